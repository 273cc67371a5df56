"""Helpers for the shim's integration tests: real ``podshim`` processes, their cleanup, leak checks.

Every shim a test starts goes through a :class:`ShimLauncher` (the ``shims`` and ``shim``
fixtures), which always ends it: ShutdownSandbox while the shim answers, ``podshim delete``
otherwise, and SIGKILL through a pidfd for anything still alive. What each sandbox made is kept
as a :class:`Footprint`; ``host_untouched`` (session-scoped and autouse in every module that
imports it) fails the run if any of it is still on the host at the end.

Processes are named by pidfd, never by pid alone, so a reused pid is never signalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from shim.api.names import EVENTS_SERVICE, SANDBOX_SERVICE, TASK_SERVICE, TEMPLATE_SERVICE
from shim.api.paths import STATE_FILE, control_socket_path
from shim.kernel import linux
from shim.lib.files import read_json
from shim.lib.processes import process_alive
from shim.rpc import Client, RpcError, blocking

from support.proctools import fd_readable, pidfds, wait_pidfds
from support.rpctools import SLOWDOWN

__all__ = [
    "HANDLERS", "NODE_ROOT", "WAIT", "PODSHIM", "FOOTPRINTS", "Footprint", "ProcessRef", "Shim", "ShimLauncher", "EventStream",
    "ADOPTED_NAMES", "SessionTemplate", "Template", "adopting_orphans", "child_pids", "not_adopting",
    "reap_adopted_zombies", "host_netns_bound_at", "host_untouched", "leftovers",
    "mounts_naming", "new_id", "ns_inode", "run_podshim", "shim", "shims",
]

#: A bound on any one wait in these tests; never a sleep.
WAIT = 5.0 * SLOWDOWN
#: A task's ``rootfs`` that is the node's own ``/`` (without the mounts below it): what a test asks
#: for explicitly when its task runs the node's programs, with ``readonly_rootfs`` (a runtime's
#: bind of a read-only mount is writable). A task given no rootfs runs on an empty root of its own
#: (shim.runtime.mounts.OWN_ROOT).
NODE_ROOT = [{"type": "bind", "source": "/", "options": ["bind", "ro"]}]
#: How long a torn-down sandbox's processes get to exit (waited for on their pidfds).
EXIT_WAIT = 5.0
PODSHIM = (sys.executable, "-m", "shim")
#: The runtime handlers this machine has, for tests run once per handler: native, and runc and crun
#: where installed.
HANDLERS = ["native"] + [h for h in ("runc", "crun") if shutil.which(h, path="/usr/sbin:/usr/bin:/sbin:/bin")]

#: Every sandbox any test made in this session, filled in as each shim is torn down.
FOOTPRINTS: list[Footprint] = []


def new_id(prefix: str = "sb") -> str:
    """A fresh identifier: sandbox ids also name cgroups, which all sandboxes of a host share."""
    return f"{prefix}-{secrets.token_hex(5)}"


def ns_inode(pid: int | str, ns_type: str) -> int:
    """The inode of ``pid``'s namespace of ``ns_type`` ("self" for this process)."""
    return linux.ns_inode(f"/proc/{pid}/ns/{ns_type}")


def mounts_naming(text: str) -> list[str]:
    """Lines of /proc/mounts that contain ``text``."""
    with open("/proc/mounts") as f:
        return [line for line in f if text in line]


def child_pids() -> set[int]:
    """Pids whose parent is this process, zombies included."""
    stats = (linux.proc_stat(int(entry)) for entry in os.listdir("/proc") if entry.isdigit())
    return {int(stat[0]) for stat in stats if stat is not None and stat[linux.STAT_PPID - 1] == str(os.getpid())}


def spare_state_files(bundle: str) -> list[str]:
    """The temporary files of state.json in ``bundle`` (a shim keeps one between writes)."""
    return [name for name in os.listdir(bundle) if name.startswith(f".{STATE_FILE}.")]


def run_podshim(action: str, namespace: str, sandbox_id: str, bundle: str, runtime_root: str,
                *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``podshim ACTION`` to completion; stdout and stderr are captured as text."""
    argv = [*PODSHIM, action, "--namespace", namespace, "--id", sandbox_id, "--bundle", bundle,
            "--runtime-root", runtime_root, *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env)


@contextlib.contextmanager
def host_netns_bound_at(directory: str) -> Iterator[str]:
    """A file in ``directory`` with this process's own network namespace (the host's, which the
    shims share) bind-mounted on it, as ``ip netns`` pins one; unmounted and removed afterwards."""
    path = os.path.join(directory, "host-netns")
    with open(path, "x"):
        pass
    try:
        linux.mount("/proc/self/ns/net", path, None, linux.MS_BIND)
        try:
            yield path
        finally:
            linux.umount2(path, linux.MNT_DETACH)
    finally:
        os.unlink(path)


@contextlib.contextmanager
def _child_subreaper(on: bool) -> Iterator[None]:
    """This process a child subreaper (``on``) or not meanwhile; the flag restored afterwards."""
    was = linux.get_child_subreaper()
    linux.set_child_subreaper(on)
    try:
        yield
    finally:
        linux.set_child_subreaper(was)


def adopting_orphans() -> contextlib.AbstractContextManager[None]:
    """Make this process a child subreaper meanwhile: a shim that ``podshim start`` forks becomes
    our child when ``start`` exits, so its exit status can be read. Processes orphaned after
    the block go to PID 1 as usual."""
    return _child_subreaper(True)


def not_adopting() -> contextlib.AbstractContextManager[None]:
    """Clear this process's child subreaper flag meanwhile (a Reaper or :func:`adopting_orphans`
    may have set it): a detached process orphaned in the block (a template) goes to PID 1, and so
    does everything it double-forks later, never to this process, where nobody would reap it."""
    return _child_subreaper(False)


#: The names of the processes a template forks (itself, its spares, its shims): what this process
#: adopts while it is a child subreaper and a template, or an intermediate child of one, exits.
ADOPTED_NAMES = ("podshim-tmpl", "podshim-spare", "podshim-shim")


def reap_adopted_zombies() -> list[int]:
    """Reap this process's zombie children named in :data:`ADOPTED_NAMES` that no Popen of this
    process waits for (adopted ones, whose exit nobody here reads); their pids."""
    zombies = set()
    for pid in child_pids():
        stat = linux.proc_stat(pid)
        if stat is not None and stat[linux.STAT_STATE - 1] == "Z" and stat[1] in ADOPTED_NAMES:
            zombies.add(pid)
    if not zombies:
        return []
    import gc

    waited = {obj.pid for obj in gc.get_objects() if isinstance(obj, subprocess.Popen) and obj.returncode is None}
    reaped = []
    for pid in sorted(zombies - waited):
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:  # reaped meanwhile (a Reaper's waitpid(-1))
            continue
        reaped.append(pid)
    return reaped


class SessionTemplate:
    """One `podshim template` for the whole session, started on first use, stopped by pid.

    It is started with `podshim template --detach`, in a session of its own, and with this
    process's child subreaper flag cleared (:func:`not_adopting`), so that it is not a descendant
    of the test process: tests that make this process a child subreaper, or count its children,
    must never adopt the template or the shims it forks. A template leaves when the code it loaded
    changes on disk (an edit during the run): the next test that wants it gets a new one.
    """

    def __init__(self) -> None:
        self.root = f"/tmp/podshim-session-tpl-{secrets.token_hex(4)}"

    def socket(self) -> str:
        path = control_socket_path(self.root)
        try:
            blocking.call("unix://" + path, TEMPLATE_SERVICE, "Ping", timeout=2)
        except Exception:  # not started yet, or gone: --detach returns once one serves
            with not_adopting():
                subprocess.run([*PODSHIM, "template", "--detach", "--runtime-root", self.root],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True, timeout=60)
        return path

    def stop(self) -> None:
        from shim.launch.template import stop_template

        stop_template(self.root)
        shutil.rmtree(self.root, ignore_errors=True)


class ProcessRef:
    """One process, pinned by a pidfd: it can be waited for and signalled without pid-reuse races."""

    def __init__(self, pid: int):
        self.pid = pid
        self.fd = os.pidfd_open(pid)

    def has_exited(self) -> bool:
        """True once the process has terminated (a zombie or reaped)."""
        return bool(select.select([self.fd], [], [], 0)[0])

    async def exited(self, timeout: float = WAIT) -> None:
        """Return when the process has terminated; TimeoutError after ``timeout``."""
        await fd_readable(self.fd, timeout)

    def reap(self) -> int | None:
        """Reap the process if it is our terminated child and return its shell-style exit status
        (128 + signal when killed); None when it is not our child, still runs, or was reaped."""
        try:
            result = os.waitid(os.P_PIDFD, self.fd, os.WEXITED | os.WNOHANG)
        except ChildProcessError:
            return None
        if result is None:
            return None
        return result.si_status + (128 if result.si_code != os.CLD_EXITED else 0)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self.fd, sig)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass(frozen=True)
class Footprint:
    """What one sandbox put on the host: its processes, netns, cgroup directories and socket."""

    processes: tuple[tuple[int, int | None], ...]  # (pid, start time) of the shim and the pause
    netns_path: str | None  # only a netns the shim made itself
    cgroup_dirs: tuple[str, ...]
    socket_path: str | None

    @classmethod
    def named_by(cls, info: dict[str, str], socket_path: str) -> Footprint:
        """What a sandbox's verbose status says it made (processes aside)."""
        return cls(processes=(), netns_path=info["netns_path"] if info["netns_owned"] == "true" else None,
                   cgroup_dirs=tuple(path for key, path in info.items() if key.startswith("cgroup.")),
                   socket_path=socket_path)

    @classmethod
    def of_bundle(cls, bundle: str) -> Footprint | None:
        """What a sandbox made, as its shim recorded it in state.json; None without a record."""
        try:
            record = read_json(os.path.join(bundle, STATE_FILE))
        except FileNotFoundError:
            return None
        processes = [(record["shim_pid"], record.get("shim_start_time"))]
        if record.get("pause"):
            processes.append((record["pause"]["pid"], record["pause"].get("start_time")))
        return cls(
            processes=tuple(processes),
            netns_path=record.get("netns_path") if record.get("netns_owned") else None,
            cgroup_dirs=tuple((record.get("cgroup") or {}).get("paths", {}).values()),
            socket_path=record.get("socket_path"),
        )

    def remains(self) -> list[str]:
        """What is still on the host, processes aside: the netns (file or mount), cgroup
        directories, the socket."""
        found = []
        if self.netns_path and (os.path.lexists(self.netns_path) or mounts_naming(os.path.basename(self.netns_path))):
            found.append(f"netns {self.netns_path}")
        found += [f"cgroup {d}" for d in self.cgroup_dirs if os.path.isdir(d)]
        if self.socket_path and os.path.lexists(self.socket_path):
            found.append(f"socket {self.socket_path}")
        return found


def leftovers(footprints: list[Footprint], wait: float = EXIT_WAIT) -> list[str]:
    """What ``footprints`` left on the host: the recorded processes still running as themselves
    after ``wait`` seconds (a zombie has exited: an unreaped child of ours is ``child_pids``'
    business), and the rest of what they made."""
    with pidfds(process for fp in footprints for process in fp.processes) as fds:
        live = wait_pidfds(fds, wait)
    return [f"process {pid}" for pid in live] + [item for fp in footprints for item in fp.remains()]


class _Session:
    """Shared by every instance of host_untouched: each module importing it gets its own."""

    modules = 0  # instances set up and not yet ended
    children_before: set[int] = set()


@pytest.fixture(scope="session", autouse=True)
def host_untouched() -> Iterator[None]:
    """Fail the session if a process, netns, mount, cgroup or socket a shim made is still there,
    or this process has children it did not have before."""
    # The first instance records the host; the last to end (session fixtures end in reverse
    # order) checks it, so a leak is reported once.
    if not _Session.modules:
        _Session.children_before = child_pids()
    _Session.modules += 1
    yield
    _Session.modules -= 1
    if not _Session.modules:
        found = leftovers(FOOTPRINTS) + [f"child process {pid}" for pid in child_pids() - _Session.children_before]
        assert not found, f"the shim tests left behind: {found}"


class Shim:
    """A shim started by ``podshim start``, with a client connected to it."""

    def __init__(self, namespace: str, sandbox_id: str, bundle: str, runtime_root: str, bootstrap: dict[str, Any]):
        self.namespace = namespace
        self.sandbox_id = sandbox_id
        self.bundle = bundle
        self.runtime_root = runtime_root
        self.bootstrap = bootstrap
        self.address: str = bootstrap["address"]
        self.pid: int = bootstrap["pid"]
        self.process = ProcessRef(self.pid)
        self.client: Client | None = None
        self.extra_clients: list[Client] = []

    @property
    def socket_path(self) -> str:
        return self.address.removeprefix("unix://")

    async def connect(self, namespace: str | None = None) -> Client:
        """Another connection to the shim (in the shim's namespace unless told); closed by the launcher."""
        client = await Client.connect(self.address, namespace=namespace or self.namespace)
        self.extra_clients.append(client)
        return client

    async def call(self, method: str, client: Client | None = None, timeout: float | None = WAIT,
                   **fields: Any) -> Any:
        """Call a Sandbox method for this shim's sandbox (``sandbox_id`` filled in)."""
        caller = client or self.client
        assert caller is not None  # (connected)
        return await caller.call(SANDBOX_SERVICE, method, {"sandbox_id": self.sandbox_id, **fields},
                                                  timeout=timeout)

    async def task(self, method: str, timeout: float | None = WAIT, **fields: Any) -> Any:
        """Call a Task method for this shim's sandbox (``sandbox_id`` filled in). A Create that
        gives no ``rootfs`` gets :data:`NODE_ROOT`, read-only (``rootfs=[]``: the task's own empty root)."""
        if method == "Create" and "rootfs" not in fields:
            fields.update(rootfs=NODE_ROOT, readonly_rootfs=True)
        assert self.client is not None  # (connected)
        return await self.client.call(TASK_SERVICE, method, {"sandbox_id": self.sandbox_id, **fields}, timeout=timeout)

    async def run_sandbox(self, **create_fields: Any) -> int:
        """CreateSandbox then StartSandbox; returns the pause's pid."""
        await self.call("CreateSandbox", **create_fields)
        pid: int = (await self.call("StartSandbox"))["pid"]
        return pid

    async def info(self) -> dict[str, str]:
        """The verbose status ``info`` map."""
        info: dict[str, str] = (await self.call("SandboxStatus", verbose=True))["info"]
        return info

    async def footprint(self) -> Footprint:
        """What the sandbox's verbose status says it made (netns, cgroups) and the socket."""
        return Footprint.named_by(await self.info(), self.socket_path)

    def record(self) -> dict[str, Any]:
        """The shim's state.json."""
        record: dict[str, Any] = read_json(os.path.join(self.bundle, STATE_FILE))
        return record

    def delete(self) -> subprocess.CompletedProcess[str]:
        """Run ``podshim delete`` for this sandbox."""
        return run_podshim("delete", self.namespace, self.sandbox_id, self.bundle, self.runtime_root)


class ShimLauncher:
    """Starts shims for one test and, whatever the test did, ends them all and records their footprints."""

    def __init__(self) -> None:
        self.shims: list[Shim] = []
        self._dirs: list[str] = []

    def directories(self) -> tuple[str, str]:
        """A fresh (bundle, runtime root) pair, neither created yet; removed at teardown."""
        base = tempfile.mkdtemp(prefix="psh-")
        self._dirs.append(base)
        return os.path.join(base, "bundle"), os.path.join(base, "run")

    async def start(self, *, namespace: str = "it", sandbox_id: str | None = None, connect: bool = True,
                    extra: tuple[str, ...] = ()) -> Shim:
        """``podshim start`` a new shim in fresh directories; AssertionError if it fails."""
        bundle, runtime_root = self.directories()
        sandbox_id = sandbox_id or new_id()
        result = await asyncio.to_thread(run_podshim, "start", namespace, sandbox_id, bundle, runtime_root, *extra)
        assert result.returncode == 0, f"podshim start failed: {result.stderr}"
        shim = self.adopt(namespace, sandbox_id, bundle, runtime_root, json.loads(result.stdout))
        if connect:
            shim.client = await Client.connect(shim.address, namespace=namespace)
        return shim

    def adopt(self, namespace: str, sandbox_id: str, bundle: str, runtime_root: str, bootstrap: dict[str, Any]) -> Shim:
        """Take charge of a shim a test started itself."""
        shim = Shim(namespace, sandbox_id, bundle, runtime_root, bootstrap)
        self.shims.append(shim)
        return shim

    async def end(self, shim: Shim) -> list[str]:
        """End ``shim`` now: ShutdownSandbox while it answers, then `podshim delete` if anything is
        left, then SIGKILL; close its connections and pidfd and record its footprint. Returns what
        the shim had left on the host once it was ended the normal way (the delete cleaned it)."""
        self.shims.remove(shim)
        # ShutdownSandbox on a fresh connection: the test's own may be closed or broken.
        if not shim.process.has_exited():
            with contextlib.suppress(RpcError, OSError):
                async with await Client.connect(shim.address, namespace=shim.namespace) as client:
                    await client.call(SANDBOX_SERVICE, "ShutdownSandbox", {"sandbox_id": shim.sandbox_id},
                                      timeout=WAIT)
            with contextlib.suppress(TimeoutError):
                await shim.process.exited()
        for open_client in [shim.client, *shim.extra_clients]:
            if open_client is not None:
                await open_client.aclose()
        left: list[str] = []
        footprint = Footprint.of_bundle(shim.bundle)
        if footprint is not None:
            left = footprint.remains()
            left += [f"process {pid}" for pid, start in footprint.processes if process_alive(pid, start)]
            if left:
                await asyncio.to_thread(shim.delete)
        shim.process.kill()  # a shim that survived even `podshim delete`
        with contextlib.suppress(TimeoutError):
            await shim.process.exited()
        shim.process.reap()  # our child only when a test adopted it
        if footprint is not None:
            for pid, start in footprint.processes:
                if pid != shim.pid and linux.proc_start_time(pid) == start:
                    with contextlib.suppress(ProcessLookupError):
                        pinned = ProcessRef(pid)  # pinned, then checked again: a reused pid is never hit
                        if linux.proc_start_time(pid) == start:
                            pinned.kill()
                        pinned.close()
            FOOTPRINTS.append(footprint)
        shim.process.close()
        return left

    async def aclose(self) -> None:
        """End every shim still in charge, then remove the directories."""
        for shim in list(self.shims):
            await self.end(shim)
        for base in self._dirs:
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
async def shims() -> AsyncIterator[ShimLauncher]:
    """Start any number of shims; all are ended after the test."""
    launcher = ShimLauncher()
    try:
        yield launcher
    finally:
        await launcher.aclose()


@pytest.fixture
async def shim(shims: ShimLauncher) -> Shim:
    """A started shim (fresh bundle and runtime root) and a connected client: ``shim.address``, ``shim.client``."""
    return await shims.start()


class EventStream:
    """Events/Subscribe read in the background; ``await next(topic)`` waits for one event."""

    def __init__(self, client: Client):
        self._client = client
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._unclaimed: list[dict[str, Any]] = []
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, shim: Shim, client: Client) -> EventStream:
        """Subscribe on ``client`` and return once the shim has registered the subscription."""
        self = cls(client)
        self._task = asyncio.create_task(self._pump())
        # The pump task runs first and sends Subscribe; the shim starts handlers in the order
        # requests arrive, so once this Ping (same connection) is answered, we are subscribed.
        await asyncio.create_task(shim.call("PingSandbox", client=client))
        return self

    async def _pump(self) -> None:
        async for event in self._client.stream(EVENTS_SERVICE, "Subscribe", {}):
            self._queue.put_nowait(event)

    async def next(self, topic: str, timeout: float = WAIT) -> dict[str, Any]:
        """The first event with ``topic`` not yet returned, whatever came before or after it."""
        for event in self._unclaimed:
            if event["topic"] == topic:
                self._unclaimed.remove(event)
                return event
        async with asyncio.timeout(timeout):
            while (event := await self._queue.get())["topic"] != topic:
                self._unclaimed.append(event)
        return event

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RpcError):
                await self._task


class Template:
    """A `podshim template` process for one runtime root, stopped (by pid) at teardown."""

    def __init__(self, runtime_root: str):
        self.runtime_root = runtime_root
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([*PODSHIM, "template", "--runtime-root", self.runtime_root],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        path = control_socket_path(self.runtime_root)
        deadline = time.monotonic() + 15
        while True:  # the template offers no readiness pipe to a plain subprocess: ask it
            try:
                blocking.call("unix://" + path, TEMPLATE_SERVICE, "Ping", timeout=1)
                return
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    said = self.proc.stderr.read().decode() if self.proc.stderr is not None else ""
                    raise RuntimeError(f"template did not start: {said}") from None
                time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(10)
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
