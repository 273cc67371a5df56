"""systemd socket activation: the CRI socket podshimd was given.

``systemd/podshimd.socket`` owns the CRI socket: it exists before podshimd runs and across its
restarts, so a client that connects meanwhile waits instead of failing. A socket-activated
podshimd serves on that descriptor itself, and leaves the socket to systemd when it stops; one
started without it binds the path itself.
"""

from __future__ import annotations

import os
import socket

from shim.lib.notify import listen_fds

__all__ = ["ActivationError", "inherited_listener"]


class ActivationError(Exception):
    """systemd passed descriptors podshimd cannot serve on; the message says why in one sentence."""


def inherited_listener(path: str) -> socket.socket | None:
    """The listening socket systemd passed for ``path`` (LISTEN_FDS), or None when podshimd was
    not socket-activated. Raises ActivationError for anything else than one Unix stream socket
    bound to ``path``."""
    fds = listen_fds()
    if not fds:
        return None
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise ActivationError(f"systemd passed {len(fds)} sockets; podshimd serves on one ({path})")
    listener = socket.socket(fileno=fds[0])
    try:
        if listener.family != socket.AF_UNIX or listener.type != socket.SOCK_STREAM:
            raise ActivationError(f"the socket systemd passed is not a Unix stream socket; podshimd serves on {path}")
        bound = listener.getsockname()
        if bound != path:
            raise ActivationError(f"the socket systemd passed is bound to {bound!r}, but podshimd's listen "
                                  f"address is unix://{path}: give both the same path")
        listener.set_inheritable(False)
    except BaseException:
        listener.close()
        raise
    return listener

