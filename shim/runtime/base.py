"""What a sandbox asks of whoever runs its processes: the :class:`Runtime` interface.

A sandbox chooses its runtime once, at CreateSandbox, from its runtime handler: ``native``
(:class:`shim.runtime.native.NativeRuntime`, the shim's own launcher) or ``runc``/``crun``
(:class:`shim.runtime.oci.backend.OciBackend`). From then on the sandbox and its tasks only talk
to this interface. The runtime starts processes and removes what *it* made (an OCI runtime's
containers and bundles); the cgroups, the netns and the log files stay with the sandbox.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shim.kernel.cgroups import SandboxCgroup
from shim.kernel.devices import DEFAULT_RULES, DeviceRules
from shim.lib.console import Console
from shim.lib.processes import signal_process
from shim.runtime.confine import Confinement
from shim.runtime.hooks import Hook
from shim.runtime.mounts import HostDevice, TaskFilesystem
from shim.runtime.pause import POD, PauseProcess, PauseSpec
from shim.runtime.process import Process

__all__ = ["CONTAINER", "NODE", "POD", "PID_MODES", "TARGET", "ExecSpec", "Runtime", "TaskSpec"]

CONTAINER = "CONTAINER"  # a task is PID 1 of a pid namespace of its own (CRI's default); POD: the pause's
NODE = "NODE"  # the host's pid namespace (the shim's)
TARGET = "TARGET"  # the pid namespace of another task of the sandbox (TaskSpec.target_pid's)
#: Task pid modes, CRI's NamespaceMode names.
PID_MODES = (POD, CONTAINER, NODE, TARGET)


@dataclass(frozen=True)
class TaskSpec:
    """A task's process: ``args`` with ``env`` in ``cwd``, in the pause's ipc, uts and net
    namespaces and, with ``pid_mode`` POD, its pid namespace (CONTAINER: a pid namespace of its
    own). ``own_ipc``: the pod has an IPC namespace of its own (not the host's). It runs in
    ``cgroup`` (made and recorded by the caller) with ``stdout``/``stderr`` as its own, confined
    to ``confinement`` (user, capabilities, no_new_privs, seccomp; protocol.md 7.3).
    ``filesystem`` is its root and mounts (:mod:`shim.runtime.mounts`); ``rootfs`` the directory
    ``<bundle>/tasks/<task_id>/rootfs`` where the caller mounted its ``filesystem.rootfs`` (an
    empty attach point when the root is the host's ``/``). With ``console`` the task's stdio is a new
    terminal of its own devpts instead, whose master the runtime has ``console`` receive before
    :meth:`Runtime.start_task` returns (the caller owns ``console``). ``resources`` (protocol.md
    7.3, Update's keys) are in ``cgroup`` already, written by the caller; the runtime says them
    where it keeps them (an OCI config's ``linux.resources``). ``oom_score_adj`` is the process's
    (None: inherited from the shim)."""

    task_id: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    pid_mode: str
    pause_pid: int
    own_ipc: bool
    cgroup: SandboxCgroup
    stdout: int
    stderr: int
    target_pid: int = 0  # pid_mode TARGET: the process whose pid namespace the task joins
    confinement: Confinement = Confinement()
    rootfs: str = ""
    filesystem: TaskFilesystem = TaskFilesystem()
    stdin: int | None = None  # None: /dev/null
    console: Console | None = None
    device_rules: DeviceRules = DEFAULT_RULES  # its cgroup's, set by the caller; an OCI runtime is told them too
    resources: Mapping[str, Any] = field(default_factory=dict)
    oom_score_adj: int | None = None
    devices: tuple[HostDevice, ...] = ()  # the host devices it is given: nodes made in its /dev
    hooks: tuple[Hook, ...] = ()  # its OCI hooks, run at the points of the OCI lifecycle (shim.runtime.hooks)


@dataclass(frozen=True)
class ExecSpec:
    """A command run beside a running task (Exec): ``args`` with the task's ``env`` and ``cwd``, in
    the namespaces of the task's process ``task_pid`` (net, ipc, uts, pid, mount) and in its
    ``cgroup``, ``stdin`` (None: /dev/null), ``stdout``/``stderr`` as its own, confined as the task is
    (``confinement``, as runc's exec applies the container's process settings). ``exec_id`` is
    unique among the task's execs. With ``terminal``, ``stdin`` (also its stdout and stderr) is a
    terminal that becomes the command's controlling terminal. With ``console_socket`` (a unix socket
    the client listens on) the command gets a new terminal of the task's devpts instead, of
    ``console_size`` (columns, rows), whose master is sent there (runc's ``--console-socket``)."""

    task_id: str
    exec_id: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    task_pid: int
    cgroup: SandboxCgroup
    stdout: int | None
    stderr: int | None
    confinement: Confinement = Confinement()
    stdin: int | None = None
    terminal: bool = False
    console_socket: str = ""
    console_size: tuple[int, int] = (0, 0)


class Runtime(abc.ABC):
    """How a sandbox's pause and tasks are started, and what is undone at the end.

    Every coroutine raises typed RpcErrors and leaves nothing of a failed or cancelled start
    behind.
    """

    @abc.abstractmethod
    async def start_pause(self, spec: PauseSpec) -> PauseProcess:
        """Start the pause as ``spec`` says (in ``spec.cgroup``, which must be set); return once
        it is ready for signals."""

    @abc.abstractmethod
    async def start_task(self, spec: TaskSpec) -> Process:
        """Start a task's process; return once it runs its program. A program (or cwd) that
        cannot be used is FailedPrecondition with the reason; a namespace file of a pause that
        exited meanwhile is NotFound naming it."""

    @abc.abstractmethod
    async def exec_process(self, spec: ExecSpec) -> Process:
        """Start a command beside a running task; return once it runs (it may have exited already:
        its ``exit`` says so). A program that cannot be run is FailedPrecondition with the reason;
        a namespace file of a task that exited meanwhile is NotFound naming it."""

    @property
    def starts_units(self) -> bool:
        """Whether the runtime starts the systemd scopes of the pause and the tasks itself (an OCI
        runtime's systemd cgroup driver): the shim then names them (cgroupsPath) and makes none."""
        return False

    @property
    def attaches_device_programs(self) -> bool:
        """Whether the runtime attaches each container's cgroup v2 device program itself, from
        ``linux.resources.devices`` (runc's and crun's cgroup managers where /sys/fs/cgroup is v2,
        with ``BPF_F_ALLOW_MULTI``): the shim then attaches none to a task's cgroup, where the
        kernel would refuse the runtime's beside its own (one cgroup's programs share one flag)."""
        return False

    def kill(self, pid: int, start_time: int, sig: int) -> bool:
        """Send ``sig`` to the process ``(pid, start_time)`` (the pause or a task's), if it is still
        that process; returns whether it was sent.

        The same for every runtime: an OCI runtime's init is the shim's child once the runtime
        exited, so its pidfd is as good as ``runc kill`` and costs no process.
        """
        return signal_process(pid, start_time, sig)

    def check_confinement(self, confinement: Confinement) -> None:  # noqa: B027 - a hook; by default all apply
        """InvalidArgument naming the field when this runtime cannot apply ``confinement``
        (checked at Task.Create). The native launcher applies every valid one."""

    @abc.abstractmethod
    async def delete_task(self, task_id: str) -> None:
        """Remove what the runtime keeps of a task that has exited or never started. Idempotent."""

    @abc.abstractmethod
    async def release(self) -> None:
        """Remove what the runtime made for the sandbox, once its processes have exited. Idempotent."""

    @abc.abstractmethod
    def info(self) -> dict[str, str]:
        """Lines for the sandbox's verbose status."""

    @abc.abstractmethod
    def record(self) -> Mapping[str, Any] | None:
        """What ``podshim delete`` needs to undo the runtime's work after a crash (state.json's
        ``oci``), or None when there is nothing."""
