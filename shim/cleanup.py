"""``podshim delete``: clean up after a shim that died, from what it recorded in state.json.

Safe to repeat and safe at any point of a crash: every step checks before it acts. Processes
are named by pid *and* start time and killed through a pidfd opened before the start time is
compared (:func:`shim.rpc.processes.open_pidfd`), so a reused pid is never killed; a process
recorded without a start time is never signalled.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Any

from shim.kernel import cgroups, netns
from shim.runtime.oci.backend import delete_recorded
from shim.rpc.api import UNKNOWN_EXIT_STATUS
from shim.paths import STATE_FILE, read_json, socket_path, write_json_atomic
from shim.rpc.processes import open_pidfd, wait_pidfd
from shim.rpc.status import RpcError

__all__ = ["UNKNOWN_EXIT_STATUS", "KILLED_EXIT_STATUS", "delete_sandbox"]

log = logging.getLogger(__name__)

#: What a pause killed by delete reports: 128 + SIGKILL, as containerd's runc shim does.
KILLED_EXIT_STATUS = 128 + signal.SIGKILL
#: Bound on waiting for a killed process to disappear.
KILL_WAIT = 5.0


def _kill(pid: int | None, start_time: int | None, what: str) -> bool:
    """SIGKILL the process ``(pid, start_time)`` and wait for it to exit; whether it was alive."""
    if not pid:
        return False
    if start_time is None:
        log.warning("%s %d was recorded without its start time; not signalling a pid that may be another "
                    "process's by now", what, pid)
        return False
    fd = open_pidfd(pid, start_time)
    if fd is None:
        return False
    try:
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        if not wait_pidfd(fd, KILL_WAIT):
            log.error("%s %d did not exit within %.0fs of SIGKILL", what, pid, KILL_WAIT)
    except ProcessLookupError:
        return False  # it exited between the check and the signal
    finally:
        os.close(fd)
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
            record["oci"] = delete_recorded(oci_record)
        except RpcError as exc:
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
