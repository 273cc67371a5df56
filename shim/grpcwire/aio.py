"""An asyncio gRPC server over :mod:`shim.grpcwire.server`: the thin transport around the sans-IO
connection, on the process's event loop.

Everything happens on the loop that reads the socket: a read that brings whole requests starts
their handlers at once, each in a task of its own, and a handler's reply is written as soon as it
returns. No thread and no completion queue stand between the socket and the handlers, so a call
costs one wake-up of the loop however busy it is, and calls that arrive together start together.

A method is a :class:`Method`: the handler ``(request, context)`` (a coroutine function, or an
async generator function for a server stream), and how its request is decoded and its replies
encoded. Whatever a handler raises becomes the call's status through
:func:`shim.rpc.dispatch.status_from_exception`, the one place that maps exceptions, as the ttrpc
servers do. A call past its deadline is cancelled and answered DEADLINE_EXCEEDED; a call its
client cancelled (or whose connection closed) is cancelled. :meth:`Server.stop` takes no more
calls (a GOAWAY on every connection), gives those in flight ``grace`` seconds, then cancels them.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from shim.grpcwire.server import Call, Cancelled, Metadata, ServerConnection
from shim.rpc.dispatch import status_from_exception
from shim.rpc.status import Code, RpcError

__all__ = ["Context", "Method", "Server", "STREAM_BACKLOG_BYTES"]

log = logging.getLogger(__name__)

#: A server stream waits for its client to read once this much of its reply is unsent.
STREAM_BACKLOG_BYTES: Final = 1024 * 1024

#: Called when a call has finished: its path, its seconds (None for a server stream) and its status.
Finished = Callable[[str, "float | None", Code], None]


@dataclass(frozen=True)
class Method:
    """One RPC: ``handler(request, context)`` (a coroutine function; an async generator function
    for a server stream), ``decode`` of the request's bytes, ``encode`` of each reply. ``where``
    names it in the log and in the sentence of an unexpected failure."""

    handler: Callable[[Any, Context], Any]
    decode: Callable[[bytes], Any]
    encode: Callable[[Any], bytes]
    where: str = ""

    @property
    def streaming(self) -> bool:
        return inspect.isasyncgenfunction(self.handler)


class Context:
    """What a handler may know of its call and do to it (the part of grpc.aio's ServicerContext
    that podshim's handlers use)."""

    def __init__(self, call: Call, protocol: _Protocol):
        self._call = call
        self._protocol = protocol
        self._deadline = None if call.timeout is None else time.monotonic() + call.timeout

    def invocation_metadata(self) -> Metadata:
        """The call's metadata, as its client sent it."""
        return self._call.metadata

    def time_remaining(self) -> float | None:
        """Seconds left before the call's deadline; None when it has none."""
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    async def send_initial_metadata(self, metadata: Metadata = ()) -> None:
        """Send the reply's headers now: a client waiting for them knows the call was taken."""
        self._protocol.send_initial_metadata(self._call.stream_id, metadata)

    async def abort(self, code: Code, details: str) -> None:
        """End the call with ``code`` and ``details`` (raises)."""
        raise RpcError(details, code=code)


class Server:
    """Serves ``methods`` (by ``/package.Service/Method`` path) on listening unix sockets."""

    def __init__(self, methods: Mapping[str, Method], *, on_finished: Finished | None = None,
                 max_request_bytes: int | None = None):
        self.methods = dict(methods)
        self.on_finished = on_finished
        self.max_request_bytes = max_request_bytes
        self._listeners: list[asyncio.AbstractServer] = []
        self._protocols: set[_Protocol] = set()
        self._stopping = False

    async def start(self, sock: socket.socket) -> None:
        """Serve on the listening socket ``sock`` (bound by the caller, or inherited from systemd)."""
        loop = asyncio.get_running_loop()
        self._listeners.append(await loop.create_unix_server(lambda: _Protocol(self), sock=sock))

    async def stop(self, grace: float) -> None:
        """Stop listening and take no more calls; calls in flight get ``grace`` seconds to finish,
        then are cancelled; then every connection is closed."""
        self._stopping = True
        for listener in self._listeners:
            listener.close()
        for protocol in list(self._protocols):
            protocol.goaway()
        tasks = {task for protocol in self._protocols for task in protocol.calls.values()}
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=grace)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
        for protocol in list(self._protocols):
            protocol.close()
        for listener in self._listeners:
            await listener.wait_closed()
        self._listeners.clear()


class _Protocol(asyncio.Protocol):
    """One accepted connection: bytes to the sans-IO core, its calls to tasks, replies back."""

    def __init__(self, server: Server):
        self.server = server
        self.conn = (ServerConnection() if server.max_request_bytes is None
                     else ServerConnection(server.max_request_bytes))
        self.calls: dict[int, asyncio.Task[None]] = {}
        self._why_cancelled: dict[int, Code] = {}  # calls this side cancelled: the status they get
        self._transport: asyncio.Transport | None = None
        self._window: dict[int, asyncio.Event] = {}  # server streams waiting for the client to read

    # -- the transport's side ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport
        self.server._protocols.add(self)
        if self.server._stopping:
            self.conn.goaway()
        self._write()

    def data_received(self, data: bytes) -> None:
        self._events(self.conn.receive_data(data))
        self._write()
        for sid, waiting in list(self._window.items()):
            if self.conn.backlog(sid) < STREAM_BACKLOG_BYTES:
                waiting.set()

    def eof_received(self) -> bool | None:
        self._events(self.conn.receive_data(b""))
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._protocols.discard(self)
        self._transport = None
        self._events(self.conn.receive_data(b""))
        for waiting in self._window.values():
            waiting.set()

    # -- calls --------------------------------------------------------------------------------------

    def _events(self, events: list[Call | Cancelled]) -> None:
        for event in events:
            if isinstance(event, Call):
                self.calls[event.stream_id] = asyncio.ensure_future(self._run(event))
            else:
                task = self.calls.get(event.stream_id)
                if task is not None and not task.done():
                    self._why_cancelled[event.stream_id] = Code.CANCELLED
                    task.cancel()
        self._close_if_done()

    async def _run(self, call: Call) -> None:
        sid = call.stream_id
        started = time.monotonic()
        code = Code.OK
        method = self.server.methods.get(call.path)
        expiry = None
        if call.timeout is not None:
            expiry = asyncio.get_running_loop().call_later(call.timeout, self._expire, sid)
        try:
            if method is None:
                raise RpcError(f"unknown method {call.path}", code=Code.UNIMPLEMENTED)
            try:
                request = method.decode(call.message)
            except RpcError:
                raise
            except Exception as exc:
                raise RpcError(f"cannot decode the request of {call.path}: {exc}", code=Code.INTERNAL) from None
            context = Context(call, self)
            if method.streaming:
                async for item in method.handler(request, context):
                    self.conn.send_message(sid, method.encode(item))
                    self._write()
                    await self._wait_for_window(sid)
            else:
                reply = await method.handler(request, context)
                self.conn.send_message(sid, method.encode(reply))
            self.conn.send_status(sid, Code.OK)
        except asyncio.CancelledError:
            code = self._why_cancelled.get(sid, Code.CANCELLED)
            if sid not in self._why_cancelled:
                raise  # not this server's doing: the loop is going away
            self.conn.send_status(sid, code, "deadline exceeded" if code == Code.DEADLINE_EXCEEDED
                                  else "the call was cancelled")
        except Exception as exc:
            code, details, _ = status_from_exception(exc, where=method.where if method is not None else call.path)
            if code == Code.OK:  # an RpcError built with OK: a bug, said as one
                code, details = Code.UNKNOWN, f"{call.path} failed with status OK: {details}"
            self.conn.send_status(sid, code, details)
        finally:
            if expiry is not None:
                expiry.cancel()
            self.calls.pop(sid, None)
            self._why_cancelled.pop(sid, None)
            self._window.pop(sid, None)
            self._write()
            self._close_if_done()
            if self.server.on_finished is not None:
                streamed = method is not None and method.streaming
                self.server.on_finished(call.path, None if streamed else time.monotonic() - started, code)

    def _expire(self, sid: int) -> None:
        task = self.calls.get(sid)
        if task is not None and not task.done():
            self._why_cancelled[sid] = Code.DEADLINE_EXCEEDED
            task.cancel()

    async def _wait_for_window(self, sid: int) -> None:
        """A server stream's next item waits while the client reads too little of the last ones."""
        while self._transport is not None and self.conn.backlog(sid) >= STREAM_BACKLOG_BYTES:
            waiting = self._window[sid] = asyncio.Event()
            await waiting.wait()

    # -- replies and the connection -----------------------------------------------------------------

    def send_initial_metadata(self, sid: int, metadata: Metadata) -> None:
        self.conn.send_initial_metadata(sid, metadata)
        self._write()

    def goaway(self) -> None:
        self.conn.goaway()
        self._write()
        self._close_if_done()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _write(self) -> None:
        data = self.conn.data_to_send()
        if data and self._transport is not None:
            self._transport.write(data)

    def _close_if_done(self) -> None:
        """Close once no call is open and no more will come (our GOAWAY, the client's, or EOF)."""
        if self.conn.closed is not None and not self.calls and not self.conn.open_calls:
            self.close()

