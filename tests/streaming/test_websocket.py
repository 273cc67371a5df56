"""The WebSocket side of the streaming server (client/streaming/websocket.py), sans-IO: the handshake
as RFC 6455 and Kubernetes' channel protocols want it, and the frames both ways (masked, lengths of
7, 16 and 64 bits, fragments, control frames). Exec over a WebSocket through podshimd is in
tests/cri/test_podshimd_exec.py."""

from __future__ import annotations

import pytest

from shim.rpc.frames import NEED_DATA

from client.streaming import websocket
from client.streaming.upgrade import HttpError, Request

KEY = "dGhlIHNhbXBsZSBub25jZQ=="  # RFC 6455's example key


def upgrade(*protocols: str, version: str = "13", key: str = KEY, method: str = "GET") -> Request:
    headers = [("connection", "Upgrade"), ("upgrade", "websocket"), ("sec-websocket-version", version),
               ("sec-websocket-key", key)]
    headers += [("sec-websocket-protocol", ", ".join(protocols))] if protocols else []
    return Request(method, "/exec/token", tuple(headers))


def test_the_accept_key_is_rfc_6455s() -> None:
    assert websocket.accept_key(KEY) == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


def test_the_clients_first_shared_protocol_wins_and_none_offered_is_the_binary_channel_protocol() -> None:
    assert websocket.negotiate(upgrade("v6.channel.k8s.io", "v4.channel.k8s.io", "channel.k8s.io")) == \
        "v4.channel.k8s.io"
    assert websocket.negotiate(upgrade("base64.channel.k8s.io")) == "base64.channel.k8s.io"
    assert websocket.negotiate(upgrade()) == ""
    answer = websocket.switching_protocols(upgrade("channel.k8s.io"), "channel.k8s.io").decode()
    assert answer.startswith("HTTP/1.1 101 Switching Protocols\r\n") and answer.endswith("\r\n\r\n")
    assert "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n" in answer
    assert "Sec-WebSocket-Protocol: channel.k8s.io\r\n" in answer


@pytest.mark.parametrize("request_, status, words", [
    (upgrade("x.k8s.io"), 403, "unable to negotiate protocol"),
    (upgrade(version="8"), 400, "Sec-WebSocket-Version must be 13"),
    (upgrade(key="short"), 400, "Sec-WebSocket-Key"),
    (upgrade(method="POST"), 400, "a WebSocket upgrade is a GET"),
])
def test_a_broken_or_unshared_handshake_is_an_http_error_with_a_sentence(request_, status, words) -> None:
    with pytest.raises(HttpError) as refused:
        websocket.negotiate(request_)
    assert refused.value.status == status and words in refused.value.message


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536, 200_000])
def test_a_masked_client_frame_of_any_length_reads_back(size) -> None:
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    reader = websocket.FrameReader()
    frame = websocket.encode_frame(0x2, payload, mask=b"\x01\x02\x03\x04")
    reader.feed(frame[:-1])
    assert reader.next_message() is NEED_DATA
    reader.feed(frame[-1:])
    assert reader.next_message() == (0x2, payload)
    assert reader.next_message() is NEED_DATA


def test_fragments_are_joined_and_a_control_frame_between_them_comes_alone() -> None:
    reader = websocket.FrameReader()
    mask = b"abcd"
    first = bytearray(websocket.encode_frame(0x2, b"\x01hel", mask=mask))
    first[0] &= 0x7F  # not final
    rest = bytearray(websocket.encode_frame(0x0, b"lo", mask=mask))
    reader.feed(bytes(first) + websocket.encode_frame(0x9, b"ping?", mask=mask) + bytes(rest))
    assert reader.next_message() == (0x9, b"ping?")
    assert reader.next_message() == (0x2, b"\x01hello")


def test_an_unmasked_client_frame_and_reserved_bits_break_the_protocol() -> None:
    reader = websocket.FrameReader()
    reader.feed(websocket.encode_frame(0x2, b"\x00x"))
    with pytest.raises(websocket.WebSocketError, match="must be masked"):
        reader.next_message()
    reader = websocket.FrameReader()
    frame = bytearray(websocket.encode_frame(0x2, b"\x00x", mask=b"abcd"))
    frame[0] |= 0x40
    reader.feed(bytes(frame))
    with pytest.raises(websocket.WebSocketError, match="reserved bits"):
        reader.next_message()


def test_a_message_over_the_limit_is_refused_with_status_1009() -> None:
    reader = websocket.FrameReader(max_bytes=10)
    reader.feed(websocket.encode_frame(0x2, bytes(11), mask=b"abcd"))
    with pytest.raises(websocket.WebSocketError) as refused:
        reader.next_message()
    assert refused.value.code == 1009


def test_the_error_channel_speaks_as_the_spdy_protocol_of_the_same_version() -> None:
    assert websocket.spdy_protocol("v5.channel.k8s.io") == "v4.channel.k8s.io"
    assert websocket.spdy_protocol("v4.base64.channel.k8s.io") == "v4.channel.k8s.io"
    assert websocket.spdy_protocol("") == websocket.spdy_protocol("base64.channel.k8s.io") == "channel.k8s.io"
