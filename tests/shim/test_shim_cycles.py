"""Many whole sandbox lives, a few at a time, then a leak check that fails on anything left over."""

from __future__ import annotations

import asyncio
import os

import pytest

from support.shimtools import (
    Footprint,
    ProcessRef,
    ShimLauncher,
    child_pids,
    host_untouched,  # noqa: F401  (autouse: what this module's shims made is checked at the end)
    leftovers,
)

# Each test runs twice: shims exec'd by `podshim start`, and forked by the session's template.
pytestmark = pytest.mark.usefixtures("spawn_mode")

CYCLES = 100
CONCURRENCY = 4


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


async def _cycle(shims: ShimLauncher):
    """start, CreateSandbox, StartSandbox, StopSandbox, ShutdownSandbox; returns (shim, what it left)."""
    shim = await shims.start()
    pause = ProcessRef(await shim.run_sandbox())
    try:
        await shim.call("StopSandbox", timeout_secs=10)
        assert pause.has_exited()
    finally:
        pause.close()
    await shim.call("ShutdownSandbox")
    await shim.process.exited()
    return shim, await shims.end(shim)


@pytest.mark.slow
async def test_100_cycles_leave_nothing_behind(shims):
    fds, children = _open_fds(), child_pids()
    limit = asyncio.Semaphore(CONCURRENCY)

    async def one():
        async with limit:
            return await _cycle(shims)

    async with asyncio.TaskGroup() as group:  # one failure cancels the rest; teardown ends them all
        tasks = [group.create_task(one()) for _ in range(CYCLES)]
    results = [task.result() for task in tasks]

    assert [left for _, left in results if left] == []
    assert leftovers([Footprint.of_bundle(shim.bundle) for shim, _ in results]) == []
    for shim, _ in results:
        assert os.listdir(os.path.dirname(shim.socket_path)) == []
    assert child_pids() - children == set()
    assert _open_fds() == fds
