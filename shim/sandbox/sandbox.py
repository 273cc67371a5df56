"""One sandbox's state machine: what may happen in which state, and the resources it owns.

The rules are the table below; a call in a state the table does not allow gets the error the
table names, with a sentence. Every resource the sandbox makes (netns, cgroup, pause task) is
recorded in ``<bundle>/state.json`` *before* it is made, so ``podshim delete`` can remove it
after a crash at any point.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from shim.api.cgroups import CGROUPFS, SYSTEMD
from shim.api.handlers import NATIVE
from shim.api.topics import TOPIC_CREATE, TOPIC_EXIT, TOPIC_START, TOPIC_STATE
from shim.kernel import cgroups, devices, netns
from shim.kernel.cgroups import systemd
from shim.kernel.linux import ns_inode, proc_start_time
from shim.kernel.reaper import ExitInfo, Reaper
from shim.lib.platform import host_platform
from shim.rpc.records import Record
from shim.rpc.records import set_field as _set
from shim.rpc.status import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, RpcError, Unavailable
from shim.sandbox.config import ShimConfig
from shim.sandbox.events import EventBus
from shim.sandbox.options import SandboxOptions
from shim.sandbox.record import STATE_NEW, ExitRecord, PauseRecord, SandboxRecord, StateFile, TaskRecord

if TYPE_CHECKING:  # the runtime's modules load at CreateSandbox: a shim serves without them (issue #15)
    from shim.lib import rootfs as host_rootfs
    from shim.runtime import pause
    from shim.runtime.base import Runtime

__all__ = ["State", "Operation", "TRANSITIONS", "REFUSALS", "transition", "ShimConfig", "Sandbox", "StartResult",
           "ExitResult", "Tasks", "DEFAULT_STOP_TIMEOUT", "KILL_WAIT_TIMEOUT"]

log = logging.getLogger(__name__)

#: StopSandbox without a timeout gives the pause this long (seconds) to exit on SIGTERM.
DEFAULT_STOP_TIMEOUT = 10.0
#: After SIGKILL a process that still has not exited in this long (seconds) is stuck in the
#: kernel; we stop waiting.
KILL_WAIT_TIMEOUT = 10.0


class State(str, enum.Enum):
    NEW = STATE_NEW        # the shim runs; no sandbox was created yet
    CREATED = "created"    # CreateSandbox done: options checked, netns ready
    RUNNING = "running"    # the pause task lives
    STOPPED = "stopped"    # the pause task exited (or was never started and Stop was called)
    SHUTDOWN = "shutdown"  # ShutdownSandbox removed everything; the shim is exiting


class Operation(str, enum.Enum):
    CREATE = "create"      # CreateSandbox
    START = "start"        # StartSandbox
    STOP = "stop"          # StopSandbox
    EXIT = "exit"          # the pause exited (the reaper saw it)
    SHUTDOWN = "shutdown"  # ShutdownSandbox
    WAIT = "wait"          # WaitSandbox
    STATUS = "status"      # SandboxStatus
    METRICS = "metrics"    # SandboxMetrics
    UPDATE = "update"      # UpdateSandbox
    PLATFORM = "platform"  # Platform


S, Op = State, Operation
#: (operation, state) -> state after it succeeds. A pair that is not here is refused: NotFound
#: before CreateSandbox, Unavailable after ShutdownSandbox, else the error in REFUSALS, else
#: FailedPrecondition.
TRANSITIONS: dict[tuple[Operation, State], State] = {
    (Op.CREATE, S.NEW): S.CREATED,
    (Op.START, S.CREATED): S.RUNNING,
    (Op.STOP, S.CREATED): S.STOPPED,
    (Op.STOP, S.RUNNING): S.STOPPED,
    (Op.STOP, S.STOPPED): S.STOPPED,
    (Op.EXIT, S.RUNNING): S.STOPPED,
    (Op.UPDATE, S.RUNNING): S.RUNNING,
    (Op.SHUTDOWN, S.NEW): S.SHUTDOWN,
    (Op.SHUTDOWN, S.CREATED): S.SHUTDOWN,
    (Op.SHUTDOWN, S.RUNNING): S.SHUTDOWN,
    (Op.SHUTDOWN, S.STOPPED): S.SHUTDOWN,
    # read-only operations: allowed, state unchanged
    **{(op, st): st for op in (Op.WAIT, Op.STATUS, Op.METRICS, Op.PLATFORM)
       for st in (S.CREATED, S.RUNNING, S.STOPPED)},
}
#: The refusals that say more than "cannot {op} sandbox {id} while it is {state}".
REFUSALS: dict[tuple[Operation, State], tuple[type[RpcError], str]] = {
    **{(Op.CREATE, st): (AlreadyExists, "sandbox {id} already exists (it is {state})")
       for st in (S.CREATED, S.RUNNING, S.STOPPED)},
    (Op.START, S.RUNNING): (FailedPrecondition, "sandbox {id} is already running"),
    (Op.START, S.STOPPED): (FailedPrecondition, "sandbox {id} has stopped; a stopped sandbox cannot be started again"),
}


def transition(op: Operation, state: State, sandbox_id: str) -> State:
    """The state after ``op`` in ``state``; the refusal (a typed RpcError with a sentence naming
    ``sandbox_id``) when the table does not allow it. Pure: changes nothing."""
    nxt = TRANSITIONS.get((op, state))
    if nxt is not None:
        return nxt
    if state is S.NEW:
        raise NotFound(f"sandbox {sandbox_id} has not been created in this shim")
    if state is S.SHUTDOWN:
        raise Unavailable(f"sandbox {sandbox_id} was shut down; the shim is exiting")
    cls, template = REFUSALS.get((op, state), (FailedPrecondition, "cannot {op} sandbox {id} while it is {state}"))
    raise cls(template.format(id=sandbox_id, state=state.value, op=op.value))


class StartResult(Record):
    __slots__ = ("pid", "created_at")
    pid: int
    created_at: int  # ns since the epoch

    def __init__(self, pid: int, created_at: int) -> None:
        _set(self, "pid", pid)
        _set(self, "created_at", created_at)


class ExitResult(Record):
    __slots__ = ("exit_status", "exited_at", "pid", "oom_killed")
    exit_status: int
    exited_at: int  # ns since the epoch
    pid: int
    oom_killed: bool  # the kernel's OOM killer killed a process of its cgroup (its counter says so)

    def __init__(self, exit_status: int, exited_at: int, pid: int = 0, oom_killed: bool = False) -> None:
        _set(self, "exit_status", exit_status)
        _set(self, "exited_at", exited_at)
        _set(self, "pid", pid)
        _set(self, "oom_killed", oom_killed)


class Tasks(Protocol):
    """The processes that live in the sandbox beside the pause (:class:`shim.sandbox.tasks.TaskSet`).

    The sandbox records them in state.json, stops them before its pause, and removes their
    cgroups before its own.
    """

    def record(self) -> dict[str, TaskRecord]: ...

    async def stop_all(self) -> None: ...

    async def release(self) -> None: ...


def _open_runtime(handler: str, config: ShimConfig, reaper: Reaper, persist: Callable[[], None], *,
                  image_pause: bool = False, cgroup_driver: str = CGROUPFS) -> Runtime:
    """The runtime of ``handler`` (one of options.RUNTIME_HANDLERS). FailedPrecondition when it
    cannot run here (runc, crun or, unless the pause is a sandbox image's, the static catatonit
    missing): at CreateSandbox, before anything is made, not at StartSandbox."""
    if handler == NATIVE:
        from shim.runtime.native import NativeRuntime

        return NativeRuntime(reaper)
    from shim.runtime.oci.backend import OciBackend  # runc and crun only: a native shim never loads it

    return OciBackend.open(handler, namespace=config.namespace, sandbox_id=config.sandbox_id, bundle=config.bundle,
                           runtime_root=config.runtime_root, reaper=reaper, persist=persist,
                           image_pause=image_pause, systemd_cgroup=cgroup_driver == SYSTEMD)


class Sandbox:
    """The sandbox a shim owns. All public coroutines raise typed RpcErrors.

    ``made_netns``: the descriptor of a network namespace made ahead (:func:`netns.make_netns`, a
    spare shim's), which CreateSandbox pins instead of making one when the sandbox wants a new
    netns; it is closed by the first CreateSandbox either way (and by :meth:`release`).
    """

    def __init__(self, config: ShimConfig, reaper: Reaper, events: EventBus, made_netns: int | None = None):
        self.config = config
        self.made_netns = made_netns
        self.reaper = reaper
        self.events = events
        self.state = S.NEW
        self.options = SandboxOptions()
        self.netns_path: str | None = None
        self.netns_owned = False
        self.cgroup: cgroups.SandboxCgroup | None = None
        # The device rules a new directory below the sandbox cgroup (a task's) starts with; None
        # once a task's own rules were added to the v1 controller's (then every task sets its own).
        self.device_rules: devices.DeviceRules | None = None
        self._start_time: int | None = None  # the shim's own, for state.json
        self.pause: pause.PauseProcess | None = None
        self.created_at = 0
        self.exit: ExitResult | None = None
        self._exited = asyncio.Event()
        self._lock = asyncio.Lock()
        self.on_state_change: Callable[[State], None] | None = None
        self.tasks: Tasks | None = None
        self.runtime: Runtime | None = None  # chosen by CreateSandbox, from the runtime handler
        self.rootfs = ""  # <bundle>/rootfs while a sandbox image's root may be mounted there
        self._state_file = StateFile(config.bundle)

    # -- the table ------------------------------------------------------------------------
    def _check(self, op: Operation, sandbox_id: str) -> State:
        self.check_id(sandbox_id)
        return transition(op, self.state, self.config.sandbox_id)

    def _enter(self, state: State) -> None:
        if state is not self.state:
            log.info("sandbox %s: %s -> %s", self.config.sandbox_id, self.state.value, state.value)
            self.state = state
            self.persist()
            self.events.publish(TOPIC_STATE, {"state": state.value})
            if self.on_state_change is not None:
                self.on_state_change(state)

    def check_id(self, sandbox_id: str) -> None:
        """NotFound unless ``sandbox_id`` is the one this shim serves."""
        if sandbox_id != self.config.sandbox_id:
            raise NotFound(f"sandbox {sandbox_id} is not served by this shim (it serves {self.config.sandbox_id})")

    # -- persistence ----------------------------------------------------------------------
    def record(self) -> SandboxRecord:
        """What ``podshim delete`` needs to clean up after this shim (state.json)."""
        p = self.pause
        return SandboxRecord(
            namespace=self.config.namespace,
            sandbox_id=self.config.sandbox_id,
            state=self.state.value,
            shim_pid=os.getpid(),
            shim_start_time=self._shim_start_time(),
            socket_path=self.config.socket_path,
            netns_path=self.netns_path,
            netns_owned=self.netns_owned,
            cgroup=self.cgroup.to_dict() if self.cgroup is not None else None,
            pause=PauseRecord(p.pid, p.start_time, p.binary) if p is not None else None,
            created_at=self.created_at,
            exit=ExitRecord(self.exit.exit_status, self.exit.exited_at) if self.exit is not None else None,
            tasks=self.tasks.record() if self.tasks is not None else {},
            runtime_handler=self.options.runtime_handler,
            oci=self.runtime.record() if self.runtime is not None else None,
            rootfs=self.rootfs,
        )

    def _shim_start_time(self) -> int | None:
        # Read once: the record is written several times per sandbox.
        if self._start_time is None:
            self._start_time = proc_start_time(os.getpid())
        return self._start_time

    def persist(self) -> None:
        try:
            self._state_file.write(self.record())
        except OSError as exc:  # the bundle went away under us: keep serving, say so
            log.error("cannot write the state of sandbox %s: %s", self.config.sandbox_id, exc)

    def close(self) -> None:
        """Remove what persisting keeps in the bundle between writes (idempotent): at
        ShutdownSandbox, and when the shim exits. A later persist makes it anew."""
        self._state_file.close()

    # -- operations -----------------------------------------------------------------------
    async def create(self, sandbox_id: str, *, options: Any = None, netns_path: str | None = None,
                     annotations: dict[str, str] | None = None,
                     rootfs: tuple[host_rootfs.RootfsMount, ...] = ()) -> None:
        """CreateSandbox: check options, prepare the network namespace and mount the pause's
        ``rootfs`` (a sandbox image's, with ``options.pause_image``)."""
        async with self._lock:
            try:
                self._create_locked(sandbox_id, options, netns_path, annotations, rootfs)
            finally:
                self._close_made_netns()  # made ahead for this Create: used or not, never again

    def _create_locked(self, sandbox_id: str, options: Any, netns_path: str | None,
                       annotations: dict[str, str] | None, rootfs: tuple[host_rootfs.RootfsMount, ...]) -> None:
        nxt = self._check(Op.CREATE, sandbox_id)
        opts = SandboxOptions.from_payload(options, annotations)
        if bool(rootfs) != (opts.pause_image is not None):
            raise InvalidArgument("rootfs and options.pause_image go together: the pause of a sandbox image "
                                  "needs both, the built-in pause neither")
        from shim.runtime import pause

        pause.validate_sysctls(opts.sysctls, host_network=opts.host_network, host_ipc=opts.ipc_mode == "NODE")
        self.runtime = _open_runtime(opts.runtime_handler, self.config, self.reaper, self.persist,
                                     image_pause=opts.pause_image is not None, cgroup_driver=opts.cgroup_driver)
        if opts.pause_confinement is not None:
            try:
                self.runtime.check_confinement(opts.pause_confinement)
            except InvalidArgument as exc:
                raise InvalidArgument(f"linux.pause_process: {exc.message}") from None
        if netns_path:
            if opts.host_network:
                raise InvalidArgument("netns_path was given but the sandbox uses the host network (network mode NODE)")
            _check_netns_file(netns_path)
            netns.check_net_sysctls(netns_path, opts.sysctls)
            self.netns_path, self.netns_owned = netns_path, False
        elif not opts.host_network:
            # Record the path before the netns exists: a crash in between leaves a record
            # that `podshim delete` acts on, never an untracked mount.
            self.netns_path, self.netns_owned = netns.new_netns_path(), True
            self.options = opts
            self.persist()
            made = False
            try:
                netns.create_netns(self.netns_path, self.made_netns)
                made = True
                netns.check_net_sysctls(self.netns_path, opts.sysctls)
            except BaseException:
                self._drop_netns(remove=made)
                raise
        if rootfs:
            self.options = opts
            try:
                self._mount_rootfs(rootfs)
            except BaseException:
                if self.netns_path and self.netns_owned:
                    self._drop_netns(remove=True)
                raise
        self.options = opts
        self.created_at = time.time_ns()
        self._enter(nxt)
        self.events.publish(TOPIC_CREATE, {"netns_path": self.netns_path or ""})

    def _drop_netns(self, *, remove: bool) -> None:
        """A failed Create forgets the netns it recorded (and made, with ``remove``: removed)."""
        if remove:
            assert self.netns_path is not None
            netns.remove_netns(self.netns_path)
        self.netns_path, self.netns_owned = None, False
        self.persist()

    def _close_made_netns(self) -> None:
        if self.made_netns is not None:
            os.close(self.made_netns)
            self.made_netns = None

    def _mount_rootfs(self, rootfs: tuple[host_rootfs.RootfsMount, ...]) -> None:
        """Mount the pause's root on <bundle>/rootfs, recorded first (a crash in between leaves a
        record that ``podshim delete`` acts on). Writable: the pause (the native one as an OCI
        runtime) makes its mount points there first, then sees it read-only in its namespace."""
        from shim.lib import rootfs as host_rootfs
        from shim.runtime import mounts

        self.rootfs = mounts.sandbox_rootfs_path(self.config.bundle)
        self.persist()
        try:
            host_rootfs.mount_rootfs(rootfs, self.rootfs)
        except BaseException:
            self._unmount_rootfs()
            raise

    def _unmount_rootfs(self) -> None:
        """Unmount and remove <bundle>/rootfs (idempotent); Internal when it stays mounted."""
        if not self.rootfs:
            return
        from shim.lib.rootfs import unmount_sandbox_rootfs

        unmount_sandbox_rootfs(self.rootfs)
        self.rootfs = ""
        self.persist()

    async def start(self, sandbox_id: str) -> StartResult:
        """StartSandbox: launch the pause task in its namespaces and cgroup."""
        async with self._lock:
            nxt = self._check(Op.START, sandbox_id)
            opts = self.options
            image = opts.pause_image
            # The cgroup's directories exist before they are recorded: a shim killed in the
            # microseconds between the two leaves an empty cgroup (the paths depend on the
            # shim's own cgroup, so they cannot be recorded ahead).
            # Without a parent of the caller's, sandboxes of different namespaces may share an
            # id: the default parent names the namespace (podshim/<namespace>/<id>).
            assert self.runtime is not None  # chosen by Create
            if opts.cgroup_driver == SYSTEMD:
                # A slice of the pod's own, the pod's resources its properties from its start; the
                # pause's scope in it, made here, or by an OCI runtime's systemd driver.
                parent_slice = opts.cgroup_parent or systemd.DEFAULT_SLICE
                cg = cgroups.SandboxCgroup.pod_slice(
                    self.config.sandbox_id, parent_slice,
                    systemd.pod_slice_name(parent_slice, self.config.namespace, self.config.sandbox_id),
                    systemd.scope_name(self.config.namespace, self.config.sandbox_id))
            else:
                parent = opts.cgroup_parent or f"{cgroups.DEFAULT_PARENT}/{self.config.namespace}"
                cg = cgroups.SandboxCgroup.create(self.config.sandbox_id, parent)
            self.cgroup = cg
            self.persist()
            from shim.runtime.pause import PauseSpec

            spec = PauseSpec(
                netns_path=self.netns_path,
                pid_mode=opts.pid_mode,
                ipc_mode=opts.ipc_mode,
                hostname=opts.hostname,
                sysctls=opts.sysctls,
                cgroup=cg,
                pause_binary=None if image is not None else opts.pause_binary or self.config.pause_binary,
                oom_score_adj=opts.oom_score_adj,
                confinement=opts.pause_confinement,
                userns=opts.userns,
                rootfs=self.rootfs if image is not None else None,
                args=image.args if image is not None else (),
                env=image.env if image is not None else (),
                cwd=image.cwd if image is not None else "/",
                privileged=opts.privileged,
            )
            try:
                if cg.is_slice:
                    await cg.start_units(opts.resources, placeholder=not self.runtime.starts_units)
                elif opts.resources:
                    cg.update(opts.resources)
                rules = devices.pod_rules(opts.privileged)
                # For every handler, before the pause is in the cgroup; in a pod slice, to the
                # pause's scope (the runtime's systemd driver applies them to a scope it starts).
                if not cg.is_slice:
                    devices.apply(cg, rules)
                elif not self.runtime.starts_units:
                    devices.apply(cgroups.SandboxCgroup(cg.name, cg.process_paths()), rules)
                self.device_rules = rules
                proc = await self.runtime.start_pause(spec)
                cg.release_placeholder()  # the pause is in the scope now
            except BaseException:
                try:
                    await cg.aremove()
                except RpcError as exc:  # stays recorded, for Shutdown or `podshim delete`
                    log.error("sandbox %s: %s", self.config.sandbox_id, exc.message)
                else:
                    self.cgroup = None
                    self.persist()
                raise
            self.pause = proc
            self.created_at = proc.created_at_ns
            proc.exit.add_done_callback(self._on_exit)
            self._enter(nxt)
            self.events.publish(TOPIC_START, {"pid": proc.pid})
            return StartResult(proc.pid, proc.created_at_ns)

    def _on_exit(self, fut: asyncio.Future[ExitInfo]) -> None:
        if fut.cancelled():
            return
        info: ExitInfo = fut.result()
        self.exit = ExitResult(info.exit_status, info.exited_at_ns, info.pid)
        log.info("pause %d exited with status %d", info.pid, info.exit_status)
        self._exited.set()
        if self.state is S.RUNNING:
            self._enter(transition(Op.EXIT, S.RUNNING, self.config.sandbox_id))
        else:
            self.persist()
        self.events.publish(TOPIC_EXIT, {"pid": info.pid, "exit_status": info.exit_status,
                                         "exited_at": info.exited_at_ns})

    async def stop(self, sandbox_id: str, timeout: float | None = None) -> None:
        """StopSandbox: SIGKILL every task and wait for their exits; then the pause gets SIGTERM,
        and SIGKILL after ``timeout`` seconds (None: the default, 0: at once). Stopping a
        stopped or never-started sandbox succeeds."""
        async with self._lock:
            nxt = self._check(Op.STOP, sandbox_id)
            await self._stop_tasks()
            await self._stop_locked(DEFAULT_STOP_TIMEOUT if timeout is None else timeout)
            self._enter(nxt)

    async def _stop_locked(self, timeout: float) -> None:
        if self.state is S.CREATED and self.exit is None:
            self.exit = ExitResult(0, time.time_ns(), 0)
            self._exited.set()
            return
        proc, runtime = self.pause, self.runtime
        if proc is None or runtime is None or self._exited.is_set():
            return
        if timeout > 0:
            runtime.kill(proc.pid, proc.start_time, signal.SIGTERM)
            try:
                await asyncio.wait_for(self._exited.wait(), timeout)
                return
            except TimeoutError:
                log.warning("pause %d did not exit %.1fs after SIGTERM; sending SIGKILL", proc.pid, timeout)
        runtime.kill(proc.pid, proc.start_time, signal.SIGKILL)
        if self.cgroup is not None:
            # Host pid mode: the pause's children are not killed with it.
            self.cgroup.kill_all()
        try:
            await asyncio.wait_for(self._exited.wait(), KILL_WAIT_TIMEOUT)
        except TimeoutError:
            raise Unavailable(f"pause {proc.pid} did not exit {KILL_WAIT_TIMEOUT:.0f}s after SIGKILL") from None

    async def wait(self, sandbox_id: str) -> ExitResult:
        """WaitSandbox: block until the pause task exits (at once if it has)."""
        self._check(Op.WAIT, sandbox_id)
        await self._exited.wait()
        assert self.exit is not None
        return self.exit

    def status(self, sandbox_id: str, verbose: bool = False) -> dict[str, Any]:
        """SandboxStatus as a payload map."""
        self._check(Op.STATUS, sandbox_id)
        p = self.pause
        out: dict[str, Any] = {
            "sandbox_id": self.config.sandbox_id,
            "pid": p.pid if p is not None else 0,
            "state": self.state.value,
            "created_at": self.created_at,
            "exited_at": self.exit.exited_at if self.exit else 0,
            "exit_status": self.exit.exit_status if self.exit else 0,
            "info": {},
        }
        if verbose:
            out["info"] = self._verbose_info()
        return out

    def _verbose_info(self) -> dict[str, str]:
        info = {
            "namespace": self.config.namespace,
            "bundle": self.config.bundle,
            "socket": self.config.socket_path,
            "shim_pid": str(os.getpid()),
            "netns_path": self.netns_path or "",
            "netns_owned": str(self.netns_owned).lower(),
            "pause_binary": self.pause.binary if self.pause else "",
            "pause_rootfs": self.rootfs,
            "pause_args": json.dumps(list(self.options.pause_image.args) if self.options.pause_image else []),
            "pause_image": self.options.pause_image.image if self.options.pause_image else "",
            "network_mode": self.options.network_mode,
            "pid_mode": self.options.pid_mode,
            "ipc_mode": self.options.ipc_mode,
            "runtime_handler": self.options.runtime_handler,
        }
        if self.runtime is not None:
            info.update(self.runtime.info())
        if self.cgroup is not None:
            for hierarchy, path in sorted(self.cgroup.paths.items()):
                info[f"cgroup.{hierarchy}"] = path
        if self.netns_path:
            try:
                info["netns_inode"] = str(ns_inode(self.netns_path))
            except OSError:
                info["netns_inode"] = ""
        if self.pause is not None and self.state is S.RUNNING:
            for ns in ("net", "pid", "ipc", "uts", "mnt", "cgroup", "user"):
                path = f"/proc/{self.pause.pid}/ns/{ns}"
                try:
                    info[f"ns.{ns}.inode"] = str(ns_inode(path))
                    info[f"ns.{ns}.path"] = path
                except OSError:
                    pass
        return info

    def metrics(self, sandbox_id: str, details: bool = False) -> dict[str, Any]:
        """SandboxMetrics: cgroup cpu/memory/pids; unreadable values are listed as unavailable;
        ``network``, the counters of each interface of the pod's network namespace (absent when
        the pod is on the host's network). With ``details``, ``data`` also has ``details``: the
        cgroup's further figures and process counts (as a task's Stats)."""
        self._check(Op.METRICS, sandbox_id)
        if self.cgroup is None:
            data = cgroups.no_metrics("cgroup (the sandbox was never started)")
        else:
            data = self.cgroup.metrics()
            network = netns.interface_counters(self.pause.pid) if self.pause is not None else None
            if network is not None:
                data["network"] = network
            if details:
                data["details"] = {**self.cgroup.details(), **self.cgroup.process_counts()}
        return {"timestamp": time.time_ns(), "sandbox_id": self.config.sandbox_id, "data": data}

    async def update(self, sandbox_id: str, resources: Any) -> None:
        """UpdateSandbox: apply ``resources`` (Task Update's keys but ``oom_score_adj``) to the
        sandbox's cgroup, which holds the pause and every task (see :meth:`SandboxCgroup.update`:
        a key that cannot be applied is InvalidArgument naming it, and nothing is changed)."""
        self._check(Op.UPDATE, sandbox_id)
        if not isinstance(resources, dict):
            raise InvalidArgument("resources must be a map of the resources to apply")
        if resources.get("oom_score_adj") is not None:
            raise InvalidArgument("resources.oom_score_adj cannot be applied to a sandbox: it is a process's, not a "
                                  "cgroup's; Update sets each task's")
        assert self.cgroup is not None  # a running sandbox has one
        await self.cgroup.aupdate(resources)
        log.info("sandbox resources updated: %s", ", ".join(f"{k}={v}" for k, v in sorted(resources.items())))

    def platform(self, sandbox_id: str) -> dict[str, str]:
        self._check(Op.PLATFORM, sandbox_id)
        return host_platform()

    async def shutdown(self, sandbox_id: str) -> None:
        """ShutdownSandbox: kill the tasks, stop the pause if needed, remove the netns and cgroups we made."""
        async with self._lock:
            nxt = self._check(Op.SHUTDOWN, sandbox_id)
            await self._stop_tasks()
            if self.state is S.RUNNING:
                await self._stop_locked(0)
            await self.release()
            self._enter(nxt)
            self.close()

    async def _stop_tasks(self) -> None:
        # Tasks first: they are killed and their exits seen before the pause goes, even those
        # the kernel would kill with it (POD pid mode), so each task reports its own exit.
        if self.tasks is not None:
            await self.tasks.stop_all()

    async def release(self) -> None:
        """Remove what this sandbox made (idempotent): the tasks' cgroups, then its own, then the
        netns, and then what its runtime made (an OCI runtime's containers, ``delete --force``,
        even when a removal before failed)."""
        self._close_made_netns()
        try:
            if self.tasks is not None:
                await self.tasks.release()
            # Each thing gone is forgotten (state.json no longer names it): `podshim delete` after
            # a clean ShutdownSandbox finds nothing left to remove.
            if self.cgroup is not None:
                await self.cgroup.aremove()
                self.cgroup = None
            if self.netns_path and self.netns_owned:
                netns.remove_netns(self.netns_path)
                self.netns_path, self.netns_owned = None, False
        finally:
            try:
                if self.runtime is not None:
                    await self.runtime.release()
            finally:
                # Once the pause and its container are gone: nothing runs from it any more.
                self._unmount_rootfs()


def _check_netns_file(path: str) -> None:
    """InvalidArgument unless ``path`` is a network namespace file (nsfs) other than the host's."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InvalidArgument(f"netns_path {path!r}: {exc.strerror}") from None
    # Every nsfs inode lives on the same device, so comparing with our own netns tells
    # whether the path is a namespace (a bind mount of one) and not a plain file. Checked
    # before opening it: opening a FIFO would block the shim.
    if st.st_dev != os.stat("/proc/self/ns/net").st_dev:
        raise InvalidArgument(f"netns_path {path!r} is not a network namespace")
    # An ipc, uts, ... namespace is on nsfs too; only its type tells it from a netns.
    try:
        fd = netns.open_netns(path)
    except NotFound as exc:
        raise InvalidArgument(f"netns_path: {exc.message}") from None
    try:
        # By inode, not by mode: the pod's net.* sysctls and CNI would change the host.
        if netns.is_host_netns(fd):
            raise InvalidArgument(f"netns_path {path!r} is the host's network namespace (the shim's own): a sandbox "
                                  "there would change the host's network settings; use network mode NODE instead")
    finally:
        os.close(fd)
