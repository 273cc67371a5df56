"""The frame codec: bytes in, frames out. No sockets, no asyncio (sans-IO, like h11).

A frame is a 10-byte header followed by ``length`` bytes of data (protocol.md, "Framing")::

    +----------------+----------------+--------+--------+----------------------+
    | length (u32be) | stream id (u32be) | type (u8) | flags (u8) | data (length bytes) |
    +----------------+----------------+--------+--------+----------------------+

Use :class:`FrameDecoder` by feeding it whatever the transport read and pulling events until
it says :data:`NEED_DATA`; ``feed(b"")`` tells it the peer closed its side.
"""

from __future__ import annotations

import enum
import struct
from typing import final

from shim.rpc.records import Record
from shim.rpc.records import set_field as _set

__all__ = [
    "HEADER",
    "HEADER_BYTES",
    "MAX_DATA_BYTES",
    "MAX_LENGTH_FIELD",
    "MessageType",
    "Flags",
    "Frame",
    "OversizedFrame",
    "NEED_DATA",
    "CLOSED",
    "FrameDecoder",
    "encode_frame",
    "ProtocolError",
    "LocalProtocolError",
    "RemoteProtocolError",
]

HEADER = struct.Struct(">IIBB")
HEADER_BYTES = HEADER.size  # 10
#: The largest data a frame may carry (4 MiB, as ttrpc).
MAX_DATA_BYTES = 4 << 20
#: A length field at or above this (its reserved first byte non-zero) is not our protocol:
#: the connection cannot be resynchronised and is closed.
MAX_LENGTH_FIELD = 1 << 24


class MessageType(enum.IntEnum):
    """The frame's type byte."""

    REQUEST = 1
    RESPONSE = 2
    DATA = 3


class Flags(enum.IntFlag):
    """The frame's flags byte."""

    NONE = 0
    REMOTE_CLOSED = 0x1
    REMOTE_OPEN = 0x2
    NO_DATA = 0x4


class ProtocolError(Exception):
    """The byte stream broke the framing rules."""


class LocalProtocolError(ProtocolError):
    """We were about to break the protocol (e.g. send an oversized frame)."""


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol in a way the connection cannot recover from."""


@final  # so that `type(ev) is Frame` tells the kinds of event apart (hot path: no isinstance)
class Frame(Record):
    """One complete frame."""

    __slots__ = ("stream_id", "type", "flags", "data")
    stream_id: int
    type: int
    flags: int
    data: bytes

    def __init__(self, stream_id: int, type: int, flags: int, data: bytes) -> None:
        _set(self, "stream_id", stream_id)
        _set(self, "type", type)
        _set(self, "flags", flags)
        _set(self, "data", data)


@final
class OversizedFrame(Record):
    """A frame whose data exceeded :data:`MAX_DATA_BYTES`; its data is skipped, never buffered."""

    __slots__ = ("stream_id", "type", "flags", "length")
    stream_id: int
    type: int
    flags: int
    length: int

    def __init__(self, stream_id: int, type: int, flags: int, length: int) -> None:
        _set(self, "stream_id", stream_id)
        _set(self, "type", type)
        _set(self, "flags", flags)
        _set(self, "length", length)


class _Sentinel:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: More bytes are needed before another event can be produced.
NEED_DATA = _Sentinel("NEED_DATA")
#: The peer closed its side cleanly, on a frame boundary.
CLOSED = _Sentinel("CLOSED")


def encode_frame(stream_id: int, msg_type: int, flags: int, data: bytes, *,
                 max_data_bytes: int = MAX_DATA_BYTES) -> bytes:
    """Return the bytes of one frame.

    Raises :class:`LocalProtocolError` when ``data`` is longer than ``max_data_bytes`` or a
    header field is out of range.
    """
    if len(data) > max_data_bytes:
        raise LocalProtocolError(f"frame data is {len(data)} bytes; the limit is {max_data_bytes}")
    try:
        return HEADER.pack(len(data), stream_id, msg_type, flags) + data
    except struct.error as exc:
        raise LocalProtocolError(f"bad frame header field: {exc}") from None


class FrameDecoder:
    """Incremental frame parser.

    Limits are enforced on the header, before anything is allocated for the data: an oversized
    frame yields :class:`OversizedFrame` and its bytes are discarded as they arrive.
    """

    __slots__ = ("_buf", "_pos", "_skip", "_eof", "max_data_bytes")

    def __init__(self, *, max_data_bytes: int = MAX_DATA_BYTES):
        self._buf = bytearray()
        self._pos = 0
        self._skip = 0
        self._eof = False
        self.max_data_bytes = max_data_bytes

    @property
    def buffered_bytes(self) -> int:
        """Bytes held that do not yet form a frame."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes) -> None:
        """Add bytes read from the peer; ``b""`` means the peer closed its side."""
        if not data:
            self._eof = True
            return
        if self._eof:
            raise LocalProtocolError("feed() after end of stream")
        if self._skip:
            n = min(self._skip, len(data))
            self._skip -= n
            data = data[n:]
            if not data:
                return
        self._buf += data

    def next_event(self) -> Frame | OversizedFrame | _Sentinel:
        """Return the next :class:`Frame`, :class:`OversizedFrame`, NEED_DATA or CLOSED.

        Raises :class:`RemoteProtocolError` when the stream ends inside a frame or a length
        field is not of this protocol (>= 16 MiB).
        """
        buf = self._buf
        pos = self._pos
        avail = len(buf) - pos
        if self._skip:
            return self._need_more(avail)
        if avail < HEADER_BYTES:
            return self._need_more(avail)
        length, stream_id, msg_type, flags = HEADER.unpack_from(buf, pos)
        if length > self.max_data_bytes:
            if length >= MAX_LENGTH_FIELD:
                raise RemoteProtocolError(
                    f"frame length field {length} has its reserved byte set; not a podshim stream")
            body = avail - HEADER_BYTES
            taken = min(body, length)
            self._skip = length - taken
            self._advance(pos + HEADER_BYTES + taken)
            return OversizedFrame(stream_id, msg_type, flags, length)
        end = pos + HEADER_BYTES + length
        if len(buf) < end:
            return self._need_more(avail)
        data = bytes(buf[pos + HEADER_BYTES:end])
        self._advance(end)
        return Frame(stream_id, msg_type, flags, data)

    def _advance(self, pos: int) -> None:
        # Compact lazily: deleting from the front of a bytearray per frame would make a
        # pipelined read of N frames cost O(N * buffer).
        if pos >= len(self._buf):
            self._buf.clear()
            self._pos = 0
        elif pos > 65536 and pos * 2 > len(self._buf):
            del self._buf[:pos]
            self._pos = 0
        else:
            self._pos = pos

    def _need_more(self, avail: int) -> _Sentinel:
        if not self._eof:
            return NEED_DATA
        if avail == 0 and not self._skip:
            return CLOSED
        raise RemoteProtocolError("the peer closed the connection in the middle of a frame")
