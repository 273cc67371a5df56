"""The test harness's own promises: the session's template is never adopted by the test process,
even when it starts while the test process is a child subreaper, and what the test process did
adopt from a template is reaped, never a Popen's child."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from shim.api.names import TEMPLATE_SERVICE
from shim.api.paths import control_socket_path
from shim.launch.template import stop_template
from shim.lib.processes import STAT_PPID, proc_stat
from shim.rpc import blocking

from support.proctools import WAIT
from support.shimtools import PODSHIM, SessionTemplate, adopting_orphans, child_pids, reap_adopted_zombies


def parent_of(pid: int) -> int | None:
    stat = proc_stat(pid)
    return None if stat is None else int(stat[STAT_PPID - 1])


def ping(socket: str) -> dict:
    return blocking.call("unix://" + socket, TEMPLATE_SERVICE, "Ping", timeout=WAIT)


def test_the_session_template_started_under_a_subreaper_is_not_the_test_processs_child() -> None:
    template = SessionTemplate()
    children = child_pids()
    try:
        with adopting_orphans():  # as while a Reaper is installed
            answer = ping(template.socket())
        assert answer["spare_pids"]
        # Neither the template nor the spares it double-forked are ours: what it forks later is not either.
        assert all(parent_of(pid) != os.getpid() for pid in (answer["pid"], *answer["spare_pids"]))
    finally:
        template.stop()
    assert child_pids() <= children


def test_adopted_template_zombies_are_reaped_and_a_popens_child_is_not(tmp_path) -> None:
    root = str(tmp_path / "run")
    named = subprocess.Popen([sys.executable, "-c", "import sys; from shim.kernel.linux import set_process_name; "
                              "set_process_name('podshim-shim'); sys.exit(7)"])
    try:
        with adopting_orphans():  # the template and its spares become this process's children
            subprocess.run([*PODSHIM, "template", "--detach", "--runtime-root", root], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, check=True, timeout=60)
        answer = ping(control_socket_path(root))
        adopted = {answer["pid"], *answer["spare_pids"]}
        assert all(parent_of(pid) == os.getpid() for pid in adopted)
    finally:
        stop_template(root)
    deadline = time.monotonic() + WAIT
    reaped: list[int] = []
    while set(reaped) != adopted and time.monotonic() < deadline:  # the spare may exit after the template
        reaped += reap_adopted_zombies()
        time.sleep(0.05)
    assert set(reaped) == adopted
    assert all(proc_stat(pid) is None for pid in adopted)
    assert named.wait(timeout=WAIT) == 7  # its exit was left for the Popen to read
