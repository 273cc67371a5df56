"""The RPC client: one connection, many concurrent calls, typed errors.

    client = await Client.connect("unix:///run/podshim/s/ab12...")
    reply = await client.call("podshim.sandbox.v1.Sandbox", "PingSandbox", {"sandbox_id": sid},
                              timeout=5)
    await client.aclose()

Errors are the classes of :mod:`shim.rpc.status`: a non-OK status raises its class
(``NotFound``...), a lost connection raises :class:`Unavailable`, a passed deadline
:class:`DeadlineExceeded`.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

from shim.rpc.channel import Channel, parse_address
from shim.rpc.codecs import MSGPACK, Codec
from shim.rpc.connection import ClientConnection, DataReceived, PeerClosed, ResponseReceived
from shim.rpc.frames import LocalProtocolError
from shim.rpc.messages import NAMESPACE_KEY, Request, Response
from shim.rpc.status import Code, DeadlineExceeded, InvalidArgument, ResourceExhausted, Unavailable, error_from_status

__all__ = ["Client", "connect"]

_END = object()


class _ClientChannel(Channel):
    conn: ClientConnection

    def __init__(self, codec: Codec = MSGPACK) -> None:
        super().__init__()
        self.conn = ClientConnection(codec=codec)
        self.pending: dict[int, asyncio.Future[Response]] = {}
        self.streams: dict[int, asyncio.Queue[Any]] = {}
        self.lost_reason = "connection closed"
        self.close_callbacks: list[Callable[[], None]] = []

    def handle_events(self, events: list[Any]) -> None:
        for ev in events:
            kind = type(ev)
            if kind is ResponseReceived:
                fut = self.pending.pop(ev.stream_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(ev.response)
                q = self.streams.pop(ev.stream_id, None)
                if q is not None:
                    q.put_nowait(ev.response)
            elif kind is DataReceived:
                q = self.streams.get(ev.stream_id)
                if q is not None:
                    if ev.payload is not None:
                        q.put_nowait(ev.payload)
                    if ev.closed:
                        self.streams.pop(ev.stream_id, None)
                        q.put_nowait(_END)
            elif kind is PeerClosed:
                self.lost_reason = "the server closed the connection"
                self.close()

    def on_lost(self, exc: Exception | None) -> None:
        reason = f"{self.lost_reason}: {exc}" if exc else self.lost_reason
        err = Unavailable(reason)
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(err)
        self.pending.clear()
        for q in self.streams.values():
            q.put_nowait(err)
        self.streams.clear()
        for cb in self.close_callbacks:
            self.loop.call_soon(cb)


class Client:
    """A connection to one RPC server. Safe for many concurrent tasks on one event loop."""

    def __init__(self, channel: _ClientChannel, address: str, namespace: str | None):
        self._ch = channel
        self.address = address
        self.namespace = namespace

    @classmethod
    async def connect(cls, address: str, *, timeout: float = 5.0, namespace: str | None = None,
                      codec: Codec = MSGPACK) -> Client:
        """Connect to ``unix:///path``, to speak ``codec`` (:data:`~shim.rpc.codecs.PROTOBUF`: the
        payloads are the bytes of each method's protobuf message, as containerd's services take them).

        A missing or refusing socket fails at once with :class:`Unavailable` (no retry loop:
        a dead shim must not stall whoever asks, containerd#5597).
        """
        try:
            path = parse_address(address)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, path), timeout)
            _, ch = await loop.create_unix_connection(lambda: _ClientChannel(codec), sock=sock)
        except (TimeoutError, OSError) as exc:
            sock.close()
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise Unavailable(f"cannot connect to {address}: {why}") from None
        return cls(ch, address, namespace)

    @property
    def closed(self) -> bool:
        return self._ch.closed.is_set()

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` (on the loop) once the connection is gone, whoever closed it."""
        self._ch.close_callbacks.append(callback)

    async def wait_closed(self) -> None:
        await self._ch.closed.wait()

    def _request(self, service: str, method: str, payload: Any, timeout: float | None,
                 metadata: dict[str, list[str]] | None) -> Request:
        md = dict(metadata or {})
        if self.namespace is not None:
            md.setdefault(NAMESPACE_KEY, [self.namespace])
        timeout_nano = 0
        if timeout is not None:
            timeout_nano = max(1, int(timeout * 1e9))
        return Request(service, method, payload if payload is not None else {}, timeout_nano, md)

    def _send(self, req: Request, streaming: bool) -> int:
        ch = self._ch
        if ch.closed.is_set():
            raise Unavailable(f"connection to {self.address} is closed")
        try:
            sid, frame = ch.conn.request(req, streaming=streaming)
        except LocalProtocolError as exc:
            raise ResourceExhausted(str(exc)) from None
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"payload cannot be encoded: {exc}") from None
        ch.write(frame)
        return sid

    async def call(self, service: str, method: str, payload: Any = None, *, timeout: float | None = None,
                   metadata: dict[str, list[str]] | None = None) -> Any:
        """Make one unary call and return the response payload.

        ``timeout`` (seconds) travels as the call's deadline; the server cancels the handler
        when it passes and so does this side, whichever is first. Raises the typed error of a
        non-OK status.
        """
        req = self._request(service, method, payload, timeout, metadata)
        ch = self._ch
        sid = self._send(req, False)
        fut = ch.loop.create_future()
        ch.pending[sid] = fut
        timer = None
        if timeout is not None:
            timer = ch.loop.call_later(timeout + 0.05, _expire, ch, sid, fut)
        try:
            response: Response = await fut
        finally:
            ch.pending.pop(sid, None)
            if timer is not None:
                timer.cancel()
        if response.code != Code.OK:
            raise error_from_status(response.code, response.message, response.details)
        return response.payload

    async def stream(self, service: str, method: str, payload: Any = None, *, timeout: float | None = None,
                     metadata: dict[str, list[str]] | None = None) -> AsyncIterator[Any]:
        """Open a server stream and yield each message until the server ends it.

        Ends normally on an OK final status; raises the typed error otherwise.
        """
        req = self._request(service, method, payload, timeout, metadata)
        ch = self._ch
        q: asyncio.Queue[Any] = asyncio.Queue()
        sid = self._send(req, True)
        ch.streams[sid] = q
        try:
            while True:
                item = await q.get()
                if item is _END:
                    return
                if isinstance(item, Response):
                    if item.code != Code.OK:
                        raise error_from_status(item.code, item.message, item.details)
                    return
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            ch.streams.pop(sid, None)

    async def aclose(self) -> None:
        """Close the connection; pending calls fail with Unavailable."""
        self._ch.lost_reason = "the client closed the connection"
        self._ch.close()
        await self._ch.closed.wait()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _expire(ch: _ClientChannel, sid: int, fut: asyncio.Future[Response]) -> None:
    ch.pending.pop(sid, None)
    if not fut.done():
        fut.set_exception(DeadlineExceeded("deadline exceeded (no answer from the server in time)"))


async def connect(address: str, **kwargs: Any) -> Client:
    """Shorthand for :meth:`Client.connect`."""
    return await Client.connect(address, **kwargs)
