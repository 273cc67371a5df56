"""Running a helper program (a CNI plugin, skopeo) to its end, bounded in time.

:func:`run` execs it in a session of its own with a clean environment the caller gives, feeds its
stdin, collects stdout and stderr, and kills its whole process group when it overruns its
timeout (DeadlineExceeded), when the caller is cancelled, or when anything fails: nothing it
started stays behind.

The helper is started by :class:`subprocess.Popen`, which uses vfork: the event loop stands still
for well under a millisecond per helper. The event loop's own process spawning (uvloop's
``fork``) copies the page tables of the whole daemon and held the loop for tens of milliseconds
per helper, two plugins per pod. Its input and output go through a worker thread of
:data:`HELPER_THREADS`, apart from anyio's default ones (which the pod store's writes use).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading

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
    # unless a cancellation came before talk's thread started, which then never runs it).
    reader, read = threading.Lock(), threading.Event()

    def talk() -> tuple[bytes, bytes]:
        if not reader.acquire(blocking=False):
            raise anyio.get_cancelled_exc_class()()
        try:
            return process.communicate(stdin, timeout)
        finally:
            read.set()

    def finish() -> None:
        """Read what the killed helper left in its pipes, close them and reap it; or wait for
        talk to do so. At most KILL_WAIT: a process that left its group may hold them open."""
        if reader.acquire(blocking=False) or read.is_set():
            try:
                process.communicate(timeout=KILL_WAIT)
            except subprocess.TimeoutExpired:
                pass
        else:
            read.wait(KILL_WAIT)

    finished = False
    try:
        try:
            # Abandoned when we are cancelled: the group is killed below, its pipes close, and
            # the thread's communicate ends (and reaps it) with it.
            out, err = await anyio.to_thread.run_sync(talk, abandon_on_cancel=True, limiter=_threads())
        except subprocess.TimeoutExpired:
            raise DeadlineExceeded(f"{what} did not finish within {timeout:g} s; it was killed") from None
        finished = True
    finally:
        if not finished:  # timed out, cancelled or failed: nothing of it may stay behind
            kill_group(process)
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(finish, limiter=_threads())
    return process.returncode, out, err
