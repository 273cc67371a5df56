"""ttrpc's own Request and Response messages in protobuf, the envelope containerd speaks (protocol.md,
"Protobuf payloads"). Sans-IO, the standard library only: the envelope is five fields, not worth a
generated module.

    Request  { string service = 1; string method = 2; bytes payload = 3; int64 timeout_nano = 4;
               repeated KeyValue metadata = 5; }                     KeyValue { string key = 1; string value = 2; }
    Response { google.rpc.Status status = 1; bytes payload = 2; }    Status { int32 code = 1; string message = 2; }

The payload stays bytes: the service's own protobuf message, which its handler parses
(shim/containerd/wire.py). Decoding raises :class:`~shim.rpc.status.InvalidArgument` with a sentence
naming what is wrong; unknown fields are skipped, as protobuf does.
"""

from __future__ import annotations

from typing import Any

from shim.rpc.messages import MAX_METADATA_ENTRIES, MAX_METADATA_VALUES, Request, Response
from shim.rpc.status import InvalidArgument

__all__ = ["encode_request", "decode_request", "encode_response", "decode_response", "pack", "unpack",
           "REQUEST_FIRST_BYTE", "LEN", "VARINT", "field", "fields", "int_field", "text"]

#: The first byte of every protobuf Request: field 1 (service, never empty), length-delimited. No
#: msgpack Request starts with it (a msgpack map starts with 0x80-0x8f, 0xde or 0xdf).
REQUEST_FIRST_BYTE = 0x0A

VARINT, I64, LEN, I32 = 0, 1, 2, 5


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int32/int64 negatives are ten-byte two's complement
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field(number: int, data: bytes) -> bytes:
    """A length-delimited field (a string, bytes or a message)."""
    return _varint(number << 3 | LEN) + _varint(len(data)) + data


def int_field(number: int, value: int) -> bytes:
    """A varint field; nothing for 0 (proto3's default)."""
    return _varint(number << 3 | VARINT) + _varint(value) if value else b""


def fields(data: bytes, what: str) -> list[tuple[int, int, Any]]:
    """``(number, wire type, value)`` of each field of the message ``data``: an int for a varint,
    bytes for a length-delimited field; fixed-width ones are skipped."""
    out: list[tuple[int, int, Any]] = []
    pos, end = 0, len(data)
    while pos < end:
        key, pos = _read_varint(data, pos, what)
        number, kind = key >> 3, key & 7
        if number == 0:
            raise InvalidArgument(f"{what} is not valid protobuf: field number 0")
        if kind == VARINT:
            value, pos = _read_varint(data, pos, what)
            out.append((number, kind, value))
        elif kind == LEN:
            length, pos = _read_varint(data, pos, what)
            if pos + length > end:
                raise InvalidArgument(f"{what} is not valid protobuf: field {number} runs past the end")
            out.append((number, kind, data[pos:pos + length]))
            pos += length
        elif kind in (I64, I32):
            pos += 8 if kind == I64 else 4
            if pos > end:
                raise InvalidArgument(f"{what} is not valid protobuf: field {number} runs past the end")
        else:
            raise InvalidArgument(f"{what} is not valid protobuf: wire type {kind} of field {number}")
    return out


def _read_varint(data: bytes, pos: int, what: str) -> tuple[int, int]:
    value = shift = 0
    while pos < len(data) and shift < 70:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise InvalidArgument(f"{what} is not valid protobuf: a varint is cut short")


def text(value: Any, what: str) -> str:
    """A length-delimited field's value as a string; InvalidArgument naming ``what`` otherwise."""
    if not isinstance(value, bytes):
        raise InvalidArgument(f"{what} must be a string (length-delimited)")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument(f"{what} is not UTF-8") from None


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def encode_request(req: Request) -> bytes:
    """A protobuf Request; its payload must already be the bytes of the method's message."""
    if not isinstance(req.payload, (bytes, bytearray)):
        raise TypeError(f"a protobuf request's payload must be bytes, not {type(req.payload).__name__}")
    parts = [field(1, req.service.encode()), field(2, req.method.encode())]
    if req.payload:
        parts.append(field(3, bytes(req.payload)))
    parts.append(int_field(4, req.timeout_nano))
    for key, values in req.metadata.items():
        for value in values:
            parts.append(field(5, field(1, key.encode()) + field(2, value.encode())))
    return b"".join(parts)


def decode_request(data: bytes) -> Request:
    """Parse a protobuf Request; InvalidArgument naming the first bad field."""
    service = method = ""
    payload = b""
    timeout = 0
    metadata: dict[str, list[str]] = {}
    entries = 0
    for number, kind, value in fields(data, "request"):
        if number == 1 and kind == LEN:
            service = text(value, "request field 'service'")
        elif number == 2 and kind == LEN:
            method = text(value, "request field 'method'")
        elif number == 3 and kind == LEN:
            payload = value
        elif number == 4 and kind == VARINT:
            timeout = _signed64(value)
        elif number == 5 and kind == LEN:
            key = value_text = ""
            for n, k, v in fields(value, "request metadata"):
                if n == 1 and k == LEN:
                    key = text(v, "a metadata key").lower()
                elif n == 2 and k == LEN:
                    value_text = text(v, "a metadata value")
            values = metadata.setdefault(key, [])
            entries += 1
            if len(metadata) > MAX_METADATA_ENTRIES or len(values) >= MAX_METADATA_VALUES:
                raise InvalidArgument(f"metadata has too many entries ({entries}); at most {MAX_METADATA_ENTRIES} "
                                      f"keys of {MAX_METADATA_VALUES} values are allowed")
            values.append(value_text)
    if not service:
        raise InvalidArgument("request field 'service' must be a non-empty string")
    if not method:
        raise InvalidArgument("request field 'method' must be a non-empty string")
    if timeout < 0:
        raise InvalidArgument("request field 'timeout_nano' must be a non-negative integer")
    return Request(service, method, payload, timeout, metadata)


def encode_response(resp: Response) -> bytes:
    """A protobuf Response: the status (its details are not sent: ttrpc's are protobuf Anys), and
    the payload, which must be bytes (the method's message) or None."""
    payload = resp.payload
    if payload is not None and not isinstance(payload, (bytes, bytearray)):
        raise TypeError(f"a protobuf response's payload must be bytes, not {type(payload).__name__}")
    status = int_field(1, int(resp.code)) + (field(2, resp.message.encode()) if resp.message else b"")
    return field(1, status) + (field(2, bytes(payload)) if payload else b"")


def decode_response(data: bytes) -> Response:
    """Parse a protobuf Response (its payload: bytes); InvalidArgument when it is malformed."""
    code, message, payload = 0, "", b""
    for number, kind, value in fields(data, "response"):
        if number == 1 and kind == LEN:
            for n, k, v in fields(value, "response status"):
                if n == 1 and k == VARINT:
                    code = _signed64(v)
                elif n == 2 and k == LEN:
                    message = text(v, "the status message")
        elif number == 2 and kind == LEN:
            payload = value
    return Response(code, message, [], payload)


def pack(payload: Any) -> bytes:
    """A data frame's bytes: a protobuf stream carries the message's own bytes."""
    if not isinstance(payload, (bytes, bytearray)):
        raise TypeError(f"a protobuf stream message must be bytes, not {type(payload).__name__}")
    return bytes(payload)


def unpack(data: bytes) -> bytes:
    return data
