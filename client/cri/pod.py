"""Pods with CRI semantics, on top of the Controller: RunPodSandbox and friends, and containers.

The flow follows containerd's CRI plugin (internal/cri/server/sandbox_*.go):

- **run**: record the pod (state CREATING — the record *is* the name reservation), create and
  start its sandbox through the Controller (the shim makes the pod's network namespace), set up
  the network with CNI, then mark it READY with its IP. Any failure rolls back every step; a
  crash leaves a CREATING record that the next start rolls back (containerd#10848 is the
  counter-example: a crash between two writes made every later start fail).
- **stop**: stop every container (best effort), tear the network down (CNI DEL, idempotent),
  stop the sandbox: NOTREADY. Idempotent; works when the shim is already dead.
- **remove**: force-stop if READY, remove the containers, make sure DEL ran, shut the shim down
  (it removes the netns and cgroup), delete the record. Idempotent: NOT_FOUND only for an id
  never seen.

Containers are tasks of the pod's shim (``podshim.task.v1.Task``): processes that join the
pause's net, ipc and uts namespaces (and its pid namespace when the pid mode is POD), on a
writable snapshot of their image (:mod:`.rootfs`), with the process their image's config and
CRI config make (:mod:`.process`), the pod's hosts, resolv.conf and hostname files
(:mod:`.podfiles`) and their CRI mounts (:mod:`.mounts`).
"""

from __future__ import annotations

import ipaddress
import logging
import operator
import os
import re
import secrets
import shlex
import signal
import socket
import stat
import time
from contextlib import asynccontextmanager
from types import MappingProxyType
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Mapping, NoReturn, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel

from shim.sandbox.options import NATIVE, RUNTIME_HANDLERS  # "native" (the default, also for ""), "runc", "crun"
from shim.rpc.api import EVENTS_SERVICE, TASK_SERVICE
from shim.paths import write_json_atomic
from shim.sandbox.events import TOPIC_EXIT, TOPIC_TASK_EXIT
from shim.rpc.files import ensure_private_dir, read_json
from shim.rpc.trees import remove_tree
from shim.rpc.status import (Aborted, DeadlineExceeded, FailedPrecondition, Internal, InvalidArgument, NotFound,
                             RpcError, Unavailable)

from client import layouts
from client.controller.bundles import bundle_path
from client.cri import podmetrics, stats
from client.cri.cni import DEFAULT_BIN_DIRS, DEFAULT_CONF_DIR, CniRunner, addresses_in_place, primary_ip
from client.cri.concurrency import together
from client.controller import Controller
from client.cri.configs import ContainerConfig, PodSandboxConfig
from client.cri.resources import pod_resources
from client.cri.events import (CONTAINER_CREATED, CONTAINER_DELETED, CONTAINER_STARTED, EventFeed,
                               EventStream)
from client.cri.failpoints import failpoint
from client.cri.logcontext import about
from client.cri.imagevolumes import VOLUMES_DIR, ImageVolumes, mount_status
from client.cri.mounts import container_mounts
from client.cri.podfiles import PodFiles, remove_pod_files, write_pod_files
from client.cri.process import container_process
from client.cri.rootfs import ContainerImage, ImageLookup, NoImages, Snapshotter, call, mount_dicts
from client.cri import cdi, security
from client.cri.resources import shim_resources
from client.cri.store import ContainerRecord, ContainerState, PodRecord, PodState, PodStore
from client.phases import phase

__all__ = ["DEFAULT_NAMESPACE", "RUNTIME_HANDLERS", "PodEntry", "PodService", "keep_newest", "open_pod_service"]

log = logging.getLogger(__name__)

#: The Controller namespace pods live in (containerd's CRI uses k8s.io).
DEFAULT_NAMESPACE = "k8s.io"
#: Seconds the pause gets between SIGTERM and SIGKILL when a pod stops.
SANDBOX_STOP_TIMEOUT = 2.0
#: Default grace for StopContainer when the caller gives none.
CONTAINER_STOP_TIMEOUT = 10.0
#: What StopContainer sends first, to every container (ContainerStatus.stop_signal says so).
STOP_SIGNAL = signal.SIGTERM
#: Bound on one call to a shim from the pod layer (not for waits, which have their own).
CALL_TIMEOUT = 30.0
#: What a container whose config names no image reports as its ``image`` and ``image_ref``: it runs
#: on a root of its own, empty but for its mounts (shim.runtime.mounts.OWN_ROOT; podshimd refuses it).
NO_IMAGE = "none"
#: Below the store's root: one directory per pod with its hosts, resolv.conf and hostname files.
POD_FILES_DIR = "pod-files"
#: Exit code reported for a container whose shim is gone (containerd's unknownExitCode).
UNKNOWN_EXIT_CODE = 255
#: CRI's PodSandboxState of each record state (CREATING is never listed; its status is not ready).
_POD_STATE = {PodState.READY: "SANDBOX_READY", PodState.NOTREADY: "SANDBOX_NOTREADY",
              PodState.CREATING: "SANDBOX_NOTREADY"}
#: The record state of each task status the shim reports (shim.sandbox.tasks.Status values).
_TASK_STATE = {"created": ContainerState.CREATED, "running": ContainerState.RUNNING,
               "stopped": ContainerState.EXITED}
#: The key that orders ListPodSandbox's entries (newest first).
_CREATED_AT = operator.itemgetter("created_at")
#: How many parsed pod configs a PodService keeps (listings parse each pod's once).
_CONFIGS_KEPT = 4096
#: The shim's sandbox state while the pause runs (shim.sandbox.sandbox.State.RUNNING).
_SANDBOX_RUNNING = "running"


#: A pod's or container's id (:func:`_new_id`); a snapshot key of this form is a container's.
_ID = re.compile(r"[0-9a-f]{64}")
#: The snapshot of a pod's sandbox image: ``sandbox-<pod id>`` (the pause's root).
SANDBOX_SNAPSHOT_PREFIX = "sandbox-"


class PodEntry(dict[str, Any]):
    """A pod's ListPodSandbox entry as :meth:`PodService.list_pod_sandbox` hands it out. Made
    only here, once per stored record, over copies nobody else holds, and read-only all through
    (its own mutators raise TypeError; its maps are ``MappingProxyType``): the same entry always
    says the same. Its type is the mark of that, for callers that keep what they make of an
    entry while they are given the same one (podshimd's encoded PodSandboxes); a dict for speed
    (reading a field costs what a dict's does)."""

    __slots__ = ()

    def _read_only(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("a listed pod's entry is read-only")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _read_only


def sandbox_snapshot_key(pod_id: str) -> str:
    """The key of the snapshot a pod's pause runs from (a sandbox image's)."""
    return SANDBOX_SNAPSHOT_PREFIX + pod_id


def _new_id() -> str:
    """A 64-hex-digit id, like CRI's."""
    return secrets.token_hex(32)


class PodService:
    """CRI's RuntimeService for pods and containers, over a Controller and a PodStore.

    Build it with :func:`open_pod_service` (which also opens the Controller and recovers the
    store); every method raises the typed errors of :mod:`shim.rpc.status`. Other processes
    may work on the same root at the same time: an operation on a pod holds the pod's lock
    (:meth:`PodStore.lock_pod`) in this process and across processes, reads take no lock.
    """

    def __init__(self, controller: Controller, store: PodStore, *, cni: CniRunner | None,
                 namespace: str = DEFAULT_NAMESPACE, log_root: str,
                 runtime_handlers: tuple[str, ...] = RUNTIME_HANDLERS, default_runtime_handler: str = NATIVE,
                 cgroup_parent: str = "", pause_binary: str | None = None,
                 images: ImageLookup | None = None, snapshots: Snapshotter | None = None,
                 sandbox_image: str = "", pull: Callable[[str], Awaitable[Any]] | None = None,
                 cdi_spec_dirs: tuple[str, ...] = cdi.DEFAULT_SPEC_DIRS):
        """``runtime_handlers`` are those RunPodSandbox accepts, ``default_runtime_handler`` the
        one an empty handler means. ``cgroup_parent`` is the cgroup parent of a pod whose config
        names none; ``pause_binary`` the pause of native pods (None: catatonit when installed,
        else the built-in pause). ``images`` finds the image a container names and
        ``snapshots`` makes its root filesystem (:mod:`.rootfs`); without them a container
        that names an image is refused (one that names none runs on a root of its own, empty but
        for its mounts).
        ``sandbox_image``, when set, is every pod's pause (containerd's sandbox_image): found
        through ``images``, pulled with ``pull(reference)`` when missing, run from a snapshot
        ``sandbox-<pod id>`` of it. ``cdi_spec_dirs`` hold the CDI specs a container's CDI devices
        are resolved with (:mod:`.cdi`)."""
        self.controller = controller
        self.cdi_spec_dirs = tuple(cdi_spec_dirs)
        self.store = store
        self.cni = cni
        self.namespace = namespace
        self.log_root = log_root
        self.runtime_handlers = tuple(runtime_handlers)
        self.default_runtime_handler = default_runtime_handler
        self.cgroup_parent = cgroup_parent
        self.pause_binary = pause_binary
        self.sandbox_image = sandbox_image
        self.pull = pull
        self.images: ImageLookup = images if images is not None else NoImages()
        self.snapshots = snapshots
        self.image_volumes = ImageVolumes(os.path.join(store.root, VOLUMES_DIR), self.images, snapshots)
        self._locks: dict[str, anyio.Lock] = {}
        # Pods whose shim's events this process follows (_follow), and those among them whose
        # record is known to be current: their state is read from the record, not the shim.
        self._followers: anyio.abc.TaskGroup | None = None
        self._following: set[str] = set()
        self._current: set[str] = set()
        self._stopping: set[str] = set()  # pods this process is stopping right now
        self._configs: dict[str, tuple[PodRecord, PodSandboxConfig]] = {}  # _config_of
        self._entries: dict[str, tuple[PodRecord, PodEntry]] = {}  # _entry_of
        self._cpu_rates = stats.CpuRates()
        self._events = EventFeed()
        self._runtime_config_path = os.path.join(os.path.dirname(log_root), "runtime-config.json")

    @asynccontextmanager
    async def _hold(self, pod_id: str) -> AsyncIterator[None]:
        """Work on one pod alone: this process's tasks queue on an anyio lock, other processes
        on the pod's flock (taken after the anyio lock, so only one task here ever waits for it)."""
        lock = self._locks.get(pod_id)
        if lock is None:
            lock = self._locks[pod_id] = anyio.Lock()
        try:
            async with lock, self.store.lock_pod(pod_id):
                yield
        finally:
            if not lock.locked() and lock.statistics().tasks_waiting == 0:
                self._locks.pop(pod_id, None)  # nobody holds or waits for it: the next one makes a new one

    # -- recovery ------------------------------------------------------------------------
    async def recover(self) -> None:
        """Roll back pods a crash left half-made; reconcile READY pods with their shims.

        A CREATING pod whose RunPodSandbox is still running, here or in another process, is
        left alone (its lock is held); see :meth:`PodStore.claim_incomplete`.
        """
        for record in self.store.list():
            if record.state is not PodState.CREATING:
                continue
            lock = self.store.claim_incomplete(record.pod_id)
            if lock is None:
                continue
            try:
                log.warning("pod %s was being created by a process that died; rolling it back", record.pod_id)
                await self._rollback(self.store.get(record.pod_id))
            except RpcError as exc:  # the record stays CREATING: the next recovery tries again
                log.warning("pod %s: rolling it back failed: %s", record.pod_id, exc)
            finally:
                lock.release()
        # Every pod is reconciled with its shim (a pause or container may have exited while no
        # process followed it) before this returns, all at once; from then on the shims' events
        # keep the records current.
        async with anyio.create_task_group() as tg:
            for record in self.store.list():
                if record.state is not PodState.CREATING:
                    tg.start_soon(self._drop_unmade_then_follow, record)
        await self._sweep_snapshots()
        await self._sweep_image_volumes()

    async def _drop_unmade_then_follow(self, record: PodRecord) -> None:
        """Remove the containers a CreateContainer that died left: CREATED records whose task the
        pod's live shim does not have, while nobody holds the pod (a create in flight holds its
        lock from before the record until the task is made). Then follow the pod's shim."""
        unmade = [c for c in record.containers.values() if c.state is ContainerState.CREATED]
        lock = self.store.lock_pod(record.pod_id) if unmade else None
        if lock is not None and lock.try_acquire():
            try:
                shim = await self._shim(record.pod_id)
                for c in unmade:
                    try:
                        await self._task_call(shim, record.pod_id, "State", {"task_id": c.container_id})
                    except NotFound:
                        log.warning("container %s was being created by a process that died before its task was "
                                    "made; removing it", c.container_id,
                                    extra={"pod_id": record.pod_id, "container_id": c.container_id})
                        await self._remove_rootfs(record.pod_id, c.container_id)
                        await self._release_volumes(record.pod_id, c.container_id, c.image_volumes.values())
                        self.store.delete_container(record.pod_id, c.container_id)
            except RpcError:
                pass  # no live shim (or it does not answer): the records are judged when it is followed
            finally:
                lock.release()
        await self._start_following(record.pod_id)

    async def _sweep_snapshots(self) -> None:
        """Remove container snapshots that no container record names, and sandbox image snapshots
        (``sandbox-<pod id>``) that no pod record names: what a process that died between removing
        a record and its snapshot left (a record is written before its snapshot is made and
        deleted after it is removed, so the snapshots are listed first: one listed there whose
        record is not read after it is a leftover, never a create in flight)."""
        if self.snapshots is None or not hasattr(self.snapshots, "snapshots"):
            return
        try:
            snapshots = await call(self.snapshots.snapshots)
        except Exception as exc:  # noqa: BLE001 (recovery goes on; the next start tries again)
            log.warning("cannot list the container snapshots: %s", exc)
            return
        known = {c.container_id for c in self.store.list_containers()}
        pods = {record.pod_id for record in self.store.list()}
        for snapshot in snapshots:
            if snapshot.kind != "active":
                continue
            if _ID.fullmatch(snapshot.name) and snapshot.name not in known:
                log.warning("removing the snapshot of container %s, which no pod has any more", snapshot.name)
                await self._remove_rootfs("-", snapshot.name)
            pod_id = snapshot.name.removeprefix(SANDBOX_SNAPSHOT_PREFIX)
            if pod_id != snapshot.name and _ID.fullmatch(pod_id) and pod_id not in pods:
                log.warning("removing the sandbox image snapshot of pod %s, which is no more", pod_id)
                await self._remove_rootfs(pod_id, snapshot.name)

    async def _sweep_image_volumes(self) -> None:
        """Release the image volumes no container record names (listed before the records are
        read, as :meth:`_sweep_snapshots` lists the snapshots)."""
        try:
            found = await self.image_volumes.listed()
        except (OSError, RpcError) as exc:
            log.warning("cannot list the image volumes: %s", exc)
            return
        in_use = {(c.pod_id, image_id.partition(":")[2]) for c in self.store.list_containers()
                  for image_id in c.image_volumes.values()}
        await self.image_volumes.sweep(found, in_use)

    async def _release_volumes(self, pod_id: str, container_id: str, image_ids: Iterable[str]) -> None:
        """Release the pod's image volumes of ``image_ids`` that no other container of the pod
        uses (the caller holds the pod's lock and deletes the container's record after this)."""
        try:
            others = self.store.get(pod_id).containers.values()
        except NotFound:
            others = {}.values()
        used = {i for c in others if c.container_id != container_id for i in c.image_volumes.values()}
        await self.image_volumes.release(pod_id, sorted(set(image_ids) - used))

    # -- following the shims: state kept current by their exit events -----------------------
    def keep_current(self, task_group: anyio.abc.TaskGroup) -> None:
        """Follow each pod's shim events in ``task_group`` (which must outlive every call):
        pods and containers that exit are marked NOTREADY and EXITED as it happens, so status
        and listings read the records instead of asking every shim. Without it (or for a pod
        not followed yet) they ask the shim, as before."""
        self._followers = task_group

    async def _start_following(self, pod_id: str) -> None:
        """Follow the pod's shim (once per process); returns when its record was reconciled."""
        if self._followers is None or pod_id in self._following:
            return
        self._following.add(pod_id)
        await self._followers.start(self._follow, pod_id)

    def _follow_soon(self, pod_id: str) -> None:
        if self._followers is not None and pod_id not in self._following:
            self._following.add(pod_id)
            self._followers.start_soon(self._follow, pod_id)

    async def _follow(self, pod_id: str, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Apply the shim's exit events to the pod's record while the shim lives. Never raises.

        Each round subscribes, then reconciles the record with the shim (what exited before the
        subscription is seen there, what exits after it comes as an event). A lost connection
        is judged by the Controller: a live shim is followed again on its new connection, a
        dead one leaves its pod NOTREADY and its containers EXITED. When this cannot tell (the
        stream failed on a live connection, another process holds the sandbox), it stops and
        the pod's readers ask the shim again."""
        started = False
        try:
            while True:
                try:
                    await self._load(pod_id)
                    client = self.controller.client_for(self.namespace, pod_id)
                except RpcError:
                    client = None
                if client is None:  # its connection was lost: the Controller reconnects, or buries it
                    if not await self._reconcile(pod_id):
                        return
                    continue
                lost = False

                async def apply_events(client: Any = client) -> None:
                    nonlocal lost
                    try:
                        async for event in client.stream(EVENTS_SERVICE, "Subscribe", {}):
                            await self._apply(pod_id, event)
                            self._events.shim_event(pod_id, event)  # to GetContainerEvents, once applied
                    except RpcError as exc:
                        # Its shim went away: after a stop or remove, as expected; otherwise the
                        # Controller reconnects or buries it and says so.
                        log.debug("pod %s: its shim's event stream ended: %s", pod_id, exc.message,
                                  extra={"pod_id": pod_id})
                    finally:
                        self._current.discard(pod_id)
                    lost = client.closed

                async with anyio.create_task_group() as tg:
                    tg.start_soon(apply_events)
                    # The stream task runs first and sends Subscribe before it waits; the status
                    # call below goes out after it on the same connection, and the shim handles
                    # requests in order, so no exit falls between the two.
                    await anyio.lowlevel.checkpoint()
                    live = await self._reconcile(pod_id)
                    if live:
                        self._current.add(pod_id)
                    else:
                        tg.cancel_scope.cancel()
                    if not started:
                        started = True
                        task_status.started()
                if not live or not lost:
                    return
        except Exception:
            log.exception("pod %s: following its shim failed", pod_id, extra={"pod_id": pod_id})
        finally:
            self._current.discard(pod_id)
            self._following.discard(pod_id)
            if not started:
                task_status.started()

    async def _reconcile(self, pod_id: str) -> bool:
        """Bring the pod's record and its containers' up to date by asking the shim; True while
        its shim lives (its events can be followed)."""
        try:
            record = self.store.get(pod_id)
        except NotFound:
            return False
        running = await self._sandbox_running(record)
        if running is None:
            return False  # another process holds the sandbox right now
        if not running and record.state is PodState.READY:
            self._mark_notready(pod_id)
        for container in record.containers.values():
            try:
                await self._ask_container(container)
            except (Aborted, NotFound):
                pass
        try:
            self.controller.client_for(self.namespace, pod_id)
        except RpcError:
            return False
        return True

    def _lifecycle(self, message: str, *args: Any, pod_id: str, container_id: str = "",
                   record: PodRecord | None = None) -> None:
        """One INFO line of a pod's or container's lifecycle: its ids, and the pod's name and namespace,
        as fields (:mod:`client.cri.logcontext`)."""
        if record is None:
            try:
                record = self.store.get(pod_id)
            except NotFound:
                record = None
        metadata = (record.config.get("metadata") or {}) if record is not None else {}
        log.info(message, *args, extra={"pod_id": pod_id, "container_id": container_id,
                                        "pod_name": metadata.get("name", ""),
                                        "pod_namespace": metadata.get("namespace", "")})

    def _mark_notready(self, pod_id: str) -> PodRecord | None:
        # Another process (or task) may be stopping it right now: the store checks the move
        # against the record as it is then, and READY → NOTREADY twice is no move the second time.
        try:
            return self.store.update(pod_id, state=PodState.NOTREADY, stopped_at=time.time_ns())
        except NotFound:
            return None

    async def _apply(self, pod_id: str, event: Any) -> None:
        """One shim event: a pause that exited makes the pod NOTREADY, a task that exited its
        container EXITED (under the pod's lock: a StartContainer in flight writes RUNNING first)."""
        if not isinstance(event, dict) or not isinstance(event.get("event"), dict):
            return
        body = event["event"]
        if event.get("topic") == TOPIC_EXIT:
            if pod_id not in self._stopping:
                self._mark_notready(pod_id)
        elif event.get("topic") == TOPIC_TASK_EXIT and isinstance(body.get("task_id"), str):
            async with self._hold(pod_id):
                try:
                    c = self.store.get_container(pod_id, body["task_id"])
                except NotFound:
                    return  # removed meanwhile, or not one of ours
                if c.state is not ContainerState.EXITED:
                    self._exited(c, {"exit_status": body.get("exit_status", UNKNOWN_EXIT_CODE),
                                     "exited_at": body.get("exited_at") or time.time_ns(),
                                     "oom_killed": body.get("oom_killed") is True})

    async def _load(self, pod_id: str) -> None:
        """Make sure this process's Controller knows the pod's sandbox. Another process may
        have made it after this one loaded the state root, or held its bundle (creating or
        loading it) just then, and the Controller skips such a bundle. Raises Aborted when the
        bundle is there but another process holds it right now: not knowing it is not its end.
        """
        await self.controller.load(self.namespace, pod_id)
        if (self.controller.sandboxes.find(self.namespace, pod_id) is None
                and os.path.isdir(bundle_path(self.controller.state_root, self.namespace, pod_id))):
            raise Aborted(f"the sandbox of pod {pod_id} is being changed by another process; try again")

    async def _sandbox_running(self, record: PodRecord) -> bool | None:
        """True while the pod's pause runs, False once it is gone; None when this cannot be told
        now (another process holds its sandbox)."""
        try:
            await self._load(record.pod_id)
            status = await self.controller.status(self.namespace, record.pod_id)
        except Aborted:
            return None
        except RpcError:
            return False
        return status.state == _SANDBOX_RUNNING

    # -- pods -----------------------------------------------------------------------------
    async def run_pod_sandbox(self, config: PodSandboxConfig | Mapping[str, Any],
                              runtime_handler: str | None = None) -> str:
        """RunPodSandbox: make, start and network a pod; return its id.

        Raises InvalidArgument (bad config, unknown runtime handler), AlreadyExists (a pod with
        the same name, namespace, uid and attempt), or the error of the step that failed, after
        rolling back everything done before it.
        """
        cfg = config if isinstance(config, PodSandboxConfig) else PodSandboxConfig.from_json(config)
        pause = security.pause_fields(cfg.security)  # refuses what cannot be honoured (AppArmor, ...) up front
        handler = runtime_handler or self.default_runtime_handler
        if handler not in self.runtime_handlers:
            raise InvalidArgument(f"runtime handler {handler!r} is not configured "
                                  f"(configured: {', '.join(self.runtime_handlers)})")
        pod_id = _new_id()
        # The pod's lock is held from before its CREATING record exists until it is READY or
        # gone: a CREATING record whose lock is free is what a crash leaves, for recovery.
        async with self._hold(pod_id), about(pod_id):
            with phase("store create"):
                record = self.store.create(PodRecord(pod_id, cfg.to_json(), handler, PodState.CREATING,
                                                     sandbox_namespace=self.namespace))
            failpoint("run:after-record")
            try:
                await self._bring_up(record, cfg, pause)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await self._rollback(self.store.get(pod_id))
                raise
        with phase("events"):
            await self._pod_ready(pod_id)
            await self._start_following(pod_id)
        self._lifecycle("pod sandbox ready (runtime handler %s)", handler, pod_id=pod_id)
        return pod_id

    async def _bring_up(self, record: PodRecord, cfg: PodSandboxConfig, pause: dict[str, Any]) -> None:
        ns, pod_id = self.namespace, record.pod_id
        options = self._shim_options(cfg, record.runtime_handler, pause)
        rootfs = await self._sandbox_rootfs(pod_id, cfg, options) if self.sandbox_image else None
        await self.controller.create(ns, pod_id, options=options, rootfs=rootfs, annotations=dict(cfg.annotations))
        failpoint("run:after-create")
        netns = ""
        if not cfg.host_network:  # CreateSandbox made it (the pause joins it when it starts)
            with phase("SandboxStatus"):
                status = await self.controller.status(ns, pod_id, verbose=True)
            netns = status.info.get("netns_path", "")
            # Recorded before any plugin runs: a crash from here on leaves a record whose
            # rollback DELs the network in the right namespace.
            with phase("store update"):
                self.store.update(pod_id, netns_path=netns)
        # The pause starts while the plugins set the network up, as the network needs only the
        # namespace (containerd sets it up before it starts the sandbox at all). Either failing
        # cancels the other; the caller's rollback undoes both (CniRunner.add undoes its own part).
        started: list[Any] = []
        network: list[Any] = []

        async def start() -> None:
            with phase("StartSandbox"):
                started.append(await self.controller.start(ns, pod_id))
            # The pod's own resources, as UpdatePodSandboxResources writes them, before any container.
            wanted = cfg.shim_pod_resources
            if wanted:
                with phase("UpdateSandbox"):
                    await self.controller.update(ns, pod_id, wanted)
            failpoint("run:after-start")

        async def add_network() -> None:
            if not cfg.host_network and self.cni is not None:
                with phase("cni add"):
                    network.append(await self.cni.add(pod_id, netns, runtime_config=cfg.cni_runtime_config()))

        await together(start, add_network)
        failpoint("run:after-network")
        ip, extra, raw = "", (), None
        if network:
            ip, extra = primary_ip(network[0])
            raw = network[0].raw
        try:
            write_pod_files(self._pod_files_dir(pod_id), cfg, (ip, *extra) if ip else extra)
        except OSError as exc:
            raise Internal(f"cannot write the pod's hosts, resolv.conf and hostname files: {exc}") from None
        with phase("store update"):
            self.store.update(pod_id, state=PodState.READY, pid=started[0].pid, cni_result=raw, ip=ip,
                              additional_ips=tuple(extra))
        failpoint("run:after-ready")

    def _shim_options(self, cfg: PodSandboxConfig, handler: str, pause: dict[str, Any]) -> dict[str, Any]:
        """CreateSandbox's options: the config's, the runtime handler's and ``pause``, the pause's
        confinement (:func:`.security.pause_fields`)."""
        options = {**cfg.to_shim_options(), "runtime_handler": handler}
        options["linux"] = {**options["linux"], "pause_process": pause}
        if not cfg.cgroup_parent and self.cgroup_parent:
            options["linux"] = {**options["linux"], "cgroup_parent": self.cgroup_parent}
        if handler == NATIVE and self.pause_binary is not None:
            options["pause_binary"] = self.pause_binary
        return options

    async def _sandbox_rootfs(self, pod_id: str, cfg: PodSandboxConfig, options: dict[str, Any]) -> list[dict[str, Any]]:
        """The pause from the sandbox image: the image (pulled when missing) recorded on the pod,
        ``options`` given its ``pause_image`` (Entrypoint + Cmd, Env, WorkingDir) and its User
        (unless the pod names one), and the mounts of its snapshot ``sandbox-<pod id>``. Raises
        the pull's errors, FailedPrecondition for an image without a program or without a
        snapshotter to run it from."""
        image = await self._sandbox_image()
        if self.snapshots is None:
            raise FailedPrecondition(f"sandbox image {self.sandbox_image!r} cannot run: this runtime has no "
                                     "snapshotter")
        args = [*(image.config.get("Entrypoint") or []), *(image.config.get("Cmd") or [])]
        if not args:
            raise FailedPrecondition(f"sandbox image {self.sandbox_image!r} has neither Entrypoint nor Cmd: "
                                     "it names no pause program")
        options.pop("pause_binary", None)  # the image's program is the pause
        options["pause_image"] = {"args": args, "env": list(image.config.get("Env") or []),
                                  "cwd": image.config.get("WorkingDir") or "/", "image": image.name}
        user = str(image.config.get("User") or "")
        if user:  # only the user changes: the rest of the pause's confinement stands (_shim_options)
            pause = {**options["linux"]["pause_process"],
                     "user": security.pause_user(cfg.security, user, await self._user_files(image))}
            options["linux"] = {**options["linux"], "pause_process": pause}
        # Recorded before the snapshot is made: a rollback, RemoveImage and GC see it from then on.
        with phase("store update"):
            self.store.update(pod_id, sandbox_image=image.name, sandbox_image_id=image.image_id)
        with phase("sandbox snapshot"):
            mounts = mount_dicts(await call(self.snapshots.prepare, sandbox_snapshot_key(pod_id), image.chain_id))
        failpoint("run:after-sandbox-snapshot")
        return mounts

    async def _sandbox_image(self) -> ContainerImage:
        """The sandbox image from the store, pulled first when the store lacks it (as containerd
        pulls its sandbox_image on demand); the pull's errors as they are."""
        try:
            return await call(self.images.container_image, self.sandbox_image)
        except NotFound:
            if self.pull is None:
                raise
        with phase("pull sandbox image"):
            await self.pull(self.sandbox_image)
        return await call(self.images.container_image, self.sandbox_image)

    def _pod_files_dir(self, pod_id: str) -> str:
        """The pod's own directory of files (hosts, resolv.conf, hostname: :mod:`.podfiles`)."""
        return os.path.join(self.store.root, POD_FILES_DIR, pod_id)

    async def _rollback(self, record: PodRecord) -> None:
        """Undo whatever of a pod exists; every step tolerates what is already gone."""
        await self._teardown_network(record, strict=False)
        await self._shutdown_sandbox(record.pod_id)
        await self._remove_sandbox_rootfs(record)
        remove_pod_files(self._pod_files_dir(record.pod_id))
        self.store.delete(record.pod_id)

    async def _teardown_network(self, record: PodRecord, *, strict: bool) -> None:
        cfg = PodSandboxConfig.from_json(record.config)
        if self.cni is None or cfg.host_network:
            return
        try:  # a netns that is gone is fine: CNI DEL is told so (CniRunner.delete)
            await self.cni.delete(record.pod_id, record.netns_path, prev_result=record.cni_result,
                                  runtime_config=cfg.cni_runtime_config())
        except RpcError as exc:
            if strict:
                raise
            log.warning("pod %s: CNI DEL failed during rollback: %s", record.pod_id, exc)

    async def _shutdown_sandbox(self, pod_id: str) -> None:
        await self._load(pod_id)  # NotFound must mean gone, not "made by another process"
        try:
            await self.controller.shutdown(self.namespace, pod_id)
        except NotFound:
            pass

    def _pod(self, pod_id: str) -> PodRecord:
        if not isinstance(pod_id, str) or not pod_id:
            raise InvalidArgument("a pod id (or a unique prefix of one) is required")
        return self.store.get_by_prefix(pod_id)

    def _pod_or_none(self, pod_id: str) -> PodRecord | None:
        """The pod, or None when no pod has this id: removed, or never seen. CRI's stop and remove
        "must not return an error if not found" (containerd answers them OK)."""
        try:
            return self._pod(pod_id)
        except NotFound:
            return None

    async def stop_pod_sandbox(self, pod_id: str) -> None:
        """StopPodSandbox: containers stopped, network torn down, sandbox stopped: NOTREADY.

        Idempotent: stopping a stopped, removed or unknown pod succeeds, and a pod whose shim is
        already dead stops too. Raises FailedPrecondition for a pod still being created.
        """
        record = self._pod_or_none(pod_id)
        if record is None:
            return
        async with self._hold(record.pod_id):
            try:
                record = self.store.get(record.pod_id)
            except NotFound:
                return  # another process removed it while this one waited for its lock
            await self._stop(record)

    async def _stop(self, record: PodRecord) -> None:
        if record.state is PodState.CREATING:  # only a crash leftover: its RunPodSandbox held the lock
            raise FailedPrecondition(f"pod {record.pod_id} is still being created")
        # The pause's exit event is this stop's doing, and the stop writes NOTREADY itself: the
        # follower leaves it alone meanwhile. A stop that fails leaves the record to be asked
        # about again (not current) in case the pause exited all the same.
        self._stopping.add(record.pod_id)
        try:
            await self._stop_pod(record)
        except BaseException:
            self._current.discard(record.pod_id)
            raise
        finally:
            self._stopping.discard(record.pod_id)

    async def _stop_pod(self, record: PodRecord) -> None:
        for container in record.containers.values():
            await self._stop_container_quietly(container)
        failpoint("stop:after-containers")
        if not record.network_down:
            with phase("cni del"):
                await self._teardown_network(record, strict=True)
        failpoint("stop:after-network")
        await self._load(record.pod_id)
        try:
            with phase("StopSandbox"):
                await self.controller.stop(self.namespace, record.pod_id, timeout=SANDBOX_STOP_TIMEOUT)
        except NotFound:
            pass
        failpoint("stop:after-sandbox")
        if record.state is not PodState.NOTREADY or not record.network_down:
            with phase("store update"):
                self.store.update(record.pod_id, state=PodState.NOTREADY, network_down=True,
                                  stopped_at=record.stopped_at or time.time_ns())
            self._lifecycle("pod sandbox stopped", pod_id=record.pod_id, record=record)

    async def remove_pod_sandbox(self, pod_id: str) -> None:
        """RemovePodSandbox: force-stop if needed, remove containers, netns, shim and record.

        Idempotent: removing a removed or unknown pod succeeds.
        """
        record = self._pod_or_none(pod_id)
        if record is None:
            return
        async with self._hold(record.pod_id):
            try:
                record = self.store.get(record.pod_id)
            except NotFound:
                return  # another process removed it while this one waited for its lock
            if record.state is not PodState.NOTREADY:
                await self._stop(record)
                record = self.store.get(record.pod_id)
            failpoint("remove:after-stop")
            for container in list(record.containers.values()):
                # A pod that went NOTREADY on its own (its pause died) was not stopped: a
                # container of it may still run, and a running task cannot be deleted.
                await self._stop_container_quietly(container)
                await self._delete_task(container)
                await self._remove_rootfs(record.pod_id, container.container_id)
                await self._release_volumes(record.pod_id, container.container_id, container.image_volumes.values())
                self.store.delete_container(record.pod_id, container.container_id)
                self._events.publish(CONTAINER_DELETED, container.container_id, record.pod_id)
            failpoint("remove:after-containers")
            # A stop that was cut short may not have finished DEL: run it again (DEL is idempotent).
            if not record.network_down:
                with phase("cni del"):
                    await self._teardown_network(record, strict=True)
            with phase("ShutdownSandbox"):
                await self._shutdown_sandbox(record.pod_id)
            failpoint("remove:after-shutdown")
            await self._remove_sandbox_rootfs(record)
            default_logs = os.path.join(self.log_root, record.pod_id)
            remove_tree(default_logs, ignore_errors=True)
            remove_pod_files(self._pod_files_dir(record.pod_id))
            with phase("store delete"):
                self.store.delete(record.pod_id)
            self._lifecycle("pod sandbox removed", pod_id=record.pod_id, record=record)
            failpoint("remove:after-record")
            self._events.publish(CONTAINER_DELETED, record.pod_id, record.pod_id)

    async def pod_sandbox_status(self, pod_id: str, verbose: bool = False) -> dict[str, Any]:
        """PodSandboxStatus, CRI-shaped; ``verbose`` adds ``info`` (pid, netns, shim address, CNI)."""
        record = await self._refreshed(self._pod(pod_id))
        cfg = PodSandboxConfig.from_json(record.config)
        status = {
            "id": record.pod_id,
            "metadata": cfg.metadata.to_json(),
            "state": _POD_STATE[record.state],
            "created_at": record.created_at,
            "network": {"ip": record.ip, "additional_ips": [{"ip": ip} for ip in record.additional_ips]},
            "linux": {"namespaces": {"options": {
                "network": cfg.namespace_options.network,
                "pid": cfg.namespace_options.pid,
                "ipc": cfg.namespace_options.ipc,
            }}},
            "labels": record.labels,
            "annotations": record.annotations,
            "runtime_handler": record.runtime_handler,
        }
        if verbose:
            status["info"] = await self._verbose_info(record, cfg)
        return status

    async def _verbose_info(self, record: PodRecord, cfg: PodSandboxConfig) -> dict[str, Any]:
        info: dict[str, Any] = {"pid": record.pid or 0, "netns_path": record.netns_path,
                                "sandbox_namespace": record.sandbox_namespace}
        if record.sandbox_image:  # containerd's "image": the sandbox image
            info.update(image=record.sandbox_image, image_id=record.sandbox_image_id,
                        snapshot_key=sandbox_snapshot_key(record.pod_id))
        try:
            await self._load(record.pod_id)
            st = await self.controller.status(self.namespace, record.pod_id, verbose=True)
            info.update(shim_address=st.address, sandbox_state=st.state, shim=dict(st.info))
        except RpcError as exc:
            info.update(shim_address="", sandbox_state="unknown", shim_error=str(exc))
        if cfg.host_network:
            info["network"] = "host network: no CNI"
        elif self.cni is None or self.cni.config() is None:
            info["network"] = "no CNI config: the pod has a network namespace with loopback only"
        else:
            info["network"] = f"CNI network {self.cni.config().name!r}"
            info["cni_result"] = record.cni_result
            if record.state is PodState.READY:
                try:
                    await self.cni.check(record.pod_id, record.netns_path, prev_result=record.cni_result,
                                         runtime_config=cfg.cni_runtime_config())
                    info["cni_check"] = "ok"
                except RpcError as exc:
                    info["cni_check"] = await self._check_failed(record, exc)
        return info

    async def _check_failed(self, record: PodRecord, exc: RpcError) -> str:
        """What a failed CNI CHECK of a READY pod means: on a pod whose interface holds the
        addresses ADD gave it, a plugin that cannot CHECK (Debian's portmap 1.1.1 on IPv6), a
        WARNING and not an error; otherwise the error."""
        if not await addresses_in_place(record.netns_path, record.cni_result):
            return str(exc)
        log.warning("pod %s: %s; its network works (its interface has the addresses CNI ADD gave it), so the "
                    "plugin cannot CHECK it", record.pod_id, exc.message, extra={"pod_id": record.pod_id})
        return f"warning: {exc.message}; the pod's network works (its interface has the addresses CNI ADD gave it)"

    async def _refreshed(self, record: PodRecord) -> PodRecord:
        """The record, marked NOTREADY if its pause is no longer running. Raises NotFound if
        another process removed the pod meanwhile."""
        if record.state is not PodState.READY or record.pod_id in self._current:
            return record  # kept current by its shim's events (_follow)
        self._follow_soon(record.pod_id)
        if await self._sandbox_running(record) is False:
            return self._mark_notready(record.pod_id) or self.store.get(record.pod_id)
        return record

    async def pod_network(self, pod_id: str) -> tuple[str, str]:
        """Where a READY pod's network is, for PortForward: its full id and the path of its network
        namespace, "" for a host-network pod (the host's). Raises NotFound, FailedPrecondition (not ready)."""
        record = await self._refreshed(self._pod(pod_id))
        if record.state is not PodState.READY:
            raise FailedPrecondition(f"pod {record.pod_id} is not ready (it is {record.state}): its network is gone")
        if PodSandboxConfig.from_json(record.config).host_network:
            return record.pod_id, ""
        return record.pod_id, record.netns_path

    def _config_of(self, record: PodRecord) -> PodSandboxConfig:
        """The record's config, parsed once per stored record (the store hands out the same
        record object until its file changes); only the last :data:`_CONFIGS_KEPT` are kept."""
        cached = self._configs.get(record.pod_id)
        if cached is not None and cached[0] is record:
            return cached[1]
        cfg = PodSandboxConfig.from_json(record.config)
        keep_newest(self._configs, record.pod_id, (record, cfg), _CONFIGS_KEPT)
        return cfg

    def _entry_of(self, record: PodRecord) -> PodEntry:
        """The record's ListPodSandbox entry, made once per stored record as :meth:`_config_of`
        parses (a listing is podshimd's most frequent call). It is never stale: a record does
        not change, a pod that changes is a new record (the store's), and the entry is of the
        record in hand. It is read-only all through, over copies nobody else holds, so the same
        entry always says the same: a caller may keep what it makes of an entry for as long as
        it is given the same entry (podshimd keeps each pod's encoded PodSandbox so): a
        :class:`PodEntry`, which only this makes."""
        kept = self._entries.get(record.pod_id)
        if kept is not None and kept[0] is record:
            return kept[1]
        config = record.config
        entry = PodEntry({
            "id": record.pod_id, "metadata": MappingProxyType(dict(config.get("metadata") or {})),
            "state": _POD_STATE[record.state], "created_at": record.created_at,
            "labels": MappingProxyType(record.labels), "annotations": MappingProxyType(record.annotations),
            "runtime_handler": record.runtime_handler, "ip": record.ip,
            "host_network": self._config_of(record).host_network})
        keep_newest(self._entries, record.pod_id, (record, entry), _CONFIGS_KEPT)
        return entry

    async def list_pod_sandbox(self, filter: Mapping[str, Any] | None = None) -> list[PodEntry]:
        """ListPodSandbox: pods, newest first, filtered by ``id`` (prefix), ``state``
        (SANDBOX_READY / SANDBOX_NOTREADY) and ``label_selector`` (all must match). Each entry
        (id, metadata, state, created_at, labels, annotations, runtime_handler, ip, host_network)
        is a read-only :class:`PodEntry`."""
        f = filter or {}
        prefix, wanted, selector = f.get("id"), f.get("state"), f.get("label_selector")
        # Enum members bound once: each PodState.X costs a metaclass lookup, and these run per pod.
        creating, ready, current = PodState.CREATING, PodState.READY, self._current
        listed = self.store.list()
        # The store's list is a new one each time: used as it is, not copied.
        records: list[PodRecord | None] = [r for r in listed if r.pod_id.startswith(prefix)] if prefix else listed
        # A followed pod's record is current (its shim's events keep it so); the pause of any
        # other ready pod is asked after, all at once.
        stale = [(i, r) for i, r in enumerate(records) if r.state is ready and r.pod_id not in current]

        async def refresh(i: int, record: PodRecord) -> None:
            try:
                records[i] = await self._refreshed(record)
            except NotFound:
                records[i] = None  # removed by another process since the list was read

        if stale:
            async with anyio.create_task_group() as tg:
                for i, record in stale:
                    tg.start_soon(refresh, i, record)
        entries, out = self._entries, []
        for record in records:
            if record is None or record.state is creating:
                continue
            kept = entries.get(record.pod_id)  # _entry_of's own first look, without a call per pod
            out.append(kept[1] if kept is not None and kept[0] is record else self._entry_of(record))
        if wanted or selector:
            out = [entry for entry in out if (not wanted or entry["state"] == wanted)
                   and (not selector or _labels_match(entry["labels"], selector))]
        out.sort(key=_CREATED_AT, reverse=True)
        return out

    # -- containers -------------------------------------------------------------------------
    async def _task(self, pod_id: str, method: str, payload: dict[str, Any], timeout: float | None = CALL_TIMEOUT) -> Any:
        return await self._task_call(await self._shim(pod_id), pod_id, method, payload, timeout)

    async def _shim(self, pod_id: str) -> Any:
        """The connection to the pod's shim. Raises Unavailable or NotFound when it has none (gone)."""
        await self._load(pod_id)
        return self.controller.client_for(self.namespace, pod_id)

    @staticmethod
    async def _task_call(shim: Any, pod_id: str, method: str, payload: dict[str, Any],
                         timeout: float | None = CALL_TIMEOUT) -> Any:
        return await shim.call(TASK_SERVICE, method, {"sandbox_id": pod_id, **payload}, timeout=timeout)

    def _log_path(self, pod: PodRecord, cfg: ContainerConfig) -> str:
        base = PodSandboxConfig.from_json(pod.config).log_directory or os.path.join(self.log_root, pod.pod_id)
        relative = cfg.log_path or f"{cfg.metadata.name}_{cfg.metadata.attempt}.log"
        path = os.path.normpath(os.path.join(base, relative))
        if os.path.commonpath([path, os.path.normpath(base)]) != os.path.normpath(base):
            raise InvalidArgument(f"log_path {relative!r} escapes the pod's log directory")
        # Below the pod's log directory (kubelet's, or ours), the log goes to its own path only:
        # a link there (made by whatever can write there) would send it, and the directories the
        # shim makes for it, anywhere on the node. The file itself the shim opens O_NOFOLLOW.
        parts = os.path.relpath(path, os.path.normpath(base)).split("/")[:-1]
        for i in range(len(parts)):
            directory = os.path.join(base, *parts[:i + 1])
            try:
                st = os.lstat(directory)
            except FileNotFoundError:
                break  # made by the shim, below what exists
            except OSError as exc:
                raise FailedPrecondition(f"log_path {relative!r}: cannot look at {directory}: {exc.strerror}") from None
            if stat.S_ISLNK(st.st_mode):
                raise InvalidArgument(f"log_path {relative!r} goes through a symbolic link in the pod's log directory "
                                      f"({directory}), which podshim does not follow for a log file")
        return path

    async def create_container(self, pod_id: str, config: ContainerConfig | Mapping[str, Any],
                               sandbox_config: PodSandboxConfig | Mapping[str, Any] | None = None) -> str:
        """CreateContainer in a READY pod; returns the container id.

        ``sandbox_config`` is CRI's copy of the pod's config, sent along by kubelet: when given,
        it must be the pod's (same metadata and log directory), since the pod's own config is
        what the container is made from. Raises NotFound (pod), FailedPrecondition (pod not
        READY), InvalidArgument (config, or a sandbox_config of another pod), AlreadyExists
        (same name and attempt in the pod).
        """
        cfg = config if isinstance(config, ContainerConfig) else ContainerConfig.from_json(config)
        pod = self._pod(pod_id)
        if sandbox_config is not None:
            _check_sandbox_config(pod, sandbox_config)
        async with self._hold(pod.pod_id):
            pod = await self._refreshed(self.store.get(pod.pod_id))
            if pod.state is not PodState.READY:
                raise FailedPrecondition(f"pod {pod.pod_id} is not ready ({_POD_STATE[pod.state]})")
            pod_cfg = PodSandboxConfig.from_json(pod.config)
            _check_pod_namespaces(cfg, pod_cfg)
            container_id = _new_id()
            log_path = self._log_path(pod, cfg)
            image = await self._container_image(cfg)
            process = container_process(cfg, image.config if image else None,
                                        hostname=pod_cfg.hostname or socket.gethostname())
            volume_ids = await self.image_volumes.resolve(cfg.mounts)
            if volume_ids and pod_cfg.namespace_options.userns is not None:
                raise InvalidArgument(f"mount {next(iter(volume_ids))} is an image volume, which podshim cannot "
                                      "id-map yet: a pod with a user namespace cannot have one")
            confinement = security.task_fields(cfg.security, pod_privileged=pod_cfg.security.privileged,
                                               read_file=await self._user_files(image), image_user=process.image_user)
            devices = cdi.resolve(cfg.cdi_devices, self.cdi_spec_dirs)
            env = cdi.merge_env(process.env, devices.env)
            user = confinement["user"]
            user["additional_gids"] = sorted({*user["additional_gids"], *devices.additional_gids})
            # The record comes first: whatever is made for the container from here on (its
            # snapshot, its task) is found through it, by a rollback or after a crash.
            self.store.add_container(ContainerRecord(
                container_id, pod.pod_id, cfg.to_json(), log_path=log_path,
                image_id=image.image_id if image else "", image_ref=image.image_ref if image else "",
                image_volumes=volume_ids))
            try:
                volumes = await self.image_volumes.mount(pod.pod_id, cfg.mounts, volume_ids)
                mounts = container_mounts(cfg.mounts, self._pod_files(pod.pod_id), readonly_rootfs=cfg.readonly_rootfs,
                                          image_sources=volumes)
                mounts += devices.mounts
                rootfs = await self._prepare_rootfs(container_id, image)
                failpoint("create:after-rootfs")
                await self._task(pod.pod_id, "Create", {
                    "task_id": container_id, "args": list(process.args), "env": env,
                    "cwd": process.cwd, "log_path": log_path, "pid_mode": cfg.pid_mode, "labels": dict(cfg.labels),
                    "pid_target": self._pid_target(pod.pod_id, cfg),
                    "rootfs": rootfs, "readonly_rootfs": cfg.readonly_rootfs, "mounts": mounts, "stdin": cfg.stdin,
                    "terminal": cfg.tty, "resources": cfg.shim_resources,
                    "devices": [device.to_json() for device in cfg.devices] + devices.devices,
                    **confinement})
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await self._remove_rootfs(pod.pod_id, container_id)
                    await self._release_volumes(pod.pod_id, container_id, volume_ids.values())
                    self.store.delete_container(pod.pod_id, container_id)
                raise
        self._events.publish(CONTAINER_CREATED, container_id, pod.pod_id)
        self._lifecycle("container %s created", cfg.metadata.name, pod_id=pod.pod_id, container_id=container_id)
        return container_id

    async def _container_image(self, cfg: ContainerConfig) -> ContainerImage | None:
        """The image the container names (None: it names none and runs on a root of its own, empty
        but for its mounts). NotFound when the store does not have it."""
        if not cfg.image:
            return None
        return await call(self.images.container_image, cfg.image)

    def _pid_target(self, pod_id: str, cfg: ContainerConfig) -> str | None:
        """The task whose pid namespace a TARGET container joins: its target, a container of the
        same pod (InvalidArgument otherwise, as containerd's validateTargetContainer)."""
        if cfg.pid_mode != "TARGET":
            return None
        try:
            target = self.store.find_container(cfg.target_id)
        except NotFound:
            target = None
        if target is None or target.pod_id != pod_id:
            raise InvalidArgument(f"target container {cfg.target_id!r} of pid mode TARGET is not a container "
                                  f"of pod {pod_id}")
        return target.container_id

    async def _user_files(self, image: ContainerImage | None) -> security.ReadFile:
        """``read_file`` for the container's /etc/passwd and /etc/group: its image's (read from
        the snapshotter), or the node's for a container without an image (whose root has none)."""
        if image is None or self.snapshots is None:
            return security.host_read_file
        files: dict[str, bytes | None] = {}
        for path in security.USER_FILES:
            try:
                files[path] = await call(self.snapshots.read_file, image.chain_id, path)
            except FileNotFoundError:
                files[path] = None
        return files.get

    def _pod_files(self, pod_id: str) -> dict[str, str]:
        """Container path → node path of the pod's hosts, resolv.conf and hostname; {} for a pod
        made before podshim wrote them."""
        files = PodFiles(self._pod_files_dir(pod_id))
        return {path: source for path, source in files.mounts().items() if os.path.exists(source)}

    async def _prepare_rootfs(self, container_id: str, image: ContainerImage | None) -> list[dict[str, Any]]:
        """The container's root filesystem mounts: a writable snapshot of its image, keyed by the
        container's id; [] without an image (the shim binds the node's / read-only)."""
        if image is None:
            return []
        if self.snapshots is None:
            raise FailedPrecondition(f"image {image.name!r} is there but this runtime has no snapshotter to make "
                                     "a container's root filesystem from it")
        return mount_dicts(await call(self.snapshots.prepare, container_id, image.chain_id))

    async def _remove_rootfs(self, pod_id: str, container_id: str) -> None:
        """Remove a container's snapshot (none, or gone already: no error). A failure is logged,
        not raised: the snapshot's key is the container id, and the next recovery removes
        snapshots of containers that are no more."""
        if self.snapshots is None:
            return
        try:
            await call(self.snapshots.remove, container_id)
        except Exception as exc:  # noqa: BLE001 (logged; recovery sweeps it)
            log.warning("pod %s: removing the root filesystem snapshot %s failed: %s", pod_id, container_id, exc)

    async def _remove_sandbox_rootfs(self, record: PodRecord) -> None:
        """Remove the pod's sandbox image snapshot, if it has one (the shim unmounted it at
        shutdown; the image is recorded on the pod before its snapshot is made)."""
        if self.snapshots is not None and record.sandbox_image_id:
            with phase("sandbox snapshot removal"):
                await self._remove_rootfs(record.pod_id, sandbox_snapshot_key(record.pod_id))

    def image_user(self, image_id: str) -> str:
        """Who uses image ``image_id`` and what to remove before it ("" when nothing does): a
        container, a container as an image volume, or a pod as its sandbox image. RemoveImage
        refuses the image meanwhile."""
        if self.image_in_use(image_id):
            return "a container; remove the container first"
        for c in self.store.list_containers():
            paths = [path for path, used in c.image_volumes.items() if used == image_id]
            if paths:
                return f"container {c.container_id} as its image volume at {paths[0]}; remove the container first"
        pods = [record.pod_id for record in self.store.list() if record.sandbox_image_id == image_id]
        if pods:
            return f"pod {pods[0]} as its sandbox image; remove the pod first"
        return ""

    def image_in_use(self, image_id: str) -> list[str]:
        """The ids of the containers (in any state) made from image ``image_id``: while there
        are any, :meth:`image_user` names a container (RemoveImage refuses the image)."""
        return [c.container_id for c in self.store.list_containers() if c.image_id == image_id]

    def _container(self, container_id: str) -> ContainerRecord:
        if not isinstance(container_id, str) or not container_id:
            raise InvalidArgument("a container id (or a unique prefix of one) is required")
        return self.store.find_container(container_id)

    async def start_container(self, container_id: str) -> None:
        """StartContainer; FailedPrecondition unless it is CREATED."""
        c = self._container(container_id)
        async with self._hold(c.pod_id):
            c = self.store.get_container(c.pod_id, c.container_id)
            if c.state is not ContainerState.CREATED:
                raise FailedPrecondition(f"container {c.container_id} is {c.state}, not CREATED")
            started = await self._task(c.pod_id, "Start", {"task_id": c.container_id})
            self.store.update_container(c.pod_id, c.container_id, state=ContainerState.RUNNING,
                                        pid=started["pid"], started_at=started["started_at"])
        self._events.publish(CONTAINER_STARTED, c.container_id, c.pod_id)
        self._lifecycle("container started (pid %s)", started["pid"], pod_id=c.pod_id, container_id=c.container_id)

    def _container_or_none(self, container_id: str) -> ContainerRecord | None:
        """The container, or None when no container has this id: removed, or never seen (as
        :meth:`_pod_or_none`)."""
        try:
            return self._container(container_id)
        except NotFound:
            return None

    async def stop_container(self, container_id: str, timeout: float | None = None) -> None:
        """StopContainer: SIGTERM, SIGKILL after ``timeout`` seconds (0: at once). Idempotent:
        stopping an exited, removed or unknown container succeeds."""
        c = self._container_or_none(container_id)
        if c is None:
            return
        async with self._hold(c.pod_id):
            try:
                c = self.store.get_container(c.pod_id, c.container_id)
            except NotFound:
                return  # removed while this call waited for the pod's lock
            await self._stop_container(c, CONTAINER_STOP_TIMEOUT if timeout is None else timeout)

    async def _stop_container_quietly(self, c: ContainerRecord) -> None:
        """Stop a container of a pod being stopped or removed, at once and best effort (as
        containerd: the sandbox stop kills it anyway); a failure is logged."""
        try:
            await self._stop_container(c, 0)
        except RpcError as exc:
            log.warning("pod %s: stopping container %s failed: %s", c.pod_id, c.container_id, exc)

    async def _stop_container(self, c: ContainerRecord, timeout: float) -> None:
        c = await self._refresh_container(c)
        if c.state is not ContainerState.RUNNING:
            if c.state is ContainerState.CREATED:  # never started: it simply will not run
                self.store.update_container(c.pod_id, c.container_id, state=ContainerState.EXITED,
                                            finished_at=time.time_ns(), exit_code=0, reason="NeverStarted")
            return
        try:
            if timeout > 0:
                await self._task(c.pod_id, "Kill", {"task_id": c.container_id, "signal": int(STOP_SIGNAL)})
                try:
                    done = await self._task(c.pod_id, "Wait", {"task_id": c.container_id}, timeout=timeout)
                    self._exited(c, done)
                    return
                except DeadlineExceeded:
                    pass
            await self._task(c.pod_id, "Kill", {"task_id": c.container_id, "signal": int(signal.SIGKILL), "all": True})
            self._exited(c, await self._task(c.pod_id, "Wait", {"task_id": c.container_id}))
        except (Unavailable, NotFound):
            self._shim_gone(c)

    def _exited(self, c: ContainerRecord, done: Mapping[str, Any]) -> ContainerRecord:
        """The container EXITED as the shim's exit (Wait, State or ``/tasks/exit``) says."""
        code = done.get("exit_status", UNKNOWN_EXIT_CODE)
        reason = exit_reason(code, done.get("oom_killed") is True)
        exited = self.store.update_container(c.pod_id, c.container_id, state=ContainerState.EXITED, exit_code=code,
                                             finished_at=done.get("exited_at") or time.time_ns(), reason=reason)
        self._lifecycle("container exited with status %s (%s)", code, reason, pod_id=c.pod_id,
                        container_id=c.container_id)
        return exited

    def _shim_gone(self, c: ContainerRecord) -> ContainerRecord:
        return self.store.update_container(c.pod_id, c.container_id, state=ContainerState.EXITED,
                                           exit_code=UNKNOWN_EXIT_CODE, finished_at=c.finished_at or time.time_ns(),
                                           reason="Unknown", message="the pod's shim is gone")

    async def _refresh_container(self, c: ContainerRecord) -> ContainerRecord:
        """Bring the record up to date with the shim (a container may have exited on its own)."""
        if c.state is ContainerState.EXITED or c.pod_id in self._current:
            return c  # an exit of a followed pod's container is in its record already (_follow)
        return await self._ask_container(c)

    async def _ask_container(self, c: ContainerRecord) -> ContainerRecord:
        if c.state is ContainerState.EXITED:
            return c
        try:
            st = await self._task_call(await self._shim(c.pod_id), c.pod_id, "State", {"task_id": c.container_id})
        except Unavailable:
            return self._shim_gone(c)
        except NotFound:
            if c.state is ContainerState.CREATED:
                # A live shim without the task: its CreateContainer has not made it yet (in flight
                # here or in another process), or died before it did (recovery removes the record).
                return c
            return self.store.update_container(c.pod_id, c.container_id, state=ContainerState.EXITED,
                                               exit_code=UNKNOWN_EXIT_CODE, finished_at=c.finished_at or time.time_ns(),
                                               reason="Unknown", message="its task is gone from the pod's shim")
        state = _TASK_STATE.get(st.get("status"), c.state)
        if state is c.state:
            return c
        if state is ContainerState.EXITED:
            return self._exited(c, st)
        return self.store.update_container(c.pod_id, c.container_id, state=state, pid=st.get("pid"),
                                           started_at=st.get("started_at") or c.started_at)

    async def _delete_task(self, c: ContainerRecord) -> None:
        try:
            await self._task(c.pod_id, "Delete", {"task_id": c.container_id})
        except (Unavailable, NotFound):
            pass  # the shim or the task is gone already

    async def remove_container(self, container_id: str) -> None:
        """RemoveContainer: force-stops a running container, then forgets it. Idempotent:
        removing a removed or unknown container succeeds."""
        c = self._container_or_none(container_id)
        if c is None:
            return
        async with self._hold(c.pod_id):
            try:
                c = self.store.get_container(c.pod_id, c.container_id)
            except NotFound:
                return  # removed while this call waited for the pod's lock
            await self._stop_container(c, 0)
            await self._delete_task(c)
            await self._remove_rootfs(c.pod_id, c.container_id)
            await self._release_volumes(c.pod_id, c.container_id, c.image_volumes.values())
            self.store.delete_container(c.pod_id, c.container_id)
        self._cpu_rates.forget(c.container_id)
        self._events.publish(CONTAINER_DELETED, c.container_id, c.pod_id)
        self._lifecycle("container removed", pod_id=c.pod_id, container_id=c.container_id)

    async def container_status(self, container_id: str, verbose: bool = False) -> dict[str, Any]:
        """ContainerStatus, CRI-shaped."""
        c = await self._refresh_container(self._container(container_id))
        cfg = ContainerConfig.from_json(c.config)
        status = {
            "id": c.container_id,
            "pod_sandbox_id": c.pod_id,
            "metadata": dict(c.config.get("metadata") or {}),
            "state": f"CONTAINER_{c.state}",
            "created_at": c.created_at,
            "started_at": c.started_at,
            "finished_at": c.finished_at,
            "exit_code": c.exit_code if c.exit_code is not None else 0,
            "image": {"image": cfg.image or NO_IMAGE},
            "image_ref": c.image_ref or NO_IMAGE,
            "reason": c.reason,
            "message": c.message,
            "labels": c.labels,
            "annotations": c.annotations,
            "log_path": c.log_path,
            "image_id": c.image_id or None,
            "stop_signal": f"SIGNAL_{STOP_SIGNAL.name}",
            "mounts": [mount_status(m, c.image_volumes) for m in cfg.mounts],
        }
        if c.state is ContainerState.RUNNING and c.pid:
            status["user"] = security.process_user(c.pid)
        if verbose:
            status["info"] = {"pid": c.pid or 0, "args": list(cfg.argv), "pid_mode": cfg.pid_mode,
                              "image_id": c.image_id, "snapshot_key": c.container_id if c.image_id else ""}
        return status

    async def list_containers(self, filter: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """ListContainers, filtered by ``id`` (prefix), ``pod_sandbox_id`` (prefix), ``state``
        (CONTAINER_CREATED / RUNNING / EXITED) and ``label_selector``."""
        f = dict(filter or {})
        out = []
        for c in self.store.list_containers():
            if f.get("id") and not c.container_id.startswith(f["id"]):
                continue
            if f.get("pod_sandbox_id") and not c.pod_id.startswith(f["pod_sandbox_id"]):
                continue
            try:
                c = await self._refresh_container(c)
            except Aborted:
                pass  # another process holds its pod's sandbox right now: listed as last recorded
            except NotFound:
                continue  # removed by another process since the list was read
            if f.get("state") and f"CONTAINER_{c.state}" != f["state"]:
                continue
            if not _labels_match(c.labels, f.get("label_selector")):
                continue
            out.append({"id": c.container_id, "pod_sandbox_id": c.pod_id,
                        "metadata": dict(c.config.get("metadata") or {}), "image": {"image": (c.config.get("image") or {}).get("image") or NO_IMAGE},
                        "image_ref": c.image_id or NO_IMAGE, "image_id": c.image_id or None,
                        "state": f"CONTAINER_{c.state}",
                        "created_at": c.created_at, "labels": c.labels, "annotations": c.annotations,
                        "exit_code": c.exit_code})
        out.sort(key=lambda c: c["created_at"], reverse=True)
        return out

    def container_log_path(self, container_id: str) -> str:
        """Where a container's CRI-format log is."""
        return self._container(container_id).log_path

    # -- running containers: exec, resources, logs ---------------------------------------------
    async def _running(self, container_id: str) -> ContainerRecord:
        """The container, brought up to date; FailedPrecondition unless it is RUNNING."""
        c = await self._refresh_container(self._container(container_id))
        if c.state is not ContainerState.RUNNING:
            raise FailedPrecondition(f"container {c.container_id} is not running (it is CONTAINER_{c.state})")
        return c

    async def exec_sync(self, container_id: str, cmd: list[str], timeout: int = 0) -> dict[str, Any]:
        """ExecSync: run ``cmd`` in a running container (its namespaces, cgroup, environment and
        working directory) until it exits; ``{exit_code, stdout, stderr}`` (bytes, each at most the
        shim's limit, 1 MiB: what is beyond is dropped, as containerd drops beyond its 16 MiB).

        ``timeout`` is in seconds (0: none); when it passes the command and its session are killed
        and DeadlineExceeded says so (containerd's answer, which kubelet reads as a probe that timed
        out). Raises InvalidArgument (bad cmd or timeout), NotFound, FailedPrecondition (not
        running; a program that cannot be run).
        """
        if not isinstance(cmd, (list, tuple)) or not cmd or not all(isinstance(a, str) for a in cmd):
            raise InvalidArgument("cmd must be a non-empty array of strings")
        if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 0:
            raise InvalidArgument(f"timeout must be a whole number of seconds, 0 or more, not {timeout!r}")
        c = await self._running(container_id)
        with about(c.pod_id, c.container_id):
            reply = await self._task(c.pod_id, "Exec", {"task_id": c.container_id, "args": list(cmd),
                                                        "timeout_secs": timeout or None},
                                     timeout=timeout + CALL_TIMEOUT if timeout else None)
            if reply.get("timed_out"):
                raise DeadlineExceeded(f"command {shlex.join(cmd)!r} timed out after {timeout} s and was killed")
            for stream in ("stdout", "stderr"):
                if reply.get(f"{stream}_truncated"):
                    log.info("exec %s: its %s was cut to the first %d bytes", shlex.join(cmd), stream,
                             len(reply.get(stream) or b""))
        return {"exit_code": reply["exit_status"], "stdout": bytes(reply.get("stdout") or b""),
                "stderr": bytes(reply.get("stderr") or b"")}

    async def exec_target(self, container_id: str) -> str:
        """The full id of a RUNNING container, for Exec and Attach. Raises NotFound, FailedPrecondition."""
        return (await self._running(container_id)).container_id

    async def exec_start(self, container_id: str, cmd: list[str], stdio: Mapping[str, Any]) -> tuple[str, str, str]:
        """Start ``cmd`` in a running container with ``stdio`` (ExecStart's ``stdin``, ``stdout``,
        ``stderr`` FIFO paths, or ``console_socket`` with ``console_width``/``console_height``, protocol.md 7.3) and return at once: ``(pod_id,
        container_id, exec_id)`` for :meth:`exec_wait` and :meth:`exec_kill`. Raises InvalidArgument,
        NotFound, FailedPrecondition (not running; a program that cannot be run)."""
        if not isinstance(cmd, (list, tuple)) or not cmd or not all(isinstance(a, str) for a in cmd):
            raise InvalidArgument("cmd must be a non-empty array of strings")
        c = await self._running(container_id)
        with about(c.pod_id, c.container_id):
            reply = await self._task(c.pod_id, "ExecStart", {"task_id": c.container_id, "args": list(cmd), **stdio})
        return c.pod_id, c.container_id, reply["exec_id"]

    async def exec_wait(self, pod_id: str, container_id: str, exec_id: str) -> int:
        """The exit status of an exec :meth:`exec_start` started, once it exited."""
        reply = await self._task(pod_id, "ExecWait", {"task_id": container_id, "exec_id": exec_id}, timeout=None)
        return int(reply["exit_status"])

    async def exec_kill(self, pod_id: str, container_id: str, exec_id: str) -> None:
        """Kill an exec :meth:`exec_start` started, and what it started in its session."""
        await self._task(pod_id, "ExecKill", {"task_id": container_id, "exec_id": exec_id})

    async def attach_target(self, container_id: str) -> dict[str, Any]:
        """What Attach needs of a RUNNING container: ``{pod_id, container_id, log_path, stdin, stdin_once,
        tty}``, ``stdin`` the path of the FIFO its shim keeps open ("" if it has none, or it was
        closed). Raises NotFound, FailedPrecondition."""
        c = await self._running(container_id)
        cfg = ContainerConfig.from_json(c.config)
        stdin = ""
        if cfg.stdin:
            stdin = (await self._task(c.pod_id, "State", {"task_id": c.container_id})).get("stdin") or ""
        return {"pod_id": c.pod_id, "container_id": c.container_id, "log_path": c.log_path, "stdin": stdin,
                "stdin_once": cfg.stdin_once, "tty": cfg.tty}

    async def attach_output(self, pod_id: str, container_id: str, fifos: Mapping[str, str]) -> None:
        """Have a container's shim copy its stdout and stderr from now on to ``fifos`` (AttachOutput's
        ``stdout``/``stderr`` FIFO paths, held open for reading by the caller)."""
        await self._task(pod_id, "AttachOutput", {"task_id": container_id, **fifos})

    async def resize_terminal(self, pod_id: str, container_id: str, width: int, height: int) -> None:
        """Set the size of a tty container's terminal (its process gets SIGWINCH). Raises InvalidArgument
        (out of range), FailedPrecondition (no terminal; not running)."""
        await self._task(pod_id, "ResizePty", {"task_id": container_id, "width": width, "height": height})

    async def close_stdin(self, pod_id: str, container_id: str) -> None:
        """Close a container's stdin for good (stdin_once): it reads end-of-file once writers are gone."""
        await self._task(pod_id, "CloseStdin", {"task_id": container_id})

    async def wait_task(self, pod_id: str, container_id: str) -> int:
        """The exit status of a container's process, once it exited."""
        return int((await self._task(pod_id, "Wait", {"task_id": container_id}, timeout=None))["exit_status"])

    async def update_container_resources(self, container_id: str, linux: Mapping[str, Any] | None) -> None:
        """UpdateContainerResources: apply CRI's LinuxContainerResources ``linux`` (proto field
        names; zero values mean "leave as it is") to a running container's cgroup. Raises
        InvalidArgument naming a field that cannot be applied (nothing is changed then), NotFound,
        FailedPrecondition (not running: a created container has no cgroup yet)."""
        resources = shim_resources(linux)
        c = await self._running(container_id)
        if not resources:
            return
        with about(c.pod_id, c.container_id):
            await self._task(c.pod_id, "Update", {"task_id": c.container_id, "resources": resources})
            log.info("container resources updated: %s", ", ".join(f"{k}={v}" for k, v in sorted(resources.items())))

    async def update_pod_sandbox_resources(self, pod_id: str, overhead: Mapping[str, Any] | None,
                                           resources: Mapping[str, Any] | None) -> None:
        """UpdatePodSandboxResources: apply CRI's pod-level LinuxContainerResources (``resources``
        plus ``overhead``, :func:`client.cri.resources.pod_resources`) to the pod's cgroup, which
        holds its pause and every container. Raises InvalidArgument naming a field that cannot be
        applied (nothing is changed then), NotFound, FailedPrecondition (the pod is not ready)."""
        wanted = pod_resources(overhead, resources)
        record = await self._refreshed(self._pod(pod_id))
        if record.state is not PodState.READY:
            raise FailedPrecondition(f"pod {record.pod_id} is not ready ({_POD_STATE[record.state]}): its cgroup "
                                     "is gone or going")
        if not wanted:
            return
        with about(record.pod_id):
            await self.controller.update(self.namespace, record.pod_id, wanted)
            log.info("pod resources updated: %s", ", ".join(f"{k}={v}" for k, v in sorted(wanted.items())))

    async def reopen_container_log(self, container_id: str) -> None:
        """ReopenContainerLog: the container's log file is opened again (created if it was moved),
        after a rotation. Raises NotFound, FailedPrecondition (not running; the file cannot be
        opened: the previous one stays in use)."""
        c = await self._running(container_id)
        with about(c.pod_id, c.container_id):
            await self._task(c.pod_id, "ReopenLog", {"task_id": c.container_id})

    # -- stats ---------------------------------------------------------------------------------
    async def container_stats(self, container_id: str) -> dict[str, Any]:
        """ContainerStats, CRI-shaped: its cgroup's cpu and memory figures; a figure the host
        cannot give (or a container that has none: never started, its shim gone) is left out."""
        return await self._container_stats(await self._refresh_container(self._container(container_id)))

    async def list_container_stats(self, filter: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """ListContainerStats of the running containers, filtered as :meth:`list_containers`
        (``id``, ``pod_sandbox_id``, ``label_selector``)."""
        found = await self.list_containers({**(filter or {}), "state": "CONTAINER_RUNNING"})
        out = []
        for entry in found:
            try:
                out.append(await self._container_stats(self.store.get_container(entry["pod_sandbox_id"], entry["id"])))
            except NotFound:
                continue  # removed meanwhile
        return out

    async def _container_stats(self, c: ContainerRecord) -> dict[str, Any]:
        doc: dict[str, Any] = {"attributes": stats.attributes(c.container_id, c.config.get("metadata") or {},
                                                              c.labels, c.annotations)}
        if c.state is ContainerState.CREATED:
            return doc
        try:
            reply = await self._task(c.pod_id, "Stats", {"task_id": c.container_id})
        except (Unavailable, NotFound):
            return doc  # the shim or the task is gone: no figures
        timestamp, data = reply.get("timestamp") or time.time_ns(), reply.get("data") or {}
        figures = {"cpu": stats.cpu_usage(c.container_id, timestamp, data, self._cpu_rates),
                   "memory": stats.memory_usage(timestamp, data), "swap": stats.swap_usage(timestamp, data),
                   "io": stats.io_usage(timestamp, data)}
        return {**doc, **{k: v for k, v in figures.items() if v}}

    async def pod_stats(self, pod_id: str) -> dict[str, Any]:
        """PodSandboxStats, CRI-shaped: the pod's cgroup (the pause and every container) and its
        running containers' stats. FailedPrecondition unless the pod is ready."""
        record = await self._refreshed(self._pod(pod_id))
        if record.state is not PodState.READY:
            raise FailedPrecondition(f"pod {record.pod_id} is not ready ({_POD_STATE[record.state]}): its sandbox "
                                     "has no usage to report")
        return await self._pod_stats(record)

    async def list_pod_stats(self, filter: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """ListPodSandboxStats of the ready pods, filtered by ``id`` (prefix) and ``label_selector``."""
        f = dict(filter or {})
        out = []
        for entry in await self.list_pod_sandbox({"id": f.get("id"), "state": "SANDBOX_READY",
                                                  "label_selector": f.get("label_selector")}):
            try:
                out.append(await self._pod_stats(self.store.get(entry["id"])))
            except (NotFound, FailedPrecondition):
                continue  # removed, or its shim died, meanwhile
        return out

    async def _pod_stats(self, record: PodRecord) -> dict[str, Any]:
        metrics = await self.controller.metrics(self.namespace, record.pod_id)
        timestamp, data = metrics.get("timestamp") or time.time_ns(), metrics.get("data") or {}
        containers = [await self._container_stats(c) for c in record.containers.values() if c.state is ContainerState.RUNNING]
        linux = {"cpu": stats.cpu_usage(record.pod_id, timestamp, data, self._cpu_rates),
                 "memory": stats.memory_usage(timestamp, data),
                 "process": stats.process_usage(timestamp, data),
                 "io": stats.io_usage(timestamp, data),
                 "containers": containers}
        return {"attributes": stats.attributes(record.pod_id, record.config.get("metadata") or {}, record.labels,
                                               record.annotations),
                "linux": {k: v for k, v in linux.items() if v}}

    # -- metrics -------------------------------------------------------------------------------
    async def list_pod_metrics(self) -> list[dict[str, Any]]:
        """ListPodSandboxMetrics of the ready pods (:mod:`client.cri.podmetrics`): each pod's
        cgroup and network figures and its running containers'; read only when asked."""
        out = []
        for entry in await self.list_pod_sandbox({"state": "SANDBOX_READY"}):
            try:
                record = self.store.get(entry["id"])
                reply = await self.controller.metrics(self.namespace, record.pod_id, details=True)
            except (NotFound, FailedPrecondition, Unavailable):
                continue  # removed, or its shim died, meanwhile
            metadata = record.config.get("metadata") or {}
            containers = [await self._container_metrics(metadata, c) for c in record.containers.values()
                          if c.state is ContainerState.RUNNING]
            out.append(podmetrics.pod_metrics(record.pod_id, metadata, reply.get("timestamp") or time.time_ns(),
                                              reply.get("data") or {}, [c for c in containers if c is not None]))
        return out

    async def _container_metrics(self, pod_metadata: Mapping[str, Any], c: ContainerRecord) -> dict[str, Any] | None:
        """One running container's metrics; None when its shim or task is gone meanwhile."""
        try:
            reply = await self._task(c.pod_id, "Stats", {"task_id": c.container_id, "details": True})
        except (Unavailable, NotFound):
            return None
        image = (c.config.get("image") or {}).get("image", "")
        return podmetrics.container_metrics(pod_metadata, c.container_id, c.metadata.name, image, c.started_at,
                                            reply.get("timestamp") or time.time_ns(), reply.get("data") or {},
                                            await self._writable_layer(c.container_id))

    async def _writable_layer(self, container_id: str) -> dict[str, Any] | None:
        """The container's writable layer: its usage and its filesystem's size and inodes; None
        when the container has no snapshot of this snapshotter (a root of its own)."""
        measure = getattr(self.snapshots, "active_usage", None)
        if measure is None:
            return None
        try:
            upper, used = await call(measure, container_id)
            fs = await call(os.statvfs, upper)
            device = await call(podmetrics.filesystem_device, upper)
        except (NotFound, OSError):
            return None
        return {"device": device, "usage_bytes": used.bytes, "limit_bytes": fs.f_blocks * fs.f_frsize,
                "inodes_total": fs.f_files, "inodes_free": fs.f_ffree}

    # -- events --------------------------------------------------------------------------------
    @asynccontextmanager
    async def events(self) -> AsyncIterator[EventStream]:
        """GetContainerEvents: ``async with pods.events() as events: async for event in events``.

        Containers and pods created, started and removed here, and every container or pause that
        exits (the shims' exit events, through the one stream per shim this process follows),
        from now on (:mod:`client.cri.events`). Every live pod is followed before it yields."""
        async with self._events.subscribe() as stream:
            for record in self.store.list():
                if record.state is PodState.READY:
                    await self._start_following(record.pod_id)
            yield stream

    async def _pod_ready(self, pod_id: str) -> None:
        self._events.publish(CONTAINER_CREATED, pod_id, pod_id)
        self._events.publish(CONTAINER_STARTED, pod_id, pod_id)

    # -- runtime config ------------------------------------------------------------------------
    @property
    def pod_cidr(self) -> str:
        """The node's pod CIDR(s) as UpdateRuntimeConfig last set them ("" if never)."""
        try:
            doc = read_json(self._runtime_config_path)
        except (OSError, ValueError):
            return ""
        return doc.get("pod_cidr", "") if isinstance(doc, dict) and isinstance(doc.get("pod_cidr"), str) else ""

    def update_runtime_config(self, pod_cidr: str) -> None:
        """UpdateRuntimeConfig: record the node's pod CIDR (one, or an IPv4 and an IPv6 one
        separated by a comma) and say what it changes. The CNI plugins' own config (conf dir)
        decides the pods' addresses: podshim writes no CNI config from it, as containerd without a
        ``conf_template``. An empty CIDR changes nothing. Raises InvalidArgument for a bad CIDR."""
        if not pod_cidr:
            return
        networks = []
        for part in pod_cidr.split(","):
            try:
                networks.append(ipaddress.ip_network(part.strip(), strict=False))
            except ValueError:
                raise InvalidArgument(f"pod CIDR {part.strip()!r} is not a network such as 10.244.0.0/24") from None
        text = ",".join(str(n) for n in networks)
        if text == self.pod_cidr:
            return
        write_json_atomic(self._runtime_config_path, {"pod_cidr": text})
        log.info("pod CIDR is now %s; the CNI config in %s still decides the pods' addresses (no config template)",
                 text, self.cni.conf_dir if self.cni is not None else "(none)")


def _check_pod_namespaces(cfg: ContainerConfig, pod_cfg: PodSandboxConfig) -> None:
    """InvalidArgument unless the container's network and IPC modes are POD or the pod's own, and its
    user namespace is the pod's: a container always joins its pod's network, IPC and user namespaces
    (as with containerd)."""
    for what, mode, pods in (("network", cfg.network_mode, pod_cfg.namespace_options.network),
                             ("ipc", cfg.ipc_mode, pod_cfg.namespace_options.ipc)):
        if mode not in ("POD", pods):
            raise InvalidArgument(f"linux.security_context.namespace_options.{what} {mode} cannot be applied: a "
                                  f"container joins its pod's {what} namespace, and the pod's is {pods}")
    if cfg.userns is not None and cfg.userns != pod_cfg.namespace_options.userns:
        raise InvalidArgument("linux.security_context.namespace_options.userns_options cannot be applied: a container "
                              "joins its pod's user namespace, and its mappings are not the pod's")


def exit_reason(exit_code: int, oom_killed: bool) -> str:
    """ContainerStatus's ``reason`` for an exit, as containerd gives it: ``OOMKilled`` when the
    shim says the kernel's OOM killer killed a process of the container (its cgroup's count, not
    a guess from the exit code), else ``Completed`` (0) or ``Error``."""
    if oom_killed:
        return "OOMKilled"
    return "Completed" if exit_code == 0 else "Error"


def _check_sandbox_config(pod: PodRecord, sandbox_config: PodSandboxConfig | Mapping[str, Any]) -> None:
    """InvalidArgument unless ``sandbox_config`` is the config of ``pod`` (metadata, log directory)."""
    given = sandbox_config if isinstance(sandbox_config, PodSandboxConfig) else PodSandboxConfig.from_json(sandbox_config)
    own = PodSandboxConfig.from_json(pod.config)
    if given.metadata.key != own.metadata.key:
        raise InvalidArgument(f"sandbox_config is for pod {given.metadata.key!r}, but pod {pod.pod_id} "
                              f"is {own.metadata.key!r}")
    if given.log_directory != own.log_directory:
        raise InvalidArgument(f"sandbox_config has log_directory {given.log_directory!r}, but pod {pod.pod_id} "
                              f"was run with {own.log_directory!r}")


_T = TypeVar("_T")


def keep_newest(kept: dict[str, _T], pod_id: str, value: _T, limit: int) -> None:
    """``value`` kept under ``pod_id`` as the newest of at most ``limit`` (a per-pod cache: the
    pod layer's parsed configs and list entries, podshimd's encoded PodSandboxes): a pod's older
    value is replaced (it pushes no other pod out); else the oldest pod's goes."""
    if kept.pop(pod_id, None) is None and len(kept) >= limit:
        kept.pop(next(iter(kept)))
    kept[pod_id] = value


def _labels_match(labels: Mapping[str, str], selector: Mapping[str, str] | None) -> bool:
    return all(labels.get(k) == v for k, v in (selector or {}).items())


@asynccontextmanager
async def open_pod_service(root: str = "/var/lib/podshim", runtime_root: str = "/run/podshim", *,
                           cni_conf_dir: str = DEFAULT_CONF_DIR, cni_bin_dirs: tuple[str, ...] = DEFAULT_BIN_DIRS,
                           cni_plugin_netns: str | None = None, namespace: str = DEFAULT_NAMESPACE,
                           spawner: Any = "exec", template: bool | None = None,
                           **options: Any) -> AsyncIterator[PodService]:
    """Open the pod service over ``root``: the Controller's bundles in ``root/sandboxes``, pod
    records in ``root/pods``, default container logs in ``root/logs``. ``root`` is marked as
    podshimd's state root and ``root/sandboxes`` as a bundle root (docs/roots.md); a root marked
    as another layout is refused (FailedPrecondition). Reconnects to live shims
    and recovers the store before yielding; closes connections (never the shims) on exit.
    ``spawner`` and ``template`` are the Controller's; ``options`` are :class:`PodService`'s
    (runtime handlers, cgroup parent, pause binary).
    """
    if not os.path.isabs(root):
        raise InvalidArgument(f"root {root!r} must be an absolute path")
    ensure_private_dir(root, 0o711, keep_mode=True)
    layouts.claim(root, layouts.POD_ROOT)
    bundle_root = os.path.join(root, layouts.SANDBOXES_DIR)
    ensure_private_dir(bundle_root, 0o711, keep_mode=True)
    layouts.claim(bundle_root, layouts.BUNDLE_ROOT)
    # Made here, not as a parent of the first log directory the shim makes: a link planted
    # there would take every pod's default logs elsewhere.
    ensure_private_dir(os.path.join(root, "logs"), 0o755, keep_mode=True)
    store = PodStore(root)
    cni = CniRunner(cni_conf_dir, cni_bin_dirs, plugin_netns=cni_plugin_netns)
    async with Controller(state_root=bundle_root, runtime_root=runtime_root,
                          spawner=spawner, template=template) as controller:
        service = PodService(controller, store, cni=cni, namespace=namespace, log_root=os.path.join(root, "logs"),
                             **options)
        # Entered by hand, not with async with: an error of the caller's block must come out as
        # it is, not wrapped in the task group's ExceptionGroup.
        followers = anyio.create_task_group()
        await followers.__aenter__()
        try:
            service.keep_current(followers)
            await service.recover()
            yield service
        finally:
            followers.cancel_scope.cancel()
            await followers.__aexit__(None, None, None)
