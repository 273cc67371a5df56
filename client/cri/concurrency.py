"""Steps that run at the same time, with the error of the one that failed as it is."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

__all__ = ["together"]


async def together(*steps: Callable[[], Awaitable[None]]) -> None:
    """Run ``steps`` at the same time. The first that fails cancels the others, and its error is
    raised as it is (not in an ExceptionGroup: callers and the status translation see the typed
    error a step raised). Cancelling the caller cancels every step."""
    errors: list[Exception] = []

    async def run(step: Callable[[], Awaitable[None]], scope: anyio.CancelScope) -> None:
        try:
            await step()
        except Exception as exc:
            errors.append(exc)
            scope.cancel()

    async with anyio.create_task_group() as tg:
        for step in steps:
            tg.start_soon(run, step, tg.cancel_scope)
    if errors:
        raise errors[0]
