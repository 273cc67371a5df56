"""shim.rpc server and client over real Unix sockets.

Tests that take the ``run`` fixture run once on asyncio's own loop and once on uvloop: they are
the ones whose behaviour rests on the loop's transports. (pytest-asyncio 1.x deprecates overriding
its ``event_loop_policy`` fixture, an error here, so they drive an ``asyncio.Runner`` themselves,
as tests/shim/test_kernel_reaper.py does.) The others run on pytest-asyncio's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import tempfile
from collections.abc import AsyncIterator

import pytest
import uvloop

from shim.rpc import (
    AlreadyExists,
    Client,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Server,
    Unavailable,
    Unimplemented,
    Unknown,
    error_from_status,
)
from shim.rpc.frames import HEADER, MAX_DATA_BYTES, NEED_DATA, Frame, FrameDecoder, MessageType, encode_frame
from shim.rpc.messages import decode_response, pack
from shim.rpc.status import Code

from support.rpctools import NOBODY, SERVICE, WAIT, call_as_nobody, request_frame

SOCKET_NAME = "rpc.sock"


class Echo:
    """The service under test. Its handlers report what happens to them through events, so
    tests wait on those, never on time."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.finished = asyncio.Event()
        self.release = asyncio.Event()

    def register(self, server: Server) -> None:
        server.register(
            SERVICE,
            unary={"Ping": self.ping, "Sleep": self.sleep, "Fail": self.fail, "Crash": self.crash,
                   "Block": self.block, "Stubborn": self.stubborn, "Deadline": self.deadline,
                   "Namespace": self.namespace, "Unencodable": self.unencodable},
            streams={"Count": self.count},
        )

    async def ping(self, ctx, payload):
        return payload

    async def sleep(self, ctx, payload):
        await asyncio.sleep(payload["delay"])
        return payload["n"]

    async def fail(self, ctx, payload):
        raise error_from_status(payload["code"], payload["message"], payload["details"])

    async def crash(self, ctx, payload):
        raise ValueError(payload["message"])

    async def _until_cancelled(self) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def block(self, ctx, payload):
        """Waits until cancelled."""
        try:
            await self._until_cancelled()
        finally:
            self.finished.set()

    async def stubborn(self, ctx, payload):
        """Swallows its cancellation and returns only once the test releases it."""
        with contextlib.suppress(asyncio.CancelledError):
            await self._until_cancelled()
        await self.release.wait()
        self.finished.set()
        return "too late"

    async def deadline(self, ctx, payload):
        return ctx.deadline - asyncio.get_running_loop().time()

    async def namespace(self, ctx, payload):
        return ctx.namespace

    async def unencodable(self, ctx, payload):
        return {"value": object()}

    async def count(self, ctx, payload, stream):
        for i in range(payload["n"]):
            await stream.send({"i": i})
        if "then" in payload:
            raise error_from_status(payload["then"], "stream failed")


@contextlib.asynccontextmanager
async def serving(service: Echo, directory: str, **options) -> AsyncIterator[Server]:
    """A Server for ``service`` (``options`` are Server's) accepting on ``directory``/rpc.sock;
    closed on exit."""
    server = Server(**options)
    service.register(server)
    path = os.path.join(directory, SOCKET_NAME)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(path, 0o777)  # reachable by any uid: the credential check alone must refuse
        sock.listen()
        await server.start(sock)  # the server owns the socket from here
    except BaseException:
        sock.close()
        raise
    try:
        yield server
    finally:
        await server.aclose()


def address(directory: str) -> str:
    return f"unix://{os.path.join(directory, SOCKET_NAME)}"


@contextlib.asynccontextmanager
async def raw_connection(directory: str) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A connection without the client library, to send what it never would."""
    reader, writer = await asyncio.open_unix_connection(os.path.join(directory, SOCKET_NAME))
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def read_responses(reader: asyncio.StreamReader, count: int) -> dict[int, object]:
    """Read frames until ``count`` responses came; return them by stream id."""
    decoder = FrameDecoder()
    responses: dict[int, object] = {}
    while len(responses) < count:
        data = await reader.read(65536)
        assert data, f"connection closed after {len(responses)} of {count} responses"
        decoder.feed(data)
        while (frame := decoder.next_event()) is not NEED_DATA:
            assert isinstance(frame, Frame) and frame.type == MessageType.RESPONSE
            responses[frame.stream_id] = decode_response(frame.data)
    return responses


@pytest.fixture
def socket_dir():
    """A short directory path (sun_path holds 108 bytes) that other uids may traverse."""
    with tempfile.TemporaryDirectory(prefix="podshim-rpc-") as directory:
        os.chmod(directory, 0o755)
        yield directory


@pytest.fixture
def service():
    return Echo()


@pytest.fixture
async def server(service, socket_dir):
    async with serving(service, socket_dir) as server:
        yield server


@pytest.fixture
async def client(server, socket_dir):
    async with await Client.connect(address(socket_dir)) as client:
        yield client


@pytest.fixture(params=[asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])
def run(request):
    """Run a coroutine to completion on a fresh loop of each kind."""
    with asyncio.Runner(loop_factory=request.param) as runner:
        yield runner.run


# -- calls ---------------------------------------------------------------------------------------

def test_unary_call_returns_the_handler_result(run, service, socket_dir) -> None:
    async def call():
        async with serving(service, socket_dir), await Client.connect(address(socket_dir)) as client:
            return await client.call(SERVICE, "Ping", {"word": "hello", "blob": b"\x00\xff"})

    assert run(call()) == {"word": "hello", "blob": b"\x00\xff"}


@pytest.mark.parametrize("error", [NotFound, AlreadyExists, FailedPrecondition, PermissionDenied, Unavailable])
async def test_rpc_error_reaches_the_client_as_its_class(client, error) -> None:
    with pytest.raises(error) as raised:
        await client.call(SERVICE, "Fail", {"code": int(error.code), "message": "sandbox 'sb1'",
                                            "details": [{"hint": 1}]})
    assert (raised.value.message, raised.value.details) == ("sandbox 'sb1'", [{"hint": 1}])


async def test_unexpected_handler_exception_is_unknown_and_logged_with_its_traceback(client, caplog) -> None:
    with pytest.raises(Unknown, match=r"/test.v1.Echo/Crash: unexpected ValueError: boom"):
        await client.call(SERVICE, "Crash", {"message": "boom"})
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.exc_info is not None and "raise ValueError" in caplog.text


async def test_unencodable_result_is_internal(client) -> None:
    with pytest.raises(Internal, match="cannot be encoded"):
        await client.call(SERVICE, "Unencodable")


@pytest.mark.parametrize("service_name, method", [(SERVICE, "Nope"), ("test.v1.Nope", "Ping")],
                         ids=["unknown-method", "unknown-service"])
async def test_unknown_method_is_unimplemented(client, service_name, method) -> None:
    with pytest.raises(Unimplemented, match=f"/{service_name}/{method}"):
        await client.call(service_name, method)


async def test_handler_sees_the_deadline_the_client_sent(client) -> None:
    loop = asyncio.get_running_loop()
    began = loop.time()
    remaining = await client.call(SERVICE, "Deadline", timeout=5.0)
    assert 5.0 - (loop.time() - began) <= remaining <= 5.0  # what is left of it when the handler runs


async def test_handler_sees_the_client_namespace(server, socket_dir) -> None:
    async with await Client.connect(address(socket_dir), namespace="k8s.io") as client:
        assert await client.call(SERVICE, "Namespace") == "k8s.io"


def test_concurrent_calls_on_one_connection_are_answered_as_they_finish(run, service, socket_dir) -> None:
    calls = 1000
    delays = random.Random(1).choices([0.0, 0.002, 0.004, 0.006, 0.008], k=calls)

    async def call_all():
        arrived = []
        async with serving(service, socket_dir), await Client.connect(address(socket_dir)) as client:
            async def one(n):
                arrived.append(await client.call(SERVICE, "Sleep", {"n": n, "delay": delays[n]}))
            await asyncio.gather(*(one(n) for n in range(calls)))
        return arrived

    arrived = run(call_all())
    assert sorted(arrived) == list(range(calls))
    assert arrived != list(range(calls))


# -- deadlines and cancellation ---------------------------------------------------------------------

def test_deadline_answers_deadline_exceeded_and_cancels_the_handler(run, service, socket_dir) -> None:
    async def call_past_deadline():
        async with serving(service, socket_dir), await Client.connect(address(socket_dir)) as client:
            with pytest.raises(DeadlineExceeded) as raised:
                await client.call(SERVICE, "Block", timeout=0.05)
            await asyncio.wait_for(service.finished.wait(), WAIT)
            assert await client.call(SERVICE, "Ping", {"after": 1}) == {"after": 1}
            return raised.value

    error = run(call_past_deadline())
    assert error.message == "deadline exceeded"  # the server's answer, not the client's own timer
    assert service.cancelled.is_set()


def test_deadline_is_answered_even_when_the_handler_swallows_cancellation(run, service, socket_dir) -> None:
    async def call_past_deadline():
        async with serving(service, socket_dir), await Client.connect(address(socket_dir)) as client:
            with pytest.raises(DeadlineExceeded) as raised:
                await client.call(SERVICE, "Stubborn", timeout=0.05)
            # Answered while the handler still runs: it returns only once released.
            assert service.cancelled.is_set() and not service.finished.is_set()
            assert await client.call(SERVICE, "Ping", {"after": 1}) == {"after": 1}
            service.release.set()
            await asyncio.wait_for(service.finished.wait(), WAIT)
            return raised.value

    error = run(call_past_deadline())
    assert error.message == "deadline exceeded"


def test_cancelled_client_call_leaves_the_connection_usable(run, service, socket_dir) -> None:
    async def cancel_a_call():
        async with serving(service, socket_dir), await Client.connect(address(socket_dir)) as client:
            call = asyncio.create_task(client.call(SERVICE, "Block"))
            await service.started.wait()
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            return await client.call(SERVICE, "Ping", {"after": 1})

    assert run(cancel_a_call()) == {"after": 1}


def test_closed_connection_cancels_its_handlers(run, service, socket_dir) -> None:
    async def close_mid_call():
        async with serving(service, socket_dir):
            client = await Client.connect(address(socket_dir))
            call = asyncio.create_task(client.call(SERVICE, "Block"))
            await service.started.wait()
            await client.aclose()
            with pytest.raises(Unavailable):
                await call
            await asyncio.wait_for(service.finished.wait(), WAIT)

    run(close_mid_call())
    assert service.cancelled.is_set()


def test_half_closed_client_still_gets_its_answer(run, service, socket_dir) -> None:
    async def ask_then_shut_down_writing():
        async with serving(service, socket_dir), raw_connection(socket_dir) as (reader, writer):
            writer.write(request_frame(1, "Sleep", {"n": 7, "delay": 0.01}))
            writer.write_eof()
            responses = await read_responses(reader, 1)
            assert await reader.read() == b""  # then the server closes
            return responses[1]

    response = run(ask_then_shut_down_writing())
    assert (response.code, response.payload) == (Code.OK, 7)


def test_aclose_with_calls_in_flight_returns_promptly(run, service, socket_dir) -> None:
    async def close_server_mid_call():
        async with serving(service, socket_dir) as server, await Client.connect(address(socket_dir)) as client:
            call = asyncio.create_task(client.call(SERVICE, "Block"))
            await service.started.wait()
            # Its handler cancelled, the connection closes at once: aclose never waits out its timeout.
            async with asyncio.timeout(WAIT):
                await server.aclose(timeout=3600)
            with pytest.raises(Unavailable):
                await call
            await asyncio.wait_for(service.finished.wait(), WAIT)

    run(close_server_mid_call())


# -- streams ------------------------------------------------------------------------------------

def test_server_stream_delivers_every_message_then_ends(run, service, socket_dir) -> None:
    async def collect():
        async with serving(service, socket_dir), await Client.connect(address(socket_dir)) as client:
            async with contextlib.aclosing(client.stream(SERVICE, "Count", {"n": 50})) as stream:
                return [item async for item in stream]

    assert run(collect()) == [{"i": i} for i in range(50)]


async def test_server_stream_error_ends_the_stream_with_its_class(client) -> None:
    received = []
    with pytest.raises(NotFound, match="stream failed"):
        async with contextlib.aclosing(client.stream(SERVICE, "Count", {"n": 2, "then": int(Code.NOT_FOUND)})) as stream:
            async for item in stream:
                received.append(item)
    assert received == [{"i": 0}, {"i": 1}]


# -- a misbehaving peer -------------------------------------------------------------------------

def test_garbage_frames_fail_their_own_streams_and_the_connection_stays_usable(run, service, socket_dir) -> None:
    async def send_garbage():
        async with serving(service, socket_dir), raw_connection(socket_dir) as (reader, writer):
            writer.write(encode_frame(1, MessageType.REQUEST, 0, b"\xc1"))  # not msgpack
            writer.write(request_frame(2))  # even stream id
            writer.write(HEADER.pack(MAX_DATA_BYTES + 1, 3, MessageType.REQUEST, 0) + bytes(MAX_DATA_BYTES + 1))
            writer.write(encode_frame(5, 9, 0, pack({"unknown": "type"})))  # ignored
            writer.write(encode_frame(9, MessageType.DATA, 0, pack({})))  # no such stream
            writer.write(request_frame(11, "Ping", {"still": "here"}))
            await writer.drain()
            return await read_responses(reader, 5)

    responses = run(send_garbage())
    assert {sid: r.code for sid, r in responses.items()} == {
        1: Code.INVALID_ARGUMENT, 2: Code.INVALID_ARGUMENT, 3: Code.RESOURCE_EXHAUSTED,
        9: Code.INVALID_ARGUMENT, 11: Code.OK}
    assert responses[11].payload == {"still": "here"}


async def test_data_frame_on_a_unary_stream_is_invalid_and_cancels_the_call(service, server, socket_dir):
    async with raw_connection(socket_dir) as (reader, writer):
        writer.write(request_frame(1, "Block"))
        await service.started.wait()
        writer.write(encode_frame(1, MessageType.DATA, 0, pack({"more": 1})))
        responses = await read_responses(reader, 1)
        await asyncio.wait_for(service.finished.wait(), WAIT)
    assert responses[1].code == Code.INVALID_ARGUMENT
    assert service.cancelled.is_set()


def test_client_vanishing_mid_frame_does_not_hurt_the_server(run, service, socket_dir, caplog) -> None:
    caplog.set_level(logging.INFO, logger="shim.rpc.channel")

    async def vanish_then_call():
        async with serving(service, socket_dir):
            async with raw_connection(socket_dir) as (_, writer):
                writer.write(request_frame(1)[:15])
                await writer.drain()
            async with await Client.connect(address(socket_dir)) as client:
                return await client.call(SERVICE, "Ping", {"after": 1})

    assert run(vanish_then_call()) == {"after": 1}
    assert "in the middle of a frame" in caplog.text


async def test_peer_with_another_uid_is_refused_without_an_answer(server, socket_dir, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="shim.rpc.server")
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        code = 3
        try:
            code = call_as_nobody(os.path.join(socket_dir, SOCKET_NAME))
        finally:
            os._exit(code)
    _, status = await asyncio.to_thread(os.waitpid, pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert f"refusing connection: peer pid {pid} has uid {NOBODY}" in caplog.text


# -- the connection limit (protocol.md 1.1) -------------------------------------------------------
async def test_at_the_connection_limit_the_connection_idle_longest_makes_room(service, socket_dir) -> None:
    async with serving(service, socket_dir, max_connections=3):
        held = [await Client.connect(address(socket_dir)) for _ in range(3)]
        try:
            for n, client in enumerate(held):  # answered in this order: held[0] is idle longest
                assert await client.call(SERVICE, "Ping", {"n": n}) == {"n": n}
            async with await Client.connect(address(socket_dir)) as newcomer:
                assert await newcomer.call(SERVICE, "Ping", {"n": 3}) == {"n": 3}
                await held[0].wait_closed()
                assert not held[1].closed and not held[2].closed
        finally:
            for client in held:
                await client.aclose()


async def test_when_every_connection_has_a_call_in_flight_a_new_one_gets_resource_exhausted(service, socket_dir) -> None:
    async with serving(service, socket_dir, max_connections=2):
        held = [await Client.connect(address(socket_dir)) for _ in range(2)]
        blocked = [asyncio.ensure_future(client.call(SERVICE, "Block", {})) for client in held]
        try:
            for client in held:  # answered after its Block was read: every connection is busy
                await client.call(SERVICE, "Ping", {})
            async with await Client.connect(address(socket_dir)) as refused:
                with pytest.raises(ResourceExhausted) as caught:
                    await refused.call(SERVICE, "Ping", {})
                assert caught.value.message == ("the shim has 2 connections open (its limit), each with a call in "
                                                "flight; try again later")
                await refused.wait_closed()
            assert await held[0].call(SERVICE, "Ping", {"still": "served"}) == {"still": "served"}
        finally:
            for task in blocked:
                task.cancel()
            for client in held:
                await client.aclose()


async def test_a_refused_connection_that_sends_nothing_is_closed(service, socket_dir, monkeypatch) -> None:
    from shim.rpc import server as module

    monkeypatch.setattr(module, "REFUSED_LINGER", 0.05)
    async with serving(service, socket_dir, max_connections=1):
        async with await Client.connect(address(socket_dir)) as busy:
            blocked = asyncio.ensure_future(busy.call(SERVICE, "Block", {}))
            try:
                await busy.call(SERVICE, "Ping", {})
                async with raw_connection(socket_dir) as (reader, _):
                    assert await asyncio.wait_for(reader.read(), WAIT) == b""  # closed, not a byte sent
            finally:
                blocked.cancel()


# -- the blocking client (shim.rpc.blocking.call) -------------------------------------------------


def test_a_blocking_call_to_a_socket_nobody_serves_is_not_served(tmp_path) -> None:
    from shim.rpc import blocking

    with pytest.raises(blocking.NotServed, match="cannot connect"):
        blocking.call(f"unix://{tmp_path}/nothing.sock", "svc", "Method", timeout=1)


def test_a_blocking_call_that_gets_no_answer_says_so_apart_from_not_served(tmp_path) -> None:
    # The call went out (the server may be carrying it out): the caller must not take it for a
    # server that is not there, as a spawner that would then start the shim a second way would.
    from shim.rpc import blocking

    path = str(tmp_path / "mute.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    try:
        with pytest.raises(blocking.NoAnswer, match="no answer") as caught:
            blocking.call("unix://" + path, "svc", "Method", timeout=0.3)
        assert not isinstance(caught.value, blocking.NotServed)
        assert isinstance(caught.value, Unavailable)  # what callers that need not tell them apart catch
    finally:
        listener.close()
