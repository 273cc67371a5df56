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

__all__ = ["call", "serve_connection", "CAN_CONNECT_TIMEOUT", "NoAnswer", "NotServed", "can_connect"]


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


def serve_connection(sock: socket.socket, handlers: Handlers[Handler], *,
                     allowed_uids: set[int], timeout: float = 5.0,
                     after_send: Callable[[], None] | None = None) -> None:
    """Serve one accepted connection until the peer closes it; calls run one at a time.

    Peers whose uid is not allowed are closed at once. ``handlers`` maps ``(service, method)``
    to a handler taking the Request and returning the payload (:func:`shim.rpc.dispatch.dispatch`).
    ``after_send`` runs after each batch of answers has been sent: work the caller should
    not wait for.
    """
    peer = peer_credentials(sock)
    if peer is None or peer.uid not in allowed_uids:
        sock.close()
        return
    sock.settimeout(timeout)
    conn = ServerConnection()
    try:
        while True:
            try:
                data = sock.recv(_READ_BYTES)
                events = conn.receive_data(data)
            except (OSError, RemoteProtocolError):
                return
            out: list[bytes] = []
            for ev in events:
                if isinstance(ev, PeerClosed):
                    if out:
                        sock.sendall(b"".join(out))
                    return
                if isinstance(ev, CallRejected):
                    out.append(conn.reject(ev.stream_id, ev.code, ev.message))
                elif isinstance(ev, CallStarted):
                    response = dispatch(ev.request, handlers)
                    out.append(answer(conn, ev.stream_id, response, where=ev.request.full_method))
            if out:
                sock.sendall(b"".join(out))
                if after_send is not None:
                    after_send()
    except OSError:
        return
    finally:
        sock.close()
