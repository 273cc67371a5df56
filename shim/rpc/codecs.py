"""The two payload codecs one ttrpc framing carries (protocol.md, "Protobuf payloads"): msgpack,
podshim's own services, and protobuf, containerd's. A server connection takes the codec of its
first request (:func:`codec_of_request`) and keeps it; a client connection is given one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shim.rpc import messages, protowire
from shim.rpc.messages import Request, Response
from shim.rpc.records import Record
from shim.rpc.records import set_field as _set

__all__ = ["Codec", "MSGPACK", "PROTOBUF", "codec_of_request"]


class Codec(Record):
    """How a connection's Requests, Responses and stream messages become bytes and back."""

    __slots__ = ("name", "encode_request", "decode_request", "encode_response", "decode_response", "pack", "unpack")
    name: str
    encode_request: Callable[[Request], bytes]
    decode_request: Callable[[bytes], Request]
    encode_response: Callable[[Response], bytes]
    decode_response: Callable[[bytes], Response]
    pack: Callable[[Any], bytes]
    unpack: Callable[[bytes], Any]

    def __init__(self, name: str, encode_request: Callable[[Request], bytes], decode_request: Callable[[bytes], Request],
                 encode_response: Callable[[Response], bytes], decode_response: Callable[[bytes], Response],
                 pack: Callable[[Any], bytes], unpack: Callable[[bytes], Any]) -> None:
        _set(self, "name", name)
        _set(self, "encode_request", encode_request)
        _set(self, "decode_request", decode_request)
        _set(self, "encode_response", encode_response)
        _set(self, "decode_response", decode_response)
        _set(self, "pack", pack)
        _set(self, "unpack", unpack)

    def __repr__(self) -> str:
        return f"<codec {self.name}>"


MSGPACK = Codec("msgpack", messages.encode_request, messages.decode_request, messages.encode_response,
                messages.decode_response, messages.pack, messages.unpack)
PROTOBUF = Codec("protobuf", protowire.encode_request, protowire.decode_request, protowire.encode_response,
                 protowire.decode_response, protowire.pack, protowire.unpack)


def codec_of_request(data: bytes) -> Codec:
    """The codec a connection's first request is written in: protobuf when it starts as ttrpc's
    protobuf Request does (field 1, length-delimited), msgpack otherwise."""
    return PROTOBUF if data[:1] == b"\x0a" else MSGPACK
