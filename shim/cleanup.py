"""``podshim delete``: clean up after a shim that died, from what it recorded in state.json.

Safe to repeat and safe at any point of a crash: every step checks before it acts, and
processes are matched by pid *and* start time so a reused pid is never killed.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Any

from shim.kernel import cgroups, netns
from shim.runtime import oci
from shim.kernel.linux import proc_start_time
from shim.rpc.api import UNKNOWN_EXIT_STATUS
from shim.paths import STATE_FILE, read_json, socket_path, write_json_atomic
from shim.rpc.status import RpcError

__all__ = ["UNKNOWN_EXIT_STATUS", "delete_sandbox", "process_alive", "wait_gone"]

log = logging.getLogger(__name__)

#: What a pause killed by delete reports: 128 + SIGKILL, as containerd's runc shim does.
KILLED_EXIT_STATUS = 128 + signal.SIGKILL
#: Bound on waiting for a killed process to disappear.
KILL_WAIT = 5.0


def process_alive(pid: int | None, start_time: int | None) -> bool:
    """True if ``pid`` runs (not a zombie) and, when given, started at ``start_time``."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    state = stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3]
    if state in (b"Z", b"X"):
        return False
    return start_time is None or proc_start_time(pid) == start_time


def wait_gone(pid: int, start_time: int | None, timeout: float = KILL_WAIT) -> bool:
    """Wait until the process is gone or a zombie; False if it outlived ``timeout``."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while process_alive(pid, start_time):
        if time.monotonic() > deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    return True


def _kill(pid: int | None, start_time: int | None, what: str) -> bool:
    if not process_alive(pid, start_time):
        return False
    try:
        os.kill(pid, signal.SIGKILL)  # type: ignore[arg-type]
    except ProcessLookupError:
        return False
    if not wait_gone(pid, start_time):  # type: ignore[arg-type]
        log.error("%s %d did not exit within %.0fs of SIGKILL", what, pid, KILL_WAIT)
    return True


def _delete_tasks(tasks: dict[str, Any]) -> None:
    """Kill each task recorded in state.json and remove its cgroup, before the sandbox's own.

    A task's own process is matched by pid and start time; whatever else is in its cgroup
    (its children, or a process whose launch the crash interrupted) is killed through the
    cgroup. Each record is updated in place.
    """
    for task_id, task in tasks.items():
        if _kill(task.get("pid"), task.get("start_time"), f"task {task_id}"):
            task.update(status="stopped", exit={"exit_status": KILLED_EXIT_STATUS, "exited_at": time.time_ns()})
        if cgroup_record := task.get("cgroup"):
            cg = cgroups.SandboxCgroup.from_dict(cgroup_record)
            cg.kill_all()
            cg.remove()
            task["cgroup"] = None


def delete_sandbox(bundle: str, namespace: str, sandbox_id: str, runtime_root: str) -> dict[str, Any]:
    """Kill what is left of the sandbox and remove what it made; return
    ``{"exit_status", "exited_at", "pid"}``.

    Order matters: the shim first (so it cannot restart anything), then the tasks and their
    cgroups, then the pause, then the runtime's containers (runc/crun handlers: ``delete
    --force``), then the sandbox cgroup (now empty), the netns, and the socket.
    """
    state_path = os.path.join(bundle, STATE_FILE)
    try:
        record = read_json(state_path)
        if not isinstance(record, dict):
            raise ValueError(f"{state_path} does not hold a map")
    except FileNotFoundError:
        record = {}
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable %s: %s", state_path, exc)
        record = {}
    if record.get("sandbox_id") not in (None, sandbox_id) or record.get("namespace") not in (None, namespace):
        raise ValueError(f"{state_path} belongs to {record.get('namespace')}/{record.get('sandbox_id')}, "
                         f"not {namespace}/{sandbox_id}")

    _kill(record.get("shim_pid"), record.get("shim_start_time"), "shim")
    _delete_tasks(record.get("tasks") or {})
    pause = record.get("pause") or {}
    pid = pause.get("pid") or 0
    exit_info = record.get("exit")
    if _kill(pid, pause.get("start_time"), "pause"):
        exit_info = {"exit_status": KILLED_EXIT_STATUS, "exited_at": time.time_ns()}
    if oci_record := record.get("oci"):
        # The containers of a runc/crun sandbox, now stopped (or never started): their runtime
        # state goes too, and a container whose create the crash interrupted is killed here.
        try:
            left = oci.delete_recorded(oci_record)
            oci_record["containers"] = [c for c in oci_record.get("containers") or [] if c.get("id") in left]
        except (RpcError, KeyError, TypeError, AttributeError) as exc:
            log.error("cannot delete the OCI containers in %s: %s", state_path, exc)
    if cgroups_record := record.get("cgroup"):
        cg = cgroups.SandboxCgroup.from_dict(cgroups_record)
        cg.kill_all()
        cg.remove()
    if record.get("netns_owned") and record.get("netns_path"):
        netns.remove_netns(record["netns_path"])
    sock = record.get("socket_path") or socket_path(namespace, sandbox_id, runtime_root)
    try:
        os.unlink(sock)
    except FileNotFoundError:
        pass
    if not exit_info:
        exit_info = {"exit_status": 0 if record and not pid else UNKNOWN_EXIT_STATUS, "exited_at": time.time_ns()}
    result = {"exit_status": exit_info["exit_status"], "exited_at": exit_info["exited_at"], "pid": pid}
    if record:
        record.update(state="deleted", exit=exit_info)
        try:
            write_json_atomic(state_path, record, durable=False)
        except OSError as exc:
            log.warning("cannot update %s: %s", state_path, exc)
    return result
