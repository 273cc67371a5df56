"""The RPC server: routes requests to handlers, enforces deadlines, answers every stream once.

Handlers are ``async def handler(ctx, payload) -> result`` (unary) or
``async def handler(ctx, payload, stream) -> None`` (server stream: ``await stream.send(obj)``).
They raise :class:`~shim.rpc.status.RpcError` subclasses; anything else becomes a status in
:mod:`shim.rpc.dispatch` (the one place that does that, shared with the blocking server).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import resource
import socket
from collections.abc import Callable, Coroutine
from typing import Any

from shim.rpc.channel import Channel, PeerCredentials, peer_credentials
from shim.rpc.codecs import PROTOBUF
from shim.rpc.connection import CallRejected, CallStarted, PeerClosed, ServerConnection, StreamInput
from shim.rpc.dispatch import answer, failure, route
from shim.rpc.frames import MAX_DATA_BYTES
from shim.rpc.messages import Request, Response
from shim.rpc.records import Record
from shim.rpc.status import Code

__all__ = ["CallContext", "ServerStream", "Server", "UnaryHandler", "StreamHandler"]

log = logging.getLogger(__name__)

UnaryHandler = Callable[["CallContext", dict[str, Any]], Coroutine[Any, Any, Any]]
StreamHandler = Callable[["CallContext", dict[str, Any], "ServerStream"], Coroutine[Any, Any, Any]]

#: Connections one server holds at once (protocol.md 1, "Connection limit"). At the limit a new
#: connection makes room by closing the one idle longest (no call in flight, nothing buffered):
#: whoever connects (a controller that just started) gets in, and idle connections cost nothing
#: but a reconnect. Only when every connection has a call in flight is the new one refused.
MAX_CONNECTIONS = 1024
#: A refused connection: the requests it sends first are answered RESOURCE_EXHAUSTED, then it is
#: closed; one that sends nothing is closed after this many seconds.
REFUSED_LINGER = 1.0
#: Refused connections waiting to be answered at once; beyond this a refused one is closed
#: without a byte (a flood must not hold descriptors).
MAX_REFUSED = 64
#: Descriptors a shim needs besides its connections (listener, pidfds, pipes, logs, netns...).
FD_HEADROOM = 256


class CallContext:
    """What a handler knows about its call: the request, the peer, the deadline."""

    __slots__ = ("request", "peer", "deadline", "_after")

    def __init__(self, request: Request, peer: PeerCredentials | None, deadline: float | None = None):
        self.request = request
        self.peer = peer
        #: absolute ``loop.time()`` at which the call's deadline passes, or None
        self.deadline = deadline
        self._after: list[Callable[[], None]] = []

    @property
    def namespace(self) -> str | None:
        return self.request.namespace

    def after_response(self, callback: Callable[[], None]) -> None:
        """Run ``callback()`` once this call's response has been handed to the socket
        (e.g. to exit the process only after ShutdownSandbox has answered)."""
        self._after.append(callback)


class _Method(Record):
    __slots__ = ("handler", "streaming")
    mutable = True
    handler: Callable[..., Coroutine[Any, Any, Any]]
    streaming: bool

    def __init__(self, handler: Callable[..., Coroutine[Any, Any, Any]], streaming: bool) -> None:
        self.handler = handler
        self.streaming = streaming


class ServerStream:
    """The server's end of a server stream: send data frames until the handler returns."""

    __slots__ = ("_channel", "stream_id")

    def __init__(self, channel: _ServerChannel, stream_id: int):
        self._channel = channel
        self.stream_id = stream_id

    async def send(self, payload: Any) -> None:
        """Send one message on the stream; waits while the client is not reading.

        Raises :class:`asyncio.CancelledError` via the handler's cancellation when the
        connection closes, and LocalProtocolError if ``payload`` is too large.
        """
        ch = self._channel
        if self.stream_id not in ch.conn.active:
            raise asyncio.CancelledError()
        ch.write(ch.conn.data(self.stream_id, payload))
        await ch.drain()


class _ServerChannel(Channel):
    pause_reading_when_blocked = True
    conn: ServerConnection

    def __init__(self, server: Server):
        super().__init__()
        self.server = server
        self.conn = ServerConnection(max_data_bytes=server.max_data_bytes)
        self.peer: PeerCredentials | None = None
        self.tasks: dict[int, asyncio.Task[Any]] = {}
        self.timers: dict[int, asyncio.TimerHandle] = {}
        self.client_streaming: set[int] = set()
        self.eof = False
        #: ``loop.time()`` of the last bytes read or call answered: who is idle longest.
        self.last_active = self.loop.time()
        #: Over the connection limit: answer RESOURCE_EXHAUSTED and close (see _refuse).
        self.refused = False
        self._linger: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.peer = peer_credentials(transport.get_extra_info("socket"))
        refusal = self.server.refusal(self.peer)
        if refusal is not None:
            log.warning("refusing connection: %s", refusal)
            self.abort()
            return
        server = self.server
        if len(server.channels) >= server.max_connections and not server.make_room():
            self._refuse()
            return
        server.channels.add(self)

    @property
    def idle(self) -> bool:
        """No call in flight and no request half-read: closing it loses nothing."""
        return not self.tasks and not self.conn.active and not self.conn.decoder.buffered_bytes

    def _refuse(self) -> None:
        server = self.server
        pid = self.peer.pid if self.peer is not None else "?"
        if len(server.refused) >= MAX_REFUSED:
            log.warning("refusing connection of pid %s without an answer: %d connections open, each with a call "
                        "in flight, and %d refused ones still being answered", pid, len(server.channels),
                        len(server.refused))
            self.abort()
            return
        log.warning("refusing connection of pid %s: %d connections open, each with a call in flight",
                    pid, len(server.channels))
        self.refused = True
        server.refused.add(self)
        self._linger = self.loop.call_later(REFUSED_LINGER, self.abort)

    def data_received(self, data: bytes) -> None:
        self.last_active = self.loop.time()
        super().data_received(data)

    def handle_events(self, events: list[Any]) -> None:
        if self.refused:
            self._answer_refused(events)
            return
        for ev in events:
            kind = type(ev)
            if kind is CallStarted:
                self._start(ev)
            elif kind is CallRejected:
                self.write(self.conn.reject(ev.stream_id, ev.code, ev.message))
            elif kind is StreamInput:
                if ev.stream_id not in self.client_streaming:
                    self._finish(ev.stream_id, Response(
                        Code.INVALID_ARGUMENT, f"data frames are not allowed on unary stream {ev.stream_id}"))
                    task = self.tasks.get(ev.stream_id)
                    if task is not None:
                        task.cancel()
            elif kind is PeerClosed:
                self.eof = True
                self._close_if_idle()

    def _answer_refused(self, events: list[Any]) -> None:
        """Answer each request of a refused connection RESOURCE_EXHAUSTED, then close it."""
        message = (f"the shim has {self.server.max_connections} connections open (its limit), each with a call "
                   "in flight; try again later")
        answered = False
        for ev in events:
            if type(ev) in (CallStarted, CallRejected):
                self.write(self.conn.reject(ev.stream_id, Code.RESOURCE_EXHAUSTED, message))
                answered = True
            elif type(ev) is PeerClosed:
                answered = True
        if answered:
            self.close()

    def _start(self, ev: CallStarted) -> None:
        req = ev.request
        sid = ev.stream_id
        server = self.server
        method = route(req, server._protobuf_methods if self.conn.codec is PROTOBUF else server._methods)
        if isinstance(method, Response):  # UNIMPLEMENTED
            self._finish(sid, method, req.full_method)
            return
        deadline = None
        if req.timeout_nano:
            deadline = self.loop.time() + req.timeout_nano / 1e9
        ctx = CallContext(req, self.peer, deadline)
        if method.streaming:
            coro = method.handler(ctx, req.payload, ServerStream(self, sid))
        else:
            coro = method.handler(ctx, req.payload)
        task = self.loop.create_task(coro)
        self.tasks[sid] = task
        task.add_done_callback(functools.partial(self._on_done, sid, ctx))
        if deadline is not None:
            self.timers[sid] = self.loop.call_at(deadline, self._on_deadline, sid)

    def _on_deadline(self, sid: int) -> None:
        self.timers.pop(sid, None)
        # Answer now, even if the handler swallows its cancellation: the client's deadline
        # must not depend on the handler's good behaviour.
        self._finish(sid, Response(Code.DEADLINE_EXCEEDED, "deadline exceeded"))
        task = self.tasks.get(sid)
        if task is not None:
            task.cancel()

    def _on_done(self, sid: int, ctx: CallContext, task: asyncio.Task[Any]) -> None:
        req = ctx.request
        self.tasks.pop(sid, None)
        self.last_active = self.loop.time()
        timer = self.timers.pop(sid, None)
        if timer is not None:
            timer.cancel()
        if sid in self.conn.active:
            if task.cancelled():
                response = Response(Code.CANCELLED, "the call was cancelled")
            elif (exc := task.exception()) is not None:
                response = failure(exc, where=req.full_method)
            else:
                response = Response(Code.OK, "", [], task.result())
            self._finish(sid, response, req.full_method)
        elif not task.cancelled() and (exc := task.exception()) is not None:
            # Answered already (its deadline passed); the one mapping still logs what went wrong.
            failure(exc, where=f"{req.full_method} (after its deadline)")
        for callback in ctx._after:
            # Queued after the flush that write() scheduled, so it runs once the bytes left.
            self.loop.call_soon(callback)
        self._close_if_idle()

    def _finish(self, sid: int, response: Response, where: str = "") -> None:
        if sid not in self.conn.active:
            return
        self.write(answer(self.conn, sid, response, where=where))

    def _close_if_idle(self) -> None:
        if self.eof and not self.tasks:
            self.close()

    def on_lost(self, exc: Exception | None) -> None:
        self.server.channels.discard(self)
        self.server.refused.discard(self)
        if self._linger is not None:
            self._linger.cancel()
        for timer in self.timers.values():
            timer.cancel()
        self.timers.clear()
        self.conn.active.clear()
        # A dropped connection cancels its handlers (protocol.md, "Cancellation").
        for task in list(self.tasks.values()):
            task.cancel()


class Server:
    """Serves registered services on listening Unix sockets.

    By default only peers with the server's effective uid, or root, are served
    (SO_PEERCRED); pass ``allowed_uids`` to change that. At most ``max_connections`` are held
    at once (:data:`MAX_CONNECTIONS`; what happens beyond is :meth:`make_room`'s and
    protocol.md's "Connection limit").
    """

    def __init__(self, *, allowed_uids: set[int] | None = None, max_data_bytes: int = MAX_DATA_BYTES,
                 max_connections: int = MAX_CONNECTIONS):
        self._methods: dict[tuple[str, str], _Method] = {}
        #: The methods of the services whose payloads are protobuf (protocol.md, "Protobuf payloads").
        self._protobuf_methods: dict[tuple[str, str], _Method] = {}
        euid = os.geteuid()
        self.allowed_uids = allowed_uids if allowed_uids is not None else {euid, 0}
        self.max_data_bytes = max_data_bytes
        self.max_connections = max_connections
        self.channels: set[_ServerChannel] = set()
        self.refused: set[_ServerChannel] = set()
        self._servers: list[asyncio.AbstractServer] = []

    def register(self, service: str, unary: dict[str, UnaryHandler] | None = None,
                 streams: dict[str, StreamHandler] | None = None, *, protobuf: bool = False) -> None:
        """Add a service's methods. Raises ValueError on a duplicate method.

        A ``protobuf`` service is called on connections that speak protobuf (a payload is the bytes
        of the method's message, and so is a handler's result); the others on msgpack connections.
        """
        table = self._protobuf_methods if protobuf else self._methods
        for name, handler in (unary or {}).items():
            self._add(table, service, name, _Method(handler, False))
        for name, stream_handler in (streams or {}).items():
            self._add(table, service, name, _Method(stream_handler, True))

    @staticmethod
    def _add(table: dict[tuple[str, str], _Method], service: str, name: str, method: _Method) -> None:
        if (service, name) in table:
            raise ValueError(f"/{service}/{name} is already registered")
        table[(service, name)] = method

    def refusal(self, peer: PeerCredentials | None) -> str | None:
        """Why a peer is refused, or None when it may call."""
        if peer is None:
            return "peer credentials unavailable"
        if peer.uid not in self.allowed_uids:
            return f"peer pid {peer.pid} has uid {peer.uid}; only uids {sorted(self.allowed_uids)} are served"
        return None

    def make_room(self) -> bool:
        """Close the connection idle longest to let a new one in; False when every connection
        has a call in flight (the new one is then refused)."""
        idle = [ch for ch in self.channels if ch.idle]
        if not idle:
            return False
        victim = min(idle, key=lambda ch: ch.last_active)
        log.info("%d connections open (the limit): closing the one idle longest (%.1fs, peer pid %s)",
                 len(self.channels), victim.loop.time() - victim.last_active,
                 victim.peer.pid if victim.peer is not None else "?")
        self.channels.discard(victim)
        victim.close()
        return True

    async def start(self, sock: socket.socket) -> None:
        """Serve on an already bound and listening socket; returns once accepting.

        Raises the soft limit on open descriptors, when it is lower, to what
        ``max_connections`` needs (up to the hard limit; below it, fewer connections fit and a
        warning says how many).
        """
        _reserve_descriptors(self.max_connections + MAX_REFUSED + FD_HEADROOM)
        loop = asyncio.get_running_loop()
        sock.setblocking(False)
        srv = await loop.create_unix_server(lambda: _ServerChannel(self), sock=sock, start_serving=True)
        self._servers.append(srv)

    async def aclose(self, timeout: float = 2.0, *, protobuf_peers_close: bool = False) -> None:
        """Stop accepting, cancel the calls in flight (each is answered CANCELLED), give the answers
        ``timeout`` seconds to leave, then close.

        With ``protobuf_peers_close`` (the shim ends because a call asked it to), containerd's
        connections (protobuf) are left for containerd to close, as it does once it has read the
        last answer, and closed here only when ``timeout`` has passed: closing one first races
        containerd's ttrpc client, which can then fail a call that was answered with 'ttrpc:
        closed' (its dispatch picks at random between the answer and the connection's end).
        """
        for srv in self._servers:
            srv.close()
        self._servers.clear()
        channels = list(self.channels)
        for ch in channels:
            for task in list(ch.tasks.values()):
                task.cancel()
        for ch in channels:
            if not (protobuf_peers_close and ch.conn.codec is PROTOBUF):
                ch.close()
        for ch in list(self.refused):
            ch.abort()
        if channels:
            await asyncio.wait([asyncio.ensure_future(ch.closed.wait()) for ch in channels], timeout=timeout)
        for ch in channels:
            if not ch.closed.is_set():
                ch.abort()


def _reserve_descriptors(needed: int) -> None:
    """Raise RLIMIT_NOFILE's soft limit to ``needed`` (at most the hard limit) if it is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the limit on open files from %d to %d: %s", soft, target, exc)
            return
        if target < needed:
            log.warning("the hard limit on open files (%d) leaves room for fewer connections than %d",
                        hard, needed - MAX_REFUSED - FD_HEADROOM)
