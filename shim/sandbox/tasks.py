"""The sandbox's tasks (containers): what may happen to a task in which state, and what it owns.

The rules are the table below; a call in a state the table does not allow gets the error the
table names, with a sentence. A task owns its process (started by the sandbox's runtime,
:class:`shim.runtime.base.Runtime`, in the pause's namespaces), its cgroup ``<sandbox cgroup>/<task id>``
and its log (:mod:`shim.runtime.crilog`).
The cgroup is recorded in ``<bundle>/state.json`` before the process is launched into it, and
the process's (pid, start time) as soon as it runs, so ``podshim delete`` can end it after a
crash.

A task's life: Create records it; Start launches it; the reaper reports its exit; its log
pipes are drained; then it is stopped, Wait answers and ``/tasks/exit`` is published; Delete
removes its cgroup and forgets it. Stopping or shutting down the sandbox kills every task and
waits for their exits first (:meth:`TaskSet.stop_all`). While it runs, commands may be run beside
it (Exec, :mod:`shim.runtime.execsync`), its cgroup read (Stats) and changed (Update), and its log
file reopened (ReopenLog).
"""

from __future__ import annotations

import asyncio
import builtins
import enum
import functools
import logging
import os
import signal
import time
from collections.abc import Mapping
from typing import Any

from shim.api.identifiers import validate_identifier
from shim.api.topics import TOPIC_TASK_EXIT
from shim.kernel import devices, linux
from shim.kernel.cgroups import SandboxCgroup, no_metrics, systemd
from shim.kernel.netns import NamespaceNotFound
from shim.kernel.reaper import ExitInfo
from shim.lib import console
from shim.lib.console import Console
from shim.lib.files import ensure_private_dir
from shim.lib.idmaps import IdMap
from shim.lib.rootfs import mount_rootfs, unmount_rootfs
from shim.rpc.status import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, RpcError, Unavailable
from shim.runtime import execstream, execsync, mounts, process
from shim.runtime.base import CONTAINER, PID_MODES, POD, TARGET, ExecSpec, TaskSpec
from shim.runtime.confine import Confinement, Rlimit
from shim.runtime.crilog import LOG_DIR_MODE, CriLog, check_log_path
from shim.runtime.hooks import Hook
from shim.runtime.hostdevices import GivenDevice
from shim.runtime.mounts import TaskFilesystem
from shim.runtime.pause import PauseProcess
from shim.sandbox.record import ExitRecord, TaskRecord
from shim.sandbox.sandbox import KILL_WAIT_TIMEOUT, ExitResult, Sandbox, State

__all__ = ["POD", "CONTAINER", "LOG_DRAIN_TIMEOUT", "Status", "TaskOperation", "TRANSITIONS", "REFUSALS",
           "transition", "Task", "TaskSet"]

log = logging.getLogger(__name__)

#: After a task's process exited, how long (seconds) its log pipes may stay open (held by a
#: process that left the task's cgroup) before the shim stops reading them.
LOG_DRAIN_TIMEOUT = 2.0
_MAX_SIGNAL = signal.SIGRTMAX


class Status(str, enum.Enum):
    CREATED = "created"    # Create recorded it; no process yet
    RUNNING = "running"    # its process runs, or has exited and its log is being drained
    STOPPED = "stopped"    # its process exited; exit status known, log complete
    DELETED = "deleted"    # Delete removed it (it is no longer in the table)


class TaskOperation(str, enum.Enum):
    START = "start"    # Start
    EXIT = "exit"      # its process exited and its log is drained
    KILL = "kill"      # Kill
    DELETE = "delete"  # Delete
    WAIT = "wait"      # Wait
    STATE = "state"    # State
    EXEC = "exec"      # Exec: a command beside the running task
    STATS = "stats"    # Stats
    UPDATE = "update"  # Update: its cgroup's resources
    REOPEN_LOG = "reopen_log"  # ReopenLog


T, Op = Status, TaskOperation
#: (operation, status) -> status after it succeeds. A pair that is not here is refused with
#: FailedPrecondition and the sentence in REFUSALS, else "cannot {op} task {id} while it is {status}".
TRANSITIONS: dict[tuple[TaskOperation, Status], Status] = {
    (Op.START, T.CREATED): T.RUNNING,
    (Op.EXIT, T.RUNNING): T.STOPPED,
    (Op.KILL, T.RUNNING): T.RUNNING,
    (Op.KILL, T.STOPPED): T.STOPPED,  # killing an exited task does nothing
    (Op.DELETE, T.CREATED): T.DELETED,
    (Op.DELETE, T.STOPPED): T.DELETED,
    # operations on what runs: status unchanged
    **{(op, T.RUNNING): T.RUNNING for op in (Op.EXEC, Op.UPDATE, Op.REOPEN_LOG)},
    # read-only operations: allowed, status unchanged
    **{(op, st): st for op in (Op.WAIT, Op.STATE, Op.STATS) for st in (T.CREATED, T.RUNNING, T.STOPPED)},
}
REFUSALS: dict[tuple[TaskOperation, Status], str] = {
    (Op.START, T.RUNNING): "task {id} is already running",
    (Op.START, T.STOPPED): "task {id} has exited; a stopped task cannot be started again",
    (Op.KILL, T.CREATED): "task {id} has not been started",
    (Op.DELETE, T.RUNNING): "task {id} is running; kill it and wait for its exit before deleting it",
    **{(op, T.CREATED): "task {id} is not running: it has not been started"
       for op in (Op.EXEC, Op.UPDATE, Op.REOPEN_LOG)},
    **{(op, T.STOPPED): "task {id} is not running: it has exited" for op in (Op.EXEC, Op.UPDATE, Op.REOPEN_LOG)},
}


def transition(op: TaskOperation, status: Status, task_id: str) -> Status:
    """The status after ``op`` in ``status``; FailedPrecondition with the table's sentence
    (naming ``task_id``) when it does not allow it. Pure: changes nothing."""
    nxt = TRANSITIONS.get((op, status))
    if nxt is None:
        template = REFUSALS.get((op, status), "cannot {op} task {id} while it is {status}")
        raise FailedPrecondition(template.format(id=task_id, op=op.value, status=status.value))
    return nxt


class Task:
    """One task: what Create asked for, and what Start made. Changed only through :class:`TaskSet`."""

    def __init__(self, task_id: str, *, args: builtins.list[str], env: dict[str, str], cwd: str, log_path: str,
                 pid_mode: str, labels: dict[str, str], confinement: Confinement | None = None,
                 filesystem: TaskFilesystem = TaskFilesystem(), rootfs: str = "", stdin: bool = False,  # noqa: B008 - a frozen Record, shared safely
                 pid_target: str | None = None, terminal: bool = False, resources: dict[str, Any] | None = None,
                 devices: tuple[GivenDevice, ...] = (), hooks: tuple[Hook, ...] = ()):
        self.task_id = task_id
        self.devices = devices  # the host devices it is given
        self.hooks = hooks  # its OCI hooks (its CDI devices')
        # Create's resources (protocol.md 7.3): its cgroup gets them before its process runs,
        # and the process its oom_score_adj.
        self.resources = {k: v for k, v in (resources or {}).items() if k != "oom_score_adj" and v is not None}
        self.oom_score_adj: int | None = (resources or {}).get("oom_score_adj")
        self.pid_target = pid_target  # pid_mode TARGET: the task whose pid namespace it joins
        self.filesystem = filesystem
        self.rootfs = rootfs  # <bundle>/tasks/<task id>/rootfs: its root's mount point; "" once removed
        self.args = args
        self.env = env
        self.cwd = cwd
        self.log_path = log_path
        self.pid_mode = pid_mode
        self.labels = labels
        self.confinement = confinement or Confinement()
        self.status = T.CREATED
        self.created_at = time.time_ns()
        self.started_at = 0
        self.process: process.Process | None = None
        self.cgroup: SandboxCgroup | None = None
        self.crilog: CriLog | None = None  # while it runs: the writer of its log file
        self.execs = 0  # Exec and ExecStart calls so far (each exec's id)
        self.stdin = stdin  # Create's stdin: a FIFO kept open through the shim while it runs
        self.stdin_fifo: execstream.TaskStdin | None = None
        self.terminal = terminal  # Create's terminal: its stdio is a pseudo-terminal whose master the shim holds
        self.terminal_input: asyncio.Task[None] | None = None  # copies the stdin FIFO to the master
        self.streamed: dict[str, tuple[process.Process, int]] = {}  # ExecStart's execs: exec id -> (leader, session)
        self.exit: ExitResult | None = None
        self.exited = asyncio.Event()
        # Start and Delete of one task take turns; so does stop_all with an in-flight Start.
        self.lock = asyncio.Lock()

    @property
    def stdin_path(self) -> str:
        """The task's stdin FIFO while the shim keeps it open, else ""."""
        fifo = self.stdin_fifo
        return fifo.path if fifo is not None and fifo.write_fd is not None else ""

    @property
    def pid(self) -> int:
        return self.process.pid if self.process is not None else 0

    def exec_confinement(self, rlimits: tuple[Rlimit, ...] | None) -> Confinement:
        """An exec's confinement: the task's, with its own ``rlimits`` when it gives some (as runc's exec)."""
        return self.confinement if rlimits is None else self.confinement.replace(rlimits=rlimits)

    def check(self, op: TaskOperation) -> Status:
        """The status after ``op``; FailedPrecondition with the table's sentence if not allowed."""
        return transition(op, self.status, self.task_id)

    def state(self) -> dict[str, Any]:
        """The State payload."""
        return {
            "task_id": self.task_id,
            "pid": self.pid,
            "status": self.status.value,
            "exit_status": self.exit.exit_status if self.exit else 0,
            "exited_at": self.exit.exited_at if self.exit else 0,
            "oom_killed": self.exit.oom_killed if self.exit else False,
            "started_at": self.started_at,
            "created_at": self.created_at,
            "log_path": self.log_path,
            "pid_mode": self.pid_mode,
            "args": list(self.args),
            "labels": dict(self.labels),
            "stdin": self.stdin_path,
            "terminal": self.terminal,
        }

    def record(self) -> TaskRecord:
        """What ``podshim delete`` needs to end this task (state.json)."""
        p = self.process
        return TaskRecord(
            status=self.status.value,
            pid=p.pid if p is not None else 0,
            start_time=p.start_time if p is not None else None,
            cgroup=self.cgroup.to_dict() if self.cgroup is not None else None,
            pid_mode=self.pid_mode,
            log_path=self.log_path,
            exit=ExitRecord(self.exit.exit_status, self.exit.exited_at) if self.exit is not None else None,
            rootfs=self.rootfs,
        )


class TaskSet:
    """The tasks of one sandbox. Attaches itself to ``sandbox`` (``sandbox.tasks``), which then
    records the tasks in state.json and stops them before its pause. Public coroutines raise
    typed RpcErrors."""

    def __init__(self, sandbox: Sandbox):
        self.sandbox = sandbox
        self._tasks: dict[str, Task] = {}
        self._closed = False  # the sandbox is stopping: no task may start any more
        self._exits: set[asyncio.Task[None]] = set()
        sandbox.tasks = self

    # -- lookups --------------------------------------------------------------------------
    def get(self, sandbox_id: str, task_id: str) -> Task:
        """The task ``task_id``; NotFound for another sandbox or an unknown task."""
        self.sandbox.check_id(sandbox_id)
        validate_identifier("task_id", task_id)
        task = self._tasks.get(task_id)
        if task is None:
            raise NotFound(f"task {task_id} not found in sandbox {self.sandbox.config.sandbox_id}")
        return task

    def list(self, sandbox_id: str) -> builtins.list[Task]:
        self.sandbox.check_id(sandbox_id)
        return list(self._tasks.values())

    def _device_rules(self, task: Task) -> devices.DeviceRules:
        """The device rules of ``task``'s cgroup: every device for a privileged task of a privileged
        pod (containerd's privileged container); else the default ones and those of the devices it
        is given. A privileged task of another pod keeps those: its cgroup's parent, the pause's,
        allows no more."""
        if task.filesystem.privileged and self.sandbox.options.privileged:
            return devices.ALL_DEVICES
        return devices.DEFAULT_RULES.plus(given.rule for given in task.devices)

    def _running_pause(self) -> PauseProcess:
        sb = self.sandbox
        if self._closed or sb.state is not State.RUNNING or sb.pause is None or sb.pause.exit.done():
            state = "stopping" if self._closed and sb.state is State.RUNNING else sb.state.value
            raise FailedPrecondition(f"sandbox {sb.config.sandbox_id} is not running (it is {state})")
        return sb.pause

    def _persist(self) -> None:
        self.sandbox.persist()

    # -- operations -----------------------------------------------------------------------
    async def create(self, sandbox_id: str, task_id: str, *, args: builtins.list[str], env: builtins.list[str] | None = None,
                     cwd: str | None = None, log_path: str, pid_mode: str = CONTAINER,
                     labels: dict[str, str] | None = None, confinement: Confinement | None = None,
                     filesystem: TaskFilesystem = TaskFilesystem(), stdin: bool = False,  # noqa: B008 - a frozen Record, shared safely
                     pid_target: str | None = None, terminal: bool = False,
                     resources: dict[str, Any] | None = None, devices: tuple[GivenDevice, ...] = (),
                     hooks: tuple[Hook, ...] = ()) -> Task:
        """Create: check the request and record the task; its log's directories are made (0755)
        and its ``filesystem.rootfs`` (without one, a root of its own: mounts.OWN_ROOT) mounted on
        ``<bundle>/tasks/<task_id>/rootfs`` (recorded first; unmounted again when the mount fails).

        ``resources`` (Update's keys) are checked against the sandbox's cgroup now and written to the
        task's at Start, before its process runs; ``oom_score_adj`` is its process's.

        Raises InvalidArgument (also naming a resource this host cannot apply), AlreadyExists,
        FailedPrecondition (the sandbox is not running; a rootfs that cannot be mounted).
        """
        self.sandbox.check_id(sandbox_id)
        validate_identifier("task_id", task_id)
        if not args or not all(isinstance(a, str) and "\0" not in a for a in args) or not args[0]:
            raise InvalidArgument("field 'args' must be a non-empty array of strings without NUL")
        environment = _environment(env or [])
        cwd = cwd or "/"
        if not os.path.isabs(cwd):
            raise InvalidArgument(f"cwd {cwd!r} must be an absolute path")
        if not os.path.isabs(log_path) or "\0" in log_path:
            raise InvalidArgument(f"log_path {log_path!r} must be an absolute path")
        if pid_mode not in PID_MODES:
            raise InvalidArgument(f"pid_mode {pid_mode!r} is not supported ({', '.join(PID_MODES)})")
        if (pid_mode == TARGET) != (pid_target is not None):
            raise InvalidArgument("field 'pid_target' (a task of this sandbox) goes with pid_mode TARGET, and only "
                                  "with it")
        self._running_pause()
        if pid_mode == TARGET and (pid_target not in self._tasks or pid_target == task_id):
            raise NotFound(f"pid_target {pid_target} is not a task of sandbox {self.sandbox.config.sandbox_id}")
        if confinement is not None and self.sandbox.runtime is not None:
            self.sandbox.runtime.check_confinement(confinement)
        if resources:
            _check_resources(self.sandbox, resources)
        if task_id in self._tasks:
            raise AlreadyExists(f"task {task_id} already exists (it is {self._tasks[task_id].status.value})")
        try:
            ensure_private_dir(os.path.dirname(log_path), LOG_DIR_MODE, keep_mode=True)
        except OSError as exc:
            raise FailedPrecondition(f"cannot make the directory of log_path {log_path}: {exc.strerror}") from None
        try:
            check_log_path(log_path)
        except OSError as exc:
            raise FailedPrecondition(f"cannot use log file {log_path}: {exc.strerror}") from None
        task = Task(task_id, args=list(args), env=environment, cwd=cwd, log_path=log_path, pid_mode=pid_mode,
                    labels=dict(labels or {}), confinement=confinement, filesystem=filesystem,
                    rootfs=mounts.rootfs_path(self.sandbox.config.bundle, task_id), stdin=stdin,
                    pid_target=pid_target, terminal=terminal, resources=resources, devices=devices, hooks=hooks)
        self._tasks[task_id] = task
        self._persist()
        idmap = None
        try:
            pause = self.sandbox.pause
            # A pod's user namespace (its pause's): the rootfs's layers are id-mapped with it.
            idmap = IdMap.of_process(pause.pid) if pause is not None else None
            mount_rootfs(filesystem.rootfs, task.rootfs, idmap)
        except BaseException:
            try:
                self._remove_rootfs(task)
            except RpcError as exc:  # kept (and recorded) for Delete or `podshim delete` to retry
                log.error("task %s: %s", task_id, exc.message)
            else:
                del self._tasks[task_id]
                self._persist()
            raise
        finally:
            if idmap is not None:
                idmap.close()
        log.info("task %s created: %s (pid mode %s)", task_id, args, pid_mode)
        return task

    async def start(self, sandbox_id: str, task_id: str, *, taps: Mapping[str, str] | None = None,
                    stdin_fifo: str | None = None) -> Task:
        """Start: launch the task's process in the pause's namespaces and its own cgroup.

        Returns once it has exec'd. Nothing is left behind when it fails: an exec failure is
        FailedPrecondition naming the program and the reason ("exec /no/such: No such file
        or directory"); FailedPrecondition also when the sandbox is not running. ``taps``: FIFOs by
        stream (stdout, stderr) that get the task's output from its first byte, as AttachOutput's
        do from then on (containerd's, shim.containerd); one that cannot be opened is InvalidArgument.
        ``stdin_fifo``: for a task created with stdin, the FIFO that is its stdin (containerd's) instead
        of one the shim makes.
        """
        task = self.get(sandbox_id, task_id)
        async with task.lock:
            nxt = task.check(Op.START)
            pause = self._running_pause()
            runtime = self.sandbox.runtime
            assert self.sandbox.cgroup is not None and runtime is not None  # a running sandbox has both
            target_pid = self._target_pid(task) if task.pid_mode == TARGET else 0
            # The directories exist before they are recorded (their paths are only known
            # then); state.json has them before any process is in them.
            pod_cgroup = self.sandbox.cgroup
            # The systemd driver: a scope of the task's own in the pod's slice (recorded, then made).
            task.cgroup = (pod_cgroup.task_scope(task_id, systemd.scope_name(self.sandbox.config.namespace, sandbox_id,
                                                                              task_id))
                           if pod_cgroup.is_slice else pod_cgroup.child(task_id))
            self._persist()
            rules = self._device_rules(task)
            try:
                if task.cgroup.unit:
                    # Made now with a placeholder in it, or by the OCI runtime's systemd driver with the init.
                    await task.cgroup.start_units(placeholder=not runtime.starts_units)
                if task.devices and not self.sandbox.options.privileged:
                    # The pod's cgroup is the parent of the task's, which may allow no more on v1.
                    devices.widen(pod_cgroup, [given.rule for given in task.devices])
                    self.sandbox.device_rules = None  # tasks made from now on start with more: they set theirs
                if not runtime.starts_units:  # else the runtime's systemd driver applies both from the spec
                    # A task's scope is beside the pause's, not below it: it inherits no rules.
                    # runc's and crun's cgroup managers attach the task's v2 program themselves.
                    devices.apply(task.cgroup, rules, inherited=None if pod_cgroup.is_slice else self.sandbox.device_rules,
                                  program=not runtime.attaches_device_programs)
                    await task.cgroup.aupdate(task.resources)
                try:
                    crilog = CriLog(task.log_path)
                except OSError as exc:
                    raise FailedPrecondition(f"cannot open log file {task.log_path}: {exc.strerror}") from None
                stdin = None
                terminal = Console() if task.terminal else None
                try:
                    for stream, fd in await execstream.opened_once_read(
                            functools.partial(execstream.open_taps, taps or {})):
                        crilog.add_tap(stream, fd)
                    mounts.check_destinations(task.filesystem, task.rootfs)
                    if task.stdin:
                        try:
                            stdin = (execstream.TaskStdin(stdin_fifo, given=True) if stdin_fifo else
                                     execstream.TaskStdin(os.path.join(self.sandbox.config.bundle, f"{task_id}.stdin")))
                        except OSError as exc:
                            raise FailedPrecondition(f"cannot make the task's stdin FIFO: {exc.strerror}") from None
                    task.process = await runtime.start_task(TaskSpec(
                        task_id, args=tuple(task.args), env=task.env, cwd=task.cwd, pid_mode=task.pid_mode,
                        pause_pid=pause.pid, own_ipc=self.sandbox.options.ipc_mode == POD, cgroup=task.cgroup,
                        stdout=crilog.stdout_fd, stderr=crilog.stderr_fd, confinement=task.confinement,
                        target_pid=target_pid, resources=task.resources, oom_score_adj=task.oom_score_adj,
                        rootfs=task.rootfs, filesystem=task.filesystem, device_rules=rules,
                        devices=tuple(given.node for given in task.devices), hooks=task.hooks,
                        stdin=stdin.read_fd if stdin is not None and terminal is None else None, console=terminal))
                    task.cgroup.hold()  # its scope stays until the task's exit is read
                except BaseException:
                    crilog.close()
                    if stdin is not None:
                        stdin.remove()
                    if terminal is not None:
                        terminal.close()
                    raise
            except BaseException as exc:
                # A cancelled Start, too, removes the (empty) cgroup before it forgets it.
                try:
                    await task.cgroup.aremove()
                except RpcError as removal:  # stays recorded, for Delete, Shutdown or `podshim delete`
                    log.error("task %s: %s", task_id, removal.message)
                else:
                    task.cgroup = None
                    self._persist()
                if isinstance(exc, NamespaceNotFound) and os.path.dirname(exc.path) == f"/proc/{pause.pid}/ns":
                    raise FailedPrecondition(f"the sandbox's pause exited while the task started ({exc.message})") \
                        from None
                raise
            crilog.start(terminal.take() if terminal is not None else None)
            if terminal is not None:
                terminal.close()
            task.crilog = crilog
            if stdin is not None:
                if crilog.terminal is not None and stdin.read_fd is not None:
                    # The shim reads the FIFO (its read end stays here) and writes to the terminal.
                    task.terminal_input = asyncio.ensure_future(_terminal_input(task, stdin.read_fd, crilog.terminal))
                else:
                    stdin.started()
                task.stdin_fifo = stdin
            task.started_at = task.process.started_at_ns
            task.status = nxt
            self._persist()
            exiting = asyncio.ensure_future(self._on_exit(task, task.process.exit, crilog))
            self._exits.add(exiting)
            exiting.add_done_callback(self._exits.discard)
            log.info("task %s started: pid %d", task_id, task.pid)
            return task

    def _target_pid(self, task: Task) -> int:
        """The pid of the running task whose pid namespace ``task`` (pid_mode TARGET) joins;
        FailedPrecondition when that task is not running (gone, not started or exited)."""
        target = self._tasks.get(task.pid_target or "")
        if target is None or target.status is not T.RUNNING or target.process is None or target.process.exit.done():
            state = "gone" if target is None else target.status.value
            raise FailedPrecondition(f"task {task.task_id} joins the pid namespace of task {task.pid_target}, "
                                     f"which is not running (it is {state})")
        return target.process.pid

    async def _on_exit(self, task: Task, exit_future: asyncio.Future[ExitInfo], crilog: CriLog) -> None:
        """The exit of a task's process: end what it left, drain its log, then report it stopped."""
        try:
            info = await exit_future
            if task.pid_mode != CONTAINER and task.cgroup is not None:
                # Without a pid namespace of its own, the task's children outlive it; containerd
                # kills them too (runc's kill-all on exit of a shared-pid-ns container).
                try:
                    task.cgroup.kill_all(signal.SIGKILL)
                except RpcError as exc:
                    log.error("task %s: cannot kill what its process left: %s", task.task_id, exc.message)
            await crilog.drain(LOG_DRAIN_TIMEOUT)
        finally:
            if task.terminal_input is not None:  # before the FIFO and the terminal it uses are closed
                task.terminal_input.cancel()
                await asyncio.gather(task.terminal_input, return_exceptions=True)
                task.terminal_input = None
            crilog.close()
            task.crilog = None
            if task.stdin_fifo is not None:
                task.stdin_fifo.remove()
                task.stdin_fifo = None
        # The kernel's own count is the evidence, not the exit status: 137 is any SIGKILL.
        oom_kills = task.cgroup.oom_kills() if task.cgroup is not None else None
        if task.cgroup is not None:
            task.cgroup.release_placeholder()  # read: its scope (systemd driver) may go now
        task.exit = ExitResult(info.exit_status, info.exited_at_ns, info.pid, oom_killed=bool(oom_kills))
        task.status = task.check(Op.EXIT)
        task.exited.set()
        self._persist()
        log.info("task %s (pid %d) exited with status %d%s", task.task_id, info.pid, info.exit_status,
                 f" ({oom_kills} of its processes killed by the OOM killer)" if oom_kills else "")
        self.sandbox.events.publish(TOPIC_TASK_EXIT, {"task_id": task.task_id, "pid": info.pid,
                                                      "exit_status": info.exit_status,
                                                      "exited_at": info.exited_at_ns,
                                                      "oom_killed": task.exit.oom_killed})

    def kill(self, sandbox_id: str, task_id: str, sig: int = signal.SIGTERM, all_processes: bool = False) -> None:
        """Kill: send ``sig`` to the task's process, or with ``all_processes`` to every process in
        its cgroup. Nothing happens once it has exited. Raises InvalidArgument (bad signal),
        NotFound, FailedPrecondition (not started)."""
        task = self.get(sandbox_id, task_id)
        if not 1 <= sig <= _MAX_SIGNAL:
            raise InvalidArgument(f"signal {sig} is not a signal number (1 to {int(_MAX_SIGNAL)})")
        task.check(Op.KILL)
        p = task.process
        if p is None or task.status is T.STOPPED or p.exit.done():
            return
        if all_processes and task.cgroup is not None:
            task.cgroup.kill_all(sig)
        elif self.sandbox.runtime is not None:  # it has one: the task was started
            self.sandbox.runtime.kill(p.pid, p.start_time, sig)

    async def exec(self, sandbox_id: str, task_id: str, *, args: builtins.list[str],
                   timeout_secs: int | None = None, rlimits: tuple[Rlimit, ...] | None = None) -> execsync.ExecResult:
        """Exec: run ``args`` beside the running task (its namespaces, cgroup, environment, working
        directory and confinement; its own ``rlimits`` when given, else the task's) until it exits, at most ``timeout_secs`` (None or 0: no limit); see
        :mod:`shim.runtime.execsync` for output, timeout and cancellation. Raises InvalidArgument,
        NotFound, FailedPrecondition (not running; the program cannot be run)."""
        task = self.get(sandbox_id, task_id)
        if not args or not all(isinstance(a, str) and "\0" not in a for a in args) or not args[0]:
            raise InvalidArgument("field 'args' must be a non-empty array of strings without NUL")
        if timeout_secs is not None and timeout_secs < 0:
            raise InvalidArgument(f"field 'timeout_secs' must not be negative, not {timeout_secs}")
        task.check(Op.EXEC)
        runtime, p, cgroup = self.sandbox.runtime, task.process, task.cgroup
        assert runtime is not None and p is not None and cgroup is not None  # a running task has them
        confinement = task.exec_confinement(rlimits)
        task.execs += 1
        exec_id = str(task.execs)
        name = f"exec {exec_id} ({args[0]}) in task {task_id}"

        def start(output: execsync.ExecOutput) -> Any:
            return runtime.exec_process(ExecSpec(task_id, exec_id, tuple(args), task.env, task.cwd, p.pid, cgroup,
                                                 output.stdout_fd, output.stderr_fd, confinement))

        try:
            result = await execsync.run(start, cgroup, timeout=timeout_secs or None, name=name)
        except NamespaceNotFound as exc:
            if os.path.dirname(exc.path) == f"/proc/{p.pid}/ns":
                raise FailedPrecondition(f"task {task_id} exited while the command started ({exc.message})") \
                    from None
            raise
        log.info("%s exited with status %d%s", name, result.exit_status, " (timed out)" if result.timed_out else "")
        return result

    async def exec_start(self, sandbox_id: str, task_id: str, *, args: builtins.list[str], stdin: str | None = None,
                         stdout: str | None = None, stderr: str | None = None, terminal: str | None = None,
                         console_socket: str | None = None,
                         console_size: tuple[int | None, int | None] = (None, None),
                         rlimits: tuple[Rlimit, ...] | None = None) -> dict[str, Any]:
        """ExecStart: start ``args`` beside the running task, as :meth:`exec` does, with the client's
        FIFOs or terminal as its stdio; ``{exec_id, pid}`` once it runs. Raises InvalidArgument,
        NotFound, FailedPrecondition (not running; the program cannot be run)."""
        task = self.get(sandbox_id, task_id)
        if not args or not all(isinstance(a, str) and "\0" not in a for a in args) or not args[0]:
            raise InvalidArgument("field 'args' must be a non-empty array of strings without NUL")
        task.check(Op.EXEC)
        runtime, p, cgroup = self.sandbox.runtime, task.process, task.cgroup
        assert runtime is not None and p is not None and cgroup is not None  # a running task has them
        stdio = await execstream.opened_once_read(
            lambda: execstream.open_stdio(stdin, stdout, stderr, terminal, console_socket, console_size))
        try:
            task.execs += 1
            exec_id = str(task.execs)
            try:
                leader = await runtime.exec_process(ExecSpec(
                    task_id, exec_id, tuple(args), task.env, task.cwd, p.pid, cgroup, stdio.stdout, stdio.stderr,
                    task.exec_confinement(rlimits), stdin=stdio.stdin, terminal=stdio.terminal,
                    console_socket=stdio.console_socket, console_size=stdio.console_size))
            except NamespaceNotFound as exc:
                if os.path.dirname(exc.path) == f"/proc/{p.pid}/ns":
                    raise FailedPrecondition(f"task {task_id} exited while the command started ({exc.message})") \
                        from None
                raise
        finally:
            stdio.close()  # the command has its own copies
        task.streamed[exec_id] = (leader, execsync.session_of(leader.pid) or leader.pid)
        log.info("exec %s (%s) in task %s started with pid %d%s", exec_id, args[0], task_id, leader.pid,
                 " on a terminal" if stdio.terminal or stdio.console_socket else "")
        return {"exec_id": exec_id, "pid": leader.pid}

    def _streamed(self, sandbox_id: str, task_id: str, exec_id: str) -> tuple[Task, process.Process, int]:
        task = self.get(sandbox_id, task_id)
        found = task.streamed.get(exec_id) if isinstance(exec_id, str) else None
        if found is None:
            raise NotFound(f"exec {exec_id!r} of task {task_id} not found (never started, or already waited for)")
        return task, found[0], found[1]

    async def exec_wait(self, sandbox_id: str, task_id: str, exec_id: str) -> dict[str, Any]:
        """ExecWait: ``{exit_status, exited_at}`` once ExecStart's command exited; the exec is then
        forgotten. Raises NotFound."""
        task, leader, _ = self._streamed(sandbox_id, task_id, exec_id)
        info = await asyncio.shield(leader.exit)
        task.streamed.pop(exec_id, None)
        return {"exit_status": info.exit_status, "exited_at": info.exited_at_ns}

    def exec_kill(self, sandbox_id: str, task_id: str, exec_id: str) -> None:
        """ExecKill: SIGKILL ExecStart's command and what it started in its session. Raises NotFound."""
        task, leader, session = self._streamed(sandbox_id, task_id, exec_id)
        if not leader.exit.done() and task.cgroup is not None:
            execsync.kill_session(leader, session, task.cgroup)

    async def attach_output(self, sandbox_id: str, task_id: str, *, stdout: str | None = None,
                            stderr: str | None = None) -> None:
        """AttachOutput: copy the running task's stdout and stderr, from now on, to the client's FIFOs as
        well as to its log. A FIFO nobody reads yet is tried again for FIFO_READER_WAIT
        (:func:`execstream.opened_once_read`). Raises InvalidArgument (a path that is no FIFO, or that
        nobody opened for reading within that wait), NotFound, FailedPrecondition (not running; its
        output ended, also while the shim waited)."""
        task = self.get(sandbox_id, task_id)
        task.check(Op.EXEC)
        crilog = task.crilog
        if crilog is None or crilog.closed:
            raise FailedPrecondition(f"task {task_id}'s output has ended")
        fifos = {stream: path for stream, path in (("stdout", stdout), ("stderr", stderr)) if path is not None}
        taps = await execstream.opened_once_read(functools.partial(execstream.open_taps, fifos))
        if crilog.closed:  # the task stopped while the shim waited for a reader: nothing more to copy
            for _, fd in taps:
                os.close(fd)
            raise FailedPrecondition(f"task {task_id}'s output ended while the shim waited for the FIFOs' reader")
        for stream, fd in taps:
            crilog.add_tap(stream, fd)

    def close_stdin(self, sandbox_id: str, task_id: str) -> None:
        """CloseStdin: drop the shim's write end of the task's stdin FIFO (idempotent). Raises NotFound,
        FailedPrecondition (not running)."""
        task = self.get(sandbox_id, task_id)
        task.check(Op.EXEC)
        if task.stdin_fifo is not None:
            task.stdin_fifo.close()

    def resize_pty(self, sandbox_id: str, task_id: str, width: int, height: int) -> None:
        """ResizePty: set the running task's terminal to ``width`` columns by ``height`` rows. Raises
        InvalidArgument (out of 0..65535), NotFound, FailedPrecondition (not running; no terminal)."""
        task = self.get(sandbox_id, task_id)
        console.check_size("width", width)
        console.check_size("height", height)
        task.check(Op.EXEC)
        if not task.terminal:
            raise FailedPrecondition(f"task {task_id} has no terminal to resize (it was created without terminal)")
        crilog = task.crilog
        if crilog is None or crilog.terminal is None:
            raise FailedPrecondition(f"task {task_id}'s terminal has closed: it has exited")
        try:
            console.resize(crilog.terminal, width, height)
        except OSError as exc:
            raise FailedPrecondition(f"cannot resize task {task_id}'s terminal: {exc.strerror}") from None

    def stats(self, sandbox_id: str, task_id: str, details: bool = False) -> dict[str, Any]:
        """Stats: ``{timestamp, data}``, the usage of the task's cgroup (SandboxMetrics' keys); a
        task never started has none and says so. With ``details``, ``data`` also has ``details``
        (:meth:`SandboxCgroup.details` and :meth:`SandboxCgroup.process_counts`)."""
        task = self.get(sandbox_id, task_id)
        task.check(Op.STATS)
        data = task.cgroup.metrics() if task.cgroup is not None else no_metrics("cgroup (the task was never started)")
        if details and task.cgroup is not None:
            data["details"] = {**task.cgroup.details(), **task.cgroup.process_counts()}
        return {"timestamp": time.time_ns(), "data": data}

    async def update(self, sandbox_id: str, task_id: str, resources: dict[str, Any]) -> None:
        """Update: apply ``resources`` to the running task's cgroup (see
        :meth:`SandboxCgroup.update`). Raises InvalidArgument naming a key that cannot be applied
        (nothing is changed then), NotFound, FailedPrecondition (not running)."""
        task = self.get(sandbox_id, task_id)
        task.check(Op.UPDATE)
        assert task.cgroup is not None  # a running task has one
        await task.cgroup.aupdate(resources)
        log.info("task %s resources updated: %s", task_id, ", ".join(f"{k}={v}" for k, v in sorted(resources.items())))

    def reopen_log(self, sandbox_id: str, task_id: str) -> None:
        """ReopenLog: the task's log file opened again at its path (created if it was moved).
        Raises NotFound, FailedPrecondition (not running; the file cannot be opened: the previous
        one stays in use)."""
        task = self.get(sandbox_id, task_id)
        task.check(Op.REOPEN_LOG)
        crilog = task.crilog
        if crilog is None or crilog.closed:
            raise FailedPrecondition(f"task {task_id} is not running: it has exited")
        try:
            crilog.reopen()
        except OSError as exc:
            raise FailedPrecondition(f"cannot reopen log file {task.log_path}: {exc.strerror}; the task keeps "
                                     "writing to the file it had") from None
        log.info("task %s reopened its log file %s", task_id, task.log_path)

    async def wait(self, sandbox_id: str, task_id: str) -> ExitResult:
        """Wait: block until the task has exited and its log is complete (at once if it has)."""
        task = self.get(sandbox_id, task_id)
        await task.exited.wait()
        assert task.exit is not None
        return task.exit

    async def delete(self, sandbox_id: str, task_id: str) -> ExitResult:
        """Delete a created or stopped task: remove its cgroup and forget it. FailedPrecondition
        while it runs."""
        task = self.get(sandbox_id, task_id)
        async with task.lock:
            nxt = task.check(Op.DELETE)
            if self.sandbox.runtime is not None:
                await self.sandbox.runtime.delete_task(task_id)
            if task.cgroup is not None:
                await task.cgroup.aremove()
                task.cgroup = None
            self._remove_rootfs(task)
            del self._tasks[task_id]
            task.status = nxt
            self._persist()
        if task.exit is None:  # never started: wake its waiters
            task.exit = ExitResult(0, time.time_ns(), 0)
            task.exited.set()
        log.info("task %s deleted", task_id)
        return task.exit

    # -- what the sandbox asks (shim.sandbox.Tasks) ------------------------------------------
    def record(self) -> dict[str, TaskRecord]:
        return {task_id: task.record() for task_id, task in self._tasks.items()}

    async def stop_all(self) -> None:
        """SIGKILL every task's cgroup and wait for their exits; from now on no task starts.

        Raises Unavailable when a task has not exited :data:`~shim.sandbox.sandbox.KILL_WAIT_TIMEOUT`
        seconds after SIGKILL.
        """
        self._closed = True
        running = []
        for task in list(self._tasks.values()):
            async with task.lock:  # an in-flight Start finishes first, then is killed here
                if task.status is T.RUNNING:
                    running.append(task)
                    if task.cgroup is not None:
                        task.cgroup.kill_all(signal.SIGKILL)
        if not running:
            return
        waits = [asyncio.ensure_future(task.exited.wait()) for task in running]
        _, pending = await asyncio.wait(waits, timeout=KILL_WAIT_TIMEOUT)
        for waiter in pending:
            waiter.cancel()
        if pending:
            late = [task.task_id for task in running if not task.exited.is_set()]
            raise Unavailable(f"tasks {', '.join(late)} did not exit {KILL_WAIT_TIMEOUT:.0f}s after SIGKILL")

    async def release(self) -> None:
        """Remove every task's cgroup and unmount its rootfs (the tasks have been stopped). Each
        task is tried; the first rootfs that could not be unmounted is raised at the end (it stays
        recorded for ``podshim delete``)."""
        errors: builtins.list[RpcError] = []
        for task in self._tasks.values():
            if task.cgroup is not None:
                await task.cgroup.aremove()
                task.cgroup = None
            try:
                self._remove_rootfs(task)
            except RpcError as exc:  # stays recorded for `podshim delete`; the other tasks go on
                errors.append(exc)
        self._persist()
        if errors:
            raise errors[0]

    @staticmethod
    def _remove_rootfs(task: Task) -> None:
        """Unmount the task's root and remove its directories; forgotten once gone (Internal,
        and it stays recorded for ``podshim delete``, when it cannot be)."""
        if task.rootfs:
            unmount_rootfs(task.rootfs)
            task.rootfs = ""


async def _terminal_input(task: Task, fifo: int, master: int) -> None:
    """The stdin FIFO of a task with a terminal, copied to the terminal while it runs."""
    try:
        await console.copy_input(fifo, master)
    except OSError as exc:
        log.error("task %s: copying its stdin to its terminal failed: %s", task.task_id, exc.strerror)


def _check_resources(sandbox: Sandbox, resources: dict[str, Any]) -> None:
    """InvalidArgument naming the first of a task's Create ``resources`` this host cannot apply: its
    cgroup's are checked against the sandbox's cgroup (a task's cgroup has the same files), and
    its ``oom_score_adj`` against what the shim may give a child."""
    assert sandbox.cgroup is not None  # a running sandbox has one
    sandbox.cgroup.check(resources)
    adj = resources.get("oom_score_adj")
    if adj is not None and not linux.oom_score_adj_permitted(adj):
        raise InvalidArgument(f"resources.oom_score_adj {adj} cannot be applied: lowering it below the shim's own "
                              "needs CAP_SYS_RESOURCE, which the shim does not have")


def _environment(env: builtins.list[str]) -> dict[str, str]:
    """``env`` checked to be ``NAME=VALUE`` strings, as a map (:func:`process.environment`: the last
    of a name wins; PATH is :data:`process.DEFAULT_PATH` when none is named)."""
    for item in env:
        if not isinstance(item, str):
            raise InvalidArgument("field 'env' must be an array of strings")
        name, sep, _ = item.partition("=")
        if not sep or not name or "\0" in item:
            raise InvalidArgument(f"env entry {item!r} is not NAME=VALUE")
    return process.environment(env)
