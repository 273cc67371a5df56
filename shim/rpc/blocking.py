"""A blocking, single-call client and server loop over the same sans-IO codec.

For places that run no event loop: ``podshim start`` asking a template for a shim, and the
template itself, which must fork without a running event loop in the way. Same frames, same
messages, same status rules as the asyncio server and client.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from shim.rpc.addresses import parse_address, peer_credentials
from shim.rpc.connection import (
    CallRejected,
    CallStarted,
    ClientConnection,
    PeerClosed,
    ResponseReceived,
    ServerConnection,
)
from shim.rpc.dispatch import Handlers, answer, dispatch
from shim.rpc.frames import RemoteProtocolError
from shim.rpc.messages import Request
from shim.rpc.status import Code, InvalidArgument, Unavailable, error_from_status

__all__ = ["call", "serve_connection", "CAN_CONNECT_TIMEOUT", "NoAnswer", "NotServed", "ServedConnection", "can_connect"]


class NotServed(Unavailable):
    """Nothing accepted the connection: the call was never made."""


class NoAnswer(Unavailable):
    """The call was sent and no answer came within its timeout: it may have been carried out."""


#: A socket that accepts a connection within this is served by a live process (containerd: 100 ms).
CAN_CONNECT_TIMEOUT = 0.1


def can_connect(path: str, timeout: float = CAN_CONNECT_TIMEOUT) -> bool:
    """Whether a Unix socket at ``path`` accepts a connection within ``timeout`` seconds (a live
    server holds it); never raises."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    s.settimeout(timeout)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()

_READ_BYTES = 65536


def call(address: str, service: str, method: str, payload: dict[str, Any] | None = None, *,
         timeout: float = 5.0, connect_timeout: float | None = None) -> Any:
    """Connect (within ``connect_timeout``, default ``timeout``), make one unary call, close.
    Returns the payload or raises the typed error.

    A missing or refusing socket raises :class:`NotServed` at once, no answer within ``timeout``
    :class:`NoAnswer` (both Unavailable).
    """
    try:
        path = parse_address(address)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout if connect_timeout is None else connect_timeout)
    try:
        try:
            sock.connect(path)
        except OSError as exc:
            raise NotServed(f"cannot connect to {address}: {exc.strerror or exc}") from None
        sock.settimeout(timeout)
        conn = ClientConnection()
        sid, frame = conn.request(Request(service, method, payload or {}, int(timeout * 1e9)))
        try:
            sock.sendall(frame)
            while True:
                data = sock.recv(_READ_BYTES)
                for ev in conn.receive_data(data):
                    if isinstance(ev, ResponseReceived) and ev.stream_id == sid:
                        resp = ev.response
                        if resp.code != Code.OK:
                            raise error_from_status(resp.code, resp.message, resp.details)
                        return resp.payload
                    if isinstance(ev, PeerClosed):
                        raise Unavailable(f"{address} closed the connection without answering")
        except TimeoutError:
            raise NoAnswer(f"no answer from {address} within {timeout}s") from None
        except (OSError, RemoteProtocolError) as exc:
            raise Unavailable(f"connection to {address} failed: {exc}") from None
    finally:
        sock.close()


Handler = Callable[[Request], Any]


class ServedConnection:
    """One accepted connection of a server without an event loop: :meth:`serve` takes what the
    peer sent (one read), runs the calls it completes one at a time and sends their answers.
    A server that polls many of them calls :meth:`serve` when the socket is readable, so that no
    peer waits for another (the shim template); :func:`serve_connection` serves one to its end.

    Peers whose uid is not allowed are closed at once. ``handlers`` maps ``(service, method)``
    to a handler taking the Request and returning the payload (:func:`shim.rpc.dispatch.dispatch`).
    ``after_send`` runs after each batch of answers has been sent: work the caller should not
    wait for. Sending an answer may block up to ``timeout`` seconds.
    """

    def __init__(self, sock: socket.socket, handlers: Handlers[Handler], *, allowed_uids: set[int],
                 timeout: float = 5.0, after_send: Callable[[], None] | None = None) -> None:
        self.sock = sock
        self.handlers = handlers
        self.timeout = timeout
        self.after_send = after_send
        self.peer = peer_credentials(sock)
        self.closed = False
        self.conn = ServerConnection()
        if self.peer is None or self.peer.uid not in allowed_uids:
            self.close()

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.sock.close()

    def serve(self, *, wait: bool = False) -> bool:
        """Read what came (with ``wait``, up to ``timeout`` seconds for it; else only what is
        there), answer the calls it completes; whether the connection is still open."""
        if self.closed:
            return False
        try:
            self.sock.settimeout(self.timeout if wait else 0.0)
            try:
                data = self.sock.recv(_READ_BYTES)
            except BlockingIOError:
                return True
            events = self.conn.receive_data(data)
            out: list[bytes] = []
            ended = False
            for ev in events:
                if isinstance(ev, PeerClosed):
                    ended = True
                    break
                if isinstance(ev, CallRejected):
                    out.append(self.conn.reject(ev.stream_id, ev.code, ev.message))
                elif isinstance(ev, CallStarted):
                    response = dispatch(ev.request, self.handlers)
                    out.append(answer(self.conn, ev.stream_id, response, where=ev.request.full_method))
            if out:
                self.sock.settimeout(self.timeout)
                self.sock.sendall(b"".join(out))
                if self.after_send is not None and not ended:
                    self.after_send()
            if ended:
                self.close()
        except (OSError, RemoteProtocolError):
            self.close()
        return not self.closed


def serve_connection(sock: socket.socket, handlers: Handlers[Handler], *,
                     allowed_uids: set[int], timeout: float = 5.0,
                     after_send: Callable[[], None] | None = None) -> None:
    """Serve one accepted connection until the peer closes it (or sends nothing for ``timeout``
    seconds); calls run one at a time (:class:`ServedConnection`)."""
    served = ServedConnection(sock, handlers, allowed_uids=allowed_uids, timeout=timeout, after_send=after_send)
    try:
        while served.serve(wait=True):
            pass
    finally:
        served.close()
