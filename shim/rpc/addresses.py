"""Unix socket addresses and peers, without an event loop: what the blocking client
(:mod:`.blocking`) and the asyncio channel (:mod:`.channel`) share, so a one-call process never
loads asyncio.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

from shim.rpc.records import Record
from shim.rpc.records import set_field as _set

__all__ = ["PeerCredentials", "parse_address", "peer_credentials"]

_UCRED = struct.Struct("3i")


class PeerCredentials(Record):
    """SO_PEERCRED of a Unix socket peer."""

    __slots__ = ("pid", "uid", "gid")
    pid: int
    uid: int
    gid: int

    def __init__(self, pid: int, uid: int, gid: int) -> None:
        _set(self, "pid", pid)
        _set(self, "uid", uid)
        _set(self, "gid", gid)


def peer_credentials(sock: Any) -> PeerCredentials | None:
    """The connected peer's pid/uid/gid, or None when the socket has none (not AF_UNIX)."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except (OSError, AttributeError):
        return None
    return PeerCredentials(*_UCRED.unpack(raw))


def parse_address(address: str) -> str:
    """Turn ``unix:///path`` (or a bare absolute path) into a filesystem path.

    Raises ValueError for any other form: podshim speaks only path-based Unix sockets
    (abstract sockets are reachable from host-network containers, CVE-2020-15257).
    """
    if address.startswith("unix://"):
        path = address[len("unix://"):]
    elif address.startswith("ttrpc+unix://"):
        path = address[len("ttrpc+unix://"):]
    else:
        path = address
    if not path.startswith("/"):
        raise ValueError(f"address {address!r} is not unix:///absolute/path")
    return path
