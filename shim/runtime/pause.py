"""Launching the pause task: the process that holds the sandbox's namespaces open.

The pause is PID 1 of new pid, ipc, uts and mount namespaces (the host's pid, ipc or uts
namespace in NODE modes), joined to the sandbox's network namespace, in the sandbox cgroup
before it execs, with the sysctls applied and a tmpfs on /dev/shm. It runs in a root of its own,
pivoted into with the host's detached (:class:`shim.runtime.mounts.PauseRoot`): an empty read-only
tmpfs holding only its program, or a sandbox image's rootfs. A pod's processes reach the pause's
root through ``/proc/1/root`` (pid namespace POD), so the host's must not be there. :mod:`shim.runtime.process` does the
forking (the one way the shim launches anything); this module says what the pause needs and
when it is ready.

A pause that has not yet set up its signal handling loses a SIGTERM (PID 1 of a pid namespace
drops every signal it has no handler for), so :func:`launch` returns only once the pause
catches or blocks SIGTERM. catatonit is exec'd with every signal blocked, which it keeps (it
sets its own mask, all blocked, and reads them from a signalfd): it is ready once exec'd. Any
other pause binary is watched until it catches or blocks SIGTERM itself, but a sandbox image's
(``PauseSpec.rootfs``), which may be any program: it is ready once it has exec'd and then handles
SIGTERM, or :data:`IMAGE_SIGTERM_GRACE` after its exec, whichever comes first (one that never
handles SIGTERM is ended by StopSandbox's SIGKILL).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import signal
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NoReturn

from shim.api.defaults import CATATONIT
from shim.kernel import linux, userns
from shim.kernel.cgroups import SandboxCgroup
from shim.kernel.reaper import ExitInfo, Reaper
from shim.lib.idmaps import UserNamespace
from shim.lib.rootfs import resolve_in_root
from shim.rpc.status import FailedPrecondition, Internal, InvalidArgument, RpcError
from shim.runtime import mounts, process
from shim.runtime.confine import Confinement

__all__ = [
    "BUILTIN",
    "NODE",
    "POD",
    "PauseProcess",
    "PauseSpec",
    "check_static_executable",
    "check_user_namespace",
    "launch",
    "program_identity",
    "validate_sysctls",
    "wait_ready",
]

POD = "POD"
NODE = "NODE"
BUILTIN = "builtin"
DEFAULT_OOM_SCORE_ADJ = -998  # what CRI gives sandboxes
DEFAULT_SHM_SIZE_BYTES = 64 << 20

READY_TIMEOUT = 2.0  # seconds for an exec'd pause to set up its SIGTERM handling
READY_POLL_SECONDS = 0.0005  # between two looks at its signal masks
#: Pause programs that block every signal first thing and read them from a signalfd, by file
#: name: exec'd with every signal blocked, they are ready at exec (no polling of their masks).
SIGNALFD_PAUSES = frozenset({"catatonit"})
IMAGE_SIGTERM_GRACE = 1.0  # seconds an image's pause, once exec'd, may take to handle SIGTERM

_SIGTERM_BIT = 1 << (signal.SIGTERM - 1)
_BUILTIN_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGCHLD}
_SYSCTL_KEY = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)+")
_IPC_SYSCTL_PREFIXES = ("kernel.shm", "kernel.msg", "fs.mqueue.")
# UTS sysctls (kernel.hostname is the sandbox's hostname option, as runc refuses it too).
_UTS_SYSCTLS = ("kernel.domainname",)


@dataclass(frozen=True)
class PauseSpec:
    """What the pause's namespaces look like. Defaults match containerd's sandbox defaults.

    ``netns_path`` None means host network, and then the host UTS namespace is kept too (as
    containerd does), so ``hostname`` is ignored. ``pause_binary``: None picks catatonit when
    installed, else the builtin Python pause; "builtin" forces it; a path names a binary that
    accepts catatonit's ``-P`` (pause mode). ``shm_size_bytes`` sizes the tmpfs on /dev/shm
    that a pod IPC namespace gets. ``confinement``: the pause's user, capabilities, no_new_privs
    and seccomp filter (None: as privileged as the shim with the native handler; containerd's
    default capabilities and no_new_privs with runc and crun). ``privileged``: a privileged pod,
    whose device cgroup (the pause's, with an OCI runtime that sets device rules) allows every
    device, so that its privileged tasks can open the host's devices they are given.
    """

    netns_path: str | None = None
    pid_mode: str = POD
    ipc_mode: str = POD
    hostname: str | None = None
    sysctls: Mapping[str, str] = field(default_factory=dict)
    cgroup: SandboxCgroup | None = None
    pause_binary: str | None = None
    oom_score_adj: int | None = DEFAULT_OOM_SCORE_ADJ
    shm_size_bytes: int = DEFAULT_SHM_SIZE_BYTES
    confinement: Confinement | None = None
    privileged: bool = False
    rootfs: str | None = None  # a sandbox image's root (mounted): the pause is ``args`` run from it
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()  # NAME=VALUE
    cwd: str = "/"
    userns: UserNamespace | None = None  # a user namespace of the pod's, made with these mappings

    @property
    def env_map(self) -> dict[str, str]:
        """``env`` as :func:`shim.runtime.process.environment` gives it."""
        return process.environment(self.env)


@dataclass(frozen=True)
class PauseProcess:
    """A running pause. ``(pid, start_time)`` names it across pid reuse (see
    :func:`shim.lib.processes.signal_process`).

    ``start_time`` is field 22 of /proc/PID/stat; ``created_at_ns`` the wall clock when it was
    ready; ``binary`` the program exec'd, or "builtin"; ``exit`` resolves when it is reaped.
    """

    pid: int
    start_time: int
    created_at_ns: int
    binary: str
    exit: asyncio.Future[ExitInfo] = field(compare=False, repr=False)


def validate_sysctls(sysctls: Mapping[str, str], *, host_network: bool, host_ipc: bool) -> None:
    """Accept only sysctls that are namespaced for this sandbox.

    ``net.*`` needs a pod network; ``kernel.shm*``, ``kernel.msg*``, ``kernel.sem`` and
    ``fs.mqueue.*`` need a pod IPC namespace, ``kernel.domainname`` a pod UTS namespace (not
    host network). Anything else would be written to the host's own
    settings. Which ``net.*`` keys a netns can set is the kernel's to say, from inside it
    (:func:`shim.kernel.netns.check_net_sysctls`, at CreateSandbox). Raises InvalidArgument
    with the reason.
    """
    for key, value in sysctls.items():
        if not isinstance(key, str) or not _SYSCTL_KEY.fullmatch(key):
            raise InvalidArgument(
                f"sysctl name {key!r} is malformed (expected dotted words, e.g. net.ipv4.ip_forward)"
            )
        if not isinstance(value, str) or "\0" in value:
            raise InvalidArgument(f"sysctl {key} has a value that is not a string without NUL: {value!r}")
        if key.startswith("net."):
            if host_network:
                raise InvalidArgument(
                    f"sysctl {key} cannot be set on a sandbox with host network: "
                    "it would change the host's network settings"
                )
        elif key in _UTS_SYSCTLS:
            if host_network:  # no UTS namespace of its own either (section 7.4)
                raise InvalidArgument(
                    f"sysctl {key} cannot be set on a sandbox with host network: it would change the host's {key}"
                )
        elif key == "kernel.sem" or key.startswith(_IPC_SYSCTL_PREFIXES):
            if host_ipc:
                raise InvalidArgument(
                    f"sysctl {key} cannot be set on a sandbox with host IPC: it would change the host's IPC limits"
                )
        else:
            raise InvalidArgument(
                f"sysctl {key} is not namespaced: applying it would change the host "
                "(allowed: net.*, kernel.shm*, kernel.msg*, kernel.sem, fs.mqueue.*, kernel.domainname)"
            )


async def launch(spec: PauseSpec, reaper: Reaper) -> PauseProcess:
    """Start the pause described by ``spec`` and return once it is ready for signals.

    ``reaper`` must be installed (it reaps the pause and makes the shim a subreaper). On any
    failure nothing is left behind: children are killed and reaped, and the error says which
    step failed and why. Raises InvalidArgument (bad spec, unknown sysctl), NotFound (netns
    missing), FailedPrecondition (reaper not installed, pause binary missing) or Internal.
    """
    binary, proc_spec = _process_spec(spec)
    userns_fd = -1
    if spec.userns is not None:
        userns_fd = await userns.create(spec.userns, reaper)
        proc_spec = dataclasses.replace(proc_spec, join=(*proc_spec.join, (f"/proc/self/fd/{userns_fd}",
                                                                          linux.CLONE_NEWUSER)))

    watch = binary != BUILTIN and not proc_spec.exec_signals_blocked

    async def ready(pid: int, exit_future: asyncio.Future[ExitInfo]) -> None:
        # The launch returns once the program has exec'd (its report pipe is close-on-exec).
        await wait_ready(pid, exit_future, sigterm_grace=IMAGE_SIGTERM_GRACE if spec.rootfs else None)

    try:
        proc = await process.launch(proc_spec, reaper, ready if watch else None)
    except process.ExecFailed as exc:
        if spec.rootfs is None:
            raise
        # The image's own program or working directory: the image is at fault, not the shim.
        raise FailedPrecondition(f"the sandbox image's pause cannot start: {exc.step}: "
                                 f"{os.strerror(exc.errno)}") from None
    finally:
        if userns_fd >= 0:
            os.close(userns_fd)  # the pause holds the namespace now
    if proc.exit.done():  # nothing to clean up: it is gone and reaped
        raise Internal("the pause exited right after it started")
    return PauseProcess(proc.pid, proc.start_time, proc.started_at_ns, binary, proc.exit)


def check_user_namespace(spec: PauseSpec) -> None:
    """InvalidArgument unless the pod of ``spec`` may have its user namespace (``spec.userns``,
    None: none to check): podshim's own pause (not a sandbox image's), a pod that is not
    privileged, and its own network, pid and IPC namespaces. Every handler checks it."""
    if spec.userns is None:
        return
    if spec.rootfs is not None:
        raise InvalidArgument("a sandbox image's pause cannot run in a pod's user namespace yet (podshim's own "
                              "pause can)")
    if spec.privileged:
        raise InvalidArgument("a privileged pod cannot have a user namespace: its privileges are the host's")
    if spec.netns_path is None or spec.pid_mode == NODE or spec.ipc_mode == NODE:
        raise InvalidArgument("a pod's user namespace needs the pod's own network, pid and IPC namespaces "
                              "(none of the host's)")


def _process_spec(spec: PauseSpec) -> tuple[str, process.ProcessSpec]:
    if spec.pid_mode not in (POD, NODE):
        raise InvalidArgument(f"pid_mode {spec.pid_mode!r} is not supported (POD or NODE)")
    if spec.ipc_mode not in (POD, NODE):
        raise InvalidArgument(f"ipc_mode {spec.ipc_mode!r} is not supported (POD or NODE)")
    host_network = spec.netns_path is None
    validate_sysctls(spec.sysctls, host_network=host_network, host_ipc=spec.ipc_mode == NODE)
    if spec.shm_size_bytes <= 0:
        raise InvalidArgument(f"shm_size_bytes must be positive, not {spec.shm_size_bytes}")
    flags = linux.CLONE_NEWNS
    if not host_network:
        flags |= linux.CLONE_NEWUTS
    if spec.ipc_mode == POD:
        flags |= linux.CLONE_NEWIPC
    if spec.pid_mode == POD:
        flags |= linux.CLONE_NEWPID
    shm = spec.shm_size_bytes if spec.ipc_mode == POD else 0
    check_user_namespace(spec)
    if spec.rootfs is not None:
        if spec.pause_binary is not None:
            raise InvalidArgument("a pause binary and a sandbox image's rootfs are both set")
        if not spec.args:
            raise InvalidArgument("a sandbox image's pause needs its args (the image's Entrypoint and Cmd)")
        binary, argv, env, cwd = spec.args[0], spec.args, spec.env_map, spec.cwd
        root = mounts.PauseRoot(rootfs=spec.rootfs, shm_size_bytes=shm)
    else:
        binary = _resolve_binary(spec.pause_binary)
        argv, env, cwd = (binary, "-P"), {}, "/"
        root = mounts.PauseRoot(binary="" if binary == BUILTIN else binary, shm_size_bytes=shm)
    return binary, process.ProcessSpec(
        name="pause",
        argv=argv,
        env=env,
        cwd=cwd,
        pause_root=root,
        builtin=_builtin_pause if binary == BUILTIN else None,
        join=((spec.netns_path, linux.CLONE_NEWNET),) if spec.netns_path is not None else (),
        unshare_flags=flags,
        procs_files=tuple(spec.cgroup.procs_files()) if spec.cgroup is not None else (),
        hostname=None if host_network else spec.hostname,
        sysctls=spec.sysctls,
        oom_score_adj=spec.oom_score_adj,
        confinement=spec.confinement,
        exec_signals_blocked=os.path.basename(binary) in SIGNALFD_PAUSES,
    )


def _resolve_binary(pause_binary: str | None) -> str:
    """The pause's program: ``pause_binary``, or (None) catatonit when it is installed and static,
    else the builtin pause. Its root holds nothing but the program, so it must be static."""
    if pause_binary is None:
        try:
            check_static_executable(CATATONIT, "catatonit")
        except FailedPrecondition:
            return BUILTIN
        return CATATONIT
    if pause_binary == BUILTIN:
        return BUILTIN
    if not os.path.isabs(pause_binary):
        raise InvalidArgument(f"pause binary {pause_binary!r} must be an absolute path or 'builtin'")
    check_static_executable(pause_binary, f"pause binary {pause_binary} must be a static executable")
    return pause_binary


def check_static_executable(path: str, what: str) -> None:
    """FailedPrecondition (``what``, then why) unless ``path`` is an executable ELF without a
    program interpreter: a pause's root holds no libraries and no loader."""
    from shim.runtime.oci import elf  # its ELF reader only, not the OCI backend

    if not os.access(path, os.X_OK):
        raise FailedPrecondition(f"{what}: it is missing or not executable")
    try:
        dynamic = elf.has_interpreter(path)
    except (OSError, elf.NotElf):
        raise FailedPrecondition(f"{what}: it is not an ELF executable") from None
    if dynamic:
        raise FailedPrecondition(f"{what}: it is dynamically linked, and the pause's root holds no libraries")


async def wait_ready(pid: int, exit_future: asyncio.Future[ExitInfo], name: str | None = None, *,
                     exe: tuple[int, int] | None = None, sigterm_grace: float | None = None) -> None:
    """Poll /proc/PID/status until the exec'd pause catches or blocks SIGTERM.

    ``name`` (the pause's command name) or ``exe`` (the ``(st_dev, st_ino)`` of its program), when
    given, tells when the process has exec'd the pause: either matching is enough (an OCI
    runtime's init catches SIGTERM itself, and dies of it). ``sigterm_grace``, when given, makes
    SIGTERM handling optional: the pause is ready that many seconds after its exec was seen
    even if it never handles SIGTERM (a sandbox image's pause may be any program).
    Raises Internal when the pause exits first or has not exec'd (or, without a grace, is not
    ready) within READY_TIMEOUT.
    """
    # catatonit blocks every signal and reads them from a signalfd (SigBlk); a classic pause
    # installs handlers (SigCgt). Either way SIGTERM is no longer dropped. The mask B set
    # before exec was empty, so a set bit is the new program's doing.
    deadline = time.monotonic() + READY_TIMEOUT
    grace_end: float | None = None
    while True:
        try:
            fields = linux.read_status(f"/proc/{pid}/status")
        except FileNotFoundError:
            fields = {}
        if exit_future.done() or fields.get("State", " Z").split()[0] in ("Z", "X"):
            # The pause has exited (a zombie until the reaper runs): report its status.
            info = await asyncio.wait_for(asyncio.shield(exit_future), process.CLEANUP_TIMEOUT)
            raise Internal(f"the pause exited during start with status {info.exit_status}")
        exec_done = ((name is None and exe is None) or (name is not None and fields.get("Name", "").strip() == name)
                     or (exe is not None and _exe_identity(pid) == exe))
        if exec_done and (name is not None or exe is not None) and not _has_arguments(pid):
            # Mid-exec: the kernel names the new program (comm, exe) before it resets the old
            # one's signal handlers (an OCI runtime's init catches SIGTERM), and sets up its
            # arguments after both. Until /proc/PID/cmdline shows them, SigCgt is not the pause's.
            exec_done = False
        if exec_done and (int(fields["SigBlk"], 16) | int(fields["SigCgt"], 16)) & _SIGTERM_BIT:
            return
        now = time.monotonic()
        if exec_done and sigterm_grace is not None:
            if grace_end is None:
                grace_end = now + sigterm_grace
            elif now >= grace_end:
                return
        elif now >= deadline:
            if not exec_done:
                raise Internal(f"the pause did not exec its program within {READY_TIMEOUT} s")
            raise Internal(f"the pause did not set up its SIGTERM handling within {READY_TIMEOUT} s")
        await asyncio.sleep(READY_POLL_SECONDS)


def _has_arguments(pid: int) -> bool:
    """Whether /proc/PID/cmdline shows arguments (empty while an exec is under way, or once a zombie)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return bool(f.read(1))
    except OSError:
        return False


def _exe_identity(pid: int) -> tuple[int, int] | None:
    try:
        st = os.stat(f"/proc/{pid}/exe")
    except OSError:
        return None
    return st.st_dev, st.st_ino


def program_identity(rootfs: str, args: tuple[str, ...], env: Mapping[str, str]) -> tuple[int, int] | None:
    """The ``(st_dev, st_ino)`` of the program ``args[0]`` names inside ``rootfs`` (searched in
    ``env``'s PATH unless it holds a "/", symbolic links resolved inside the root), or None when
    it is not found there (it may still be found by the runtime: then the pause's command name
    tells its exec)."""
    program = args[0]
    candidates = [program] if "/" in program else [
        os.path.join(directory or "/", program) for directory in env.get("PATH", process.DEFAULT_PATH).split(":")]
    for candidate in candidates:
        if not candidate.startswith("/"):
            continue
        try:
            st = os.stat(resolve_in_root(rootfs, candidate))
        except (OSError, RpcError):  # RpcError: a loop of symbolic links
            continue
        if stat.S_ISREG(st.st_mode):
            return st.st_dev, st.st_ino
    return None


def _builtin_pause(write_fd: int) -> NoReturn:
    """A pause without exec: wait for signals, reap orphans, exit 0 on SIGTERM or SIGINT."""
    # Every signal is still blocked from the fork, and blocked signals are never dropped,
    # even for PID 1 of a pid namespace: it is ready now. Signals it does not wait for stay
    # pending, so none of the shim's Python handlers can ever run in this copy.
    os.write(write_fd, b"R\n")
    os.close(write_fd)
    while True:
        info = signal.sigwaitinfo(_BUILTIN_SIGNALS)
        if info.si_signo != signal.SIGCHLD:
            os._exit(0)
        try:
            while os.waitpid(-1, os.WNOHANG)[0] != 0:
                pass
        except ChildProcessError:
            pass
