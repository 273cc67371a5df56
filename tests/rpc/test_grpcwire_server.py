"""shim.grpcwire's server: gRPC calls over HTTP/2 without grpcio. The sans-IO connection is driven
in memory by the sans-IO client (and, for what a gRPC client never sends, by a raw h2 client);
the asyncio server on a unix socket by grpcio's own client, as kubelet's would call it."""

from __future__ import annotations

import asyncio
import socket
import struct

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import pytest

from shim.grpcwire.aio import Method, Server
from shim.grpcwire.client import NEED_DATA, Connection, Outcome
from shim.grpcwire.server import Call, Cancelled, ServerConnection
from shim.grpcwire.wire import decode_details, decode_timeout, encode_details, encode_timeout
from shim.rpc.status import Code, NotFound

PATH = "/test.v1.Echo/Say"


def exchange(client: Connection, server: ServerConnection) -> list[Call | Cancelled]:
    """Carry bytes both ways until neither side has any to send; the server's events meanwhile."""
    events: list[Call | Cancelled] = []
    while True:
        to_server, to_client = client.data_to_send(), server.data_to_send()
        if not to_server and not to_client:
            return events
        if to_server:
            events += server.receive_data(to_server)
        if to_client:
            client.receive_data(to_client)


def called(request: bytes = b"hello", timeout: float | None = 5.0) -> tuple[Connection, ServerConnection, Call]:
    client, server = Connection(), ServerConnection()
    client.start_call(PATH, request, timeout)
    (call,) = exchange(client, server)
    assert isinstance(call, Call)
    return client, server, call


def outcome(client: Connection, server: ServerConnection) -> Outcome:
    exchange(client, server)
    result = client.next_outcome()
    assert isinstance(result, Outcome)
    return result


# -- the wire's encodings ----------------------------------------------------------------------------

@pytest.mark.parametrize("value, seconds", [(b"5S", 5.0), (b"250m", 0.25), (b"3M", 180.0), (b"1H", 3600.0),
                                            (b"100u", 1e-4), (b"7n", 7e-9)])
def test_a_grpc_timeout_is_digits_and_a_unit(value: bytes, seconds: float) -> None:
    assert decode_timeout(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [b"", b"5", b"S", b"5s", b"-5S", b"123456789S", b"5 S"])
def test_anything_else_is_no_grpc_timeout(value: bytes) -> None:
    assert decode_timeout(value) is None


def test_a_timeout_encoded_is_decoded_to_the_same_seconds_at_its_units_precision() -> None:
    for seconds in (0.001, 1.5, 120.0, 86400.0):
        decoded = decode_timeout(encode_timeout(seconds))
        assert decoded is not None and decoded == pytest.approx(seconds, rel=1e-6)


def test_a_status_sentence_is_percent_encoded_where_it_is_not_printable_ascii() -> None:
    assert encode_details("plain words: fine") == b"plain words: fine"
    assert encode_details("100% sure\n") == b"100%25 sure%0A"
    assert encode_details("pod ‘a’") == b"pod %E2%80%98a%E2%80%99"
    for sentence in ("100% sure\n", "pod ‘a’", "tab\there"):
        assert decode_details(encode_details(sentence)) == sentence


# -- a call ------------------------------------------------------------------------------------------

def test_a_unary_call_arrives_whole_with_its_path_timeout_and_metadata_and_its_reply_goes_back() -> None:
    client, server, call = called(b"hello", timeout=2.5)
    assert (call.path, call.message) == (PATH, b"hello")
    assert call.timeout == pytest.approx(2.5)
    server.send_message(call.stream_id, b"world")
    server.send_status(call.stream_id, Code.OK)
    assert outcome(client, server) == Outcome(Code.OK, message=b"world")
    assert server.open_calls == 0


def test_a_call_without_a_timeout_has_none() -> None:
    assert called(timeout=None)[2].timeout is None


def test_a_failure_is_a_status_with_its_sentence_in_trailers_only() -> None:
    client, server, call = called()
    server.send_status(call.stream_id, Code.NOT_FOUND, "pod ‘a’ not found: 100% gone")
    assert outcome(client, server) == Outcome(Code.NOT_FOUND, "pod ‘a’ not found: 100% gone", from_server=True)


def test_a_reply_larger_than_the_clients_window_waits_for_it_and_arrives_whole() -> None:
    client, server, call = called()
    big = bytes(range(256)) * (24 * 1024)  # 6 MiB: past the client's 4 MiB window
    server.send_message(call.stream_id, big)
    server.send_status(call.stream_id, Code.OK)
    assert server.backlog(call.stream_id) > 0  # held until the client reads
    assert outcome(client, server) == Outcome(Code.OK, message=big)


def test_calls_on_one_connection_are_independent() -> None:
    client, server = Connection(), ServerConnection()
    client.start_call(PATH, b"one", None)
    (first,) = exchange(client, server)
    assert isinstance(first, Call)
    server.send_message(first.stream_id, b"1")
    server.send_status(first.stream_id, Code.OK)
    assert outcome(client, server).message == b"1"
    client.start_call(PATH, b"two", None)
    (second,) = exchange(client, server)
    assert isinstance(second, Call) and second.stream_id > first.stream_id and second.message == b"two"


def test_a_reply_to_a_call_its_client_reset_is_dropped_and_the_call_cancelled() -> None:
    server = ServerConnection()
    raw = RawClient(server)
    stream_id = raw.send(GRPC_REQUEST, framed(b"m"))
    (call,) = raw.events
    assert isinstance(call, Call) and call.stream_id == stream_id
    raw.h2.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
    events = server.receive_data(raw.h2.data_to_send())
    assert events == [Cancelled(call.stream_id, "the client cancelled the call (HTTP/2 CANCEL)")]
    server.send_message(call.stream_id, b"too late")  # ignored, not an error
    server.send_status(call.stream_id, Code.OK)
    assert server.open_calls == 0


def test_a_connection_that_closes_cancels_its_open_calls() -> None:
    _, server, call = called()
    assert server.receive_data(b"") == [Cancelled(call.stream_id, "the client closed the connection")]
    assert server.closed == "the client closed the connection" and server.peer_done


def test_after_goaway_the_open_call_is_answered_and_a_new_one_refused() -> None:
    client, server, call = called()
    server.goaway()
    server.send_message(call.stream_id, b"still answered")
    server.send_status(call.stream_id, Code.OK)
    assert outcome(client, server) == Outcome(Code.OK, message=b"still answered")
    client.start_call(PATH, b"new", None)
    assert exchange(client, server) == []
    result = client.next_outcome()
    assert isinstance(result, Outcome) and result.code == Code.UNAVAILABLE
    assert server.closed == "the server is stopping"


# -- requests the server refuses on its own ------------------------------------------------------------

class RawClient:
    """An h2 client that sends whatever a test wants, and reads the reply's headers."""

    def __init__(self, server: ServerConnection):
        self.server = server
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.h2.initiate_connection()
        self.headers: dict[bytes, bytes] = {}
        self.ended = False
        self.events: list[Call | Cancelled] = []

    def send(self, headers: list[tuple[bytes, bytes]], body: bytes = b"", end: bool = True) -> int:
        stream_id = self.h2.get_next_available_stream_id()
        self.h2.send_headers(stream_id, headers, end_stream=end and not body)
        if body:
            self.h2.send_data(stream_id, body, end_stream=end)
        self.pump()
        return stream_id

    def pump(self) -> None:
        while True:
            to_server, to_client = self.h2.data_to_send(), self.server.data_to_send()
            if not to_server and not to_client:
                return
            if to_server:
                self.events += self.server.receive_data(to_server)
            for event in self.h2.receive_data(to_client) if to_client else []:
                if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                    self.headers.update(dict(event.headers))
                if isinstance(event, h2.events.StreamEnded):
                    self.ended = True


GRPC_REQUEST = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", PATH.encode()), (b":authority", b"x"),
                (b"content-type", b"application/grpc"), (b"te", b"trailers")]


def framed(message: bytes, compressed: int = 0) -> bytes:
    return struct.pack(">BI", compressed, len(message)) + message


def refused(headers: list[tuple[bytes, bytes]], body: bytes, max_request_bytes: int = 1024) -> RawClient:
    raw = RawClient(ServerConnection(max_request_bytes=max_request_bytes))
    raw.send(headers, body)
    assert raw.ended and raw.events == []  # answered without reaching the application
    return raw


def status(raw: RawClient) -> tuple[bytes, int, str]:
    return (raw.headers[b":status"], int(raw.headers[b"grpc-status"]), decode_details(raw.headers[b"grpc-message"]))


def test_a_request_that_is_not_a_post_is_refused_405() -> None:
    headers = [(k, b"GET" if k == b":method" else v) for k, v in GRPC_REQUEST]
    assert status(refused(headers, b"")) == (b"405", Code.INTERNAL, "gRPC calls are POST requests, not 'GET'")


def test_a_request_that_is_not_grpc_is_refused_415() -> None:
    headers = [(k, b"application/json" if k == b"content-type" else v) for k, v in GRPC_REQUEST]
    assert status(refused(headers, b"{}"))[:2] == (b"415", Code.INTERNAL)


def test_a_compressed_request_is_refused_unimplemented_with_a_sentence() -> None:
    raw = refused(GRPC_REQUEST + [(b"grpc-encoding", b"gzip")], framed(b"x"))
    assert status(raw)[1] == Code.UNIMPLEMENTED and "compressed ('gzip')" in status(raw)[2]
    raw = refused(GRPC_REQUEST, framed(b"x", compressed=1))
    assert status(raw) == (b"200", Code.UNIMPLEMENTED,
                           "the request's message is compressed, though grpc-encoding is identity")


def test_a_request_larger_than_the_limit_is_refused_on_its_declared_length() -> None:
    raw = refused(GRPC_REQUEST, framed(b"x" * 2000))
    assert status(raw) == (b"200", Code.RESOURCE_EXHAUSTED,
                           "the request's message of 2000 bytes is larger than the limit of 1024")


@pytest.mark.parametrize("body, sentence", [
    (b"", "the request has no message"),
    (b"\x00\x00", "the request's message prefix is truncated (2 of 5 bytes)"),
    (framed(b"abc")[:-1], "the request's message is truncated (2 of 3 bytes)"),
    (framed(b"a") + framed(b"b"), "the request carries more than one message; every method here takes one")])
def test_a_malformed_message_is_refused_internal(body: bytes, sentence: str) -> None:
    assert status(refused(GRPC_REQUEST, body)) == (b"200", Code.INTERNAL, sentence)


def test_a_malformed_timeout_is_refused() -> None:
    raw = refused(GRPC_REQUEST + [(b"grpc-timeout", b"soon")], framed(b""))
    assert status(raw) == (b"200", Code.INTERNAL, "the request's grpc-timeout 'soon' is not a number and a unit")


def test_metadata_is_the_calls_own_headers_binary_ones_decoded() -> None:
    raw = RawClient(ServerConnection())
    raw.send(GRPC_REQUEST + [(b"containerd-namespace", b"k8s.io"), (b"trace-bin", b"AAEC"),
                             (b"user-agent", b"grpc-go/1.70")], framed(b"m"))
    (call,) = raw.events
    assert isinstance(call, Call)
    assert call.metadata == (("containerd-namespace", "k8s.io"), ("trace-bin", b"\x00\x01\x02"))


def test_a_clients_goaway_lets_its_open_calls_finish() -> None:
    client, server, call = called()
    goaway = struct.pack(">HBBBI", 0, 8, 7, 0, 0) + struct.pack(">II", call.stream_id, 0)
    assert server.receive_data(goaway) == []
    assert server.peer_done and server.closed is not None
    server.send_message(call.stream_id, b"done")
    server.send_status(call.stream_id, Code.OK)
    assert outcome(client, server) == Outcome(Code.OK, message=b"done")


def test_an_http2_protocol_error_ends_the_connection_and_cancels_its_calls() -> None:
    _, server, call = called()
    bad = struct.pack(">HBBBI", 0, 4, 0x4, 0, 1) + b"\x00\x00\x00\x00"  # SETTINGS on a stream: not allowed
    events = server.receive_data(bad)
    assert len(events) == 1 and isinstance(events[0], Cancelled) and events[0].stream_id == call.stream_id
    assert server.closed is not None and server.closed.startswith("HTTP/2 protocol error from the client")
    assert server.data_to_send()  # its GOAWAY


# -- the asyncio server, called by grpcio's client ---------------------------------------------------

class Echo:
    def __init__(self) -> None:
        self.cancelled: list[str] = []
        self.release = asyncio.Event()

    async def Say(self, request: bytes, context: object) -> bytes:
        if request == b"missing":
            raise NotFound("no such thing: missing")
        if request == b"broken":
            raise ValueError("a bug")
        if request.startswith(b"wait"):
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.append(request.decode())
                raise
        return b"said " + request

    async def Count(self, request: bytes, context: object):  # a server stream
        for i in range(int(request)):
            yield str(i).encode()


def same(data: bytes) -> bytes:
    return data


@pytest.fixture
async def echo(tmp_path):
    service = Echo()
    finished: list[tuple[str, Code]] = []
    server = Server({PATH: Method(service.Say, same, same, where="Echo.Say"),
                     "/test.v1.Echo/Count": Method(service.Count, same, same, where="Echo.Count")},
                    on_finished=lambda path, seconds, code: finished.append((path, code)))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "s.sock"))
    listener.listen()
    await server.start(listener)
    channel = grpc.aio.insecure_channel(f"unix://{tmp_path}/s.sock")
    try:
        yield service, server, channel, finished
    finally:
        await channel.close()
        await server.stop(0)


def say(channel: grpc.aio.Channel):
    return channel.unary_unary(PATH, request_serializer=same, response_deserializer=same)


async def test_grpcs_client_gets_a_reply_and_a_status_with_its_sentence(echo) -> None:
    service, _, channel, finished = echo
    assert await say(channel)(b"hi", timeout=10) == b"said hi"
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await say(channel)(b"missing", timeout=10)
    assert (failed.value.code(), failed.value.details()) == (grpc.StatusCode.NOT_FOUND, "no such thing: missing")
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await say(channel)(b"broken", timeout=10)
    assert (failed.value.code(), failed.value.details()) == (grpc.StatusCode.UNKNOWN,
                                                             "Echo.Say: unexpected ValueError: a bug")
    assert finished == [(PATH, Code.OK), (PATH, Code.NOT_FOUND), (PATH, Code.UNKNOWN)]


async def test_an_unknown_method_is_unimplemented(echo) -> None:
    _, _, channel, _ = echo
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await channel.unary_unary("/test.v1.Echo/Shout", request_serializer=same, response_deserializer=same)(
            b"x", timeout=10)
    assert (failed.value.code(), failed.value.details()) == (grpc.StatusCode.UNIMPLEMENTED,
                                                             "unknown method /test.v1.Echo/Shout")


async def test_a_server_stream_sends_every_item_then_its_status(echo) -> None:
    _, _, channel, finished = echo
    count = channel.unary_stream("/test.v1.Echo/Count", request_serializer=same, response_deserializer=same)
    assert [item async for item in count(b"5", timeout=10)] == [b"0", b"1", b"2", b"3", b"4"]
    assert finished == [("/test.v1.Echo/Count", Code.OK)]


def call_without_a_clock_of_its_own(socket_path: str, request: bytes, timeout: float) -> Outcome:
    """A call that sends its deadline and then only waits for the server's answer: no client-side
    timer resets the stream first, so what comes back is what the server did at the deadline."""
    conn = Connection()
    conn.start_call(PATH, request, timeout)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(socket_path)
        sock.sendall(conn.data_to_send())
        while (result := conn.next_outcome()) is NEED_DATA:
            conn.receive_data(sock.recv(65536))
            sock.sendall(conn.data_to_send())
    assert isinstance(result, Outcome)
    return result


async def test_a_call_past_its_deadline_is_cancelled_and_answered_deadline_exceeded(echo, tmp_path) -> None:
    service, _, _, finished = echo
    result = await asyncio.to_thread(call_without_a_clock_of_its_own, str(tmp_path / "s.sock"),
                                     b"wait-deadline", 0.3)
    assert (result.code, result.details, result.from_server) == (Code.DEADLINE_EXCEEDED, "deadline exceeded", True)
    assert service.cancelled == ["wait-deadline"] and finished == [(PATH, Code.DEADLINE_EXCEEDED)]


async def test_grpcs_client_past_its_deadline_gets_deadline_exceeded_and_the_call_is_cancelled(echo) -> None:
    service, _, channel, finished = echo
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await say(channel)(b"wait-deadline", timeout=0.3)
    assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    for _ in range(100):
        if finished:
            break
        await asyncio.sleep(0.05)
    # grpc's client resets the stream at its own deadline, which may reach the server before the
    # server's timer (started when the headers arrived) fires: either way the handler is cancelled.
    assert service.cancelled == ["wait-deadline"]
    assert finished in ([(PATH, Code.DEADLINE_EXCEEDED)], [(PATH, Code.CANCELLED)])


async def test_a_call_its_client_cancels_is_cancelled_on_the_server(echo) -> None:
    service, _, channel, finished = echo
    call = say(channel)(b"wait-cancel", timeout=30)
    await asyncio.sleep(0.2)
    call.cancel()
    for _ in range(100):
        if finished:
            break
        await asyncio.sleep(0.05)
    assert service.cancelled == ["wait-cancel"] and finished == [(PATH, Code.CANCELLED)]


async def test_stop_lets_calls_in_flight_finish_within_the_grace_and_takes_no_new_ones(echo, tmp_path) -> None:
    service, server, channel, _ = echo
    in_flight = asyncio.ensure_future(say(channel)(b"wait-stop", timeout=30))
    await asyncio.sleep(0.2)
    stopping = asyncio.ensure_future(server.stop(30))
    await asyncio.sleep(0.2)
    assert not stopping.done()  # the call in flight holds it
    service.release.set()
    assert await in_flight == b"said wait-stop"
    await stopping
    assert service.cancelled == []
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await say(channel)(b"after", timeout=2)
    assert failed.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


async def test_stop_cancels_what_is_still_running_after_the_grace(echo) -> None:
    service, server, channel, _ = echo
    in_flight = asyncio.ensure_future(say(channel)(b"wait-forever", timeout=30))
    await asyncio.sleep(0.2)
    await server.stop(0.2)
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await in_flight
    assert failed.value.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
    assert service.cancelled == ["wait-forever"]

