"""The streaming server's listener: HTTP/1.1 in, one SPDY session (or, for exec and attach, one
WebSocket session: :mod:`.websocket`) per upgraded connection.

``/portforward/TOKEN``, ``/exec/TOKEN`` and ``/attach/TOKEN``: the token (:mod:`.tokens`) names the
CRI request that returned the URL; an unknown, used or expired one, a path of another kind, or a
request that is no SPDY/3.1 or WebSocket upgrade gets a plain-text HTTP error and the connection is closed. What a
session does is its handler's (:mod:`.portforward`, :mod:`.remotecommand`); this file only wires.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from shim.rpc.frames import NEED_DATA

from . import portforward, remotecommand, websocket
from .attach import AttachBackend, AttachRequest
from .remotecommand import ExecBackend, ExecRequest
from .session import Session
from .tokens import TokenError, Tokens
from .upgrade import HttpError, Request, RequestReader, error_response, negotiate, switching_protocols

__all__ = ["HEAD_TIMEOUT", "CLOSE_TIMEOUT", "MAX_UNAUTHENTICATED", "PortForwardRequest", "ExecRequest", "AttachRequest", "Backend",
           "StreamingServer", "split_address"]

log = logging.getLogger("podshimd.streaming")

#: Seconds a client has to send its request head after connecting (kubelet and crictl send it at once).
HEAD_TIMEOUT = 10.0
#: Connections that have not shown a token yet (anyone who reaches the port can open one): past
#: this many, a new one is closed at once, so idle connections cannot take the daemon's descriptors.
MAX_UNAUTHENTICATED = 128
#: Seconds the sessions get to end when the server closes.
CLOSE_TIMEOUT = 5.0


@dataclass(frozen=True, slots=True)
class PortForwardRequest:
    pod_sandbox_id: str


KINDS: dict[type, str] = {PortForwardRequest: "portforward", ExecRequest: "exec", AttachRequest: "attach"}
PROTOCOLS = {"portforward": (portforward.PROTOCOL,), "exec": remotecommand.PROTOCOLS,
             "attach": remotecommand.PROTOCOLS}


@dataclass(frozen=True, slots=True)
class Backend:
    """What sessions need from the pod layer: ``pod_network(pod_id)`` -> netns path ("" = host);
    ``execs``, how commands are started, waited for and killed."""

    pod_network: Callable[[str], Awaitable[str]]
    execs: ExecBackend | None = None
    attach: AttachBackend | None = None


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[V6]:PORT``) as (host, port). Raises ValueError."""
    host, sep, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{address!r} is not HOST:PORT")
    return host, int(port)


class SessionTasks:
    """The tasks serving one session's streams: each ends with the session (cancelled, awaited);
    one that fails is logged with its traceback and the others go on."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a streaming task failed", exc_info=task.exception())

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        while self._tasks:
            await asyncio.wait(set(self._tasks))


class StreamingServer:
    """Listens on ``address`` once :meth:`start` returned; :meth:`url` makes the URL of a CRI answer."""

    def __init__(self, address: str, backend: Backend, *, tokens: Tokens | None = None) -> None:
        self.host, self.port = split_address(address)
        self.backend = backend
        self.tokens = tokens or Tokens()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        self._unauthenticated = 0
        self._refused_since_log = 0
        self.base_url = ""

    async def start(self) -> None:
        """Bind and listen. Raises OSError."""
        self._server = await asyncio.start_server(self._serve_connection, self.host, self.port,
                                                  reuse_address=True)
        host, port = self._server.sockets[0].getsockname()[:2]
        self.port = port
        if ipaddress.ip_address(host).is_unspecified:
            host = "127.0.0.1" if ipaddress.ip_address(host).version == 4 else "::1"
        self.base_url = f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"

    def url(self, request: Any) -> str:
        """Store ``request`` (a PortForwardRequest, ...) under a one-time token; return its URL.
        Raises ResourceExhausted when too many URLs wait."""
        return f"{self.base_url}/{KINDS[type(request)]}/{self.tokens.insert(request)}"

    async def aclose(self) -> None:
        """Stop listening and end every session (their streams are cut; forwarded sockets closed)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(set(self._connections), timeout=CLOSE_TIMEOUT)
        if self._server is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), CLOSE_TIMEOUT)
            self._server = None

    async def __aenter__(self) -> StreamingServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- one connection ----------------------------------------------------------------------------
    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._handle(reader, writer)
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("streaming connection failed")
        finally:
            self._connections.discard(task)
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._unauthenticated >= MAX_UNAUTHENTICATED:
            if not self._refused_since_log:
                log.warning("streaming: %d connections have not sent a request with a token yet; closing new ones "
                            "until they do or their %.0f s run out", MAX_UNAUTHENTICATED, HEAD_TIMEOUT)
            self._refused_since_log += 1
            return
        if self._refused_since_log:
            log.warning("streaming: closed %d connections at once while too many waited", self._refused_since_log)
            self._refused_since_log = 0
        head = RequestReader()
        self._unauthenticated += 1
        try:
            async with asyncio.timeout(HEAD_TIMEOUT):
                while (request := head.next_event()) is NEED_DATA:
                    data = await reader.read(4096)
                    if not data:
                        return
                    head.feed(data)
            assert isinstance(request, Request)
            kind, stored, protocol = self._route(request)
        except HttpError as exc:
            log.debug("streaming request refused (%d): %s", exc.status, exc.message)
            writer.write(error_response(exc))
            with contextlib.suppress(TimeoutError, ConnectionError):  # a client that does not read is dropped
                await asyncio.wait_for(writer.drain(), HEAD_TIMEOUT)
            return
        except (TimeoutError, ConnectionError):
            return
        finally:
            self._unauthenticated -= 1
        tasks = SessionTasks()
        session: Session | websocket.WebSocketSession
        if websocket.is_websocket(request):
            writer.write(websocket.switching_protocols(request, protocol))
            handler = self._handler(stored, websocket.spdy_protocol(protocol), tasks)
            session = websocket.WebSocketSession(reader, writer, protocol, handler.stream_opened)
        else:
            writer.write(switching_protocols(protocol))
            handler = self._handler(stored, protocol, tasks)
            session = Session(reader, writer, handler.stream_opened)
        try:
            await session.run(head.trailing)
        finally:
            handler.close()
            await tasks.aclose()  # the client is gone: what serves its streams ends too

    def _route(self, request: Request) -> tuple[str, Any, str]:
        if request.method not in ("POST", "GET"):
            raise HttpError(405, f"method {request.method} is not allowed: use POST")
        parts = request.target.split("?", 1)[0].strip("/").split("/")
        if len(parts) != 2 or parts[0] not in PROTOCOLS:
            raise HttpError(404, f"no such streaming endpoint {request.target!r} (the paths are "
                                 "/exec/TOKEN, /attach/TOKEN and /portforward/TOKEN from a CRI call's URL)")
        kind, token = parts
        if websocket.is_websocket(request):  # kubelet proxies its client's WebSocket (exec, attach)
            if kind == "portforward":
                raise HttpError(400, "port-forward is served over SPDY/3.1 only, not a WebSocket")
            protocol = websocket.negotiate(request)
        else:
            protocol = negotiate(request, PROTOCOLS[kind])  # before the token is spent
        try:
            stored = self.tokens.consume(token)
        except TokenError as exc:
            raise HttpError(404, str(exc)) from None
        if KINDS[type(stored)] != kind:
            raise HttpError(400, f"this URL's token is for /{KINDS[type(stored)]}/, not /{kind}/")
        return kind, stored, protocol

    def _handler(self, stored: Any, protocol: str, tasks: SessionTasks) -> Any:
        if isinstance(stored, AttachRequest):
            assert self.backend.attach is not None
            return remotecommand.RemoteCommandSession(stored, protocol, self.backend.attach, tasks.spawn)
        if isinstance(stored, ExecRequest):
            assert self.backend.execs is not None
            return remotecommand.RemoteCommandSession(stored, protocol, self.backend.execs, tasks.spawn)
        if isinstance(stored, PortForwardRequest):
            pod_id = stored.pod_sandbox_id
            return portforward.PortForwardSession(pod_id, lambda: self.backend.pod_network(pod_id), tasks.spawn)
        raise AssertionError(f"no handler for {stored!r}")  # pragma: no cover

