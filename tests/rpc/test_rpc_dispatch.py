"""shim.rpc.dispatch and the errno table: plain synchronous functions, no socket, no loop."""

from __future__ import annotations

import asyncio
import errno
import logging

import pytest

from shim.rpc import dispatch
from shim.rpc.connection import CallStarted, ServerConnection
from shim.rpc.frames import Frame, FrameDecoder
from shim.rpc.messages import Request, Response, decode_response
from shim.rpc.status import (
    ERRNO_CODES,
    AlreadyExists,
    Code,
    FailedPrecondition,
    Internal,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    code_for_errno,
    error_from_oserror,
)

from support.rpctools import SERVICE, request_frame

PING = Request(SERVICE, "Ping", {"word": "hello"})


def raising(exc: BaseException):
    def handler(request: Request):
        raise exc
    return handler


def handlers(handler) -> dict:
    return {(SERVICE, "Ping"): handler}


def errors_logged(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR]


# -- routing ---------------------------------------------------------------------------------------

def test_route_finds_the_handler_of_the_service_and_method() -> None:
    handler = object()
    assert dispatch.route(PING, handlers(handler)) is handler


@pytest.mark.parametrize("request_", [Request(SERVICE, "Nope"), Request("test.v1.Nope", "Ping")],
                         ids=["unknown-method", "unknown-service"])
def test_route_of_an_unknown_method_is_unimplemented_naming_it(request_) -> None:
    assert dispatch.route(request_, handlers(object())) == Response(
        Code.UNIMPLEMENTED, f"unknown method {request_.full_method}")


def test_dispatch_answers_ok_with_the_handler_result() -> None:
    assert dispatch.dispatch(PING, handlers(lambda request: request.payload)) == Response(payload={"word": "hello"})


# -- exceptions to statuses --------------------------------------------------------------------------

def test_rpc_error_keeps_its_code_sentence_and_details_and_is_not_logged(caplog) -> None:
    error = FailedPrecondition("sandbox 'sb1' is not running", details=[{"hint": 1}])
    assert dispatch.dispatch(PING, handlers(raising(error))) == Response(
        Code.FAILED_PRECONDITION, "sandbox 'sb1' is not running", [{"hint": 1}])
    assert errors_logged(caplog) == []


def test_unexpected_exception_is_unknown_with_a_sentence_and_logged_once_with_its_traceback(caplog) -> None:
    response = dispatch.dispatch(PING, handlers(raising(ValueError("boom"))))
    assert response == Response(Code.UNKNOWN, f"{PING.full_method}: unexpected ValueError: boom")
    [record] = errors_logged(caplog)
    assert record.exc_info is not None and record.exc_info[0] is ValueError


@pytest.mark.parametrize("err, code", sorted(ERRNO_CODES.items()), ids=[errno.errorcode[e] for e in sorted(ERRNO_CODES)])
def test_os_error_has_the_status_of_its_errno_and_is_logged_once_with_its_traceback(err, code, caplog):
    response = dispatch.dispatch(PING, handlers(raising(OSError(err, "said by the kernel", "/some/file"))))
    assert response == Response(code, f"{PING.full_method}: said by the kernel: /some/file")
    [record] = errors_logged(caplog)
    assert record.exc_info is not None and issubclass(record.exc_info[0], OSError)


def test_os_error_of_another_errno_is_internal() -> None:
    response = dispatch.dispatch(PING, handlers(raising(OSError(errno.EIO, "I/O error"))))
    assert (response.code, response.message) == (Code.INTERNAL, f"{PING.full_method}: I/O error")


def test_timeout_is_deadline_exceeded_and_cancellation_is_cancelled(caplog) -> None:
    assert dispatch.failure(TimeoutError(), where="x").code == Code.DEADLINE_EXCEEDED
    assert dispatch.failure(asyncio.CancelledError(), where="x") == Response(Code.CANCELLED, "the call was cancelled")
    assert errors_logged(caplog) == []


# -- encoding the answer --------------------------------------------------------------------------------

def started_stream(conn: ServerConnection) -> int:
    [event] = conn.receive_data(request_frame(1))
    assert isinstance(event, CallStarted)
    return event.stream_id


def decoded(data: bytes) -> Response:
    decoder = FrameDecoder()
    decoder.feed(data)
    frame = decoder.next_event()
    assert isinstance(frame, Frame)
    return decode_response(frame.data)


def test_answer_encodes_the_response_on_its_stream() -> None:
    conn = ServerConnection()
    sid = started_stream(conn)
    assert decoded(dispatch.answer(conn, sid, Response(payload=[1, "two"]), where="x")).payload == [1, "two"]


def test_result_that_cannot_be_encoded_is_internal_and_logged_once_with_its_traceback(caplog) -> None:
    conn = ServerConnection()
    sid = started_stream(conn)
    response = decoded(dispatch.answer(conn, sid, Response(payload={"value": object()}), where=PING.full_method))
    assert response.code == Code.INTERNAL and response.message.startswith("result cannot be encoded: ")
    [record] = errors_logged(caplog)
    assert PING.full_method in record.getMessage() and record.exc_info is not None


# -- the errno table ------------------------------------------------------------------------------------

def test_errno_table_is_the_documented_one() -> None:
    assert ERRNO_CODES == {
        errno.ENOENT: Code.NOT_FOUND,
        errno.EEXIST: Code.ALREADY_EXISTS,
        errno.EPERM: Code.PERMISSION_DENIED,
        errno.EACCES: Code.PERMISSION_DENIED,
        errno.EBUSY: Code.FAILED_PRECONDITION,
        errno.ENOSPC: Code.RESOURCE_EXHAUSTED,
    }
    assert code_for_errno(errno.EIO) == code_for_errno(None) == Code.INTERNAL


@pytest.mark.parametrize("err, cls", [(errno.ENOENT, NotFound), (errno.EEXIST, AlreadyExists),
                                      (errno.EACCES, PermissionDenied), (errno.EBUSY, FailedPrecondition),
                                      (errno.ENOSPC, ResourceExhausted), (errno.EIO, Internal)])
def test_error_from_oserror_is_the_errno_class_with_the_sentence_of_what_failed(err, cls) -> None:
    error = error_from_oserror(OSError(err, "said by the kernel"), "cannot create cgroup /sys/fs/cgroup/x")
    assert type(error) is cls
    assert error.message == "cannot create cgroup /sys/fs/cgroup/x: said by the kernel"
