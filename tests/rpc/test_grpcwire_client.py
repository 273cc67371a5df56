"""shim.grpcwire: podshimctl's unary gRPC calls over HTTP/2 without grpcio. The sans-IO core is
driven byte for byte by an h2 server-side connection in memory; the blocking channel by a unix
socket that accepts and never answers."""

from __future__ import annotations

import os
import socket
import struct
from urllib.parse import quote

import h2.config
import h2.connection
import h2.errors
import h2.events
import pytest

from shim.grpcwire.channel import Channel
from shim.grpcwire.client import NEED_DATA, Connection, Outcome, encode_timeout
from shim.rpc.status import Code

PATH = "/runtime.v1.RuntimeService/Version"
GRPC_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]


def framed(message: bytes) -> bytes:
    return struct.pack(">BI", 0, len(message)) + message


class Server:
    """The server side of one in-memory HTTP/2 connection: what the client sent, as h2 events."""

    def __init__(self) -> None:
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        self.h2.initiate_connection()
        self.requests: dict[int, dict[bytes, bytes]] = {}
        self.bodies: dict[int, bytearray] = {}
        self.ended: set[int] = set()
        self.resets: list[int] = []
        self.pending = b""  # the reply's DATA the client's window has no room for yet
        self.trailers: list[tuple[bytes, bytes]] | None = None  # sent once pending is

    def receive(self, data: bytes) -> None:
        for event in self.h2.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                self.requests[event.stream_id] = dict(event.headers)
                self.bodies[event.stream_id] = bytearray()
            elif isinstance(event, h2.events.DataReceived):
                self.bodies[event.stream_id] += event.data
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                self.ended.add(event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                self.resets.append(event.stream_id)


def exchange(client: Connection, server: Server, chunk: int | None = None) -> int:
    """Carry bytes both ways until neither side has any to send; how many moved. ``chunk``: feed
    the client in reads of at most that many bytes."""
    moved = 0
    while True:
        to_server, to_client = client.data_to_send(), server.h2.data_to_send()
        if not to_server and not to_client:
            return moved
        moved += len(to_server) + len(to_client)
        if to_server:
            server.receive(to_server)
        for start in range(0, len(to_client), chunk or len(to_client) or 1):
            client.receive_data(to_client[start:start + (chunk or len(to_client))])


def started(request: bytes = b"ping", timeout: float | None = 5.0, **options) -> tuple[Connection, Server, int]:
    client, server = Connection(**options), Server()
    client.start_call(PATH, request, timeout)
    exchange(client, server)
    (stream_id,) = server.requests
    return client, server, stream_id


def reply(server: Server, stream_id: int, message: bytes | None, status: int = 0, details: str = "",
          headers: list[tuple[bytes, bytes]] = GRPC_HEADERS) -> None:
    """A whole gRPC reply: headers, the message (as flow control allows: the rest is left to
    :func:`send_rest`), trailers."""
    server.h2.send_headers(stream_id, headers)
    server.pending = framed(message) if message is not None else b""
    server.trailers = [(b"grpc-status", b"%d" % status)] + (
        [(b"grpc-message", quote(details).encode())] if details else [])
    send_rest(server, stream_id)


def send_rest(server: Server, stream_id: int) -> None:
    """Send as much of the pending reply as the client's window takes, and the trailers after it."""
    if stream_id in server.resets:
        return
    while server.pending:
        room = min(server.h2.local_flow_control_window(stream_id), server.h2.max_outbound_frame_size)
        if room <= 0:
            return
        server.h2.send_data(stream_id, server.pending[:room])
        server.pending = server.pending[room:]
    if server.trailers is not None:
        server.h2.send_headers(stream_id, server.trailers, end_stream=True)
        server.trailers = None


def outcome_of(client: Connection, server: Server, stream_id: int, chunk: int | None = None) -> Outcome:
    """Run the connection until the client has the call's outcome (fails if the reply stalls)."""
    while True:
        moved = exchange(client, server, chunk)
        outcome = client.next_outcome()
        if outcome is not NEED_DATA:
            assert isinstance(outcome, Outcome)
            return outcome
        send_rest(server, stream_id)
        if not moved and not exchange(client, server, chunk):
            pytest.fail("the reply stalled: neither side has anything to send")


# -- the request ---------------------------------------------------------------------------------

def test_a_call_is_a_grpc_post_with_the_deadline_and_one_prefixed_message() -> None:
    _, server, stream_id = started(b"\x0a\x03abc", timeout=2.5)
    assert server.requests[stream_id] == {
        b":method": b"POST", b":scheme": b"http", b":path": PATH.encode(), b":authority": b"localhost",
        b"content-type": b"application/grpc", b"te": b"trailers", b"grpc-timeout": b"2500000u"}
    assert bytes(server.bodies[stream_id]) == framed(b"\x0a\x03abc") and stream_id in server.ended


def test_a_request_larger_than_the_servers_window_is_sent_as_the_window_opens() -> None:
    request = os.urandom(200_000)
    _, server, stream_id = started(request)
    assert bytes(server.bodies[stream_id]) == framed(request) and stream_id in server.ended


@pytest.mark.parametrize(("seconds", "header"), [
    (60.0, b"60000000u"), (2.5, b"2500000u"), (0.0005, b"500000n"), (0.0, b"1n"), (-3.0, b"1n"),
    (100_000.0, b"100000S"), (10 ** 9, b"16666666M")])
def test_the_deadline_is_sent_in_the_finest_unit_of_at_most_8_digits(seconds, header) -> None:
    assert encode_timeout(seconds) == header


# -- replies -------------------------------------------------------------------------------------

def test_an_ok_reply_is_its_message() -> None:
    client, server, stream_id = started()
    reply(server, stream_id, b"\x0a\x05v0.1")
    assert outcome_of(client, server, stream_id) == Outcome(Code.OK, message=b"\x0a\x05v0.1")


def test_an_empty_ok_message_is_a_message() -> None:
    client, server, stream_id = started()
    reply(server, stream_id, b"")
    assert outcome_of(client, server, stream_id) == Outcome(Code.OK, message=b"")


def test_an_error_status_keeps_the_servers_percent_decoded_sentence() -> None:
    client, server, stream_id = started()
    reply(server, stream_id, None, status=Code.NOT_FOUND, details="no pod 'ä1' — 100% gone\nreally")
    assert outcome_of(client, server, stream_id) == Outcome(Code.NOT_FOUND, "no pod 'ä1' — 100% gone\nreally",
                                                            from_server=True)


def test_a_trailers_only_reply_is_its_status() -> None:
    client, server, stream_id = started()
    server.h2.send_headers(stream_id, [*GRPC_HEADERS, (b"grpc-status", b"12"), (b"grpc-message", b"no%20such")],
                           end_stream=True)
    assert outcome_of(client, server, stream_id) == Outcome(Code.UNIMPLEMENTED, "no such", from_server=True)


def test_a_reply_without_a_status_is_internal() -> None:
    client, server, stream_id = started()
    server.h2.send_headers(stream_id, GRPC_HEADERS)
    server.h2.send_data(stream_id, framed(b"x"), end_stream=True)
    assert outcome_of(client, server, stream_id) == Outcome(Code.INTERNAL, "the reply ended without a grpc-status")


def test_an_http_error_is_mapped_as_grpc_maps_it() -> None:
    client, server, stream_id = started()
    server.h2.send_headers(stream_id, [(b":status", b"503"), (b"content-type", b"text/plain")])
    server.h2.send_data(stream_id, b"busy", end_stream=True)
    outcome = outcome_of(client, server, stream_id)
    assert outcome == Outcome(Code.UNAVAILABLE, "the server answered with HTTP status 503, not a gRPC reply")


def test_a_reply_that_is_not_grpc_is_internal() -> None:
    client, server, stream_id = started()
    reply(server, stream_id, b"x", headers=[(b":status", b"200"), (b"content-type", b"text/html")])
    assert outcome_of(client, server, stream_id) == Outcome(
        Code.INTERNAL, "the reply's content-type is 'text/html', not application/grpc")


def test_a_truncated_message_is_internal() -> None:
    client, server, stream_id = started()
    server.h2.send_headers(stream_id, GRPC_HEADERS)
    server.h2.send_data(stream_id, framed(b"abcdef")[:-2])
    server.h2.send_headers(stream_id, [(b"grpc-status", b"0")], end_stream=True)
    assert outcome_of(client, server, stream_id) == Outcome(Code.INTERNAL,
                                                            "the reply's message is truncated (4 of 6 bytes)")


def test_a_reply_over_the_limit_is_refused_before_it_is_all_read() -> None:
    client, server, stream_id = started(max_message_bytes=1000)
    server.h2.send_headers(stream_id, GRPC_HEADERS)
    server.h2.send_data(stream_id, framed(b"x" * 10_000)[:2000])  # the declared length is enough to refuse it
    outcome = outcome_of(client, server, stream_id)
    assert outcome == Outcome(Code.RESOURCE_EXHAUSTED, "the reply is larger than the limit of 1000 bytes")
    exchange(client, server)
    assert server.resets == [stream_id]  # the server is told to stop sending


def test_a_reset_stream_is_unavailable() -> None:
    client, server, stream_id = started()
    server.h2.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
    assert outcome_of(client, server, stream_id) == Outcome(
        Code.UNAVAILABLE, "the server reset the call's stream (HTTP/2 error REFUSED_STREAM)")
    assert client.usable  # only the stream failed


def test_a_goaway_is_unavailable_and_ends_the_connection() -> None:
    client, server, stream_id = started()
    server.h2.close_connection(h2.errors.ErrorCodes.INTERNAL_ERROR, last_stream_id=0)
    outcome = outcome_of(client, server, stream_id)
    assert outcome == Outcome(Code.UNAVAILABLE, "the server ended the connection (GOAWAY, HTTP/2 error INTERNAL_ERROR)")
    assert not client.usable
    client.start_call(PATH, b"again", 1.0)  # no new call after a GOAWAY: the channel connects anew
    assert client.next_outcome() == outcome


def goaway(last_stream_id: int, error_code: int = h2.errors.ErrorCodes.NO_ERROR, debug: bytes = b"") -> bytes:
    """A GOAWAY frame as a server shutting down sends it, with the server's connection going on
    (h2's own would close its state machine, python-hyper/h2#1181)."""
    return struct.pack(">HBBBI", 0, 8 + len(debug), 0x7, 0, 0) + struct.pack(">II", last_stream_id, error_code) + debug


@pytest.mark.parametrize("chunk", [None, 1], ids=["whole", "byte by byte"])
def test_a_graceful_goaway_lets_the_open_call_finish_and_refuses_new_calls(chunk) -> None:
    client, server, stream_id = started()
    # grpc-go's graceful stop: a GOAWAY for every stream, a second for those it took, then the reply
    sent = goaway(2**31 - 1) + goaway(stream_id, debug=b"graceful_stop")
    for start in range(0, len(sent), chunk or len(sent)):
        client.receive_data(sent[start:start + (chunk or len(sent))])
    assert client.next_outcome() is NEED_DATA and not client.usable
    reply(server, stream_id, b"\x0a\x05v0.1")
    assert outcome_of(client, server, stream_id, chunk) == Outcome(Code.OK, message=b"\x0a\x05v0.1")
    client.start_call(PATH, b"again", 1.0)
    assert client.next_outcome() == Outcome(Code.UNAVAILABLE, "the server ended the connection (GOAWAY, HTTP/2 "
                                                              "error NO_ERROR)")


def test_a_goaway_read_with_the_reply_lets_the_reply_count() -> None:
    client, server, stream_id = started()
    reply(server, stream_id, b"done")
    client.receive_data(goaway(stream_id) + server.h2.data_to_send())
    assert client.next_outcome() == Outcome(Code.OK, message=b"done")


def test_a_goaway_that_leaves_the_call_out_fails_it_at_once() -> None:
    client, server, stream_id = started()
    client.receive_data(goaway(stream_id - 1))
    assert client.next_outcome() == Outcome(Code.UNAVAILABLE, "the server ended the connection (GOAWAY, HTTP/2 "
                                                              "error NO_ERROR)")


@pytest.mark.parametrize(("frame", "says"), [
    (struct.pack(">HBBBI", 0, 4, 0x7, 0, 0) + b"\0\0\0\1", "Frame data missing or invalid"),
    (struct.pack(">HBBBI", 0, 8, 0x7, 0, 1) + bytes(8), "Stream ID must be zero for GoAwayFrame")])
def test_a_malformed_goaway_is_a_protocol_error(frame, says):
    client, _, _ = started()
    client.receive_data(frame)
    outcome = client.next_outcome()
    assert outcome.code == Code.INTERNAL and outcome.details.startswith("HTTP/2 protocol error from the server: ")
    assert says in outcome.details and not client.usable


def test_the_connection_closing_after_a_graceful_goaway_fails_the_call_it_owed() -> None:
    client, _, stream_id = started()
    client.receive_data(goaway(stream_id))
    client.receive_data(b"")
    assert client.next_outcome() == Outcome(Code.UNAVAILABLE, "the server ended the connection (GOAWAY, HTTP/2 "
                                                              "error NO_ERROR) before the reply was complete")


@pytest.mark.parametrize(("error_code", "debug", "says"), [
    (h2.errors.ErrorCodes.ENHANCE_YOUR_CALM, b"too_many_pings", "ENHANCE_YOUR_CALM: too_many_pings"),
    (h2.errors.ErrorCodes.INTERNAL_ERROR, b"", "INTERNAL_ERROR"),
    (h2.errors.ErrorCodes.INTERNAL_ERROR, b"\xffbad", "INTERNAL_ERROR: \\xffbad")])
def test_the_connection_closing_after_an_error_goaway_says_the_goaways_error(error_code, debug, says) -> None:
    client, _, stream_id = started()
    client.receive_data(goaway(stream_id, error_code, debug))  # the call was taken: it stays open
    assert client.next_outcome() is NEED_DATA
    client.receive_data(b"")
    assert client.next_outcome() == Outcome(Code.UNAVAILABLE, f"the server ended the connection (GOAWAY, HTTP/2 "
                                                              f"error {says}) before the reply was complete")


def test_the_connection_closing_mid_reply_is_unavailable() -> None:
    client, server, stream_id = started()
    server.h2.send_headers(stream_id, GRPC_HEADERS)
    exchange(client, server)
    client.receive_data(b"")
    assert client.next_outcome() == Outcome(Code.UNAVAILABLE, "the connection closed before the reply was complete")


def test_a_reply_split_over_many_small_reads() -> None:
    client, server = Connection(), Server()
    client.start_call(PATH, b"ping", 5.0)
    exchange(client, server, chunk=1)  # the server's preface too, byte by byte
    (stream_id,) = server.requests
    reply(server, stream_id, b"\x0a\x05v0.1" * 50, status=0)
    assert outcome_of(client, server, stream_id, chunk=1) == Outcome(Code.OK, message=b"\x0a\x05v0.1" * 50)


def test_a_reply_larger_than_http2s_initial_window_is_not_stalled() -> None:
    client, server, stream_id = started()
    big = os.urandom(5 * 1024 * 1024)  # past the 64 KiB initial window and the 4 MiB one the client asks for
    reply(server, stream_id, big)
    assert outcome_of(client, server, stream_id, chunk=16384) == Outcome(Code.OK, message=big)


def test_calls_follow_one_another_on_one_connection() -> None:
    client, server, first = started()
    reply(server, first, b"one")
    assert outcome_of(client, server, first) == Outcome(Code.OK, message=b"one")
    client.start_call(PATH, b"again", 1.0)
    exchange(client, server)
    second = max(server.requests)
    assert second > first and bytes(server.bodies[second]) == framed(b"again")
    reply(server, second, b"two")
    assert outcome_of(client, server, second) == Outcome(Code.OK, message=b"two")


# -- the blocking channel ------------------------------------------------------------------------

def test_a_server_that_never_answers_is_deadline_exceeded(tmp_path) -> None:
    path = str(tmp_path / "silent.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen()  # accepted by the kernel's backlog, never read
        channel = Channel(path)
        try:
            outcome = channel.call(PATH, b"", timeout=0.2)
        finally:
            channel.close()
    assert outcome == Outcome(Code.DEADLINE_EXCEEDED, "no reply within the call's deadline of 0.2 s")


def test_nothing_listening_is_unavailable(tmp_path) -> None:
    channel = Channel(str(tmp_path / "none.sock"))
    outcome = channel.call(PATH, b"", timeout=1.0)
    assert outcome.code == Code.UNAVAILABLE and outcome.details.startswith(f"cannot connect to {tmp_path}/none.sock: ")


def test_a_second_message_in_a_unary_reply_is_internal() -> None:
    client, server, stream_id = started()
    server.h2.send_headers(stream_id, GRPC_HEADERS)
    server.h2.send_data(stream_id, framed(b"one") + framed(b"two"))
    assert outcome_of(client, server, stream_id) == Outcome(
        Code.INTERNAL, "the reply carries more than one message for a unary call")


@pytest.mark.parametrize("first_bytes", [b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
                                         b"\x00\x01garbage garbage garbage\xff" * 20])
def test_a_server_whose_first_bytes_are_not_http2_settings_is_unavailable_at_once(first_bytes) -> None:
    # RFC 9113 3.4: the server's preface is a SETTINGS frame. Without this check h2 buffers what
    # a frame header of "HTTP/1.1 4" declares (4.7 MB) and the call waits for its deadline.
    client = Connection()
    client.start_call(PATH, b"ping", 5.0)
    client.data_to_send()
    client.receive_data(first_bytes)
    outcome = client.next_outcome()
    assert outcome == Outcome(Code.UNAVAILABLE, f"the server does not speak HTTP/2: its first bytes are "
                                                f"{first_bytes[:16]!r}, not a SETTINGS frame")
    assert not client.usable


def test_a_server_that_closes_at_once_is_said_to_have_closed_the_connection(tmp_path) -> None:
    path = str(tmp_path / "closing.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen()
        channel = Channel(path)
        try:
            channel._connect(None)  # connected; the server then closes without reading a byte
            accepted, _ = listener.accept()
            accepted.close()
            outcome = channel.call(PATH, b"x" * 300_000, timeout=5.0)
        finally:
            channel.close()
    assert outcome.code == Code.UNAVAILABLE
    assert outcome.details.startswith("the server closed the connection"), outcome.details


def test_podshimctl_names_the_endpoint_when_the_connection_failed_not_the_server(tmp_path) -> None:
    # A socket that answers, but not with HTTP/2: the failure is the connection's, and the
    # sentence says which endpoint it was, so a wrong --endpoint is seen for what it is.
    import subprocess
    import sys
    import threading

    path = str(tmp_path / "not-podshimd.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen()

        def answer_http1() -> None:
            for _ in range(2):  # podshimctl's own check that something answers, then the call
                accepted, _ = listener.accept()
                with accepted:
                    try:
                        accepted.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                        accepted.recv(65536)
                    except OSError:
                        pass

        server = threading.Thread(target=answer_http1, daemon=True)
        server.start()
        run = subprocess.run([sys.executable, "-m", "client.cli", "pods", "--endpoint", f"unix://{path}"],
                             capture_output=True, text=True, timeout=60,
                             cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        server.join(timeout=10)
    assert run.returncode != 0
    assert f"podshimd at unix://{path}: the server does not speak HTTP/2" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
