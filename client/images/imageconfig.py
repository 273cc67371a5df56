"""The image config's schema: every field of it podshim reads, checked where a config comes in.

An image config (OCI image-spec config.md; Docker's is the same for these fields) is JSON an
image's author wrote. podshim reads ``rootfs.diff_ids`` (to unpack and check the layers) and the
``config`` object's ``User``, ``Env``, ``Entrypoint``, ``Cmd`` and ``WorkingDir`` (to run
containers); ImageStatus hands the whole config to kubelet, which reads ``Labels``,
``StopSignal``, ``ExposedPorts``, ``Volumes``, ``architecture``, ``os`` and ``variant`` as the
image spec types them. :func:`check_config` checks the types of all of them once, when a pull
brings the config in and when a record is read back, so nothing later meets a string where it
reads an object: a config that fails is refused with a sentence naming the field, and never
stored. Other fields (history...) are kept as they are.
"""

from __future__ import annotations

import re
from typing import Any

from shim.rpc.status import InvalidArgument

__all__ = ["MAX_CONFIG_BYTES", "check_config"]

#: The largest image config a pull takes: skopeo's (containers/image's) limit on a config blob.
MAX_CONFIG_BYTES = 4 << 20

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_STRING_FIELDS = ("architecture", "os", "variant", "created", "author")
_CONFIG_STRINGS = ("User", "WorkingDir", "StopSignal")
_CONFIG_STRING_LISTS = ("Env", "Entrypoint", "Cmd")
_CONFIG_OBJECTS = ("ExposedPorts", "Volumes")


def check_config(config: Any, what: str, layers: int | None = None) -> dict[str, Any]:
    """``config`` (a decoded image config) when the fields podshim reads have their types, and
    ``rootfs.diff_ids`` lists ``layers`` sha256 digests (any number when None). Raises
    InvalidArgument with a sentence starting with ``what`` and naming the field otherwise."""
    if not isinstance(config, dict):
        raise InvalidArgument(f"{what} is a JSON {_kind(config)}, not an object")
    for key in _STRING_FIELDS:
        _check(config, key, str, "a string", what)
    rootfs = config.get("rootfs")
    if not isinstance(rootfs, dict):
        raise InvalidArgument(f"{what}: rootfs is {_described(rootfs)}, not an object with the layers' diff_ids")
    _check(rootfs, "type", str, "a string", what, "rootfs.")
    diff_ids = rootfs.get("diff_ids")
    if not isinstance(diff_ids, list):
        raise InvalidArgument(f"{what}: rootfs.diff_ids is {_described(diff_ids)}, not an array of layer digests")
    for number, diff_id in enumerate(diff_ids):
        if not isinstance(diff_id, str) or not _DIGEST.fullmatch(diff_id):
            raise InvalidArgument(f"{what}: rootfs.diff_ids[{number}] is {_described(diff_id)}, not a sha256 digest "
                                  "(sha256:<64 hex digits>)")
    if layers is not None and len(diff_ids) != layers:
        raise InvalidArgument(f"{what} lists {len(diff_ids)} diff_ids in rootfs.diff_ids for {layers} layers")
    run = config.get("config")
    if run is None:
        return config
    if not isinstance(run, dict):
        raise InvalidArgument(f"{what}: config is {_described(run)}, not an object")
    for key in _CONFIG_STRINGS:
        _check(run, key, str, "a string", what, "config.")
    for key in _CONFIG_STRING_LISTS:
        value = run.get(key)
        if value is not None and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
            raise InvalidArgument(f"{what}: config.{key} is {_described(value)}, not an array of strings")
    for key in _CONFIG_OBJECTS:
        _check(run, key, dict, "an object", what, "config.")
    labels = run.get("Labels")
    if labels is not None and (not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values())):
        raise InvalidArgument(f"{what}: config.Labels is {_described(labels)}, not an object of strings")
    return config


def _check(doc: dict[str, Any], key: str, kind: type, named: str, what: str, prefix: str = "") -> None:
    value = doc.get(key)
    if value is not None and not isinstance(value, kind):
        raise InvalidArgument(f"{what}: {prefix}{key} is {_described(value)}, not {named}")


def _kind(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(
        type(value), "null")


def _described(value: Any) -> str:
    """What a value is, for a sentence: its JSON kind, with a short value when it is one."""
    if value is None:
        return "missing or null"
    if isinstance(value, (dict, list)):
        return f"an {_kind(value)}"
    text = repr(value)
    return f"the {_kind(value)} {text if len(text) <= 40 else text[:37] + '...'}"
