"""Running a helper program (a CNI plugin, skopeo) to its end, bounded in time.

:func:`run` execs it in a session of its own with a clean environment the caller gives, feeds its
stdin, collects stdout and stderr, and kills its whole process group when it overruns its
timeout (DeadlineExceeded), when the caller is cancelled, or when anything fails: nothing it
started stays behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

import anyio
from anyio.abc import Process

from shim.rpc.status import DeadlineExceeded, Internal

__all__ = ["KILL_WAIT", "run", "kill_group"]

#: How long to wait for a killed helper to be reaped (and, in CNI, for the DELs that undo a failed ADD).
KILL_WAIT = 5.0


def kill_group(process: Process) -> None:
    """SIGKILL the process group of ``process`` (started with start_new_session), if any is left."""
    # The helper's pid is its group id. The group may outlive the helper (a child still holding
    # stdout is why we timed out), and a pid is not reused while a group of that id has members;
    # only a group that is already empty could be a new process's, which a sequential pid
    # allocator makes a matter of wrapping pid_max within these few milliseconds.
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


async def run(argv: list[str], env: dict[str, str], stdin: bytes, timeout: float,
        what: str) -> tuple[int, bytes, bytes]:
    """Run ``argv`` with ``stdin``; (exit status, stdout, stderr). Kills its process group on
    timeout (DeadlineExceeded) or cancellation."""
    out, err = bytearray(), bytearray()
    finished = False

    async def drain(stream: Any, buffer: bytearray) -> None:
        async for chunk in stream:
            buffer += chunk

    try:
        # A session of its own: on timeout the whole group goes (a helper that is a shell script
        # leaves its children behind if only the shell is killed).
        process = await anyio.open_process(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, env=env, start_new_session=True)
    except OSError as exc:  # not the errno's code: a NOT_FOUND here would read as "no such pod"
        raise Internal(f"{what}: cannot run {argv[0]!r}: {exc.strerror or exc}") from None
    try:
        with anyio.fail_after(timeout):
            async with anyio.create_task_group() as tg:
                tg.start_soon(drain, process.stdout, out)
                tg.start_soon(drain, process.stderr, err)
                assert process.stdin is not None  # opened with stdin=PIPE
                try:
                    await process.stdin.send(stdin)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    pass  # it exited without reading its input; its exit status tells why
                await process.stdin.aclose()
            returncode = await process.wait()
            finished = True
    except TimeoutError:
        raise DeadlineExceeded(f"{what} did not finish within {timeout:g} s; it was killed") from None
    finally:
        if not finished:  # timed out, cancelled or failed: nothing of it may stay behind
            kill_group(process)
        with anyio.CancelScope(shield=True), anyio.move_on_after(KILL_WAIT):
            await process.aclose()
    return returncode, bytes(out), bytes(err)
