"""ExecSync: a command run beside a task until it exits, its output collected, under a timeout.

Whoever runs the task's processes (the native launcher, or an OCI runtime's ``exec``) starts
the command with the two write ends of :class:`ExecOutput` as its stdout and stderr; :func:`run`
owns everything after that: the output (the first :data:`EXEC_OUTPUT_LIMIT_BYTES` of each
stream are kept, the rest is read and dropped so the command never blocks on a full pipe), the
timeout, and the end. A command that times out, or whose caller is cancelled, is killed with
its session: every process of the task's cgroup whose session is the command's (what it started
stays in its session unless it made one of its own). The native launcher and runc make the
command a session leader; crun leaves it in the session of the crun that started it, which
exited: its id is then read from the command when it starts.

A command that exited but left a background process holding its stdout or stderr is answered
:data:`EXEC_DRAIN_SECS` after its exit with what was read; that process is left alone, as
containerd leaves the processes an exec started.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from shim.kernel import linux
from shim.kernel.cgroups import SandboxCgroup
from shim.lib.pipes import PipeReader
from shim.rpc.status import RpcError, Unavailable
from shim.runtime import process

__all__ = ["EXEC_DRAIN_SECS", "EXEC_KILL_WAIT", "EXEC_OUTPUT_LIMIT_BYTES", "ExecOutput", "ExecResult", "run",
           "kill_session", "session_of"]

#: The most of each of stdout and stderr an Exec answers with: both fit one frame (4 MiB) with
#: room to spare. containerd keeps 16 MiB per stream, kubelet's gRPC message limit.
EXEC_OUTPUT_LIMIT_BYTES = 1024 * 1024
#: After the command exited, how long (seconds) its output may stay open before Exec answers.
EXEC_DRAIN_SECS = 2.0
#: After SIGKILL, how long (seconds) the command may take to exit before Exec gives up on it.
EXEC_KILL_WAIT = 10.0


@dataclass(frozen=True)
class ExecResult:
    """How an exec ended: its exit status (3.3), what it wrote, and whether the timeout killed it."""

    exit_status: int
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False

    def payload(self) -> dict[str, Any]:
        """The Exec response (protocol.md 7.3)."""
        return {"exit_status": self.exit_status, "stdout": self.stdout, "stderr": self.stderr,
                "stdout_truncated": self.stdout_truncated, "stderr_truncated": self.stderr_truncated,
                "timed_out": self.timed_out}


class _Capped:
    """The first ``limit`` bytes of a stream; whether more came."""

    def __init__(self, limit: int):
        self.limit = limit
        self.data = bytearray()
        self.truncated = False

    def feed(self, chunk: bytes) -> None:
        room = self.limit - len(self.data)
        if len(chunk) > room:
            self.truncated = True
        if room > 0:
            self.data += chunk[:room]


class ExecOutput:
    """The stdout and stderr pipes of one exec. :attr:`stdout_fd` and :attr:`stderr_fd` are the
    write ends for the command; :meth:`start` (once it runs) closes them here and reads the pipes
    on the loop; :meth:`close` is the one cleanup path. Raises OSError when no pipe can be made."""

    def __init__(self, limit: int = EXEC_OUTPUT_LIMIT_BYTES):
        self._fds: list[int] = []
        self._readers: list[PipeReader] = []
        self.stdout, self.stderr = _Capped(limit), _Capped(limit)
        try:
            for _ in range(2):
                self._fds.extend(os.pipe2(os.O_CLOEXEC))
        except BaseException:
            self.close()
            raise
        self._stdout_r, self.stdout_fd, self._stderr_r, self.stderr_fd = self._fds

    def start(self) -> None:
        """Close the command's ends here and read both pipes on the running loop."""
        loop = asyncio.get_running_loop()
        for fd in (self.stdout_fd, self.stderr_fd):
            self._fds.remove(fd)
            os.close(fd)
        self._readers = [PipeReader(loop, self._stdout_r, self.stdout.feed, name="an exec's stdout"),
                         PipeReader(loop, self._stderr_r, self.stderr.feed, name="an exec's stderr")]

    async def drain(self, timeout: float) -> None:
        """Wait until both pipes reached EOF, at most ``timeout`` seconds; then close them."""
        pending = [reader.eof for reader in self._readers if not reader.eof.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout)
        self.close()

    def close(self) -> None:
        """Read what the pipes hold, stop reading and close them. Idempotent."""
        for reader in self._readers:
            reader.stop()
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


async def run(start: Callable[[ExecOutput], Awaitable[process.Process]], cgroup: SandboxCgroup, *,
              timeout: float | None, name: str) -> ExecResult:
    """Start the command with ``start(output)`` and return how it ended.

    ``cgroup`` is the task's: where the command's session is looked for when it must be killed.
    ``timeout`` (seconds, None: none) bounds the command's life. Raises what ``start`` raises
    (nothing is left behind), or Unavailable when the killed command does not exit within
    :data:`EXEC_KILL_WAIT`. ``name`` names the command in errors.
    """
    output = ExecOutput()
    try:
        leader = await start(output)
        # The command's session: its own (it leads one, as the launcher and runc make it), or
        # the one of the runtime that started it (crun exec calls no setsid).
        session = session_of(leader.pid) or leader.pid
        output.start()
        timed_out = False
        try:
            info = await asyncio.wait_for(asyncio.shield(leader.exit), timeout)
        except TimeoutError:
            timed_out = not leader.exit.done()
            if timed_out:
                kill_session(leader, session, cgroup)
            try:
                info = await asyncio.wait_for(asyncio.shield(leader.exit), EXEC_KILL_WAIT)
            except TimeoutError:
                raise Unavailable(f"{name} (pid {leader.pid}) did not exit {EXEC_KILL_WAIT:.0f}s after SIGKILL") \
                    from None
        except BaseException:  # cancelled: the caller went away or its deadline passed
            if not leader.exit.done():
                kill_session(leader, session, cgroup)
            raise
        await output.drain(EXEC_DRAIN_SECS)
    finally:
        output.close()
    return ExecResult(info.exit_status, bytes(output.stdout.data), bytes(output.stderr.data),
                      output.stdout.truncated, output.stderr.truncated, timed_out)


def kill_session(leader: process.Process, session: int, cgroup: SandboxCgroup) -> None:
    """SIGKILL ``leader``, then every process of ``cgroup`` in ``session``, until none is new.

    The leader goes first: killed after the processes it waits for, it could see them die and
    exit on its own before its SIGKILL came. Call this before the leader is reaped: until then
    its pid, when it is its session's id, cannot name another process.
    """
    process.signal_process(leader.pid, leader.start_time, signal.SIGKILL)
    signalled = {leader.pid}
    while True:
        try:
            members = cgroup.pids()
        except RpcError:
            members = set()
        fresh = {pid for pid in members if session_of(pid) == session} - signalled
        if not fresh:
            break
        for pid in fresh:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        signalled |= fresh


def session_of(pid: int) -> int | None:
    """The session id of process ``pid``, or None when it is gone."""
    stat = linux.proc_stat(pid)
    return int(stat[linux.STAT_SESSION - 1]) if stat is not None else None
