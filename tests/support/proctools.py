"""Waiting for processes the tests did not necessarily start: through pidfds, never by polling /proc.

A pidfd polls readable once its process has exited, whoever its parent is, so a zombie that
PID 1 has not reaped yet counts as gone (as everywhere in these tests). :func:`alive` is only
for looking; the waits are the kernel's event, bounded by a timeout for the test's sake.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping

from shim.lib.processes import open_pidfd, process_alive

__all__ = ["WAIT", "alive", "fd_readable", "fd_targets", "fifo_writer", "unheld_netns", "pidfds", "wait_gone",
           "wait_gone_async", "wait_pidfds", "wait_pidfds_async"]

#: A bound on any one wait in these tests; never a sleep.
WAIT = 10.0


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    return process_alive(pid, None)


def fifo_writer(path: str, timeout: float = WAIT) -> int:
    """Open the FIFO ``path`` for writing once another process opened it for reading (the open
    returns then: whatever that process wrote before is written by then); the descriptor, blocking.

    An open of a FIFO blocks until its other end is opened, and has no timeout: it is made in a
    thread, and when no reader came within ``timeout`` the FIFO is opened for reading here, which
    completes it. So no thread is ever left blocked, whatever the test's outcome; then
    AssertionError. (Safe to call from a thread: ``asyncio.to_thread(fifo_writer, path)``.)"""
    opened: list[int | OSError] = []

    def open_it() -> None:
        try:
            opened.append(os.open(path, os.O_WRONLY | os.O_CLOEXEC))
        except OSError as exc:
            opened.append(exc)

    opener = threading.Thread(target=open_it, name=f"open {path}", daemon=True)
    opener.start()
    opener.join(timeout)
    if not opener.is_alive():
        if isinstance(opened[0], OSError):
            raise opened[0]
        return opened[0]
    unblock = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        opener.join()
    finally:
        os.close(unblock)
        for fd in opened:
            if isinstance(fd, int):
                os.close(fd)
    raise AssertionError(f"nobody opened the FIFO {path} for reading within {timeout:g} s")


def fd_targets(pid: int) -> list[str]:
    """What process ``pid`` holds open: the targets of its /proc/PID/fd links, sorted (a descriptor
    closed while they are read is left out)."""
    targets = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:
            pass
    return sorted(targets)


@contextlib.contextmanager
def pidfds(processes: Iterable[tuple[int, int | None]]) -> Iterator[dict[int, int]]:
    """``{pidfd: pid}`` for each ``(pid, start_time)`` still running as that process (any
    process with the pid when ``start_time`` is None); the pidfds are closed on exit."""
    fds: dict[int, int] = {}
    try:
        for pid, start_time in processes:
            fd = open_pidfd(pid, start_time)
            if fd is not None:
                fds[fd] = pid
        yield fds
    finally:
        for fd in fds:
            os.close(fd)


def wait_pidfds(fds: Mapping[int, int], timeout: float = WAIT, *, kill: bool = False) -> list[int]:
    """Wait until every process of ``{pidfd: pid}`` has exited; the pids still running after
    ``timeout`` seconds. With ``kill``, those are then SIGKILLed, so a failing test leaves
    nothing behind either."""
    deadline = time.monotonic() + timeout
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    left = dict(fds)
    while left and (remaining := deadline - time.monotonic()) > 0:
        for fd, _ in poller.poll(remaining * 1000):
            poller.unregister(fd)
            del left[fd]
    return _killed_if(left, kill)


def wait_gone(*pids: int, timeout: float = WAIT, kill: bool = False) -> list[int]:
    """Wait until every one of ``pids`` has exited; those still running after ``timeout``
    seconds (empty when all are gone), SIGKILLed if ``kill``. Blocks: in an async test, use
    :func:`wait_gone_async`."""
    with pidfds((pid, None) for pid in pids) as fds:
        return wait_pidfds(fds, timeout, kill=kill)


async def fd_readable(fd: int, timeout: float = WAIT) -> None:
    """Return once ``fd`` is readable (a pidfd: once its process has exited), without blocking
    the event loop; TimeoutError after ``timeout``."""
    if select.select([fd], [], [], 0)[0]:
        return
    loop = asyncio.get_running_loop()
    readable = loop.create_future()
    def ready() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(fd, ready)
    try:
        await asyncio.wait_for(readable, timeout)
    finally:
        loop.remove_reader(fd)


async def wait_pidfds_async(fds: Mapping[int, int], timeout: float = WAIT, *, kill: bool = False) -> list[int]:
    """:func:`wait_pidfds` for async tests: the event loop runs meanwhile."""

    async def exited(fd: int) -> bool:
        try:
            await fd_readable(fd, timeout)
            return True
        except TimeoutError:
            return False

    done = await asyncio.gather(*(exited(fd) for fd in fds))
    return _killed_if({fd: pid for (fd, pid), gone in zip(fds.items(), done, strict=False) if not gone}, kill)


async def wait_gone_async(*pids: int, timeout: float = WAIT, kill: bool = False) -> list[int]:
    """:func:`wait_gone` for async tests: the event loop runs meanwhile."""
    with pidfds((pid, None) for pid in pids) as fds:
        return await wait_pidfds_async(fds, timeout, kill=kill)


def _killed_if(left: Mapping[int, int], kill: bool) -> list[int]:
    if kill:
        for fd in left:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
    return sorted(left.values())


def _session_of(pid: str) -> bytes | None:
    """The PODSHIM_TEST_SESSION marker in the environment of ``pid``, or None."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"PODSHIM_TEST_SESSION="):
                    return item
    except OSError:
        pass
    return None


def _parent_of(pid: str) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rfind(b")") + 2:].split()[1].decode()
    except (OSError, IndexError):
        return None


def unheld_netns(prefix: str = "podshim", exclude: str | None = None) -> set[str]:
    """Names of the netns files in /var/run/netns starting with ``prefix`` (not with ``exclude``),
    but for those a process of another test run is in.

    A process belongs to another run when it, or its parent (a pause's is its shim; a pause drops
    its environment), carries another run's PODSHIM_TEST_SESSION marker (tests/conftest.py). So a
    leak check that compares these before and after sees what this run left behind, including a
    namespace pinned by a leaked pause, and not the pods of a run beside it.
    """
    try:
        names = [n for n in os.listdir("/var/run/netns")
                 if n.startswith(prefix) and not (exclude and n.startswith(exclude))]
    except FileNotFoundError:
        return set()
    inodes: dict[str, int] = {}
    for name in names:
        try:
            inodes[name] = os.stat(f"/var/run/netns/{name}").st_ino
        except OSError:
            continue
    if not inodes:
        return set()
    wanted = set(inodes.values())
    ours = f"PODSHIM_TEST_SESSION={os.environ.get('PODSHIM_TEST_SESSION', '')}".encode()
    others: set[int] = set()  # netns inodes that processes of other runs are in
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            inode = os.stat(f"/proc/{entry}/ns/net").st_ino
        except OSError:
            continue
        if inode not in wanted or inode in others:
            continue  # only the processes in those namespaces have their environment read
        parent = _parent_of(entry)
        markers = {_session_of(entry), _session_of(parent) if parent else None} - {None}
        if markers and ours not in markers:
            others.add(inode)
    return {name for name, inode in inodes.items() if inode not in others}


def run_in_child(check: Callable[[], bool]) -> int:
    """Run ``check()`` in a forked child (its traceback printed if it raises); the child's exit
    status: 0 when it returned True, 1 when False, 2 when it raised."""
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(0 if check() else 1)
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(2)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
