"""``containerd.task.v3.Task`` on the shim: containerd's containers as the shim's tasks.

containerd's CRI gives a container as an OCI bundle (config.json, made to join the pause's
namespaces by ``/proc/<pause pid>/ns/*``), the mounts of its root and FIFOs for its stdio; the
shim's TaskService takes its own fields (protocol.md 7.3). :func:`task_fields` translates the one
into the other and refuses, with a sentence, what the shim cannot apply. The task's output goes to
containerd's FIFOs from its first byte (CRI writes the container's log from them); the shim also
keeps its own CRI-format copy in its bundle (``logs/<id>.log``).

An exec is containerd's three calls (Exec, then Start and Wait with its ``exec_id``): Exec keeps
the process spec, Start runs it (the shim's ExecStart), Wait and Kill reach it by the shim's own
exec id, Delete forgets it. The sandbox's own id answers Connect, Pids and State (containerd's
reconnect, ``shim_load``).

A Task Create of the shim's own id on a shim whose sandbox was never created is containerd's plain
container (no sandbox: ``ctr run``): the shim makes it a pod of its own (:meth:`TaskV3._plain_pod`),
its id then names the container, and Shutdown (which containerd sends after its Delete) ends the pod
and the shim.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from google.protobuf.empty_pb2 import Empty
from google.protobuf.message import Message

from shim.api.handlers import NATIVE
from shim.containerd.api import load
from shim.containerd.events import Publisher, task_events
from shim.containerd.features import BIND_OPTIONS
from shim.containerd.services import pod_files, timestamp
from shim.containerd.stdio import ExecTerminal
from shim.lib import console
from shim.rpc.records import Record
from shim.rpc.records import set_field as _set
from shim.rpc.server import CallContext
from shim.rpc.status import FailedPrecondition, InvalidArgument, NotFound
from shim.runtime import execstream
from shim.sandbox.sandbox import State as SandboxState

if TYPE_CHECKING:
    from shim.sandbox.service import SandboxService
    from shim.sandbox.task_service import TaskService

__all__ = ["TaskV3", "task_fields", "Exec"]

task_pb2 = load("runtime.task.v3.shim_pb2")
tasktypes_pb2 = load("types.task.task_pb2")

#: The mounts every task gets from the shim whatever it asks (protocol.md 7.3, "Filesystem"): the
#: spec's own entries for them are containerd's way of saying the same.
STANDARD_MOUNTS = ("/proc", "/dev", "/dev/pts", "/dev/shm", "/dev/mqueue", "/sys", "/sys/fs/cgroup")
#: The namespaces a container shares with its pod, by the path of the pause's.
POD_NAMESPACES = ("network", "ipc", "uts")
_STATUS = {"created": tasktypes_pb2.CREATED, "running": tasktypes_pb2.RUNNING, "stopped": tasktypes_pb2.STOPPED}


def _read_spec(bundle: str) -> dict[str, Any]:
    if not os.path.isabs(bundle):
        raise InvalidArgument(f"bundle {bundle!r} must be an absolute path")
    try:
        with open(os.path.join(bundle, "config.json"), "rb") as f:
            spec = json.load(f)
    except OSError as exc:
        raise FailedPrecondition(f"cannot read {bundle}/config.json: {exc.strerror}") from None
    except ValueError as exc:
        raise InvalidArgument(f"{bundle}/config.json is not JSON: {exc}") from None
    if not isinstance(spec, dict):
        raise InvalidArgument(f"{bundle}/config.json is not an OCI spec (an object)")
    return spec


def _resources(linux: dict[str, Any], process: dict[str, Any]) -> dict[str, Any]:
    """The spec's ``linux.resources`` as the shim's resource keys (protocol.md 7.3, Update). The
    device rules are not among them: every task's cgroup holds containerd's default rules already."""
    given = linux.get("resources") or {}
    out: dict[str, Any] = {}
    cpu, memory, pids = given.get("cpu") or {}, given.get("memory") or {}, given.get("pids") or {}
    for key, value in (("cpu_shares", cpu.get("shares")), ("cpu_quota_us", cpu.get("quota")),
                       ("cpu_period_us", cpu.get("period")), ("memory_limit_bytes", memory.get("limit")),
                       ("memory_swap_limit_bytes", memory.get("swap")), ("pids_limit", pids.get("limit"))):
        if value:  # 0 and absent: containerd's "not set"
            out[key] = value
    for key, value in (("cpuset_cpus", cpu.get("cpus")), ("cpuset_mems", cpu.get("mems"))):
        if value:
            out[key] = value
    if given.get("hugepageLimits"):
        out["hugepage_limits"] = {h["pageSize"]: h["limit"] for h in given["hugepageLimits"]}
    if given.get("unified"):
        out["unified"] = dict(given["unified"])
    for key in ("blockIO", "network", "rdma"):
        if given.get(key):
            raise InvalidArgument(f"config.json linux.resources.{key} is not supported by podshim's shim")
    if process.get("oomScoreAdj") is not None:
        out["oom_score_adj"] = process["oomScoreAdj"]
    return out


def task_fields(spec: dict[str, Any], rootfs: list[Any], pause_pid: int,
                pod_files: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The shim's Create fields (protocol.md 7.3) of containerd's OCI ``spec`` and root ``rootfs``
    mounts, for a sandbox whose pause is ``pause_pid``. ``pod_files`` (container path → node path:
    the pod's hosts, resolv.conf, hostname) are bound first, each unless the spec mounts something
    there (as containerd's CRI does with its own), read-only when the root is. Raises
    InvalidArgument naming what the shim cannot apply."""
    process = spec.get("process") or {}
    linux = spec.get("linux") or {}
    if not process.get("args"):
        raise InvalidArgument("config.json process.args is empty")
    namespaces = {ns.get("type"): ns.get("path", "") for ns in linux.get("namespaces") or []}
    for kind in POD_NAMESPACES:
        if namespaces.get(kind) not in (f"/proc/{pause_pid}/ns/{'net' if kind == 'network' else kind}", None):
            raise InvalidArgument(f"config.json's {kind} namespace {namespaces[kind]!r} is not the pod's: a task "
                                  "of podshim's shim always shares its pod's network, IPC and UTS namespaces")
    if "pid" not in namespaces:
        pid_mode = "NODE"
    elif not namespaces["pid"]:
        pid_mode = "CONTAINER"
    elif namespaces["pid"] == f"/proc/{pause_pid}/ns/pid":
        pid_mode = "POD"
    else:
        raise InvalidArgument(f"config.json's pid namespace {namespaces['pid']!r} is neither the pod's nor a new "
                              "one: podshim's shim cannot join it")
    privileged = _privileged(linux.get("devices") or [])
    user = process.get("user") or {}
    readonly_rootfs = bool((spec.get("root") or {}).get("readonly"))
    spec_mounts = spec.get("mounts") or []
    fields: dict[str, Any] = {
        "args": list(process["args"]), "env": list(process.get("env") or []), "cwd": process.get("cwd") or "/",
        "pid_mode": pid_mode, "terminal": bool(process.get("terminal")),
        "user": {"uid": user.get("uid", 0), "gid": user.get("gid", 0),
                 "additional_gids": list(user.get("additionalGids") or [])},
        "capabilities": list((process.get("capabilities") or {}).get("bounding") or []),
        "no_new_privileges": bool(process.get("noNewPrivileges")),
        "rootfs": [{"type": m.type, "source": m.source, "options": list(m.options)} for m in rootfs],
        "readonly_rootfs": readonly_rootfs,
        "mounts": [*_pod_file_mounts(pod_files or {}, spec_mounts, readonly_rootfs), *_mounts(spec_mounts)],
        "masked_paths": list(linux.get("maskedPaths") or []),
        "readonly_paths": list(linux.get("readonlyPaths") or []),
        "resources": _resources(linux, process),
        "privileged": privileged,
    }
    if linux.get("seccomp"):
        fields["seccomp"] = linux["seccomp"]
    if process.get("rlimits"):
        fields["rlimits"] = process["rlimits"]  # OCI's {type, soft, hard}: the shim's own fields
    hooks = _hooks(spec.get("hooks"))
    if hooks:
        fields["hooks"] = hooks
    return fields


def _hooks(doc: Any) -> list[dict[str, Any]]:
    """config.json's ``hooks`` (an OCI runtime's: containerd's CDI devices', NRI's) as the shim's
    Create ``hooks``, which every handler runs at their points; InvalidArgument for a point the shim
    does not know."""
    if not doc:
        return []
    from shim.runtime.hooks import HOOK_NAMES

    if not isinstance(doc, dict):
        raise InvalidArgument("config.json hooks must be an object of the lifecycle points' hooks")
    unknown = sorted(set(doc) - set(HOOK_NAMES))
    if unknown:
        raise InvalidArgument(f"config.json hooks: the points are {', '.join(HOOK_NAMES)}, not {', '.join(unknown)}")
    return [{"hook_name": name, **{key: hook[key] for key in ("path", "args", "env", "timeout") if key in hook}}
            for name in HOOK_NAMES for hook in doc.get(name) or [] if isinstance(hook, dict)]


def _privileged(given: list[dict[str, Any]]) -> bool:
    """Whether config.json's ``linux.devices`` are a privileged container's: every device of the
    host's /dev, as containerd's CRI lists them (the shim then gives the task the host's devices, as
    it does a privileged task's, shim.runtime.mounts.host_devices); none: not privileged. Any other
    list is refused."""
    if not given:
        return False
    from shim.runtime.mounts import DEV_NODES, host_devices

    # the task's own /dev has these (ptmx: a link to its devpts' own)
    standard = {(f"/dev/{name}", "c", major, minor) for name, major, minor in (*DEV_NODES, ("ptmx", 5, 2))}
    listed = {(d.get("path"), d.get("type"), d.get("major"), d.get("minor")) for d in given} - standard
    host = {(d.path, d.kind, d.major, d.minor) for d in host_devices()}
    if listed != host:
        differ = ", ".join(str(path) for path, *_ in sorted(listed ^ host, key=str)[:3])
        raise InvalidArgument(f"config.json linux.devices: devices other than all of the host's (a privileged "
                              f"container's) are not yet given to containerd's containers by podshim's shim "
                              f"({differ} differ)")
    return True


def _pod_file_mounts(pod_files: Mapping[str, str], spec_mounts: list[dict[str, Any]],
                     readonly: bool) -> list[dict[str, Any]]:
    from shim.runtime.mounts import BindMount

    taken = {m.get("destination") for m in spec_mounts}
    options = ("rbind", "ro") if readonly else ("rbind",)
    return [BindMount(path, source, options).to_oci() for path, source in pod_files.items() if path not in taken]


def _mounts(mounts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, m in enumerate(mounts):
        destination = m.get("destination", "")
        if destination in STANDARD_MOUNTS:
            continue
        options = list(m.get("options") or [])
        kind = m.get("type", "bind")
        if kind == "tmpfs" and "bind" not in options and "rbind" not in options:
            from shim.runtime.mounts import tmpfs_refusal

            refused = tmpfs_refusal(options)
            if refused:
                raise InvalidArgument(f"config.json mounts[{i}] ({destination}) has {refused}")
            out.append({"destination": destination, "type": "tmpfs", "source": "tmpfs", "options": options})
            continue
        if kind != "bind" and "bind" not in options and "rbind" not in options:
            raise InvalidArgument(f"config.json mounts[{i}] ({destination}) is a {kind!r} mount: podshim's shim "
                                  "binds host paths and mounts tmpfs only")
        unknown = [o for o in options if o not in BIND_OPTIONS]
        if unknown:
            raise InvalidArgument(f"config.json mounts[{i}] ({destination}) has options podshim's shim cannot "
                                  f"apply: {', '.join(unknown)}")
        out.append({"destination": destination, "source": m.get("source", ""), "type": "bind", "options": options})
    return out


class Exec(Record):
    """An exec containerd made (Exec): its FIFOs; once started, the shim's exec id for it and its pid
    (``started`` is done then: containerd waits for an exec before it starts it), and what the shim
    holds of its stdio (shim.containerd.stdio: the stdin FIFO ``hold``, or its ``console``) until
    CloseIO or its end; once waited for, its exit."""

    __slots__ = ("args", "stdin", "stdout", "stderr", "terminal", "exec_id", "pid", "started", "exit", "hold",
                 "console", "rlimits")
    mutable = True
    args: list[str]
    stdin: str
    stdout: str
    stderr: str
    terminal: bool
    exec_id: str
    pid: int
    started: asyncio.Future[None]
    exit: dict[str, int] | None  # {exit_status, exited_at}
    hold: int | None
    console: ExecTerminal | None
    rlimits: list[Any] | None  # its process spec's (None: the task's)

    def __init__(self, args: list[str], stdin: str, stdout: str, stderr: str, terminal: bool, exec_id: str = "",
                 pid: int = 0, started: asyncio.Future[None] | None = None, exit: dict[str, int] | None = None,
                 hold: int | None = None, console: ExecTerminal | None = None, rlimits: list[Any] | None = None) -> None:
        self.args, self.stdin, self.stdout, self.stderr, self.terminal = args, stdin, stdout, stderr, terminal
        self.rlimits = rlimits
        self.exec_id, self.pid, self.exit, self.hold, self.console = exec_id, pid, exit, hold, console
        self.started = asyncio.get_running_loop().create_future() if started is None else started

    async def release(self) -> None:
        """Let go of the exec's stdio (its end, or Delete)."""
        if self.hold is not None:
            os.close(self.hold)
            self.hold = None
        if self.console is not None:
            await self.console.drained() if self.exit is not None else await self.console.aclose()
            self.console = None


class _Stdio(Record):
    __slots__ = ("stdin", "stdout", "stderr")
    stdin: str
    stdout: str
    stderr: str

    def __init__(self, stdin: str, stdout: str, stderr: str) -> None:
        _set(self, "stdin", stdin)
        _set(self, "stdout", stdout)
        _set(self, "stderr", stderr)


class TaskV3:
    """``containerd.task.v3.Task`` on the shim's TaskService (see the module's docstring)."""

    def __init__(self, service: SandboxService, tasks: TaskService, events: Publisher):
        self.service = service
        self.tasks = tasks
        self.events = events
        self.stdio: dict[str, _Stdio] = {}  # task id -> containerd's FIFOs, from Create to Start
        self.execs: dict[tuple[str, str], Exec] = {}  # (task id, containerd's exec id)
        self.consoles = 0  # console sockets made: each exec's has its own name
        self.plain = False  # the pod is a plain container's, of the shim's own id (containerd's `ctr run`)

    @property
    def sandbox_id(self) -> str:
        return self.service.sandbox.config.sandbox_id

    def _ids(self, task_id: str) -> dict[str, str]:
        if task_id == self.sandbox_id and not self.plain:
            raise FailedPrecondition(f"task {task_id} is the sandbox: containerd drives it through the Sandbox "
                                     "service")
        return {"sandbox_id": self.sandbox_id, "task_id": task_id}

    def _is_sandbox(self, task_id: str) -> bool:
        """Whether ``task_id`` names the pod itself (not a plain container of the shim's own id)."""
        return task_id == self.sandbox_id and not self.plain

    async def _plain_pod(self, ctx: CallContext, spec: dict[str, Any]) -> dict[str, Any]:
        """Make and start the pod of a plain container (Create of the shim's own id: containerd with no
        sandbox of its own, ``ctr run``): its own pause, and its network (or the node's, when the spec
        has no network namespace), IPC and UTS namespaces; ``spec`` with those joined."""
        linux = spec.get("linux") or {}
        namespaces = list(linux.get("namespaces") or [])
        for ns in namespaces:
            if ns.get("path") and ns.get("type") in (*POD_NAMESPACES, "pid"):
                raise InvalidArgument(f"config.json's {ns['type']} namespace {ns['path']!r}: a plain container of "
                                      "podshim's shim gets new namespaces or the node's, never given ones")
        kinds = {ns.get("type") for ns in namespaces}
        options: dict[str, Any] = {"runtime_handler": NATIVE, "linux": {"security_context": {"namespace_options": {
            "network": "POD" if "network" in kinds else "NODE"}}}}
        if spec.get("hostname"):
            options["hostname"] = spec["hostname"]
        self.plain = True
        await self.service.create(ctx, {"sandbox_id": self.sandbox_id, "options": options})
        pid = (await self.service.start(ctx, {"sandbox_id": self.sandbox_id}))["pid"]
        linux["namespaces"] = [{**ns, "path": f"/proc/{pid}/ns/{'net' if ns['type'] == 'network' else ns['type']}"}
                               if ns.get("type") in POD_NAMESPACES else ns for ns in namespaces]
        return {**spec, "linux": linux}

    def _exec(self, task_id: str, exec_id: str) -> Exec:
        found = self.execs.get((task_id, exec_id))
        if found is None:
            raise NotFound(f"exec {exec_id} not found in task {task_id}")
        return found

    async def create(self, ctx: CallContext, r: Any) -> Message:
        plain = r.id == self.sandbox_id and self.service.sandbox.state is SandboxState.NEW and not self.plain
        ids = {"sandbox_id": self.sandbox_id, "task_id": r.id} if plain else self._ids(r.id)
        if r.checkpoint or r.parent_checkpoint:
            raise InvalidArgument("restoring a checkpoint is not supported by podshim's shim")
        spec = _read_spec(r.bundle)
        if plain:
            spec = await self._plain_pod(ctx, spec)
        pause = self.service.sandbox.pause
        if pause is None:
            raise FailedPrecondition(f"sandbox {self.sandbox_id} is not running: its tasks cannot be created")
        files = pod_files(self.service.sandbox.config.bundle).written()  # none for a plain container's pod
        fields = task_fields(spec, list(r.rootfs), pause.pid, files)
        log_path = os.path.join(self.service.sandbox.config.bundle, "logs", f"{r.id}.log")
        await self.tasks.create(ctx, {**ids, **fields, "log_path": log_path, "stdin": bool(r.stdin)})
        self.stdio[r.id] = _Stdio(r.stdin, r.stdout, r.stderr)
        self.events.publish("/tasks/create", task_events.TaskCreate(
            container_id=r.id, bundle=r.bundle, rootfs=list(r.rootfs),
            io=task_events.TaskIO(stdin=r.stdin, stdout=r.stdout, stderr=r.stderr, terminal=r.terminal)))
        return task_pb2.CreateTaskResponse(pid=0)

    async def start(self, ctx: CallContext, r: Any) -> Message:
        ids = self._ids(r.id)
        if r.exec_id:
            ex = self._exec(r.id, r.exec_id)
            if ex.started.done():
                raise FailedPrecondition(f"exec {r.exec_id} of task {r.id} was started already")
            try:
                started = await self._exec_start(ctx, ids, ex)
            except BaseException as exc:
                await ex.release()
                if not ex.started.done():
                    ex.started.set_exception(FailedPrecondition(f"exec {r.exec_id} of task {r.id} did not start: "
                                                                f"{exc}"))
                    ex.started.exception()  # retrieved: a Wait may never come
                raise
            ex.exec_id, ex.pid = started["exec_id"], started["pid"]
            ex.started.set_result(None)
            self.events.publish("/tasks/exec-started", task_events.TaskExecStarted(
                container_id=r.id, exec_id=r.exec_id, pid=ex.pid))
            return task_pb2.StartResponse(pid=ex.pid)
        stdio = self.stdio.pop(r.id, _Stdio("", "", ""))
        taps = {stream: path for stream, path in (("stdout", stdio.stdout), ("stderr", stdio.stderr)) if path}
        task = await self.tasks.tasks.start(self.sandbox_id, r.id, taps=taps, stdin_fifo=stdio.stdin or None)
        self.events.publish("/tasks/start", task_events.TaskStart(container_id=r.id, pid=task.pid))
        return task_pb2.StartResponse(pid=task.pid)

    async def _exec_start(self, ctx: CallContext, ids: dict[str, str], ex: Exec) -> dict[str, Any]:
        """Run the exec with containerd's FIFOs (shim.containerd.stdio); ``{exec_id, pid}``."""
        call: dict[str, Any] = {**ids, "args": ex.args}
        if ex.rlimits is not None:
            call["rlimits"] = ex.rlimits
        if not ex.terminal:
            if ex.stdin:
                ex.hold = execstream.hold_fifo(ex.stdin, "stdin")
            return await self.tasks.exec_start(ctx, {**call, "stdin": ex.stdin or None,
                                                     "stdout": ex.stdout or None, "stderr": ex.stderr or None})
        ex.console = ExecTerminal()
        self.consoles += 1
        path = ex.console.listen(os.path.join(self.service.sandbox.config.bundle, f"exec-{self.consoles}.console"))
        started = await self.tasks.exec_start(ctx, {**call, "console_socket": path})
        try:
            await ex.console.attach(ex.stdin, ex.stdout)
        except BaseException:
            await self.tasks.exec_kill(ctx, {**ids, "exec_id": started["exec_id"]})
            raise
        return started

    async def delete(self, ctx: CallContext, r: Any) -> Message:
        if r.exec_id:
            ex = self._exec(r.id, r.exec_id)
            if ex.started.done() and ex.exit is None:
                raise FailedPrecondition(f"exec {r.exec_id} of task {r.id} is running: it cannot be deleted")
            del self.execs[(r.id, r.exec_id)]
            await ex.release()
            exit = ex.exit or {"exit_status": 0, "exited_at": 0}
            return task_pb2.DeleteResponse(pid=ex.pid, exit_status=exit["exit_status"],
                                           exited_at=timestamp(exit["exited_at"]))
        result = await self.tasks.delete(ctx, self._ids(r.id))
        self.stdio.pop(r.id, None)
        for key in [key for key in self.execs if key[0] == r.id]:
            await self.execs.pop(key).release()
        self.events.publish("/tasks/delete", task_events.TaskDelete(
            container_id=r.id, id=r.id, pid=result["pid"], exit_status=result["exit_status"],
            exited_at=timestamp(result["exited_at"])))
        return task_pb2.DeleteResponse(pid=result["pid"], exit_status=result["exit_status"],
                                       exited_at=timestamp(result["exited_at"]))

    async def exec(self, ctx: CallContext, r: Any) -> Message:
        self._ids(r.id)
        if (r.id, r.exec_id) in self.execs:
            raise InvalidArgument(f"exec {r.exec_id} already exists in task {r.id}")
        try:
            process = json.loads(r.spec.value) if r.spec.value else {}
        except ValueError as exc:
            raise InvalidArgument(f"the exec's process spec is not JSON: {exc}") from None
        if not process.get("args"):
            raise InvalidArgument("the exec's process spec has no args")
        rlimits = process.get("rlimits")
        if rlimits is not None:
            from shim.runtime.confine import parse_rlimits

            parse_rlimits(rlimits, "process.rlimits")  # refused now, not at its start
        self.execs[(r.id, r.exec_id)] = Exec(list(process["args"]), r.stdin, r.stdout, r.stderr, r.terminal,
                                             rlimits=rlimits)
        self.events.publish("/tasks/exec-added", task_events.TaskExecAdded(container_id=r.id, exec_id=r.exec_id))
        return Empty()

    async def wait(self, ctx: CallContext, r: Any) -> Message:
        ids = self._ids(r.id)
        if r.exec_id:
            ex = self._exec(r.id, r.exec_id)
            if ex.exit is None:
                await asyncio.shield(ex.started)  # containerd waits for an exec before it starts it
                exit = await self.tasks.exec_wait(ctx, {**ids, "exec_id": ex.exec_id})
                if ex.exit is None:
                    ex.exit = exit
                    await ex.release()  # its last output has reached containerd
            result = ex.exit
        else:
            result = await self.tasks.wait(ctx, ids)
        return task_pb2.WaitResponse(exit_status=result["exit_status"], exited_at=timestamp(result["exited_at"]))

    async def kill(self, ctx: CallContext, r: Any) -> Message:
        ids = self._ids(r.id)
        if r.exec_id:
            ex = self._exec(r.id, r.exec_id)
            if ex.exec_id:
                if r.signal not in (signal.SIGKILL, signal.SIGTERM):
                    raise InvalidArgument(f"signal {r.signal} to an exec: podshim's shim ends an exec with SIGKILL only")
                await self.tasks.exec_kill(ctx, {**ids, "exec_id": ex.exec_id})
        else:
            await self.tasks.kill(ctx, {**ids, "signal": r.signal or signal.SIGTERM, "all": r.all})
        return Empty()

    async def state(self, ctx: CallContext, r: Any) -> Message:
        if self._is_sandbox(r.id):
            return await self._sandbox_state(ctx, r)
        if r.exec_id:
            ex = self._exec(r.id, r.exec_id)
            if ex.exit is not None:
                return task_pb2.StateResponse(id=r.id, exec_id=r.exec_id, pid=ex.pid, status=tasktypes_pb2.STOPPED,
                                              exit_status=ex.exit["exit_status"],
                                              exited_at=timestamp(ex.exit["exited_at"]))
            return task_pb2.StateResponse(id=r.id, exec_id=r.exec_id, pid=ex.pid,
                                          status=tasktypes_pb2.RUNNING if ex.exec_id else tasktypes_pb2.CREATED)
        state = await self.tasks.state(ctx, self._ids(r.id))
        stdio = self.stdio.get(r.id, _Stdio("", "", ""))
        return task_pb2.StateResponse(
            id=r.id, pid=state["pid"], status=_STATUS.get(state["status"], tasktypes_pb2.UNKNOWN),
            stdout=stdio.stdout, stderr=stdio.stderr, terminal=state["terminal"], exit_status=state["exit_status"],
            exited_at=timestamp(state["exited_at"]))

    async def _sandbox_state(self, ctx: CallContext, r: Any) -> Message:
        if r.exec_id:
            raise NotFound(f"exec {r.exec_id} not found in task {r.id}")
        status = await self.service.status(ctx, {"sandbox_id": r.id})
        return task_pb2.StateResponse(
            id=r.id, bundle=self.service.sandbox.config.bundle, pid=status["pid"],
            status=_STATUS.get(status["state"], tasktypes_pb2.STOPPED), exit_status=status["exit_status"],
            exited_at=timestamp(status["exited_at"]))

    async def pids(self, ctx: CallContext, r: Any) -> Message:
        if self._is_sandbox(r.id):
            pause = self.service.sandbox.pause
            pid = pause.pid if pause is not None else 0
        else:
            pid = (await self.tasks.state(ctx, self._ids(r.id)))["pid"]
        return task_pb2.PidsResponse(processes=[tasktypes_pb2.ProcessInfo(pid=pid)] if pid else [])

    async def connect(self, ctx: CallContext, r: Any) -> Message:
        if self._is_sandbox(r.id):
            pause = self.service.sandbox.pause
            pid = pause.pid if pause is not None else 0
        else:
            pid = (await self.tasks.state(ctx, self._ids(r.id)))["pid"]
        return task_pb2.ConnectResponse(shim_pid=os.getpid(), task_pid=pid)

    async def resize_pty(self, ctx: CallContext, r: Any) -> Message:
        if r.exec_id:
            ex = self._exec(r.id, r.exec_id)
            if not ex.terminal:
                raise FailedPrecondition(f"exec {r.exec_id} of task {r.id} has no terminal to resize")
            console.check_size("width", r.width)
            console.check_size("height", r.height)
            if ex.console is not None:  # (before Start, or after its end: nothing to resize)
                try:
                    ex.console.resize(r.width, r.height)
                except OSError as exc:
                    raise FailedPrecondition(f"cannot resize exec {r.exec_id}'s terminal: {exc.strerror}") from None
            return Empty()
        await self.tasks.resize_pty(ctx, {**self._ids(r.id), "width": r.width, "height": r.height})
        return Empty()

    async def close_io(self, ctx: CallContext, r: Any) -> Message:
        if r.exec_id:
            ex = self._exec(r.id, r.exec_id)
            if ex.hold is not None:
                os.close(ex.hold)
                ex.hold = None
            if ex.console is not None:
                ex.console.close_stdin()
        else:
            await self.tasks.close_stdin(ctx, self._ids(r.id))
        return Empty()

    async def update(self, ctx: CallContext, r: Any) -> Message:
        try:
            resources = json.loads(r.resources.value) if r.resources.value else {}
        except ValueError as exc:
            raise InvalidArgument(f"the task's resources are not JSON (OCI LinuxResources): {exc}") from None
        if r.annotations:
            raise InvalidArgument("Update with annotations is not supported by podshim's shim")
        await self.tasks.update(ctx, {**self._ids(r.id), "resources": _resources({"resources": resources}, {})})
        return Empty()

    async def stats(self, ctx: CallContext, r: Any) -> Message:
        from shim.containerd.metrics import cgroup_metrics  # (the cgroups schema, only when asked)
        from shim.sandbox.tasks import Op

        ids = self._ids(r.id)
        task = self.tasks.tasks.get(ids["sandbox_id"], r.id)
        task.check(Op.STATS)
        if task.cgroup is None:
            raise FailedPrecondition(f"task {r.id} has no cgroup: it was never started")
        return task_pb2.StatsResponse(stats=cgroup_metrics(task.cgroup))

    async def unsupported(self, ctx: CallContext, r: Any) -> Message:
        self._ids(r.id)
        raise FailedPrecondition(f"task {r.id}: podshim's shim does not support this call for containerd's "
                                 "containers (Pause, Resume, Checkpoint)")

    async def shutdown(self, ctx: CallContext, r: Any) -> Message:
        # containerd sends it to the shim of a plain container (after its Delete), which ends then
        # with the container's pod; a sandbox's shim ends with ShutdownSandbox.
        if self.plain or self.service.sandbox.state is SandboxState.NEW:
            if self.service.sandbox.state is not SandboxState.NEW:
                await self.service.stop(ctx, {"sandbox_id": self.sandbox_id, "timeout_secs": 0})
            await self.service.shutdown(ctx, {"sandbox_id": self.sandbox_id})
        return Empty()
