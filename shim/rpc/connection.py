"""Stream bookkeeping for one connection, either side. Sans-IO: bytes in, events and bytes out.

The rules enforced here are protocol.md's "Stream rules" and "Errors": which mistakes fail one
stream (answered with a status on that stream) and which close the connection. The payload codec
(:mod:`shim.rpc.codecs`) is the server connection's first request's, and the one a client
connection is given: msgpack unless said otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from shim.rpc.codecs import MSGPACK, Codec, codec_of_request
from shim.rpc.frames import (
    CLOSED,
    MAX_DATA_BYTES,
    Flags,
    Frame,
    FrameDecoder,
    LocalProtocolError,
    MessageType,
    OversizedFrame,
    encode_frame,
)
from shim.rpc.messages import Request, Response, encode_response
from shim.rpc.records import Record
from shim.rpc.records import set_field as _set
from shim.rpc.status import Code, RpcError

__all__ = [
    "MAX_STREAM_ID",
    "MAX_ACTIVE_STREAMS",
    "CallStarted",
    "CallRejected",
    "StreamInput",
    "ResponseReceived",
    "DataReceived",
    "PeerClosed",
    "ServerConnection",
    "ClientConnection",
]

# Flag tests on the hot path use plain ints: ``int & IntFlag`` builds a new IntFlag (about 1 µs).
_REMOTE_CLOSED = Flags.REMOTE_CLOSED.value
_REMOTE_OPEN = Flags.REMOTE_OPEN.value
_NO_DATA = Flags.NO_DATA.value

MAX_STREAM_ID = (1 << 32) - 1
#: Streams one connection may have open at once on the server; more are refused with
#: RESOURCE_EXHAUSTED so a single peer cannot make the server hold unbounded work.
MAX_ACTIVE_STREAMS = 4096


class CallStarted(Record):
    """A valid request opened a stream; run its handler."""

    __slots__ = ("stream_id", "request", "client_streaming")
    stream_id: int
    request: Request
    client_streaming: bool

    def __init__(self, stream_id: int, request: Request, client_streaming: bool) -> None:
        _set(self, "stream_id", stream_id)
        _set(self, "request", request)
        _set(self, "client_streaming", client_streaming)


class CallRejected(Record):
    """A request or frame failed its stream; answer with this status (already decided)."""

    __slots__ = ("stream_id", "code", "message")
    stream_id: int
    code: Code
    message: str

    def __init__(self, stream_id: int, code: Code, message: str) -> None:
        _set(self, "stream_id", stream_id)
        _set(self, "code", code)
        _set(self, "message", message)


class StreamInput(Record):
    """A data frame from the client on an open stream."""

    __slots__ = ("stream_id", "data", "closed")
    stream_id: int
    data: bytes
    closed: bool

    def __init__(self, stream_id: int, data: bytes, closed: bool) -> None:
        _set(self, "stream_id", stream_id)
        _set(self, "data", data)
        _set(self, "closed", closed)


class ResponseReceived(Record):
    __slots__ = ("stream_id", "response")
    stream_id: int
    response: Response

    def __init__(self, stream_id: int, response: Response) -> None:
        _set(self, "stream_id", stream_id)
        _set(self, "response", response)


class DataReceived(Record):
    __slots__ = ("stream_id", "payload", "closed")
    stream_id: int
    payload: Any
    closed: bool

    def __init__(self, stream_id: int, payload: Any, closed: bool) -> None:
        _set(self, "stream_id", stream_id)
        _set(self, "payload", payload)
        _set(self, "closed", closed)


class PeerClosed(Record):
    """The peer closed its side on a frame boundary."""

    __slots__ = ()


class _Side:
    __slots__ = ("decoder", "max_data_bytes")

    def __init__(self, max_data_bytes: int):
        self.max_data_bytes = max_data_bytes
        self.decoder = FrameDecoder(max_data_bytes=max_data_bytes)

    def _frames(self, data: bytes) -> Iterator[Frame | OversizedFrame | None]:
        """The frames complete with ``data``, then None if the peer closed its side."""
        self.decoder.feed(data)
        while True:
            ev = self.decoder.next_event()  # may raise RemoteProtocolError: the caller closes
            if type(ev) is Frame or type(ev) is OversizedFrame:
                yield ev
            else:  # NEED_DATA or CLOSED
                if ev is CLOSED:
                    yield None
                return


class ServerConnection(_Side):
    """The server's view of one connection."""

    __slots__ = ("last_stream_id", "active", "max_active_streams", "codec", "_decode_request", "_encode_response",
                 "_pack")

    def __init__(self, *, max_data_bytes: int = MAX_DATA_BYTES, max_active_streams: int = MAX_ACTIVE_STREAMS):
        super().__init__(max_data_bytes)
        self.last_stream_id = 0
        self.active: set[int] = set()
        self.max_active_streams = max_active_streams
        #: The codec of the connection's first request (None before it): every later one is read in it.
        self.codec: Codec | None = None
        self._decode_request: Callable[[bytes], Request] | None = None  # (not a bound method: no cycle)
        # A stream refused before any request was read (a bad stream id) is answered in msgpack.
        self._encode_response: Callable[[Response], bytes] = encode_response
        self._pack = MSGPACK.pack

    def _first_request(self, data: bytes) -> Request:
        """Decode the first request, and take its codec for the connection's life."""
        codec = self.codec = codec_of_request(data)
        self._decode_request = codec.decode_request
        self._encode_response = codec.encode_response
        self._pack = codec.pack
        return codec.decode_request(data)

    def receive_data(self, data: bytes) -> list[Any]:
        """Feed bytes read from the client; return the events they complete.

        Raises :class:`~shim.rpc.frames.RemoteProtocolError` only for an unrecoverable framing
        error; the caller then closes the connection.
        """
        events: list[Any] = []
        for ev in self._frames(data):
            if ev is None:
                events.append(PeerClosed())
            elif type(ev) is Frame:
                self._on_frame(ev, events)
            else:
                self._on_oversized(ev, events)
        return events

    def _on_oversized(self, ev: OversizedFrame, events: list[Any]) -> None:
        if ev.type not in (MessageType.REQUEST, MessageType.DATA):
            return
        if ev.type == MessageType.REQUEST and self._new_stream_error(ev.stream_id) is None:
            self.last_stream_id = ev.stream_id
        self.active.discard(ev.stream_id)
        events.append(CallRejected(ev.stream_id, Code.RESOURCE_EXHAUSTED,
                                   f"frame of {ev.length} bytes exceeds the limit of {self.max_data_bytes} bytes"))

    def _new_stream_error(self, stream_id: int) -> str | None:
        if stream_id % 2 == 0:
            return f"stream id {stream_id} must be odd for client-initiated streams"
        if stream_id <= self.last_stream_id:
            return f"stream id {stream_id} cannot be re-used and must increase (last was {self.last_stream_id})"
        return None

    def _on_frame(self, frame: Frame, events: list[Any]) -> None:
        sid = frame.stream_id
        if frame.type == MessageType.REQUEST:
            error = self._new_stream_error(sid)
            if error is not None:
                events.append(CallRejected(sid, Code.INVALID_ARGUMENT, error))
                return
            self.last_stream_id = sid
            if len(self.active) >= self.max_active_streams:
                events.append(CallRejected(sid, Code.RESOURCE_EXHAUSTED,
                                           f"too many concurrent streams on this connection (limit {self.max_active_streams})"))
                return
            try:
                decode = self._decode_request
                request = decode(frame.data) if decode is not None else self._first_request(frame.data)
            except RpcError as exc:
                events.append(CallRejected(sid, exc.code, exc.message))
                return
            self.active.add(sid)
            events.append(CallStarted(sid, request, bool(frame.flags & _REMOTE_OPEN)))
        elif frame.type == MessageType.DATA:
            if sid not in self.active:
                if sid % 2 == 1 and sid <= self.last_stream_id:
                    return  # a late frame for a stream we already answered: drop it
                events.append(CallRejected(sid, Code.INVALID_ARGUMENT, f"stream id {sid} is not active"))
                return
            events.append(StreamInput(sid, frame.data, bool(frame.flags & _REMOTE_CLOSED)))
        # Responses from a client and unknown types are ignored (protocol.md, "Message types").

    def response(self, stream_id: int, response: Response) -> bytes:
        """Bytes that answer ``stream_id`` and end it. Ending a stream twice sends nothing."""
        if stream_id not in self.active:
            return b""
        self.active.discard(stream_id)
        data = self._encode_response(response)
        if len(data) > self.max_data_bytes:
            data = self._encode_response(Response(Code.RESOURCE_EXHAUSTED,
                                            f"response of {len(data)} bytes exceeds the {self.max_data_bytes}-byte limit"))
        return encode_frame(stream_id, MessageType.RESPONSE, 0, data)

    def reject(self, stream_id: int, code: Code, message: str) -> bytes:
        """Bytes of an error response on a stream that failed before or during its call."""
        self.active.discard(stream_id)
        return encode_frame(stream_id, MessageType.RESPONSE, 0,
                            self._encode_response(Response(code, message)))

    def data(self, stream_id: int, payload: Any) -> bytes:
        """Bytes of one data frame on an open server stream.

        Raises :class:`LocalProtocolError` when the encoded payload is too large.
        """
        return encode_frame(stream_id, MessageType.DATA, 0, self._pack(payload), max_data_bytes=self.max_data_bytes)


class ClientConnection(_Side):
    """The client's view of one connection: allocates stream ids and decodes answers."""

    __slots__ = ("next_stream_id", "codec")

    def __init__(self, *, max_data_bytes: int = MAX_DATA_BYTES, codec: Codec = MSGPACK):
        super().__init__(max_data_bytes)
        self.next_stream_id = 1
        self.codec = codec

    def request(self, request: Request, *, streaming: bool = False) -> tuple[int, bytes]:
        """Allocate the next odd stream id and return it with the request frame's bytes.

        Raises :class:`LocalProtocolError` when the request is too large or the connection
        has used up its stream ids (open a new connection).
        """
        sid = self.next_stream_id
        if sid > MAX_STREAM_ID:
            raise LocalProtocolError("stream ids exhausted on this connection")
        frame = encode_frame(sid, MessageType.REQUEST, _REMOTE_CLOSED if streaming else 0,
                             self.codec.encode_request(request), max_data_bytes=self.max_data_bytes)
        self.next_stream_id = sid + 2
        return sid, frame

    def receive_data(self, data: bytes) -> list[Any]:
        """Feed bytes read from the server; return ResponseReceived / DataReceived / PeerClosed."""
        events: list[Any] = []
        for ev in self._frames(data):
            if ev is None:
                events.append(PeerClosed())
            elif type(ev) is OversizedFrame:
                if ev.type == MessageType.RESPONSE:
                    events.append(ResponseReceived(ev.stream_id, Response(
                        Code.RESOURCE_EXHAUSTED, f"response of {ev.length} bytes exceeds the limit")))
            elif ev.type == MessageType.RESPONSE:
                try:
                    response = self.codec.decode_response(ev.data)
                except RpcError as exc:
                    response = Response(Code.INTERNAL, f"malformed response from server: {exc.message}")
                events.append(ResponseReceived(ev.stream_id, response))
            elif ev.type == MessageType.DATA:
                closed = bool(ev.flags & _REMOTE_CLOSED)
                if ev.flags & _NO_DATA or not ev.data:
                    payload = None
                else:
                    try:
                        payload = self.codec.unpack(ev.data)
                    except RpcError:
                        continue
                events.append(DataReceived(ev.stream_id, payload, closed))
        return events
