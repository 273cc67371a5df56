"""client.processes: helpers (CNI plugins, skopeo) run from podshimd's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest
import uvloop

from shim.rpc.status import DeadlineExceeded

from client import processes
from client.processes import run

from support.looptools import loop_stalls

#: A daemon this large (podshimd holding many pods): what a fork of it would copy.
BALLAST_BYTES = 512 * 1024 * 1024


def test_starting_helpers_does_not_hold_up_the_event_loop_for_the_size_of_the_daemon() -> None:
    # podshimd runs on uvloop, whose own process spawning forks the whole daemon (its page
    # tables copied while the loop waits); a helper must start as a vfork does, in time that
    # does not grow with the daemon, while the loop serves other calls.
    ballast = bytearray(BALLAST_BYTES)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1  # resident, as a daemon's heap is
    stalls: list[float] = []

    async def main() -> list[tuple[int, bytes, bytes]]:
        async with loop_stalls() as seen:
            done = [await run(["sh", "-c", "cat; echo err >&2; exit 3"], {"PATH": "/usr/bin:/bin"}, b"in", 30, "sh")
                    for _ in range(10)]
        stalls.extend(seen)
        return done

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        done = runner.run(main())
    del ballast
    assert done == [(3, b"in", b"err\n")] * 10
    assert max(stalls) < 0.25, f"the event loop stood still for {max(stalls):.2f} s starting a helper"


def started_helpers(monkeypatch) -> list[subprocess.Popen[bytes]]:
    """Every Popen client.processes makes from now on."""
    made: list[subprocess.Popen[bytes]] = []

    class Recorded(subprocess.Popen[bytes]):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)
    monkeypatch.setattr(subprocess, "Popen", Recorded)  # (the module client.processes runs helpers with)
    return made


@pytest.mark.parametrize("cancels", [[0.0], [0.0, 0.0], [0.05, 0.0], [0.0, 0.001], [0.05, 0.0, 0.0]],
                         ids=["once", "twice-at-once", "twice-while-talking", "twice-while-reaping", "thrice"])
def test_a_helper_whose_caller_is_cancelled_is_killed_reaped_and_its_pipes_closed(monkeypatch, cancels):
    # A pull given up on its progress timeout cancels a skopeo more than once (the timeout, then
    # the pull's own clean-up): however often, by the time the caller sees its cancellation the
    # helper is reaped and no pipe of it is left open.
    made = started_helpers(monkeypatch)

    async def main() -> BaseException | None:
        call = asyncio.ensure_future(run(["sleep", "30"], {"PATH": "/usr/bin:/bin"}, b"", 60, "sleep"))
        for delay in cancels:
            await asyncio.sleep(delay)
            call.cancel()
        await asyncio.wait([call])
        return None if call.cancelled() else call.exception()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(main()) is None  # cancelled, and nothing else
    [helper] = made
    assert helper.returncode == -signal.SIGKILL
    assert helper.stdin.closed and helper.stdout.closed and helper.stderr.closed


@pytest.fixture
def escaped(tmp_path):
    """A helper whose child leaves its process group and holds its pipes for 5 s; the child is
    ended at the test's end. (argv, the file the child's pid is written to)."""
    pidfile = tmp_path / "escaped.pid"
    script = ("import os, sys, time\n"
              "if os.fork() == 0:\n"
              "    os.setsid(); open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(5); os._exit(0)\n"
              "time.sleep(30)\n")
    yield [sys.executable, "-c", script, str(pidfile)], pidfile
    if pidfile.exists():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


@pytest.mark.parametrize("cancels", [[], [0.3], [0.3, 0.0]], ids=["timed-out", "cancelled", "cancelled-twice"])
def test_a_helper_whose_pipes_a_process_that_left_its_group_holds_is_reaped_and_its_pipes_closed_by_its_timeout(
        monkeypatch, escaped, cancels):
    # The escaped process holds the pipes for 5 s. A timed-out helper is reaped, its pipes
    # closed, KILL_WAIT after its timeout; a cancelled one's caller goes on after KILL_WAIT, and
    # the helper is reaped and its pipes closed at its timeout.
    monkeypatch.setattr(processes, "KILL_WAIT", 0.2)
    made = started_helpers(monkeypatch)
    argv, pidfile = escaped

    async def main() -> tuple[float, BaseException | None]:
        started = time.monotonic()
        call = asyncio.ensure_future(run(argv, {}, b"", 2.0, "escaping"))
        for delay in cancels:
            await asyncio.sleep(delay)
            call.cancel()
        await asyncio.wait([call])
        return time.monotonic() - started, None if call.cancelled() else call.exception()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        took, failure = runner.run(main())
    if cancels:
        assert failure is None and took < 1.8  # cancelled, and not held up by the escaped process
    else:
        assert isinstance(failure, DeadlineExceeded)
    [helper] = made
    for _ in range(500):  # its talking thread settles it at its timeout (2 s)
        if helper.returncode is not None and helper.stdout.closed:
            break
        time.sleep(0.01)
    assert helper.returncode == -signal.SIGKILL
    assert helper.stdin.closed and helper.stdout.closed and helper.stderr.closed
