"""systemd's side channels: the notify socket (READY=1, STATUS=, STOPPING=1) and LISTEN_FDS.

Both are a few lines of protocol; writing them here keeps the shim free of a libsystemd binding.
"""

from __future__ import annotations

import logging
import os
import socket

__all__ = ["Notifier", "SD_LISTEN_FDS_START", "listen_fds"]

log = logging.getLogger(__name__)

SD_LISTEN_FDS_START = 3


def listen_fds(*, unset_environment: bool = True) -> list[int]:
    """The file descriptors systemd passed us (socket activation), or [] when none were.

    Only honoured when LISTEN_PID names this process, as sd_listen_fds(3) requires.
    """
    try:
        pid = int(os.environ.get("LISTEN_PID", ""))
        count = int(os.environ.get("LISTEN_FDS", ""))
    except ValueError:
        return []
    if unset_environment:
        for key in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            os.environ.pop(key, None)
    if pid != os.getpid() or count <= 0:
        return []
    fds = list(range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + count))
    for fd in fds:
        os.set_inheritable(fd, False)
    return fds


class Notifier:
    """Sends sd_notify(3) messages when NOTIFY_SOCKET is set; does nothing otherwise."""

    def __init__(self, address: str | None):
        self.address = address
        self._sock: socket.socket | None = None
        if address:
            if address.startswith("@"):
                address = "\0" + address[1:]
            self._target = address
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @classmethod
    def from_env(cls) -> Notifier:
        address = os.environ.pop("NOTIFY_SOCKET", None)
        return cls(address)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, *lines: str) -> None:
        """Send ``KEY=VALUE`` lines in one datagram; failures are logged, never raised."""
        if self._sock is None:
            return
        try:
            self._sock.sendto("\n".join(lines).encode(), self._target)
        except OSError as exc:
            log.warning("sd_notify to %s failed: %s", self.address, exc)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
