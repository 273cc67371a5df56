"""``portforward.k8s.io``: TCP connections to ports inside a pod's network namespace.

For every connection it forwards, the client opens two streams with the same ``port`` and
``requestID`` headers: an error stream (``streamType: error``), whose write side it closes at once,
and a data stream (``streamType: data``). The server connects to the port on the pod's loopback
(127.0.0.1, then ::1), copies bytes both ways (an end of one direction is passed on as a half-close),
and closes both streams when the connection is done. What goes wrong (nothing listening, a bad port)
is written as one sentence on the error stream, which the client shows; other connections and the
session go on. Clients that send no ``requestID`` (before Kubernetes 1.6) pair a data stream with the
error stream opened just before it (id - 2).

The socket is made in the pod's netns (:func:`shim.lib.namespaces.socket_in_netns`, by a worker
thread) and connected from the event loop; a host-network pod's ports are the host's.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from shim.lib.namespaces import socket_in_netns
from shim.rpc.status import RpcError

from .session import Stream, StreamClosed

__all__ = ["MAX_FORWARDS", "PROTOCOL", "STREAM_PAIR_TIMEOUT", "PortForwardSession", "connect_in_netns"]

log = logging.getLogger("podshimd.streaming")

PROTOCOL = "portforward.k8s.io"
#: Seconds the second stream of a pair may take to follow the first (kubelet's stream creation timeout).
STREAM_PAIR_TIMEOUT = 30.0
#: Connections one port-forward session forwards at once (each holds a socket in the daemon), and
#: as many half-opened pairs may wait for their second stream: a browser opens a few dozen; more is
#: refused on the connection's error stream, and the session goes on.
MAX_FORWARDS = 128
COPY_BYTES = 64 * 1024


class ForwardError(Exception):
    """A connection that cannot be forwarded; ``str()`` is the sentence for the error stream."""


async def connect_in_netns(netns_path: str, port: int) -> socket.socket:
    """A TCP connection to ``port`` on the loopback of the netns at ``netns_path`` ("" = this process's
    own, for host-network pods): 127.0.0.1 first, then ::1. Raises ForwardError, RpcError (no such netns)."""
    loop = asyncio.get_running_loop()
    first_error: OSError | None = None
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        if netns_path:
            sock = await asyncio.to_thread(socket_in_netns, netns_path, family)
        else:
            sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, (host, port))
            return sock
        except OSError as exc:
            sock.close()
            first_error = first_error or exc
            if exc.errno not in (errno.ECONNREFUSED, errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT, errno.ENETUNREACH):
                break
        except BaseException:
            sock.close()
            raise
    assert first_error is not None
    reason = os.strerror(first_error.errno) if first_error.errno else str(first_error)
    raise ForwardError(f"cannot connect to port {port} on the pod's localhost: {reason}")


class PortForwardSession:
    """The streams of one port-forward connection: pairs them and forwards each pair.

    ``network`` returns the pod's netns path ("" for host network), asked per connection so that a
    pod stopped meanwhile is reported. ``spawn`` runs a forwarding task owned by the session.
    """

    def __init__(self, pod_id: str, network: Callable[[], Awaitable[str]],
                 spawn: Callable[[Coroutine[Any, Any, Any]], None]) -> None:
        self.pod_id = pod_id
        self._network = network
        self._spawn = spawn
        self._pending: dict[str, dict[str, Stream]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._forwarding = 0

    def stream_opened(self, stream: Stream) -> None:
        kind = stream.header("streamtype")
        if kind not in ("error", "data"):
            log.debug("port-forward: refusing a stream of type %r", kind)
            stream.reset()
            return
        request_id = stream.header("requestid")
        if request_id is None:
            request_id = str(stream.stream_id if kind == "error" else stream.stream_id - 2)
        if request_id not in self._pending and len(self._pending) >= MAX_FORWARDS:
            log.debug("port-forward: pod %s: refusing request %s: %d requests already wait for their second stream",
                      self.pod_id, request_id, MAX_FORWARDS)
            stream.reset()
            return
        pair = self._pending.setdefault(request_id, {})
        if kind in pair:
            log.debug("port-forward: request %s opened a second %s stream", request_id, kind)
            stream.reset()
            return
        pair[kind] = stream
        if len(pair) < 2:
            loop = asyncio.get_running_loop()
            self._timers[request_id] = loop.call_later(STREAM_PAIR_TIMEOUT, self._unpaired, request_id)
            return
        del self._pending[request_id]
        self._timers.pop(request_id).cancel()
        if self._forwarding >= MAX_FORWARDS:
            self._spawn(self._fail(pair["error"], pair["data"], f"pod {self.pod_id}: this port-forward session "
                                   f"already forwards {MAX_FORWARDS} connections: close one first"))
            return
        self._forwarding += 1
        self._spawn(self._counted(self._forward(pair["error"], pair["data"])))

    async def _counted(self, forward: Coroutine[Any, Any, None]) -> None:
        try:
            await forward
        finally:
            self._forwarding -= 1

    def _unpaired(self, request_id: str) -> None:
        self._timers.pop(request_id, None)
        for stream in self._pending.pop(request_id, {}).values():
            log.debug("port-forward: request %s: its other stream did not come within %.0f s", request_id,
                      STREAM_PAIR_TIMEOUT)
            stream.reset()

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    async def _forward(self, error: Stream, data: Stream) -> None:
        error.discard()  # the client writes nothing on it
        port_text = data.header("port") or ""
        try:
            try:
                port = int(port_text)
                if not 1 <= port <= 65535:
                    raise ValueError
            except ValueError:
                raise ForwardError(f"port {port_text!r} is not a number from 1 to 65535") from None
            try:
                netns = await self._network()
            except RpcError as exc:
                raise ForwardError(exc.message) from None
            sock = await connect_in_netns(netns, port)
        except ForwardError as exc:
            await self._fail(error, data, f"pod {self.pod_id}: {exc}")
            return
        try:
            reader, writer = await asyncio.open_connection(sock=sock)
        except BaseException:
            sock.close()
            raise
        try:
            problem = await _copy_both_ways(data, reader, writer)
        finally:
            writer.close()
        if problem:
            await self._fail(error, data, f"pod {self.pod_id}: the connection to port {port} broke: {problem}")
        else:
            error.close()

    async def _fail(self, error: Stream, data: Stream, message: str) -> None:
        log.debug("port-forward: %s", message)
        try:
            await error.write(message.encode())
        except StreamClosed:
            pass
        error.close()
        data.discard()
        data.close()


async def _copy_both_ways(data: Stream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str:
    """Copy until both directions ended; return "" or what broke the connection."""
    async def upstream() -> None:  # client -> pod
        while chunk := await data.read():
            writer.write(chunk)
            await writer.drain()
        if data.was_reset:
            raise ConnectionAbortedError("the client reset the stream")
        if writer.can_write_eof():
            writer.write_eof()

    async def downstream() -> None:  # pod -> client
        while chunk := await reader.read(COPY_BYTES):
            await data.write(chunk)
        data.close()

    tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)
    failures = [error for t in tasks if not t.cancelled() and (error := t.exception()) is not None]
    if not failures:
        return ""
    data.reset()
    first = failures[0]
    if isinstance(first, (StreamClosed, ConnectionAbortedError)):
        return ""  # the client went away or gave up: nobody to tell
    if isinstance(first, OSError):
        return os.strerror(first.errno) if first.errno else str(first)
    raise first
