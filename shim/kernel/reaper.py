"""The one owner of ``waitpid(-1)`` in the shim process.

The shim is a child subreaper: the pause task (a grandchild, see :mod:`shim.runtime.pause`) and any
orphan below it become the shim's children, and something must reap them. Exactly one piece of
code may call ``waitpid(-1)``; two reapers steal exits from each other. So nothing else in the
shim may wait for children: no ``asyncio.create_subprocess_*`` (its child watcher would race us),
no ``subprocess`` from a worker thread. A synchronous ``subprocess.run`` on the loop's own thread
is harmless: it reaps its child before the loop can run :meth:`Reaper.reap`.

As in containerd's ``pkg/sys/reaper``, an exit is never lost: every exit is kept (the newest
:data:`MAX_KEPT_EXITS`), so :meth:`Reaper.watch` may be called after the pid was reaped. That
matters for pids learned late, such as the pause grandchild whose pid arrives through a pipe.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from shim.kernel import linux
from shim.rpc.records import Record
from shim.rpc.records import set_field as _set
from shim.rpc.status import FailedPrecondition

__all__ = ["MAX_KEPT_EXITS", "ExitInfo", "Reaper", "exit_status_from_wait"]

MAX_KEPT_EXITS = 1024

_installed: Reaper | None = None


class ExitInfo(Record):
    """How a child ended.

    ``exit_status`` is the exit code (0–255) when the process exited, or 128 + the signal number
    when a signal killed it (137 for SIGKILL, 143 for SIGTERM), like a shell's ``$?``.
    ``exited_at_ns`` is the wall clock (``time.time_ns()``) when the shim reaped it, which is
    within one loop iteration of the exit itself.
    """

    __slots__ = ("pid", "exit_status", "exited_at_ns")
    pid: int
    exit_status: int
    exited_at_ns: int

    def __init__(self, pid: int, exit_status: int, exited_at_ns: int) -> None:
        _set(self, "pid", pid)
        _set(self, "exit_status", exit_status)
        _set(self, "exited_at_ns", exited_at_ns)


def exit_status_from_wait(status: int) -> int:
    """The shell-style exit status of a ``waitpid`` status: the code, or 128 + the killing signal.

    Raises ValueError for a stop/continue status (never seen without WUNTRACED/WCONTINUED).
    """
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    raise ValueError(f"wait status {status:#x} is neither an exit nor a kill")


def _is_live_child(pid: int) -> bool:
    stat = linux.proc_stat(pid)
    return stat is not None and int(stat[linux.STAT_PPID - 1]) == os.getpid()


class Reaper:
    """Reaps every child of the shim and hands each exit to whoever watches its pid.

    Install it on the loop before the first fork; keep it installed while children live.
    """

    def __init__(self, *, max_kept_exits: int = MAX_KEPT_EXITS):
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watchers: dict[int, list[asyncio.Future[ExitInfo]]] = {}
        self._exits: collections.OrderedDict[int, ExitInfo] = collections.OrderedDict()
        self._max_kept_exits = max_kept_exits
        self._was_subreaper = False
        self._previous_handler: signal.Handlers | Callable[[int, FrameType | None], Any] | int | None = None

    @property
    def installed(self) -> bool:
        return self._loop is not None

    def install(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Become a child subreaper and reap on every SIGCHLD delivered to ``loop`` (asyncio or uvloop).

        ``loop`` defaults to the running loop. Reaps once right away, for children that exited
        before. Raises FailedPrecondition if a Reaper is already installed in this process.
        """
        global _installed
        if _installed is not None:
            raise FailedPrecondition("a Reaper is already installed: one owner of waitpid(-1) per process")
        loop = loop or asyncio.get_running_loop()
        self._was_subreaper = linux.get_child_subreaper()
        linux.set_child_subreaper(True)
        try:
            try:
                loop.add_signal_handler(signal.SIGCHLD, self.reap)
            except RuntimeError:
                # uvloop refuses SIGCHLD ("used by the event loop to track subprocesses"). A
                # plain Python handler works there: uvloop always installs a signal wakeup fd
                # and runs Python-level handlers when it wakes.
                self._previous_handler = signal.signal(signal.SIGCHLD, self._on_sigchld)
        except BaseException:
            linux.set_child_subreaper(self._was_subreaper)
            raise
        self._loop = loop
        _installed = self
        self.reap()

    def _on_sigchld(self, signum: int, frame: FrameType | None) -> None:
        # A Python signal handler may run between any two bytecodes of the loop's thread:
        # defer the reaping to a loop callback rather than touch the watchers from here.
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.reap)

    def uninstall(self) -> None:
        """Stop reaping and restore the subreaper flag. Idempotent.

        Watchers still pending stay pending; a later :meth:`install` resolves them.
        """
        global _installed
        if _installed is not self or self._loop is None:
            return
        if self._previous_handler is not None:
            signal.signal(signal.SIGCHLD, self._previous_handler)
            self._previous_handler = None
        elif not self._loop.is_closed():
            self._loop.remove_signal_handler(signal.SIGCHLD)
        linux.set_child_subreaper(self._was_subreaper)
        self._loop = None
        _installed = None

    def reap(self) -> list[ExitInfo]:
        """Collect every child that has exited (``waitpid(-1, WNOHANG)`` until none) and resolve watchers.

        SIGCHLD signals coalesce, so one call must drain them all. Returns the exits collected.
        """
        collected = []
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            info = ExitInfo(pid, exit_status_from_wait(status), time.time_ns())
            collected.append(info)
            self._exits[pid] = info
            self._exits.move_to_end(pid)
            while len(self._exits) > self._max_kept_exits:
                self._exits.popitem(last=False)
            for future in self._watchers.pop(pid, ()):
                if not future.done():
                    future.set_result(info)
        return collected

    def watch(self, pid: int) -> asyncio.Future[ExitInfo]:
        """A future that resolves with the exit of child ``pid``, even if it was already reaped.

        Any number of watchers of one pid all get the same ExitInfo. Cancelling the future only
        drops that watcher. Raises FailedPrecondition when the reaper is not installed.
        """
        if self._loop is None:
            raise FailedPrecondition("the reaper is not installed")
        future: asyncio.Future[ExitInfo] = self._loop.create_future()
        info = self._exits.get(pid)
        if info is not None:
            # A kept exit is stale if the pid was reused by a newer child of ours (pid_max is
            # only 32768 on some machines): /proc/PID then exists with us as its parent. A pid
            # reused by someone else's process does not make our record wrong.
            if not _is_live_child(pid):
                future.set_result(info)
                return future
            del self._exits[pid]
        self._watchers.setdefault(pid, []).append(future)
        future.add_done_callback(lambda f: self._forget(pid, f))
        return future

    def _forget(self, pid: int, future: asyncio.Future[ExitInfo]) -> None:
        watchers = self._watchers.get(pid)
        if watchers and future in watchers:
            watchers.remove(future)
            if not watchers:
                del self._watchers[pid]
