"""shim.runtime.execsync: a command's output, exit, timeout and cancellation, with real processes
launched into a real cgroup (no namespaces: what is specific to tasks is tested in test_shim_tasks)."""

from __future__ import annotations

import asyncio
import os
import secrets

import pytest

from shim.kernel.cgroups import SandboxCgroup
from shim.kernel.reaper import Reaper
from shim.rpc.status import FailedPrecondition
from shim.runtime import execsync, process
from shim.runtime.execsync import EXEC_OUTPUT_LIMIT_BYTES, ExecOutput, ExecResult

from support.proctools import wait_gone_async

#: Bound on waiting for killed processes to be gone (an event wait, not a sleep).
GONE_WAIT = 10.0


@pytest.fixture
def cgroup():
    made = SandboxCgroup.create(f"podshim-test-exec-{os.getpid()}-{secrets.token_hex(4)}",
                                f"podshim-test-parent-{secrets.token_hex(4)}")
    yield made
    made.kill_all()
    made.remove()
    for path in made.paths.values():
        try:
            os.rmdir(os.path.dirname(path))
        except OSError:
            pass


def starter(reaper: Reaper, cgroup: SandboxCgroup, *argv: str, started: list | None = None):
    """What a runtime does for an exec: launch ``argv`` in the cgroup with the exec's pipes."""
    async def start(output: ExecOutput) -> process.Process:
        proc = await process.launch(process.ProcessSpec(
            name="exec", argv=argv, env={"PATH": process.DEFAULT_PATH}, procs_files=tuple(cgroup.procs_files()),
            stdout=output.stdout_fd, stderr=output.stderr_fd), reaper)
        if started is not None:
            started.append(proc)
        return proc
    return start


async def test_stdout_stderr_and_exit_status_are_returned(reaper, cgroup) -> None:
    result = await execsync.run(starter(reaper, cgroup, "sh", "-c", "echo out; echo err >&2; exit 3"), cgroup,
                                timeout=None, name="exec")
    assert result == ExecResult(3, b"out\n", b"err\n")


async def test_output_past_the_limit_is_read_dropped_and_flagged(reaper, cgroup) -> None:
    size = EXEC_OUTPUT_LIMIT_BYTES + 100_000
    result = await execsync.run(starter(reaper, cgroup, "head", "-c", str(size), "/dev/zero"), cgroup,
                                timeout=None, name="exec")
    assert (result.exit_status, len(result.stdout), result.stdout_truncated) == (0, EXEC_OUTPUT_LIMIT_BYTES, True)
    assert not result.stderr_truncated


async def test_a_timeout_kills_the_command_and_what_it_started_in_its_session(reaper, cgroup) -> None:
    script = "echo started; sleep 100 & sleep 100 & wait"
    result = await execsync.run(starter(reaper, cgroup, "sh", "-c", script), cgroup, timeout=0.5, name="exec")
    assert (result.timed_out, result.exit_status, result.stdout) == (True, 137, b"started\n")
    assert await wait_gone_async(*cgroup.pids(), timeout=GONE_WAIT) == []
    assert cgroup.pids() == set()


async def test_a_process_in_another_session_survives_the_timeout(reaper, cgroup) -> None:
    result = await execsync.run(starter(reaper, cgroup, "sh", "-c", "setsid sleep 100 </dev/null >/dev/null 2>&1 & "
                                                                  "sleep 100"), cgroup, timeout=0.5, name="exec")
    assert result.timed_out
    assert len(cgroup.pids()) == 1  # the task's own kind of process: left alone (the fixture kills it)


async def test_a_background_process_holding_the_output_delays_the_answer_only_so_long(reaper, cgroup, monkeypatch) -> None:
    monkeypatch.setattr(execsync, "EXEC_DRAIN_SECS", 0.2)
    result = await execsync.run(starter(reaper, cgroup, "sh", "-c", "echo hi; sleep 100 &"), cgroup, timeout=None,
                                name="exec")
    assert result == ExecResult(0, b"hi\n", b"")
    assert len(cgroup.pids()) == 1  # the sleep: the exec's, but not killed (containerd leaves it too)


async def test_a_cancelled_exec_kills_the_command(reaper, cgroup) -> None:
    started: list[process.Process] = []
    ready = asyncio.get_running_loop().create_future()

    async def start(output: ExecOutput) -> process.Process:
        proc = await starter(reaper, cgroup, "sleep", "100", started=started)(output)
        ready.set_result(None)
        return proc

    running = asyncio.ensure_future(execsync.run(start, cgroup, timeout=None, name="exec"))
    await ready
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert (await asyncio.wait_for(started[0].exit, GONE_WAIT)).exit_status == 137


async def test_a_command_that_cannot_start_leaves_no_pipe_open(reaper, cgroup) -> None:
    fds = set(os.listdir("/proc/self/fd"))

    async def fail(output: ExecOutput) -> process.Process:
        raise FailedPrecondition("exec /no/such: No such file or directory")

    with pytest.raises(FailedPrecondition):
        await execsync.run(fail, cgroup, timeout=1, name="exec")
    assert set(os.listdir("/proc/self/fd")) == fds
