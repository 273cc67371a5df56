"""shim.kernel.linux: the system call wrappers that are not the os module's."""

from __future__ import annotations

import ctypes
import errno
import os
import signal

import pytest

from shim.kernel import linux

from support.proctools import run_in_child


def _ignored(sig: int) -> bool:
    return bool(linux.status_mask("SigIgn") >> (sig - 1) & 1)


# -- signals ----------------------------------------------------------------------------------


def test_default_signal_resets_an_ignored_signal() -> None:
    def check() -> bool:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        assert _ignored(signal.SIGUSR1)
        linux.default_signal(signal.SIGUSR1)
        return not _ignored(signal.SIGUSR1)

    assert run_in_child(check) == 0


KNOWN_MACHINE = pytest.mark.skipif(os.uname().machine not in linux._ARCH_SYSCALLS,
                                   reason="podshim knows no system call numbers for this machine")


@KNOWN_MACHINE
def test_default_signal_resets_a_signal_the_c_library_keeps_for_itself() -> None:
    # glibc refuses sigaction on 32 and 33; its posix_spawn leaves them ignored in what it starts.
    def check() -> bool:
        action = ctypes.c_ulong * 4
        ignore = action(1)  # SIG_IGN
        assert linux._libc.syscall(linux._SYS_RT_SIGACTION, 32, ignore, None, ctypes.c_size_t(8)) == 0
        assert _ignored(32)
        linux.default_signal(32)
        return not _ignored(32)

    assert run_in_child(check) == 0


def test_default_signal_on_a_machine_whose_number_is_unknown_resets_what_libc_allows(monkeypatch) -> None:
    monkeypatch.setattr(linux, "_SYS_RT_SIGACTION", -1)

    def check() -> bool:
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        linux.default_signal(signal.SIGUSR2)
        assert not _ignored(signal.SIGUSR2)
        linux.default_signal(32)  # the C library's own: left as it is, and no exec fails for it
        return True

    assert run_in_child(check) == 0


def test_pivot_root_on_a_machine_whose_number_is_unknown_fails_enosys_naming_it(monkeypatch) -> None:
    monkeypatch.setattr(linux, "_SYS_PIVOT_ROOT", -1)
    monkeypatch.setattr(linux, "_MACHINE", "pdp11")
    with pytest.raises(OSError) as caught:
        linux.pivot_root("/", "/")
    assert caught.value.errno == errno.ENOSYS
    assert "pivot_root" in str(caught.value) and "pdp11" in str(caught.value)


@KNOWN_MACHINE
def test_every_known_machine_has_both_numbers() -> None:
    assert linux._ARCH_SYSCALLS[os.uname().machine] == (linux._SYS_PIVOT_ROOT, linux._SYS_RT_SIGACTION)
    assert all(len(numbers) == 2 and min(numbers) > 0 for numbers in linux._ARCH_SYSCALLS.values())


# -- the parent's death -----------------------------------------------------------------------

_DIES_WITH_ITS_PARENT = """
import os, signal, sys, time
from shim.kernel import linux
parent = os.getpid()
pid = os.fork()
if pid == 0:
    linux.set_parent_death_signal(signal.SIGTERM)
    assert os.getppid() == parent
    os.write(1, b"set\\n")  # each line in one write: print() under PYTHONUNBUFFERED writes it in parts
    time.sleep(60)
    os._exit(0)
os.write(1, b"child %d\\n" % pid)
time.sleep(60)
"""


def _dead(pid: int) -> bool:
    """Whether ``pid`` has exited: gone, or a zombie (the machine's PID 1 reaps it later)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_child_told_so_gets_its_signal_when_its_parent_is_killed():
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-c", _DIES_WITH_ITS_PARENT], stdout=subprocess.PIPE, text=True)
    child, dead = 0, False
    try:
        # The two lines come in either order: the child may say "set" before its parent names it.
        lines = sorted([proc.stdout.readline(), proc.stdout.readline()])
        assert lines[0].startswith("child ") and lines[1] == "set\n", lines
        child = int(lines[0].split()[1])
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 5  # a bound: the signal is sent as the parent exits
        while not (dead := _dead(child)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert dead
    finally:
        proc.stdout.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if child and not dead:
            os.kill(child, signal.SIGKILL)


# -- memory -----------------------------------------------------------------------------------


def _resident(address: int, pages: int) -> list[bool]:
    """Whether each of ``pages`` pages from ``address`` is in memory (/proc/self/pagemap)."""
    page = os.sysconf("SC_PAGE_SIZE")
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(address // page * 8)
        data = f.read(pages * 8)
    return [bool(int.from_bytes(data[i:i + 8], "little") >> 63) for i in range(0, len(data), 8)]


def test_release_zero_pages_gives_back_the_pages_of_zeros_and_keeps_the_others() -> None:
    import ctypes
    import mmap

    page = os.sysconf("SC_PAGE_SIZE")
    region = mmap.mmap(-1, 8 * page)  # private anonymous memory, as the heap is
    try:
        for n in range(8):
            region[n * page:(n + 1) * page] = bytes(page)  # every page written: in memory
        region[2 * page + 7] = 1  # pages 2 and 5 hold something
        region[6 * page - 1] = 2
        address = ctypes.addressof(ctypes.c_char.from_buffer(region))
        assert all(_resident(address, 8))
        # From the middle of page 0 to the middle of page 7: only whole pages count.
        released = linux.release_zero_pages(address + page // 2, 7 * page)
        assert released == 4 * page  # pages 1, 3, 4 and 6
        assert _resident(address, 8) == [True, False, True, False, False, True, False, True]
        assert region[2 * page + 7] == 1 and region[6 * page - 1] == 2
        assert region[:] == bytes(2 * page + 7) + b"\1" + bytes(4 * page - 9) + b"\2" + bytes(2 * page)
    finally:
        region.close()
