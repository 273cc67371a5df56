"""``<bundle>/state.json``: what a shim made, written before it is made, read by ``podshim delete``.

One schema, :class:`SandboxRecord`, for every writer and reader: the process that forks a shim
writes the first record (:func:`shim.launch.spawn.spawn_shim`; a spare shim writes its own), the
shim's :class:`~shim.sandbox.sandbox.Sandbox` rewrites it on every change, and ``podshim delete``
(:mod:`shim.cleanup`) reads it to undo what is left and writes it back as ``deleted``. The file
is a JSON map with sorted keys; nested records that belong to another layer are kept as that
layer writes them: ``cgroup`` (:meth:`shim.kernel.cgroups.SandboxCgroup.to_dict`) and ``oci``
(:meth:`shim.runtime.oci.backend.OciBackend.record`).

Versions (``version``; a reader takes any version, fields it does not know are ignored and
fields it misses have their defaults):

- none: records written before the schema had a version. The same keys as version 1, except
  that ``tasks`` (before the Task service), ``runtime_handler`` and ``oci`` (before the OCI
  runtime handlers) may be missing, and the first record written by a spawner has only
  ``namespace``, ``sandbox_id``, ``state``, ``shim_pid``, ``shim_start_time`` and ``socket_path``.
- 1: every key, always, and ``version``; a task's ``rootfs`` (where the shim mounts its root) is
  missing in records written before tasks had one, the sandbox's ``rootfs`` (where the shim mounts
  the pause's root, a sandbox image's) in records written before sandboxes had one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from shim.api.paths import STATE_FILE
from shim.lib.files import Rewriter, json_document, read_json, write_json_atomic
from shim.rpc.records import Record
from shim.rpc.records import set_field as _set

__all__ = ["STATE_DELETED", "STATE_NEW", "STATE_VERSION", "ExitRecord", "MalformedRecord", "PauseRecord",
           "SandboxRecord", "StateFile", "TaskRecord", "read_state", "write_state"]

STATE_VERSION = 1
#: The state of a shim that serves no sandbox yet (:attr:`shim.sandbox.sandbox.State.NEW`).
STATE_NEW = "new"
#: The state ``podshim delete`` leaves: nothing of the sandbox is left.
STATE_DELETED = "deleted"
_UNVERSIONED = 0


class MalformedRecord(ValueError):
    """A state.json map with a field of the wrong type (the sentence names it)."""


class ExitRecord(Record):
    __slots__ = ("exit_status", "exited_at")
    exit_status: int
    exited_at: int  # ns since the epoch

    def __init__(self, exit_status: int, exited_at: int) -> None:
        _set(self, "exit_status", exit_status)
        _set(self, "exited_at", exited_at)

    def to_dict(self) -> dict[str, Any]:
        return {"exit_status": self.exit_status, "exited_at": self.exited_at}

    @classmethod
    def from_dict(cls, doc: Any, where: str) -> ExitRecord | None:
        if doc is None:
            return None
        doc = _map(doc, where)
        return cls(_int(doc, "exit_status", where), _int(doc, "exited_at", where))


class PauseRecord(Record):
    """The pause: ``(pid, start_time)`` names it across pid reuse; ``binary`` is what it runs."""

    __slots__ = ("pid", "start_time", "binary")
    pid: int
    start_time: int | None
    binary: str

    def __init__(self, pid: int, start_time: int | None, binary: str) -> None:
        _set(self, "pid", pid)
        _set(self, "start_time", start_time)
        _set(self, "binary", binary)

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "start_time": self.start_time, "binary": self.binary}

    @classmethod
    def from_dict(cls, doc: Any, where: str) -> PauseRecord | None:
        if doc is None:
            return None
        doc = _map(doc, where)
        return cls(_int(doc, "pid", where), _optional(doc, "start_time", int, where),
                   _optional(doc, "binary", str, where) or "")


class TaskRecord(Record):
    """A task: its status, its process ``(pid, start_time)`` once started, its cgroup's record
    (made before its process), its exit once seen, and ``rootfs``: the directory where the shim
    mounts its root (recorded before anything is mounted there; "" for none)."""

    __slots__ = ("status", "pid", "start_time", "cgroup", "pid_mode", "log_path", "exit", "rootfs")
    status: str
    pid: int
    start_time: int | None
    cgroup: Mapping[str, Any] | None
    pid_mode: str
    log_path: str
    exit: ExitRecord | None
    rootfs: str

    def __init__(self, status: str, pid: int = 0, start_time: int | None = None,
                 cgroup: Mapping[str, Any] | None = None, pid_mode: str = "", log_path: str = "",
                 exit: ExitRecord | None = None, rootfs: str = "") -> None:
        _set(self, "status", status)
        _set(self, "pid", pid)
        _set(self, "start_time", start_time)
        _set(self, "cgroup", cgroup)
        _set(self, "pid_mode", pid_mode)
        _set(self, "log_path", log_path)
        _set(self, "exit", exit)
        _set(self, "rootfs", rootfs)

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "pid": self.pid, "start_time": self.start_time,
                "cgroup": dict(self.cgroup) if self.cgroup is not None else None, "pid_mode": self.pid_mode,
                "log_path": self.log_path, "exit": self.exit.to_dict() if self.exit is not None else None,
                "rootfs": self.rootfs}

    @classmethod
    def from_dict(cls, doc: Any, where: str) -> TaskRecord:
        doc = _map(doc, where)
        return cls(
            status=_optional(doc, "status", str, where) or "",
            pid=_optional(doc, "pid", int, where) or 0,
            start_time=_optional(doc, "start_time", int, where),
            cgroup=_optional(doc, "cgroup", Mapping, where),
            pid_mode=_optional(doc, "pid_mode", str, where) or "",
            log_path=_optional(doc, "log_path", str, where) or "",
            exit=ExitRecord.from_dict(doc.get("exit"), f"{where}.exit"),
            rootfs=_optional(doc, "rootfs", str, where) or "",
        )


class SandboxRecord(Record):
    """One shim and what its sandbox made: the shim ``(shim_pid, shim_start_time)`` and its
    socket, the netns (``netns_owned``: made by the shim, so removed by it), the cgroup, the
    pause, the tasks by id, and the runtime handler with the OCI runtime's containers."""

    __slots__ = ("namespace", "sandbox_id", "state", "shim_pid", "shim_start_time", "socket_path", "netns_path",
                 "netns_owned", "cgroup", "pause", "created_at", "exit", "tasks", "runtime_handler", "oci", "rootfs",
                 "version")
    namespace: str
    sandbox_id: str
    state: str
    shim_pid: int
    shim_start_time: int | None
    socket_path: str | None
    netns_path: str | None
    netns_owned: bool
    cgroup: Mapping[str, Any] | None
    pause: PauseRecord | None
    created_at: int  # ns since the epoch
    exit: ExitRecord | None
    tasks: Mapping[str, TaskRecord]
    runtime_handler: str | None  # None: not chosen yet (before CreateSandbox)
    oci: Mapping[str, Any] | None
    rootfs: str  # <bundle>/rootfs while the pause's root (a sandbox image's) may be mounted there
    version: int

    def __init__(self, namespace: str, sandbox_id: str, state: str, shim_pid: int, shim_start_time: int | None,
                 socket_path: str | None, netns_path: str | None = None, netns_owned: bool = False,
                 cgroup: Mapping[str, Any] | None = None, pause: PauseRecord | None = None, created_at: int = 0,
                 exit: ExitRecord | None = None, tasks: Mapping[str, TaskRecord] | None = None,
                 runtime_handler: str | None = None, oci: Mapping[str, Any] | None = None, rootfs: str = "",
                 version: int = STATE_VERSION) -> None:
        _set(self, "namespace", namespace)
        _set(self, "sandbox_id", sandbox_id)
        _set(self, "state", state)
        _set(self, "shim_pid", shim_pid)
        _set(self, "shim_start_time", shim_start_time)
        _set(self, "socket_path", socket_path)
        _set(self, "netns_path", netns_path)
        _set(self, "netns_owned", netns_owned)
        _set(self, "cgroup", cgroup)
        _set(self, "pause", pause)
        _set(self, "created_at", created_at)
        _set(self, "exit", exit)
        _set(self, "tasks", {} if tasks is None else tasks)
        _set(self, "runtime_handler", runtime_handler)
        _set(self, "oci", oci)
        _set(self, "rootfs", rootfs)
        _set(self, "version", version)

    def to_dict(self) -> dict[str, Any]:
        """The JSON map of state.json."""
        return {
            "version": self.version,
            "namespace": self.namespace,
            "sandbox_id": self.sandbox_id,
            "state": self.state,
            "shim_pid": self.shim_pid,
            "shim_start_time": self.shim_start_time,
            "socket_path": self.socket_path,
            "netns_path": self.netns_path,
            "netns_owned": self.netns_owned,
            "cgroup": dict(self.cgroup) if self.cgroup is not None else None,
            "pause": self.pause.to_dict() if self.pause is not None else None,
            "created_at": self.created_at,
            "exit": self.exit.to_dict() if self.exit is not None else None,
            "tasks": {task_id: task.to_dict() for task_id, task in self.tasks.items()},
            "runtime_handler": self.runtime_handler,
            "oci": dict(self.oci) if self.oci is not None else None,
            "rootfs": self.rootfs,
        }

    @classmethod
    def from_dict(cls, doc: Any) -> SandboxRecord:
        """Read a state.json map of any version (see the module's docstring). Raises
        MalformedRecord naming the field that has the wrong type."""
        doc = _map(doc, "state.json")
        tasks = _optional(doc, "tasks", Mapping, "state.json") or {}
        return cls(
            version=_optional(doc, "version", int, "state.json") or _UNVERSIONED,
            namespace=_optional(doc, "namespace", str, "state.json") or "",
            sandbox_id=_optional(doc, "sandbox_id", str, "state.json") or "",
            state=_optional(doc, "state", str, "state.json") or "",
            shim_pid=_optional(doc, "shim_pid", int, "state.json") or 0,
            shim_start_time=_optional(doc, "shim_start_time", int, "state.json"),
            socket_path=_optional(doc, "socket_path", str, "state.json"),
            netns_path=_optional(doc, "netns_path", str, "state.json"),
            netns_owned=bool(_optional(doc, "netns_owned", bool, "state.json")),
            cgroup=_optional(doc, "cgroup", Mapping, "state.json"),
            pause=PauseRecord.from_dict(doc.get("pause"), "state.json pause"),
            created_at=_optional(doc, "created_at", int, "state.json") or 0,
            exit=ExitRecord.from_dict(doc.get("exit"), "state.json exit"),
            tasks={str(task_id): TaskRecord.from_dict(task, f"state.json task {task_id}")
                   for task_id, task in tasks.items()},
            runtime_handler=_optional(doc, "runtime_handler", str, "state.json"),
            oci=_optional(doc, "oci", Mapping, "state.json"),
            rootfs=_optional(doc, "rootfs", str, "state.json") or "",
        )


def read_state(bundle: str) -> SandboxRecord | None:
    """The record in ``bundle``, or None when there is none. Raises ValueError (naming the file)
    when it is not a JSON map, MalformedRecord (naming the file and the field) when a field has
    the wrong type, OSError when it cannot be read."""
    path = os.path.join(bundle, STATE_FILE)
    try:
        doc = read_json(path)
    except FileNotFoundError:
        return None
    if not isinstance(doc, Mapping):
        raise ValueError(f"{path} does not hold a map")
    try:
        return SandboxRecord.from_dict(doc)
    except MalformedRecord as exc:
        raise MalformedRecord(f"{path}: {exc}") from None


def write_state(bundle: str, record: SandboxRecord) -> None:
    """Replace the record in ``bundle`` atomically (not fsync'd: a reboot ends every shim anyway).
    Raises OSError."""
    write_json_atomic(os.path.join(bundle, STATE_FILE), record.to_dict(), durable=False)


class StateFile:
    """The record in one bundle as its shim rewrites it on every change (:meth:`Sandbox.persist
    <shim.sandbox.sandbox.Sandbox.persist>`): :func:`write_state`'s file and guarantee, without
    a new inode for each version (:class:`shim.lib.files.Rewriter`). :meth:`close` removes what
    it keeps between writes."""

    def __init__(self, bundle: str) -> None:
        self._file = Rewriter(os.path.join(bundle, STATE_FILE))

    def write(self, record: SandboxRecord) -> None:
        """Replace the record. Raises OSError."""
        self._file.write(json_document(record.to_dict()))

    def close(self) -> None:
        """Remove the spare version kept for the next write (idempotent)."""
        self._file.close()

    @staticmethod
    def remove_leftovers(bundle: str) -> list[str]:
        """Remove what the StateFile of a killed shim left in ``bundle`` (`podshim delete`, once
        the shim is gone: :meth:`shim.lib.files.Rewriter.remove_leftovers`)."""
        return Rewriter.remove_leftovers(os.path.join(bundle, STATE_FILE))


def _map(doc: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise MalformedRecord(f"{where} is not a map")
    return doc


def _optional(doc: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    value = doc.get(key)
    # JSON has no separate bool: a bool is never taken for an int.
    if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
        raise MalformedRecord(f"{where}: {key} is {value!r}, not {_KIND_NAMES.get(kind, kind.__name__)}")
    return value


def _int(doc: Mapping[str, Any], key: str, where: str) -> int:
    value: int | None = _optional(doc, key, int, where)
    if value is None:
        raise MalformedRecord(f"{where}: {key} is missing")
    return value


_KIND_NAMES = {int: "an integer", str: "a string", bool: "true or false", Mapping: "a map"}
