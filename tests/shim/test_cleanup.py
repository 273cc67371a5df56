"""``podshim delete`` kills only the processes a dead shim recorded: never a pid reused since.

The pid-reuse test runs in a pid namespace of its own (``unshare --pid``), where the next pid is
chosen through ``ns_last_pid``: the recorded process is replaced by a newcomer with its very
pid right after delete looked at it, the window in which a kill by pid hits the newcomer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from shim.cleanup import delete_sandbox
from shim.lib.processes import proc_start_time, process_alive
from shim.sandbox.record import write_state as write_state_home

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Runs as pid 1 of a new pid namespace (with its own /proc). Prints {"newcomer_alive": bool}.
REUSE = textwrap.dedent(r"""
    import json, os, subprocess, sys
    from shim.cleanup import delete_sandbox
    from shim.lib import processes
    from shim.lib.processes import proc_start_time

    bundle, runtime_root = sys.argv[1], sys.argv[2]
    recorded = subprocess.Popen(["sleep", "600"])
    start_time = proc_start_time(recorded.pid)
    newcomer = []
    real_proc_stat = processes.proc_stat
    seen = {}

    def proc_stat(pid):
        # The first look at the recorded process's stat sees it alive; right after, it exits and
        # a newcomer gets its pid. Later reads still see the old line, as a slow reader would.
        if pid == recorded.pid:
            if not seen:
                seen["fields"] = real_proc_stat(pid)
                recorded.kill()
                recorded.wait()
                with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                    f.write(str(recorded.pid - 1))
                newcomer.append(subprocess.Popen(["sleep", "600"]))
                assert newcomer[0].pid == recorded.pid, (newcomer[0].pid, recorded.pid)
            return list(seen["fields"])
        return real_proc_stat(pid)

    with open(os.path.join(bundle, "state.json"), "w") as f:
        json.dump({"namespace": "ns", "sandbox_id": "sb", "pause": {"pid": recorded.pid, "start_time": start_time}}, f)
    processes.proc_stat = proc_stat
    try:
        delete_sandbox(bundle, "ns", "sb", runtime_root)
    finally:
        processes.proc_stat = real_proc_stat
    assert seen, "delete never looked at the recorded process"
    alive = newcomer[0].poll() is None
    newcomer[0].kill()
    newcomer[0].wait()
    print(json.dumps({"newcomer_alive": alive}))
""")


def test_delete_never_kills_a_pid_reused_after_it_looked_at_the_process(tmp_path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", REUSE, str(bundle),
                           str(tmp_path / "run")], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"newcomer_alive": True}


@pytest.mark.parametrize("start_time", ["another", None], ids=["another-start-time", "no-start-time"])
def test_delete_leaves_a_live_pid_whose_start_time_does_not_match_the_record(tmp_path, sleeper, start_time):
    recorded = proc_start_time(sleeper.pid) + 1 if start_time == "another" else None
    with open(tmp_path / "state.json", "w") as f:
        json.dump({"namespace": "ns", "sandbox_id": "sb", "pause": {"pid": sleeper.pid, "start_time": recorded},
                   "tasks": {"t1": {"pid": sleeper.pid, "start_time": recorded}}}, f)
    result = delete_sandbox(str(tmp_path), "ns", "sb", str(tmp_path / "run"))
    assert process_alive(sleeper.pid, None) and sleeper.poll() is None
    assert result["exit_status"] != 128 + signal.SIGKILL


def test_delete_kills_the_recorded_process_and_reports_it_killed(tmp_path, sleeper) -> None:
    with open(tmp_path / "state.json", "w") as f:
        json.dump({"namespace": "ns", "sandbox_id": "sb",
                   "pause": {"pid": sleeper.pid, "start_time": proc_start_time(sleeper.pid)}}, f)
    result = delete_sandbox(str(tmp_path), "ns", "sb", str(tmp_path / "run"))
    assert sleeper.wait(timeout=5) == -signal.SIGKILL
    assert result["exit_status"] == 128 + signal.SIGKILL and result["pid"] == sleeper.pid


def test_a_second_delete_at_once_reports_the_pause_the_first_killed(tmp_path, sleeper, monkeypatch):
    """Two deletes of one sandbox at once (the Controller's dead-shim cleanup and an operator's):
    the second takes its turn after the first and reports the first's 128 + SIGKILL, not 255
    for a pause it found already dead."""
    import shim.cleanup
    with open(tmp_path / "state.json", "w") as f:
        json.dump({"namespace": "ns", "sandbox_id": "sb",
                   "pause": {"pid": sleeper.pid, "start_time": proc_start_time(sleeper.pid)}}, f)
    first_killed, first_goes_on = threading.Event(), threading.Event()
    real_write_state = write_state_home

    def write_state(bundle, record):
        if threading.current_thread() is first:  # the first delete has killed the pause, not yet recorded it
            first_killed.set()
            first_goes_on.wait()
        real_write_state(bundle, record)

    monkeypatch.setattr(shim.cleanup, "write_state", write_state)
    results = {}

    def delete(name):
        results[name] = delete_sandbox(str(tmp_path), "ns", "sb", str(tmp_path / "run"))

    first = threading.Thread(target=delete, args=("first",))
    second = threading.Thread(target=delete, args=("second",))
    first.start()
    try:
        first_killed.wait()
        second.start()
        second.join(timeout=1)  # unlocked, the second is done by now; taking turns, it waits for the first
    finally:
        first_goes_on.set()
        first.join()
        second.join()
    assert sleeper.wait(timeout=5) == -signal.SIGKILL
    assert results["first"]["exit_status"] == results["second"]["exit_status"] == 128 + signal.SIGKILL


@pytest.mark.parametrize("made", ["mounted", "file only"])
def test_delete_of_a_live_shim_removes_the_netns_it_recorded_after_delete_read_its_record(tmp_path, sleeper,
                                                                                         monkeypatch, made) -> None:
    """A delete of a shim that is still at work (a client gave up on it): the shim records a netns
    path and makes the netns after delete read state.json, and delete's SIGKILL stops it there, the
    netns mounted or only its file made. Delete removes what the dead shim recorded last."""
    import shim.cleanup
    from shim.kernel import netns

    record = {"namespace": "ns", "sandbox_id": "sb", "shim_pid": sleeper.pid,
              "shim_start_time": proc_start_time(sleeper.pid)}
    with open(tmp_path / "state.json", "w") as f:
        json.dump(record, f)
    path = netns.new_netns_path()
    real_kill = shim.cleanup._kill

    def kill(pid, start_time, what):  # the shim goes on until the kill
        with open(tmp_path / "state.json", "w") as f:
            json.dump({**record, "netns_path": path, "netns_owned": True}, f)
        if made == "mounted":
            netns.create_netns(path)
        else:
            os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o444))
        return real_kill(pid, start_time, what)

    monkeypatch.setattr(shim.cleanup, "_kill", kill)
    try:
        delete_sandbox(str(tmp_path), "ns", "sb", str(tmp_path / "run"))
        assert sleeper.wait(timeout=5) == -signal.SIGKILL
        assert not os.path.exists(path)
    finally:
        netns.remove_netns(path)
