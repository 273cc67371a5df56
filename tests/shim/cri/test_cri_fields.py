"""Every field of CRI's ContainerConfig and PodSandboxConfig is applied or refused with a sentence,
never dropped: the generated messages (the schema podshimd serves) are walked field by field, and a
field that shim/cri/fields.py's table does not name fails here; a field the table refuses is
refused when it asks for something, and not when it is at its zero value (kubelet sends some of them
with every pod); docs/cri.md shows the table as it is."""

from __future__ import annotations

import os
from typing import Any

import pytest
from google.protobuf import json_format

from shim.cri import fields
from shim.cri.api import api_pb2
from shim.cri.configs import ContainerConfig, PodSandboxConfig
from shim.rpc.status import InvalidArgument

from support.podtools import container_config, pod_config

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "cri.md")


def schema_fields(descriptor, prefix: str = "", seen: tuple = ()) -> dict[str, Any]:
    """Every field of a message, by its path, recursively (a message met again on its own path, as
    none of these is, would end the walk there)."""
    found = {}
    for field in descriptor.fields:
        path = prefix + field.name
        found[path] = field
        inner = field.message_type
        if inner is not None and not inner.GetOptions().map_entry and inner.full_name not in seen:
            found.update(schema_fields(inner, path + ".", seen + (descriptor.full_name,)))
    return found


def covered(path: str, table: dict) -> fields.Field | None:
    """The entry that says what happens to ``path``: its own, or a refused or informing message's
    above it (which covers everything inside)."""
    if path in table:
        return table[path]
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        above = table.get(".".join(parts[:i]))
        if above is not None and above.kind in (fields.REFUSED, fields.INFORMS):
            return above
    return None


@pytest.mark.parametrize("message,table", [(api_pb2.ContainerConfig, fields.CONTAINER_CONFIG),
                                           (api_pb2.PodSandboxConfig, fields.POD_SANDBOX_CONFIG)])
def test_every_field_of_the_schema_is_applied_informs_or_refused(message, table):
    schema = schema_fields(message.DESCRIPTOR)
    missing = [path for path in schema if covered(path, table) is None]
    assert not missing, f"fields of {message.DESCRIPTOR.name} the table does not name: {missing}"
    for path, field in schema.items():
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            assert covered(path, table).leaf or covered(path, table).kind != fields.APPLIED, path
    assert all(f.kind in (fields.APPLIED, fields.INFORMS, fields.REFUSED) and f.text for f in table.values())


def refused_values(table: dict, message) -> list[tuple[str, object]]:
    """A value for each refused field of the schema that asks for something."""
    schema = schema_fields(message.DESCRIPTOR)
    values: list[tuple[str, object]] = []
    for path, field in schema.items():
        entry = table.get(path)
        if entry is None or entry.kind != fields.REFUSED:
            continue
        value: object
        if field.message_type is not None:
            inner = field.message_type
            if inner.GetOptions().map_entry:
                value = {"k": "v"}
            elif path.endswith("userns_options"):
                value = {"mode": 0}  # POD: a user namespace of the pod's own
            else:
                first = inner.fields[0]
                value = {first.name: "x" if first.type == first.TYPE_STRING else 1}
        elif field.type == field.TYPE_STRING:
            value = "x"
        elif field.type == field.TYPE_BOOL:
            value = True
        else:
            value = 1
        values.append((path, [value] if field.is_repeated and not isinstance(value, dict) else value))
    return values


def with_field(doc: dict, path: str, value) -> dict:
    doc = {**doc}
    node = doc
    parts = path.split(".")
    for part in parts[:-1]:
        node[part] = {**node.get(part, {})}
        node = node[part]
    node[parts[-1]] = [value] if isinstance(value, dict) and path in REPEATED_MESSAGES else value
    return doc


REPEATED_MESSAGES = {path for message in (api_pb2.ContainerConfig, api_pb2.PodSandboxConfig)
                     for path, field in schema_fields(message.DESCRIPTOR).items()
                     if field.is_repeated and field.message_type is not None
                     and not field.message_type.GetOptions().map_entry}


@pytest.mark.parametrize("path,value", refused_values(fields.CONTAINER_CONFIG, api_pb2.ContainerConfig))
def test_a_refused_container_field_that_asks_for_something_is_refused_by_name(path, value) -> None:
    doc = container_config(["true"])
    if path.startswith("mounts."):  # a field of a mount: in a mount that is otherwise fine
        doc["mounts"] = [{"container_path": "/m", "host_path": "/tmp", path.split(".", 1)[1]: value}]
    else:
        doc = with_field(doc, path, value)
    with pytest.raises(InvalidArgument, match=rf"{path.split('.')[0]}.* cannot be applied: "):
        ContainerConfig.from_json(doc)


@pytest.mark.parametrize("path,value", refused_values(fields.POD_SANDBOX_CONFIG, api_pb2.PodSandboxConfig))
def test_a_refused_pod_field_that_asks_for_something_is_refused_by_name(path, value) -> None:
    with pytest.raises(InvalidArgument, match=rf"{path.split('.')[0]}.* cannot be applied: "):
        PodSandboxConfig.from_json(with_field(pod_config(), path, value))


def test_what_kubelet_sends_with_every_pod_is_not_refused() -> None:
    # Zero values, the host's user namespace (mode NODE) and the Merge policy ask for nothing.
    userns = {"userns_options": {"mode": "NODE"}}
    pod = pod_config()
    pod["linux"]["security_context"]["namespace_options"].update(userns)
    pod["linux"]["security_context"]["supplemental_groups_policy"] = 0
    pod["linux"]["overhead"] = {"cpu_shares": 2, "memory_limit_in_bytes": 1 << 20}
    pod["linux"]["resources"] = {"cpu_shares": 256, "memory_limit_in_bytes": 1 << 27}
    pod["windows"] = {}
    PodSandboxConfig.from_json(pod)
    container = container_config(["true"])
    container["linux"]["security_context"]["namespace_options"].update(userns)
    container["linux"]["security_context"]["supplemental_groups_policy"] = "Merge"
    container["image"] = {"image": "", "user_specified_image": "busybox", "annotations": {}}
    container["stop_signal"] = 0
    container["CDI_devices"] = []
    container["mounts"] = [{"container_path": "/m", "host_path": "/tmp", "recursive_read_only": False}]
    ContainerConfig.from_json(container)


MAPPING = [{"host_id": 100000, "container_id": 0, "length": 65536}]


def test_a_pod_user_namespace_goes_to_the_shim_with_its_mappings() -> None:
    pod = pod_config()
    pod["linux"]["security_context"]["namespace_options"]["userns_options"] = {"uids": MAPPING, "gids": MAPPING}
    options = PodSandboxConfig.from_json(pod).to_shim_options()
    assert options["linux"]["security_context"]["namespace_options"]["userns_options"] == {
        "mode": "POD", "uids": [{"container_id": 0, "host_id": 100000, "length": 65536}],
        "gids": [{"container_id": 0, "host_id": 100000, "length": 65536}]}


@pytest.mark.parametrize("userns, sentence", [
    ({"mode": "CONTAINER", "uids": MAPPING, "gids": MAPPING}, "mode is .CONTAINER.; allowed: POD"),
    ({"mode": "POD"}, "uids must be one mapping"),
    ({"mode": "POD", "uids": MAPPING * 2, "gids": MAPPING}, "uids must be one mapping"),
    ({"mode": "POD", "uids": MAPPING, "gids": [{"host_id": 0, "container_id": 0, "length": 65536}]},
     "leave out the host's root"),
    ({"mode": "NODE", "uids": MAPPING}, "mode NODE .* takes no mappings"),
])
def test_a_user_namespace_podshim_cannot_make_is_refused(userns, sentence) -> None:
    pod = pod_config()
    pod["linux"]["security_context"]["namespace_options"]["userns_options"] = userns
    with pytest.raises(InvalidArgument, match=sentence):
        PodSandboxConfig.from_json(pod)


def test_a_field_through_the_protobuf_request_is_refused_too() -> None:
    from shim.cri import requests

    config = json_format.ParseDict(container_config(["true"]), api_pb2.ContainerConfig())
    config.linux.security_context.capabilities.add_ambient_capabilities.append("CAP_NET_RAW")
    with pytest.raises(InvalidArgument, match="add_ambient_capabilities cannot be applied: ambient capabilities"):
        requests.container_config(api_pb2.CreateContainerRequest(config=config))


def test_docs_show_the_table_as_it_is() -> None:
    with open(DOCS) as f:
        text = f.read()
    assert fields.markdown() in text, "docs/cri.md's field table differs: python -m shim.cri.fields prints it"
