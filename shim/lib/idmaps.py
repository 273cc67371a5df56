"""A pod's user namespace as values: its uid and gid mappings, checked as kubelet sends them
(:class:`UserNamespace`), an id seen through them (:func:`inside_id`), and the namespace as
id-mapped mounts need it (:class:`IdMap`: an fd on it and the host's ids of its root), read from
a process that is in it. The shim makes the namespace (:mod:`shim.kernel.userns`); the pod layer
checks a pod's mappings and reads a pod's ids with the same types.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from shim.rpc.records import Record
from shim.rpc.records import set_field as _set
from shim.rpc.status import InvalidArgument

__all__ = ["OVERFLOW_ID", "IdMap", "IdMapping", "UserNamespace", "inside_id"]

#: The id an unmapped id shows as inside a user namespace (the kernel's overflowuid and overflowgid).
OVERFLOW_ID = 65534


class IdMapping(Record):
    """One line of a uid_map or gid_map: ``container_id`` (inside), ``host_id``, ``length``."""

    __slots__ = ("container_id", "host_id", "length")
    container_id: int
    host_id: int
    length: int

    def __init__(self, container_id: int, host_id: int, length: int) -> None:
        _set(self, "container_id", container_id)
        _set(self, "host_id", host_id)
        _set(self, "length", length)

    def line(self) -> str:
        return f"{self.container_id} {self.host_id} {self.length}\n"


class UserNamespace(Record):
    """A pod's mappings (uids, gids), checked (:meth:`from_payload`)."""

    __slots__ = ("uids", "gids")
    uids: tuple[IdMapping, ...]
    gids: tuple[IdMapping, ...]

    def __init__(self, uids: tuple[IdMapping, ...], gids: tuple[IdMapping, ...]) -> None:
        _set(self, "uids", uids)
        _set(self, "gids", gids)

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any], where: str = "userns_options") -> UserNamespace:
        """The mappings of a CRI UserNamespace (``uids``, ``gids``: lists of ``container_id``,
        ``host_id``, ``length``). InvalidArgument with a sentence for any other form than kubelet's."""
        return cls(_mappings(payload.get("uids"), f"{where}.uids"), _mappings(payload.get("gids"), f"{where}.gids"))

    def to_payload(self) -> dict[str, Any]:
        return {kind: [{"container_id": m.container_id, "host_id": m.host_id, "length": m.length} for m in maps]
                for kind, maps in (("uids", self.uids), ("gids", self.gids))}

    @classmethod
    def of_process(cls, pid: int) -> UserNamespace | None:
        """The mappings of process ``pid``'s user namespace (a pod's pause), every line of its
        uid_map and gid_map, or None when it is the shim's. Raises OSError (the process is gone)."""
        if os.stat(f"/proc/{pid}/ns/user").st_ino == os.stat("/proc/self/ns/user").st_ino:
            return None
        maps = []
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{pid}/{name}") as f:
                maps.append(tuple(IdMapping(*(int(n) for n in line.split())) for line in f if line.strip()))
        return cls(*maps)

    @property
    def root_uid(self) -> int:
        """The host's uid of root inside."""
        return self.uids[0].host_id

    @property
    def root_gid(self) -> int:
        return self.gids[0].host_id


def inside_id(maps: tuple[IdMapping, ...], host_id: int) -> int:
    """``host_id`` as a user namespace of ``maps`` sees it (:data:`OVERFLOW_ID` when none maps it)."""
    for m in maps:
        if m.host_id <= host_id < m.host_id + m.length:
            return m.container_id + host_id - m.host_id
    return OVERFLOW_ID


def _mappings(value: Any, where: str) -> tuple[IdMapping, ...]:
    if not isinstance(value, list) or len(value) != 1 or not isinstance(value[0], Mapping):
        raise InvalidArgument(f"{where} must be one mapping (a range from id 0 inside, as kubelet sends)")
    entry = value[0]
    numbers = []
    for key in ("container_id", "host_id", "length"):
        number = entry.get(key, 0)
        if isinstance(number, str) and number.isdigit():
            number = int(number)
        if not isinstance(number, int) or isinstance(number, bool) or not 0 <= number < 1 << 32:
            raise InvalidArgument(f"{where}[0].{key} must be an unsigned 32-bit integer, not {number!r}")
        numbers.append(number)
    container_id, host_id, length = numbers
    if container_id != 0:
        raise InvalidArgument(f"{where}[0] must map from id 0 inside, not {container_id}")
    if length == 0:
        raise InvalidArgument(f"{where}[0].length must not be 0")
    if host_id == 0 or host_id + length > 1 << 32:
        raise InvalidArgument(f"{where}[0] maps to host ids {host_id}..{host_id + length - 1}: they must "
                              "leave out the host's root and fit in 32 bits")
    return (IdMapping(container_id, host_id, length),)


class IdMap(Record):
    """A pod's user namespace as mounts need it: ``userns_fd`` (open on it, to id-map mounts
    with) and the host's ``root_uid`` and ``root_gid`` of its root. :meth:`close` closes the fd."""

    __slots__ = ("userns_fd", "root_uid", "root_gid")
    mutable = True
    userns_fd: int
    root_uid: int
    root_gid: int

    def __init__(self, userns_fd: int, root_uid: int, root_gid: int) -> None:
        self.userns_fd = userns_fd
        self.root_uid = root_uid
        self.root_gid = root_gid

    @classmethod
    def of_process(cls, pid: int) -> IdMap | None:
        """The user namespace of process ``pid`` (a pod's pause), or None when it is the shim's.
        Raises OSError (the process is gone)."""
        if os.stat(f"/proc/{pid}/ns/user").st_ino == os.stat("/proc/self/ns/user").st_ino:
            return None
        fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        try:
            ids = []
            for name in ("uid_map", "gid_map"):
                with open(f"/proc/{pid}/{name}") as f:
                    ids.append(_host_root(f.read()))
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, *ids)

    def close(self) -> None:
        if self.userns_fd >= 0:
            os.close(self.userns_fd)
            self.userns_fd = -1


def _host_root(text: str) -> int:
    for line in text.splitlines():
        inside, outside, _ = (int(n) for n in line.split())
        if inside == 0:
            return outside
    return OVERFLOW_ID  # root inside has no id
