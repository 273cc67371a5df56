"""The Controller: containerd's sandbox.Controller for podshim shims.

It spawns one shim per sandbox, keeps a connection to each in an :class:`~client.nsmap.NSMap`,
and reconnects to all of them after a restart. The state it needs survives in bundle
directories, ``<state_root>/<namespace>/<sandbox_id>/`` (the shim's bootstrap.json and
state.json); nothing else is persisted.

    async with Controller(state_root, runtime_root) as c:     # loads every bundle
        await c.create("default", "sb1", options={"hostname": "web"})
        instance = await c.start("default", "sb1")
        ...
        await c.shutdown("default", "sb1")

Errors are the typed exceptions of :mod:`shim.rpc.status` (NotFound, AlreadyExists,
InvalidArgument, Unavailable, ...). Operations that change one sandbox are serialised; different
sandboxes are fully concurrent. Closing the controller closes connections and never stops a shim.

A shim is dead only when its process is gone (its pid and start time, from bootstrap.json or
state.json), never because it is slow or busy: one that runs but does not answer (stopped,
overloaded, its connection limit reached) is *unreachable*. Calls on it fail with UNAVAILABLE or
DEADLINE_EXCEEDED and a sentence, it is left alone, and the next call reconnects once it answers.
Only a gone process leads to ``podshim delete`` (or an explicit :meth:`Controller.shutdown`).

The Controller removes only bundles it can prove a Controller made (:func:`client.bundles.made_here`);
any other directory under its root is left alone, logged and listed in :attr:`Controller.unknown`.
It refuses a root marked as another layout, podshimd's state root (docs/roots.md). A read-only
Controller (``read_only=True``, podshimctl's verbs that only look) changes nothing at all: it
reports a dead shim's sandbox as stopped and leaves the cleanup to one that is not.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any, Mapping, Sequence

import anyio

from shim.rpc.api import SANDBOX_SERVICE
from shim.rpc.client import Client
from shim.rpc.identifiers import validate_identifier
from shim.rpc.processes import pidfd_exited, process_exiting
from shim.rpc.status import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    RpcError,
    Unavailable,
    error_from_oserror,
)

from client import layouts
from client.bundles import (
    ShimProcess,
    bundle_path,
    made_here,
    make_bundle,
    read_bootstrap,
    read_shim_process,
    remove_bundle,
    scan,
)
from client.defaults import (
    CALL_TIMEOUT,
    CONNECT_TIMEOUT,
    CREATE_TIMEOUT,
    DEFAULT_RUNTIME_ROOT,
    DEFAULT_BUNDLE_ROOT,
    DEFAULT_STOP_GRACE,
    DISCARD_TIMEOUT,
    EXIT_GRACE,
    LOAD_TIMEOUT,
    SHUTDOWN_TIMEOUT,
    START_TIMEOUT,
    STOP_MARGIN,
)
from client.handle import ENDED, Phase, ShimHandle
from client.nsmap import NSMap
from client.phases import phase
from client.results import (
    UNKNOWN_EXIT_STATUS,
    ControllerInstance,
    ControllerStatus,
    ExitStatus,
    Platform,
    SandboxState,
)
from client.spawners import ExecSpawner, Spawner, template_wanted
from client.systemd import SystemdSpawner

__all__ = ["Controller", "DEFAULT_BUNDLE_ROOT"]

log = logging.getLogger(__name__)


class Controller:
    """Spawns, tracks and reconnects podshim shims.

    ``state_root`` holds the bundles; ``runtime_root`` the shim sockets (``<root>/s``).
    ``spawner`` is ``"exec"`` (detached shims, :class:`ExecSpawner`), ``"systemd"`` (one
    ``podshim@`` unit per shim, :class:`~client.systemd.SystemdSpawner`) or a :class:`Spawner`.
    ``template`` (exec only; default $PODSHIM_TEMPLATE, else True): fork shims from the runtime
    root's shim template, started when none answers and left running for every later Controller
    and podshimctl on that root (``podshim template``); False execs every shim (``podshim start``).

    ``read_only``: never change anything (no cleanup after a dead shim, no leftover removed);
    create, start, stop and shutdown are refused.

    Use ``async with Controller(...) as c`` (loads every bundle), or ``await c.load(...)`` and
    ``await c.aclose()`` from the same task: the controller owns a task group (it judges lost
    connections and cleans up after shims that die) that lives from the first load to aclose.
    """

    def __init__(self, state_root: str = DEFAULT_BUNDLE_ROOT, runtime_root: str = DEFAULT_RUNTIME_ROOT,
                 spawner: str | Spawner = "exec", *, template: bool | None = None, read_only: bool = False):
        for name, path in (("state root", state_root), ("runtime root", runtime_root)):
            if not os.path.isabs(path):
                raise InvalidArgument(f"{name} {path!r} must be an absolute path")
        self.state_root = os.path.normpath(state_root)
        self.runtime_root = os.path.normpath(runtime_root)
        if template and spawner != "exec":
            raise InvalidArgument(f"template={template!r} applies to the exec spawner only, not to {spawner!r}")
        if spawner == "exec":
            spawner = ExecSpawner(runtime_root=self.runtime_root, use_template=template_wanted(template))
        elif spawner == "systemd":
            spawner = SystemdSpawner(self.state_root, self.runtime_root)
        elif not isinstance(spawner, Spawner):
            raise InvalidArgument(f"spawner must be 'exec', 'systemd' or a Spawner, not {spawner!r}")
        self.spawner: Spawner = spawner
        self.read_only = read_only
        self.sandboxes: NSMap[ShimHandle] = NSMap()
        #: Directories under the root that look like bundles but that nothing proves a Controller
        #: made: path -> why they are left alone. Never loaded, never removed.
        self.unknown: dict[str, str] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._losses: Any = None  # the send side of the lost-connection queue, once open
        self._closed = False

    # -- opening, loading, closing --------------------------------------------------------
    async def __aenter__(self) -> "Controller":
        try:
            await self.load()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _open(self) -> None:
        if self._closed:
            raise Unavailable("the controller is closed")
        if self._tg is not None:
            return
        layouts.check(self.state_root, layouts.BUNDLE_ROOT)
        if not self.read_only:
            await self.spawner.open()
        self._losses, losses = anyio.create_memory_object_stream[tuple[ShimHandle, Client]](math.inf)
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        tg.start_soon(self._judge_losses, losses)

    async def load(self, namespace: str | None = None, sandbox_id: str | None = None) -> None:
        """Open the controller (first call) and reconnect to the shims of the state root: every
        bundle, one namespace's, or one sandbox's (``podshimctl`` loads only what it needs).

        Bundles already known are skipped, so calling it again is cheap. Shims are reconnected
        concurrently, each within LOAD_TIMEOUT: a shim whose sandbox exists is back in the map; a
        shim that never got CreateSandbox (we crashed in between) is shut down and forgotten; a
        shim whose process is gone (or whose bundle names none that answers) is cleaned up with
        ``podshim delete`` and kept as a tombstone (state "stopped" with the exit status delete
        found, 255 if unknown) until :meth:`shutdown`. A shim whose process runs but does not
        answer in time is kept, unreachable, and left alone. A bundle another process is
        changing right now is skipped.

        A directory that nothing proves a Controller made is left alone: logged at WARNING and
        kept in :attr:`unknown`, never loaded.

        Raises InvalidArgument for bad identifiers (``sandbox_id`` needs ``namespace``),
        FailedPrecondition when the root is marked as another layout (podshimd's state root),
        the OS error's status when the state root cannot be read.
        """
        await self._open()
        if sandbox_id is not None:
            if namespace is None:
                raise InvalidArgument("load: a sandbox id needs its namespace")
            path = bundle_path(self.state_root, namespace, sandbox_id)
            found = [(namespace, sandbox_id, path)] if os.path.isdir(path) else []
        else:
            try:
                found = scan(self.state_root, namespace, clean=not self.read_only)
            except OSError as exc:
                raise error_from_oserror(exc, f"cannot read state root {self.state_root}") from None
        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            for ns, sid, path in found:
                if self.sandboxes.find(ns, sid) is not None:
                    continue
                if not made_here(path):
                    self._leave_unknown(path)
                    continue
                handle = ShimHandle(ns, sid, path)
                self.sandboxes.add(ns, sid, handle)
                tg.start_soon(self._load_one, handle)
        if found:
            log.debug("loaded %d bundle(s) from %s in %.3fs", len(found), self.state_root, time.monotonic() - started)

    def _leave_unknown(self, path: str) -> None:
        why = (f"no {layouts.MARKER} of a bundle and no bootstrap.json of a podshim shim: nothing says a "
               "Controller made it")
        if path not in self.unknown:
            log.warning("leaving %s alone, unknown: %s (is %s really a bundle root?)", path, why, self.state_root)
        self.unknown[path] = why

    async def aclose(self) -> None:
        """Close every connection; shims keep running (a new controller reconnects to them).
        Waits for dead-shim cleanups already under way. Idempotent."""
        if self._closed:
            return
        self._closed = True
        handles = self.sandboxes.list()
        for handle in handles:
            handle.closing = True  # before any await: these closes are not deaths
            handle.stop_watching()
        async with anyio.create_task_group() as tg:
            for handle in handles:
                if handle.client is not None:
                    tg.start_soon(handle.client.aclose)
        if self._tg is not None:
            self._losses.close()
            tg, self._tg = self._tg, None
            await tg.__aexit__(None, None, None)

    # -- the Controller API ---------------------------------------------------------------
    async def create(self, namespace: str, sandbox_id: str, *, options: Mapping[str, Any] | None = None,
                     netns_path: str | None = None, rootfs: Sequence[Any] | None = None,
                     annotations: Mapping[str, str] | None = None) -> None:
        """Make the bundle, spawn a shim and send it CreateSandbox.

        ``options`` is a PodSandboxConfig map (protocol.md 7.4); ``netns_path`` an existing
        network namespace to join (else the shim makes one); ``rootfs`` mounts (the native
        shim accepts none). On any failure, and on cancellation, everything made so far is
        undone: the shim is shut down and deleted, the bundle removed, the id freed.

        Raises AlreadyExists (also when two tasks race for one id), InvalidArgument, the
        spawner's errors (Unavailable, DeadlineExceeded, Internal) and the shim's.
        """
        path = bundle_path(self.state_root, namespace, sandbox_id)
        payload = _create_payload(sandbox_id, path, options, netns_path, rootfs, annotations)
        self._check_open(changes="create a sandbox")
        handle = ShimHandle(namespace, sandbox_id, path)
        self.sandboxes.add(namespace, sandbox_id, handle)  # the reservation: AlreadyExists on a race
        try:
            try:
                make_bundle(self.state_root, namespace, sandbox_id, lock=handle.bundle_lock)
            except OSError as exc:
                raise error_from_oserror(exc, f"cannot make bundle {path}") from None
        except BaseException:
            self._forget(handle)
            raise
        with handle.hold_bundle() as held:
            try:
                if not held:
                    raise Unavailable(f"bundle {path} was removed by another process while being made")
                with phase("spawn"):
                    boot = await self.spawner.spawn(namespace, sandbox_id, path)
                handle.address, handle.version = boot.address, boot.version
                with phase("connect"):
                    client = await Client.connect(boot.address, namespace=namespace, timeout=CONNECT_TIMEOUT)
                self._attach(handle, client)
                with phase("CreateSandbox"):
                    await client.call(SANDBOX_SERVICE, "CreateSandbox", payload, timeout=CREATE_TIMEOUT)
                handle.state = SandboxState.CREATED
                handle.created_at = time.time_ns()
                handle.confirmed = True
                # A spawn that answered without the shim's pid and start time (a socket-activated
                # shim starts only with our connection) is completed from the bootstrap it wrote since.
                if not (boot.pid > 0 and boot.start_time is not None):
                    boot = _quietly(read_bootstrap, path) or boot
                handle.process = read_shim_process(path, boot)
                self._go_live(handle)
            except BaseException as exc:
                log.warning("create %s/%s failed (%s); undoing it", namespace, sandbox_id, _describe(exc))
                await self._discard(handle)
                raise

    async def start(self, namespace: str, sandbox_id: str) -> ControllerInstance:
        """StartSandbox: launch the pause. Raises NotFound, FailedPrecondition (already
        running, stopped, or the shim died), Unavailable (the shim went away meanwhile)."""
        handle = await self._handle(namespace, sandbox_id, changes="start a sandbox")
        async with handle.lock:
            reply = await self._call(handle, "StartSandbox", {"sandbox_id": sandbox_id}, START_TIMEOUT,
                                     idempotent=False)
            if reply is None:
                raise FailedPrecondition(f"cannot start sandbox {sandbox_id}: it has exited and its shim is gone; "
                                         "shut it down")
            handle.pid, handle.created_at, handle.state = reply.get("pid", 0), reply.get("created_at", 0), SandboxState.RUNNING
            return ControllerInstance(sandbox_id, handle.pid, handle.created_at, handle.address, handle.version, {})

    async def platform(self, namespace: str, sandbox_id: str) -> Platform:
        """The sandbox's OCI platform. Raises NotFound, FailedPrecondition when its shim died."""
        handle, reply = await self._read(namespace, sandbox_id, "Platform", {}, CALL_TIMEOUT)
        if reply is None:
            raise FailedPrecondition(f"sandbox {sandbox_id} has exited; its platform is not known any more")
        p = reply.get("platform") or {}
        return Platform(p.get("os", ""), p.get("architecture", ""), p.get("variant", ""))

    async def stop(self, namespace: str, sandbox_id: str, timeout: float | None = None) -> None:
        """StopSandbox: SIGTERM, then SIGKILL after ``timeout`` seconds (None: the shim's
        default of 10 s; 0: at once); returns once the pause exited.

        Stopping an unknown sandbox, a stopped one or one whose shim is dead succeeds, as in
        containerd (containerd#9611). Raises InvalidArgument for a negative timeout, Unavailable
        or DeadlineExceeded when the shim runs but does not answer (nothing was stopped).
        """
        validate_identifier("namespace", namespace)
        validate_identifier("sandbox id", sandbox_id)
        payload: dict[str, Any] = {"sandbox_id": sandbox_id}
        grace = DEFAULT_STOP_GRACE
        if timeout is not None:
            if timeout < 0 or math.isnan(timeout):
                raise InvalidArgument(f"stop timeout must be zero or more seconds, not {timeout}")
            payload["timeout_secs"] = grace = math.ceil(timeout)
        self._check_open(changes="stop a sandbox")
        handle = self.sandboxes.find(namespace, sandbox_id)
        if handle is None:
            return
        await handle.settled.wait()
        async with handle.lock:
            if handle.phase not in (Phase.LIVE, Phase.UNREACHABLE):
                return
            try:
                if await self._call(handle, "StopSandbox", payload, grace + STOP_MARGIN) is None:
                    log.debug("stop %s/%s: its shim is gone; nothing to stop", namespace, sandbox_id)
            except NotFound:
                if handle.phase is not Phase.GONE:
                    raise  # the shim answered: it does not know the sandbox

    async def wait(self, namespace: str, sandbox_id: str) -> ExitStatus:
        """Block until the sandbox's pause exits; its exit status. When the shim dies, the
        status ``podshim delete`` found (255 if unknown). Raises NotFound, Unavailable when the
        controller closes or the sandbox is shut down meanwhile."""
        handle, reply = await self._read(namespace, sandbox_id, "WaitSandbox", {}, None)
        if reply is None:
            assert handle.exit is not None
            return handle.exit
        return ExitStatus(reply.get("exit_status", 0), reply.get("exited_at", 0))

    async def status(self, namespace: str, sandbox_id: str, verbose: bool = False) -> ControllerStatus:
        """SandboxStatus, plus the shim's address and version. ``verbose`` fills ``info``
        (bundle, socket, shim pid, netns path, cgroups, namespaces). A sandbox whose shim died
        is "stopped" with the exit status of its cleanup. Raises NotFound."""
        handle, reply = await self._read(namespace, sandbox_id, "SandboxStatus", {"verbose": bool(verbose)},
                                         CALL_TIMEOUT)
        if reply is None:
            return handle.cached_status()
        handle.remember(reply)
        return _status(handle, reply)

    async def shutdown(self, namespace: str, sandbox_id: str) -> None:
        """ShutdownSandbox: stop the pause, remove everything, let the shim exit; then forget
        the sandbox. When the shim does not go away cleanly (it is dead, hung, or does not
        answer), ``podshim delete`` finishes the job. A tombstone is simply forgotten.

        Returns once the shim closed its connection: the pause, network namespace, cgroups,
        socket and bundle are gone by then; the shim's process may still be exiting (the kernel
        takes a millisecond or two to tear down its memory), as a containerd shim may.

        Runs to the end even if cancelled (bounded by the named timeouts). Raises NotFound for
        an unknown sandbox (so a second shutdown of the same id is NotFound), Unavailable when
        another process is changing the sandbox.
        """
        handle = await self._handle(namespace, sandbox_id, changes="shut a sandbox down")
        async with handle.lock:
            if handle.phase is Phase.GONE:
                raise NotFound(f"sandbox {sandbox_id} not found in namespace {namespace}")
            with handle.hold_bundle() as held, anyio.CancelScope(shield=True):
                if not held and os.path.isdir(handle.bundle):
                    raise Unavailable(f"sandbox {sandbox_id} is being changed by another process; try again")
                if handle.phase is Phase.UNREACHABLE:
                    try:
                        await self._revive(handle, SHUTDOWN_TIMEOUT)
                    except RpcError as exc:
                        # Asked to go, and still not answering: `podshim delete` ends it.
                        log.warning("shutdown %s/%s: %s; deleting it", namespace, sandbox_id, exc.message)
                if handle.phase is Phase.GONE:
                    return  # its shim never got CreateSandbox: reviving it shut it down
                if handle.phase is Phase.LIVE:
                    handle.closing = True
                    if not await self._shutdown_shim(handle, SHUTDOWN_TIMEOUT):
                        await self._bury(handle)
                elif handle.phase is Phase.UNREACHABLE:
                    handle.closing = True
                    await self._bury(handle)
                else:
                    await handle.dead.wait()  # a cleanup under way ends first (set already when DEAD)
                await self._release(handle)

    async def metrics(self, namespace: str, sandbox_id: str, details: bool = False) -> dict[str, Any]:
        """SandboxMetrics: ``{timestamp, sandbox_id, data: {cpu_usage_ns, memory_usage_bytes,
        memory_limit_bytes, pids_current, unavailable}}`` (with ``details``, also ``data.details``:
        protocol.md). Raises NotFound, FailedPrecondition when the shim died."""
        handle, reply = await self._read(namespace, sandbox_id, "SandboxMetrics", {"details": True} if details else {},
                                         CALL_TIMEOUT)
        if reply is None:
            raise FailedPrecondition(f"sandbox {sandbox_id} has exited; it has no metrics")
        return dict(reply.get("metrics") or {})

    async def update(self, namespace: str, sandbox_id: str, resources: Mapping[str, Any]) -> None:
        """UpdateSandbox: write ``resources`` (Task Update's keys but oom_score_adj) to the sandbox's
        cgroup. Raises InvalidArgument naming a key that cannot be applied (nothing changed),
        NotFound, FailedPrecondition when it is not running or its shim died."""
        self._check_open(changes="update a sandbox")
        _, reply = await self._read(namespace, sandbox_id, "UpdateSandbox", {"resources": dict(resources)},
                                    CALL_TIMEOUT)
        if reply is None:
            raise FailedPrecondition(f"sandbox {sandbox_id} has exited; its resources cannot be updated")

    async def list(self, namespace: str | None = None) -> list[ControllerStatus]:
        """The status of every sandbox (of one namespace, or all), sorted by namespace and id.

        Live shims are asked concurrently, each within CALL_TIMEOUT; one that does not answer
        is listed with what was last known. Sandboxes still being created are not listed.
        """
        if namespace is not None:
            validate_identifier("namespace", namespace)
        self._check_open()
        handles = [h for h in self.sandboxes.list(namespace) if h.phase is not Phase.PENDING]
        results: list[ControllerStatus | None] = [None] * len(handles)

        async def one(i: int, handle: ShimHandle) -> None:
            try:
                _, reply = await self._read(handle.namespace, handle.sandbox_id, "SandboxStatus", {}, CALL_TIMEOUT)
            except NotFound:
                return  # shut down meanwhile
            except RpcError as exc:
                log.debug("list: %s/%s did not answer (%s)", handle.namespace, handle.sandbox_id, exc)
                reply = None
            if reply is not None:
                handle.remember(reply)
            results[i] = handle.cached_status() if reply is None else _status(handle, reply)

        async with anyio.create_task_group() as tg:
            for i, handle in enumerate(handles):
                tg.start_soon(one, i, handle)
        return [r for r in results if r is not None]

    def client_for(self, namespace: str, sandbox_id: str) -> Client:
        """The connection to the sandbox's shim (for its Task service). Do not close it.

        Raises NotFound, Unavailable while the sandbox is being created, when its shim is gone,
        and when it runs but does not answer (any other Controller call tries it again).
        """
        validate_identifier("namespace", namespace)
        validate_identifier("sandbox id", sandbox_id)
        handle = self.sandboxes.get(namespace, sandbox_id)
        if handle.phase is Phase.PENDING:
            raise Unavailable(f"sandbox {sandbox_id} is still being created")
        if handle.phase is Phase.UNREACHABLE:
            raise Unavailable(_unreachable(handle))
        if handle.phase is not Phase.LIVE or handle.client is None:
            raise Unavailable(f"the shim of sandbox {sandbox_id} is gone")
        if handle.client.closed:
            raise Unavailable(f"the connection to the shim of sandbox {sandbox_id} was lost; the next Controller call "
                              "tells whether it runs and reconnects")
        return handle.client

    # -- internals ------------------------------------------------------------------------
    def _check_open(self, changes: str = "") -> None:
        """Raise when the controller is not open, or (``changes``: what the caller would do) is
        read-only."""
        if self._closed:
            raise Unavailable("the controller is closed")
        if self._tg is None:
            raise FailedPrecondition("the controller is not open: use `async with Controller(...)` or load()")
        if changes and self.read_only:
            raise FailedPrecondition(f"this Controller was opened read-only: it cannot {changes}")

    async def _handle(self, namespace: str, sandbox_id: str, changes: str = "") -> ShimHandle:
        validate_identifier("namespace", namespace)
        validate_identifier("sandbox id", sandbox_id)
        self._check_open(changes)
        handle = self.sandboxes.get(namespace, sandbox_id)
        await handle.settled.wait()
        if handle.phase is Phase.GONE:
            raise NotFound(f"sandbox {sandbox_id} not found in namespace {namespace}")
        return handle

    async def _read(self, namespace: str, sandbox_id: str, method: str, extra: dict[str, Any],
                    timeout: float | None) -> tuple[ShimHandle, dict[str, Any] | None]:
        """Call a method that only reads; ``(handle, reply)``, with reply None when the shim
        turned out to be dead (the handle is then a tombstone)."""
        handle = await self._handle(namespace, sandbox_id)
        reply = await self._call(handle, method, {"sandbox_id": sandbox_id, **extra}, timeout)
        if reply is not None:
            return handle, reply
        await handle.dead.wait()
        if handle.exit is None:  # shut down meanwhile, not dead
            raise NotFound(f"sandbox {sandbox_id} not found in namespace {namespace}")
        return handle, None

    async def _call(self, handle: ShimHandle, method: str, payload: dict[str, Any], timeout: float | None, *,
                    idempotent: bool = True) -> dict[str, Any] | None:
        """One call to the sandbox's shim, reconnecting first when it did not answer before.

        When the connection is lost under the call while the shim's process lives (the shim
        closed it as its idlest to make room, or drops it on its way out), an ``idempotent``
        call is made once more on a new connection; another is not, since the shim may have
        done it.

        Returns None when the shim's process turned out to be gone (the handle is then DYING or
        DEAD). Raises NotFound when the sandbox was shut down, Unavailable or DeadlineExceeded
        (with a sentence) when the shim runs but does not answer; it is then left alone.
        """
        for attempt in (1, 2):
            lost = handle.client
            if handle.phase is Phase.LIVE and lost is not None and lost.closed and not handle.closing:
                # Dropped while idle: judge it now rather than fail a call never sent.
                await self._judge_loss(handle, lost)
            if handle.phase is Phase.UNREACHABLE:
                await self._revive(handle, timeout)
            if handle.phase is Phase.GONE:
                raise NotFound(f"sandbox {handle.sandbox_id} not found in namespace {handle.namespace}")
            if handle.phase is not Phase.LIVE:
                return None
            client = handle.client
            assert client is not None
            try:
                return await client.call(SANDBOX_SERVICE, method, payload, timeout=timeout)
            except DeadlineExceeded as exc:
                within = f" within {timeout:g}s" if timeout is not None else ""
                raise DeadlineExceeded(f"the shim of sandbox {handle.sandbox_id} in namespace {handle.namespace} "
                                       f"({handle.process or 'pid unknown'}) did not answer {method}{within} "
                                       f"({exc.message}); it is left running") from None
            except Unavailable:
                if not client.closed:
                    raise  # the shim itself answered UNAVAILABLE
                if handle.closing:
                    if handle.phase in ENDED:
                        return None
                    raise  # we closed it (shutdown, controller closing)
                await self._judge_loss(handle, client)
                if handle.phase in ENDED:
                    return None  # its process is gone
                if handle.phase is Phase.GONE:
                    raise NotFound(f"sandbox {handle.sandbox_id} not found in namespace {handle.namespace}") from None
                if not idempotent:
                    raise Unavailable(f"the connection to the shim of sandbox {handle.sandbox_id} in namespace "
                                      f"{handle.namespace} ({handle.process or 'pid unknown'}) was lost during "
                                      f"{method}, which it may or may not have done; the shim runs and was left "
                                      "alone") from None
                if attempt == 2:
                    raise Unavailable(_unreachable(handle)) from None
        raise AssertionError("unreachable")

    def _attach(self, handle: ShimHandle, client: Client) -> None:
        handle.client = client
        client.on_close(lambda: self._on_closed(handle, client))

    def _go_live(self, handle: ShimHandle) -> None:
        handle.stop_watching()
        handle.unreachable_reason = ""
        handle.move(Phase.LIVE)
        # The connection may have dropped while the handle was not LIVE, when a close is not
        # reported: report it now or nobody would judge it.
        if handle.client is not None and handle.client.closed:
            self._on_closed(handle, handle.client)

    def _on_closed(self, handle: ShimHandle, client: Client) -> None:
        """A connection closed (on the loop, from the rpc client). If we did not close it, queue
        the judgement of whether the shim died. Calls in flight already failed with Unavailable."""
        if handle.closing or handle.client is not client or handle.phase is not Phase.LIVE:
            return
        try:
            self._losses.send_nowait((handle, client))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # the controller is closing

    async def _judge_losses(self, losses: Any) -> None:
        async with losses:
            async for handle, client in losses:
                assert self._tg is not None
                self._tg.start_soon(self._judge_loss, handle, client)

    async def _judge_loss(self, handle: ShimHandle, client: Client) -> None:
        """A LIVE shim's connection ``client`` was lost: bury the sandbox when the shim's process
        is gone or exiting (a killed process closes its sockets a moment before it is a zombie:
        wait for that, within EXIT_GRACE); otherwise it is UNREACHABLE and watched. Once per
        connection; a caller that comes second waits for the first. Never raises."""
        async with handle.reach_lock:
            if handle.client is not client or handle.phase is not Phase.LIVE or handle.closing:
                return  # judged already, or revived, or we closed it ourselves
            process = handle.process
            if process is None:
                # Nothing names the shim's process: a lost connection is all we can go by.
                await self._bury(handle)
                return
            pidfd = process.open_pidfd()
            try:
                gone = pidfd is None or await _exits_soon(process, pidfd)
            except BaseException:
                _close_quietly(pidfd)
                raise
            if gone or handle.phase is not Phase.LIVE or handle.closing:  # or shut down while we waited
                _close_quietly(pidfd)
                if gone:
                    await self._bury(handle)
                return
            handle.client = None
            self._unreachable(handle, "runs but its connection was lost", pidfd)
        await client.aclose()

    def _unreachable(self, handle: ShimHandle, reason: str, pidfd: int) -> None:
        """Keep a shim whose process runs but does not answer: UNREACHABLE, with a task that
        buries it once its process exits (it owns ``pidfd``)."""
        log.warning("sandbox %s/%s: its shim (%s) %s; it is left running and tried again on the next call",
                    handle.namespace, handle.sandbox_id, handle.process, reason)
        handle.unreachable_reason = reason
        handle.move(Phase.UNREACHABLE)
        handle.stop_watching()
        handle.watch_scope = scope = anyio.CancelScope()
        assert self._tg is not None
        self._tg.start_soon(self._watch, handle, pidfd, scope)

    async def _watch(self, handle: ShimHandle, pidfd: int, scope: anyio.CancelScope) -> None:
        """Wait for an UNREACHABLE shim's process to exit, then bury the sandbox; until
        ``scope`` is cancelled (it answered again, was shut down, or the controller closes)."""
        try:
            with scope:
                await anyio.wait_readable(pidfd)
        finally:
            os.close(pidfd)
        if scope.cancel_called or handle.closing:
            return
        await self._bury(handle)

    async def _revive(self, handle: ShimHandle, timeout: float | None) -> None:
        """Try an UNREACHABLE shim again: connect and, if it never said it holds the sandbox,
        ask. It is LIVE again when it answers; DYING when its process turned out to be gone;
        GONE when it never got CreateSandbox (it is shut down). Raises Unavailable or
        DeadlineExceeded with a sentence when it still does not answer (it stays UNREACHABLE)."""
        async with handle.reach_lock:
            if handle.phase is not Phase.UNREACHABLE:
                return  # revived, buried or forgotten while we waited
            budget = CONNECT_TIMEOUT if timeout is None else min(timeout, CONNECT_TIMEOUT)
            client: Client | None = None
            reply: dict[str, Any] | None = None
            try:
                with anyio.fail_after(budget):
                    client = await Client.connect(handle.address, namespace=handle.namespace, timeout=budget)
                    if not handle.confirmed:
                        reply = await client.call(SANDBOX_SERVICE, "SandboxStatus",
                                                  {"sandbox_id": handle.sandbox_id}, timeout=budget)
            except (RpcError, TimeoutError) as exc:
                if client is not None:
                    await client.aclose()
                if isinstance(exc, NotFound):
                    with handle.hold_bundle() as held:
                        if not held:
                            raise Unavailable(f"sandbox {handle.sandbox_id} is being changed by another process; "
                                              "try again") from None
                        log.warning("sandbox %s/%s: its shim never got CreateSandbox; shutting it down",
                                    handle.namespace, handle.sandbox_id)
                        await self._discard(handle)
                    return
                if handle.process is not None:
                    pidfd = handle.process.open_pidfd()
                    try:
                        gone = pidfd is None or await _exits_soon(handle.process, pidfd)
                    finally:
                        _close_quietly(pidfd)
                    if gone:
                        await self._bury(handle)
                        return
                timed_out = isinstance(exc, (TimeoutError, DeadlineExceeded))
                why = f"did not answer within {budget:g}s" if timed_out else f"cannot be reached ({exc})"
                handle.unreachable_reason = f"runs but {why}"
                cls = DeadlineExceeded if timed_out else Unavailable
                raise cls(_unreachable(handle)) from None
            log.info("sandbox %s/%s: its shim answers again", handle.namespace, handle.sandbox_id)
            self._attach(handle, client)
            if reply is not None:
                handle.remember(reply)
            self._go_live(handle)

    async def _bury(self, handle: ShimHandle) -> None:
        """The dead-shim cleanup, once per handle: ``podshim delete`` (kills what is left,
        removes netns, cgroup and socket), remove the bundle, keep a tombstone with the exit
        status. Concurrent callers wait for the first. Never raises."""
        if handle.phase in ENDED:
            await handle.dead.wait()
            return
        if handle.phase not in (Phase.LIVE, Phase.UNREACHABLE, Phase.PENDING):
            return
        handle.move(Phase.DYING)
        handle.stop_watching()
        exit_status = None
        with handle.hold_bundle() as held, anyio.CancelScope(shield=True):
            try:
                if handle.client is not None:
                    await handle.client.aclose()  # it is DYING now: this close is not reported again
                if self.read_only:
                    handle.uncleaned = True
                    log.warning("the shim of sandbox %s/%s is gone; left as it is (read-only: a Controller that "
                                "may change things cleans up after it)", handle.namespace, handle.sandbox_id)
                elif held:
                    log.warning("the shim of sandbox %s/%s is gone; cleaning up after it",
                                handle.namespace, handle.sandbox_id)
                    exit_status = await self.spawner.delete(handle.namespace, handle.sandbox_id, handle.bundle)
                    _remove_quietly(handle.bundle)
                else:
                    log.warning("the shim of sandbox %s/%s is gone; another process is cleaning up after it",
                                handle.namespace, handle.sandbox_id)
            except Exception:
                log.exception("cleanup after the shim of %s/%s failed", handle.namespace, handle.sandbox_id)
            finally:
                handle.exit = exit_status or ExitStatus(UNKNOWN_EXIT_STATUS, time.time_ns())
                handle.state = SandboxState.STOPPED
                handle.move(Phase.DEAD)
                handle.dead.set()

    async def _shutdown_shim(self, handle: ShimHandle, timeout: float) -> bool:
        """ShutdownSandbox and wait for the shim to close the connection; True when it went
        away cleanly. The connection is closed either way."""
        client = handle.client
        assert client is not None
        clean = False
        try:
            with phase("ShutdownSandbox call"):
                await client.call(SANDBOX_SERVICE, "ShutdownSandbox", {"sandbox_id": handle.sandbox_id},
                                  timeout=timeout)
        except RpcError as exc:
            # Unavailable/NotFound: already dead; DeadlineExceeded: hung. delete will see to it.
            log.debug("ShutdownSandbox %s/%s: %s", handle.namespace, handle.sandbox_id, exc)
        else:
            with anyio.move_on_after(timeout), phase("shim exit"):
                await client.wait_closed()
            clean = client.closed
        await client.aclose()
        return clean

    async def _discard(self, handle: ShimHandle) -> None:
        """Undo a sandbox that never came to be (a failed create, or a shim found alive on load
        that never got CreateSandbox): shut the shim down, `podshim delete`, remove the bundle,
        forget the id; a read-only controller only forgets it. Shielded from cancellation; never
        raises."""
        with anyio.CancelScope(shield=True):
            try:
                handle.closing = True
                if self.read_only:
                    if handle.client is not None:
                        await handle.client.aclose()
                    self._forget(handle)
                    return
                if handle.client is not None:
                    await self._shutdown_shim(handle, DISCARD_TIMEOUT)
                await self.spawner.delete(handle.namespace, handle.sandbox_id, handle.bundle)
                await self._release(handle)
            except Exception:
                log.exception("undoing sandbox %s/%s failed", handle.namespace, handle.sandbox_id)
                self._forget(handle)

    async def _release(self, handle: ShimHandle) -> None:
        """The end of every sandbox: the spawner's release, the bundle, the map entry."""
        try:
            with phase("release"):
                await self.spawner.release(handle.namespace, handle.sandbox_id)
        finally:
            with phase("bundle removal"):
                _remove_quietly(handle.bundle)
            self._forget(handle)

    def _forget(self, handle: ShimHandle) -> None:
        handle.stop_watching()
        if handle.phase is not Phase.GONE:
            handle.move(Phase.GONE)
        handle.dead.set()  # nobody may wait forever on a sandbox that is gone
        self.sandboxes.delete(handle.namespace, handle.sandbox_id, handle)

    async def _load_one(self, handle: ShimHandle) -> None:
        with handle.hold_bundle() as held:
            if not held:
                log.warning("skipping %s: another process is changing it", handle.bundle)
                self._forget(handle)
                return
            try:
                await self._reconnect(handle)
            except Exception:
                log.exception("loading %s failed", handle.bundle)
            finally:
                if not handle.settled.is_set():  # failed or cancelled half-way: nobody may wait on it
                    self._forget(handle)

    async def _reconnect(self, handle: ShimHandle) -> None:
        """Load one bundle: reach its shim within LOAD_TIMEOUT and settle the handle (LIVE,
        UNREACHABLE, a tombstone, or forgotten when the shim never got CreateSandbox)."""
        ns, sid = handle.namespace, handle.sandbox_id
        try:
            boot = read_bootstrap(handle.bundle)
        except RpcError as exc:
            # No address: whatever runs could never be reached. state.json still names the
            # shim's processes for `podshim delete`.
            log.warning("sandbox %s/%s: cannot reach its shim (%s)", ns, sid, exc.message)
            await self._bury(handle)
            return
        handle.address, handle.version = boot.address, boot.version
        handle.process = read_shim_process(handle.bundle, boot)
        pidfd = None
        if handle.process is not None:
            pidfd = handle.process.open_pidfd()
            if pidfd is None:
                log.warning("sandbox %s/%s: its shim (%s) is gone", ns, sid, handle.process)
                await self._bury(handle)
                return
        try:
            try:
                reply = await self._first_status(handle)
            except (RpcError, TimeoutError, OSError) as exc:
                timed_out = isinstance(exc, (TimeoutError, DeadlineExceeded))
                why = f"did not answer within {LOAD_TIMEOUT:g}s" if timed_out else _describe(exc)
                client, handle.client = handle.client, None
                if client is not None:
                    await client.aclose()
                if pidfd is None or await _exits_soon(handle.process, pidfd):
                    log.warning("sandbox %s/%s: cannot reach its shim (%s)", ns, sid, why)
                    await self._bury(handle)
                else:
                    self._unreachable(handle, f"runs but {why}" if timed_out else f"runs but cannot be reached ({why})",
                                      pidfd)
                    pidfd = None  # the watch owns it now
                return
        finally:
            _close_quietly(pidfd)  # a LIVE shim's connection tells when it goes
        if reply is None:
            # Spawned but never created: the controller died between the two (containerd#6860).
            log.warning("sandbox %s/%s: its shim never got CreateSandbox; shutting it down", ns, sid)
            await self._discard(handle)
            return
        handle.remember(reply)
        self._go_live(handle)

    async def _first_status(self, handle: ShimHandle) -> dict[str, Any] | None:
        """Connect to a loaded shim and ask for its sandbox within LOAD_TIMEOUT; None when it
        never got CreateSandbox. Raises RpcError, TimeoutError, OSError."""
        with anyio.fail_after(LOAD_TIMEOUT):
            client = await Client.connect(handle.address, namespace=handle.namespace, timeout=LOAD_TIMEOUT)
            self._attach(handle, client)
            try:
                return await client.call(SANDBOX_SERVICE, "SandboxStatus", {"sandbox_id": handle.sandbox_id},
                                         timeout=LOAD_TIMEOUT)
            except NotFound:
                return None


def _create_payload(sandbox_id: str, bundle: str, options: Any, netns_path: Any, rootfs: Any,
                    annotations: Any) -> dict[str, Any]:
    """CreateSandbox's payload, checked before anything is spawned: a bad argument costs no shim."""
    payload: dict[str, Any] = {"sandbox_id": sandbox_id, "bundle_path": bundle}
    if options is not None:
        if not isinstance(options, Mapping):
            raise InvalidArgument(f"options must be a map (a PodSandboxConfig), not {type(options).__name__}")
        payload["options"] = dict(options)
    if netns_path is not None:
        if not isinstance(netns_path, str) or not os.path.isabs(netns_path):
            raise InvalidArgument(f"netns_path {netns_path!r} must be an absolute path")
        payload["netns_path"] = netns_path
    if rootfs is not None:
        if isinstance(rootfs, (str, bytes)) or not isinstance(rootfs, Sequence):
            raise InvalidArgument("rootfs must be a list of mounts")
        payload["rootfs"] = list(rootfs)
    if annotations is not None:
        if not isinstance(annotations, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()):
            raise InvalidArgument("annotations must map strings to strings")
        payload["annotations"] = dict(annotations)
    return payload


def _status(handle: ShimHandle, reply: dict[str, Any]) -> ControllerStatus:
    return ControllerStatus(
        sandbox_id=handle.sandbox_id,
        pid=reply.get("pid") or 0,
        state=reply.get("state") or SandboxState.UNKNOWN,
        info=dict(reply.get("info") or {}),
        created_at=reply.get("created_at") or 0,
        exited_at=reply.get("exited_at") or 0,
        exit_status=reply.get("exit_status") or 0,
        address=handle.address,
        version=handle.version,
        namespace=handle.namespace,
    )


def _remove_quietly(path: str) -> None:
    try:
        remove_bundle(path)
    except OSError as exc:
        log.error("cannot remove bundle %s: %s", path, exc)


def _unreachable(handle: ShimHandle) -> str:
    """The sentence of a call on a shim that runs but does not answer."""
    return (f"the shim of sandbox {handle.sandbox_id} in namespace {handle.namespace} "
            f"({handle.process or 'pid unknown'}) {handle.unreachable_reason or 'does not answer'}; "
            "it is left running and tried again on the next call")


def _quietly(read: Any, *args: Any) -> Any:
    """``read(*args)``, or None when it raises an RpcError."""
    try:
        return read(*args)
    except RpcError:
        return None


async def _exits_soon(process: ShimProcess, pidfd: int) -> bool:
    """Whether the process behind ``pidfd`` has exited, or is on its way out and exits within
    EXIT_GRACE (a killed process closes its sockets a moment before it is a zombie)."""
    if pidfd_exited(pidfd):
        return True
    if not process_exiting(process.pid):
        return False
    with anyio.move_on_after(EXIT_GRACE):
        await anyio.wait_readable(pidfd)
        return True
    return False


def _close_quietly(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, RpcError):
        return str(exc)
    if isinstance(exc, TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
