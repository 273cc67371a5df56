"""The Controller: containerd's sandbox.Controller for podshim shims.

It spawns one shim per sandbox, keeps a connection to each in an :class:`~client.controller.nsmap.NSMap`,
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

The Controller removes only bundles it can prove a Controller made (:func:`client.controller.bundles.made_here`);
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
from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from shim.api.identifiers import validate_identifier
from shim.api.names import SANDBOX_SERVICE
from shim.rpc.client import Client
from shim.rpc.status import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    RpcError,
    Unavailable,
    error_from_oserror,
)

from client.controller.bundles import bundle_path, make_bundle, read_bootstrap, read_shim_process
from client.controller.defaults import (
    CALL_TIMEOUT,
    CONNECT_TIMEOUT,
    CREATE_TIMEOUT,
    DEFAULT_BUNDLE_ROOT,
    DEFAULT_RUNTIME_ROOT,
    DEFAULT_STOP_GRACE,
    SHUTDOWN_TIMEOUT,
    START_TIMEOUT,
    STOP_MARGIN,
)
from client.controller.handle import ENDED, Phase, ShimHandle
from client.controller.liveness import describe_error, unreachable_sentence
from client.controller.loading import Loading
from client.controller.nsmap import NSMap
from client.controller.results import ControllerInstance, ControllerStatus, ExitStatus, Platform, SandboxState
from client.controller.spawners import ExecSpawner, Spawner, template_wanted
from client.controller.spawners.systemd import SystemdSpawner
from client.phases import phase

__all__ = ["Controller", "DEFAULT_BUNDLE_ROOT"]

log = logging.getLogger("client.controller")  # the package's one logger: its modules are one Controller


class Controller(Loading):
    """Spawns, tracks and reconnects podshim shims.

    ``state_root`` holds the bundles; ``runtime_root`` the shim sockets (``<root>/s``).
    ``spawner`` is ``"exec"`` (detached shims, :class:`ExecSpawner`), ``"systemd"`` (one
    ``podshim@`` unit per shim, :class:`~client.controller.spawners.systemd.SystemdSpawner`) or a :class:`Spawner`.
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
    async def __aenter__(self) -> Controller:
        try:
            await self.load()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

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
                log.warning("create %s/%s failed (%s); undoing it", namespace, sandbox_id, describe_error(exc))
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
                if handle.phase is not Phase.GONE:  # type: ignore[comparison-overlap]  # the awaits above move it
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
        answer), ``podshim delete`` finishes the job. A tombstone is forgotten, once ``podshim
        delete`` has run to its end (one that failed or ran out of time is run again here).

        Returns once the shim closed its connection: the pause, network namespace, cgroups,
        socket and bundle are gone by then; the shim's process may still be exiting (the kernel
        takes a millisecond or two to tear down its memory), as a containerd shim may.

        Runs to the end even if cancelled (bounded by the named timeouts). Raises NotFound for
        an unknown sandbox (so a second shutdown of the same id is NotFound), Unavailable when
        another process is changing the sandbox or when the cleanup after a dead shim still does
        not finish (the sandbox is kept: a later shutdown tries again).
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
                if handle.phase is Phase.GONE:  # type: ignore[comparison-overlap]  # the awaits above move it
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
                if handle.cleanup_unfinished and not self.read_only:
                    await self._clean_again(handle)
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
            raise Unavailable(unreachable_sentence(handle))
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
                reply: dict[str, Any] = await client.call(SANDBOX_SERVICE, method, payload, timeout=timeout)
                return reply
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
                if handle.phase is Phase.GONE:  # type: ignore[comparison-overlap]  # the awaits above move it
                    raise NotFound(f"sandbox {handle.sandbox_id} not found in namespace {handle.namespace}") from None
                if not idempotent:
                    raise Unavailable(f"the connection to the shim of sandbox {handle.sandbox_id} in namespace "
                                      f"{handle.namespace} ({handle.process or 'pid unknown'}) was lost during "
                                      f"{method}, which it may or may not have done; the shim runs and was left "
                                      "alone") from None
                if attempt == 2:
                    raise Unavailable(unreachable_sentence(handle)) from None
        raise AssertionError("unreachable")


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


def _quietly(read: Any, *args: Any) -> Any:
    """``read(*args)``, or None when it raises an RpcError."""
    try:
        return read(*args)
    except RpcError:
        return None


