"""Running a helper program (a CNI plugin, skopeo) to its end, bounded in time.

:func:`run` execs it in a session of its own with a clean environment the caller gives, feeds its
stdin, collects stdout and stderr, and kills its whole process group when it overruns its
timeout (DeadlineExceeded), when the caller is cancelled, or when anything fails: nothing it
started stays behind. By the time :func:`run` returns or raises, however often its caller was
cancelled meanwhile, the helper is reaped and its pipes are closed; only where a process that
left the helper's group holds its pipes does that wait until the helper's own timeout.

The helper is started by :class:`subprocess.Popen`, which uses vfork: the event loop stands still
for well under a millisecond per helper. The event loop's own process spawning (uvloop's
``fork``) copies the page tables of the whole daemon and held the loop for tens of milliseconds
per helper, two plugins per pod. Its input and output go through a worker thread of
:data:`HELPER_THREADS`, apart from anyio's default ones (which the pod store's writes use).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable

import anyio
import anyio.to_thread

from shim.rpc.status import DeadlineExceeded, Internal

__all__ = ["HELPER_THREADS", "KILL_WAIT", "run", "kill_group"]

#: How long to wait for a killed helper to be reaped (and, in CNI, for the DELs that undo a failed ADD).
KILL_WAIT = 5.0
#: How many helpers' input and output are served at once (each by a thread that waits on its pipes).
HELPER_THREADS = 128

_limiter: anyio.CapacityLimiter | None = None


def _threads() -> anyio.CapacityLimiter:
    global _limiter
    if _limiter is None:
        _limiter = anyio.CapacityLimiter(HELPER_THREADS)
    return _limiter


def kill_group(process: subprocess.Popen[bytes]) -> None:
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
    try:
        # A session of its own: on timeout the whole group goes (a helper that is a shell script
        # leaves its children behind if only the shell is killed).
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   env=env, start_new_session=True)
    except OSError as exc:  # not the errno's code: a NOT_FOUND here would read as "no such pod"
        raise Internal(f"{what}: cannot run {argv[0]!r}: {exc.strerror or exc}") from None
    # One thread reads its pipes and reaps it: the one that takes ``reader`` first (talk,
    # unless a cancellation came before talk's thread started, which then never runs it). It
    # reaps it whatever happens, and closes its pipes, before it lets ``read`` go.
    reader, read = threading.Lock(), threading.Event()

    def settle() -> None:
        """Kill what is left of the group, read what it left in the pipes and reap it. A process
        that left the group may hold the pipes open: after KILL_WAIT ours are closed anyway."""
        kill_group(process)
        try:
            process.communicate(timeout=KILL_WAIT)
        except subprocess.TimeoutExpired:
            for pipe in (process.stdin, process.stdout, process.stderr):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
            process.wait()  # the helper itself is gone with its group: it cannot leave its own session

    def talk() -> tuple[bytes, bytes]:
        if not reader.acquire(blocking=False):
            raise anyio.get_cancelled_exc_class()()
        try:
            return process.communicate(stdin, timeout)
        except BaseException:
            settle()
            raise
        finally:
            read.set()

    def finish() -> None:
        """Kill the helper and reap it; or let talk, which reads its pipes, do so, and wait for
        that at most KILL_WAIT. (Longer only when a process that left the group holds the
        pipes: talk then settles it at its timeout.)"""
        kill_group(process)
        if reader.acquire(blocking=False):
            settle()
        else:
            read.wait(KILL_WAIT)

    try:
        try:
            # Abandoned when we are cancelled: finish kills the group, its pipes close, and
            # talk's communicate ends (and reaps it) with it.
            out, err = await anyio.to_thread.run_sync(talk, abandon_on_cancel=True, limiter=_threads())
        except subprocess.TimeoutExpired:
            raise DeadlineExceeded(f"{what} did not finish within {timeout:g} s; it was killed") from None
    except BaseException as exc:  # timed out, cancelled or failed: nothing of it may stay behind
        if await _unfailing(finish) and not isinstance(exc, asyncio.CancelledError):
            raise asyncio.CancelledError() from exc  # cancelled meanwhile: that outranks the failure
        raise
    return process.returncode, out, err


async def _unfailing(job: Callable[[], None]) -> bool:
    """Run ``job`` in a thread of its own and wait for it, whatever cancellations come meanwhile;
    whether one came (the caller raises it once ``job`` is done).

    A worker of anyio's would skip a job whose waiter was cancelled before the worker took it,
    and anyio's shield does not hold off asyncio's own ``Task.cancel``: a helper killed on a
    cancellation that came twice stayed unreaped, its pipes open."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def report() -> None:
        if not done.done():
            done.set_result(None)

    def work() -> None:
        try:
            job()
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(report)
    threading.Thread(target=work, name="helper-reaper", daemon=True).start()
    cancelled = False
    while not done.done():
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            cancelled = True
    return cancelled
