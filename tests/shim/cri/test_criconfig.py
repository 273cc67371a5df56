"""shim.cri.configs: crictl's JSON configs parse into frozen dataclasses; bad fields are named."""

from __future__ import annotations

import copy
import json
import pathlib
import re

import pytest

from shim.cri.configs import SANDBOX_OOM_SCORE_ADJ, ContainerConfig, PodSandboxConfig
from shim.rpc.status import InvalidArgument
from shim.sandbox.options import SandboxOptions

ROOT = pathlib.Path(__file__).parents[3]
EXAMPLES = ROOT / "examples"

POD = {
    "metadata": {"name": "web", "namespace": "default", "uid": "u-1", "attempt": 2},
    "hostname": "web-0",
    "log_directory": "/var/log/pods/web",
    "dns_config": {"servers": ["10.0.0.10"], "searches": ["svc.local"], "options": ["ndots:5"]},
    "port_mappings": [{"protocol": 1, "container_port": 53, "host_port": 5353, "host_ip": "127.0.0.1"}],
    "labels": {"app": "web"},
    "annotations": {"a": "b"},
    "linux": {
        "cgroup_parent": "/kubepods/pod-u-1",
        "sysctls": {"net.ipv4.ip_forward": "1"},
        "security_context": {"namespace_options": {"network": 2, "pid": "container", "ipc": 0}},
    },
}

CONTAINER = {
    "metadata": {"name": "app", "attempt": 1},
    "image": {"image": "busybox"},
    "command": ["/bin/sh"],
    "args": ["-c", "true"],
    "working_dir": "/",
    "envs": [{"key": "A", "value": "1"}, {"key": "EMPTY"}],
    "labels": {"tier": "x"},
    "annotations": {"k": "v"},
    "log_path": "app/1.log",
    "linux": {"security_context": {"namespace_options": {"pid": 0}}},
}


def with_field(doc: dict, path: str, value) -> dict:
    """A deep copy of ``doc`` with the dotted ``path`` set to ``value`` (created as needed)."""
    doc = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return doc


def refusal(parse, doc: dict) -> str:
    """The message of the InvalidArgument ``parse(doc)`` raises."""
    with pytest.raises(InvalidArgument) as info:
        parse(doc)
    return info.value.message


def test_pod_config_reads_every_field() -> None:
    config = PodSandboxConfig.from_json(POD)
    assert config.metadata.key == "web_default_u-1_2"
    assert config.hostname == "web-0" and config.log_directory == "/var/log/pods/web"
    assert config.dns_config.servers == ("10.0.0.10",) and config.dns_config.options == ("ndots:5",)
    mapping = config.port_mappings[0]
    assert (mapping.protocol, mapping.container_port, mapping.host_port, mapping.host_ip) == ("UDP", 53, 5353, "127.0.0.1")
    assert config.labels == {"app": "web"} and config.annotations == {"a": "b"}
    assert config.cgroup_parent == "/kubepods/pod-u-1" and config.sysctls == {"net.ipv4.ip_forward": "1"}
    assert (config.namespace_options.network, config.namespace_options.pid, config.namespace_options.ipc) == (
        "NODE", "CONTAINER", "POD")
    assert config.host_network


def test_minimal_pod_config_gets_cri_defaults() -> None:
    config = PodSandboxConfig.from_json({"metadata": {"name": "p", "namespace": "n", "uid": "u"}})
    assert config.metadata.attempt == 0
    assert (config.namespace_options.network, config.namespace_options.pid, config.namespace_options.ipc) == (
        "POD", "POD", "POD")
    assert config.hostname == "" and config.labels == {} and config.port_mappings == ()


def test_nulls_are_absent_and_a_key_that_is_no_field_is_refused_by_name() -> None:
    doc = with_field(POD, "linux.security_context.privileged", True)
    doc["hostname"] = None
    assert PodSandboxConfig.from_json(doc).hostname == ""
    with pytest.raises(InvalidArgument, match="linux.security_context.anything is not a field of CRI's "
                                              "PodSandboxConfig that podshim knows$"):
        PodSandboxConfig.from_json(with_field(POD, "linux.security_context.anything", 1))


def test_config_is_frozen() -> None:
    config = PodSandboxConfig.from_json(POD)
    with pytest.raises(AttributeError):
        config.hostname = "x"  # type: ignore[misc]


@pytest.mark.parametrize("path, value, message", [
    ("metadata.name", 7, "metadata.name must be a string, got int"),
    ("metadata.name", "", "metadata.name must not be empty"),
    ("metadata.namespace", None, "metadata.namespace is required"),
    ("metadata.uid", ["u"], "metadata.uid must be a string, got array"),
    ("metadata.attempt", -1, "metadata.attempt is -1; allowed: 0..4294967295"),
    ("metadata.attempt", True, "metadata.attempt must be an integer, got bool"),
    ("metadata", "web", "metadata must be an object, got str"),
    ("labels", {"app": 1}, "labels.app must be a string, got int"),
    ("annotations", ["a"], "annotations must be an object, got array"),
    ("dns_config.servers", ["ok", 1], "dns_config.servers[1] must be a string, got int"),
    ("port_mappings", [{"container_port": 70000}], "port_mappings[0].container_port is 70000"),
    ("port_mappings", [{"container_port": 80, "protocol": "ICMP"}], "port_mappings[0].protocol is 'ICMP'"),
    ("linux.sysctls", {"net.x": 1}, "linux.sysctls.net.x must be a string, got int"),
    ("linux.cgroup_parent", 3, "linux.cgroup_parent must be a string"),
    ("linux.security_context.namespace_options.network", 1,
     "linux.security_context.namespace_options.network is 1; allowed: POD (0), NODE (2)"),
    ("linux.security_context.namespace_options.ipc", "TARGET", "namespace_options.ipc is 'TARGET'"),
    ("linux.security_context.namespace_options.pid", 3.0, "namespace_options.pid is 3.0"),
    ("log_directory", "logs", "log_directory 'logs' must be an absolute path"),
])
def test_bad_pod_field_is_invalid_argument_naming_its_path(path, value, message) -> None:
    assert message in refusal(PodSandboxConfig.from_json, with_field(POD, path, value))


def test_pod_config_must_be_an_object_with_metadata() -> None:
    with pytest.raises(InvalidArgument, match="must be an object"):
        PodSandboxConfig.from_json([POD])
    with pytest.raises(InvalidArgument, match="metadata is required"):
        PodSandboxConfig.from_json({"hostname": "x"})


def test_to_json_round_trips() -> None:
    config = PodSandboxConfig.from_json(POD)
    assert PodSandboxConfig.from_json(config.to_json()) == config
    container = ContainerConfig.from_json(CONTAINER)
    assert ContainerConfig.from_json(container.to_json()) == container


def test_shim_options_carry_what_protocol_md_lists() -> None:
    options = PodSandboxConfig.from_json(POD).to_shim_options()
    assert options == {
        "hostname": "web-0",
        "labels": {"app": "web"},
        "annotations": {"a": "b"},
        "linux": {
            "cgroup_parent": "/kubepods/pod-u-1",
            "sysctls": {"net.ipv4.ip_forward": "1"},
            "security_context": {"namespace_options": {"network": "NODE", "pid": "CONTAINER", "ipc": "POD"}},
            "oom_score_adj": -998,
        },
    }


def test_the_shim_reads_whether_the_pod_is_privileged() -> None:
    assert SandboxOptions.from_payload({}).privileged is False
    assert SandboxOptions.from_payload({"linux": {"security_context": {"privileged": True}}}).privileged is True
    with pytest.raises(InvalidArgument, match="privileged"):
        SandboxOptions.from_payload({"linux": {"security_context": {"privileged": "yes"}}})


def test_shim_accepts_the_options() -> None:
    parsed = SandboxOptions.from_payload(PodSandboxConfig.load(EXAMPLES / "pod-config.json").to_shim_options())
    assert parsed.hostname == "podshim-demo" and parsed.oom_score_adj == SANDBOX_OOM_SCORE_ADJ
    assert (parsed.network_mode, parsed.pid_mode, parsed.ipc_mode) == ("POD", "POD", "POD")


def test_sandbox_oom_score_adj_matches_protocol_md() -> None:
    spec = (ROOT / "protocol.md").read_text()
    match = re.search(r"^\| `linux\.oom_score_adj` \|.*default (-?\d+) \|$", spec, re.M)
    assert match and int(match.group(1)) == SANDBOX_OOM_SCORE_ADJ


def test_container_config_reads_every_field() -> None:
    config = ContainerConfig.from_json(CONTAINER)
    assert config.metadata.key == "app_1" and config.image == "busybox"
    assert config.argv == ("/bin/sh", "-c", "true")
    assert config.working_dir == "/" and config.log_path == "app/1.log"
    assert config.envs == (("A", "1"), ("EMPTY", ""))
    assert config.labels == {"tier": "x"} and config.annotations == {"k": "v"}
    assert config.pid_mode == "POD"


def test_container_pid_mode_unset_is_pod_as_the_proto3_zero_value() -> None:
    doc = {"metadata": {"name": "c"}, "command": ["true"]}
    config = ContainerConfig.from_json(doc)
    assert config.pid_mode == "POD" and config.image == "" and config.metadata.attempt == 0
    empty = {**doc, "linux": {"security_context": {"namespace_options": {}}}}
    assert ContainerConfig.from_json(empty).pid_mode == "POD"


@pytest.mark.parametrize("path, value, message", [
    ("metadata.name", None, "metadata.name is required"),
    ("metadata.attempt", "1", "metadata.attempt must be an integer, got str"),
    ("command", "/bin/sh", "command must be an array, got str"),
    ("args", ["-c", None], "args[1] must be a string, got null"),
    ("envs", [{"value": "x"}], "envs[0].key is required"),
    ("envs", [{"key": "A=B"}], "envs[0].key 'A=B' must not contain '='"),
    ("envs", ["A=B"], "envs[0] must be an object, got str"),
    ("image.image", 5, "image.image must be a string, got int"),
    ("log_path", "/var/log/x", "log_path '/var/log/x' must be relative"),
    ("log_path", "../x.log", "without '..'"),
    ("working_dir", "tmp", "working_dir 'tmp' must be an absolute path"),
    ("linux.security_context.namespace_options.pid", 5,
     "linux.security_context.namespace_options.pid is 5; allowed: POD (0), CONTAINER (1), NODE (2), TARGET (3)"),
])
def test_bad_container_field_is_invalid_argument_naming_its_path(path, value, message) -> None:
    assert message in refusal(ContainerConfig.from_json, with_field(CONTAINER, path, value))


@pytest.mark.parametrize("field, value, says", [
    ("hostname", "web\n", "hostname 'web\\n' is not an RFC 1123 host name"),
    ("hostname", "a" * 64, "is not an RFC 1123 host name"),
    ("hostname", "web-0." + "a" * 60, "is 66 characters"),
    ("labels", {"app": "x" * (1 << 20)}, "labels['app'] is 1048576 characters; at most 253"),
    ("labels", {"app": "-web"}, "labels['app'] '-web' is not a label value"),
    ("labels", {"a/b/c": "x"}, "labels key 'a/b/c' is not a qualified name"),
    ("labels", {"Example.com/app": "x"}, "labels key 'Example.com/app' is not a qualified name"),
    ("labels", {"x" * 64: "x"}, "is not a qualified name"),
    ("annotations", {"big": "x" * 2_000_000}, "annotations are 2000003 bytes in all; at most 262144"),
    ("annotations", {"no spaces": "x"}, "annotations key 'no spaces' is not a qualified name"),
], ids=["hostname-newline", "hostname-label-64", "hostname-66", "label-1-mib", "label-value", "label-key-two-slashes",
        "label-key-prefix-case", "label-key-64", "annotations-2-mb", "annotation-key"])
def test_pod_fields_beyond_the_limits_of_cri_and_kubernetes_are_refused(field, value, says) -> None:
    doc = {"metadata": {"name": "p", "namespace": "n", "uid": "u"}, field: value}
    with pytest.raises(InvalidArgument) as info:
        PodSandboxConfig.from_json(doc)
    assert says in info.value.message, info.value.message


def test_container_labels_and_annotations_have_the_same_limits() -> None:
    doc = {"metadata": {"name": "c"}, "command": ["true"]}
    with pytest.raises(InvalidArgument, match=r"labels\['app'\] is 254 characters"):
        ContainerConfig.from_json({**doc, "labels": {"app": "x" * 254}})
    with pytest.raises(InvalidArgument, match="annotations are 300001 bytes"):
        ContainerConfig.from_json({**doc, "annotations": {"a": "x" * 300_000}})


def test_pod_fields_at_the_limits_are_accepted() -> None:
    config = PodSandboxConfig.from_json({
        "metadata": {"name": "p", "namespace": "n", "uid": "u"},
        "hostname": "web-0.a-service.default.svc.cluster.local",
        "labels": {"app.kubernetes.io/name": "w" * 63, "empty": "", "Tier_2": "a.b-c_d",
                   # kubelet's: the pod's name, a DNS subdomain longer than an API label value may be
                   "io.kubernetes.pod.name": "pod-update-activedeadlineseconds-ddac1ada-a730-43b7-9fc2-73e34935754c",
                   "longest": "p" * 253},
        "annotations": {"a": "x" * (256 * 1024 - 1)}})
    assert config.labels["empty"] == "" and len(config.annotations["a"]) == 256 * 1024 - 1


def test_container_may_leave_command_and_args_to_its_image() -> None:
    # The image's Entrypoint and Cmd fill them in (client.cri.process); nothing at all to run is
    # refused there, where the image is known.
    assert ContainerConfig.from_json({"metadata": {"name": "c"}, "command": [], "args": []}).argv == ()
    assert ContainerConfig.from_json({"metadata": {"name": "c"}, "args": ["sleep", "1"]}).argv == ("sleep", "1")


def test_container_mounts_and_read_only_rootfs_round_trip() -> None:
    doc = {"metadata": {"name": "c"}, "mounts": [{"container_path": "/data", "host_path": "/srv/data", "readonly": True,
                                                  "propagation": "PROPAGATION_HOST_TO_CONTAINER"}],
           "linux": {"security_context": {"readonly_rootfs": True}}}
    config = ContainerConfig.from_json(doc)
    assert config.readonly_rootfs and config.mounts[0].propagation == "PROPAGATION_HOST_TO_CONTAINER"
    assert ContainerConfig.from_json(config.to_json()) == config


def test_container_devices_round_trip_and_a_missing_path_is_refused_naming_it() -> None:
    doc = {"metadata": {"name": "c"}, "devices": [{"container_path": "/dev/fuse", "host_path": "/dev/fuse",
                                                   "permissions": "mrw"}]}
    config = ContainerConfig.from_json(doc)
    assert config.devices[0].host_path == "/dev/fuse" and config.devices[0].permissions == "mrw"
    assert ContainerConfig.from_json(config.to_json()) == config
    with pytest.raises(InvalidArgument, match=r"devices\[0\].host_path"):
        ContainerConfig.from_json({"metadata": {"name": "c"}, "devices": [{"container_path": "/dev/fuse"}]})


@pytest.mark.parametrize("content, says", [
    (b'{"metadata": ', "is not valid JSON: Expecting value"),
    ('{"hostname": "caf\xe9"}'.encode("latin-1"), "is not UTF-8 text (byte 0xe9 at offset 17)"),
    (b"[" * 100_000 + b"]" * 100_000, "is not valid JSON: it is nested more than 100 deep"),
    (b'{"a": ' * 101 + b"1" + b"}" * 101, "is not valid JSON: it is nested more than 100 deep"),
    (b'{"metadata": ' + b"1" * 5000 + b"}", "is not valid JSON: Exceeds the limit"),
], ids=["truncated", "latin-1", "100000-deep", "101-deep", "5000-digit-int"])
def test_a_bad_json_file_is_invalid_argument_in_one_sentence_naming_it(tmp_path, content, says) -> None:
    path = tmp_path / "pod-config.json"
    path.write_bytes(content)
    with pytest.raises(InvalidArgument) as info:
        PodSandboxConfig.load(path)
    assert info.value.message.startswith(f"{path} {says}") and "\n" not in info.value.message, info.value.message


def test_missing_file_and_non_object_are_invalid_argument(tmp_path) -> None:
    with pytest.raises(InvalidArgument, match="cannot read .*nothing.json"):
        ContainerConfig.load(tmp_path / "nothing.json")
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(InvalidArgument, match="must hold a JSON object"):
        ContainerConfig.load(tmp_path / "list.json")


def test_examples_parse() -> None:
    pod = PodSandboxConfig.load(EXAMPLES / "pod-config.json")
    container = ContainerConfig.load(EXAMPLES / "container-config.json")
    assert pod.metadata.key == "podshim-sandbox_default_hdishd83djaidwnduwk28bcsb_1"
    assert container.command == ("/bin/sh", "-c", "hostname; cat /proc/net/dev; ip -o addr 2>/dev/null || true")
    # crictl writes these files: keep them plain JSON in its spelling.
    assert "metadata" in json.loads((EXAMPLES / "pod-config.json").read_text())
