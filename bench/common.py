"""Helpers shared by the benchmarks: percentiles, a process's memory, pidfd waits, the floor, and
leaving a CRI runtime as found (its pods removed before it stops, no network namespace of theirs
left behind).

The floor is the kernel's own cost of a pod sandbox without any runtime: ``unshare(1)`` makes the
namespaces and runs catatonit as their PID 1, we wait until catatonit handles SIGTERM, send it,
and wait for the exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from support.critools import Podshimd

__all__ = [
    "FLOOR_ARGV",
    "bench_podshimd",
    "busybox_tree",
    "compile_bytecode",
    "Memory",
    "children_of",
    "code_of",
    "floor_cgroup_cycle",
    "floor_cycle",
    "handles_signal",
    "memory",
    "not_root",
    "parent_of",
    "percentile",
    "podshimd_netns",
    "remove_cri_pods",
    "remove_netns",
    "signal_pid",
    "template_memory",
    "wait_pidfd",
]

FLOOR_ARGV = ("unshare", "--fork", "--pid", "--net", "--ipc", "--uts", "--mount", "--mount-proc", "catatonit", "-P")
#: How often the floor polls /proc for catatonit's readiness (the shim's own readiness poll).
READY_POLL = 0.0005
#: Task.Create's fields for a task on the node's own ``/``, read-only, as the benchmarks run theirs
#: (a task given no rootfs runs on an empty root of its own, where no program is).
NODE_ROOT = {"rootfs": [{"type": "bind", "source": "/", "options": ["bind", "ro"]}], "readonly_rootfs": True}


def not_root(reason: str) -> bool:
    """Whether this bench runs without root, which it needs because of ``reason``; if so, it says
    ``run as root: REASON`` on stderr, and the bench exits 2."""
    if os.geteuid() == 0:
        return False
    print(f"run as root: {reason}", file=sys.stderr)
    return True


def code_of(argv: Sequence[str], tree: str, repo: str) -> list[str]:
    """``argv``, podshim's command line as the Controller runs it
    (:func:`shim.lib.program.podshim_argv`, whose last item is the search path), with checkout
    ``tree`` in the place of ``repo`` on that path: the same command, running the code of ``tree``."""
    *command, path = argv
    return [*command, ":".join([tree, *(p for p in path.split(":") if p != repo)])]


def compile_bytecode(repo: str) -> None:
    """Write the bytecode of ``repo``'s packages, as an installer does: with PYTHONDONTWRITEBYTECODE
    set (a test harness may set it) and sources newer than their .pyc, every process would
    compile them again, tens of milliseconds that no installed podshim pays."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", *(os.path.join(repo, p) for p in ("shim", "client"))],
                   check=True, stdout=subprocess.DEVNULL)


def remove_cri_pods(crictl: str, endpoint: str) -> list[str]:
    """Stop and remove every pod of the CRI runtime at ``endpoint`` (``crictl rmp -fa``), as a bench
    does before it stops the runtime: a runtime stopped with pods left them (their netns, shims,
    CNI leases) behind. Returns the problems, as sentences: pods still listed afterwards."""
    base = [crictl, "--runtime-endpoint", endpoint, "--timeout", "60s"]
    done = subprocess.run([*base, "rmp", "-fa"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=600)
    listed = subprocess.run([*base, "pods", "-q"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=120)
    if done.returncode == 0 and listed.returncode == 0 and not listed.stdout.split():
        return []
    return [f"{endpoint}: crictl rmp -fa exited {done.returncode} ({done.stderr.strip()[-300:]}); pods left: "
            f"{' '.join(listed.stdout.split()) or '(crictl pods failed: ' + listed.stderr.strip()[-200:] + ')'}"]


def remove_netns(paths: Iterable[str]) -> list[str]:
    """Unmount and remove those of ``paths`` (network namespace files a runtime recorded as its
    own) that are still there; the ones removed. Never touches a path it was not given."""
    removed = []
    for path in sorted(set(paths)):
        if os.path.lexists(path):
            subprocess.run(["umount", "-l", path], stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            removed.append(path)
    return removed


def podshimd_netns(state_root: str) -> set[str]:
    """The network namespaces podshimd's pod records (``STATE_ROOT/pods/*.json``) name."""
    directory = os.path.join(state_root, "pods")
    found = set()
    for entry in os.listdir(directory) if os.path.isdir(directory) else ():
        if entry.endswith(".json") and not entry.startswith("."):
            try:
                with open(os.path.join(directory, entry)) as f:
                    path = json.load(f).get("netns_path")
            except (OSError, ValueError):
                continue
            if path:
                found.add(path)
    return found


@contextlib.contextmanager
def bench_podshimd(directory: str, crictl: str, problems: list[str], *, config: str = "", netns: str | None = None,
                   env: dict[str, str] | None = None, image: Any = None) -> Iterator[Podshimd]:
    """tests/critools.running_podshimd (the keyword arguments are its), which the bench must have on its path,
    with every pod removed (:func:`remove_cri_pods`) before podshimd stops; then the network
    namespaces its pod records named that are still there are removed. What went wrong is added to
    ``problems``, as sentences."""
    from support.critools import running_podshimd

    pods_netns: set[str] = set()
    with running_podshimd(directory, config=config, netns=netns, env=env, image=image) as daemon:
        try:
            yield daemon
        finally:
            pods_netns = podshimd_netns(daemon.state_root)
            problems += remove_cri_pods(crictl, daemon.endpoint)
    problems += [f"podshimd left the netns {path} of a removed pod (removed now)" for path in remove_netns(pods_netns)]


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, nearest rank."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n * q / 100), at least 1
    return ordered[min(len(ordered), int(rank)) - 1]


@dataclass(frozen=True)
class Memory:
    """A process's resident memory in KiB and its thread count."""

    rss: int
    pss: int
    threads: int


def memory(pid: int) -> Memory:
    """RSS and PSS from /proc/PID/smaps_rollup, threads from /proc/PID/status."""
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Rss", "Pss"):
                fields[key] = int(rest.split()[0])
    threads = int(_status(pid).get("Threads", "0"))
    return Memory(fields["Rss"], fields["Pss"], threads)


def template_memory(pid: int, runtime_root: str) -> Memory:
    """The fixed cost of a shim template: the template, its spare shims and their intermediate
    children (its only children), summed."""
    from shim.api.names import TEMPLATE_SERVICE
    from shim.api.paths import control_socket_path
    from shim.rpc import blocking

    pids = {pid, *children_of(pid)}
    try:
        ping = blocking.call("unix://" + control_socket_path(runtime_root), TEMPLATE_SERVICE, "Ping", timeout=2)
    except Exception:  # it is busy: count what we see
        ping = {}
    pids.update(pid for pid in ping.get("spare_pids", ()) if pid)
    total = Memory(0, 0, 0)
    for p in pids:
        try:
            m = memory(p)
        except OSError:
            continue
        total = Memory(total.rss + m.rss, total.pss + m.pss, total.threads + m.threads)
    return total


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return {key: value.strip() for key, _, value in (line.partition(":") for line in f)}


def parent_of(pid: int) -> int:
    """The parent pid of ``pid`` (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return 0
    return int(stat[stat.rfind(b")") + 2:].split()[1])


def children_of(pid: int) -> list[int]:
    """The children of ``pid``, from every thread's /proc/PID/task/TID/children."""
    found: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return found


def handles_signal(pid: int, sig: int, name: str | None = None) -> bool:
    """True once ``pid`` (running ``name``, when given) blocks or catches ``sig``.

    catatonit blocks every signal and reads them from a signalfd; until it does, a signal to
    PID 1 of a pid namespace with no handler is dropped.
    """
    try:
        status = _status(pid)
    except OSError:
        return False
    if name is not None and status.get("Name") != name:
        return False  # not exec'd yet: the mask may still be unshare's
    bit = 1 << (sig - 1)
    return bool((int(status["SigBlk"], 16) | int(status["SigCgt"], 16)) & bit)


def wait_pidfd(fd: int, timeout: float) -> bool:
    """Wait until the process behind pidfd ``fd`` has exited; False after ``timeout`` seconds."""
    return bool(select.select([fd], [], [], timeout)[0])


def signal_pid(pid: int, sig: int, still_ours: Callable[[int], bool] | None = None) -> bool:
    """Send ``sig`` to ``pid`` through a pidfd, after ``still_ours(pid)`` (if given) confirmed,
    on that pidfd, that the pid still names the process we mean. False when it is gone."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        if still_ours is not None and not still_ours(pid):
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def floor_cycle(argv: tuple[str, ...] = FLOOR_ARGV, timeout: float = 10.0,
                preexec: Callable[[], None] | None = None,
                spawn: Callable[[tuple[str, ...]], int] | None = None) -> tuple[float, float]:
    """One floor sandbox: (start until catatonit handles SIGTERM, SIGTERM until unshare exited),
    in seconds. ``preexec`` runs in the child before it execs unshare; ``spawn(argv)``, when
    given, starts unshare instead of subprocess and returns its pid (our child). Anything left
    is killed before returning."""
    name = os.path.basename(argv[-2])
    t0 = time.perf_counter()
    proc: Any = (_Child(spawn(argv)) if spawn is not None else
                 subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, preexec_fn=preexec))
    pause = 0
    try:
        deadline = time.monotonic() + timeout
        while not (pause and handles_signal(pause, signal.SIGTERM, name)):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{name} did not become ready under unshare")
            if not pause:
                kids = children_of(proc.pid)
                pause = kids[0] if kids else 0
            time.sleep(READY_POLL)
        t1 = time.perf_counter()
        signal_pid(pause, signal.SIGTERM, lambda p: parent_of(p) == proc.pid)
        proc.wait(timeout)
        return t1 - t0, time.perf_counter() - t1
    finally:
        if proc.poll() is None:
            if pause:
                signal_pid(pause, signal.SIGKILL, lambda p: parent_of(p) == proc.pid)
            proc.kill()
            proc.wait()


class _Child:
    """A child process started without subprocess: poll, wait and kill as Popen's."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(0.0005)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)


def _spawn_without_the_lock(cgroup: Any) -> Callable[[tuple[str, ...]], int]:
    """How podshim enters a sandbox cgroup (shim.kernel.cgroups.entry_files): the child is born
    in the v2 directory (clone3) and its one thread writes "0" to each v1 ``tasks`` file, then it
    execs; no cgroup.procs write, so no wait for the kernel's RCU grace period."""
    from shim.kernel import cgroups, linux

    def spawn(argv: tuple[str, ...]) -> int:
        tasks, v2_dirs = cgroups.entry_files(cgroup.procs_files())
        # A raw clone3 child must not meet a lock another thread held (linux.clone3): with
        # threads, fork and move the child into the v2 cgroup (the grace period, as runc).
        single = len(os.listdir("/proc/self/task")) == 1
        v2_fd = os.open(v2_dirs[0], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if v2_dirs else -1
        try:
            old = linux.block_all_signals()
            try:
                pid = linux.fork_into_cgroup(v2_fd) if v2_fd >= 0 and single else os.fork()
                if pid == 0:
                    try:
                        if v2_fd >= 0 and not single:
                            linux.write_file(os.path.join(v2_dirs[0], "cgroup.procs"), b"0")
                        for path in tasks:
                            linux.write_file(path, b"0")
                        null = os.open(os.devnull, os.O_RDWR)
                        for target in (0, 1, 2):
                            os.dup2(null, target)
                        # The bench's Python handlers (its janitor's) must not run in this copy.
                        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                            signal.signal(sig, signal.SIG_DFL)
                        linux.set_signal_mask(b"")
                        os.execvp(argv[0], list(argv))
                    finally:
                        os._exit(127)
            finally:
                linux.set_signal_mask(old)
        finally:
            if v2_fd >= 0:
                os.close(v2_fd)
        return pid

    return spawn


def floor_cgroup_cycle(parent: str, timeout: float = 10.0, *, lock_free: bool = False) -> tuple[float, float, float]:
    """The floor plus what every runtime adds for a sandbox's cgroup: a directory in every
    hierarchy (below ``parent``, relative to our own cgroup, which the caller keeps: see
    :func:`shim.kernel.cgroups.hold_parent`), the process put in it before it execs (unshare, and so
    catatonit after it), and the rmdir at the end. (start, stop, remove) in seconds; the cgroup is
    removed whatever happens. The process is moved in by cgroup.procs writes, as runc does, or
    with ``lock_free`` entered as podshim does (:func:`_spawn_without_the_lock`)."""
    import secrets

    from shim.kernel.cgroups import SandboxCgroup

    t0 = time.perf_counter()
    cgroup = SandboxCgroup.create(f"floor-{secrets.token_hex(4)}", parent)
    try:
        made = time.perf_counter() - t0
        if lock_free:
            start, stop = floor_cycle(timeout=timeout, spawn=_spawn_without_the_lock(cgroup))
        else:
            start, stop = floor_cycle(timeout=timeout, preexec=lambda: cgroup.join(0))  # 0: the child itself
    finally:
        t1 = time.perf_counter()
        cgroup.remove()
    return made + start, stop, time.perf_counter() - t1


def busybox_tree(path: str, *tools: str) -> str:
    """A small root at ``path``: /bin/busybox (static) with ``tools`` linked to it, empty /etc and /tmp."""
    for directory in ("bin", "etc", "tmp"):
        os.makedirs(f"{path}/{directory}")
    shutil.copy("/bin/busybox", f"{path}/bin/busybox")
    for tool in tools:
        os.symlink("busybox", f"{path}/bin/{tool}")
    return path


@contextlib.asynccontextmanager
async def running_sandbox(base: str, sandbox_id: str, *, namespace: str = "bench", timeout: float = 10.0,
                          options: dict[str, Any] | None = None) -> AsyncIterator[Callable[..., Awaitable[dict[str, Any]]]]:
    """A sandbox of its own (``podshim start`` with its bundle and runtime root under ``base``,
    created with ``options`` and started); yields ``call(service, method, **fields)``, a call to
    it. At the end it is shut down (or, if that fails, ``podshim delete``d) and ``base`` removed."""
    import sys

    from shim.api.names import SANDBOX_SERVICE
    from shim.rpc import Client

    argv = [sys.executable, "-m", "shim", "--namespace", namespace, "--id", sandbox_id,
            "--bundle", f"{base}/bundle", "--runtime-root", f"{base}/run"]
    try:
        started = subprocess.run(argv[:3] + ["start"] + argv[3:], capture_output=True, text=True, check=True)
        client = await Client.connect(json.loads(started.stdout)["address"], namespace=namespace)

        async def call(service: str, method: str, **fields: Any) -> dict[str, Any]:
            answer: dict[str, Any] = await client.call(service, method, {"sandbox_id": sandbox_id, **fields},
                                                       timeout=timeout)
            return answer

        try:
            await call(SANDBOX_SERVICE, "CreateSandbox", **({"options": options} if options else {}))
            await call(SANDBOX_SERVICE, "StartSandbox")
            yield call
        finally:
            try:
                await call(SANDBOX_SERVICE, "ShutdownSandbox")
            except Exception:
                subprocess.run(argv[:3] + ["delete"] + argv[3:], capture_output=True)
            await client.aclose()
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def task_cycle(call: Callable[..., Awaitable[dict[str, Any]]], task_id: str, **fields: Any) -> tuple[float, float]:
    """Create, Start, Kill (SIGKILL), Wait and Delete the task ``task_id`` (Create's ``fields``
    besides the id); (Create's, Start's) seconds."""
    from shim.api.names import TASK_SERVICE

    t0 = time.perf_counter()
    await call(TASK_SERVICE, "Create", task_id=task_id, **fields)
    t1 = time.perf_counter()
    await call(TASK_SERVICE, "Start", task_id=task_id)
    t2 = time.perf_counter()
    await call(TASK_SERVICE, "Kill", task_id=task_id, signal=9)
    await call(TASK_SERVICE, "Wait", task_id=task_id)
    await call(TASK_SERVICE, "Delete", task_id=task_id)
    return t1 - t0, t2 - t1


def run_stamp(load_before: tuple[float, float, float]) -> str:
    """When a bench ran and how loaded the machine was: the UTC time, the cores, and the load
    averages (1, 5, 15 min) given from its start and read now, at its end."""
    import datetime

    def loads(values: Sequence[float]) -> str:
        return " ".join(f"{x:.2f}" for x in values)

    return (f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} cores; load average "
            f"(1, 5, 15 min) {loads(load_before)} at the start, {loads(os.getloadavg())} at the end")
