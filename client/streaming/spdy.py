"""SPDY/3.1, sans-IO: the frame codec, header blocks and a connection's stream and window bookkeeping.

No sockets, no asyncio (as h11 and :mod:`shim.rpc.frames`): a :class:`Connection` takes the bytes a
transport read (``receive_data``) and returns events; what it must send accumulates until the
transport takes it (``data_to_send``). Kubernetes' exec, attach and port-forward run on it.

The wire (draft-mbelshe-httpbis-spdy-00, SPDY/3 and the 3.1 session window), every integer big-endian::

    control frame:  |1| version (15) | type (16) | flags (8) | length (24) | data (length bytes)
    data frame:     |0| stream id (31)           | flags (8) | length (24) | data (length bytes)

======== ==== ======================================================================
type     code data
======== ==== ======================================================================
SYN_STREAM  1 stream id (31), associated stream id (31), priority (3) + 5 unused, slot (8), header block
SYN_REPLY   2 stream id (31), header block
RST_STREAM  3 stream id (31), status (32)
SETTINGS    4 count (32), then count x [flags (8), id (24), value (32)]
PING        6 ping id (32)
GOAWAY      7 last good stream id (31), status (32)
HEADERS     8 stream id (31), header block
WINDOW_UPDATE 9 stream id (31; 0 = the session, SPDY/3.1), delta (31)
======== ==== ======================================================================

A header block is ``count (32)`` then ``count`` x [name length (32), name, value length (32), value],
compressed with zlib using :data:`HEADER_DICTIONARY` as preset dictionary. Each direction of a
connection is ONE zlib stream: every block is a sync-flushed continuation of the previous ones, so a
block can only be decoded by the context that decoded every block before it. Names are lower case;
several values of one name are joined by NUL.

Stream ids: the client opens odd ones, the server even ones, each side's ids strictly increasing.

Flow control (SPDY/3.1): a sender may have at most the receiver's window of DATA bytes unacknowledged
per stream (initially 64 KiB, or SETTINGS_INITIAL_WINDOW_SIZE) and per session (64 KiB); WINDOW_UPDATE
gives credit back. Kubernetes' Go implementation (moby/spdystream) neither sends WINDOW_UPDATE nor
honours windows and relies on TCP alone: a :class:`Connection` made with ``flow_control=False``
speaks to it (it accounts nothing, enforces nothing, sends no WINDOW_UPDATE).

Which errors do what: a malformed frame header, a header block that does not decompress (the shared
zlib context is lost), a bad stream id on SYN_STREAM, or a session window overrun end the connection
(GOAWAY PROTOCOL_ERROR / FLOW_CONTROL_ERROR queued, then :class:`RemoteProtocolError`); DATA for a stream
that is unknown or already half-closed, a stream window overrun, or an oversized DATA frame fail that
stream only (RST_STREAM queued and a :class:`StreamReset` event with ``remote=False``).
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import final

# One sentinel and one error family for podshim's sans-IO codecs (as h11's): the peer's fault or ours.
from shim.rpc.frames import NEED_DATA, LocalProtocolError, ProtocolError, RemoteProtocolError

__all__ = [
    "VERSION", "HEADER_DICTIONARY", "DEFAULT_WINDOW_BYTES", "MAX_DATA_BYTES", "MAX_HEADER_BLOCK_BYTES",
    "ControlType", "RstStatus", "GoAwayStatus", "SettingId", "FLAG_FIN", "FLAG_UNIDIRECTIONAL",
    "SynStream", "SynReply", "RstStream", "Settings", "Ping", "GoAway", "Headers", "WindowUpdate", "Data",
    "HeaderCompressor", "HeaderDecompressor", "FrameDecoder", "encode_frame", "NEED_DATA",
    "ProtocolError", "LocalProtocolError", "RemoteProtocolError",
    "StreamOpened", "StreamReplied", "HeadersReceived", "DataReceived", "StreamReset", "SettingsReceived",
    "PingReceived", "PingAcknowledged", "GoAwayReceived", "WindowUpdated", "Connection", "header",
]

VERSION = 3
#: The initial stream and session window of SPDY/3.1.
DEFAULT_WINDOW_BYTES = 64 * 1024
#: The largest DATA frame accepted (the length field allows 16 MiB - 1; Go writes at most 32 KiB per copy).
MAX_DATA_BYTES = 1 << 20
#: The largest control frame accepted, and the largest a header block may decompress to.
MAX_CONTROL_BYTES = 64 * 1024
MAX_HEADER_BLOCK_BYTES = 256 * 1024
_MAX_STREAM_ID = 0x7FFFFFFF
_MAX_WINDOW = 0x7FFFFFFF

FLAG_FIN = 0x01
FLAG_UNIDIRECTIONAL = 0x02  # SYN_STREAM only
FLAG_SETTINGS_CLEAR = 0x01  # SETTINGS only

_WORD = struct.Struct(">I")
_TWO_WORDS = struct.Struct(">II")
_SYN_STREAM = struct.Struct(">IIBB")


class ControlType(enum.IntEnum):
    SYN_STREAM = 1
    SYN_REPLY = 2
    RST_STREAM = 3
    SETTINGS = 4
    PING = 6
    GOAWAY = 7
    HEADERS = 8
    WINDOW_UPDATE = 9


class RstStatus(enum.IntEnum):
    PROTOCOL_ERROR = 1
    INVALID_STREAM = 2
    REFUSED_STREAM = 3
    UNSUPPORTED_VERSION = 4
    CANCEL = 5
    INTERNAL_ERROR = 6
    FLOW_CONTROL_ERROR = 7
    STREAM_IN_USE = 8
    STREAM_ALREADY_CLOSED = 9
    FRAME_TOO_LARGE = 11


class GoAwayStatus(enum.IntEnum):
    OK = 0
    PROTOCOL_ERROR = 1
    INTERNAL_ERROR = 2


class SettingId(enum.IntEnum):
    UPLOAD_BANDWIDTH = 1
    DOWNLOAD_BANDWIDTH = 2
    ROUND_TRIP_TIME = 3
    MAX_CONCURRENT_STREAMS = 4
    CURRENT_CWND = 5
    DOWNLOAD_RETRANS_RATE = 6
    INITIAL_WINDOW_SIZE = 7
    CLIENT_CERTIFICATE_VECTOR_SIZE = 8


def _dictionary() -> bytes:
    # SPDY/3 section 2.6.10.1: header names and common values as length-prefixed words, then a tail
    # of status lines, dates and content types, run together.
    words = ("options head post put delete trace accept accept-charset accept-encoding accept-language "
             "accept-ranges age allow authorization cache-control connection content-base content-encoding "
             "content-language content-length content-location content-md5 content-range content-type date "
             "etag expect expires from host if-match if-modified-since if-none-match if-range "
             "if-unmodified-since last-modified location max-forwards pragma proxy-authenticate "
             "proxy-authorization range referer retry-after server te trailer transfer-encoding upgrade "
             "user-agent vary via warning www-authenticate method get status")
    more = "version HTTP/1.1 url public set-cookie keep-alive origin"
    tokens = [*words.split(), "200 OK", *more.split()]
    tail = ("100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505"
            "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request401 "
            "Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented503 Service "
            "UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, "
            "Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,application/xml,"
            "application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=gzip,deflate,sdch"
            "charset=utf-8charset=iso-8859-1,utf-,*,enq=0.")
    return b"".join(_WORD.pack(len(t)) + t.encode() for t in tokens) + tail.encode()


#: The zlib preset dictionary of SPDY/3 header blocks (1423 bytes, Adler-32 0xe3c6a7c2).
HEADER_DICTIONARY = _dictionary()


# -- frames ------------------------------------------------------------------------------------------

#: A header block: (name, value) pairs, names lower case; a name with several values appears once per value.
HeaderList = tuple[tuple[str, str], ...]


def header(headers: Iterable[tuple[str, str]], name: str) -> str | None:
    """The first value of ``name`` in ``headers`` (names compare case-insensitively), or None."""
    name = name.lower()
    for key, value in headers:
        if key == name:
            return value
    return None


@final
@dataclass(frozen=True, slots=True)
class SynStream:
    stream_id: int
    headers: HeaderList
    fin: bool = False
    unidirectional: bool = False
    associated_stream_id: int = 0
    priority: int = 0


@final
@dataclass(frozen=True, slots=True)
class SynReply:
    stream_id: int
    headers: HeaderList
    fin: bool = False


@final
@dataclass(frozen=True, slots=True)
class RstStream:
    stream_id: int
    status: int


@final
@dataclass(frozen=True, slots=True)
class Settings:
    #: setting id -> (flags, value)
    values: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    clear: bool = False


@final
@dataclass(frozen=True, slots=True)
class Ping:
    ping_id: int


@final
@dataclass(frozen=True, slots=True)
class GoAway:
    last_good_stream_id: int
    status: int = GoAwayStatus.OK


@final
@dataclass(frozen=True, slots=True)
class Headers:
    stream_id: int
    headers: HeaderList
    fin: bool = False


@final
@dataclass(frozen=True, slots=True)
class WindowUpdate:
    stream_id: int
    delta: int


@final
@dataclass(frozen=True, slots=True)
class Data:
    stream_id: int
    data: bytes
    fin: bool = False


Frame = SynStream | SynReply | RstStream | Settings | Ping | GoAway | Headers | WindowUpdate | Data


# -- header blocks -----------------------------------------------------------------------------------

class HeaderCompressor:
    """One direction's zlib context: every block continues the same stream (sync-flushed)."""

    def __init__(self) -> None:
        self._zlib = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, zlib.MAX_WBITS,
                                      zdict=HEADER_DICTIONARY)

    def compress(self, headers: Iterable[tuple[str, str]]) -> bytes:
        """The compressed header block of ``headers``; names are lower-cased and repeated names joined by NUL.
        Raises LocalProtocolError for an empty name or a NUL inside a value."""
        grouped: dict[str, list[str]] = {}
        for name, value in headers:
            if not name or "\x00" in name or "\x00" in value:
                raise LocalProtocolError(f"bad header {name!r}: {value!r}")
            grouped.setdefault(name.lower(), []).append(value)
        parts = [_WORD.pack(len(grouped))]
        for name, values in grouped.items():
            raw_name, raw_value = name.encode(), "\x00".join(values).encode()
            parts += [_WORD.pack(len(raw_name)), raw_name, _WORD.pack(len(raw_value)), raw_value]
        block = b"".join(parts)
        return self._zlib.compress(block) + self._zlib.flush(zlib.Z_SYNC_FLUSH)


class HeaderDecompressor:
    """The peer's zlib context; refuses a block that inflates beyond :data:`MAX_HEADER_BLOCK_BYTES`."""

    def __init__(self, max_bytes: int = MAX_HEADER_BLOCK_BYTES) -> None:
        self._zlib = zlib.decompressobj(zlib.MAX_WBITS, zdict=HEADER_DICTIONARY)
        self.max_bytes = max_bytes

    def decompress(self, data: bytes) -> HeaderList:
        """The pairs of one compressed block. Raises RemoteProtocolError: the shared context is then
        unusable, so the connection must end."""
        try:
            block = self._zlib.decompress(data, self.max_bytes + 1)
        except zlib.error as exc:
            raise RemoteProtocolError(f"a header block does not decompress: {exc}") from None
        if len(block) > self.max_bytes or self._zlib.unconsumed_tail:
            raise RemoteProtocolError(f"a header block inflates beyond {self.max_bytes} bytes")
        return _parse_block(block)


def _parse_block(block: bytes) -> HeaderList:
    def take(pos: int) -> tuple[bytes, int]:
        if pos + 4 > len(block):
            raise RemoteProtocolError("a header block ends inside a length")
        (n,) = _WORD.unpack_from(block, pos)
        end = pos + 4 + n
        if end > len(block):
            raise RemoteProtocolError("a header block ends inside a name or value")
        return block[pos + 4:end], end

    if len(block) < 4:
        raise RemoteProtocolError("a header block has no pair count")
    (count,) = _WORD.unpack_from(block, 0)
    pos, pairs = 4, []
    for _ in range(count):
        raw_name, pos = take(pos)
        raw_value, pos = take(pos)
        try:
            name, value = raw_name.decode(), raw_value.decode()
        except UnicodeDecodeError:
            raise RemoteProtocolError("a header name or value is not UTF-8") from None
        if not name or name != name.lower():
            raise RemoteProtocolError(f"header name {name!r} is empty or not lower case")
        pairs += [(name, v) for v in value.split("\x00")]
    if pos != len(block):
        raise RemoteProtocolError("a header block has bytes after its last pair")
    return tuple(pairs)


# -- the codec ---------------------------------------------------------------------------------------

def _control(ctype: int, flags: int, payload: bytes) -> bytes:
    return _TWO_WORDS.pack(0x80000000 | VERSION << 16 | ctype, flags << 24 | len(payload)) + payload


def _stream_id(stream_id: int, *, zero_ok: bool = False) -> int:
    if not (0 if zero_ok else 1) <= stream_id <= _MAX_STREAM_ID:
        raise LocalProtocolError(f"stream id {stream_id} is out of range")
    return stream_id


def encode_frame(frame: Frame, compressor: HeaderCompressor) -> bytes:
    """The bytes of ``frame``; header blocks go through ``compressor`` (the connection's outgoing
    context: frames must then be sent in the order they were encoded). Raises LocalProtocolError."""
    fin = FLAG_FIN if getattr(frame, "fin", False) else 0
    if type(frame) is Data:
        if len(frame.data) > 0xFFFFFF:
            raise LocalProtocolError(f"a DATA frame of {len(frame.data)} bytes is beyond the 24-bit length")
        return _TWO_WORDS.pack(_stream_id(frame.stream_id), fin << 24 | len(frame.data)) + frame.data
    if type(frame) is SynStream:
        if not 0 <= frame.priority <= 7:
            raise LocalProtocolError(f"priority {frame.priority} is not 0-7")
        fixed = _SYN_STREAM.pack(_stream_id(frame.stream_id), _stream_id(frame.associated_stream_id, zero_ok=True),
                                 frame.priority << 5, 0)
        flags = fin | (FLAG_UNIDIRECTIONAL if frame.unidirectional else 0)
        return _control(ControlType.SYN_STREAM, flags, fixed + compressor.compress(frame.headers))
    if type(frame) is SynReply:
        return _control(ControlType.SYN_REPLY, fin,
                        _WORD.pack(_stream_id(frame.stream_id)) + compressor.compress(frame.headers))
    if type(frame) is Headers:
        return _control(ControlType.HEADERS, fin,
                        _WORD.pack(_stream_id(frame.stream_id)) + compressor.compress(frame.headers))
    if type(frame) is RstStream:
        if frame.status == 0:
            raise LocalProtocolError("RST_STREAM status 0 is not allowed")
        return _control(ControlType.RST_STREAM, 0, _TWO_WORDS.pack(_stream_id(frame.stream_id), frame.status))
    if type(frame) is Settings:
        entries = b"".join(_TWO_WORDS.pack(flags << 24 | (sid & 0xFFFFFF), value)
                           for sid, (flags, value) in frame.values.items())
        return _control(ControlType.SETTINGS, FLAG_SETTINGS_CLEAR if frame.clear else 0,
                        _WORD.pack(len(frame.values)) + entries)
    if type(frame) is Ping:
        return _control(ControlType.PING, 0, _WORD.pack(frame.ping_id))
    if type(frame) is GoAway:
        return _control(ControlType.GOAWAY, 0, _TWO_WORDS.pack(_stream_id(frame.last_good_stream_id, zero_ok=True),
                                                               frame.status))
    if type(frame) is WindowUpdate:
        if not 1 <= frame.delta <= _MAX_WINDOW:
            raise LocalProtocolError(f"window delta {frame.delta} is not 1 to 2^31-1")
        return _control(ControlType.WINDOW_UPDATE, 0, _TWO_WORDS.pack(_stream_id(frame.stream_id, zero_ok=True),
                                                                      frame.delta))
    raise LocalProtocolError(f"not a SPDY frame: {frame!r}")


@final
@dataclass(frozen=True, slots=True)
class OversizedData:
    """A DATA frame beyond the decoder's limit: its bytes were skipped, never buffered."""

    stream_id: int
    length: int


@final
@dataclass(frozen=True, slots=True)
class UnknownControl:
    """A control frame of a type SPDY/3.1 does not define: the spec says to ignore it."""

    type: int


class FrameDecoder:
    """Incremental frame parser: ``feed(bytes)``, then ``next_frame()`` until NEED_DATA.

    Header blocks are decompressed here, in arrival order, with the peer's one zlib context. Limits
    are checked on the 8-byte header before anything is buffered.
    """

    def __init__(self, *, max_data_bytes: int = MAX_DATA_BYTES) -> None:
        self._buf = bytearray()
        self._skip = 0
        self.max_data_bytes = max_data_bytes
        self.decompressor = HeaderDecompressor()

    def feed(self, data: bytes) -> None:
        """Add bytes read from the peer."""
        if self._skip:
            n = min(self._skip, len(data))
            self._skip -= n
            data = data[n:]
        self._buf += data

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf)

    def next_frame(self) -> Frame | OversizedData | UnknownControl | object:
        """The next frame, or NEED_DATA. Raises RemoteProtocolError when the stream cannot be parsed on."""
        buf = self._buf
        if self._skip or len(buf) < 8:
            return NEED_DATA
        first, second = _TWO_WORDS.unpack_from(buf, 0)
        flags, length = second >> 24, second & 0xFFFFFF
        if not first & 0x80000000:
            stream_id = first & _MAX_STREAM_ID
            if length > self.max_data_bytes:
                taken = min(len(buf) - 8, length)
                self._skip = length - taken
                del buf[:8 + taken]
                return OversizedData(stream_id, length)
            if len(buf) < 8 + length:
                return NEED_DATA
            data = bytes(buf[8:8 + length])
            del buf[:8 + length]
            if stream_id == 0:
                raise RemoteProtocolError("a DATA frame on stream 0")
            return Data(stream_id, data, bool(flags & FLAG_FIN))
        version, ctype = (first >> 16) & 0x7FFF, first & 0xFFFF
        if version != VERSION:
            raise RemoteProtocolError(f"a control frame of SPDY version {version}, not {VERSION}")
        if length > MAX_CONTROL_BYTES:
            raise RemoteProtocolError(f"a control frame of {length} bytes (the limit is {MAX_CONTROL_BYTES})")
        if len(buf) < 8 + length:
            return NEED_DATA
        payload = bytes(buf[8:8 + length])
        del buf[:8 + length]
        return self._control(ctype, flags, payload)

    def _control(self, ctype: int, flags: int, payload: bytes) -> Frame | UnknownControl:
        fin = bool(flags & FLAG_FIN)

        def need(n: int, exact: bool = False) -> None:
            if len(payload) < n or (exact and len(payload) != n):
                raise RemoteProtocolError(f"a {ControlType(ctype).name} frame of {len(payload)} bytes")

        if ctype == ControlType.SYN_STREAM:
            need(10)
            sid, assoc, pri, _slot = _SYN_STREAM.unpack_from(payload)
            headers = self.decompressor.decompress(payload[10:])
            if sid & _MAX_STREAM_ID == 0:
                raise RemoteProtocolError("SYN_STREAM for stream 0")
            return SynStream(sid & _MAX_STREAM_ID, headers, fin, bool(flags & FLAG_UNIDIRECTIONAL),
                             assoc & _MAX_STREAM_ID, pri >> 5)
        if ctype in (ControlType.SYN_REPLY, ControlType.HEADERS):
            need(4)
            sid = _WORD.unpack_from(payload)[0] & _MAX_STREAM_ID
            headers = self.decompressor.decompress(payload[4:])
            if sid == 0:
                raise RemoteProtocolError(f"{ControlType(ctype).name} for stream 0")
            return (SynReply if ctype == ControlType.SYN_REPLY else Headers)(sid, headers, fin)
        if ctype == ControlType.RST_STREAM:
            need(8, exact=True)
            sid, status = _TWO_WORDS.unpack(payload)
            if sid & _MAX_STREAM_ID == 0 or status == 0:
                raise RemoteProtocolError("RST_STREAM for stream 0 or with status 0")
            return RstStream(sid & _MAX_STREAM_ID, status)
        if ctype == ControlType.SETTINGS:
            need(4)
            (count,) = _WORD.unpack_from(payload)
            need(4 + 8 * count, exact=True)
            values = {}
            for i in range(count):
                word, value = _TWO_WORDS.unpack_from(payload, 4 + 8 * i)
                values[word & 0xFFFFFF] = (word >> 24, value)
            return Settings(values, bool(flags & FLAG_SETTINGS_CLEAR))
        if ctype == ControlType.PING:
            need(4, exact=True)
            return Ping(_WORD.unpack(payload)[0])
        if ctype == ControlType.GOAWAY:
            need(8, exact=True)
            sid, status = _TWO_WORDS.unpack(payload)
            return GoAway(sid & _MAX_STREAM_ID, status)
        if ctype == ControlType.WINDOW_UPDATE:
            need(8, exact=True)
            sid, delta = _TWO_WORDS.unpack(payload)
            delta &= _MAX_WINDOW
            if delta == 0:
                raise RemoteProtocolError("WINDOW_UPDATE with a delta of 0")
            return WindowUpdate(sid & _MAX_STREAM_ID, delta)
        return UnknownControl(ctype)


# -- the connection ----------------------------------------------------------------------------------

@final
@dataclass(frozen=True, slots=True)
class StreamOpened:
    """The peer opened a stream (SYN_STREAM); answer with :meth:`Connection.reply` or reset it."""

    stream_id: int
    headers: HeaderList
    fin: bool


@final
@dataclass(frozen=True, slots=True)
class StreamReplied:
    stream_id: int
    headers: HeaderList
    fin: bool


@final
@dataclass(frozen=True, slots=True)
class HeadersReceived:
    stream_id: int
    headers: HeaderList
    fin: bool


@final
@dataclass(frozen=True, slots=True)
class DataReceived:
    """DATA on a stream; with flow control, give the credit back with :meth:`Connection.acknowledge`."""

    stream_id: int
    data: bytes
    fin: bool


@final
@dataclass(frozen=True, slots=True)
class StreamReset:
    """A stream ended abnormally: the peer reset it (``remote``) or we did, for its protocol error."""

    stream_id: int
    status: int
    remote: bool = True


@final
@dataclass(frozen=True, slots=True)
class SettingsReceived:
    values: Mapping[int, tuple[int, int]]


@final
@dataclass(frozen=True, slots=True)
class PingReceived:
    """The peer pinged; the echo is already queued."""

    ping_id: int


@final
@dataclass(frozen=True, slots=True)
class PingAcknowledged:
    ping_id: int


@final
@dataclass(frozen=True, slots=True)
class GoAwayReceived:
    last_good_stream_id: int
    status: int


@final
@dataclass(frozen=True, slots=True)
class WindowUpdated:
    """Send credit arrived for ``stream_id`` (0: the session)."""

    stream_id: int
    delta: int


Event = (StreamOpened | StreamReplied | HeadersReceived | DataReceived | StreamReset | SettingsReceived
         | PingReceived | PingAcknowledged | GoAwayReceived | WindowUpdated)


@dataclass(slots=True)
class _Stream:
    send_window: int
    receive_window: int
    local_closed: bool = False  # we sent FIN
    remote_closed: bool = False  # the peer sent FIN
    replied: bool = False  # SYN_REPLY sent (theirs) or received (ours)
    unacknowledged: int = 0  # bytes received that the application has not yet acknowledged


class Connection:
    """One SPDY/3.1 session, either side. Feed it bytes (:meth:`receive_data`) and act on the events;
    call the sending methods; write out :meth:`data_to_send`.

    ``flow_control=False`` is for peers that do not do SPDY/3.1 flow control (Kubernetes' spdystream):
    windows are then neither enforced nor updated.
    """

    def __init__(self, *, client_side: bool, flow_control: bool = True,
                 initial_window_bytes: int = DEFAULT_WINDOW_BYTES, max_data_bytes: int = MAX_DATA_BYTES) -> None:
        self.client_side = client_side
        self.flow_control = flow_control
        self._decoder = FrameDecoder(max_data_bytes=max_data_bytes)
        self._compressor = HeaderCompressor()
        self._out: list[bytes] = []
        self._streams: dict[int, _Stream] = {}
        self._next_stream_id = 1 if client_side else 2
        self._next_ping_id = 1 if client_side else 2
        self._last_remote_stream_id = 0
        self._peer_initial_window = DEFAULT_WINDOW_BYTES  # for streams we open or accept: our send window
        self._initial_window = initial_window_bytes  # what we grant each stream
        self.session_send_window = DEFAULT_WINDOW_BYTES
        self.session_receive_window = DEFAULT_WINDOW_BYTES
        self._session_unacknowledged = 0
        self.goaway_sent = False
        self.goaway_received = False
        if initial_window_bytes != DEFAULT_WINDOW_BYTES and flow_control:
            self._send(Settings({SettingId.INITIAL_WINDOW_SIZE: (0, initial_window_bytes)}))

    # -- bookkeeping queries ---------------------------------------------------------------------------
    @property
    def open_streams(self) -> frozenset[int]:
        """The ids of streams not yet closed both ways nor reset."""
        return frozenset(self._streams)

    def send_window(self, stream_id: int) -> int:
        """How many DATA bytes may be sent on ``stream_id`` now (stream and session windows)."""
        stream = self._get(stream_id)
        return min(stream.send_window, self.session_send_window)

    def receive_window(self, stream_id: int) -> int:
        return self._get(stream_id).receive_window

    def _get(self, stream_id: int) -> _Stream:
        try:
            return self._streams[stream_id]
        except KeyError:
            raise LocalProtocolError(f"stream {stream_id} is not open") from None

    # -- output ----------------------------------------------------------------------------------------
    def data_to_send(self) -> bytes:
        """Everything queued to send, in order; empties the queue."""
        data = b"".join(self._out)
        self._out.clear()
        return data

    def _send(self, frame: Frame) -> None:
        self._out.append(encode_frame(frame, self._compressor))

    # -- sending ---------------------------------------------------------------------------------------
    def open_stream(self, headers: Sequence[tuple[str, str]], *, fin: bool = False) -> int:
        """Open a stream of ours (SYN_STREAM); return its id. Raises LocalProtocolError after GOAWAY."""
        if self.goaway_sent or self.goaway_received:
            raise LocalProtocolError("no new streams after GOAWAY")
        stream_id = self._next_stream_id
        _stream_id(stream_id)
        self._next_stream_id += 2
        self._streams[stream_id] = _Stream(self._peer_initial_window, self._initial_window, local_closed=fin)
        self._send(SynStream(stream_id, tuple(headers), fin))
        return stream_id

    def reply(self, stream_id: int, headers: Sequence[tuple[str, str]] = (), *, fin: bool = False) -> None:
        """Accept a stream the peer opened (SYN_REPLY)."""
        stream = self._get(stream_id)
        if self._ours(stream_id) or stream.replied:
            raise LocalProtocolError(f"stream {stream_id} cannot be replied to")
        stream.replied = True
        self._send(SynReply(stream_id, tuple(headers), fin))
        if fin:
            self._close_local(stream_id, stream)

    def send_data(self, stream_id: int, data: bytes, *, fin: bool = False) -> None:
        """Send DATA (and FIN when ``fin``). With flow control, ``data`` must fit :meth:`send_window`.
        Raises LocalProtocolError for a stream we closed or data beyond the window."""
        stream = self._get(stream_id)
        if stream.local_closed:
            raise LocalProtocolError(f"stream {stream_id} is closed for sending")
        if self.flow_control:
            if len(data) > min(stream.send_window, self.session_send_window):
                raise LocalProtocolError(f"{len(data)} bytes exceed stream {stream_id}'s send window "
                                         f"({min(stream.send_window, self.session_send_window)})")
            stream.send_window -= len(data)
            self.session_send_window -= len(data)
        view = memoryview(data)
        pieces = [view[i:i + MAX_DATA_BYTES] for i in range(0, len(data), MAX_DATA_BYTES)] or [view]
        for piece in pieces[:-1]:
            self._send(Data(stream_id, bytes(piece)))
        self._send(Data(stream_id, bytes(pieces[-1]), fin))
        if fin:
            self._close_local(stream_id, stream)

    def end_stream(self, stream_id: int) -> None:
        """Half-close our side (an empty DATA frame with FIN); nothing if already closed."""
        stream = self._streams.get(stream_id)
        if stream is not None and not stream.local_closed:
            self.send_data(stream_id, b"", fin=True)

    def reset_stream(self, stream_id: int, status: int = RstStatus.CANCEL) -> None:
        """Abort a stream (RST_STREAM); nothing if it is already gone."""
        if self._streams.pop(stream_id, None) is not None:
            self._send(RstStream(stream_id, status))

    def acknowledge(self, stream_id: int, nbytes: int) -> None:
        """The application consumed ``nbytes`` of ``stream_id``'s data: give the credit back
        (WINDOW_UPDATE, batched to half a window). Nothing without flow control."""
        if not self.flow_control or nbytes <= 0:
            return
        self._session_unacknowledged += nbytes
        if self._session_unacknowledged >= DEFAULT_WINDOW_BYTES // 2:
            self.session_receive_window += self._session_unacknowledged
            self._send(WindowUpdate(0, self._session_unacknowledged))
            self._session_unacknowledged = 0
        stream = self._streams.get(stream_id)
        if stream is None or stream.remote_closed:
            return
        stream.unacknowledged += nbytes
        if stream.unacknowledged >= self._initial_window // 2:
            stream.receive_window += stream.unacknowledged
            self._send(WindowUpdate(stream_id, stream.unacknowledged))
            stream.unacknowledged = 0

    def ping(self) -> int:
        """Send a PING of ours; return its id (a :class:`PingAcknowledged` event follows)."""
        ping_id = self._next_ping_id
        self._next_ping_id = (self._next_ping_id + 2) & 0xFFFFFFFF or (1 if self.client_side else 2)
        self._send(Ping(ping_id))
        return ping_id

    def goaway(self, status: int = GoAwayStatus.OK) -> None:
        """Tell the peer no more streams will be accepted (GOAWAY); once only."""
        if not self.goaway_sent:
            self.goaway_sent = True
            self._send(GoAway(self._last_remote_stream_id, status))

    # -- receiving -------------------------------------------------------------------------------------
    def receive_data(self, data: bytes) -> list[Event]:
        """Process bytes from the peer; return the events they complete. Raises RemoteProtocolError
        for a connection error, after queueing a GOAWAY that says so."""
        self._decoder.feed(data)
        events: list[Event] = []
        while True:
            try:
                frame = self._decoder.next_frame()
            except RemoteProtocolError:
                self.goaway(GoAwayStatus.PROTOCOL_ERROR)
                raise
            if frame is NEED_DATA:
                return events
            self._handle(frame, events)

    def _ours(self, stream_id: int) -> bool:
        return (stream_id % 2 == 1) == self.client_side

    def _fail_connection(self, reason: str, status: int = GoAwayStatus.PROTOCOL_ERROR) -> None:
        self.goaway(status)
        raise RemoteProtocolError(reason)

    def _fail_stream(self, stream_id: int, status: int, events: list[Event]) -> None:
        self._streams.pop(stream_id, None)
        self._send(RstStream(stream_id, status))
        events.append(StreamReset(stream_id, status, remote=False))

    def _close_local(self, stream_id: int, stream: _Stream) -> None:
        stream.local_closed = True
        if stream.remote_closed:
            del self._streams[stream_id]

    def _close_remote(self, stream_id: int, stream: _Stream) -> None:
        stream.remote_closed = True
        if stream.local_closed:
            del self._streams[stream_id]

    def _handle(self, frame: object, events: list[Event]) -> None:
        kind = type(frame)
        if kind is Data:
            assert isinstance(frame, Data)
            self._on_data(frame, events)
        elif kind is SynStream:
            assert isinstance(frame, SynStream)
            sid = frame.stream_id
            if self._ours(sid) or sid <= self._last_remote_stream_id:
                self._fail_connection(f"SYN_STREAM for stream {sid}: not a new id of the peer's")
            self._last_remote_stream_id = sid
            if self.goaway_sent:
                self._send(RstStream(sid, RstStatus.REFUSED_STREAM))
                return
            self._streams[sid] = _Stream(self._peer_initial_window, self._initial_window, remote_closed=frame.fin,
                                         local_closed=frame.unidirectional)
            events.append(StreamOpened(sid, frame.headers, frame.fin))
        elif kind is SynReply or kind is Headers:
            assert isinstance(frame, (SynReply, Headers))
            stream = self._streams.get(frame.stream_id)
            if stream is None:
                return  # a stream already reset: its late frames are dropped
            if kind is SynReply:
                if not self._ours(frame.stream_id) or stream.replied:
                    self._fail_stream(frame.stream_id, RstStatus.STREAM_IN_USE, events)
                    return
                stream.replied = True
                events.append(StreamReplied(frame.stream_id, frame.headers, frame.fin))
            else:
                events.append(HeadersReceived(frame.stream_id, frame.headers, frame.fin))
            if frame.fin:
                self._close_remote(frame.stream_id, stream)
        elif kind is RstStream:
            assert isinstance(frame, RstStream)
            if self._streams.pop(frame.stream_id, None) is not None:
                events.append(StreamReset(frame.stream_id, frame.status))
        elif kind is Settings:
            assert isinstance(frame, Settings)
            window = frame.values.get(SettingId.INITIAL_WINDOW_SIZE)
            if window is not None and self.flow_control:
                if window[1] > _MAX_WINDOW:
                    self._fail_connection(f"SETTINGS_INITIAL_WINDOW_SIZE {window[1]} is beyond 2^31-1")
                delta = window[1] - self._peer_initial_window
                self._peer_initial_window = window[1]
                for stream in self._streams.values():
                    stream.send_window += delta
            events.append(SettingsReceived(frame.values))
        elif kind is Ping:
            assert isinstance(frame, Ping)
            if (frame.ping_id % 2 == 1) == self.client_side:
                events.append(PingAcknowledged(frame.ping_id))
            else:
                self._send(frame)
                events.append(PingReceived(frame.ping_id))
        elif kind is GoAway:
            assert isinstance(frame, GoAway)
            self.goaway_received = True
            events.append(GoAwayReceived(frame.last_good_stream_id, frame.status))
        elif kind is WindowUpdate:
            assert isinstance(frame, WindowUpdate)
            self._on_window_update(frame, events)
        elif kind is OversizedData:
            assert isinstance(frame, OversizedData)
            if frame.stream_id in self._streams:
                self._fail_stream(frame.stream_id, RstStatus.FRAME_TOO_LARGE, events)
        # UnknownControl: ignored, as the spec says

    def _on_data(self, frame: Data, events: list[Event]) -> None:
        sid = frame.stream_id
        stream = self._streams.get(sid)
        if stream is None:
            opened = sid < self._next_stream_id if self._ours(sid) else sid <= self._last_remote_stream_id
            if not opened:
                self._send(RstStream(sid, RstStatus.INVALID_STREAM))
            return  # a stream we reset or closed: its data in flight is dropped
        if stream.remote_closed:
            self._fail_stream(sid, RstStatus.STREAM_ALREADY_CLOSED, events)
            return
        if self.flow_control:
            n = len(frame.data)
            if n > self.session_receive_window:
                self._fail_connection(f"{n} bytes of DATA overrun the session window ({self.session_receive_window})")
            self.session_receive_window -= n
            if n > stream.receive_window:
                self._fail_stream(sid, RstStatus.FLOW_CONTROL_ERROR, events)
                return
            stream.receive_window -= n
        events.append(DataReceived(sid, frame.data, frame.fin))
        if frame.fin:
            self._close_remote(sid, stream)

    def _on_window_update(self, frame: WindowUpdate, events: list[Event]) -> None:
        if not self.flow_control:
            events.append(WindowUpdated(frame.stream_id, frame.delta))
            return
        if frame.stream_id == 0:
            if self.session_send_window + frame.delta > _MAX_WINDOW:
                self._fail_connection("WINDOW_UPDATE overflows the session window")
            self.session_send_window += frame.delta
        else:
            stream = self._streams.get(frame.stream_id)
            if stream is None:
                return
            if stream.send_window + frame.delta > _MAX_WINDOW:
                self._fail_stream(frame.stream_id, RstStatus.FLOW_CONTROL_ERROR, events)
                return
            stream.send_window += frame.delta
        events.append(WindowUpdated(frame.stream_id, frame.delta))
