"""The host devices a task is given (Task.Create's ``devices``, CRI's ContainerConfig.devices), as
containerd's WithDevices gives them: each ``host_path`` resolved on the host (its symbolic links
followed; a directory gives every device node below it), made at ``container_path`` in the task's
/dev with the host node's mode and owner, and allowed in the task's cgroup with ``permissions``.
An entry may say the node's ``type`` (c or b), ``major``, ``minor``, ``file_mode``, ``uid`` and
``gid`` itself (a CDI spec's device node): those win over the host node's, and a node whose type
and numbers are said needs none on the host.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from typing import Any

from shim.kernel.devices import DeviceRule, normal_access
from shim.rpc.records import Record
from shim.rpc.records import set_field as _set
from shim.rpc.status import FailedPrecondition, InvalidArgument
from shim.runtime.mounts import HostDevice

__all__ = ["GivenDevice", "parse_devices"]

#: Where a given device's node may be made: the task's own /dev (a fresh tmpfs, nothing of the
#: image's in it), not below the mounts made there after the nodes.
_DEV = "/dev"
_MOUNTED_IN_DEV = ("/dev/pts", "/dev/shm", "/dev/mqueue")
#: What an entry may say of its node itself, over its host node's (a CDI spec's device node fields).
_SAID = ("type", "major", "minor", "file_mode", "uid", "gid")


class GivenDevice(Record):
    """One device node to make in the task (``node.path`` is its path there) and the rule that lets
    the task use it."""

    __slots__ = ("node", "rule")
    node: HostDevice
    rule: DeviceRule

    def __init__(self, node: HostDevice, rule: DeviceRule) -> None:
        _set(self, "node", node)
        _set(self, "rule", rule)


def parse_devices(payload: Mapping[str, Any]) -> tuple[GivenDevice, ...]:
    """The ``devices`` of a Task.Create payload, resolved on the host now. InvalidArgument names a
    malformed entry; FailedPrecondition a host path that is not there or is no device node."""
    entries = payload.get("devices")
    if entries is None:
        return ()
    if not isinstance(entries, list):
        raise InvalidArgument("field 'devices' must be an array")
    found: list[GivenDevice] = []
    for i, entry in enumerate(entries):
        where = f"devices[{i}]"
        if not isinstance(entry, Mapping):
            raise InvalidArgument(f"field '{where}' must be a map")
        container_path = _path(entry, "container_path", where)
        host_path = _path(entry, "host_path", where)
        permissions = entry.get("permissions") or "rwm"
        if not container_path.startswith(_DEV + "/") or any(
                container_path == m or container_path.startswith(m + "/") for m in _MOUNTED_IN_DEV):
            raise InvalidArgument(f"field '{where}.container_path' {container_path!r} must be below /dev (and not "
                                  f"below {', '.join(_MOUNTED_IN_DEV)})")
        try:
            access = normal_access(permissions)
        except InvalidArgument as exc:
            raise InvalidArgument(f"field '{where}.permissions': {exc.message}") from None
        said = _said(entry, where)
        for path, node in _nodes(host_path, where, said):
            target = container_path if path == "" else os.path.join(container_path, path)
            node = HostDevice(target, said.get("type", node.kind), said.get("major", node.major),
                              said.get("minor", node.minor), said.get("file_mode", node.mode), said.get("uid", node.uid),
                              said.get("gid", node.gid))
            found.append(GivenDevice(node, DeviceRule(node.kind, node.major, node.minor, access)))
    return tuple(found)


def _said(entry: Mapping[str, Any], where: str) -> dict[str, Any]:
    """What an entry says of its node itself (a CDI spec's ``type``, ``major``, ``minor``,
    ``file_mode``, ``uid``, ``gid``), over what its host node has; InvalidArgument when malformed."""
    said = {key: entry[key] for key in _SAID if entry.get(key) is not None}
    if said.get("type", "c") not in ("b", "c"):
        raise InvalidArgument(f"field '{where}.type' must be c or b, not {said['type']!r}")
    for key, high in (("major", 2**31 - 1), ("minor", 2**31 - 1), ("file_mode", 0o7777), ("uid", 2**32 - 1),
                      ("gid", 2**32 - 1)):
        value = said.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= high):
            raise InvalidArgument(f"field '{where}.{key}' must be a whole number from 0 to {high}")
    return said


def _path(entry: Mapping[str, Any], key: str, where: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not os.path.isabs(value) or "\0" in value:
        raise InvalidArgument(f"field '{where}.{key}' must be an absolute path")
    return os.path.normpath(value)


def _nodes(host_path: str, where: str, said: Mapping[str, Any]) -> list[tuple[str, HostDevice]]:
    """(path relative to ``host_path``, "" for itself; the node) of the device at ``host_path``,
    or of every device below it when it is a directory. A node whose type and numbers are ``said``
    needs no node on the host (a minor said of none is 0, its mode is then 0666, its owner root, unless said too)."""
    resolved = os.path.realpath(host_path)
    try:
        st = os.stat(resolved)
    except OSError as exc:
        if "type" in said and "major" in said:
            return [("", HostDevice(resolved, said["type"], said["major"], said.get("minor", 0), 0o666, 0, 0))]
        raise FailedPrecondition(f"{where}.host_path {host_path}: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        numbers = sorted(set(said) & {"type", "major", "minor"})
        if numbers:
            raise InvalidArgument(f"field '{where}' says {', '.join(numbers)} of a directory of devices ({host_path})")
        found = []
        for directory, _, names in os.walk(resolved):
            for name in sorted(names):
                full = os.path.join(directory, name)
                try:
                    inner = os.lstat(full)
                except OSError:
                    continue  # gone meanwhile
                if stat.S_ISCHR(inner.st_mode) or stat.S_ISBLK(inner.st_mode):
                    found.append((os.path.relpath(full, resolved), _node(full, inner)))
        if not found:
            raise FailedPrecondition(f"{where}.host_path {host_path} is a directory with no device node in it")
        return found
    if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        raise FailedPrecondition(f"{where}.host_path {host_path} is not a device node")
    return [("", _node(resolved, st))]


def _node(path: str, st: os.stat_result) -> HostDevice:
    return HostDevice(path, "c" if stat.S_ISCHR(st.st_mode) else "b", os.major(st.st_rdev), os.minor(st.st_rdev),
                      stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
