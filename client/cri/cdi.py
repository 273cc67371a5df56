"""CDI (the Container Device Interface): a container's ``CDI_devices``, named ``vendor.com/class=name``,
resolved with the node's CDI spec files into what the container gets: device nodes, mounts,
environment variables, supplementary groups and OCI hooks.

A spec file is a JSON (``*.json``) or YAML (``*.yaml``, ``*.yml``) document in one of the spec
directories (config ``cdi_spec_dirs``; by default /etc/cdi, then /var/run/cdi): ``cdiVersion``,
``kind`` (``vendor.com/class``), ``devices`` (each a ``name`` and its ``containerEdits``) and the
spec's own ``containerEdits``, applied with any of its devices. Both formats go through the one
validator below, which follows the CDI reference implementation's: a file it rejects (not JSON or
YAML, a field of the wrong type or unknown, a ``cdiVersion`` podshim does not know or too old for
the fields used, ...) is skipped with a logged warning naming it and the reason, and a device that
only such a file could have defined is INVALID_ARGUMENT naming the device and the skipped files.
A device found in several directories is the last directory's (a spec of /var/run/cdi overrides
one of /etc/cdi); defined twice in one directory, it is refused when asked for.

What podshim cannot apply is refused with a sentence (FAILED_PRECONDITION naming the file), never
skipped: ``intelRdt``, ``netDevices``, a mount whose type is not ``bind``, a FIFO device node.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from shim.cri.cdinames import DEVICE, KIND, parse_name
from shim.rpc.status import FailedPrecondition, InvalidArgument

__all__ = ["DEFAULT_SPEC_DIRS", "HOOK_NAMES", "KNOWN_VERSIONS", "CdiEdits", "merge_env", "resolve"]

log = logging.getLogger(__name__)

#: Where CDI spec files are, lowest priority first (the CDI specification's defaults).
DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
#: The CDI specification versions podshim reads: those the reference implementation reads (it knows
#: 0.1.0 and 0.2.0 too, but requires 0.3.0 of every spec).
KNOWN_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
#: The OCI lifecycle points a CDI hook may run at.
HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
_SUFFIXES = {".json": "JSON", ".yaml": "YAML", ".yml": "YAML"}
_SPEC_KEYS = frozenset({"cdiVersion", "kind", "devices", "containerEdits", "annotations"})
_DEVICE_KEYS = frozenset({"name", "containerEdits", "annotations"})
_EDIT_KEYS = frozenset({"env", "deviceNodes", "mounts", "hooks", "intelRdt", "additionalGids", "netDevices"})
_NODE_KEYS = frozenset({"path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid", "gid"})
_MOUNT_KEYS = frozenset({"hostPath", "containerPath", "options", "type"})
_HOOK_KEYS = frozenset({"hookName", "path", "args", "env", "timeout"})
_NODE_TYPES = ("", "c", "u", "b", "p")
_NO_PERMISSIONS = "none"  # the CDI specification's "no access in the device cgroup"


class _Broken(Exception):
    """Why a spec file is not a valid CDI spec."""


@dataclass
class CdiEdits:
    """What a container's CDI devices add to it: ``env`` (``KEY=value``), ``devices`` (Task.Create
    ``devices`` entries: container_path, host_path, permissions and what the spec says of the node),
    ``mounts`` (Task.Create binds), ``additional_gids`` and ``hooks`` (Task.Create ``hooks``)."""

    env: list[str] = field(default_factory=list)
    devices: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    additional_gids: list[int] = field(default_factory=list)
    hooks: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Found:
    """The devices of the spec directories, and the files skipped as broken (path -> reason)."""

    devices: dict[tuple[str, str], tuple[str, Mapping[str, Any], Any]] = field(default_factory=dict)
    twice: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)


def resolve(names: Iterable[str], spec_dirs: Iterable[str] = DEFAULT_SPEC_DIRS) -> CdiEdits:
    """The edits of the CDI devices ``names`` from the spec files in ``spec_dirs`` (read now: device
    plugins write them while the node runs). InvalidArgument for a name that is not fully qualified
    or that no valid spec defines; FailedPrecondition for what cannot be applied."""
    wanted = [(name, *parse_name(name)) for name in names]
    edits = CdiEdits()
    if not wanted:
        return edits
    spec_dirs = list(spec_dirs)
    found = _devices(spec_dirs)
    applied_specs: set[str] = set()
    for name, kind, device in wanted:
        if (kind, device) in found.twice:
            first, second = found.twice[(kind, device)]
            raise FailedPrecondition(f"CDI device {name} is defined twice in {os.path.dirname(second)} ({first} and "
                                     f"{second})")
        entry = found.devices.get((kind, device))
        if entry is None:
            skipped = "".join(f"; {path} was skipped: {reason}" for path, reason in sorted(found.broken.items()))
            raise InvalidArgument(f"CDI device {name!r} is not defined by any valid CDI spec in "
                                  f"{', '.join(spec_dirs)}{skipped}")
        path, spec, device_edits = entry
        if path not in applied_specs:  # a spec's own edits once, whichever of its devices asks
            applied_specs.add(path)
            _apply(edits, spec.get("containerEdits"), f"{path}: containerEdits")
        _apply(edits, device_edits, f"{path}: device {device!r}")
    return edits


def _devices(spec_dirs: Iterable[str]) -> _Found:
    """The devices of ``spec_dirs``, the later directory winning; broken files skipped (logged)."""
    found = _Found()
    for directory in spec_dirs:
        try:
            names = sorted(os.listdir(directory))
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise FailedPrecondition(f"cannot list the CDI spec directory {directory}: {exc.strerror}") from None
        here: dict[tuple[str, str], str] = {}
        for file_name in names:
            path = os.path.join(directory, file_name)
            fmt = _SUFFIXES.get(os.path.splitext(file_name)[1])
            if fmt is None:
                continue
            try:
                spec = _read_spec(path, fmt)
            except _Broken as exc:
                log.warning("CDI spec %s skipped: %s", path, exc)
                found.broken[path] = str(exc)
                continue
            for device in spec["devices"]:
                key = (spec["kind"], device["name"])
                if key in here:
                    found.twice[key] = (here[key], path)
                    continue
                here[key] = path
                found.twice.pop(key, None)  # an earlier directory's conflict is overridden too
                found.devices[key] = (path, spec, device.get("containerEdits"))
    return found


def _read_spec(path: str, fmt: str) -> dict[str, Any]:
    """The spec in ``path``, checked; _Broken saying why it is not a valid CDI spec."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise _Broken(f"cannot read it: {exc.strerror}") from None
    try:
        spec = json.loads(data) if fmt == "JSON" else yaml.safe_load(data)
    except (ValueError, yaml.YAMLError) as exc:
        raise _Broken(f"it is not valid {fmt}: {' '.join(str(exc).split())}") from None
    _check_spec(spec)
    return spec  # type: ignore[no-any-return]


def _check_spec(spec: Any) -> None:
    """_Broken unless ``spec`` is a CDI spec as the CDI reference implementation validates one."""
    _check_object(spec, "the spec", _SPEC_KEYS)
    version = spec.get("cdiVersion")
    if not isinstance(version, str) or version.removeprefix("v") not in KNOWN_VERSIONS:
        raise _Broken(f"cdiVersion {version!r} is not a CDI version podshim knows ({KNOWN_VERSIONS[0]} to "
                      f"{KNOWN_VERSIONS[-1]})")
    kind = spec.get("kind")
    if not isinstance(kind, str) or KIND.match(kind) is None:
        raise _Broken(f"kind {kind!r} is not vendor.com/class")
    devices = spec.get("devices")
    if not isinstance(devices, list) or not devices:
        raise _Broken("devices must be a non-empty list")
    names: set[str] = set()
    for i, device in enumerate(devices):
        _check_object(device, f"devices[{i}]", _DEVICE_KEYS)
        name = device.get("name")
        if not isinstance(name, str) or DEVICE.match(name) is None:
            raise _Broken(f"devices[{i}].name {name!r} is not a CDI device name")
        if name in names:
            raise _Broken(f"device {name!r} is defined twice")
        names.add(name)
        _check_edits(device.get("containerEdits"), f"device {name!r}")
        _check_annotations(device.get("annotations"), f"device {name!r}")
    _check_edits(spec.get("containerEdits"), "containerEdits")
    _check_annotations(spec.get("annotations"), "the spec")
    needed = _required_version(spec)
    if _version_key(version) < _version_key(needed):
        raise _Broken(f"the fields it uses need cdiVersion {needed} or later, and it says {version}")


def _check_object(doc: Any, where: str, keys: frozenset[str]) -> None:
    if not isinstance(doc, dict):
        raise _Broken(f"{where} must be an object")
    unknown = sorted(str(key) for key in set(doc) - keys)
    if unknown:
        raise _Broken(f"{where} has {unknown[0]!r}, which is no field of a CDI spec")


def _check_annotations(doc: Any, where: str) -> None:
    if doc is not None and (not isinstance(doc, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                                  for k, v in doc.items())):
        raise _Broken(f"the annotations of {where} must map strings to strings")


def _strings(doc: Any, where: str) -> list[str]:
    if doc is None:
        return []
    if not isinstance(doc, list) or not all(isinstance(item, str) for item in doc):
        raise _Broken(f"{where} must be a list of strings")
    return doc


def _check_env(doc: Any, where: str) -> None:
    for entry in _strings(doc, where):
        if entry.find("=") <= 0:
            raise _Broken(f"{where}: {entry!r} is not KEY=value")


def _check_int(doc: Any, where: str, *, low: int = 0, high: int = 2**32 - 1) -> None:
    if doc is not None and (not isinstance(doc, int) or isinstance(doc, bool) or not low <= doc <= high):
        raise _Broken(f"{where} must be a whole number from {low} to {high}")


def _check_edits(doc: Any, where: str) -> None:
    """_Broken unless ``doc`` is a valid containerEdits object (or absent)."""
    if doc is None:
        return
    _check_object(doc, where, _EDIT_KEYS)
    _check_env(doc.get("env"), f"{where}: env")
    for i, node in enumerate(_list(doc.get("deviceNodes"), f"{where}: deviceNodes")):
        at = f"{where}: deviceNodes[{i}]"
        _check_object(node, at, _NODE_KEYS)
        for key in ("path", "hostPath"):
            if key in node and (not isinstance(node[key], str) or not node[key].startswith("/")):
                raise _Broken(f"{at}.{key} must be an absolute path")
        if "path" not in node:
            raise _Broken(f"{at} has no path")
        if node.get("type", "") not in _NODE_TYPES:
            raise _Broken(f"{at}.type {node['type']!r} is not one of b, c, u, p")
        permissions = node.get("permissions", "")
        if not isinstance(permissions, str) or permissions != _NO_PERMISSIONS and permissions.strip("rwm"):
            raise _Broken(f"{at}.permissions {permissions!r} is not some of r, w, m (or none)")
        for key in ("major", "minor"):
            _check_int(node.get(key), f"{at}.{key}", high=2**31 - 1)
        for key in ("uid", "gid"):
            _check_int(node.get(key), f"{at}.{key}")
        _check_int(node.get("fileMode"), f"{at}.fileMode")  # a Go os.FileMode: its type bits are high ones
    for i, mount in enumerate(_list(doc.get("mounts"), f"{where}: mounts")):
        at = f"{where}: mounts[{i}]"
        _check_object(mount, at, _MOUNT_KEYS)
        for key in ("hostPath", "containerPath"):
            if not isinstance(mount.get(key), str) or not mount[key]:
                raise _Broken(f"{at} needs {key}")
        _strings(mount.get("options"), f"{at}.options")
        if "type" in mount and not isinstance(mount["type"], str):
            raise _Broken(f"{at}.type must be a string")
    for i, hook in enumerate(_list(doc.get("hooks"), f"{where}: hooks")):
        at = f"{where}: hooks[{i}]"
        _check_object(hook, at, _HOOK_KEYS)
        if hook.get("hookName") not in HOOK_NAMES:
            raise _Broken(f"{at}.hookName {hook.get('hookName')!r} is not one of {', '.join(HOOK_NAMES)}")
        if not isinstance(hook.get("path"), str) or not hook["path"].startswith("/"):
            raise _Broken(f"{at} needs an absolute path")
        _strings(hook.get("args"), f"{at}.args")
        _check_env(hook.get("env"), f"{at}.env")
        _check_int(hook.get("timeout"), f"{at}.timeout", low=1, high=2**31 - 1)
    if doc.get("intelRdt") is not None and not isinstance(doc["intelRdt"], dict):
        raise _Broken(f"{where}: intelRdt must be an object")
    for i, net in enumerate(_list(doc.get("netDevices"), f"{where}: netDevices")):
        _check_object(net, f"{where}: netDevices[{i}]", frozenset({"hostInterfaceName", "name"}))
    for i, gid in enumerate(_list(doc.get("additionalGids"), f"{where}: additionalGids")):
        _check_int(gid, f"{where}: additionalGids[{i}]")


def _list(doc: Any, where: str) -> list[Any]:
    if doc is None:
        return []
    if not isinstance(doc, list):
        raise _Broken(f"{where} must be a list")
    return doc


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.removeprefix("v").split("."))


def _required_version(spec: Mapping[str, Any]) -> str:
    """The oldest CDI version that has every field ``spec`` uses (the reference's requiresV* rules)."""
    edits = [spec.get("containerEdits") or {}, *((d.get("containerEdits") or {}) for d in spec["devices"])]
    rdts = [e["intelRdt"] for e in edits if e.get("intelRdt") is not None]
    if any(e.get("netDevices") for e in edits) or any("schemata" in r or r.get("enableMonitoring") for r in rdts):
        return "1.1.0"
    if rdts or any(e.get("additionalGids") for e in edits):
        return "0.7.0"
    if spec.get("annotations") or any(d.get("annotations") for d in spec["devices"]) \
            or "." in spec["kind"].partition("/")[2]:
        return "0.6.0"
    if any(not d["name"][0].isalpha() for d in spec["devices"]) \
            or any(node.get("hostPath") for e in edits for node in e.get("deviceNodes") or []):
        return "0.5.0"
    if any("type" in m for e in edits for m in e.get("mounts") or []):
        return "0.4.0"
    return "0.3.0"


def _apply(edits: CdiEdits, doc: Any, where: str) -> None:
    """Add one (valid) containerEdits object to ``edits``; FailedPrecondition for what podshim cannot apply."""
    if not doc:
        return
    if doc.get("intelRdt"):
        raise FailedPrecondition(f"CDI spec {where} has intelRdt, which podshim cannot apply (it sets no Intel RDT "
                                 "class of service)")
    if doc.get("netDevices"):
        raise FailedPrecondition(f"CDI spec {where} has netDevices, which podshim cannot apply (it moves no host "
                                 "network interface into a pod)")
    edits.env.extend(doc.get("env") or [])
    for i, node in enumerate(doc.get("deviceNodes") or []):
        kind = node.get("type", "")
        if kind == "p":
            raise FailedPrecondition(f"CDI spec {where}: deviceNodes[{i}] is a FIFO, which podshim cannot make (it "
                                     "makes character and block device nodes)")
        if node.get("permissions") == _NO_PERMISSIONS:
            raise FailedPrecondition(f"CDI spec {where}: deviceNodes[{i}] has permissions 'none', which podshim "
                                     "cannot apply (a node it makes is allowed in the container's device cgroup)")
        entry: dict[str, Any] = {"container_path": node["path"], "host_path": node.get("hostPath") or node["path"],
                                 "permissions": node.get("permissions") or "rwm"}
        if kind:
            entry["type"] = "c" if kind == "u" else kind
        for key, to in (("major", "major"), ("minor", "minor"), ("fileMode", "file_mode"), ("uid", "uid"),
                        ("gid", "gid")):
            if node.get(key) is not None:
                entry[to] = node[key] & 0o777 if key == "fileMode" else node[key]
        edits.devices.append(entry)
    for i, mount in enumerate(doc.get("mounts") or []):
        options = list(mount.get("options") or [])
        if mount.get("type", "bind") not in ("bind", "") and "bind" not in options and "rbind" not in options:
            raise FailedPrecondition(f"CDI spec {where}: mounts[{i}] is of type {mount.get('type')!r}; podshim "
                                     "applies bind mounts only")
        edits.mounts.append({"destination": mount["containerPath"], "source": mount["hostPath"], "type": "bind",
                             "options": options or ["rbind"]})
    edits.additional_gids.extend(gid for gid in doc.get("additionalGids") or [] if gid != 0)
    for hook in doc.get("hooks") or []:
        entry = {"hook_name": hook["hookName"], "path": hook["path"], "args": list(hook.get("args") or []),
                 "env": list(hook.get("env") or [])}
        if hook.get("timeout") is not None:
            entry["timeout"] = hook["timeout"]
        edits.hooks.append(entry)


def merge_env(env: Iterable[str], added: Iterable[str]) -> list[str]:
    """``env`` (``KEY=value``) with ``added`` applied: a key already there takes the added value in
    its place, a new key goes at the end."""
    out = list(env)
    where = {entry.partition("=")[0]: i for i, entry in enumerate(out)}
    for entry in added:
        key = entry.partition("=")[0]
        if key in where:
            out[where[key]] = entry
        else:
            where[key] = len(out)
            out.append(entry)
    return out
