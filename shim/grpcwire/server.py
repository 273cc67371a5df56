"""The server side of gRPC over HTTP/2, sans-IO: bytes in, calls out; replies in, bytes out.

One :class:`ServerConnection` per accepted connection. :meth:`ServerConnection.receive_data`
turns what the client sent into :class:`Call` events (a request whose one message has arrived
whole) and :class:`Cancelled` events (the client reset a call's stream, or the connection ended);
the application answers each call with :meth:`~ServerConnection.send_message` (once for a unary
call, once per item for a server stream) and :meth:`~ServerConnection.send_status`, and writes
:meth:`~ServerConnection.data_to_send` to the socket. The HTTP/2 framing, HPACK and flow-control
bookkeeping are h2's; this module adds gRPC's rules (PROTOCOL-HTTP2.md in grpc's repository):
the request's headers and its deadline, the message prefix, the status in trailers, and every way
a request can be malformed answered with a status and a sentence without reaching the
application. Replies wait for the client's flow-control window; :meth:`ServerConnection.backlog`
says how much of a stream's reply is still waiting.

:meth:`~ServerConnection.goaway` stops the connection taking calls (a graceful stop): calls
already taken go on, later ones are refused with REFUSED_STREAM, which a gRPC client retries on a
new connection.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Final

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from shim.grpcwire.wire import (
    CLIENT_PREFACE,
    GOAWAY_PAYLOAD,
    PREFIX,
    GoawayCutter,
    decode_timeout,
    encode_details,
    error_name,
    goaway_frame,
)
from shim.rpc.status import Code

__all__ = ["MAX_REQUEST_BYTES", "MAX_CONCURRENT_CALLS", "Call", "Cancelled", "Metadata", "ServerConnection"]

#: The largest request message taken: grpc's servers' default receive limit.
MAX_REQUEST_BYTES: Final = 4 * 1024 * 1024
#: Calls one connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS): kubelet sends all
#: of a node's CRI calls on one connection, a RunPodSandbox per pod worker at once on a busy node;
#: gRPC's own servers set no limit.
MAX_CONCURRENT_CALLS: Final = 4096
#: The receive window of each call and of the connection: a request streams in without a round
#: trip per 64 KiB (HTTP/2's initial window).
RECEIVE_WINDOW_BYTES: Final = 1024 * 1024
_HTTP_OK: Final = [(b":status", b"200"), (b"content-type", b"application/grpc")]
# Headers that are gRPC's or HTTP's own, not the call's metadata.
_NOT_METADATA: Final = frozenset((b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding",
                                  b"user-agent", b"host"))

#: A call's metadata: (key, value) pairs, as grpc's servers give them (a "-bin" key's value decoded
#: from base64 into bytes).
Metadata = tuple[tuple[str, "str | bytes"], ...]


@dataclass(frozen=True)
class Call:
    """A request that arrived whole: its ``/package.Service/Method`` ``path``, ``metadata``, the
    ``timeout`` its client gave it (seconds from now; None: none) and its one ``message``."""

    stream_id: int
    path: str
    metadata: Metadata
    timeout: float | None
    message: bytes


@dataclass(frozen=True)
class Cancelled:
    """The client no longer wants the call on ``stream_id``; ``why`` says how it went."""

    stream_id: int
    why: str


@dataclass
class _Stream:
    headers: dict[bytes, bytes]
    body: bytearray = field(default_factory=bytearray)
    dropping: bool = False  # answered already (a malformed request): what more comes is discarded
    called: bool = False  # handed to the application as a Call
    headers_sent: bool = False
    pending: bytearray = field(default_factory=bytearray)  # reply bytes waiting for the client's window
    trailers: list[tuple[bytes, bytes]] | None = None  # sent once pending is


class ServerConnection:
    """The server side of one HTTP/2 connection carrying gRPC calls (unary requests; unary or
    server-streaming replies). Never raises for what the client sends: a protocol error ends the
    connection with a GOAWAY (:attr:`closed` says why) and every open call is :class:`Cancelled`."""

    def __init__(self, max_request_bytes: int = MAX_REQUEST_BYTES):
        self.max_request_bytes = max_request_bytes
        self._h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        self._h2.local_settings = h2.settings.Settings(client=False, initial_values={
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_CONCURRENT_CALLS,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: RECEIVE_WINDOW_BYTES,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 64 * 1024})
        self._h2.initiate_connection()
        self._h2.increment_flow_control_window(RECEIVE_WINDOW_BYTES - 65535)
        self._streams: dict[int, _Stream] = {}
        self._cutter = GoawayCutter(preface=len(CLIENT_PREFACE))
        self._out = bytearray()  # bytes of our own (a GOAWAY) after h2's, in order
        self._last_stream_id = 0  # the highest stream id the client opened
        self._goaway_sent: int | None = None  # the last stream id our GOAWAY took
        #: Why the connection takes no more calls (our GOAWAY, the client's, EOF, a protocol error), or None.
        self.closed: str | None = None
        #: Whether the transport should close once the open calls are answered (the client said GOAWAY or EOF).
        self.peer_done = False

    # -- input -----------------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[Call | Cancelled]:
        """What the client's ``data`` (``b""``: it closed the connection) means for the calls."""
        events: list[Call | Cancelled] = []
        if not data:
            self.peer_done = True
            self._close("the client closed the connection")
            events.extend(Cancelled(sid, "the client closed the connection") for sid in self._streams)
            self._streams.clear()
            return events
        for is_goaway, part in self._cutter.cut(data, self._h2.max_inbound_frame_size):
            if is_goaway:
                self._receive_goaway(part)
                continue
            try:
                h2_events = self._h2.receive_data(part)
            except h2.exceptions.ProtocolError as exc:  # h2 queued its GOAWAY
                why = f"HTTP/2 protocol error from the client: {exc}"
                self._close(why)
                self.peer_done = True
                events.extend(Cancelled(sid, why) for sid in self._streams)
                self._streams.clear()
                return events
            for event in h2_events:
                self._handle(event, events)
        return events

    def _handle(self, event: h2.events.Event, events: list[Call | Cancelled]) -> None:
        if isinstance(event, h2.events.DataReceived):
            if event.flow_controlled_length:
                self._h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            stream = self._streams.get(event.stream_id)
            if stream is not None and not stream.dropping:
                stream.body += event.data
                self._check_size(event.stream_id, stream)
        elif isinstance(event, h2.events.RequestReceived):
            self._request(event, events)
        elif isinstance(event, h2.events.StreamEnded):
            stream = self._streams.get(event.stream_id)
            if stream is not None and not stream.dropping:
                self._ended(event.stream_id, stream, events)
        elif isinstance(event, h2.events.StreamReset):
            stream = self._streams.pop(event.stream_id, None)
            if stream is not None and stream.called:
                name = error_name(event.error_code)
                events.append(Cancelled(event.stream_id, f"the client cancelled the call (HTTP/2 {name})"))
        elif isinstance(event, h2.events.WindowUpdated):
            if event.stream_id:
                self._flush_stream(event.stream_id)
            else:
                self._flush_all()
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self._flush_all()

    def _request(self, event: h2.events.RequestReceived, events: list[Call | Cancelled]) -> None:
        sid = event.stream_id
        self._last_stream_id = max(self._last_stream_id, sid)
        headers = dict(event.headers)
        if self._goaway_sent is not None and sid > self._goaway_sent:
            self._reset(sid, h2.errors.ErrorCodes.REFUSED_STREAM)  # the client retries it elsewhere
            return
        stream = self._streams[sid] = _Stream(headers)
        problem = self._header_problem(headers)
        if problem is not None:
            self._refuse(sid, stream, *problem)
        elif event.stream_ended is not None:
            self._ended(sid, stream, events)

    def _header_problem(self, headers: dict[bytes, bytes]) -> tuple[int, Code, str] | None:
        """(HTTP status, gRPC status, sentence) of a request this server cannot take, or None."""
        if headers.get(b":method") != b"POST":
            return 405, Code.INTERNAL, f"gRPC calls are POST requests, not {_said(headers.get(b':method'))}"
        content_type = headers.get(b"content-type", b"")
        if not (content_type == b"application/grpc" or content_type.startswith((b"application/grpc+",
                                                                                 b"application/grpc;"))):
            return 415, Code.INTERNAL, f"the request's content-type is {_said(content_type)}, not application/grpc"
        path = headers.get(b":path", b"")
        if not path.startswith(b"/") or path.count(b"/") != 2:
            return 200, Code.UNIMPLEMENTED, f"the request's path {_said(path)} is not /package.Service/Method"
        timeout = headers.get(b"grpc-timeout")
        if timeout is not None and decode_timeout(timeout) is None:
            return 200, Code.INTERNAL, f"the request's grpc-timeout {_said(timeout)} is not a number and a unit"
        encoding = headers.get(b"grpc-encoding", b"identity")
        if encoding != b"identity":
            return 200, Code.UNIMPLEMENTED, f"the request is compressed ({_said(encoding)}): this server takes " \
                                            "uncompressed messages only (grpc-encoding identity)"
        return None

    def _check_size(self, sid: int, stream: _Stream) -> None:
        """Refuse on the declared length, before the rest is read (or buffered)."""
        if len(stream.body) < PREFIX.size:
            return
        compressed, length = PREFIX.unpack_from(stream.body)
        if compressed:
            self._refuse(sid, stream, 200, Code.UNIMPLEMENTED, "the request's message is compressed, though "
                                                               "grpc-encoding is identity")
        elif length > self.max_request_bytes:
            self._refuse(sid, stream, 200, Code.RESOURCE_EXHAUSTED, f"the request's message of {length} bytes is "
                                                                    f"larger than the limit of {self.max_request_bytes}")
        elif len(stream.body) > PREFIX.size + length:
            self._refuse(sid, stream, 200, Code.INTERNAL, "the request carries more than one message; every "
                                                          "method here takes one")

    def _ended(self, sid: int, stream: _Stream, events: list[Call | Cancelled]) -> None:
        body = stream.body
        if len(body) < PREFIX.size:
            self._refuse(sid, stream, 200, Code.INTERNAL, "the request has no message" if not body else
                         f"the request's message prefix is truncated ({len(body)} of 5 bytes)")
            return
        length = PREFIX.unpack_from(body)[1]
        if len(body) - PREFIX.size < length:
            self._refuse(sid, stream, 200, Code.INTERNAL, f"the request's message is truncated "
                                                          f"({len(body) - PREFIX.size} of {length} bytes)")
            return
        timeout_value = stream.headers.get(b"grpc-timeout")
        timeout = None if timeout_value is None else decode_timeout(timeout_value)
        stream.called = True
        message = bytes(body[PREFIX.size:])
        stream.body = bytearray()
        events.append(Call(sid, stream.headers[b":path"].decode("utf-8", "replace"), _metadata(stream.headers),
                           timeout, message))

    def _receive_goaway(self, payload: bytes) -> None:
        """The client opens no more calls here; those it opened go on, then the connection closes."""
        _, error_code = GOAWAY_PAYLOAD.unpack_from(payload)
        self.peer_done = True
        self._close(f"the client ended the connection (GOAWAY, HTTP/2 {error_name(error_code)})")

    # -- output ------------------------------------------------------------------------------------

    def data_to_send(self) -> bytes:
        """The bytes to write to the client now (possibly none)."""
        data = self._h2.data_to_send()
        if self._out:
            data, self._out = data + bytes(self._out), bytearray()
        return data

    def send_initial_metadata(self, stream_id: int, metadata: Metadata = ()) -> None:
        """Send the reply's headers now (a server stream says so before its first item)."""
        stream = self._streams.get(stream_id)
        if stream is not None and not stream.headers_sent:
            self._send_headers(stream_id, stream, metadata)

    def send_message(self, stream_id: int, message: bytes) -> None:
        """One reply message on the call (ignored once the call is gone: the client cancelled it)."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.trailers is not None:
            return
        if not stream.headers_sent:
            self._send_headers(stream_id, stream, ())
        stream.pending += PREFIX.pack(0, len(message))
        stream.pending += message
        self._flush_stream(stream_id)

    def send_status(self, stream_id: int, code: Code, details: str = "") -> None:
        """End the call with its status (ignored once the call is gone)."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.trailers is not None:
            return
        trailers = [(b"grpc-status", b"%d" % int(code))]
        if details:
            trailers.append((b"grpc-message", encode_details(details)))
        if not stream.headers_sent:  # trailers-only: one HEADERS frame ends the stream
            self._end(stream_id, stream, _HTTP_OK + trailers)
            return
        stream.trailers = trailers
        self._flush_stream(stream_id)

    def backlog(self, stream_id: int) -> int:
        """Reply bytes of the call still waiting for the client's flow-control window."""
        stream = self._streams.get(stream_id)
        return 0 if stream is None else len(stream.pending)

    def goaway(self) -> None:
        """Take no more calls (a graceful stop): the calls already opened go on."""
        if self._goaway_sent is None and self.closed is None:
            self._goaway_sent = self._last_stream_id
            self._out += goaway_frame(self._last_stream_id)
            self._close("the server is stopping")

    @property
    def open_calls(self) -> int:
        """Calls taken and not yet answered in full (nor cancelled)."""
        return len(self._streams)

    # -- helpers -----------------------------------------------------------------------------------

    def _send_headers(self, sid: int, stream: _Stream, metadata: Metadata) -> None:
        stream.headers_sent = True
        extra = [(key.encode(), base64.b64encode(value).rstrip(b"=") if isinstance(value, bytes) else value.encode())
                 for key, value in metadata]
        self._h2.send_headers(sid, _HTTP_OK + extra)

    def _flush_all(self) -> None:
        for sid in list(self._streams):
            self._flush_stream(sid)

    def _flush_stream(self, sid: int) -> None:
        stream = self._streams.get(sid)
        if stream is None:
            return
        while stream.pending:
            room = min(self._h2.local_flow_control_window(sid), self._h2.max_outbound_frame_size)
            if room <= 0:
                return
            chunk = bytes(stream.pending[:room])
            del stream.pending[:room]
            self._h2.send_data(sid, chunk)
        if stream.trailers:
            self._end(sid, stream, stream.trailers)

    def _end(self, sid: int, stream: _Stream, headers: list[tuple[bytes, bytes]]) -> None:
        """The last HEADERS of the call; the client's rest of the request, if any, is not wanted."""
        self._streams.pop(sid, None)
        try:
            self._h2.send_headers(sid, headers, end_stream=True)
            if not stream.called and not self._remote_closed(sid):
                self._reset(sid, h2.errors.ErrorCodes.NO_ERROR)
        except h2.exceptions.ProtocolError:
            pass  # the client reset the stream meanwhile

    def _refuse(self, sid: int, stream: _Stream, http_status: int, code: Code, details: str) -> None:
        """Answer a request that cannot be taken; what more the client sends on it is discarded."""
        stream.dropping = True
        stream.body = bytearray()
        headers = [(b":status", b"%d" % http_status), (b"content-type", b"application/grpc"),
                   (b"grpc-status", b"%d" % int(code)), (b"grpc-message", encode_details(details))]
        self._end(sid, stream, headers)

    def _remote_closed(self, sid: int) -> bool:
        h2_stream = self._h2.streams.get(sid)
        return h2_stream is None or h2_stream.closed

    def _reset(self, sid: int, error: h2.errors.ErrorCodes) -> None:
        try:
            self._h2.reset_stream(sid, error)
        except h2.exceptions.ProtocolError:
            pass  # already closed

    def _close(self, why: str) -> None:
        if self.closed is None:
            self.closed = why


def _metadata(headers: dict[bytes, bytes]) -> Metadata:
    pairs: list[tuple[str, str | bytes]] = []
    for key, value in headers.items():
        if key.startswith(b":") or key in _NOT_METADATA:
            continue
        name = key.decode("ascii", "replace")
        if name.endswith("-bin"):
            try:
                pairs.append((name, base64.b64decode(value + b"=" * (-len(value) % 4))))
            except ValueError:
                continue  # not base64: not metadata a gRPC client sent
        else:
            pairs.append((name, value.decode("ascii", "replace")))
    return tuple(pairs)


def _said(value: bytes | None) -> str:
    return "none" if value is None else repr(value.decode("utf-8", "replace")[:100])
