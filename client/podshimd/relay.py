"""systemd socket activation for a gRPC server that cannot serve on an inherited descriptor.

``systemd/podshimd.socket`` owns the CRI socket: it exists before podshimd runs and across its
restarts, so a client that connects meanwhile waits instead of failing. grpcio cannot serve on a
listening descriptor it did not bind (its core's socket activation is a build option the wheels
leave out), so a socket-activated podshimd binds gRPC to a private socket beside the public one
and relays every connection accepted on systemd's socket to it, bytes both ways, half-closes
passed on. A podshimd started without the socket binds gRPC to the public path itself and runs no
relay.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from shim.lib.notify import listen_fds

__all__ = ["RELAY_CHUNK_BYTES", "ActivationError", "inherited_listener", "start_relay"]

log = logging.getLogger("podshimd")

#: What one read moves from one side of a relayed connection to the other.
RELAY_CHUNK_BYTES = 256 * 1024


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


async def start_relay(listener: socket.socket, target: str) -> asyncio.AbstractServer:
    """Serve ``listener``: each connection is relayed to the Unix socket ``target``. Returns the
    server (its ``close()`` stops accepting; relayed connections end with either side)."""

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_unix_connection(target)
        except OSError as exc:
            log.warning("cannot relay a connection to %s: %s", target, exc.strerror or exc)
            writer.close()
            return
        try:
            await asyncio.gather(_pipe(reader, upstream_writer, writer), _pipe(upstream_reader, writer, upstream_writer))
        finally:
            writer.close()
            upstream_writer.close()

    listener.setblocking(False)
    return await asyncio.start_unix_server(relay, sock=listener, limit=RELAY_CHUNK_BYTES)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, reader_side: asyncio.StreamWriter) -> None:
    """Copy ``reader`` to ``writer`` until EOF, then half-close ``writer``. If either side fails,
    close both (``reader_side`` is the writer of ``reader``'s connection), which ends the other
    direction's copy too."""
    try:
        while data := await reader.read(RELAY_CHUNK_BYTES):
            writer.write(data)
            await writer.drain()
        if not writer.is_closing() and writer.can_write_eof():
            writer.write_eof()  # the peer finished sending: tell the other side, keep reading
    except (OSError, RuntimeError):  # a side went away (uvloop says so with RuntimeError)
        writer.close()
        reader_side.close()
