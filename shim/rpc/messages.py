"""The messages frames carry: Request, Response and stream data, as msgpack maps.

Field names and msgpack types are those of protocol.md, "Messages". Decoding validates every
field's type and raises :class:`~shim.rpc.status.InvalidArgument` with a sentence naming the
field, so a malformed message fails its own stream and nothing else.
"""

from __future__ import annotations

from typing import Any

import msgpack

from shim.rpc.records import Record
from shim.rpc.records import set_field as _set
from shim.rpc.status import Code, InvalidArgument

__all__ = [
    "NAMESPACE_KEY",
    "MAX_METADATA_ENTRIES",
    "Request",
    "Response",
    "pack",
    "unpack",
    "encode_request",
    "decode_request",
    "encode_response",
    "decode_response",
    "require",
    "optional",
]

#: The metadata key that carries the namespace a call is for.
NAMESPACE_KEY = "podshim-namespace"
#: Bounds on metadata so a peer cannot make us hold much: keys, values per key.
MAX_METADATA_ENTRIES = 64
MAX_METADATA_VALUES = 16

_packer = msgpack.Packer(use_bin_type=True)


def pack(obj: Any) -> bytes:
    """Encode one msgpack document (str as str, bytes as bin)."""
    data: bytes = _packer.pack(obj)
    return data


def unpack(data: bytes) -> Any:
    """Decode one msgpack document; any decoding failure is :class:`InvalidArgument`."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types (ValueError, ExtraData, ...)
        raise InvalidArgument(f"data is not one valid msgpack document: {type(exc).__name__}: {exc}") from None


class Request(Record):
    """A call: which method, its payload, its relative deadline and its metadata."""

    __slots__ = ("service", "method", "payload", "timeout_nano", "metadata")
    service: str
    method: str
    payload: dict[str, Any]  # bytes, the message's own, on a protobuf connection (protocol.md 11)
    timeout_nano: int
    metadata: dict[str, list[str]]

    def __init__(self, service: str, method: str, payload: dict[str, Any] | bytes | None = None, timeout_nano: int = 0,
                 metadata: dict[str, list[str]] | None = None) -> None:
        _set(self, "service", service)
        _set(self, "method", method)
        _set(self, "payload", {} if payload is None else payload)
        _set(self, "timeout_nano", timeout_nano)
        _set(self, "metadata", {} if metadata is None else metadata)

    @property
    def full_method(self) -> str:
        return f"/{self.service}/{self.method}"

    @property
    def namespace(self) -> str | None:
        values = self.metadata.get(NAMESPACE_KEY)
        return values[0] if values else None


class Response(Record):
    """The answer to a call: a status and, when OK, a payload."""

    __slots__ = ("code", "message", "details", "payload")
    code: int
    message: str
    details: list[Any]
    payload: Any

    def __init__(self, code: int = Code.OK, message: str = "", details: list[Any] | None = None,
                 payload: Any = None) -> None:
        _set(self, "code", code)
        _set(self, "message", message)
        _set(self, "details", [] if details is None else details)
        _set(self, "payload", payload)


def encode_request(req: Request) -> bytes:
    return pack({
        "service": req.service,
        "method": req.method,
        "payload": req.payload,
        "timeout_nano": req.timeout_nano,
        "metadata": req.metadata,
    })


def decode_request(data: bytes) -> Request:
    """Parse a Request; raises InvalidArgument naming the first bad field."""
    doc = unpack(data)
    if not isinstance(doc, dict):
        raise InvalidArgument(f"request must be a map, got {_typename(doc)}")
    service = doc.get("service")
    method = doc.get("method")
    if not isinstance(service, str) or not service:
        raise InvalidArgument("request field 'service' must be a non-empty string")
    if not isinstance(method, str) or not method:
        raise InvalidArgument("request field 'method' must be a non-empty string")
    payload = doc.get("payload")
    if payload is None:
        payload = {}
    elif not isinstance(payload, dict):
        raise InvalidArgument(f"request field 'payload' must be a map, got {_typename(payload)}")
    timeout = doc.get("timeout_nano", 0)
    if timeout is None:
        timeout = 0
    if type(timeout) is not int or timeout < 0:
        raise InvalidArgument("request field 'timeout_nano' must be a non-negative integer")
    metadata = doc.get("metadata")
    if metadata is None:
        metadata = {}
    else:
        metadata = _check_metadata(metadata)
    return Request(service, method, payload, timeout, metadata)


def _check_metadata(md: Any) -> dict[str, list[str]]:
    if not isinstance(md, dict):
        raise InvalidArgument(f"request field 'metadata' must be a map, got {_typename(md)}")
    if len(md) > MAX_METADATA_ENTRIES:
        raise InvalidArgument(f"metadata has {len(md)} keys; at most {MAX_METADATA_ENTRIES} are allowed")
    out: dict[str, list[str]] = {}
    for key, values in md.items():
        if not isinstance(key, str):  # msgpack map keys may also be binary
            raise InvalidArgument(f"metadata key {key!r} must be a string")
        if isinstance(values, str):
            values = [values]
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise InvalidArgument(f"metadata {key!r} must be a list of strings")
        if len(values) > MAX_METADATA_VALUES:
            raise InvalidArgument(f"metadata {key!r} has {len(values)} values; at most {MAX_METADATA_VALUES}")
        out[key.lower()] = values
    return out


def encode_response(resp: Response) -> bytes:
    return pack({
        "status": {"code": int(resp.code), "message": resp.message, "details": resp.details},
        "payload": resp.payload,
    })


def decode_response(data: bytes) -> Response:
    """Parse a Response; raises InvalidArgument when it is malformed."""
    doc = unpack(data)
    if not isinstance(doc, dict):
        raise InvalidArgument(f"response must be a map, got {_typename(doc)}")
    status = doc.get("status") or {}
    if not isinstance(status, dict):
        raise InvalidArgument("response field 'status' must be a map")
    code = status.get("code", 0)
    message = status.get("message", "")
    details = status.get("details") or []
    if type(code) is not int or not isinstance(message, str) or not isinstance(details, list):
        raise InvalidArgument("response status must be {code: int, message: str, details: array}")
    return Response(code, message, details, doc.get("payload"))


_MISSING = object()


def require(payload: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    """Return ``payload[name]``, raising InvalidArgument if it is absent or of the wrong type."""
    value = payload.get(name, _MISSING)
    if value is _MISSING or value is None:
        raise InvalidArgument(f"field {name!r} is required")
    return _check_type(name, value, kind)


def optional(payload: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
    """Return ``payload[name]`` or ``default`` when absent/nil; InvalidArgument on a wrong type."""
    value = payload.get(name)
    if value is None:
        return default
    return _check_type(name, value, kind)


def _check_type(name: str, value: Any, kind: type | tuple[type, ...]) -> Any:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is an int subclass in Python but a distinct msgpack type: keep them apart.
    if isinstance(value, bool) and bool not in kinds:
        raise InvalidArgument(f"field {name!r} must be {_kindname(kinds)}, got bool")
    if not isinstance(value, kinds):
        raise InvalidArgument(f"field {name!r} must be {_kindname(kinds)}, got {_typename(value)}")
    return value


_NAMES = {str: "a string", int: "an integer", bool: "a boolean", dict: "a map", list: "an array",
          float: "a float", bytes: "binary"}


def _kindname(kinds: tuple[type, ...]) -> str:
    return " or ".join(_NAMES.get(k, k.__name__) for k in kinds)


def _typename(value: Any) -> str:
    if value is None:
        return "nil"
    for k, name in _NAMES.items():
        if type(value) is k:
            return name.split(" ", 1)[1]
    return type(value).__name__
