"""shim.rpc.connection: the stream rules, with a client and a server joined in memory."""

from __future__ import annotations

import pytest

from shim.rpc.connection import (
    CallRejected,
    CallStarted,
    ClientConnection,
    DataReceived,
    PeerClosed,
    ResponseReceived,
    ServerConnection,
    StreamInput,
)
from shim.rpc.frames import HEADER, MAX_DATA_BYTES, Flags, MessageType, encode_frame
from shim.rpc.messages import MAX_METADATA_ENTRIES, MAX_METADATA_VALUES, Request, Response, pack
from shim.rpc.status import Code

PING = Request("test.v1.Echo", "Ping", {"n": 1})


class Pair:
    """A ClientConnection and a ServerConnection with the bytes between them carried by hand."""

    def __init__(self, **server_options):
        self.client = ClientConnection()
        self.server = ServerConnection(**server_options)

    def call(self, request: Request = PING, *, streaming: bool = False) -> list:
        """Send ``request`` from the client; return the server's events."""
        _, frame = self.client.request(request, streaming=streaming)
        return self.server.receive_data(frame)

    def answer(self, data: bytes) -> list:
        """Deliver bytes the server produced; return the client's events."""
        return self.client.receive_data(data)

    def reject(self, raw: bytes) -> CallRejected:
        """Send raw client bytes; return the one rejection they cause, checked as the client sees it."""
        [rejected] = self.server.receive_data(raw)
        assert type(rejected) is CallRejected
        [received] = self.answer(self.server.reject(rejected.stream_id, rejected.code, rejected.message))
        assert received == ResponseReceived(rejected.stream_id, Response(rejected.code, rejected.message))
        return rejected


def request_frame(doc, stream_id: int = 1, flags: int = 0) -> bytes:
    return encode_frame(stream_id, MessageType.REQUEST, flags, pack(doc))


def request_doc(**fields) -> dict:
    """A valid request map with ``fields`` replaced (a value of ... removes the field)."""
    doc = {"service": "test.v1.Echo", "method": "Ping", "payload": {}, "timeout_nano": 0, "metadata": {}}
    doc.update(fields)
    return {k: v for k, v in doc.items() if v is not ...}


def test_request_starts_a_call() -> None:
    pair = Pair()
    request = Request("test.v1.Echo", "Ping", {"n": 1}, 5_000_000, {"podshim-namespace": ["k8s.io"]})
    assert pair.call(request) == [CallStarted(1, request, False)]


def test_request_flagged_remote_open_starts_a_client_stream() -> None:
    [started] = Pair().server.receive_data(request_frame(request_doc(), flags=Flags.REMOTE_OPEN))
    assert (type(started), started.client_streaming) == (CallStarted, True)


def test_client_stream_ids_are_odd_and_increasing() -> None:
    pair = Pair()
    assert [ev.stream_id for _ in range(3) for ev in pair.call()] == [1, 3, 5]


def test_response_reaches_the_client() -> None:
    pair = Pair()
    pair.call()
    response = Response(Code.OK, "", [], {"pong": True})
    assert pair.answer(pair.server.response(1, response)) == [ResponseReceived(1, response)]


def test_response_ends_the_stream() -> None:
    pair = Pair()
    pair.call()
    pair.server.response(1, Response())
    assert 1 not in pair.server.active


def test_ending_a_stream_twice_sends_nothing() -> None:
    pair = Pair()
    pair.call()
    pair.server.response(1, Response())
    assert pair.server.response(1, Response()) == b""


def test_server_stream_data_reaches_the_client() -> None:
    pair = Pair()
    pair.call(streaming=True)
    assert pair.answer(pair.server.data(1, {"i": 0})) == [DataReceived(1, {"i": 0}, False)]


def test_eof_on_a_frame_boundary_is_peer_closed() -> None:
    assert ServerConnection().receive_data(b"") == [PeerClosed()]


def test_metadata_keys_are_lowercased_and_a_single_string_is_a_list() -> None:
    [started] = Pair().server.receive_data(request_frame(request_doc(metadata={"Podshim-Namespace": "k8s.io"})))
    assert started.request.metadata == {"podshim-namespace": ["k8s.io"]}


def test_absent_optional_fields_take_their_defaults() -> None:
    doc = request_doc(payload=..., timeout_nano=..., metadata=...)
    [started] = Pair().server.receive_data(request_frame(doc))
    assert started.request == Request("test.v1.Echo", "Ping", {}, 0, {})


MALFORMED_REQUESTS = {
    "bad-msgpack": (b"\xc1", "not one valid msgpack document"),
    "trailing-bytes": (pack(request_doc()) + b"\x00", "not one valid msgpack document"),
    "not-a-map": (pack(["test.v1.Echo", "Ping"]), "must be a map"),
    "service-missing": (pack(request_doc(service=...)), "'service'"),
    "service-empty": (pack(request_doc(service="")), "'service'"),
    "service-not-string": (pack(request_doc(service=7)), "'service'"),
    "method-missing": (pack(request_doc(method=...)), "'method'"),
    "method-binary": (pack(request_doc(method=b"Ping")), "'method'"),
    "payload-not-map": (pack(request_doc(payload=[1, 2])), "'payload'"),
    "payload-int-key": (pack(request_doc(payload={1: "x"})), "not one valid msgpack document"),
    "timeout-string": (pack(request_doc(timeout_nano="5s")), "'timeout_nano'"),
    "timeout-negative": (pack(request_doc(timeout_nano=-1)), "'timeout_nano'"),
    "timeout-bool": (pack(request_doc(timeout_nano=True)), "'timeout_nano'"),
    "timeout-float": (pack(request_doc(timeout_nano=1.5)), "'timeout_nano'"),
    "metadata-not-map": (pack(request_doc(metadata=["a"])), "'metadata'"),
    "metadata-value-not-strings": (pack(request_doc(metadata={"a": [1]})), "metadata 'a'"),
    "metadata-binary-key": (pack(request_doc(metadata={b"a": ["x"]})), "metadata"),
    "metadata-too-many-keys": (
        pack(request_doc(metadata={f"k{i}": ["v"] for i in range(MAX_METADATA_ENTRIES + 1)})),
        f"at most {MAX_METADATA_ENTRIES}",
    ),
    "metadata-too-many-values": (
        pack(request_doc(metadata={"k": ["v"] * (MAX_METADATA_VALUES + 1)})),
        f"at most {MAX_METADATA_VALUES}",
    ),
}


@pytest.mark.parametrize("data, fragment", MALFORMED_REQUESTS.values(), ids=MALFORMED_REQUESTS.keys())
def test_malformed_request_fails_its_stream_with_invalid_argument(data, fragment) -> None:
    rejected = Pair().reject(encode_frame(1, MessageType.REQUEST, 0, data))
    assert (rejected.stream_id, rejected.code) == (1, Code.INVALID_ARGUMENT)
    assert fragment in rejected.message


def test_malformed_request_leaves_the_connection_usable() -> None:
    pair = Pair()
    pair.reject(encode_frame(1, MessageType.REQUEST, 0, b"\xc1"))
    assert [type(ev) for ev in pair.server.receive_data(request_frame(request_doc(), stream_id=3))] == [CallStarted]


def test_even_stream_id_is_invalid() -> None:
    rejected = Pair().reject(request_frame(request_doc(), stream_id=2))
    assert (rejected.stream_id, rejected.code) == (2, Code.INVALID_ARGUMENT)
    assert "must be odd" in rejected.message


def test_reused_stream_id_is_invalid() -> None:
    pair = Pair()
    pair.call()
    rejected = pair.reject(request_frame(request_doc(), stream_id=1))
    assert (rejected.stream_id, rejected.code) == (1, Code.INVALID_ARGUMENT)
    assert "re-used" in rejected.message


def test_decreasing_stream_id_is_invalid() -> None:
    pair = Pair()
    pair.server.receive_data(request_frame(request_doc(), stream_id=5))
    rejected = pair.reject(request_frame(request_doc(), stream_id=3))
    assert (rejected.stream_id, rejected.code) == (3, Code.INVALID_ARGUMENT)


def test_stream_id_of_a_rejected_request_cannot_be_reused() -> None:
    pair = Pair()
    pair.reject(encode_frame(1, MessageType.REQUEST, 0, b"\xc1"))
    assert pair.reject(request_frame(request_doc(), stream_id=1)).code == Code.INVALID_ARGUMENT


def test_data_frame_on_an_unknown_stream_is_invalid() -> None:
    rejected = Pair().reject(encode_frame(9, MessageType.DATA, 0, pack({})))
    assert (rejected.stream_id, rejected.code) == (9, Code.INVALID_ARGUMENT)
    assert "not active" in rejected.message


def test_data_frame_on_an_answered_stream_is_dropped() -> None:
    pair = Pair()
    pair.call()
    pair.server.response(1, Response())
    assert pair.server.receive_data(encode_frame(1, MessageType.DATA, 0, pack({}))) == []


def test_data_frame_on_an_open_stream_is_stream_input() -> None:
    pair = Pair()
    pair.call()
    frame = encode_frame(1, MessageType.DATA, Flags.REMOTE_CLOSED, pack({"more": 1}))
    assert pair.server.receive_data(frame) == [StreamInput(1, pack({"more": 1}), True)]


@pytest.mark.parametrize("msg_type", [0, 4, 255])
def test_unknown_message_type_is_ignored(msg_type) -> None:
    pair = Pair()
    assert pair.server.receive_data(encode_frame(1, msg_type, 0, b"whatever")) == []
    assert [type(ev) for ev in pair.call()] == [CallStarted]


def test_response_frame_from_a_client_is_ignored() -> None:
    assert Pair().server.receive_data(encode_frame(1, MessageType.RESPONSE, 0, pack({}))) == []


def test_oversized_request_fails_only_its_stream() -> None:
    pair = Pair()
    oversized = HEADER.pack(MAX_DATA_BYTES + 1, 1, MessageType.REQUEST, 0) + bytes(MAX_DATA_BYTES + 1)
    [rejected] = pair.server.receive_data(oversized)
    assert (rejected.stream_id, rejected.code) == (1, Code.RESOURCE_EXHAUSTED)
    assert [type(ev) for ev in pair.server.receive_data(request_frame(request_doc(), stream_id=3))] == [CallStarted]


def test_too_many_concurrent_streams_is_resource_exhausted() -> None:
    pair = Pair(max_active_streams=2)
    pair.call()
    pair.call()
    [rejected] = pair.call()
    assert (rejected.stream_id, rejected.code) == (5, Code.RESOURCE_EXHAUSTED)


def test_response_payload_too_large_is_resource_exhausted() -> None:
    pair = Pair()
    pair.call()
    big = Response(Code.OK, "", [], {"blob": bytes(MAX_DATA_BYTES)})
    [received] = pair.answer(pair.server.response(1, big))
    assert (received.stream_id, received.response.code) == (1, Code.RESOURCE_EXHAUSTED)


def test_oversized_response_is_resource_exhausted_on_the_client() -> None:
    oversized = HEADER.pack(MAX_DATA_BYTES + 1, 1, MessageType.RESPONSE, 0) + bytes(MAX_DATA_BYTES + 1)
    [received] = ClientConnection().receive_data(oversized)
    assert (received.stream_id, received.response.code) == (1, Code.RESOURCE_EXHAUSTED)


def test_malformed_response_is_internal_on_the_client() -> None:
    [received] = ClientConnection().receive_data(encode_frame(1, MessageType.RESPONSE, 0, b"\xc1"))
    assert received.response.code == Code.INTERNAL
