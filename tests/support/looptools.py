"""How long an event loop stood still while a test's block ran: a task that ticks and records
the time between its ticks."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

#: How often the ticking task asks to run again (s).
TICK = 0.005


@asynccontextmanager
async def loop_stalls() -> AsyncIterator[list[float]]:
    """While the block runs, a task ticks every :data:`TICK`; yields the list (filled as it
    runs) of the seconds between its ticks. Its max is the longest the loop stood still."""
    stalls: list[float] = []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await anyio.sleep(TICK)
            now = time.monotonic()
            stalls.append(now - last)
            last = now

    async with anyio.create_task_group() as tg:
        tg.start_soon(tick)
        yield stalls
        tg.cancel_scope.cancel()
