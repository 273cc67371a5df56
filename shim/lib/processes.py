"""A process named for its whole life: its pid and start time, read from /proc, and its pidfd.

A pid alone names whichever process holds it now; the pid and the start time (field 22 of
/proc/PID/stat, clock ticks since boot) name one process across pid reuse. Deciding that a
process is still the one we mean and then acting on it by pid leaves a window in which it may
exit and its pid go to a newcomer, so anything that acts goes through a pidfd: opened first, it
pins that one process, and the start time is compared after (:func:`open_pidfd`).

Here, where both sides may import it (stdlib only): the shim signals its pauses and tasks and
``podshim delete`` kills what a dead shim left; the Controller tells a dead shim from a slow one.
"""

from __future__ import annotations

import errno
import os
import select
import signal

from shim.lib.files import read_file

__all__ = [
    "STAT_PPID",
    "STAT_SESSION",
    "STAT_STARTTIME",
    "STAT_STATE",
    "open_pidfd",
    "pidfd_exited",
    "process_exiting",
    "proc_start_time",
    "proc_stat",
    "read_status",
    "status_mask",
    "process_alive",
    "signal_process",
    "wait_gone",
    "wait_pidfd",
]

# Field numbers of /proc/PID/stat (proc(5)).
STAT_STATE = 3
STAT_PPID = 4
STAT_SESSION = 6
STAT_FLAGS = 9
STAT_STARTTIME = 22
STAT_SIGNAL = 31  # the task's pending signals (the low 31)

#: The kernel's PF_EXITING task flag (<linux/sched.h>): set as a process starts to exit, before
#: it closes its files, so a peer that sees the connection end can tell a dying process.
_PF_EXITING = 0x00000004

#: States of a process that has exited (zombie, dead): its pid is still taken, it runs no more.
_EXITED_STATES = ("Z", "X")


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat, numbered as in proc(5) from 1 (so field n is ``[n - 1]``).

    None when the process is gone. The command name (field 2) may contain spaces and
    parentheses, so it is cut out at the *last* ")" rather than split on blanks.
    """
    try:
        line = read_file(f"/proc/{pid}/stat").decode("utf-8", "surrogateescape")
    except (FileNotFoundError, ProcessLookupError):
        return None
    head, _, tail = line.rpartition(")")
    pid_field, _, comm = head.partition(" (")
    return [pid_field, comm, *tail.split()]


def proc_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat), or None if gone.

    Together with the pid it names one process for its whole life, across pid reuse.
    """
    stat = proc_stat(pid)
    return int(stat[STAT_STARTTIME - 1]) if stat is not None else None


def _is(stat: list[str] | None, start_time: int | None) -> bool:
    """Whether a stat line is of a running process that started at ``start_time`` (any, if None)."""
    if stat is None or stat[STAT_STATE - 1] in _EXITED_STATES:
        return False
    return start_time is None or int(stat[STAT_STARTTIME - 1]) == start_time


def process_alive(pid: int | None, start_time: int | None) -> bool:
    """True if ``pid`` runs (not a zombie) and, when ``start_time`` is given, started then.

    A stopped process (SIGSTOP) is alive. Only for looking: to act on the answer, hold the
    process with :func:`open_pidfd`.
    """
    if not pid or pid < 0:
        return False
    try:
        return _is(proc_stat(pid), start_time)
    except OSError:
        return False


def process_exiting(pid: int) -> bool:
    """Whether ``pid`` is on its way out: gone, a zombie, exiting (PF_EXITING), or with a
    SIGKILL pending (sent, not yet acted on). A process that closed a socket while it lives
    is not; a killed one closes its sockets while it exits."""
    try:
        stat = proc_stat(pid)
    except OSError:
        return True
    if stat is None or stat[STAT_STATE - 1] in _EXITED_STATES:
        return True
    if int(stat[STAT_FLAGS - 1]) & _PF_EXITING:
        return True
    return bool(int(stat[STAT_SIGNAL - 1]) & (1 << (signal.SIGKILL - 1)))


def open_pidfd(pid: int | None, start_time: int | None) -> int | None:
    """A pidfd (close-on-exec) for the process ``(pid, start_time)``, or None when that process
    is gone or has exited. The caller closes it.

    The pidfd is opened before the start time is compared: from then on it names that one
    process, so a pid reused after the comparison can never be signalled or waited for through
    it. With ``start_time`` None any live process with the pid passes (only for a caller that
    knows no start time, never for one that kills).
    """
    if not pid or pid < 0:
        return None
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    except OSError as exc:
        # The pid is now a thread of another process (pid reuse): ENOENT, EINVAL before Linux 6.9.
        if exc.errno in (errno.ENOENT, errno.EINVAL):
            return None
        raise
    try:
        if _is(proc_stat(pid), start_time):
            return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


def pidfd_exited(fd: int) -> bool:
    """Whether the process behind pidfd ``fd`` has exited (a zombie counts): it polls readable."""
    return wait_pidfd(fd, 0)


def wait_pidfd(fd: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for the process behind pidfd ``fd`` to exit; whether it did.

    Blocking: for code without an event loop (``podshim delete``). On a loop, wait for the
    pidfd to be readable instead.
    """
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, int(timeout * 1000))))


def signal_process(pid: int, start_time: int, sig: int) -> bool:
    """Send ``sig`` to the process ``(pid, start_time)`` if it is still that process and alive.

    Safe across pid reuse (see :func:`open_pidfd`). Returns whether the signal was sent.
    """
    fd = open_pidfd(pid, start_time)
    if fd is None:
        return False
    try:
        signal.pidfd_send_signal(fd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(fd)


def wait_gone(pid: int, start_time: int | None, timeout: float) -> bool:
    """Wait until the process is gone or a zombie; False if it outlived ``timeout``."""
    fd = open_pidfd(pid, start_time)
    if fd is None:
        return True
    try:
        return wait_pidfd(fd, timeout)
    finally:
        os.close(fd)


def read_status(path: str = "/proc/self/status") -> dict[str, str]:
    """A /proc/PID/status file as ``{field: value}``, each value stripped. Raises OSError
    (FileNotFoundError: the process is gone)."""
    fields = {}
    for line in read_file(path).decode("utf-8", "replace").splitlines():
        name, sep, value = line.partition(":")
        if sep:
            fields[name] = value.strip()
    return fields


def status_mask(field: str, path: str = "/proc/self/status") -> int:
    """A hexadecimal mask of a /proc/PID/status file (SigIgn, SigBlk, CapEff, ...) as an int.
    Raises OSError, and ValueError when the file has no such field."""
    value = read_status(path).get(field)
    if value is None:
        raise ValueError(f"{path} has no {field}")
    return int(value, 16)
