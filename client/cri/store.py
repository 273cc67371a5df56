"""The persistent pod store: one JSON record per pod, written atomically, read back on restart.

Layout: ``<root>/pods/<pod_id>.json`` holds a :class:`PodRecord` with its containers. A write
is tmp file + fsync + rename + fsync of the directory, so after a crash (or power cut) each
record is the old one or the new one, never half of either.

**A record is the reservation.** containerd keeps the name index and the sandbox metadata in
separate places; a crash between the two writes left restarts failing with "failed to get
metadata for stored sandbox" (containerd#10848) or names reserved forever (#5410, #6095). Here
the name index is not stored at all: it is rebuilt from the records at start-up, so there can
never be a reservation without a record. :meth:`PodStore.reserve_name` only holds a name in
memory for a pod service that needs it before it can write the record; a crash forgets it.

**The CREATING rule.** The pod service writes the pod's record in state CREATING *before* it
makes anything outside (netns, CNI, shim), so a crash leaves a record that says what to undo.
A record found in CREATING when the store opens was being created by a process that is gone:
it is *incomplete*. An incomplete record does not hold its name (a new RunPodSandbox for the
same pod succeeds at once) and :meth:`PodStore.list_incomplete` hands it to the pod service,
which rolls back what the record names and deletes it. CREATING records written by this
process do hold their names: their RunPodSandbox is still running.

A record that cannot be parsed (a disk error, a hand edit) does not stop the store from
opening: it is renamed to ``<file>.corrupt``, logged and skipped.

Thread and task safety: every method is synchronous and holds one lock while it reads or
changes the in-memory indexes and writes the file, so asyncio tasks (and threads) in one
process see each change whole. One process owns a store root at a time.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from shim.rpc.files import ensure_private_dir, fsync_dir, read_json, write_atomic
from shim.rpc.identifiers import validate_identifier
from shim.rpc.status import AlreadyExists, InvalidArgument, NotFound

from client.cri.configs import ContainerMetadata, PodSandboxMetadata

__all__ = [
    "RECORD_VERSION",
    "POD_STATES",
    "CONTAINER_STATES",
    "ContainerRecord",
    "PodRecord",
    "PodStore",
]

log = logging.getLogger(__name__)

#: ``version`` in every record file; a reader ignores fields it does not know.
RECORD_VERSION = 1
#: CRI's PodSandboxState plus CREATING, which CRI never reports (the pod is not listed yet).
POD_STATES = ("CREATING", "READY", "NOTREADY")
#: CRI's ContainerState values a record can hold.
CONTAINER_STATES = ("CREATED", "RUNNING", "EXITED")
_PODS_DIR = "pods"
_SUFFIX = ".json"
_CORRUPT_SUFFIX = ".corrupt"
#: How many candidates an "ambiguous prefix" error names.
_MAX_CANDIDATES_SHOWN = 10


def _fields_of(cls: type, doc: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in doc.items() if k in names}


def _check_state(kind: str, state: str, allowed: tuple[str, ...]) -> None:
    if state not in allowed:
        raise InvalidArgument(f"{kind} state {state!r} is not one of {', '.join(allowed)}")


class _ConfigLabels:
    """Labels and annotations, read from the crictl config a record keeps."""

    config: dict[str, Any]

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.config.get("labels") or {})

    @property
    def annotations(self) -> dict[str, str]:
        return dict(self.config.get("annotations") or {})


@dataclass(frozen=True)
class ContainerRecord(_ConfigLabels):
    """A container of a pod, as the pod service needs it for status, list and recovery.

    Times are ns since the epoch (0 = not yet). ``pid`` is the container's init process as seen
    from the shim's PID namespace; ``exit_code`` is set once EXITED (128 + signal if killed).
    ``config`` is the crictl ContainerConfig JSON as given.
    """

    container_id: str
    pod_id: str
    config: dict[str, Any]
    state: str = "CREATED"
    created_at: int = field(default_factory=time.time_ns)
    started_at: int = 0
    finished_at: int = 0
    pid: int | None = None
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    log_path: str = ""

    @property
    def metadata(self) -> ContainerMetadata:
        return ContainerMetadata.from_json(self.config.get("metadata"))

    def check(self) -> None:
        """InvalidArgument unless ids, state and metadata are valid."""
        validate_identifier("container id", self.container_id)
        validate_identifier("pod id", self.pod_id)
        _check_state("container", self.state, CONTAINER_STATES)
        self.metadata  # noqa: B018  (parsing is the check)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "ContainerRecord":
        return cls(**_fields_of(cls, doc))


@dataclass(frozen=True)
class PodRecord(_ConfigLabels):
    """One pod sandbox and its containers, as stored.

    - ``config``: the crictl PodSandboxConfig JSON as given (the source of name, labels, ...).
    - ``state``: CREATING until RunPodSandbox finished, then READY; NOTREADY once the pause exited
      or StopPodSandbox ran. CRI reports CREATING as nothing (RunPodSandbox has not returned).
    - ``sandbox_namespace``: the controller namespace the shim runs in; with ``pod_id`` it finds
      the shim again after a restart.
    - ``netns_path``, ``cni_result``: what recovery and StopPodSandbox need to tear the network
      down (CNI DEL wants the ADD result as prevResult). ``ip``/``additional_ips`` are CRI's.
    - ``pid``: the pause's pid, for status; ``stopped_at``: when it became NOTREADY.
    """

    pod_id: str
    config: dict[str, Any]
    runtime_handler: str = ""
    state: str = "CREATING"
    created_at: int = field(default_factory=time.time_ns)
    sandbox_namespace: str = "default"
    netns_path: str = ""
    ip: str = ""
    additional_ips: tuple[str, ...] = ()
    cni_result: dict[str, Any] | None = None
    pid: int | None = None
    stopped_at: int = 0
    containers: dict[str, ContainerRecord] = field(default_factory=dict)

    @property
    def metadata(self) -> PodSandboxMetadata:
        return PodSandboxMetadata.from_json(self.config.get("metadata"))

    def check(self) -> None:
        """InvalidArgument unless ids, states, metadata and container ownership are valid."""
        validate_identifier("pod id", self.pod_id)
        validate_identifier("sandbox namespace", self.sandbox_namespace)
        _check_state("pod", self.state, POD_STATES)
        self.metadata  # noqa: B018  (parsing is the check)
        keys: dict[str, str] = {}
        for container_id, container in self.containers.items():
            container.check()
            if container_id != container.container_id or container.pod_id != self.pod_id:
                raise InvalidArgument(f"container {container_id!r} is filed under the wrong id or pod")
            key = container.metadata.key
            if key in keys:
                raise AlreadyExists(f"pod {self.pod_id} already has container {keys[key]} named {key!r}")
            keys[key] = container_id

    def to_json(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["additional_ips"] = list(self.additional_ips)
        return {"version": RECORD_VERSION, **doc}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "PodRecord":
        """Build a record from its stored JSON; unknown fields are ignored."""
        values = _fields_of(cls, doc)
        values["additional_ips"] = tuple(values.get("additional_ips") or ())
        values["containers"] = {cid: ContainerRecord.from_json(c) for cid, c in (values.get("containers") or {}).items()}
        return cls(**values)


def _write_atomic(path: str, data: bytes) -> None:
    """A pod record must survive a power cut: file and directory are fsynced."""
    write_atomic(path, data)


def _resolve_prefix(kind: str, prefix: str, ids: Iterator[str]) -> str:
    """crictl's id lookup: an exact id, else the one id that starts with ``prefix``."""
    if not isinstance(prefix, str) or not prefix:
        raise InvalidArgument(f"{kind} id or prefix must be a non-empty string")
    candidates = sorted(i for i in ids if i.startswith(prefix))
    if prefix in candidates:
        return prefix
    if not candidates:
        raise NotFound(f"no {kind} has an id starting with {prefix!r}")
    if len(candidates) > 1:
        shown = ", ".join(candidates[:_MAX_CANDIDATES_SHOWN])
        more = len(candidates) - _MAX_CANDIDATES_SHOWN
        raise InvalidArgument(f"{kind} id prefix {prefix!r} is ambiguous: it matches {shown}"
                              + (f" and {more} more" if more > 0 else ""))
    return candidates[0]


class PodStore:
    """Pod records under ``root``, loaded at construction; see the module docstring for the rules.

    Raises OSError if ``root`` cannot be created or read.
    """

    def __init__(self, root: str | os.PathLike[str]):
        self.root = os.path.abspath(os.fspath(root))
        self._dir = os.path.join(self.root, _PODS_DIR)
        ensure_private_dir(self._dir, 0o700)
        self._lock = threading.RLock()
        self._pods: dict[str, PodRecord] = {}
        self._names: dict[str, str] = {}          # metadata key → pod id, from complete records
        self._pending: dict[str, str] = {}        # metadata key → pod id, reserve_name() not yet written
        self._incomplete: set[str] = set()        # pod ids found CREATING at start-up
        self._container_pods: dict[str, str] = {}  # container id → pod id
        self._load()

    # -- loading -------------------------------------------------------------------------

    def _load(self) -> None:
        for entry in sorted(os.listdir(self._dir)):
            path = os.path.join(self._dir, entry)
            if entry.startswith("."):
                # A tmp file of a write that crashed before its rename: the record it would have
                # replaced is intact, so the tmp file is garbage.
                os.unlink(path)
                continue
            if not entry.endswith(_SUFFIX):
                continue
            try:
                record = PodRecord.from_json(read_json(path))
                record.check()
                if entry != record.pod_id + _SUFFIX:
                    raise InvalidArgument(f"it holds pod {record.pod_id!r}")
                for container_id in record.containers:
                    if container_id in self._container_pods:
                        raise AlreadyExists(f"container {container_id} is also in pod {self._container_pods[container_id]}")
            except (ValueError, TypeError, AttributeError, InvalidArgument, AlreadyExists) as exc:
                log.error("pod record %s is not valid (%s); moved aside to %s%s", path, exc, path, _CORRUPT_SUFFIX)
                os.replace(path, path + _CORRUPT_SUFFIX)
                continue
            if record.state == "CREATING":
                self._incomplete.add(record.pod_id)
            self._index(record)
        fsync_dir(self._dir)

    # -- internal index upkeep (callers hold the lock) ------------------------------------

    def _index(self, record: PodRecord) -> None:
        self._pods[record.pod_id] = record
        if record.pod_id not in self._incomplete:
            self._names[record.metadata.key] = record.pod_id
        for container_id in record.containers:
            self._container_pods[container_id] = record.pod_id

    def _unindex(self, pod_id: str) -> None:
        record = self._pods.pop(pod_id, None)
        if record is None:
            return
        key = record.metadata.key
        if self._names.get(key) == pod_id:
            del self._names[key]
        for container_id in record.containers:
            if self._container_pods.get(container_id) == pod_id:
                del self._container_pods[container_id]

    def _name_holder(self, key: str) -> str | None:
        return self._names.get(key) or self._pending.get(key)

    def _write(self, record: PodRecord) -> PodRecord:
        """Persist ``record`` and index what was written; returns the stored copy."""
        try:
            data = (json.dumps(record.to_json(), sort_keys=True, allow_nan=False) + "\n").encode()
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"pod {record.pod_id}: the record is not JSON-serialisable: {exc}") from None
        _write_atomic(os.path.join(self._dir, record.pod_id + _SUFFIX), data)
        # Index a copy made from the bytes on disk: later changes to the caller's dicts cannot
        # reach the store, and what is read now is exactly what a restart would read.
        stored = PodRecord.from_json(json.loads(data))
        self._unindex(record.pod_id)
        self._index(stored)
        return stored

    # -- names ---------------------------------------------------------------------------

    def reserve_name(self, metadata_key: str, pod_id: str) -> None:
        """Hold a pod name (``name_namespace_uid_attempt``) for ``pod_id`` until its record is put.

        Idempotent for the same pod. Raises AlreadyExists naming the pod that holds the name.
        The hold is in memory only: writing the pod's record makes it durable, and
        :meth:`release_name` gives it up if the record is never written.
        """
        validate_identifier("pod id", pod_id)
        with self._lock:
            holder = self._name_holder(metadata_key)
            if holder is not None and holder != pod_id:
                raise AlreadyExists(f"pod name {metadata_key!r} is reserved for pod {holder}")
            self._pending[metadata_key] = pod_id

    def release_name(self, metadata_key: str, pod_id: str) -> None:
        """Give up a hold taken by :meth:`reserve_name` (no-op if ``pod_id`` does not hold it)."""
        with self._lock:
            if self._pending.get(metadata_key) == pod_id:
                del self._pending[metadata_key]

    # -- pods ----------------------------------------------------------------------------

    def put(self, record: PodRecord) -> PodRecord:
        """Create or replace a pod's record (durably); returns the stored copy.

        Raises InvalidArgument for a bad record, AlreadyExists when another pod holds its name
        or one of its container ids belongs to another pod.
        """
        record.check()
        key = record.metadata.key
        with self._lock:
            holder = self._name_holder(key)
            # An incomplete record never takes its name back: a new pod may hold it by now.
            if holder is not None and holder != record.pod_id and record.pod_id not in self._incomplete:
                raise AlreadyExists(f"pod name {key!r} is reserved for pod {holder}")
            old = self._pods.get(record.pod_id)
            if old is not None and old.metadata.key != key:
                raise InvalidArgument(f"pod {record.pod_id}: metadata cannot change ({old.metadata.key!r} → {key!r})")
            for container_id in record.containers:
                owner = self._container_pods.get(container_id)
                if owner is not None and owner != record.pod_id:
                    raise AlreadyExists(f"container {container_id} belongs to pod {owner}")
            stored = self._write(record)
            if self._pending.get(key) == record.pod_id:
                del self._pending[key]  # the record is the reservation now
            return stored

    def update(self, pod_id: str, /, **changes: Any) -> PodRecord:
        """Replace some fields of a pod's record in one step (no lost update between tasks).

        Raises NotFound, or what :meth:`put` raises.
        """
        if "pod_id" in changes or "containers" in changes:
            raise InvalidArgument("update cannot change pod_id or containers; use the container methods")
        with self._lock:
            return self.put(dataclasses.replace(self.get(pod_id), **changes))

    def get(self, pod_id: str) -> PodRecord:
        """The pod with exactly this id; NotFound otherwise."""
        with self._lock:
            record = self._pods.get(pod_id)
        if record is None:
            raise NotFound(f"pod sandbox {pod_id!r}")
        return record

    def get_by_prefix(self, prefix: str) -> PodRecord:
        """The pod whose id is ``prefix`` or the only one starting with it (as crictl resolves ids).

        NotFound if none matches, InvalidArgument naming the candidates if several do.
        """
        with self._lock:
            return self._pods[_resolve_prefix("pod sandbox", prefix, iter(self._pods))]

    def delete(self, pod_id: str) -> None:
        """Remove a pod's record, its containers and its name; no error if it is not there."""
        validate_identifier("pod id", pod_id)
        with self._lock:
            try:
                os.unlink(os.path.join(self._dir, pod_id + _SUFFIX))
            except FileNotFoundError:
                pass
            else:
                fsync_dir(self._dir)
            self._unindex(pod_id)
            self._incomplete.discard(pod_id)

    def list(self) -> list[PodRecord]:
        """Every pod, incomplete ones included, oldest first."""
        with self._lock:
            return sorted(self._pods.values(), key=lambda r: (r.created_at, r.pod_id))

    def list_incomplete(self) -> list[PodRecord]:
        """Pods a crash left in CREATING: roll back what each names, then :meth:`delete` it.

        They hold no name, so a new pod with the same metadata need not wait for this.
        """
        with self._lock:
            return sorted((self._pods[i] for i in self._incomplete), key=lambda r: (r.created_at, r.pod_id))

    def is_incomplete(self, pod_id: str) -> bool:
        """True for a pod a crash left in CREATING (see :meth:`list_incomplete`)."""
        with self._lock:
            return pod_id in self._incomplete

    # -- containers ----------------------------------------------------------------------

    def put_container(self, container: ContainerRecord) -> ContainerRecord:
        """Create or replace a container in its pod's record (durably); returns the stored copy.

        Raises NotFound if the pod is not there, AlreadyExists if the id belongs to another pod
        or another container of the pod has the same (name, attempt).
        """
        container.check()
        with self._lock:
            pod = self.get(container.pod_id)
            containers = dict(pod.containers)
            containers[container.container_id] = container
            stored = self.put(dataclasses.replace(pod, containers=containers))
            return stored.containers[container.container_id]

    def update_container(self, container_id: str, /, **changes: Any) -> ContainerRecord:
        """Replace some fields of a container in one step; NotFound if it is not there."""
        if "container_id" in changes or "pod_id" in changes:
            raise InvalidArgument("update_container cannot change container_id or pod_id")
        with self._lock:
            return self.put_container(dataclasses.replace(self.get_container(container_id), **changes))

    def get_container(self, container_id: str) -> ContainerRecord:
        """The container with exactly this id, in whichever pod; NotFound otherwise."""
        with self._lock:
            pod_id = self._container_pods.get(container_id)
            if pod_id is None:
                raise NotFound(f"container {container_id!r}")
            return self._pods[pod_id].containers[container_id]

    def find_container(self, container_id_or_prefix: str) -> ContainerRecord:
        """The container whose id is given or is the only one starting with it, across pods.

        NotFound if none matches, InvalidArgument naming the candidates if several do.
        """
        with self._lock:
            container_id = _resolve_prefix("container", container_id_or_prefix, iter(self._container_pods))
            return self.get_container(container_id)

    def delete_container(self, container_id: str) -> None:
        """Remove a container from its pod's record; no error if it is not there."""
        with self._lock:
            pod_id = self._container_pods.get(container_id)
            if pod_id is None:
                return
            pod = self._pods[pod_id]
            containers = {cid: c for cid, c in pod.containers.items() if cid != container_id}
            self.put(dataclasses.replace(pod, containers=containers))

    def list_containers(self, pod_id: str | None = None) -> list[ContainerRecord]:
        """Every container (of one pod if ``pod_id`` is given; NotFound if that pod is not there)."""
        with self._lock:
            pods = [self.get(pod_id)] if pod_id is not None else list(self._pods.values())
            found = [c for pod in pods for c in pod.containers.values()]
        return sorted(found, key=lambda c: (c.created_at, c.container_id))
