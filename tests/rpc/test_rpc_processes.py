"""shim.rpc.processes: a process named by pid and start time, alive or not, held by a pidfd."""

from __future__ import annotations

import os
import signal

from shim.rpc.processes import open_pidfd, pidfd_exited, proc_start_time, process_alive, signal_process, wait_pidfd


def test_a_stopped_process_is_alive_and_a_zombie_is_not(sleeper):
    start = proc_start_time(sleeper.pid)
    os.kill(sleeper.pid, signal.SIGSTOP)
    try:
        assert process_alive(sleeper.pid, start)
    finally:
        os.kill(sleeper.pid, signal.SIGCONT)
    sleeper.kill()
    os.waitid(os.P_PID, sleeper.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    assert proc_start_time(sleeper.pid) == start and not process_alive(sleeper.pid, start)


def test_another_start_time_is_another_process(sleeper):
    start = proc_start_time(sleeper.pid)
    assert not process_alive(sleeper.pid, start + 1) and open_pidfd(sleeper.pid, start + 1) is None
    assert not signal_process(sleeper.pid, start + 1, signal.SIGKILL) and sleeper.poll() is None
    assert not process_alive(0, None) and open_pidfd(0, None) is None


def test_a_pidfd_tells_when_its_process_exits(sleeper):
    fd = open_pidfd(sleeper.pid, proc_start_time(sleeper.pid))
    assert fd is not None
    try:
        assert not pidfd_exited(fd)
        assert signal_process(sleeper.pid, proc_start_time(sleeper.pid), signal.SIGKILL)
        assert wait_pidfd(fd, 5.0) and pidfd_exited(fd)
    finally:
        os.close(fd)
