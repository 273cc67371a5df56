"""The pod service's shared state and the steps every RPC group uses: finding a pod or a
container, holding a pod, calling its shim, logging its lifecycle; the pod layer's constants."""

from __future__ import annotations

import functools
import logging
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel
import anyio.to_thread

from shim.api.handlers import NATIVE, RUNTIME_HANDLERS  # "native" (the default, also for ""), "runc", "crun"
from shim.api.names import TASK_SERVICE
from shim.cri.configs import ContainerConfig, PodSandboxConfig
from shim.rpc.status import Aborted, InvalidArgument, NotFound

from client.controller import Controller
from client.controller.bundles import bundle_path
from client.cri import cdi, stats
from client.cri.cni import CniRunner
from client.cri.events import EventFeed
from client.cri.imagevolumes import VOLUMES_DIR, ImageVolumes
from client.cri.rootfs import ImageLookup, NoImages, Snapshotter
from client.cri.store import ContainerRecord, PodRecord, PodState, PodStore

if TYPE_CHECKING:
    from shim.cri.security import ReadFile

    from client.cri.rootfs import ContainerImage

__all__ = ["DEFAULT_NAMESPACE", "SANDBOX_STOP_TIMEOUT", "CONTAINER_STOP_TIMEOUT",
           "CALL_TIMEOUT", "NO_IMAGE", "POD_FILES_DIR", "UNKNOWN_EXIT_CODE", "POD_STATE",
           "SANDBOX_SNAPSHOT_PREFIX", "PodEntry", "PodServiceBase", "sandbox_snapshot_key", "new_id",
           "keep_newest", "labels_match", "parsed_once"]

log = logging.getLogger("client.cri.pod")  # one logger for the pod layer's lines, whichever module writes them

#: The Controller namespace pods live in (containerd's CRI uses k8s.io).
DEFAULT_NAMESPACE = "k8s.io"
#: Seconds the pause gets between SIGTERM and SIGKILL when a pod stops.
SANDBOX_STOP_TIMEOUT = 2.0
#: Default grace for StopContainer when the caller gives none.
CONTAINER_STOP_TIMEOUT = 10.0
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
POD_STATE = {PodState.READY: "SANDBOX_READY", PodState.NOTREADY: "SANDBOX_NOTREADY",
             PodState.CREATING: "SANDBOX_NOTREADY"}
#: How many parsed pod configs a PodService keeps (listings parse each pod's once).
_CONFIGS_KEPT = 4096
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


def new_id() -> str:
    """A 64-hex-digit id, like CRI's."""
    return secrets.token_hex(32)


class PodServiceBase:
    """What every part of the pod service shares: the Controller, the store, the caches, the locks."""

    def __init__(self, controller: Controller, store: PodStore, *, cni: CniRunner | None,
                 namespace: str = DEFAULT_NAMESPACE, log_root: str,
                 runtime_handlers: tuple[str, ...] = RUNTIME_HANDLERS, default_runtime_handler: str = NATIVE,
                 cgroup_parent: str = "", cgroup_driver: str = "cgroupfs", pause_binary: str | None = None,
                 images: ImageLookup | None = None, snapshots: Snapshotter | None = None,
                 sandbox_image: str = "", pull: Callable[[str], Awaitable[Any]] | None = None,
                 cdi_spec_dirs: tuple[str, ...] = cdi.DEFAULT_SPEC_DIRS):
        """``runtime_handlers`` are those RunPodSandbox accepts, ``default_runtime_handler`` the
        one an empty handler means. ``cgroup_parent`` is the cgroup parent of a pod whose config
        names none, ``cgroup_driver`` who makes pods' cgroups (cgroupfs, or systemd: its parents are
        slices); ``pause_binary`` the pause of native pods (None: catatonit when installed,
        else the built-in pause). ``images`` finds the image a container names and
        ``snapshots`` makes its root filesystem (:mod:`client.cri.rootfs`); without them a container
        that names an image is refused (one that names none runs on a root of its own, empty but
        for its mounts).
        ``sandbox_image``, when set, is every pod's pause (containerd's sandbox_image): found
        through ``images``, pulled with ``pull(reference)`` when missing, run from a snapshot
        ``sandbox-<pod id>`` of it. ``cdi_spec_dirs`` hold the CDI specs a container's CDI devices
        are resolved with (:mod:`client.cri.cdi`)."""
        self.controller = controller
        self.cdi_spec_dirs = tuple(cdi_spec_dirs)
        self.store = store
        self.cni = cni
        self.namespace = namespace
        self.log_root = log_root
        self.runtime_handlers = tuple(runtime_handlers)
        self.default_runtime_handler = default_runtime_handler
        self.cgroup_parent = cgroup_parent
        self.cgroup_driver = cgroup_driver
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
        self._container_configs: dict[str, tuple[ContainerRecord, ContainerConfig]] = {}  # _container_config_of
        self._entries: dict[str, tuple[PodRecord, PodEntry]] = {}  # _entry_of
        self._user_files_of: dict[str, dict[str, bytes | None]] = {}  # chain id -> /etc/passwd, /etc/group
        self._cpu_rates = stats.CpuRates()
        self._events = EventFeed()
        self._runtime_config_path = os.path.join(os.path.dirname(log_root), "runtime-config.json")

    async def _stored(self, change: Callable[..., _T], /, *args: Any, **kwargs: Any) -> _T:
        """``change(*args, **kwargs)``, a change of the pod store (create, update, delete...),
        made in a worker thread: a durable write waits for the disk (its fsyncs), and the event
        loop serves every other call meanwhile. Once begun it runs to its end, cancelled or not
        (a change is made whole or not at all)."""
        return await anyio.to_thread.run_sync(functools.partial(change, *args, **kwargs))

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

    @asynccontextmanager
    async def _held_pod(self, pod_id: str) -> AsyncIterator[PodRecord | None]:
        """The pod as it is once held (:meth:`_hold`), or None when no pod has this id, or another
        process removed it while this one waited for its lock: CRI's stop and remove succeed then."""
        found = self._pod_or_none(pod_id)
        if found is None:
            yield None
            return
        async with self._hold(found.pod_id):
            record: PodRecord | None
            try:
                record = self.store.get(found.pod_id)
            except NotFound:
                record = None
            yield record

    @asynccontextmanager
    async def _held_container(self, container_id: str) -> AsyncIterator[ContainerRecord | None]:
        """The container as it is once its pod is held, or None (as :meth:`_held_pod`)."""
        found = self._container_or_none(container_id)
        if found is None:
            yield None
            return
        async with self._hold(found.pod_id):
            c: ContainerRecord | None
            try:
                c = self.store.get_container(found.pod_id, found.container_id)
            except NotFound:
                c = None
            yield c

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

    def _container(self, container_id: str) -> ContainerRecord:
        if not isinstance(container_id, str) or not container_id:
            raise InvalidArgument("a container id (or a unique prefix of one) is required")
        return self.store.find_container(container_id)

    def _container_or_none(self, container_id: str) -> ContainerRecord | None:
        """The container, or None when no container has this id: removed, or never seen (as
        :meth:`_pod_or_none`)."""
        try:
            return self._container(container_id)
        except NotFound:
            return None

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

    def _config_of(self, record: PodRecord) -> PodSandboxConfig:
        """The record's config, parsed once per stored record (the store hands out the same
        record object until its file changes); only the last :data:`_CONFIGS_KEPT` are kept."""
        return parsed_once(self._configs, record.pod_id, record, PodSandboxConfig.from_json)

    def _container_config_of(self, c: ContainerRecord) -> ContainerConfig:
        """The container record's config, parsed once per stored record, as :meth:`_config_of`."""
        return parsed_once(self._container_configs, c.container_id, c, ContainerConfig.from_json)

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
            "state": POD_STATE[record.state], "created_at": record.created_at,
            "labels": MappingProxyType(record.labels), "annotations": MappingProxyType(record.annotations),
            "runtime_handler": record.runtime_handler, "ip": record.ip,
            "host_network": self._config_of(record).host_network})
        keep_newest(self._entries, record.pod_id, (record, entry), _CONFIGS_KEPT)
        return entry

    def _pod_files_dir(self, pod_id: str) -> str:
        """The pod's own directory of files (hosts, resolv.conf, hostname: :mod:`shim.lib.podfiles`)."""
        return os.path.join(self.store.root, POD_FILES_DIR, pod_id)

    if TYPE_CHECKING:
        # What one RPC group's part calls of another's (PodService joins them all): declared here,
        # so that each part is checked against the others' signatures.
        async def list_pod_sandbox(self, filter: Mapping[str, Any] | None = None) -> list[PodEntry]: ...
        async def list_containers(self, filter: Mapping[str, Any] | None = None) -> list[dict[str, Any]]: ...
        async def _refreshed(self, record: PodRecord) -> PodRecord: ...
        async def _stop(self, record: PodRecord) -> None: ...
        async def _rollback(self, record: PodRecord) -> None: ...
        async def _teardown_network(self, record: PodRecord, *, strict: bool) -> None: ...
        async def _shutdown_sandbox(self, pod_id: str) -> None: ...
        async def _remove_sandbox_rootfs(self, record: PodRecord) -> None: ...
        def _follow_soon(self, pod_id: str) -> None: ...
        async def _start_following(self, pod_id: str) -> None: ...
        async def _sandbox_running(self, record: PodRecord) -> bool | None: ...
        async def _mark_notready(self, pod_id: str) -> PodRecord | None: ...
        async def _pod_ready(self, pod_id: str) -> None: ...
        async def _refresh_container(self, c: ContainerRecord) -> ContainerRecord: ...
        async def _ask_container(self, c: ContainerRecord) -> ContainerRecord: ...
        async def _exited(self, c: ContainerRecord, done: Mapping[str, Any]) -> ContainerRecord: ...
        async def _shim_gone(self, c: ContainerRecord) -> ContainerRecord: ...
        async def _running(self, container_id: str) -> ContainerRecord: ...
        async def _stop_container(self, c: ContainerRecord, timeout: float) -> None: ...
        async def _stop_container_quietly(self, c: ContainerRecord) -> None: ...
        async def _delete_task(self, c: ContainerRecord) -> None: ...
        async def _remove_rootfs(self, pod_id: str, container_id: str) -> None: ...
        async def _user_files(self, image: ContainerImage | None) -> ReadFile: ...

    async def _release_volumes(self, pod_id: str, container_id: str, image_ids: Iterable[str]) -> None:
        """Release the pod's image volumes of ``image_ids`` that no other container of the pod
        uses (the caller holds the pod's lock and deletes the container's record after this)."""
        try:
            others = self.store.get(pod_id).containers.values()
        except NotFound:
            others = {}.values()
        used = {i for c in others if c.container_id != container_id for i in c.image_volumes.values()}
        await self.image_volumes.release(pod_id, sorted(set(image_ids) - used))


_T = TypeVar("_T")


def keep_newest(kept: dict[str, _T], pod_id: str, value: _T, limit: int) -> None:
    """``value`` kept under ``pod_id`` as the newest of at most ``limit`` (a per-pod cache: the
    pod layer's parsed configs and list entries, podshimd's encoded PodSandboxes): a pod's older
    value is replaced (it pushes no other pod out); else the oldest pod's goes."""
    if kept.pop(pod_id, None) is None and len(kept) >= limit:
        kept.pop(next(iter(kept)))
    kept[pod_id] = value


_R = TypeVar("_R", PodRecord, ContainerRecord)
_C = TypeVar("_C")


def parsed_once(kept: dict[str, tuple[_R, _C]], key: str, record: _R, parse: Callable[[Any], _C]) -> _C:
    """``parse(record.config)``, made once per config and kept under ``key`` (see
    :func:`keep_newest`): a record does not change, a changed one is a new object, and a new
    record of the same config (every write of a pod gives one) is given what was made already."""
    cached = kept.get(key)
    if cached is not None and cached[0] is record:
        return cached[1]
    if cached is not None and cached[0].config == record.config:
        made = cached[1]
    else:
        made = parse(record.config)
    keep_newest(kept, key, (record, made), _CONFIGS_KEPT)
    return made


def labels_match(labels: Mapping[str, str], selector: Mapping[str, str] | None) -> bool:
    """Whether ``labels`` has every key and value of ``selector`` (CRI's label_selector)."""
    return all(labels.get(k) == v for k, v in (selector or {}).items())
