"""Requests to handlers and outcomes to responses: the one place an exception becomes a status.

Sans-IO: no socket, no event loop. The asyncio server (:mod:`shim.rpc.server`) and the
blocking one (:mod:`shim.rpc.blocking`) route a request with :func:`route`, answer a failed
call with :func:`failure` and encode the answer with :func:`answer`; the blocking server runs
a whole call with :func:`dispatch`. podshimd maps its handlers' exceptions with
:func:`status_from_exception` too. An exception nobody expected is logged here, with its
traceback, once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from shim.rpc.connection import ServerConnection
from shim.rpc.frames import LocalProtocolError
from shim.rpc.messages import Request, Response
from shim.rpc.status import Code, RpcError, code_for_errno

__all__ = ["Handlers", "route", "dispatch", "failure", "answer", "status_from_exception"]

log = logging.getLogger(__name__)

H = TypeVar("H")

#: A handler table: ``(service, method)`` to whatever the server calls.
Handlers = Mapping[tuple[str, str], H]


def status_from_exception(exc: BaseException, *, where: str = "") -> tuple[Code, str, list[Any]]:
    """The status ``(code, message, details)`` of what a call raised.

    An RpcError keeps its code, sentence and details; a cancellation is CANCELLED, a
    TimeoutError DEADLINE_EXCEEDED. Anything else is unexpected and logged with its
    traceback: an OSError has its errno's code (:func:`shim.rpc.status.code_for_errno`), any
    other exception is UNKNOWN; the message names ``where`` and never carries a traceback.
    """
    if isinstance(exc, RpcError):
        return exc.code, exc.message, exc.details
    if not isinstance(exc, Exception):  # asyncio.CancelledError and other BaseExceptions
        return Code.CANCELLED, "the call was cancelled", []
    if isinstance(exc, TimeoutError):
        return Code.DEADLINE_EXCEEDED, "deadline exceeded", []
    prefix = f"{where}: " if where else ""
    if isinstance(exc, OSError):
        log.error("%s failed with an OS error", where or "call", exc_info=exc)
        reason = exc.strerror or str(exc)
        if exc.filename is not None:
            reason = f"{reason}: {exc.filename}"
        return code_for_errno(exc.errno), prefix + reason, []
    log.error("%s raised an unexpected exception", where or "call", exc_info=exc)
    return Code.UNKNOWN, f"{prefix}unexpected {type(exc).__name__}: {exc}", []


def failure(exc: BaseException, *, where: str) -> Response:
    """The Response to a call that raised ``exc`` (:func:`status_from_exception`)."""
    code, message, details = status_from_exception(exc, where=where)
    return Response(code, message, details)


def route(request: Request, handlers: Handlers[H]) -> H | Response:
    """The handler ``request`` calls, or the UNIMPLEMENTED Response when there is none."""
    handler = handlers.get((request.service, request.method))
    if handler is None:
        return Response(Code.UNIMPLEMENTED, f"unknown method {request.full_method}")
    return handler


def dispatch(request: Request, handlers: Handlers[Callable[[Request], Any]]) -> Response:
    """Run a synchronous call: the handler's result, or the status of what it raised."""
    handler = route(request, handlers)
    if isinstance(handler, Response):
        return handler
    try:
        return Response(payload=handler(request))
    except Exception as exc:
        return failure(exc, where=request.full_method)


def answer(conn: ServerConnection, stream_id: int, response: Response, *, where: str) -> bytes:
    """The bytes that answer ``stream_id`` with ``response``. A result msgpack cannot encode is
    a bug of the handler named ``where``: logged, and answered INTERNAL with a sentence."""
    try:
        return conn.response(stream_id, response)
    except (TypeError, ValueError, OverflowError, LocalProtocolError) as exc:
        log.error("%s returned a result that cannot be encoded", where, exc_info=exc)
        return conn.reject(stream_id, Code.INTERNAL, f"result cannot be encoded: {exc}")
