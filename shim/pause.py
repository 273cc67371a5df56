"""Launching the pause task: the process that holds the sandbox's namespaces open.

The least work that gives the pause its namespaces, with no subprocess and no helper binary::

    shim --fork--> A: join cgroup, setns(netns), unshare(ipc, uts, mnt[, pid]), / rslave,
                      sethostname, sysctls, tmpfs on /dev/shm, then
                      --fork--> B (PID 1 of the new pid ns): mount /proc, oom_score_adj,
                                fds, stdio, signals, exec catatonit -P
                      A reports B's pid and exits 0

A is needed because unshare(CLONE_NEWPID) only moves the caller's *children* into the new pid
namespace (with pid_mode NODE there is none, and A becomes the pause itself). When A exits, B
is re-parented to the shim, a child subreaper, and the shim's :class:`~shim.reaper.Reaper`
reaps it. Both children report on one close-on-exec pipe: ``P<pid>`` (B's pid), ``R`` (the
builtin pause is ready), ``E<errno> <step>`` (the step that failed), ``W<errno> <step>`` (a
best-effort step that failed: lowering oom_score_adj). EOF means A has exited and B has exec'd
or is ready.

A pause that has not yet set up its signal handling loses a SIGTERM (PID 1 of a pid namespace
drops every signal it has no handler for), so :func:`launch` returns only once the pause
catches or blocks SIGTERM.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import fcntl
import gc
import logging
import os
import re
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NoReturn

from shim import linux
from shim.cgroups import SandboxCgroup
from shim.netns import open_netns
from shim.reaper import ExitInfo, Reaper
from shim.rpc.status import FailedPrecondition, Internal, InvalidArgument, RpcError

__all__ = [
    "BUILTIN",
    "CATATONIT",
    "NODE",
    "POD",
    "PauseProcess",
    "PauseSpec",
    "kill_pause",
    "launch",
    "validate_sysctls",
]

log = logging.getLogger(__name__)

POD = "POD"
NODE = "NODE"
CATATONIT = "/usr/bin/catatonit"
BUILTIN = "builtin"
DEFAULT_OOM_SCORE_ADJ = -998  # what CRI gives sandboxes
DEFAULT_SHM_SIZE_BYTES = 64 << 20

REPORT_TIMEOUT = 2.0  # seconds for A and B to report (their EOF) after the fork
READY_TIMEOUT = 2.0  # seconds for an exec'd pause to set up its SIGTERM handling
READY_POLL_INTERVAL = 0.0005
CLEANUP_TIMEOUT = 1.0  # seconds to wait for killed children after a failed launch
_MAX_REPORT_BYTES = 4096  # no more than PIPE_BUF, so each child's single write is atomic

_SIGTERM_BIT = 1 << (signal.SIGTERM - 1)
_BUILTIN_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGCHLD}
_SYSCTL_KEY = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)+")
_IPC_SYSCTL_PREFIXES = ("kernel.shm", "kernel.msg", "fs.mqueue.")


@dataclass(frozen=True)
class PauseSpec:
    """What the pause's namespaces look like. Defaults match containerd's sandbox defaults.

    ``netns_path`` None means host network, and then the host UTS namespace is kept too (as
    containerd does), so ``hostname`` is ignored. ``pause_binary``: None picks catatonit when
    installed, else the builtin Python pause; "builtin" forces it; a path names a binary that
    accepts catatonit's ``-P`` (pause mode). ``shm_size_bytes`` sizes the tmpfs on /dev/shm
    that a pod IPC namespace gets.
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


@dataclass(frozen=True)
class PauseProcess:
    """A running pause. ``(pid, start_time)`` names it across pid reuse (see :func:`kill_pause`).

    ``start_time`` is field 22 of /proc/PID/stat; ``created_at_ns`` the wall clock when it was
    ready; ``binary`` the program exec'd, or "builtin"; ``exit`` resolves when it is reaped.
    """

    pid: int
    start_time: int
    created_at_ns: int
    binary: str
    exit: asyncio.Future[ExitInfo] = field(compare=False, repr=False)


@dataclass(frozen=True)
class _Plan:
    """Everything the children need, computed (and validated) by the parent before the fork."""

    procs_files: list[str]
    netns_path: str | None
    netns_fd: int | None
    unshare_flags: int
    hostname: str | None
    sysctls: list[tuple[str, str, bytes]]  # key, /proc/sys path, value
    shm_options: str | None
    mount_proc: bool
    oom_score_adj: bytes | None
    binary: str
    max_fd: int


def validate_sysctls(sysctls: Mapping[str, str], *, host_network: bool, host_ipc: bool) -> None:
    """Accept only sysctls that are namespaced for this sandbox.

    ``net.*`` needs a pod network; ``kernel.shm*``, ``kernel.msg*``, ``kernel.sem`` and
    ``fs.mqueue.*`` need a pod IPC namespace. Anything else would be written to the host's own
    settings. Raises InvalidArgument with the reason.
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
        elif key == "kernel.sem" or key.startswith(_IPC_SYSCTL_PREFIXES):
            if host_ipc:
                raise InvalidArgument(
                    f"sysctl {key} cannot be set on a sandbox with host IPC: it would change the host's IPC limits"
                )
        else:
            raise InvalidArgument(
                f"sysctl {key} is not namespaced: applying it would change the host "
                "(allowed: net.*, kernel.shm*, kernel.msg*, kernel.sem, fs.mqueue.*)"
            )


async def launch(spec: PauseSpec, reaper: Reaper) -> PauseProcess:
    """Start the pause described by ``spec`` and return once it is ready for signals.

    ``reaper`` must be installed (it reaps the pause and makes the shim a subreaper). On any
    failure nothing is left behind: children are killed and reaped, and the error says which
    step failed and why. Raises InvalidArgument (bad spec, unknown sysctl), NotFound (netns
    missing), FailedPrecondition (reaper not installed, pause binary missing) or Internal.
    """
    if not reaper.installed:
        raise FailedPrecondition("the reaper must be installed before the pause is launched")
    plan = _plan(spec)
    netns_fd = open_netns(spec.netns_path) if spec.netns_path is not None else None
    try:
        plan = dataclasses.replace(plan, netns_fd=netns_fd)
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    except BaseException:
        if netns_fd is not None:
            os.close(netns_fd)
        raise
    try:
        # B closes every fd above 2 but this one after dup2-ing /dev/null onto 0-2, so it must
        # not be one of them (possible if the shim runs with stdio closed).
        if write_fd < 3:
            low_fd, write_fd = write_fd, fcntl.fcntl(write_fd, fcntl.F_DUPFD_CLOEXEC, 3)
            os.close(low_fd)
        pid_a = _fork(_child_a, plan, write_fd)
    except OSError as exc:
        os.close(read_fd)
        raise Internal(f"pause launch failed at fork: {exc.strerror}") from exc
    finally:
        os.close(write_fd)
        if netns_fd is not None:
            os.close(netns_fd)

    a_exit = reaper.watch(pid_a)
    reader = _ReportReader(read_fd)
    try:
        pause = await _start(plan, reaper, pid_a, a_exit, reader)
    except BaseException:
        # Shielded: a second cancellation must not leave a half-started pause behind.
        await asyncio.shield(_abandon(reaper, pid_a, a_exit, reader))
        raise
    reader.close()
    return pause


def kill_pause(pid: int, start_time: int, sig: int) -> bool:
    """Send ``sig`` to the pause ``(pid, start_time)`` if it is still that process and alive.

    Safe across pid reuse: the process is pinned with a pidfd before its start time is
    compared, so the signal cannot reach a newcomer. Returns whether the signal was sent.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    try:
        stat = linux.proc_stat(pid)
        if stat is None or int(stat[linux.STAT_STARTTIME - 1]) != start_time or stat[linux.STAT_STATE - 1] == "Z":
            return False
        signal.pidfd_send_signal(pidfd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(pidfd)


# -- the parent's side -----------------------------------------------------------------------


def _plan(spec: PauseSpec) -> _Plan:
    if spec.pid_mode not in (POD, NODE):
        raise InvalidArgument(f"pid_mode {spec.pid_mode!r} is not supported (POD or NODE)")
    if spec.ipc_mode not in (POD, NODE):
        raise InvalidArgument(f"ipc_mode {spec.ipc_mode!r} is not supported (POD or NODE)")
    host_network = spec.netns_path is None
    validate_sysctls(spec.sysctls, host_network=host_network, host_ipc=spec.ipc_mode == NODE)
    hostname = None if host_network else spec.hostname
    if hostname is not None and (not hostname or len(hostname.encode()) > 64 or "\0" in hostname):
        raise InvalidArgument(f"hostname {hostname!r} must be 1 to 64 bytes without NUL")
    if spec.oom_score_adj is not None and not -1000 <= spec.oom_score_adj <= 1000:
        raise InvalidArgument(f"oom_score_adj {spec.oom_score_adj} is outside -1000..1000")
    if spec.shm_size_bytes <= 0:
        raise InvalidArgument(f"shm_size_bytes must be positive, not {spec.shm_size_bytes}")

    flags = linux.CLONE_NEWNS
    if not host_network:
        flags |= linux.CLONE_NEWUTS
    if spec.ipc_mode == POD:
        flags |= linux.CLONE_NEWIPC
    if spec.pid_mode == POD:
        flags |= linux.CLONE_NEWPID
    return _Plan(
        procs_files=spec.cgroup.procs_files() if spec.cgroup is not None else [],
        netns_path=spec.netns_path,
        netns_fd=None,  # opened last, once the spec is known to be valid
        unshare_flags=flags,
        hostname=hostname,
        sysctls=[(k, "/proc/sys/" + k.replace(".", "/"), v.encode()) for k, v in spec.sysctls.items()],
        shm_options=f"mode=1777,size={spec.shm_size_bytes}" if spec.ipc_mode == POD else None,
        mount_proc=spec.pid_mode == POD,
        oom_score_adj=str(spec.oom_score_adj).encode() if spec.oom_score_adj is not None else None,
        binary=_resolve_binary(spec.pause_binary),
        max_fd=os.sysconf("SC_OPEN_MAX"),
    )


def _resolve_binary(pause_binary: str | None) -> str:
    if pause_binary is None:
        return CATATONIT if os.access(CATATONIT, os.X_OK) else BUILTIN
    if pause_binary == BUILTIN:
        return BUILTIN
    if not os.path.isabs(pause_binary):
        raise InvalidArgument(f"pause binary {pause_binary!r} must be an absolute path or 'builtin'")
    if not os.access(pause_binary, os.X_OK):
        raise FailedPrecondition(f"pause binary {pause_binary} does not exist or is not executable")
    return pause_binary


def _fork(child, plan: _Plan, write_fd: int) -> int:
    """fork(); the child runs ``child(plan, write_fd)``, which never returns."""
    # Every signal is blocked across the fork, and stays blocked in the children until exec:
    # a signal handled in a child would have the interpreter write to the wakeup fd it shares
    # with our event loop, and our loop would act on a SIGTERM or SIGCHLD that was never ours.
    old_mask = linux.block_all_signals()
    try:
        pid = os.fork()
        if pid == 0:
            child(plan, write_fd)
    finally:
        linux.set_signal_mask(old_mask)
    return pid


class _Report:
    """What the children wrote on the report pipe."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.ready = False
        self.error: tuple[int, str] | None = None
        self.warnings: list[tuple[int, str]] = []

    def parse(self, data: bytes) -> None:
        for record in data.split(b"\n"):
            kind, body = record[:1], record[1:].decode("utf-8", "replace")
            if kind == b"P" and body.isdigit():
                self.pid = int(body)
            elif kind == b"R":
                self.ready = True
            elif kind in (b"E", b"W"):
                number, _, step = body.partition(" ")
                failure = (int(number) if number.isdigit() else 0, step)
                if kind == b"W":
                    self.warnings.append(failure)
                elif self.error is None:
                    self.error = failure


class _ReportReader:
    """Reads the report pipe without blocking the loop; keeps what it read across calls."""

    def __init__(self, read_fd: int) -> None:
        os.set_blocking(read_fd, False)
        self._fd = read_fd
        self._data = bytearray()
        self.eof = False
        self.report = _Report()

    async def read_until_eof(self, timeout: float) -> None:
        """Read until both children closed their end (bounded by ``timeout``); parse into ``report``.

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
                    done.set_exception(Internal(f"reading the pause launcher's report failed: {exc.strerror}"))
                return
            self._data.extend(chunk)
            if not chunk:
                self.eof = True
            if (self.eof or len(self._data) > _MAX_REPORT_BYTES) and not done.done():
                done.set_result(None)

        loop.add_reader(self._fd, on_readable)
        try:
            await asyncio.wait_for(done, timeout)
        except TimeoutError:
            raise Internal(f"the pause launcher did not finish within {timeout} s") from None
        finally:
            loop.remove_reader(self._fd)
            self.report = _Report()
            self.report.parse(bytes(self._data))

    def close(self) -> None:
        os.close(self._fd)


async def _start(
    plan: _Plan, reaper: Reaper, pid_a: int, a_exit: asyncio.Future[ExitInfo], reader: _ReportReader
) -> PauseProcess:
    """The parent's side of a launch, from the fork until the pause is ready."""
    await reader.read_until_eof(REPORT_TIMEOUT)
    report = reader.report
    if report.error is not None:
        raise _launch_error(*report.error)
    for err, step in report.warnings:
        log.warning("pause %s: %s failed (%s); continuing without it", report.pid, step, os.strerror(err))
    if report.pid != pid_a:  # A forked the pause (a new pid namespace) and must exit 0
        a_info = await asyncio.wait_for(asyncio.shield(a_exit), REPORT_TIMEOUT)
        if report.pid is None or a_info.exit_status != 0:
            raise Internal(f"the pause launcher exited with status {a_info.exit_status} without starting the pause")
    b_exit = reaper.watch(report.pid)
    if plan.binary == BUILTIN:
        if not report.ready:
            raise Internal("the builtin pause closed its report pipe without becoming ready")
    else:
        await _wait_ready(report.pid, b_exit)
    start_time = linux.proc_start_time(report.pid)
    if start_time is None or b_exit.done():
        raise Internal("the pause exited right after it started")
    return PauseProcess(report.pid, start_time, time.time_ns(), plan.binary, b_exit)


async def _wait_ready(pid: int, exit_future: asyncio.Future[ExitInfo]) -> None:
    """Poll /proc/PID/status until the exec'd pause catches or blocks SIGTERM."""
    # catatonit blocks every signal and reads them from a signalfd (SigBlk); a classic pause
    # installs handlers (SigCgt). Either way SIGTERM is no longer dropped. The mask B set
    # before exec was empty, so a set bit is the new program's doing.
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if line.startswith(("State", "SigBlk", "SigCgt")))
        except FileNotFoundError:
            fields = {}
        if exit_future.done() or fields.get("State", " Z").split()[0] in ("Z", "X"):
            # The pause has exited (a zombie until the reaper runs): report its status.
            info = await asyncio.wait_for(asyncio.shield(exit_future), CLEANUP_TIMEOUT)
            raise Internal(f"the pause exited during start with status {info.exit_status}")
        if (int(fields["SigBlk"], 16) | int(fields["SigCgt"], 16)) & _SIGTERM_BIT:
            return
        if time.monotonic() >= deadline:
            raise Internal(f"the pause did not set up its SIGTERM handling within {READY_TIMEOUT} s")
        await asyncio.sleep(READY_POLL_INTERVAL)


def _launch_error(err: int, step: str) -> RpcError:
    reason = os.strerror(err) if err else "failed"
    if err == errno.ENOENT and step.startswith("writing sysctl "):
        return InvalidArgument(f"pause launch failed at {step}: no such sysctl in this kernel or namespace")
    return Internal(f"pause launch failed at {step}: {reason} (errno {err})")


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
    step = "starting the pause launcher"
    try:
        signal.set_wakeup_fd(-1)
        gc.disable()
        # The cgroup comes first so that every page the pause touches is charged to the
        # sandbox: v1 memory charges do not move with a task that changes cgroup later.
        own_pid = str(os.getpid()).encode()
        for procs in plan.procs_files:
            step = f"joining cgroup {procs}"
            linux.write_file(procs, own_pid)
        if plan.netns_fd is not None:
            step = f"setns({plan.netns_path})"
            linux.setns(plan.netns_fd, linux.CLONE_NEWNET)
        step = f"unshare({_flag_names(plan.unshare_flags)})"
        linux.unshare(plan.unshare_flags)
        # Slave, not private: umounts from the host must still reach this copy of the mount
        # table, or the pause would pin every netns bind mount that existed when it started.
        step = "making / a recursive slave mount"
        linux.mount(None, "/", None, linux.MS_SLAVE | linux.MS_REC)
        if plan.hostname is not None:
            step = f"sethostname({plan.hostname})"
            linux.sethostname(plan.hostname)
        for key, path, value in plan.sysctls:
            step = f"writing sysctl {key}"
            linux.write_file(path, value)
        if plan.shm_options is not None:
            step = "mounting a tmpfs on /dev/shm"
            flags = linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
            linux.mount("shm", "/dev/shm", "tmpfs", flags, plan.shm_options)
        if not plan.mount_proc:
            # No new pid namespace: A can become the pause itself; a second fork buys nothing.
            os.write(write_fd, b"P%d\n" % os.getpid())
            _child_b(plan, write_fd)
        step = "forking the pause"
        pid_b = os.fork()
        if pid_b == 0:
            _child_b(plan, write_fd)
        os.write(write_fd, b"P%d\n" % pid_b)
        os._exit(0)
    except BaseException as exc:
        _report_failure(write_fd, step, exc)
    finally:
        os._exit(1)


def _child_b(plan: _Plan, write_fd: int) -> NoReturn:
    step = "starting the pause"
    try:
        if plan.mount_proc:
            # A /proc that shows this pid namespace, so /proc/self is the pause itself.
            step = "mounting proc on /proc"
            linux.mount("proc", "/proc", "proc", linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC)
        if plan.oom_score_adj is not None:
            step = "writing /proc/self/oom_score_adj"
            try:
                linux.write_file("/proc/self/oom_score_adj", plan.oom_score_adj)
            except PermissionError as exc:
                # Lowering it below the shim's own needs CAP_SYS_RESOURCE, which some machines
                # (and rootless setups) drop. The pause still works; the parent warns.
                _report_failure(write_fd, step, exc, kind=b"W")
        step = "detaching the pause from the shim's session, fds and signals"
        os.setsid()
        os.chdir("/")
        null_fd = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null_fd, fd)
        os.closerange(3, write_fd)
        os.closerange(write_fd + 1, plan.max_fd)
        if plan.binary == BUILTIN:
            _builtin_pause(write_fd)
        # exec resets caught signals but keeps ignored ones (Python ignores SIGPIPE and SIGXFSZ,
        # and anything ignored when the shim started). The kernel's SigIgn has them all.
        for sig in _ignored_signals():
            signal.signal(sig, signal.SIG_DFL)
        linux.set_signal_mask(b"")
        step = f"exec {plan.binary}"
        os.execve(plan.binary, [plan.binary, "-P"], {})
    except BaseException as exc:
        _report_failure(write_fd, step, exc)
    finally:
        os._exit(127)


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


def _ignored_signals() -> list[int]:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("SigIgn:"):
                mask = int(line.split()[1], 16)
                return [sig for sig in range(1, mask.bit_length() + 1) if mask >> (sig - 1) & 1]
    return []


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
)


def _flag_names(flags: int) -> str:
    return "|".join(name for bit, name in _FLAG_NAMES if flags & bit)
