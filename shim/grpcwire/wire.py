"""gRPC's rules on HTTP/2 that both sides share, sans-IO: the 5-byte message prefix, the
grpc-timeout and grpc-message encodings, and the cutting of GOAWAY frames out of what a peer sends.

The GOAWAY frames are read here, never by h2: h2 closes its connection's state machine on one
(received or sent) and then fails on every frame after it (python-hyper/h2#1181), where RFC 9113
6.8 says the streams up to its last stream id go on. So both sides cut a peer's GOAWAY out before
h2 sees the bytes, and a server says its own with :func:`goaway_frame` instead of h2's.
"""

from __future__ import annotations

import re
import struct
from typing import Final
from urllib.parse import unquote_to_bytes

import h2.errors

__all__ = ["CLIENT_PREFACE", "PREFIX", "FRAME_HEADER", "GOAWAY_PAYLOAD", "GoawayCutter", "decode_details", "decode_timeout",
           "encode_details", "encode_timeout", "error_name", "goaway_frame"]

#: gRPC's message prefix: compressed flag, length.
PREFIX: Final = struct.Struct(">BI")
#: HTTP/2's 9-byte frame header: length (24 bits), type, flags, stream.
FRAME_HEADER: Final = struct.Struct(">HBBBI")
#: A GOAWAY's last stream id (31 bits) and error code; then its debug data.
GOAWAY_PAYLOAD: Final = struct.Struct(">II")
_GOAWAY = 0x7
#: What an HTTP/2 client sends before its first frame (RFC 9113 3.4).
CLIENT_PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

_TIMEOUT_UNITS: Final = ((b"n", 1e9), (b"u", 1e6), (b"m", 1e3), (b"S", 1.0), (b"M", 1 / 60), (b"H", 1 / 3600))
_PER_SECOND: Final = dict(_TIMEOUT_UNITS)
_TIMEOUT: Final = re.compile(rb"([0-9]{1,8})([HMSmun])")
# grpc-message: every byte outside printable ASCII, and '%' itself, percent-encoded (gRPC's PROTOCOL-HTTP2).
_PLAIN: Final = frozenset(range(0x20, 0x7F)) - {ord("%")}


def encode_timeout(timeout: float) -> bytes:
    """``timeout`` seconds as a grpc-timeout header value: at most 8 digits and a unit, the finest
    unit that fits (a timeout already past is sent as 1 ns: the server fails it at once)."""
    for unit, per_second in _TIMEOUT_UNITS:
        value = max(1, int(timeout * per_second))
        if value < 100_000_000:
            return b"%d%s" % (value, unit)
    return b"99999999H"


def decode_timeout(value: bytes) -> float | None:
    """The seconds of a grpc-timeout header value; None when it is not one (digits and a unit)."""
    match = _TIMEOUT.fullmatch(value)
    if match is None:
        return None
    return int(match[1]) / _PER_SECOND[match[2]]


def encode_details(details: str) -> bytes:
    """A status's sentence as a grpc-message value."""
    raw = details.encode("utf-8", "replace")
    if all(byte in _PLAIN for byte in raw):
        return raw
    return b"".join(bytes((byte,)) if byte in _PLAIN else b"%%%02X" % byte for byte in raw)


def decode_details(value: bytes) -> str:
    """A grpc-message value as the sentence it carries."""
    return unquote_to_bytes(value).decode("utf-8", "replace")


def goaway_frame(last_stream_id: int, error_code: int = 0, debug: bytes = b"") -> bytes:
    """A whole GOAWAY frame: no stream after ``last_stream_id`` is taken (RFC 9113 6.8)."""
    payload = GOAWAY_PAYLOAD.pack(last_stream_id & 0x7FFFFFFF, error_code) + debug
    return FRAME_HEADER.pack(len(payload) >> 8, len(payload) & 0xFF, _GOAWAY, 0, 0) + payload


class GoawayCutter:
    """Cuts a peer's byte stream around its GOAWAY frames, read after read: the bytes for h2 and
    each whole GOAWAY's payload, in order. Only a well-formed GOAWAY (stream 0, at least 8 bytes,
    no larger than ``max_frame_size``) is taken out: h2 fails a malformed one. ``preface``: bytes
    that come before the first frame (a client's connection preface, which a server reads)."""

    def __init__(self, preface: int = 0) -> None:
        self._held = b""  # the start of a frame header cut by a read: cut once it is whole
        self._frame_left = preface  # bytes of the current frame's payload (or the preface) still to come
        self._goaway: bytearray | None = None  # the payload of a GOAWAY being read

    def cut(self, data: bytes, max_frame_size: int) -> list[tuple[bool, bytes]]:
        """``data`` as ``(False, bytes for h2)`` and ``(True, a GOAWAY's payload)`` parts."""
        data, self._held = self._held + data, b""
        parts: list[tuple[bool, bytes]] = []
        start = pos = 0  # start: the first byte for h2 not in parts yet
        while pos < len(data):
            if self._frame_left:
                step = min(self._frame_left, len(data) - pos)
                self._frame_left -= step
                if self._goaway is not None:
                    self._goaway += data[pos:pos + step]
                    start = pos + step
                    if not self._frame_left:
                        parts.append((True, bytes(self._goaway)))
                        self._goaway = None
                pos += step
            elif len(data) - pos < FRAME_HEADER.size:
                self._held = data[pos:]
                break
            else:
                high, low, frame_type, _, stream_id = FRAME_HEADER.unpack_from(data, pos)
                self._frame_left = (high << 8) | low
                if frame_type == _GOAWAY and stream_id == 0 and GOAWAY_PAYLOAD.size <= self._frame_left <= max_frame_size:
                    parts.append((False, data[start:pos]))
                    self._goaway = bytearray()
                    start = pos + FRAME_HEADER.size
                pos += FRAME_HEADER.size
        parts.append((False, data[start:pos]))
        return [(is_goaway, part) for is_goaway, part in parts if part]


def error_name(error_code: int | None) -> str:
    """The name of an HTTP/2 error code (RST_STREAM's, GOAWAY's), or its number."""
    if error_code is None:
        return "unknown"
    try:
        return h2.errors.ErrorCodes(error_code).name
    except ValueError:
        return str(error_code)
