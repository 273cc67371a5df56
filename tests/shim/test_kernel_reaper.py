"""shim.kernel.reaper on the real kernel: one waitpid(-1) owner, no exit ever lost."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
import uvloop

from shim.kernel import linux
from shim.kernel.reaper import ExitInfo, Reaper, exit_status_from_wait
from shim.rpc.status import FailedPrecondition

from support.proctools import wait_gone

WAIT = 5.0  # seconds; a bound for the test, not a readiness sleep


@pytest.fixture
async def spawn(reaper):
    """Start a child with posix_spawn; every child (or adopted orphan) still unreaped at the end
    is killed and reaped."""
    pids = []

    def start(*argv: str, **options) -> int:
        pid = os.posix_spawn(argv[0], list(argv), {}, **options)
        pids.append(pid)
        return pid

    start.adopt = pids.append
    yield start
    for pid in pids:
        exit_future = reaper.watch(pid)
        if not exit_future.done():  # not reaped yet, so the pid is still our child's
            os.kill(pid, signal.SIGKILL)
        await asyncio.wait_for(exit_future, WAIT)


async def test_exit_code_is_reported(reaper, spawn) -> None:
    pid = spawn("/bin/sh", "-c", "exit 7")
    info = await asyncio.wait_for(reaper.watch(pid), WAIT)
    assert (info.pid, info.exit_status) == (pid, 7)


async def test_kill_9_reported_as_137(reaper, spawn) -> None:
    pid = spawn("/bin/sleep", "60")
    exit_future = reaper.watch(pid)
    os.kill(pid, signal.SIGKILL)
    assert (await asyncio.wait_for(exit_future, WAIT)).exit_status == 137


async def test_sigterm_reported_as_143(reaper, spawn) -> None:
    pid = spawn("/bin/sleep", "60")
    exit_future = reaper.watch(pid)
    os.kill(pid, signal.SIGTERM)
    assert (await asyncio.wait_for(exit_future, WAIT)).exit_status == 143


async def test_exit_time_is_wall_clock_of_reaping(reaper, spawn) -> None:
    before = time.time_ns()
    info = await asyncio.wait_for(reaper.watch(spawn("/bin/true")), WAIT)
    assert before <= info.exited_at_ns <= time.time_ns()


async def test_instant_exit_is_not_lost(reaper, spawn) -> None:
    pid = spawn("/bin/true")
    assert not wait_gone(pid)  # blocking: the loop, and the reaper on it, must not run meanwhile
    assert [info.pid for info in reaper.reap()] == [pid]  # reaped before anyone watched
    exit_future = reaper.watch(pid)
    assert exit_future.done()
    assert exit_future.result().exit_status == 0


async def test_several_watchers_all_get_the_exit(reaper, spawn) -> None:
    pid = spawn("/bin/sh", "-c", "exit 3")
    early = [reaper.watch(pid), reaper.watch(pid)]
    first = await asyncio.wait_for(early[0], WAIT)
    late = reaper.watch(pid)
    assert late.done()
    assert {early[1].result(), late.result()} == {first}


async def test_cancelled_watcher_does_not_disturb_others(reaper, spawn) -> None:
    pid = spawn("/bin/sleep", "60")
    cancelled, kept = reaper.watch(pid), reaper.watch(pid)
    cancelled.cancel()
    os.kill(pid, signal.SIGKILL)
    assert (await asyncio.wait_for(kept, WAIT)).exit_status == 137


async def test_kept_exit_is_not_given_to_a_newer_child_with_the_same_pid(reaper, spawn) -> None:
    pid = spawn("/bin/sleep", "60")
    # Simulate pid reuse: a kept exit for a pid that now belongs to a live child of ours.
    reaper._exits[pid] = ExitInfo(pid, 0, 0)
    exit_future = reaper.watch(pid)
    assert not exit_future.done()
    os.kill(pid, signal.SIGKILL)
    assert (await asyncio.wait_for(exit_future, WAIT)).exit_status == 137


async def test_kept_exits_are_bounded() -> None:
    reaper = Reaper(max_kept_exits=2)
    reaper.install()
    try:
        pids = [os.posix_spawn("/bin/true", ["/bin/true"], {}) for _ in range(3)]
        assert not wait_gone(*pids)  # exited, not reaped: the reaper runs only on the loop
        reaper.reap()
        oldest = reaper.watch(pids[0])
        assert not oldest.done()
        oldest.cancel()
        assert all(reaper.watch(pid).done() for pid in pids[1:])
    finally:
        reaper.uninstall()


async def test_orphaned_grandchild_is_reaped_by_the_subreaper(reaper, spawn):
    read_fd, write_fd = os.pipe()
    try:
        # sh starts a sleep in the background, prints its pid and exits: the sleep is orphaned.
        pid = spawn("/bin/sh", "-c", "/bin/sleep 60 & echo $!", file_actions=[(os.POSIX_SPAWN_DUP2, write_fd, 1)])
    finally:
        os.close(write_fd)
    try:
        grandchild = int(os.read(read_fd, 64))
    finally:
        os.close(read_fd)
    spawn.adopt(grandchild)
    assert (await asyncio.wait_for(reaper.watch(pid), WAIT)).exit_status == 0
    grandchild_exit = reaper.watch(grandchild)
    assert linux.proc_stat(grandchild)[linux.STAT_PPID - 1] == str(os.getpid())
    os.kill(grandchild, signal.SIGKILL)  # unreaped, so still the orphan we were given
    assert (await asyncio.wait_for(grandchild_exit, WAIT)).exit_status == 137


async def test_only_one_reaper_per_process(reaper) -> None:
    with pytest.raises(FailedPrecondition):
        Reaper().install()


async def test_watch_needs_an_installed_reaper() -> None:
    with pytest.raises(FailedPrecondition):
        Reaper().watch(os.getpid())


async def test_uninstall_restores_the_subreaper_flag() -> None:
    assert not linux.get_child_subreaper()
    reaper = Reaper()
    reaper.install()
    assert linux.get_child_subreaper()
    reaper.uninstall()
    assert not linux.get_child_subreaper()
    reaper.uninstall()  # idempotent


def test_reaper_works_on_uvloop() -> None:
    async def scenario() -> int:
        reaper = Reaper()
        reaper.install()  # uvloop refuses add_signal_handler(SIGCHLD): the fallback must work
        try:
            pid = os.posix_spawn("/bin/sh", ["/bin/sh", "-c", "exit 9"], {})
            return (await asyncio.wait_for(reaper.watch(pid), WAIT)).exit_status
        finally:
            reaper.uninstall()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(scenario()) == 9
    assert signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL


@pytest.mark.parametrize(
    "status, expected",
    [(0, 0), (3 << 8, 3), (255 << 8, 255), (signal.SIGKILL, 137), (signal.SIGTERM, 143)],
)
def test_exit_status_from_wait(status, expected) -> None:
    assert exit_status_from_wait(status) == expected


def test_exit_status_of_a_stopped_child_is_an_error() -> None:
    with pytest.raises(ValueError):
        exit_status_from_wait(0x137F)  # WIFSTOPPED by SIGSTOP
