"""``podshim delete``: clean up after a shim that died, from what it recorded in state.json.

Safe to repeat and safe at any point of a crash: every step checks before it acts. Processes
are named by pid *and* start time and killed through a pidfd opened before the start time is
compared (:func:`shim.lib.processes.open_pidfd`), so a reused pid is never killed; a process
recorded without a start time is never signalled.

Two deletes of one sandbox at once (the Controller's dead-shim cleanup and an operator's, or a
retry) take turns on ``BUNDLE/delete.lock``: the second reads what the first recorded. Without
it, the second found the pause already killed by the first (a zombie: "gone") before the first
had written its exit, and reported 255 (unknown) for a pause that was killed.

The kernel's and the runtime's modules load only for what the record still names: after a clean
ShutdownSandbox (which forgets each thing it removed) a delete is a process start and a few
syscalls (containerd runs one after every pod).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterator, Mapping
from typing import Any

from shim.api.defaults import DELETE_KILL_WAIT_TIMEOUT as KILL_WAIT_TIMEOUT
from shim.api.names import DELETE_LOCK_FILE, UNKNOWN_EXIT_STATUS
from shim.api.paths import STATE_FILE, socket_path
from shim.lib.files import flock_open
from shim.lib.processes import open_pidfd, wait_pidfd
from shim.rpc.status import RpcError
from shim.sandbox.record import (
    STATE_DELETED,
    STATE_VERSION,
    ExitRecord,
    MalformedRecord,
    SandboxRecord,
    StateFile,
    TaskRecord,
    read_state,
    write_state,
)

__all__ = ["UNKNOWN_EXIT_STATUS", "KILLED_EXIT_STATUS", "delete_sandbox"]

log = logging.getLogger(__name__)

#: What a pause killed by delete reports: 128 + SIGKILL, as containerd's runc shim does.
KILLED_EXIT_STATUS = 128 + signal.SIGKILL


def _kill(pid: int, start_time: int | None, what: str) -> bool:
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
        if not wait_pidfd(fd, KILL_WAIT_TIMEOUT):
            log.error("%s %d did not exit within %.0fs of SIGKILL", what, pid, KILL_WAIT_TIMEOUT)
    except ProcessLookupError:
        return False  # it exited between the check and the signal
    finally:
        os.close(fd)
    return True


def _remove_cgroup(record: Mapping[str, Any] | None) -> None:
    """Kill what is in the recorded cgroup and remove it (InvalidArgument for a malformed record)."""
    if record:
        from shim.kernel import cgroups

        cg = cgroups.SandboxCgroup.from_dict(dict(record))
        cg.kill_all()
        cg.remove()


def _delete_task(bundle: str, task_id: str, task: TaskRecord) -> TaskRecord:
    """Kill a task recorded in state.json, remove its cgroup and unmount its rootfs; return its
    record updated.

    Its own process is matched by pid and start time; whatever else is in its cgroup (its
    children, or a process whose launch the crash interrupted) is killed through the cgroup.
    A rootfs is unmounted only where the shim mounts one (``<bundle>/tasks/<task id>/rootfs``):
    a record naming another path is refused, never acted on.
    """
    if _kill(task.pid, task.start_time, f"task {task_id}"):
        task = task.replace(status="stopped", exit=ExitRecord(KILLED_EXIT_STATUS, time.time_ns()))
    _remove_cgroup(task.cgroup)
    rootfs = task.rootfs
    if rootfs:
        from shim.lib.rootfs import unmount_rootfs
        from shim.runtime import mounts

        if os.path.normpath(rootfs) != os.path.normpath(mounts.rootfs_path(os.path.abspath(bundle), task_id)):
            log.error("task %s: not unmounting %s, which is not its rootfs in %s", task_id, rootfs, bundle)
        else:
            try:
                unmount_rootfs(rootfs)
                rootfs = ""
            except RpcError as exc:
                log.error("task %s: %s", task_id, exc.message)
    return task.replace(cgroup=None, rootfs=rootfs)


@contextlib.contextmanager
def _delete_turn(bundle: str) -> Iterator[None]:
    """Hold ``BUNDLE/delete.lock`` for a block, waiting for a delete of the same bundle that holds
    it (it ends: every step of a delete is bounded). A bundle that is gone has nothing to take
    turns on: the block runs unlocked (and finds no state.json)."""
    with contextlib.ExitStack() as turn:
        try:
            turn.enter_context(flock_open(os.path.join(bundle, DELETE_LOCK_FILE)))
        except (FileNotFoundError, NotADirectoryError):
            pass
        yield


def _read_record(bundle: str) -> SandboxRecord | None:
    """The bundle's state.json; None when it is missing or unreadable (logged). Raises
    MalformedRecord."""
    try:
        return read_state(bundle)
    except MalformedRecord:
        raise
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable %s: %s", os.path.join(bundle, STATE_FILE), exc)
        return None


def delete_sandbox(bundle: str, namespace: str, sandbox_id: str, runtime_root: str) -> dict[str, int]:
    """Kill what is left of the sandbox and remove what it made; return
    ``{"exit_status", "exited_at", "pid"}``.

    Order matters: the shim first (so it cannot restart anything), then the tasks, their
    cgroups and rootfs mounts, then the pause, then the runtime's containers (runc/crun handlers: ``delete
    --force``), then the sandbox cgroup (now empty), the netns, and the socket. Raises
    ValueError when the record belongs to another sandbox or has a field of the wrong type, and
    InvalidArgument for a malformed cgroup record.

    Deletes of one bundle take turns (:func:`_delete_turn`): a second one finds the first's
    record (state "deleted", its exit) and reports the same exit. 255 (unknown) is reported only
    when nothing recorded the pause's exit: no readable state.json, or a recorded pause that had
    exited before any delete killed it.
    """
    with _delete_turn(bundle):
        return _delete_sandbox(bundle, namespace, sandbox_id, runtime_root)


def _delete_sandbox(bundle: str, namespace: str, sandbox_id: str, runtime_root: str) -> dict[str, int]:
    state_path = os.path.join(bundle, STATE_FILE)
    record = _read_record(bundle)
    if record is not None and (record.sandbox_id not in ("", sandbox_id) or record.namespace not in ("", namespace)):
        raise ValueError(f"{state_path} belongs to {record.namespace}/{record.sandbox_id}, "
                         f"not {namespace}/{sandbox_id}")
    if record is None:
        sock = socket_path(namespace, sandbox_id, runtime_root)
        _unlink(sock)
        return {"exit_status": UNKNOWN_EXIT_STATUS, "exited_at": time.time_ns(), "pid": 0}
    if record.version > STATE_VERSION:
        log.warning("%s is of version %d, newer than this podshim's %d; acting on what it knows",
                    state_path, record.version, STATE_VERSION)

    _kill(record.shim_pid, record.shim_start_time, "shim")
    # Read again now that the shim is dead: what it recorded after our first read (a netns, a
    # pause, a cgroup it was making: each recorded before it is made) is what there is to remove.
    record = _read_record(bundle) or record
    StateFile.remove_leftovers(bundle)  # the killed shim's spare of state.json
    tasks = {task_id: _delete_task(bundle, task_id, task) for task_id, task in record.tasks.items()}
    pid = record.pause.pid if record.pause is not None else 0
    exit_info = record.exit
    if record.pause is not None and _kill(pid, record.pause.start_time, "pause"):
        exit_info = ExitRecord(KILLED_EXIT_STATUS, time.time_ns())
    oci = record.oci
    if oci:
        # The containers of a runc/crun sandbox, now stopped (or never started): their runtime
        # state goes too, and a container whose create the crash interrupted is killed here.
        from shim.runtime.oci.backend import delete_recorded

        try:
            oci = delete_recorded(oci)
        except RpcError as exc:
            log.error("cannot delete the OCI containers in %s: %s", state_path, exc.message)
    rootfs = _unmount_sandbox_rootfs(bundle, record.rootfs)
    _remove_cgroup(record.cgroup)
    if record.netns_owned and record.netns_path:
        from shim.kernel import netns

        netns.remove_netns(record.netns_path)
    _unlink(record.socket_path or socket_path(namespace, sandbox_id, runtime_root))
    if exit_info is None:
        exit_info = ExitRecord(0 if not pid else UNKNOWN_EXIT_STATUS, time.time_ns())
    try:
        # In this podshim's version: what a newer one recorded beyond it no longer exists.
        write_state(bundle, record.replace(version=STATE_VERSION, state=STATE_DELETED, exit=exit_info, tasks=tasks,
                                           oci=oci, rootfs=rootfs))
    except OSError as exc:
        log.warning("cannot update %s: %s", state_path, exc)
    return {"exit_status": exit_info.exit_status, "exited_at": exit_info.exited_at, "pid": pid}


def _unmount_sandbox_rootfs(bundle: str, rootfs: str) -> str:
    """Unmount the pause's rootfs (a sandbox image's) once the pause is gone; what is left of it
    ("" once unmounted). Only where the shim mounts one (``<bundle>/rootfs``)."""
    if not rootfs:
        return ""
    from shim.lib.rootfs import unmount_sandbox_rootfs
    from shim.runtime import mounts

    if os.path.normpath(rootfs) != os.path.normpath(mounts.sandbox_rootfs_path(os.path.abspath(bundle))):
        log.error("not unmounting %s, which is not the pause's rootfs in %s", rootfs, bundle)
        return rootfs
    try:
        unmount_sandbox_rootfs(rootfs)
    except (RpcError, OSError) as exc:
        log.error("cannot remove the pause's rootfs %s: %s", rootfs, getattr(exc, "message", exc))
        return rootfs
    return ""


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
