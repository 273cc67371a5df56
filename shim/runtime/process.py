"""Launching a process into namespaces: the one way the shim starts the pause and every task.

The least work that gives a process its namespaces, with no subprocess and no helper binary::

    shim --fork--> A: join v1 cgroups, setns(each namespace file), unshare(flags),
                      / rslave (with a new mount ns), sethostname, sysctls, then
                      --fork--> B (born in the v2 cgroup; in the new or joined pid ns):
                                a task's root, or mount /proc (with a new pid ns),
                                oom_score_adj, session, stdio, fds, the pause's root, cwd,
                                signals, exec or builtin
                      A reports B's pid and exits 0

    shim --clone3 (its new namespaces, its v2 cgroup)--> the process, "direct": A's steps but
                      the unshare, then B's (a new pid namespace and nothing of another process's
                      pid or mount namespace to join: the pod's pause)

A is needed because unshare(CLONE_NEWPID) and setns() of a pid namespace only move the
caller's *children* into it, and because moving a process into a cgroup v2 directory takes a
global kernel lock whose writer waits an RCU grace period (milliseconds), while a child born
there takes none (:func:`shim.kernel.cgroups.entry_files`). Where clone3 is refused (a kernel
before 5.7, a seccomp filter), A moves itself into the v2 cgroup first thing instead, as into the
v1 ones (:func:`shim.kernel.cgroups.birth_in_v2_allowed`). Without a pid namespace to enter
or a v2 cgroup to be born in, A becomes the process itself. The direct path needs none of that: the kernel
makes the namespaces and puts the process in its cgroup at its birth; it is taken while the shim
has one thread (the child of a raw clone3 skips the after-fork work that makes a fork of a
threaded process safe), and where the kernel and any seccomp filter allow clone3.
When A exits, B is re-parented to the shim, a child subreaper, and the shim's
:class:`~shim.kernel.reaper.Reaper` reaps it. Both children report on one close-on-exec pipe:
``P<pid>`` (B's pid; the direct child, PID 1 of its namespace, writes none: the shim knows its
pid from clone3), ``R`` (a builtin is ready), ``E<errno> <step>`` (the step that failed),
``X<errno> <step>`` (chdir or exec failed: the process's own arguments are wrong), ``W<errno>
<step>`` (a best-effort step that failed: lowering oom_score_adj). EOF means A has exited and B
has exec'd or is ready.

What the process is for (the pause's readiness, a task's logs) stays with the caller:
:func:`launch` takes an optional ``ready`` coroutine run before it returns, inside the same
cleanup, so a failed or cancelled launch never leaves a process behind.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import fcntl
import gc
import logging
import os
import select
import signal
import socket
import struct
import termios
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NoReturn

from shim.kernel import cgroups, linux
from shim.kernel.netns import is_host_netns, open_namespace
from shim.kernel.reaper import ExitInfo, Reaper
from shim.lib.console import resize as resize_terminal
from shim.lib.processes import signal_process
from shim.lib.rootfs import AT_ROOT, at_root
from shim.rpc.status import FailedPrecondition, Internal, InvalidArgument, RpcError, error_from_oserror
from shim.runtime import confine, mounts

__all__ = [
    "DEFAULT_PATH",
    "ExecFailed",
    "Process",
    "ProcessSpec",
    "environment",
    "launch",
    "read_available",
    "signal_process",
    "started_at_ns",
    "wait_exit",
]

log = logging.getLogger(__name__)

#: PATH when a process's environment sets none (containerd's and runc's default).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
REPORT_TIMEOUT = 2.0  # seconds for A and B to report (their EOF) after the fork
CLEANUP_TIMEOUT = 1.0  # seconds to wait for killed children after a failed launch
_MAX_REPORT_BYTES = 4096  # no more than PIPE_BUF, so each child's single write is atomic


def environment(env: Iterable[str]) -> dict[str, str]:
    """The environment a process runs with from ``env`` (validated ``NAME=VALUE`` strings): a map,
    the last of a name winning as in a process's environment, with :data:`DEFAULT_PATH` as PATH
    when it names none. A task's (:mod:`shim.sandbox.tasks` checks the strings first) and a
    sandbox image's pause's, under the native handler and in the OCI spec alike, so that pause
    sees the same environment under either."""
    result = dict(entry.split("=", 1) for entry in env)
    result.setdefault("PATH", DEFAULT_PATH)
    return result


# setns order: the mount namespace after the others, since joining it changes the root and cwd of
# A; a pod's user namespace last, since from there on A has no power over the host's namespaces.
_JOIN_ORDER = (linux.CLONE_NEWCGROUP, linux.CLONE_NEWIPC, linux.CLONE_NEWUTS, linux.CLONE_NEWNET,
               linux.CLONE_NEWPID, linux.CLONE_NEWNS, linux.CLONE_NEWUSER)


class ExecFailed(Internal):
    """The process could not be started as asked: its cwd or its program (``step``) failed with ``errno``.

    An Internal error for a process the shim chose (the pause); a caller that took the program
    from its client (a task) turns it into FailedPrecondition.
    """

    def __init__(self, message: str, *, err: int, step: str):
        super().__init__(message)
        self.errno = err
        self.step = step


#: One hook the process runs itself: its point (createContainer, startContainer), program, argv,
#: environment (None: the process's) and timeout in seconds.
ChildHook = tuple[str, str, tuple[str, ...], Mapping[str, str] | None, int]


@dataclass(frozen=True)
class LaunchHooks:
    """The OCI hooks of a launch with a root (:mod:`shim.runtime.hooks` says the points). Once the
    process's namespaces and mounts are made, before it pivots into its root, it waits while the
    caller's ``at_gate(pid)`` runs (the runtime's own hooks, createRuntime); that returns the state
    documents of the process's own hooks: ``in_task``'s createContainer ones, which it runs right
    then, and its startContainer ones, run right before its confinement and exec. What ``at_gate``
    raises fails the launch; a hook of ``in_task`` that fails, or outlives its timeout (it is
    killed), fails it with FailedPrecondition naming the hook."""

    at_gate: Callable[[int], Awaitable[tuple[bytes, bytes]]]
    in_task: tuple[ChildHook, ...] = ()


@dataclass(frozen=True)
class ProcessSpec:
    """Where a process runs and what it runs. Validated by :func:`launch` before anything is made.

    ``name`` names it in errors ("pause", "task web"). ``join`` lists namespace files and their
    ``CLONE_NEW*`` types to setns into (in a fixed order: the mount namespace last); ``unshare_flags`` the namespaces made new (a new pid
    namespace needs a new mount namespace too: it gets its own /proc). A new mount namespace is
    made a recursive slave of the one it copies. ``procs_files`` are the cgroup.procs files of the
    cgroups the process is in before it touches a page: the v1 ones are joined first thing by A
    (or the direct child), the v2 one by birth there. ``sysctls`` are
    written after the namespaces are entered. ``binds`` are ``(source, target)`` bind mounts (not recursive) made
    in the new mount namespace right after it is made a slave, so only this process and what it
    starts see them (needs ``CLONE_NEWNS`` in ``unshare_flags``). ``binds_from`` are ``(mount
    namespace file, source, target)``: a recursive copy of ``source`` as that namespace sees it
    (another process's, such as the pause's /dev/shm), bound on ``target`` with the binds (needs
    ``CLONE_NEWNS``). ``attach`` are ``(fd, target)``: detached trees the caller opened
    (:func:`shim.kernel.linux.open_tree`, id-mapped say), attached on ``target`` after the binds
    (needs ``CLONE_NEWNS``); the caller closes its fds after the launch. ``root``, when set, is the task's
    own root (:mod:`shim.runtime.mounts`: its /proc, /dev, /sys and mounts, then pivot_root), built
    by B in its pid namespace (needs ``CLONE_NEWNS``); the caller closes it after the launch.
    ``stdin``/``stdout``/``stderr`` are fds (None: /dev/null); with ``controlling_terminal`` the
    process's stdin (a terminal) becomes the controlling terminal of the session it leads.
    ``pause_root``, when set, is the pause's own root (:class:`shim.runtime.mounts.PauseRoot`), which
    it pivots into right before its cwd (needs ``CLONE_NEWNS``). ``argv[0]`` is searched in the PATH
    of ``env`` unless it contains a "/" (inside its root).
    ``console``, when set, is a unix socket: the process gets a new pseudo-terminal of its root's
    /dev/ptmx (its own devpts) as stdin, stdout, stderr and controlling terminal instead, and the
    terminal's master is sent on ``console`` (SCM_RIGHTS, as runc's console socket) before exec,
    once the terminal is ``console_size`` (columns, rows) big.
    ``builtin``, when set, runs in B instead of exec with the report fd (it writes ``R\\n`` once
    ready and never returns). ``exec_signals_blocked`` execs the program with every signal still
    blocked, as B has had them since the fork, instead of none: for a program that sets its own
    mask first thing and reads its signals from a signalfd (catatonit), which then cannot lose a
    signal sent from its exec on (a blocked signal stays pending, even for PID 1 of a pid
    namespace), so it is ready when its exec is done. ``confinement`` (a task's user,
    capabilities, no_new_privs and seccomp filter, :mod:`shim.runtime.confine`) is applied last,
    right before exec; None leaves the process as privileged as the shim. ``program``, when set,
    is the file exec'd (an absolute path) instead of ``argv[0]`` looked up in the PATH.
    ``hooks`` (with ``root``): the task's OCI hooks (:class:`LaunchHooks`).
    """

    name: str
    argv: tuple[str, ...] = ()
    program: str = ""
    hooks: LaunchHooks | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = "/"
    builtin: Callable[[int], NoReturn] | None = None
    join: tuple[tuple[str, int], ...] = ()
    unshare_flags: int = 0
    procs_files: tuple[str, ...] = ()
    hostname: str | None = None
    sysctls: Mapping[str, str] = field(default_factory=dict)
    oom_score_adj: int | None = None
    binds: tuple[tuple[str, str], ...] = ()
    binds_from: tuple[tuple[str, str, str], ...] = ()
    attach: tuple[tuple[int, str], ...] = ()
    root: mounts.RootSetup | None = None
    stdout: int | None = None
    stderr: int | None = None
    confinement: confine.Confinement | None = None
    stdin: int | None = None
    controlling_terminal: bool = False
    exec_signals_blocked: bool = False
    pause_root: mounts.PauseRoot | None = None
    console: int | None = None
    console_size: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class Process:
    """A launched process. ``(pid, start_time)`` names it across pid reuse (see :func:`signal_process`).

    ``start_time`` is field 22 of /proc/PID/stat (0 when it had exited and been reaped before
    :func:`launch` returned); ``started_at_ns`` the wall clock when it was ready (never after
    its exit: :func:`started_at_ns`); ``exit`` resolves when it is reaped.
    """

    pid: int
    start_time: int
    started_at_ns: int
    exit: asyncio.Future[ExitInfo] = field(compare=False, repr=False)


@dataclass(frozen=True)
class _Plan:
    """Everything the children need, computed (and validated) by the parent before the fork."""

    name: str
    cgroup_tasks: tuple[str, ...]  # v1 ``tasks`` files A writes "0" to (cgroups.entry_files)
    cgroup_v2: str | None  # the v2 directory the process is born in (fork_into_cgroup)
    cgroup_v2_procs: str | None  # the v2 cgroup.procs A writes itself to first, where no birth there
    join: list[tuple[int, int, str]]  # fd, CLONE_NEW* type, path
    unshare_flags: int
    second_fork: bool
    direct: bool  # the shim may clone the process straight into its new namespaces (_clone_direct)
    hostname: str | None
    sysctls: list[tuple[str, str, bytes]]  # key, /proc/sys path, value
    oom_score_adj: bytes | None
    binds: tuple[tuple[str, str], ...]
    cgroup_v2_fd: int  # open on cgroup_v2 by the parent (-1: none)
    binds_from: list[tuple[int, str, str]]  # mount ns fd (opened by the parent), source, target
    own_mnt_fd: int  # the shim's mount namespace, to come back to after taking binds_from
    attach: tuple[tuple[int, str], ...]  # the caller's detached trees and their targets
    root: mounts.RootSetup | None
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    builtin: Callable[[int], NoReturn] | None
    stdio: tuple[int | None, int | None, int | None]  # stdin, stdout, stderr
    controlling_terminal: bool
    exec_signals_blocked: bool
    console: int | None  # the socket the terminal's master is sent on
    console_size: tuple[int, int]  # its columns and rows
    max_fd: int
    confine: tuple[tuple[str, Callable[[], None]], ...]  # (step, call): the last calls before exec
    pause_root: mounts.PauseRoot | None = None
    #: a cgroup namespace to join (opened by the parent; -1: none), joined by the process itself once
    #: in its v2 cgroup: a process may enter a cgroup only from inside its namespace's root
    cgroupns_fd: int = -1
    program: str = ""
    in_task_hooks: tuple[ChildHook, ...] | None = None  # None: no hooks, no gate
    gate: tuple[int, int] = (-1, -1)  # the gate pipe (read end: the process's; write end: the parent's)


async def launch(spec: ProcessSpec, reaper: Reaper,
                 ready: Callable[[int, asyncio.Future[ExitInfo]], Awaitable[None]] | None = None) -> Process:
    """Start the process described by ``spec``; return once it has exec'd (and ``ready`` returned).

    ``ready(pid, exit_future)``, when given, runs before this returns; what it raises fails the
    launch. ``reaper`` must be installed (it reaps the process and makes the shim a subreaper).
    On any failure or cancellation nothing is left behind: children are killed and reaped, and
    the error says which step failed and why. Raises InvalidArgument (bad spec, unknown sysctl),
    NotFound (a namespace file is missing or of another type), FailedPrecondition (reaper not
    installed), ExecFailed (chdir or exec) or Internal.
    """
    if not reaper.installed:
        raise FailedPrecondition(f"the reaper must be installed before the {spec.name} is launched")
    plan = _plan(spec)
    fds: list[int] = []  # what the parent opens for the children: closed once they have copies
    read_fd = None
    try:
        join = []
        cgroupns_fd = -1
        for path, nstype in sorted(spec.join, key=lambda item: _JOIN_ORDER.index(item[1])):
            fds.append(open_namespace(path, nstype))
            if nstype == linux.CLONE_NEWCGROUP:
                cgroupns_fd = fds[-1]  # joined by B (see _Plan.cgroupns_fd)
                continue
            join.append((fds[-1], nstype, path))
        _check_net_sysctls(plan, join)
        binds_from = []
        for path, source, target in spec.binds_from:
            fds.append(open_namespace(path, linux.CLONE_NEWNS))
            binds_from.append((fds[-1], source, target))
        cgroup_v2_fd = -1
        if plan.cgroup_v2 is not None:
            try:
                fds.append(os.open(plan.cgroup_v2, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
            except OSError as exc:
                raise error_from_oserror(exc, f"cannot open cgroup {plan.cgroup_v2}") from None
            cgroup_v2_fd = fds[-1]
        own_mnt_fd = -1
        if binds_from:
            fds.append(os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC))
            own_mnt_fd = fds[-1]
        if spec.hooks is not None:
            gate_read, gate_write = os.pipe2(os.O_CLOEXEC)
            fds.append(gate_read)
            if gate_write < 3:  # kept past the fork (closed once the launch is over)
                gate_write, low = fcntl.fcntl(gate_write, fcntl.F_DUPFD_CLOEXEC, 3), gate_write
                os.close(low)
            plan = dataclasses.replace(plan, gate=(_above_stdio(gate_read, fds), gate_write))
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        fds.append(write_fd)
        # B closes every fd above 2 but the report pipe after dup2-ing its stdio onto 0-2, so
        # none of them may be one of 0-2 (possible if the shim runs with stdio closed).
        write_fd = _above_stdio(write_fd, fds)
        stdin, stdout, stderr = (None if fd is None else _above_stdio(fd, fds) for fd in (spec.stdin, spec.stdout, spec.stderr))
        stdio = (stdin, stdout, stderr)
        console = None if spec.console is None else _above_stdio(spec.console, fds)
        plan = dataclasses.replace(plan, join=join, stdio=stdio, binds_from=binds_from, own_mnt_fd=own_mnt_fd,
                                   console=console, cgroup_v2_fd=cgroup_v2_fd, cgroupns_fd=cgroupns_fd)
        try:
            pid_a = _clone_direct(plan, write_fd) if plan.direct else None
            if pid_a is None:
                plan = dataclasses.replace(plan, direct=False)
                pid_a = _fork(_child_a, plan, write_fd)
        except OSError as exc:
            raise error_from_oserror(exc, f"{spec.name} launch failed at fork") from exc
    except BaseException:
        if read_fd is not None:
            os.close(read_fd)
        if plan.gate[1] >= 0:
            os.close(plan.gate[1])
        raise
    finally:
        for fd in fds:
            os.close(fd)

    a_exit = reaper.watch(pid_a)
    reader = _ReportReader(read_fd, spec.name)
    try:
        process = await _start(plan, reaper, pid_a, a_exit, reader, ready, spec.hooks)
    except BaseException:
        # Shielded: a second cancellation must not leave a half-started process behind.
        await asyncio.shield(_abandon(reaper, pid_a, a_exit, reader))
        raise
    finally:
        if plan.gate[1] >= 0:
            os.close(plan.gate[1])
    reader.close()
    return process


# -- the parent's side -----------------------------------------------------------------------


def _plan(spec: ProcessSpec) -> _Plan:
    """Check ``spec`` (InvalidArgument) and compute what the children need, but the fds."""
    if spec.builtin is None and (not spec.argv or not all(isinstance(a, str) and "\0" not in a for a in spec.argv)):
        raise InvalidArgument(f"the {spec.name}'s argv must be non-empty strings without NUL")
    if any("\0" in k or "\0" in v or "=" in k or not k for k, v in spec.env.items()):
        raise InvalidArgument(f"the {spec.name}'s environment has a name that is empty or holds '=' or NUL")
    if spec.unshare_flags & linux.CLONE_NEWPID and not spec.unshare_flags & linux.CLONE_NEWNS:
        raise InvalidArgument("a new pid namespace needs a new mount namespace for its /proc")
    if (spec.binds or spec.binds_from or spec.attach or spec.root or spec.pause_root) \
            and not spec.unshare_flags & linux.CLONE_NEWNS:
        raise InvalidArgument(f"the {spec.name}'s bind mounts and root need a new mount namespace")
    for path, nstype in spec.join:
        if nstype not in _JOIN_ORDER:
            raise InvalidArgument(f"cannot join {path}: namespace type {nstype:#x} is not supported")
    if spec.hooks is not None and spec.root is None:
        raise InvalidArgument(f"the {spec.name}'s hooks need a root of its own")
    if spec.program and not os.path.isabs(spec.program):
        raise InvalidArgument(f"the {spec.name}'s program {spec.program!r} must be an absolute path")
    hostname = spec.hostname
    if hostname is not None and (not hostname or len(hostname.encode()) > 64 or "\0" in hostname):
        raise InvalidArgument(f"hostname {hostname!r} must be 1 to 64 bytes without NUL")
    if spec.oom_score_adj is not None and not -1000 <= spec.oom_score_adj <= 1000:
        raise InvalidArgument(f"oom_score_adj {spec.oom_score_adj} is outside -1000..1000")
    tasks, v2_dirs = cgroups.entry_files(spec.procs_files)
    if len(v2_dirs) > 1:
        raise InvalidArgument(f"the {spec.name} can join one cgroup v2 directory, not {len(v2_dirs)}")
    if v2_dirs and spec.unshare_flags & linux.CLONE_NEWCGROUP:
        # It is born in its v2 cgroup after the namespaces are made: a new cgroup namespace would
        # be rooted at the shim's cgroup (a task's own is made by its root: RootSetup.cgroup_namespace).
        raise InvalidArgument(f"the {spec.name} cannot get a cgroup namespace and a cgroup v2 directory at once")
    userns = any(nstype == linux.CLONE_NEWUSER for _, nstype in spec.join)
    if v2_dirs and (userns or not cgroups.birth_in_v2_allowed()):
        # (In a pod's user namespace A may not write the host's cgroup.procs.)
        # No clone3 into a cgroup here: A moves itself first thing, before any namespace is
        # joined (the grace period, as runc pays it), and the process is its child or itself.
        v2_procs, v2_dirs = os.path.join(v2_dirs[0], "cgroup.procs"), []
        clone3_ok = False
    else:
        v2_procs, clone3_ok = None, True
    return _Plan(
        name=spec.name,
        cgroup_tasks=tuple(tasks),
        cgroup_v2=v2_dirs[0] if v2_dirs else None,
        cgroup_v2_procs=v2_procs,
        join=[],  # opened last, once the spec is known to be valid
        unshare_flags=spec.unshare_flags,
        # A second fork enters a new pid namespace, and a cgroup v2 directory without the
        # global lock a move into one takes (cgroups.entry_files).
        second_fork=bool(spec.unshare_flags & linux.CLONE_NEWPID or v2_dirs)
        or any(nstype == linux.CLONE_NEWPID for _, nstype in spec.join),
        # New namespaces (a pid namespace among them) and no pid or mount namespace to join nor
        # mounts to take from another one first: the namespaces can be made at the birth.
        # (A pod's user namespace is joined first: the new namespaces are its.)
        direct=clone3_ok and bool(spec.unshare_flags & linux.CLONE_NEWPID) and not spec.binds_from and not userns
        and not any(nstype in (linux.CLONE_NEWPID, linux.CLONE_NEWNS) for _, nstype in spec.join),
        hostname=spec.hostname,
        sysctls=[(k, "/proc/sys/" + k.replace(".", "/"), v.encode()) for k, v in spec.sysctls.items()],
        oom_score_adj=str(spec.oom_score_adj).encode() if spec.oom_score_adj is not None else None,
        binds=spec.binds,
        cgroup_v2_fd=-1,  # opened last, as join
        binds_from=[],  # opened last, as join
        own_mnt_fd=-1,
        attach=spec.attach,
        root=spec.root,
        argv=spec.argv,
        env=dict(spec.env),
        cwd=spec.cwd,
        builtin=spec.builtin,
        stdio=(None, None, None),
        controlling_terminal=spec.controlling_terminal or spec.console is not None,
        exec_signals_blocked=spec.exec_signals_blocked,
        console=None,  # placed above stdio with the fds
        console_size=spec.console_size,
        max_fd=os.sysconf("SC_OPEN_MAX"),
        confine=confine.steps(spec.confinement),
        pause_root=spec.pause_root,
        program=spec.program,
        in_task_hooks=spec.hooks.in_task if spec.hooks is not None else None,
    )


def _check_net_sysctls(plan: _Plan, join: list[tuple[int, int, str]]) -> None:
    """InvalidArgument when net.* sysctls would be written in the host's network namespace.

    Checked here, on the namespace actually opened, because a caller's check by path or by
    network mode cannot see a bind mount of the host's netns swapped in since.
    """
    if plan.unshare_flags & linux.CLONE_NEWNET or not any(key.startswith("net.") for key, _, _ in plan.sysctls):
        return
    net = [(fd, path) for fd, nstype, path in join if nstype == linux.CLONE_NEWNET]
    if not net or is_host_netns(net[-1][0]):
        where = f"{net[-1][1]}, which is" if net else "what would be"
        raise InvalidArgument(f"the {plan.name}'s net.* sysctls are refused: {where} the host's network namespace")


def _above_stdio(fd: int, fds: list[int]) -> int:
    if fd >= 3:
        return fd
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    fds.append(high)
    return high


def _fork(child: Callable[[_Plan, int], None], plan: _Plan, write_fd: int, clone_flags: int | None = None) -> int:
    """fork() (or clone3 with ``clone_flags``, and ``plan.cgroup_v2_fd`` for CLONE_INTO_CGROUP);
    the child runs ``child(plan, write_fd)`` and never returns from here."""
    # Every signal is blocked across the fork, and stays blocked in the children until exec:
    # a signal handled in a child would have the interpreter write to the wakeup fd it shares
    # with our event loop, and our loop would act on a SIGTERM or SIGCHLD that was never ours.
    old_mask = linux.block_all_signals()
    try:
        pid = os.fork() if clone_flags is None else linux.clone3(clone_flags, plan.cgroup_v2_fd)
        if pid == 0:
            try:
                child(plan, write_fd)
            finally:
                os._exit(1)  # never back into the caller's event loop, whatever the child raised
    finally:
        linux.set_signal_mask(old_mask)
    return pid


def _clone_direct(plan: _Plan, write_fd: int) -> int | None:
    """clone3 the process straight into its new namespaces (and its cgroup v2 directory): one
    copy of the shim instead of two (A and B). Its pid, or None where that cannot be done here:
    the shim runs another thread now (the child of a raw clone3 must not meet a lock such a
    thread held), or the kernel (or a seccomp filter) refuses clone3."""
    if len(os.listdir("/proc/self/task")) != 1:
        return None
    flags = plan.unshare_flags | (linux.CLONE_INTO_CGROUP if plan.cgroup_v2_fd >= 0 else 0)
    try:
        return _fork(_child_direct, plan, write_fd, clone_flags=flags)
    except OSError as exc:
        if exc.errno in linux.CLONE3_REFUSED:
            return None  # A says which step fails, if one does
        raise


class _Report:
    """What the children wrote on the report pipe."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.ready = False
        self.error: tuple[bytes, int, str] | None = None  # kind (E or X), errno, step
        self.warnings: list[tuple[int, str]] = []
        self.at_gate = False  # the process waits at its hooks' gate

    def parse(self, data: bytes) -> None:
        for record in data.split(b"\n"):
            kind, body = record[:1], record[1:].decode("utf-8", "replace")
            if kind == b"P" and body.isdigit():
                self.pid = int(body)
            elif kind == b"R":
                self.ready = True
            elif kind == b"H":
                self.at_gate = True
            elif kind in (b"E", b"X", b"W", b"K"):
                number, _, step = body.partition(" ")
                err = int(number) if number.isdigit() else 0
                if kind == b"W":
                    self.warnings.append((err, step))
                elif self.error is None:
                    self.error = (kind, err, step)


class _ReportReader:
    """Reads the report pipe without blocking the loop; keeps what it read across calls."""

    def __init__(self, read_fd: int, name: str) -> None:
        os.set_blocking(read_fd, False)
        self._fd = read_fd
        self._name = name
        self._data = bytearray()
        self.eof = False
        self.report = _Report()

    async def read_until_eof(self, timeout: float, until: Callable[[_Report], bool] | None = None) -> None:
        """Read until both children closed their end, or ``until`` holds for what their complete
        records say (bounded by ``timeout``); parse into ``report``.

        Raises Internal on timeout or a read error.
        """
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def on_readable() -> None:
            try:
                chunk = os.read(self._fd, _MAX_REPORT_BYTES)
            except BlockingIOError:
                return
            except OSError as exc:
                if not done.done():
                    done.set_exception(error_from_oserror(exc, f"reading the {self._name} launcher's report failed"))
                return
            self._data.extend(chunk)
            if not chunk:
                self.eof = True
            if (self.eof or len(self._data) > _MAX_REPORT_BYTES) and not done.done():
                done.set_result(None)
            elif until is not None and not done.done():
                seen = _Report()
                seen.parse(bytes(self._data[:self._data.rfind(b"\n") + 1]))
                if until(seen) or seen.error is not None:
                    done.set_result(None)

        loop.add_reader(self._fd, on_readable)
        try:
            await asyncio.wait_for(done, timeout)
        except TimeoutError:
            raise Internal(f"the {self._name} launcher did not finish within {timeout} s") from None
        finally:
            loop.remove_reader(self._fd)
            self.report = _Report()
            self.report.parse(bytes(self._data))

    def close(self) -> None:
        os.close(self._fd)


_WARNED: set[tuple[str, int]] = set()


async def _start(plan: _Plan, reaper: Reaper, pid_a: int, a_exit: asyncio.Future[ExitInfo], reader: _ReportReader,
                 ready: Callable[[int, asyncio.Future[ExitInfo]], Awaitable[None]] | None,
                 hooks: LaunchHooks | None) -> Process:
    """The parent's side of a launch, from the fork until the process is ready."""
    timeout = REPORT_TIMEOUT
    if hooks is not None:
        await reader.read_until_eof(REPORT_TIMEOUT, until=lambda seen: seen.at_gate and (
            plan.direct or seen.pid is not None))
        if reader.report.at_gate and reader.report.error is None:
            creating, created = await hooks.at_gate(pid_a if plan.direct else reader.report.pid or 0)
            os.write(plan.gate[1], creating + b"\n" + created + b"\n")  # far below a pipe's buffer
            # Its own hooks' time, as they may take it, on top of the rest of its start.
            timeout += sum(hook[4] for hook in hooks.in_task)
    if not reader.eof:
        await reader.read_until_eof(timeout)
    report = reader.report
    if report.error is not None:
        raise _launch_error(plan.name, *report.error)
    if plan.direct:
        report.pid = pid_a  # the process itself: it knows itself only as PID 1 of its namespace
    for err, step in report.warnings:
        # Said once per kind of failure: on a host without CAP_SYS_RESOURCE every launch
        # fails to lower oom_score_adj, and a warning per sandbox would drown the log.
        level = logging.DEBUG if (step, err) in _WARNED else logging.WARNING
        _WARNED.add((step, err))
        log.log(level, "%s %s: %s failed (%s); continuing without it", plan.name, report.pid, step, os.strerror(err))
    if report.pid != pid_a:  # A forked the process (into a pid namespace) and must exit 0
        a_info = await asyncio.wait_for(asyncio.shield(a_exit), REPORT_TIMEOUT)
        if report.pid is None or a_info.exit_status != 0:
            raise Internal(f"the {plan.name} launcher exited with status {a_info.exit_status} "
                           f"without starting the {plan.name}")
    pid = report.pid
    exit_future = reaper.watch(pid)
    if plan.builtin is not None and not report.ready:
        raise Internal(f"the builtin {plan.name} closed its report pipe without becoming ready")
    if ready is not None:
        await ready(pid, exit_future)
    # Until the reaper has reaped it the pid cannot be reused, and reaping runs only in a loop
    # callback, never between this check and the read: a start time read here is the process's.
    start_time = 0 if exit_future.done() else linux.proc_start_time(pid) or 0
    return Process(pid, start_time, started_at_ns(exit_future), exit_future)


async def wait_exit(proc: Process, deadline: float) -> ExitInfo:
    """The exit of ``proc`` (a program the shim runs to its end: an OCI runtime's call, a hook); past
    ``deadline`` (``time.monotonic()``; TimeoutError) or when cancelled, it is killed first."""
    try:
        return await asyncio.wait_for(asyncio.shield(proc.exit), max(0.0, deadline - time.monotonic()))
    except BaseException as exc:
        # Until the reaper has reaped it the pid is still its, so the kill is safe.
        if not proc.exit.done():
            signal_process(proc.pid, proc.start_time, signal.SIGKILL)
        if isinstance(exc, TimeoutError):
            await asyncio.wait([proc.exit], timeout=CLEANUP_TIMEOUT)
        raise


def read_available(fd: int) -> bytes:
    """What can be read from the pipe ``fd`` now, to its end or to what is there: something the
    program started may still hold its write end."""
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def started_at_ns(exit_future: asyncio.Future[ExitInfo]) -> int:
    """The wall clock time a process that is ready now started at: now, or its exit time when it
    has already exited and been reaped (a process that exits at once may be reaped, and its
    exit stamped, before its launcher looks at the clock: it never exits before it starts)."""
    now = time.time_ns()
    if exit_future.done() and not exit_future.cancelled():
        return min(now, exit_future.result().exited_at_ns)
    return now


def _launch_error(name: str, kind: bytes, err: int, step: str) -> RpcError:
    reason = os.strerror(err) if err else "failed"
    if err == errno.ENOENT and step.startswith("writing sysctl "):
        return InvalidArgument(f"{name} launch failed at {step}: no such sysctl in this kernel or namespace")
    if err in (errno.EACCES, errno.EPERM) and step.startswith("writing sysctl "):
        return InvalidArgument(f"{name} launch failed at {step}: the kernel does not let this namespace set it")
    if err in (errno.EINVAL, errno.ERANGE) and step.startswith("writing sysctl "):
        return InvalidArgument(f"{name} launch failed at {step}: the kernel refuses the value ({reason})")
    if kind == b"K":  # a hook of the process's own failed: the hook is the caller's to fix
        return FailedPrecondition(f"{name} launch failed: {step}")
    if err == errno.EINVAL and step.startswith(AT_ROOT):
        return InvalidArgument(f"{name} launch failed: {at_root(step[len(AT_ROOT):])}")
    message = f"{name} launch failed at {step}: {reason} (errno {err})"
    if kind == b"X":
        return ExecFailed(message, err=err, step=step)
    return Internal(message)


async def _abandon(reaper: Reaper, pid_a: int, a_exit: asyncio.Future[ExitInfo], reader: _ReportReader) -> None:
    """Kill and reap what a failed or cancelled launch made, then close the report pipe."""
    try:
        # Learn B's pid before killing anything: A killed between its fork and its report
        # would leave B running where nobody knows it. A reports within microseconds of the
        # fork and B closes the pipe when it execs, so this wait is short.
        if not reader.eof:
            try:
                await reader.read_until_eof(CLEANUP_TIMEOUT)
            except Internal:
                pass
        waits = [a_exit]
        pid_b = reader.report.pid
        if pid_b is not None and pid_b != pid_a:
            b_exit = reaper.watch(pid_b)
            waits.append(b_exit)
            # Until the reaper has reaped B its pid cannot have been reused, so killing it is
            # safe; reaping happens only in a loop callback, never between watch() and kill().
            if not b_exit.done():
                _kill_quietly(pid_b)
        if not a_exit.done():
            _kill_quietly(pid_a)
        await asyncio.wait(waits, timeout=CLEANUP_TIMEOUT)
    finally:
        reader.close()


def _kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# -- the children's side ---------------------------------------------------------------------
# They run in a copy of the shim right after fork: they must never return into the caller's
# event loop (every path ends in os._exit or exec), must not take locks another thread may have
# held at fork time (no logging, no imports), and report failures as "E<errno> <step>".


def _child_a(plan: _Plan, write_fd: int) -> NoReturn:
    steps = [f"starting the {plan.name} launcher"]
    try:
        _enter_cgroups_and_namespaces(plan, steps, write_fd)
        if not plan.second_fork:
            # No pid namespace to enter: A can become the process itself.
            os.write(write_fd, b"P%d\n" % os.getpid())
            _child_b(plan, write_fd)
        steps[0] = f"forking the {plan.name}"
        pid_b = linux.fork_into_cgroup(plan.cgroup_v2_fd) if plan.cgroup_v2_fd >= 0 else os.fork()
        if pid_b == 0:
            _child_b(plan, write_fd)
        os.write(write_fd, b"P%d\n" % pid_b)
        os._exit(0)
    except BaseException as exc:
        _report_failure(write_fd, steps[0], exc)
    finally:
        os._exit(1)


def _child_direct(plan: _Plan, write_fd: int) -> NoReturn:
    """The process cloned straight into its new namespaces and cgroup v2 directory: A's work
    but the unshare, then B's."""
    steps = [f"starting the {plan.name}"]
    try:
        _enter_cgroups_and_namespaces(plan, steps, write_fd)
    except BaseException as exc:
        _report_failure(write_fd, steps[0], exc)
        os._exit(1)
    _child_b(plan, write_fd)


def _enter_cgroups_and_namespaces(plan: _Plan, steps: list[str], write_fd: int) -> None:
    """A's work up to the second fork (the direct child's too: its unshare is made, at its
    birth); ``steps[0]`` names the step under way, for the report of a failure."""
    signal.set_wakeup_fd(-1)
    gc.disable()
    # The v1 cgroups come first so that every page the process touches is charged there:
    # v1 memory charges do not move with a task that changes cgroup later. "0" in ``tasks``
    # moves this thread alone (A has one), without the kernel's global lock; the v2
    # directory, where that cannot be done, is entered by B's birth there.
    for tasks in plan.cgroup_tasks:
        steps[0] = f"joining cgroup {os.path.dirname(tasks)}"
        linux.write_file(tasks, b"0")
    if plan.cgroup_v2_procs is not None:
        steps[0] = f"joining cgroup {os.path.dirname(plan.cgroup_v2_procs)}"
        linux.write_file(plan.cgroup_v2_procs, b"0")
    trees = []
    for fd, source, target in plan.binds_from:
        # Taken before any setns: a detached copy can be attached in the new namespace below.
        steps[0] = f"taking {source} from another mount namespace"
        linux.setns(fd, linux.CLONE_NEWNS)
        trees.append((linux.open_tree(source, True), target))
        linux.setns(plan.own_mnt_fd, linux.CLONE_NEWNS)
    if plan.root is not None:
        # The task's mount point, as the cwd a new mount namespace carries into its copy: once in a
        # pod's user namespace, A may no longer look up a path through the shim's private directories.
        steps[0] = f"chdir {plan.root.mount_point}"
        os.chdir(plan.root.mount_point)
    written = 0
    for fd, nstype, path in plan.join:
        if nstype == linux.CLONE_NEWUSER:
            # Root of a pod's user namespace may not write the host's network namespace's sysctls
            # (CNI's, owned by the host's) nor lower oom_score_adj: A does, before it joins.
            for key, sysctl, value in plan.sysctls:
                if key.startswith("net."):
                    steps[0] = f"writing sysctl {key}"
                    linux.write_file(sysctl, value)
                    written += 1
            if plan.oom_score_adj is not None:
                steps[0] = "writing /proc/self/oom_score_adj"
                try:
                    linux.write_file("/proc/self/oom_score_adj", plan.oom_score_adj)
                except PermissionError as exc:  # as B's write below: the parent warns
                    _report_failure(write_fd, steps[0], exc, kind=b"W")
        steps[0] = f"setns({path})"
        linux.setns(fd, nstype)
        if nstype == linux.CLONE_NEWUSER:
            # Root inside, as the namespace maps it: the host's root has no id there.
            steps[0] = "becoming root of the pod's user namespace"
            os.setgroups([])
            os.setresgid(0, 0, 0)
            os.setresuid(0, 0, 0)
    if plan.unshare_flags and not plan.direct:
        steps[0] = f"unshare({_flag_names(plan.unshare_flags)})"
        linux.unshare(plan.unshare_flags)
    if plan.unshare_flags & linux.CLONE_NEWNS:
        # Slave, not private: umounts from the host must still reach this copy of the mount
        # table, or the process would pin every netns bind mount that existed when it started.
        steps[0] = "making / a recursive slave mount"
        linux.mount(None, "/", None, linux.MS_SLAVE | linux.MS_REC)
    for source, target in plan.binds:
        steps[0] = f"bind-mounting {source} on {target}"
        linux.mount(source, target, None, linux.MS_BIND)
    for tree, target in trees:
        steps[0] = f"bind-mounting a copy on {target}"
        linux.move_mount(tree, target)
    for tree, target in plan.attach:
        steps[0] = f"attaching a prepared mount on {target}"
        linux.move_mount(tree, target)
    if plan.hostname is not None:
        steps[0] = f"sethostname({plan.hostname})"
        linux.sethostname(plan.hostname)
    for key, path, value in plan.sysctls:
        if written and key.startswith("net."):
            continue
        steps[0] = f"writing sysctl {key}"
        linux.write_file(path, value)


def _child_b(plan: _Plan, write_fd: int) -> NoReturn:
    step = f"starting the {plan.name}"
    kind = b"E"
    try:
        if plan.cgroupns_fd >= 0:
            step = "joining the task's cgroup namespace"
            linux.setns(plan.cgroupns_fd, linux.CLONE_NEWCGROUP)
        if plan.root is not None and plan.root.cgroup_namespace:
            # In its v2 cgroup by now (born there, or moved first thing): the namespace's root.
            step = "unsharing a cgroup namespace"
            linux.unshare(linux.CLONE_NEWCGROUP)
        states: list[bytes] = []  # the state documents of its hooks (from the gate)
        if plan.root is not None:
            # Its root, with a /proc of its pid namespace, /dev, /sys and its mounts; pivot_root.
            steps = [step]
            try:
                mounts.enter_root(plan.root, steps, before_pivot=None if plan.in_task_hooks is None else
                                  lambda: states.extend(_at_gate(plan, write_fd, steps)))
            finally:
                step = steps[0]
            # The process side (plan.confine: user, capabilities, no_new_privs, seccomp) comes
            # after this, last before exec: inside this root, with the mounts already made.
        elif plan.unshare_flags & linux.CLONE_NEWPID and plan.pause_root is None:
            # A /proc that shows this pid namespace, so /proc/self is the process itself (the
            # pause reads the shim's until it leaves it, where its own pid is the one shown).
            step = "mounting proc on /proc"
            linux.mount("proc", "/proc", "proc", linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC)
        if plan.oom_score_adj is not None and not any(t == linux.CLONE_NEWUSER for _, t, _ in plan.join):
            step = "writing /proc/self/oom_score_adj"
            try:
                linux.write_file("/proc/self/oom_score_adj", plan.oom_score_adj)
            except PermissionError as exc:
                # Lowering it below the shim's own needs CAP_SYS_RESOURCE, which some machines
                # (and rootless setups) drop. The process still works; the parent warns.
                _report_failure(write_fd, step, exc, kind=b"W")
        stdio = plan.stdio
        if plan.console is not None:
            step = "making its terminal (/dev/ptmx)"
            terminal = _make_terminal(plan.console, plan.console_size)
            stdio = (terminal, terminal, terminal)
        step = f"detaching the {plan.name} from the shim's session, fds and signals"
        os.setsid()
        null_fd = os.open("/dev/null", os.O_RDWR)
        for target, fd in enumerate(stdio):
            os.dup2(null_fd if fd is None else fd, target)
        if plan.controlling_terminal:
            step = "making stdin the controlling terminal"
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        os.closerange(3, write_fd)
        os.closerange(write_fd + 1, plan.max_fd)
        ignored = _ignored_signals()  # read from /proc, which the pause's root leaves behind
        if plan.pause_root is not None:
            steps = [step]
            try:
                mounts.enter_pause_root(plan.pause_root, steps)
            finally:
                step = steps[0]
        kind = b"X"
        step = f"chdir {plan.cwd}"
        _chdir_in_root(plan.cwd)
        kind = b"E"
        if plan.builtin is not None:
            for _step, call in plan.confine:  # a builtin is confined as a program would be at exec
                call()
            plan.builtin(write_fd)
        if states:
            # Signals still blocked: a handler of the shim's must never run here (the hooks'
            # exits are seen on their pidfds).
            step = "running its startContainer hooks"
            _child_hooks(plan, write_fd, "startContainer", states[1])
        # exec resets caught signals but keeps ignored ones (Python ignores SIGPIPE and SIGXFSZ,
        # and anything ignored when the shim started). The kernel's SigIgn has them all.
        step = "resetting the signals it would inherit ignored"
        for sig in ignored:
            linux.default_signal(sig)
        if not plan.exec_signals_blocked:
            linux.set_signal_mask(b"")
        for _step, call in plan.confine:
            call()
        kind = b"X"
        step = f"exec {plan.program or plan.argv[0]}"
        os.execvpe(plan.program or plan.argv[0], list(plan.argv), plan.env)
    except BaseException as exc:
        _report_failure(write_fd, step, exc, kind)
    finally:
        os._exit(127)


def _at_gate(plan: _Plan, write_fd: int, steps: list[str]) -> list[bytes]:
    """In B, its namespaces and mounts made, before it pivots into its root: report ``H``, wait at
    the gate for the state documents of its hooks (createContainer's, startContainer's: the parent
    has run createRuntime's meanwhile) and run its createContainer hooks; the documents."""
    os.close(plan.gate[1])  # the parent's end: a parent gone is an EOF
    steps[0] = "waiting for the runtime's hooks"
    os.write(write_fd, b"H\n")
    data = b""
    while data.count(b"\n") < 2:
        chunk = os.read(plan.gate[0], 65536)
        if not chunk:
            os._exit(1)  # the parent gave up the launch (and kills this process)
        data += chunk
    os.close(plan.gate[0])
    states = data.split(b"\n")[:2]
    steps[0] = "running its createContainer hooks"
    _child_hooks(plan, write_fd, "createContainer", states[0])
    return states


def _child_hooks(plan: _Plan, write_fd: int, point: str, state: bytes) -> None:
    """In B: run its hooks of ``point``, each with ``state`` on its stdin; the first that fails is
    reported (``K``) and B exits."""
    # Their exits send B a SIGCHLD (blocked): the shim's handler of it must never run in B, once
    # its signals are unblocked before exec. Ignored by default, a pending one is dropped.
    linux.default_signal(signal.SIGCHLD)
    for name, program, argv, env, timeout in plan.in_task_hooks or ():
        if name == point:
            failure = _child_hook(program, argv, plan.env if env is None else env, timeout, state, plan.max_fd)
            if failure is not None:
                record = f"K0 {name} hook {program} {failure}".encode("utf-8", "replace").replace(b"\n", b" ")
                os.write(write_fd, record[:_MAX_REPORT_BYTES - 64] + b"\n")
                os._exit(127)


def _child_hook(program: str, argv: tuple[str, ...], env: Mapping[str, str], timeout: int, state: bytes,
                max_fd: int) -> str | None:
    """In B: run one hook with ``state`` on its stdin, killed past ``timeout`` seconds; None when it
    exited 0, else what went wrong. Its stdout and stderr are kept (their end) for the error."""
    in_r, in_w = os.pipe2(os.O_CLOEXEC)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    ignored = _ignored_signals()
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(in_r, 0)
            os.dup2(out_w, 1)
            os.dup2(out_w, 2)
            os.closerange(3, max_fd)
            for sig in ignored:
                linux.default_signal(sig)
            linux.set_signal_mask(b"")
            os.execve(program, list(argv), dict(env))
        except OSError as exc:
            os.write(2, f"cannot run it: {exc.strerror}".encode())
        finally:
            os._exit(127)
    os.close(in_r)
    os.close(out_w)
    try:
        os.write(in_w, state)  # far below a pipe's buffer: the hook need not read it
    except OSError:
        pass  # it exited (or closed its stdin) without reading: its exit says what it did
    os.close(in_w)
    pidfd = os.pidfd_open(pid)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(out_r, select.POLLIN)
    output = b""
    deadline = time.monotonic() + timeout
    exited = False
    try:
        while not exited:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return f"did not finish within its timeout of {timeout} s; it was killed"
            for fd, _ in poller.poll(int(left * 1000) + 1):
                if fd == pidfd:
                    exited = True
                elif fd == out_r:
                    chunk = os.read(out_r, 4096)
                    if chunk:
                        output = (output + chunk)[-512:]
                    else:
                        poller.unregister(out_r)
        _, status = os.waitpid(pid, 0)
        os.set_blocking(out_r, False)
        try:
            output = (output + os.read(out_r, 4096))[-512:]
        except BlockingIOError:
            pass  # something it started holds the pipe: what it wrote is what there is
    finally:
        os.close(pidfd)
        os.close(out_r)
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        return None
    text = " ".join(output.decode("utf-8", "replace").split())
    return f"failed: {f'exit status {code}' if code > 0 else f'killed by signal {-code}'}" + (
        f": {text}" if text else "")


def _chdir_in_root(cwd: str) -> None:
    """chdir to ``cwd`` resolved inside this process's root, as if it were ``/`` (a link to
    ``/..`` or to an absolute path stays in it) and through no /proc magic link (/proc/1/root, a
    process's cwd or fds: another root, the host's for a process that has it). Raises OSError
    (ELOOP for a magic link)."""
    root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = linux.openat2(root, cwd, os.O_PATH | os.O_DIRECTORY, linux.RESOLVE_IN_ROOT | linux.RESOLVE_NO_MAGICLINKS)
    finally:
        os.close(root)
    try:
        os.fchdir(fd)
    finally:
        os.close(fd)


# <asm-generic/ioctls.h>: unlockpt()'s ioctl, and the slave of a master opened through the master
# itself (Linux 4.13), never through a path a process in the container could swap.
_TIOCSPTLCK = 0x40045431
_TIOCGPTPEER = 0x5441


def _make_terminal(console: int, size: tuple[int, int]) -> int:
    """In B: a new pseudo-terminal of /dev/ptmx (the root's own devpts) of ``size`` (columns, rows);
    its master is sent on the socket ``console`` and closed here; returns the slave, above stdio (it
    is dup'ed onto 0-2)."""
    master = os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    fcntl.ioctl(master, _TIOCSPTLCK, struct.pack("i", 0))
    resize_terminal(master, *size)  # (columns, rows)
    slave = fcntl.ioctl(master, _TIOCGPTPEER, os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    if slave < 3:
        slave = fcntl.fcntl(slave, fcntl.F_DUPFD_CLOEXEC, 3)
    sock = socket.socket(fileno=console)
    socket.send_fds(sock, [b"\0"], [master])
    sock.detach()
    os.close(master)
    return slave


def _ignored_signals() -> list[int]:
    """The signals this process ignores (and an exec would leave ignored). Among them may be the
    C library's own (glibc: 32 and 33), which its posix_spawn leaves ignored in what it starts (a
    shim whose starter used it): :func:`shim.kernel.linux.default_signal` resets those too."""
    mask = linux.status_mask("SigIgn")
    return [sig for sig in range(1, mask.bit_length() + 1) if mask >> (sig - 1) & 1]


def _report_failure(write_fd: int, step: str, exc: BaseException, kind: bytes = b"E") -> None:
    err = exc.errno if isinstance(exc, OSError) and exc.errno else 0
    if not isinstance(exc, OSError):
        step = f"{step}: {type(exc).__name__}: {exc}"
    record = b"%s%d %s\n" % (kind, err, step.encode("utf-8", "replace").replace(b"\n", b" ")[:_MAX_REPORT_BYTES - 64])
    try:
        os.write(write_fd, record)
    except OSError:
        pass


_FLAG_NAMES = (
    (linux.CLONE_NEWNS, "CLONE_NEWNS"),
    (linux.CLONE_NEWUTS, "CLONE_NEWUTS"),
    (linux.CLONE_NEWIPC, "CLONE_NEWIPC"),
    (linux.CLONE_NEWPID, "CLONE_NEWPID"),
    (linux.CLONE_NEWNET, "CLONE_NEWNET"),
    (linux.CLONE_NEWCGROUP, "CLONE_NEWCGROUP"),
    (linux.CLONE_NEWUSER, "CLONE_NEWUSER"),
)


def _flag_names(flags: int) -> str:
    return "|".join(name for bit, name in _FLAG_NAMES if flags & bit)
