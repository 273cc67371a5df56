"""Errors to gRPC status: the one place.

Every CRI handler is wrapped by :func:`translated` (``server.compose`` does it for every method of
every handler group), so a handler simply raises: a :class:`shim.rpc.status.RpcError` keeps its
code (the pod layer's and the shims' codes are gRPC's numbers) and its sentence; anything else
goes through :func:`shim.rpc.dispatch.status_from_exception` (the shims' servers' own mapping),
which logs it with its traceback and answers with a sentence: an OSError its errno's code, the
rest UNKNOWN. No traceback ever reaches a client.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from shim.rpc.dispatch import status_from_exception
from shim.rpc.status import Code

__all__ = ["GRPC_CODES", "grpc_code", "translated"]

#: gRPC's StatusCode for each of our codes (both are gRPC's numbers).
GRPC_CODES: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}


def grpc_code(code: int) -> grpc.StatusCode:
    """The grpc.StatusCode of a status number; UNKNOWN for a number gRPC does not define."""
    return GRPC_CODES.get(int(code), grpc.StatusCode.UNKNOWN)


def _status(exc: Exception, where: str) -> tuple[grpc.StatusCode, str]:
    code, message, _ = status_from_exception(exc, where=where)
    if code == Code.OK:  # an RpcError built with OK would make abort() fail: a bug, said as one
        return grpc.StatusCode.UNKNOWN, f"{where}: failed with status OK: {message}"
    return grpc_code(code), message


def translated(handler: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a CRI handler ``(self, request, context)``, a coroutine function or an async
    generator function (a server-streaming RPC): whatever it raises becomes the call's status."""
    where = handler.__qualname__
    if inspect.isasyncgenfunction(handler):
        @functools.wraps(handler)
        async def stream(self: Any, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                async for item in handler(self, request, context):
                    yield item
                return
            except Exception as exc:
                code, message = _status(exc, where)
            await context.abort(code, message)
        return stream

    @functools.wraps(handler)
    async def unary(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await handler(self, request, context)
        except Exception as exc:
            code, message = _status(exc, where)
        await context.abort(code, message)
    return unary

