"""Unary gRPC calls over HTTP/2, sans-IO: bytes in, bytes out, an :class:`Outcome` per call.

The HTTP/2 framing, HPACK and flow-control bookkeeping are python-hyper's ``h2`` (the sibling of
h11, the model of this shape); this module adds gRPC's rules on top (the request headers, the
5-byte message prefix, the status in trailers) and turns every way a reply can go wrong into a
status with a sentence, mapped as gRPC's own clients map them (grpc's doc/http-grpc-status-mapping.md
for a non-200 HTTP status). One call at a time per connection, which is all a blocking client makes;
:mod:`shim.grpcwire.channel` owns the socket.

A GOAWAY is cut out before h2 sees it (:class:`shim.grpcwire.wire.GoawayCutter`): h2 would close
its connection on one, where RFC 9113 6.8 says the streams up to
its last stream id go on. So a server shutting down gracefully still answers the open call;
only new calls are refused.

    conn = Connection()
    conn.start_call("/runtime.v1.RuntimeService/Version", request_bytes, timeout=5.0)
    sock.sendall(conn.data_to_send())
    while (outcome := conn.next_outcome()) is NEED_DATA:
        conn.receive_data(sock.recv(65536))   # b"" at EOF
        sock.sendall(conn.data_to_send())     # window updates, pings' acks, the rest of a request
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from shim.grpcwire.wire import (
    FRAME_HEADER,
    GOAWAY_PAYLOAD,
    PREFIX,
    GoawayCutter,
    decode_details,
    encode_timeout,
    error_name,
)
from shim.rpc.status import Code

__all__ = ["MAX_MESSAGE_BYTES", "NEED_DATA", "Connection", "Outcome", "encode_timeout"]

#: The largest reply message accepted: grpc's own clients' default receive limit is 4 MiB; CRI
#: clients (crictl, kubelet) raise it to 16 MiB for ListContainers and verbose statuses.
MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
#: The receive window asked for, per stream and (by a WINDOW_UPDATE) for the connection: a large
#: reply streams in without waiting for a round trip per 64 KiB (HTTP/2's initial window).
RECEIVE_WINDOW_BYTES: Final = 4 * 1024 * 1024
_SETTINGS = 0x4
_GOAWAY_DEBUG_SAID = 200  # the bytes of a GOAWAY's debug data put in a status's sentence, at most


class _NeedData:
    def __repr__(self) -> str:
        return "NEED_DATA"


#: What :meth:`Connection.next_outcome` returns while the call's reply is incomplete.
NEED_DATA: Final = _NeedData()


@dataclass(frozen=True)
class Outcome:
    """How a call ended: ``code`` OK with the reply ``message`` (a serialised protobuf), else the
    status and its sentence (``details``, percent-decoded). ``from_server``: the status is the
    server's own (its grpc-status); False for what this client found (the socket, the deadline,
    HTTP/2 or gRPC framing), which a caller may want to say came from the connection."""

    code: Code
    details: str = ""
    message: bytes = b""
    from_server: bool = False


# grpc's mapping of an HTTP status that is not 200 (a proxy's answer, or no gRPC server at all).
_HTTP_CODES: Final = {400: Code.INTERNAL, 401: Code.UNAUTHENTICATED, 403: Code.PERMISSION_DENIED,
                      404: Code.UNIMPLEMENTED, 429: Code.UNAVAILABLE, 502: Code.UNAVAILABLE,
                      503: Code.UNAVAILABLE, 504: Code.UNAVAILABLE}


class Connection:
    """The client side of one HTTP/2 connection carrying unary gRPC calls, one at a time.

    Raises ``RuntimeError`` when used out of order (a call started while one is open); every
    failure of the peer or the transport is an :class:`Outcome`, never an exception.
    """

    def __init__(self, authority: str = "localhost", max_message_bytes: int = MAX_MESSAGE_BYTES):
        self.authority = authority.encode()
        self.max_message_bytes = max_message_bytes
        self._h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        # Set before the preface, so that the first SETTINGS frame carries it (h2's documented way).
        self._h2.local_settings = h2.settings.Settings(client=True, initial_values={
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: RECEIVE_WINDOW_BYTES,
            h2.settings.SettingCodes.ENABLE_PUSH: 0})
        self._h2.initiate_connection()
        self._h2.increment_flow_control_window(RECEIVE_WINDOW_BYTES - 65535)
        self._stream_id = 0
        self._outcome: Outcome | None = None
        self._pending = b""  # request bytes the peer's flow-control window has no room for yet
        self._headers: dict[bytes, bytes] = {}
        self._body = bytearray()
        self._closed: str | None = None  # why the connection takes no more calls
        self._first_bytes: bytes | None = b""  # the server's first bytes until they are seen to be HTTP/2
        self._cutter = GoawayCutter()  # a GOAWAY is read here, never by h2 (shim.grpcwire.wire)
        self._goaway_said: str | None = None  # the last GOAWAY read: its error code and debug data

    @property
    def usable(self) -> bool:
        """True while a new call may start on this connection (no GOAWAY, EOF or protocol error)."""
        return self._closed is None

    def start_call(self, path: str, message: bytes, timeout: float | None = None) -> None:
        """Begin a unary call of ``path`` (``/package.Service/Method``) with the serialised request
        ``message``; ``timeout`` seconds (sent as grpc-timeout) or none."""
        if self._stream_id and self._outcome is None:
            raise RuntimeError("a call is still open on this connection")
        self._outcome = None
        self._headers = {}
        self._body = bytearray()
        if self._closed is not None:
            self._outcome = Outcome(Code.UNAVAILABLE, self._closed)
            return
        headers = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path.encode()),
                   (b":authority", self.authority), (b"content-type", b"application/grpc"), (b"te", b"trailers")]
        if timeout is not None:
            headers.append((b"grpc-timeout", encode_timeout(timeout)))
        self._stream_id = self._h2.get_next_available_stream_id()
        self._h2.send_headers(self._stream_id, headers)
        self._pending = PREFIX.pack(0, len(message)) + message
        self._send_pending()

    def data_to_send(self) -> bytes:
        """The bytes to write to the peer now (possibly none)."""
        return self._h2.data_to_send()

    def receive_data(self, data: bytes) -> None:
        """Bytes read from the peer; ``b""`` when it closed the connection."""
        if not data:
            self._close("the server closed the connection")
            # A server that fails (INTERNAL_ERROR, ENHANCE_YOUR_CALM) closes right after its GOAWAY:
            # the GOAWAY says why.
            said = ("the connection closed" if self._goaway_said is None
                    else f"the server ended the connection ({self._goaway_said})")
            self._settle(Outcome(Code.UNAVAILABLE, f"{said} before the reply was complete"))
            return
        if self._first_bytes is not None and not self._check_preface(data):
            return
        for is_goaway, part in self._cutter.cut(data, self._h2.max_inbound_frame_size):
            if is_goaway:
                self._receive_goaway(part)
                continue
            try:
                events = self._h2.receive_data(part)
            except h2.exceptions.ProtocolError as exc:
                self._close(f"HTTP/2 protocol error from the server: {exc}")
                self._settle(Outcome(Code.INTERNAL, f"HTTP/2 protocol error from the server: {exc}"))
                return
            for event in events:
                self._handle(event)

    def next_outcome(self) -> Outcome | _NeedData:
        """The open call's outcome once its reply is complete, else :data:`NEED_DATA`."""
        if self._outcome is None:
            return NEED_DATA
        return self._outcome

    def fail(self, outcome: Outcome) -> None:
        """End the open call with ``outcome`` (the transport's verdict: a deadline, a broken socket)
        and take no more calls on this connection."""
        self._close(outcome.details)
        self._settle(outcome)

    def _check_preface(self, data: bytes) -> bool:
        """False (and the connection failed) when the server's first frame header is not a SETTINGS
        frame on stream 0 (RFC 9113 3.4): no HTTP/2 server, such as an HTTP/1.1 one or garbage. h2
        checks a frame's length only once it has buffered the whole frame, so without this a frame
        header of "HTTP/1.1 4" would wait for 4.7 MB, until the call's deadline."""
        assert self._first_bytes is not None
        self._first_bytes += data[:16 - len(self._first_bytes)]  # 16: enough to show in the sentence
        if len(self._first_bytes) < FRAME_HEADER.size:
            return True
        high, low, frame_type, flags, stream_id = FRAME_HEADER.unpack_from(self._first_bytes)
        if frame_type == _SETTINGS and stream_id == 0 and not flags & 0x1 and ((high << 8) | low) % 6 == 0:
            self._first_bytes = None
            return True
        why = (f"the server does not speak HTTP/2: its first bytes are {self._first_bytes!r}, "
               "not a SETTINGS frame")
        self._close(why)
        self._settle(Outcome(Code.UNAVAILABLE, why))
        return False

    def _receive_goaway(self, payload: bytes) -> None:
        """The server takes no new call (RFC 9113 6.8); the open call goes on if the server took
        it (its stream id is at most the GOAWAY's last stream id), else it fails UNAVAILABLE.
        The channel's next call connects anew."""
        last_stream_id, error_code = GOAWAY_PAYLOAD.unpack_from(payload)
        debug = payload[GOAWAY_PAYLOAD.size:GOAWAY_PAYLOAD.size + _GOAWAY_DEBUG_SAID]
        self._goaway_said = f"GOAWAY, HTTP/2 error {error_name(error_code)}"
        if debug:
            self._goaway_said += f": {debug.decode(errors='backslashreplace')}"
        why = f"the server ended the connection ({self._goaway_said})"
        self._close(why)
        if self._stream_id > last_stream_id & 0x7FFFFFFF:
            self._settle(Outcome(Code.UNAVAILABLE, why))

    # -- events ---------------------------------------------------------------------------------

    def _handle(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.DataReceived):
            # Give the window back at once, for the connection and the stream: the reply is
            # consumed as it comes (bounded by max_message_bytes), so the peer never stalls.
            if event.flow_controlled_length:
                self._h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            if event.stream_id == self._stream_id and self._outcome is None:
                self._body += event.data
                # Refused on the declared length, before the rest is read (or buffered).
                if len(self._body) >= PREFIX.size:
                    length = PREFIX.unpack_from(self._body)[1]
                    if length > self.max_message_bytes:
                        self._reset(Outcome(Code.RESOURCE_EXHAUSTED, f"the reply is larger than the limit of "
                                                                     f"{self.max_message_bytes} bytes"))
                    elif len(self._body) > PREFIX.size + length:
                        self._reset(Outcome(Code.INTERNAL, "the reply carries more than one message for a unary call"))
        elif isinstance(event, h2.events.ResponseReceived):
            if event.stream_id == self._stream_id:
                self._headers = dict(event.headers)
                if event.stream_ended is None:
                    self._check_response_headers()
        elif isinstance(event, h2.events.TrailersReceived):
            if event.stream_id == self._stream_id:
                self._headers.update(event.headers)
        elif isinstance(event, h2.events.StreamEnded):
            if event.stream_id == self._stream_id:
                self._settle(self._finish())
        elif isinstance(event, h2.events.StreamReset):
            if event.stream_id == self._stream_id:
                self._settle(Outcome(Code.UNAVAILABLE, f"the server reset the call's stream "
                                                       f"(HTTP/2 error {error_name(event.error_code)})"))
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            self._send_pending()

    def _check_response_headers(self) -> None:
        """A reply whose headers already say it is not gRPC fails at once (its body is not read)."""
        problem = self._header_problem()
        if problem is not None:
            self._reset(problem)

    def _header_problem(self) -> Outcome | None:
        status = self._headers.get(b":status", b"")
        if status != b"200":
            code = _HTTP_CODES.get(int(status) if status.isdigit() else 0, Code.UNKNOWN)
            return Outcome(code, f"the server answered with HTTP status {status.decode(errors='replace')}, "
                                 "not a gRPC reply")
        content_type = self._headers.get(b"content-type", b"")
        if not (content_type == b"application/grpc" or content_type.startswith((b"application/grpc+",
                                                                                 b"application/grpc;"))):
            return Outcome(Code.INTERNAL, f"the reply's content-type is {content_type.decode(errors='replace')!r}, "
                                          "not application/grpc")
        return None

    def _finish(self) -> Outcome:
        """The outcome of a stream that ended: its status, and on OK its one message."""
        problem = self._header_problem()
        if problem is not None and b"grpc-status" not in self._headers:
            return problem
        raw_status = self._headers.get(b"grpc-status")
        if raw_status is None:
            return Outcome(Code.INTERNAL, "the reply ended without a grpc-status")
        if not raw_status.isdigit():
            return Outcome(Code.UNKNOWN, f"the reply's grpc-status {raw_status.decode(errors='replace')!r} "
                                         "is not a number")
        try:
            code = Code(int(raw_status))
        except ValueError:
            code = Code.UNKNOWN
        details = decode_details(self._headers.get(b"grpc-message", b""))
        if code != Code.OK:
            return Outcome(code, details or code.name, from_server=True)
        body = bytes(self._body)
        if len(body) < PREFIX.size:
            return Outcome(Code.INTERNAL, "the reply has no message" if not body else
                           f"the reply's message prefix is truncated ({len(body)} of 5 bytes)")
        compressed, length = PREFIX.unpack_from(body)
        if compressed:
            return Outcome(Code.INTERNAL, "the reply's message is compressed, though no compression was offered")
        # (a message over the limit, or more than one, already failed the call as its DATA came)
        if len(body) - PREFIX.size < length:
            return Outcome(Code.INTERNAL, f"the reply's message is truncated ({len(body) - PREFIX.size} of "
                                          f"{length} bytes)")
        return Outcome(Code.OK, message=body[PREFIX.size:])

    # -- helpers --------------------------------------------------------------------------------

    def _send_pending(self) -> None:
        """As much of the request as the peer's windows and frame size take; the stream ends with it."""
        if not self._pending or self._outcome is not None:
            return
        while self._pending:
            room = min(self._h2.local_flow_control_window(self._stream_id), self._h2.max_outbound_frame_size)
            if room <= 0:
                return
            chunk, self._pending = self._pending[:room], self._pending[room:]
            self._h2.send_data(self._stream_id, chunk, end_stream=not self._pending)

    def _reset(self, outcome: Outcome) -> None:
        """End the call with ``outcome`` and tell the server to stop sending it."""
        try:
            self._h2.reset_stream(self._stream_id, h2.errors.ErrorCodes.CANCEL)
        except h2.exceptions.ProtocolError:
            pass  # the stream is already closed
        self._settle(outcome)

    def _settle(self, outcome: Outcome) -> None:
        if self._stream_id and self._outcome is None:
            self._outcome = outcome
            self._pending = b""
            self._body = bytearray()

    def _close(self, why: str) -> None:
        if self._closed is None:
            self._closed = why
