"""One-time tokens (client/streaming/tokens.py) and the HTTP upgrade request and answers (upgrade.py)."""

from __future__ import annotations

import pytest

from shim.rpc.frames import NEED_DATA
from shim.rpc.status import ResourceExhausted

from client.streaming.tokens import TokenError, Tokens
from client.streaming.upgrade import HttpError, RequestReader, error_response, negotiate, switching_protocols


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_token_is_consumed_by_its_first_use() -> None:
    tokens = Tokens()
    token = tokens.insert("request")
    assert tokens.consume(token) == "request"
    with pytest.raises(TokenError, match="already used"):
        tokens.consume(token)


def test_a_token_expires_after_its_ttl() -> None:
    clock = Clock()
    tokens = Tokens(ttl=60, clock=clock)
    token = tokens.insert("request")
    clock.now += 59.9
    assert len(tokens) == 1
    clock.now += 0.2
    with pytest.raises(TokenError, match="expired"):
        tokens.consume(token)


def test_tokens_are_random_and_long() -> None:
    tokens = Tokens()
    found = {tokens.insert(i) for i in range(100)}
    assert len(found) == 100 and all(len(t) == 24 for t in found)


def test_too_many_waiting_tokens_are_refused_until_some_expire() -> None:
    clock = Clock()
    tokens = Tokens(max_tokens=2, clock=clock)
    tokens.insert(1)
    tokens.insert(2)
    with pytest.raises(ResourceExhausted):
        tokens.insert(3)
    clock.now += 61
    tokens.insert(3)


GO_REQUEST = (b"POST /portforward/abc HTTP/1.1\r\nHost: 127.0.0.1:1\r\nUser-Agent: crictl\r\nContent-Length: 0\r\n"
              b"Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n"
              b"X-Stream-Protocol-Version: v3.channel.k8s.io\r\n\r\n")


def read(data: bytes):
    reader = RequestReader()
    reader.feed(data)
    return reader.next_event(), reader


def test_a_request_head_is_parsed_when_complete_and_what_follows_kept():
    reader = RequestReader()
    reader.feed(GO_REQUEST[:20])
    assert reader.next_event() is NEED_DATA
    reader.feed(GO_REQUEST[20:] + b"\x80\x03")
    request = reader.next_event()
    assert (request.method, request.target) == ("POST", "/portforward/abc")
    assert request.values("x-stream-protocol-version") == ["v4.channel.k8s.io", "v3.channel.k8s.io"]
    assert reader.trailing == b"\x80\x03"


def test_negotiation_takes_the_clients_first_protocol_the_server_supports() -> None:
    request, _ = read(GO_REQUEST)
    assert negotiate(request, ("v3.channel.k8s.io", "v4.channel.k8s.io")) == "v4.channel.k8s.io"
    assert negotiate(request, ("v3.channel.k8s.io",)) == "v3.channel.k8s.io"


def test_no_common_protocol_is_403_listing_the_accepted_ones() -> None:
    request, _ = read(GO_REQUEST)
    with pytest.raises(HttpError) as refused:
        negotiate(request, ("portforward.k8s.io",))
    assert refused.value.status == 403
    answer = error_response(refused.value)
    assert answer.startswith(b"HTTP/1.1 403 Forbidden\r\n")
    assert b"X-Accepted-Stream-Protocol-Versions: portforward.k8s.io\r\n" in answer
    assert answer.endswith(b"unable to upgrade: unable to negotiate protocol: client supports "
                           b"['v4.channel.k8s.io', 'v3.channel.k8s.io'], server accepts ['portforward.k8s.io']\n")


def test_a_request_that_is_not_an_upgrade_is_400() -> None:
    request, _ = read(b"GET /portforward/abc HTTP/1.1\r\nHost: x\r\n\r\n")
    with pytest.raises(HttpError, match="must upgrade the connection") as refused:
        negotiate(request, ("portforward.k8s.io",))
    assert refused.value.status == 400


@pytest.mark.parametrize("head", [b"garbage\r\n\r\n", b"GET / HTTP/1.1\r\nno colon\r\n\r\n", b"x" * 20000])
def test_a_malformed_or_huge_head_is_400(head) -> None:
    with pytest.raises(HttpError) as refused:
        read(head)
    assert refused.value.status == 400


def test_the_101_answer_names_spdy_and_the_protocol() -> None:
    assert switching_protocols("portforward.k8s.io") == (
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
        b"X-Stream-Protocol-Version: portforward.k8s.io\r\n\r\n")
