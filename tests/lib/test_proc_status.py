"""shim.lib.processes: a process named by pid and start time, alive or not, held by a pidfd; its
/proc/PID/status."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from shim.lib.processes import (
    open_pidfd,
    pidfd_exited,
    proc_start_time,
    process_alive,
    read_status,
    signal_process,
    status_mask,
    wait_gone,
    wait_pidfd,
)


def test_a_stopped_process_is_alive_and_a_zombie_is_not(sleeper) -> None:
    start = proc_start_time(sleeper.pid)
    os.kill(sleeper.pid, signal.SIGSTOP)
    try:
        assert process_alive(sleeper.pid, start)
    finally:
        os.kill(sleeper.pid, signal.SIGCONT)
    sleeper.kill()
    os.waitid(os.P_PID, sleeper.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    assert proc_start_time(sleeper.pid) == start and not process_alive(sleeper.pid, start)


def test_another_start_time_is_another_process(sleeper) -> None:
    start = proc_start_time(sleeper.pid)
    assert start is not None
    assert not process_alive(sleeper.pid, start + 1) and open_pidfd(sleeper.pid, start + 1) is None
    assert not signal_process(sleeper.pid, start + 1, signal.SIGKILL) and sleeper.poll() is None
    assert not process_alive(0, None) and open_pidfd(0, None) is None


def test_a_pidfd_tells_when_its_process_exits(sleeper) -> None:
    start = proc_start_time(sleeper.pid)
    assert start is not None
    fd = open_pidfd(sleeper.pid, start)
    assert fd is not None
    try:
        assert not pidfd_exited(fd)
        assert signal_process(sleeper.pid, start, signal.SIGKILL)
        assert wait_pidfd(fd, 5.0) and pidfd_exited(fd)
    finally:
        os.close(fd)


def test_a_pid_reused_as_a_thread_of_another_process_is_not_that_process(sleeper) -> None:
    # Under churn a pid we saw may come back as a thread of someone else's process: pidfd_open
    # refuses it (ENOENT; EINVAL before Linux 6.9), which means "gone", not an error.
    start = proc_start_time(sleeper.pid)
    assert start is not None
    thread_ids: list[int] = []
    named, release = threading.Event(), threading.Event()

    def hold() -> None:
        thread_ids.append(threading.get_native_id())
        named.set()
        release.wait()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        named.wait()
        assert open_pidfd(thread_ids[0], start) is None
        assert not signal_process(thread_ids[0], start, signal.SIGKILL)
        assert wait_gone(thread_ids[0], start, 0)
    finally:
        release.set()
        thread.join()


# -- /proc/PID/status -------------------------------------------------------------------------


def test_read_status_gives_each_field_stripped() -> None:
    fields = read_status()
    assert fields["Pid"] == str(os.getpid())
    assert fields["Name"] and fields["Name"] == fields["Name"].strip()


def test_status_mask_reads_a_hexadecimal_field_and_names_a_missing_one(tmp_path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tx\nSigIgn:\t0000000000001001\n")
    assert status_mask("SigIgn", str(status)) == 0x1001
    with pytest.raises(ValueError, match="has no CapEff"):
        status_mask("CapEff", str(status))
    with pytest.raises(FileNotFoundError):
        read_status(str(tmp_path / "gone"))
