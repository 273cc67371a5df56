"""The ``native`` runtime handler: the shim's own launcher (:mod:`shim.runtime.process`) forks the
pause (:mod:`shim.runtime.pause`) and the tasks into their namespaces and cgroups, and execs."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Mapping
from typing import Any

from shim.kernel.cgroups.hierarchies import V2, discover_hierarchies, pure_v2
from shim.kernel.linux import (
    CLONE_NEWCGROUP,
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
)
from shim.kernel.reaper import Reaper
from shim.lib import console
from shim.lib.idmaps import IdMap
from shim.rpc.status import FailedPrecondition, Internal
from shim.runtime import hooks, mounts, pause, process
from shim.runtime.base import CONTAINER, POD, TARGET, ExecSpec, Runtime, TaskSpec

__all__ = ["NativeRuntime"]

# The pause's namespaces a task joins (its pid namespace too in POD pid mode). Not its mount
# namespace: the pause has pivoted into a root of its own there, and a task's is made from the shim's.
_JOINED = (("ipc", CLONE_NEWIPC), ("uts", CLONE_NEWUTS), ("net", CLONE_NEWNET))
# The task's namespaces an exec joins: its mount namespace (its root) and pid namespace too.
_EXEC_JOINED = (*_JOINED, ("mnt", CLONE_NEWNS), ("pid", CLONE_NEWPID))


class NativeRuntime(Runtime):
    """Processes forked by the shim; ``reaper`` (installed) reaps them. It makes nothing that
    outlives its processes: deleting a task (or releasing the sandbox) runs its poststop hooks only."""

    def __init__(self, reaper: Reaper):
        self.reaper = reaper
        # A started task's poststop hooks and their bundle, run once it is deleted (or the sandbox released).
        self._poststop: dict[str, tuple[tuple[hooks.Hook, ...], str]] = {}

    async def start_pause(self, spec: pause.PauseSpec) -> pause.PauseProcess:
        return await pause.launch(spec, self.reaper)

    async def start_task(self, spec: TaskSpec) -> process.Process:
        if not spec.hooks:
            return await self._start_task(spec)
        # Its hooks read what they need of the container from its bundle's config.json (nvidia-ctk's
        # the root), written for them while it starts.
        bundle = _bundle(spec)
        config = hooks.write_bundle_config(bundle, spec.rootfs, spec.args, spec.env, spec.cwd)
        try:
            started = await self._start_task(spec)
            self._poststop[spec.task_id] = (spec.hooks, bundle)
            await hooks.run_logged(spec.hooks, "poststart", hooks.state(spec.task_id, "running", started.pid, bundle),
                                   self.reaper, spec.task_id)
        finally:
            os.unlink(config)
        return started

    async def _start_task(self, spec: TaskSpec) -> process.Process:
        # The trees of its root and mounts are taken here, in the shim's mount namespace (see
        # shim.runtime.mounts); the child attaches its copies, and ours are closed after the fork.
        idmap = _pod_idmap(spec.pause_pid)
        try:
            root = mounts.open_trees(spec.filesystem, spec.rootfs, own_ipc=spec.own_ipc, idmap=idmap)
        finally:
            if idmap is not None:
                idmap.close()
        root.devices = (*root.devices, *spec.devices)
        # On cgroup v2 a task sees its own cgroup as the root, as runc and crun make it there; on
        # v1 its own cgroup directories are bound on /sys/fs/cgroup, as runc makes them.
        hierarchies = discover_hierarchies()
        root.cgroup_namespace = pure_v2(hierarchies)
        if not root.cgroup_namespace:
            try:
                mounts.open_cgroup_trees(root, {h.mountpoint: spec.cgroup.paths[h.key] for h in hierarchies
                                                if h.key != V2 and h.key in spec.cgroup.paths})
            except BaseException:
                root.close()
                raise
        if root.userns and root.devices:
            root.close()
            raise FailedPrecondition(f"task {spec.task_id}'s devices cannot be made in the pod's user namespace")
        try:
            console_fd = spec.console.pair() if spec.console is not None else None
            try:
                started = await self._launch(_process_spec(spec, root, console_fd, self._hooks(spec)))
            finally:
                if spec.console is not None:
                    spec.console.launched()
        finally:
            root.close()
        if spec.console is not None:
            # The child sent the master before it exec'd, so it is waiting on the socket.
            try:
                await spec.console.receive()
            except BaseException as exc:
                await asyncio.shield(_end(started))  # started, but not as asked: nothing is left behind
                if isinstance(exc, OSError):
                    raise Internal(f"task {spec.task_id}'s terminal did not come from its launcher: "
                                   f"{exc.strerror}") from None
                raise
        return started

    def _hooks(self, spec: TaskSpec) -> process.LaunchHooks | None:
        """The launch's part of the task's hooks: prestart and createRuntime run here at its gate,
        createContainer and startContainer by the process itself (:mod:`shim.runtime.hooks`)."""
        if not any(hook.name in ("prestart", "createRuntime", *hooks.IN_TASK) for hook in spec.hooks):
            return None
        bundle = _bundle(spec)

        async def at_gate(pid: int) -> tuple[bytes, bytes]:
            creating = hooks.state(spec.task_id, "creating", pid, bundle)
            await hooks.run(spec.hooks, ("prestart", "createRuntime"), creating, self.reaper)
            return creating, hooks.state(spec.task_id, "created", pid, bundle)

        return process.LaunchHooks(at_gate, tuple(
            (hook.name, hook.path, hook.argv, hook.environment({}) if hook.env else None, hook.seconds)
            for hook in spec.hooks if hook.name in hooks.IN_TASK))

    async def exec_process(self, spec: ExecSpec) -> process.Process:
        ns_dir = f"/proc/{spec.task_pid}/ns"
        if spec.console_socket:
            # The launcher's child sends the master on our connection to the client's socket.
            with await console.connect(spec.console_socket) as sock:
                return await self._launch(_exec_spec(spec, ns_dir, sock.fileno()))
        return await self._launch(_exec_spec(spec, ns_dir))

    async def _launch(self, spec: process.ProcessSpec) -> process.Process:
        try:
            return await process.launch(spec, self.reaper)
        except process.ExecFailed as exc:  # the client's own program or cwd: theirs to fix
            raise FailedPrecondition(f"{exc.step}: {os.strerror(exc.errno)}") from None

    async def delete_task(self, task_id: str) -> None:
        """The task's poststop hooks, if it was started with some (their failures are logged)."""
        task_hooks, bundle = self._poststop.pop(task_id, ((), ""))
        await hooks.run_logged(task_hooks, "poststop", hooks.state(task_id, "stopped", 0, bundle), self.reaper,
                               task_id)

    async def release(self) -> None:
        for task_id in list(self._poststop):
            await self.delete_task(task_id)

    def info(self) -> dict[str, str]:
        return {}

    def record(self) -> Mapping[str, Any] | None:
        return None


def _exec_spec(spec: ExecSpec, ns_dir: str, console_fd: int | None = None) -> process.ProcessSpec:
    """The exec's process, in the task's namespaces (``ns_dir``) and cgroup; with ``console_fd``
    (a connection to the client's console socket) on a new terminal of ``spec.console_size``."""
    return process.ProcessSpec(
        name=f"exec {spec.exec_id} in task {spec.task_id}", argv=spec.args, env=spec.env, cwd=spec.cwd,
        join=tuple((f"{ns_dir}/{name}", nstype) for name, nstype in _EXEC_JOINED) + _user(spec.task_pid)
        + _cgroupns(spec.task_pid),
        procs_files=tuple(spec.cgroup.procs_files()), stdout=spec.stdout, stderr=spec.stderr, stdin=spec.stdin,
        controlling_terminal=spec.terminal, confinement=spec.confinement, console=console_fd,
        console_size=spec.console_size)


def _cgroupns(task_pid: int) -> tuple[tuple[str, int], ...]:
    """The task's cgroup namespace, where it has one of its own (pure cgroup v2: start_task), for an
    exec to join."""
    return ((f"/proc/{task_pid}/ns/cgroup", CLONE_NEWCGROUP),) if pure_v2(discover_hierarchies()) else ()


def _pod_idmap(pause_pid: int) -> IdMap | None:
    try:
        return IdMap.of_process(pause_pid)
    except OSError:
        raise FailedPrecondition(f"the pod's pause ({pause_pid}) is gone") from None


def _user(pid: int) -> tuple[tuple[str, int], ...]:
    """The user namespace of ``pid`` to join (a pod's, made by its pause), or none (the shim's)."""
    try:
        own = os.stat(f"/proc/{pid}/ns/user").st_ino != os.stat("/proc/self/ns/user").st_ino
    except OSError:
        return ()  # gone: joining its other namespaces says so
    return ((f"/proc/{pid}/ns/user", CLONE_NEWUSER),) if own else ()


async def _end(started: process.Process) -> None:
    process.signal_process(started.pid, started.start_time, signal.SIGKILL)
    await asyncio.wait([started.exit], timeout=process.CLEANUP_TIMEOUT)


def _bundle(spec: TaskSpec) -> str:
    """The task's directory (its root's mount point is in it): its hooks' ``bundle``."""
    return os.path.dirname(spec.rootfs) if spec.rootfs else ""


def _process_spec(spec: TaskSpec, root: mounts.RootSetup, console_fd: int | None = None,
                  launch_hooks: process.LaunchHooks | None = None) -> process.ProcessSpec:
    """The task's process: in the pause's ipc, uts and net namespaces, in a mount namespace of its
    own copied from the shim's (a recursive slave) with ``root`` as its root, and in the pause's pid
    namespace (POD), another task's (TARGET), the shim's (NODE: the host's), or PID 1 of a new one
    (CONTAINER). With a pod IPC namespace, the pod's /dev/shm (the pause's) is taken from the pause's
    mount namespace onto /dev/shm before the root is built, which binds it from there."""
    ns_dir = f"/proc/{spec.pause_pid}/ns"
    join = tuple((f"{ns_dir}/{name}", nstype) for name, nstype in _JOINED)
    if spec.pid_mode == POD:
        join += ((f"{ns_dir}/pid", CLONE_NEWPID),)
    elif spec.pid_mode == TARGET:
        join += ((f"/proc/{spec.target_pid}/ns/pid", CLONE_NEWPID),)
    join += _user(spec.pause_pid)
    return process.ProcessSpec(
        name=f"task {spec.task_id}",
        argv=spec.args,
        env=spec.env,
        cwd=spec.cwd,
        join=join,
        unshare_flags=CLONE_NEWPID | CLONE_NEWNS if spec.pid_mode == CONTAINER else CLONE_NEWNS,
        root=root,
        binds_from=((f"{ns_dir}/mnt", "/dev/shm", "/dev/shm"),) if spec.own_ipc else (),
        procs_files=tuple(spec.cgroup.procs_files()),
        stdout=spec.stdout,
        stdin=spec.stdin,
        stderr=spec.stderr,
        confinement=spec.confinement,
        console=console_fd,
        oom_score_adj=spec.oom_score_adj,
        hooks=launch_hooks,
    )
