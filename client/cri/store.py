"""The persistent pod store: one JSON record per pod, shared by every process that opens its root.

Layout under ``<root>``::

    pods/<pod_id>.json    a PodRecord with its containers (RECORD_VERSION), written atomically
    pods/<pod_id>.lock    the pod's lock file, while an operation on the pod holds it

A write is tmp file + fsync + rename + fsync of the directory (:func:`write_atomic`), so after a
crash (or power cut) each record is the old one or the new one, never half of either.

**The state machines.** A pod is CREATING until RunPodSandbox finished, then READY, then
NOTREADY once stopped or its pause died; a container is CREATED, RUNNING, EXITED. The allowed
moves are the tables :data:`POD_TRANSITIONS` and :data:`CONTAINER_TRANSITIONS`; the store
refuses any other with FailedPrecondition. Staying in a state is not a move.

**Many processes, one root.** podshimctl, podshimd and any Controller user may open the same
root at the same time. Every read reads the files (a record is decoded again only when its
bytes changed), so a change is seen by every process at once. Two kinds of
flock keep them apart; the kernel drops both when a process dies, so kill -9 never
leaves a lock held:

- *The store lock*, an flock on the ``pods`` directory itself, is held for the moment of one
  change: check that the record is still the one the change was made from, and rename the new
  file (written and fsynced before the lock is taken) into place; the directory is fsynced
  after it is let go, so that writers of different pods wait for the disk together. A record
  that changed meanwhile is read again and the change made again from it. Checks that span
  records (a pod's name is free, a container id is unused) and the rename they allow are one
  step across all processes. Reads take no lock: a record file is always whole.
- *A pod's lock* is held by the process working on the pod for the whole operation — from
  before RunPodSandbox writes the CREATING record until the pod is READY or rolled back; a
  stop, a removal, a container change — so two processes never work on one pod at once, while
  reads (``pods``, ``inspectp``) of it go on. Take it with :meth:`PodStore.lock_pod`; a pod's
  lock is taken before the store lock, never the other way round.

**A record is the reservation.** containerd keeps the name index and the sandbox metadata in
separate places; a crash between the two writes left restarts failing with "failed to get
metadata for stored sandbox" (containerd#10848) or names reserved forever (#5410, #6095). Here
there is no name index: :meth:`PodStore.create` checks the name against the records on disk
under the store lock, so two processes creating the same pod at once get one record and one
AlreadyExists, and there can never be a reservation without a record.

**The CREATING rule.** The pod service writes the pod's record in state CREATING, holding the
pod's lock, *before* it makes anything outside (netns, CNI, shim), so a crash leaves a record
that says what to undo. A CREATING record whose lock is free belongs to a process that is gone:
it is *incomplete*. It does not hold its name (a new RunPodSandbox for the same pod succeeds at
once), and :meth:`PodStore.claim_incomplete` hands it, locked, to whoever rolls it back. A
CREATING record whose lock is held is a RunPodSandbox still running, here or in another
process: nobody else touches it.

**Leftovers.** Opening a store removes tmp files of writes that died before their rename and
moves records that cannot be parsed aside to ``<file>.corrupt`` (logged), but only when it gets
the store lock at once: every rename holds that lock, so then no other process is half-way
through one. A tmp file it removes may be a live writer's that has not taken the lock yet: that
writer writes it again. If the lock is busy, the next open cleans up.
"""

from __future__ import annotations

import builtins
import dataclasses
import enum
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio

from shim.api.identifiers import is_identifier, validate_identifier
from shim.cri.configs import ContainerMetadata, PodSandboxMetadata
from shim.cri.signals import DEFAULT_STOP
from shim.lib.files import (
    decode_json,
    ensure_private_dir,
    flock_open,
    fsync_dir,
    unlink_quietly,
    write_atomic,
    write_temporary,
)
from shim.rpc.status import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound

__all__ = [
    "CONTAINER_TRANSITIONS",
    "POD_TRANSITIONS",
    "RECORD_VERSION",
    "ContainerRecord",
    "ContainerState",
    "PodLock",
    "PodRecord",
    "PodState",
    "PodStore",
    "check_container_transition",
    "check_pod_transition",
]

log = logging.getLogger(__name__)


class PodState(enum.StrEnum):
    """A pod record's state: CRI's PodSandboxState plus CREATING, which CRI never reports."""

    CREATING = "CREATING"  # RunPodSandbox has not finished: the pod is not listed yet
    READY = "READY"        # its pause runs and its network is up
    NOTREADY = "NOTREADY"  # stopped, or its pause died; only removal is left


class ContainerState(enum.StrEnum):
    """A container record's state: CRI's ContainerState (CONTAINER_UNKNOWN is never stored)."""

    CREATED = "CREATED"
    RUNNING = "RUNNING"
    EXITED = "EXITED"


#: The state a pod or container record starts in.
INITIAL_POD_STATE = PodState.CREATING
INITIAL_CONTAINER_STATE = ContainerState.CREATED
#: Where each state may go. A failed RunPodSandbox deletes its CREATING record instead.
POD_TRANSITIONS: Mapping[PodState, frozenset[PodState]] = {
    PodState.CREATING: frozenset({PodState.READY}),
    PodState.READY: frozenset({PodState.NOTREADY}),
    PodState.NOTREADY: frozenset(),
}
#: CREATED → EXITED is a container that never started (stopped first, or its shim died).
CONTAINER_TRANSITIONS: Mapping[ContainerState, frozenset[ContainerState]] = {
    ContainerState.CREATED: frozenset({ContainerState.RUNNING, ContainerState.EXITED}),
    ContainerState.RUNNING: frozenset({ContainerState.EXITED}),
    ContainerState.EXITED: frozenset(),
}

#: ``version`` in every record file. A reader ignores fields it does not know and leaves a
#: record of a newer version alone (it is neither used nor moved aside).
RECORD_VERSION = 1
_PODS_DIR = "pods"
_RECORD_SUFFIX = ".json"
_LOCK_SUFFIX = ".lock"
_CORRUPT_SUFFIX = ".corrupt"
#: How long a wait for another process's pod lock sleeps between tries, at first and at most.
_LOCK_POLL_FIRST = 0.002
_LOCK_POLL_MAX = 0.05
#: How many candidates an "ambiguous prefix" error names.
_MAX_CANDIDATES_SHOWN = 10
#: A listing is read again only when the pods directory changed (every write renames a file into
#: it, every lock file is made and removed there), told by its change times; but a file system
#: stamps those from a clock that ticks every few ms, so a change in the tick of a read could keep
#: the times the read saw (git's "racy" index entries). A listing is kept only when the times it
#: saw were this much older than the read.
_RACY_NS = 100_000_000


def _check_transition(kind: str, name: str, table: Mapping[Any, frozenset[Any]], old: Any, new: Any) -> None:
    if new == old or new in table[old]:
        return
    allowed = sorted(table[old])
    then = f"it can only become {' or '.join(allowed)}" if allowed else "it can only be removed"
    raise FailedPrecondition(f"{kind} {name} is {old} and cannot become {new}: {then}")


def check_pod_transition(pod_id: str, old: PodState, new: PodState) -> None:
    """FailedPrecondition unless a pod may go from ``old`` to ``new`` (:data:`POD_TRANSITIONS`)."""
    _check_transition("pod", pod_id, POD_TRANSITIONS, PodState(old), PodState(new))


def check_container_transition(container_id: str, old: ContainerState, new: ContainerState) -> None:
    """FailedPrecondition unless a container may go from ``old`` to ``new`` (:data:`CONTAINER_TRANSITIONS`)."""
    _check_transition("container", container_id, CONTAINER_TRANSITIONS, ContainerState(old), ContainerState(new))


def _state(kind: str, enum_type: type[enum.StrEnum], value: Any) -> Any:
    try:
        return enum_type(value)
    except ValueError:
        raise InvalidArgument(f"{kind} state {value!r} is not one of {', '.join(enum_type)}") from None


def _fields_of(cls: type, doc: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in doc.items() if k in names}


def _replaced(record: Any, kind: str, frozen: tuple[str, ...], changes: dict[str, Any]) -> Any:
    """``record`` with ``changes``; InvalidArgument for a field that is unknown or fixed."""
    fixed = sorted(set(changes) & set(frozen))
    if fixed:
        raise InvalidArgument(f"a {kind}'s {', '.join(fixed)} cannot change")
    try:
        return dataclasses.replace(record, **changes)
    except TypeError as exc:
        raise InvalidArgument(f"{kind} update: {exc}") from None


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

    Stored inside its pod's record (and versioned with it). Times are ns since the epoch (0 =
    not yet). ``pid`` is the container's init process as seen from the shim's PID namespace;
    ``exit_code`` is set once EXITED (128 + signal if killed). ``config`` is the crictl
    ContainerConfig JSON as given. ``state`` may be given as its string; it is kept as the enum.
    ``image_id`` is the id (config digest) of the image the container runs on, "" for none (a
    root of its own): RemoveImage refuses an image some container has; its root filesystem
    is the snapshot whose key is the container id. ``image_ref`` is the image's first repo
    digest (CRI's ``image_ref``), else its id; ``image_name`` its first repo tag, else the
    reference the container was created with (CRI's ``image`` of its status: kubelet creates
    containers by image id, and shows this as the pod's image). ``image_volumes`` are its image
    volumes (container path → image id; :mod:`client.cri.imagevolumes`): RemoveImage refuses
    those images too. ``resources`` and ``user``: see the fields.
    """

    container_id: str
    pod_id: str
    config: dict[str, Any]
    state: ContainerState = INITIAL_CONTAINER_STATE
    created_at: int = field(default_factory=time.time_ns)
    started_at: int = 0
    finished_at: int = 0
    pid: int | None = None
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    log_path: str = ""
    image_id: str = ""
    image_ref: str = ""
    image_name: str = ""
    image_volumes: Mapping[str, str] = field(default_factory=dict)
    #: The LinuxContainerResources fields UpdateContainerResources set since the create (CRI's
    #: names), over those of ``config``: with them, what the container has now.
    resources: Mapping[str, Any] = field(default_factory=dict)
    #: The user its process is created with (``uid``, ``gid``, ``additional_gids``, as the
    #: container sees them; its OCI spec's process.user): ContainerStatus.user when no process
    #: runs, as containerd reports it. None: recorded before it was kept.
    user: Mapping[str, Any] | None = None
    #: The signal StopContainer sends it first: its config's, else its image's StopSignal, else
    #: the default (which is also what a record from before it was kept says).
    stop_signal: int = int(DEFAULT_STOP)

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", _state("container", ContainerState, self.state))
        object.__setattr__(self, "image_volumes", dict(self.image_volumes or {}))
        object.__setattr__(self, "resources", dict(self.resources or {}))

    @property
    def metadata(self) -> ContainerMetadata:
        return ContainerMetadata.from_json(self.config.get("metadata"))

    def check(self) -> None:
        """InvalidArgument unless ids and metadata are valid."""
        validate_identifier("container id", self.container_id)
        validate_identifier("pod id", self.pod_id)
        self.metadata  # noqa: B018  (parsing is the check)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ContainerRecord:
        return cls(**_fields_of(cls, doc))


class NewerRecord(FailedPrecondition):
    """A record written by a newer podshim: left as it is, neither used nor moved aside."""


@dataclass(frozen=True)
class PodRecord(_ConfigLabels):
    """One pod sandbox and its containers, as stored.

    - ``config``: the crictl PodSandboxConfig JSON as given (the source of name, labels, ...).
    - ``state``: see :class:`PodState` and :data:`POD_TRANSITIONS`; may be given as its string.
    - ``sandbox_namespace``: the controller namespace the shim runs in; with ``pod_id`` it finds
      the shim again after a restart.
    - ``netns_path``, ``cni_result``: what recovery and StopPodSandbox need to tear the network
      down (CNI DEL wants the ADD result as prevResult). ``ip``/``additional_ips`` are CRI's.
    - ``pid``: the pause's pid, for status; ``stopped_at``: when it became NOTREADY.
    - ``network_down``: a StopPodSandbox finished tearing the network down (CNI DEL ran to its
      end), so RemovePodSandbox need not run DEL again; False when a stop was cut short.
    - ``sandbox_image``, ``sandbox_image_id``: the pause's image (its name and id) when the
      runtime has a sandbox image, recorded before its snapshot (``sandbox-<pod id>``) is made.
    """

    pod_id: str
    config: dict[str, Any]
    runtime_handler: str = ""
    state: PodState = INITIAL_POD_STATE
    created_at: int = field(default_factory=time.time_ns)
    sandbox_namespace: str = "default"
    netns_path: str = ""
    ip: str = ""
    additional_ips: tuple[str, ...] = ()
    cni_result: dict[str, Any] | None = None
    pid: int | None = None
    stopped_at: int = 0
    network_down: bool = False
    containers: dict[str, ContainerRecord] = field(default_factory=dict)
    sandbox_image: str = ""
    sandbox_image_id: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", _state("pod", PodState, self.state))

    @property
    def metadata(self) -> PodSandboxMetadata:
        return PodSandboxMetadata.from_json(self.config.get("metadata"))

    def check(self) -> None:
        """InvalidArgument unless ids, metadata and container ownership are valid;
        AlreadyExists if two containers share a (name, attempt)."""
        validate_identifier("pod id", self.pod_id)
        validate_identifier("sandbox namespace", self.sandbox_namespace)
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
    def from_json(cls, doc: dict[str, Any]) -> PodRecord:
        """Build a record from its stored JSON; unknown fields are ignored.

        Raises InvalidArgument for a record this code cannot read (bad version or state),
        :class:`NewerRecord` for one written by a newer podshim.
        """
        version = doc.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise InvalidArgument(f"record version {version!r} is not a positive integer")
        if version > RECORD_VERSION:
            raise NewerRecord(f"record version {version} is newer than this podshim's ({RECORD_VERSION})")
        values = _fields_of(cls, doc)
        values["additional_ips"] = tuple(values.get("additional_ips") or ())
        values["containers"] = {cid: ContainerRecord.from_json(c) for cid, c in (values.get("containers") or {}).items()}
        return cls(**values)


class PodLock:
    """The flock of one pod (``pods/<pod_id>.lock``), held by the process working on the pod.

    Made by :meth:`PodStore.lock_pod`. Each PodLock is its own open file, so two of them
    exclude each other in one process as across processes. ``async with`` acquires and
    releases it. It is released by :meth:`release` or by the kernel when the process dies,
    which is how :meth:`PodStore.claim_incomplete` tells a crash leftover from a
    RunPodSandbox still running. Not reentrant.
    """

    def __init__(self, path: str):
        self.path = path
        self._held: ExitStack | None = None

    @property
    def held(self) -> bool:
        return self._held is not None

    def try_acquire(self) -> bool:
        """Take the lock if it is free; False if another holder has it."""
        if self._held is not None:
            raise RuntimeError(f"{self.path} is already held by this PodLock")
        with ExitStack() as held:
            # Its holder unlinks the lock file as it lets go, so nothing is left behind.
            if held.enter_context(flock_open(self.path, blocking=False, unlink=True)) is None:
                return False
            self._held = held.pop_all()
        return True

    async def acquire(self) -> None:
        """Take the lock, waiting as long as its holder keeps it (cancel to give up).

        flock offers nothing to wait on and a thread blocked in flock(2) cannot be cancelled,
        so this tries again after a short sleep that grows to 50 ms. Contention is rare: one
        process serialises its own operations on a pod before it asks for this lock.
        """
        delay = _LOCK_POLL_FIRST
        while not self.try_acquire():
            await anyio.sleep(delay)
            delay = min(delay * 2, _LOCK_POLL_MAX)

    def release(self) -> None:
        """Let go of the lock (no-op if not held)."""
        held, self._held = self._held, None
        if held is not None:
            held.close()

    async def __aenter__(self) -> PodLock:
        await self.acquire()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        self.release()


def _encoded(record: PodRecord) -> bytes:
    """A record file's bytes; InvalidArgument for a record that is not valid or not JSON."""
    record.check()
    try:
        return (json.dumps(record.to_json(), sort_keys=True, allow_nan=False) + "\n").encode()
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"pod {record.pod_id}: the record is not JSON-serialisable: {exc}") from None


def _stat_key(st: os.stat_result) -> tuple[int, ...]:
    """What tells one record file from another at the same path: each write is a new file."""
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _file_bytes(path: str) -> bytes | None:
    """The bytes of the file at ``path``; None when there is none."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


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
    """Pod records under ``root``; see the module docstring for the rules.

    Every method is synchronous and looks at the files, so a change made by another process is
    seen at once. Changes hold a thread lock and the store lock, so asyncio tasks, threads and
    processes each see every change whole. Raises OSError if ``root`` cannot be created or read.
    """

    def __init__(self, root: str | os.PathLike[str]):
        self.root = os.path.abspath(os.fspath(root))
        self._dir = os.path.join(self.root, _PODS_DIR)
        ensure_private_dir(self._dir, 0o700)
        self._mutex = threading.RLock()
        self._depth = 0  # how many blocks of this store hold its lock (_exclusive)
        self._reported: set[str] = set()  # newer-version records already logged
        # pod id → (the record file's bytes, the record, the file's stat key when it had
        # settled as it was read, else None): the last parse of each (_parse)
        self._cache: dict[str, tuple[bytes, PodRecord, tuple[int, ...] | None]] = {}
        # container id → the pod whose record held it when last parsed: where find_container
        # looks first (the record read then says whether it is still there)
        self._owners: dict[str, str] = {}
        # The last listing and the directory's (inode, mtime, ctime) it was read at (_read_all).
        self._listing: tuple[tuple[int, int, int], list[PodRecord]] | None = None
        self._clean_up()

    # -- files and locks -------------------------------------------------------------------

    def _record_path(self, pod_id: str) -> str:
        return os.path.join(self._dir, pod_id + _RECORD_SUFFIX)

    def _lock_path(self, pod_id: str) -> str:
        return os.path.join(self._dir, pod_id + _LOCK_SUFFIX)

    @contextmanager
    def _exclusive(self, *, blocking: bool = True) -> Iterator[bool]:
        """Hold the store lock (reentrant in this store); yields False if busy and not ``blocking``."""
        with self._mutex, ExitStack() as held:
            if self._depth == 0 and held.enter_context(flock_open(self._dir, blocking=blocking, create=False)) is None:
                yield False
                return
            self._depth += 1
            try:
                yield True
            finally:
                self._depth -= 1

    def lock_pod(self, pod_id: str) -> PodLock:
        """A new, not yet taken, lock for the pod ``pod_id`` (see :class:`PodLock`)."""
        validate_identifier("pod id", pod_id)
        return PodLock(self._lock_path(pod_id))

    def _clean_up(self) -> None:
        """Remove dead writers' tmp files, move unreadable records aside, drop lock files of
        dead holders — only if no other process is writing (see "Leftovers" above)."""
        with self._exclusive(blocking=False) as exclusive:
            if not exclusive:
                return
            for entry in sorted(os.listdir(self._dir)):
                path = os.path.join(self._dir, entry)
                if entry.startswith("."):
                    # A tmp file of a write that died before its rename (every write holds
                    # the store lock): the file it would have replaced is intact.
                    os.unlink(path)
                elif entry.endswith(_LOCK_SUFFIX):
                    with flock_open(path, blocking=False, unlink=True):  # a live holder keeps its file
                        pass
                elif entry.endswith(_RECORD_SUFFIX):
                    self._read(entry[:-len(_RECORD_SUFFIX)])  # sets it aside if it is not valid

    # -- reading -----------------------------------------------------------------------------

    def _parse(self, pod_id: str, path: str) -> tuple[bytes, PodRecord]:
        """Read and check a record file: its bytes and its record. The same bytes as last time
        give the same record without decoding and checking them again (most of a read's cost);
        a file that had settled when it was last read (:data:`_RACY_NS`, as for listings) and
        whose stat is still the same (every write is a new file, renamed in) is not read again."""
        cached = self._cache.get(pod_id)
        if cached is not None and cached[2] is not None and _stat_key(os.stat(path)) == cached[2]:
            return cached[0], cached[1]
        started = time.time_ns()
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            data = f.read()
        key = _stat_key(st) if max(st.st_mtime_ns, st.st_ctime_ns) < started - _RACY_NS else None
        if cached is not None and cached[0] == data:
            if key != cached[2]:
                self._cache[pod_id] = (data, cached[1], key)
            return data, cached[1]
        doc = decode_json(data, path)
        if not isinstance(doc, dict):
            raise InvalidArgument("it is not a JSON object")
        record = PodRecord.from_json(doc)
        record.check()
        if record.pod_id != pod_id:
            raise InvalidArgument(f"it holds pod {record.pod_id!r}")
        self._remember(pod_id, data, record, key)
        return data, record

    def _remember(self, pod_id: str, data: bytes, record: PodRecord, key: tuple[int, ...] | None) -> None:
        """Keep ``record``, parsed from ``data``, as the last parse of ``pod_id``'s record file
        (``key``: its settled stat; None has the next read compare the bytes)."""
        self._forget(pod_id)
        self._cache[pod_id] = (data, record, key)
        for container_id in record.containers:
            self._owners[container_id] = pod_id

    def _forget(self, pod_id: str) -> None:
        """Drop the last parse of ``pod_id``'s record, and its containers' owner entries."""
        cached = self._cache.pop(pod_id, None)
        for container_id in cached[1].containers if cached is not None else ():
            if self._owners.get(container_id) == pod_id:
                self._owners.pop(container_id, None)  # another thread's parse may be at it too

    def _read(self, pod_id: str) -> PodRecord | None:
        """The record of ``pod_id`` as on disk; None if there is none or it cannot be used
        (logged; one that is not valid is set aside)."""
        path = self._record_path(pod_id)
        try:
            return self._parse(pod_id, path)[1]
        except FileNotFoundError:
            self._forget(pod_id)
            return None
        except NewerRecord as exc:
            if path not in self._reported:
                self._reported.add(path)
                log.error("pod record %s is left as it is and not used: %s", path, exc.message)
            return None
        except OSError as exc:  # EIO, EACCES...: the file may be fine; leave it
            log.error("pod record %s cannot be read (%s); skipped", path, exc)
            return None
        except (ValueError, TypeError, AttributeError, InvalidArgument, AlreadyExists) as exc:
            self._set_aside(path, exc)
            return None

    def _set_aside(self, path: str, reason: Exception) -> None:
        """Move a record that is not valid to ``<path>.corrupt``. A whole file that does not
        parse is corrupt (writes replace files whole), but the move waits for the store lock,
        so that it cannot set aside a record another process is replacing right now."""
        with self._exclusive(blocking=False) as exclusive:
            if not exclusive:
                log.error("pod record %s is not valid (%s); skipped", path, reason)
                return
            try:
                os.replace(path, path + _CORRUPT_SUFFIX)
            except FileNotFoundError:
                return
            fsync_dir(self._dir)
        log.error("pod record %s is not valid (%s); moved aside to %s%s", path, reason, path, _CORRUPT_SUFFIX)

    def _ids(self) -> list[str]:
        return [e[:-len(_RECORD_SUFFIX)] for e in os.listdir(self._dir)
                if e.endswith(_RECORD_SUFFIX) and not e.startswith(".")]

    def _read_all(self) -> list[PodRecord]:
        """Every valid record, oldest first; the last listing again while the directory is
        unchanged (:data:`_RACY_NS`), so listing many pods costs one stat, not a read of each
        file (nor a sort)."""
        started = time.time_ns()
        st = os.stat(self._dir)  # before reading: a change made while reading shows next time
        seen = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        listing = self._listing
        if listing is not None and listing[0] == seen:
            return list(listing[1])
        ids = self._ids()
        for gone in set(self._cache) - set(ids):
            self._forget(gone)
        records = sorted((r for r in map(self._read, ids) if r is not None), key=lambda r: (r.created_at, r.pod_id))
        settled = st.st_mtime_ns < started - _RACY_NS
        self._listing = (seen, records) if settled else None
        return list(records)

    def _current(self, pod_id: str) -> PodRecord:
        record = self._read(pod_id)
        if record is None:
            raise NotFound(f"pod sandbox {pod_id!r}")
        return record

    # -- writing ---------------------------------------------------------------------------------

    def _commit(self, pod_id: str, change: Callable[[PodRecord | None], PodRecord | None],
                check: Callable[[], None] | None = None) -> PodRecord | None:
        """Write ``change(the pod's record as it is)`` (None there: no record) durably; returns
        the stored copy, or None when ``change`` gives None (nothing to write).

        The new file is written and fsynced before the store lock is taken, and the directory
        fsynced once the lock is let go (one fsync covers the renames of every writer before
        it): writers wait for the disk together, not one after another. Under the lock only
        ``check`` (what spans records) and the rename, if the record file is still the one
        ``change`` saw; if it changed meanwhile, all again from the record as it is then. A
        record file that cannot be used is left to :meth:`_read` (which logs it or sets it
        aside), all of it under the lock."""
        path = self._record_path(pod_id)
        while True:
            base: bytes | None
            try:
                base, current = self._parse(pod_id, path)
            except FileNotFoundError:
                base, current = None, None
            except Exception:  # noqa: BLE001 - any record _read would not give: let it say why
                with self._exclusive():
                    if check is not None:
                        check()
                    new = change(self._read(pod_id))
                    if new is None:
                        return None
                    data = _encoded(new)
                    write_atomic(path, data)
                return self._stored(pod_id, data)
            new = change(current)
            if new is None:
                return None
            data = _encoded(new)
            tmp = write_temporary(path, data)
            renamed = False
            try:
                with self._exclusive():
                    if check is not None:
                        check()
                    if _file_bytes(path) != base:
                        continue  # changed since it was read
                    try:
                        os.replace(tmp, path)
                    except FileNotFoundError:
                        continue  # another process, opening the store, took it for a dead writer's
                    renamed = True
            finally:
                if not renamed:
                    unlink_quietly(tmp)
            fsync_dir(self._dir)
            return self._stored(pod_id, data)

    def _stored(self, pod_id: str, data: bytes) -> PodRecord:
        """The record this process just wrote as ``data``: a copy made from the bytes on disk
        (later changes to the caller's dicts cannot reach the store, and what is returned is
        exactly what a reader will read), kept as the next read's parse (a read that finds these
        bytes decodes nothing)."""
        stored = PodRecord.from_json(json.loads(data))
        self._remember(pod_id, data, stored, None)
        return stored

    # -- pods ----------------------------------------------------------------------------------

    def claim_incomplete(self, pod_id: str) -> PodLock | None:
        """The held lock of a pod a crash left CREATING; None if the pod is not CREATING (or
        gone) or its owner is alive (still creating it, or rolling it back).

        The caller rolls back what the record names, :meth:`delete`\\ s it, and releases the lock.
        """
        lock = self.lock_pod(pod_id)
        if not lock.try_acquire():
            return None
        record = self._read(pod_id)  # again: its owner may have finished before letting go
        if record is None or record.state is not PodState.CREATING:
            lock.release()
            return None
        return lock

    def _name_holder(self, key: str, pod_id: str) -> str | None:
        for other in self._read_all():
            if other.pod_id == pod_id or other.metadata.key != key:
                continue
            if other.state is PodState.CREATING:
                lock = self.claim_incomplete(other.pod_id)
                if lock is not None:
                    lock.release()
                    continue  # a crash leftover: it holds no name
            return other.pod_id
        return None

    def create(self, record: PodRecord) -> PodRecord:
        """Write a new pod's record (durably); returns the stored copy.

        It must be CREATING, and its writer must hold the pod's lock (:meth:`lock_pod`) until
        the pod is READY or its record deleted: a CREATING record whose lock is free is a crash
        leftover. Raises InvalidArgument for a bad record, FailedPrecondition if it is not
        CREATING or has containers, AlreadyExists if the id is taken or another pod (not a
        crash leftover) has the same name, namespace, uid and attempt.
        """
        record.check()
        if record.state is not INITIAL_POD_STATE or record.containers:
            raise FailedPrecondition(f"pod {record.pod_id}: a new pod record is {INITIAL_POD_STATE} "
                                     f"with no containers, not {record.state} with {len(record.containers)}")
        key = record.metadata.key

        def free() -> None:
            if os.path.exists(self._record_path(record.pod_id)):
                raise AlreadyExists(f"pod {record.pod_id} already exists")
            holder = self._name_holder(key, record.pod_id)
            if holder is not None:
                raise AlreadyExists(f"pod name {key!r} is reserved for pod {holder}")

        stored = self._commit(record.pod_id, lambda current: record, free)
        assert stored is not None  # change gave a record
        return stored

    def update(self, pod_id: str, /, **changes: Any) -> PodRecord:
        """Change some fields of a pod's record in one step (no lost update between tasks or
        processes); returns the stored copy.

        Raises NotFound, FailedPrecondition for a state change :data:`POD_TRANSITIONS` does not
        allow, InvalidArgument for an unknown field or one that cannot change (pod_id, config,
        containers: use the container methods).
        """
        def change(old: PodRecord | None) -> PodRecord:
            if old is None:
                raise NotFound(f"pod sandbox {pod_id!r}")
            new: PodRecord = _replaced(old, "pod", ("pod_id", "config", "containers"), changes)
            check_pod_transition(pod_id, old.state, new.state)
            return new

        stored = self._commit(pod_id, change)
        assert stored is not None  # change gave a record
        return stored

    def get(self, pod_id: str) -> PodRecord:
        """The pod with exactly this id; NotFound otherwise."""
        validate_identifier("pod id", pod_id)
        return self._current(pod_id)

    def get_by_prefix(self, prefix: str) -> PodRecord:
        """The pod whose id is ``prefix`` or the only one starting with it (as crictl resolves ids).

        NotFound if none matches, InvalidArgument naming the candidates if several do. A whole
        id (kubelet's every call) is one record read, not a listing of the directory.
        """
        if isinstance(prefix, str) and is_identifier(prefix):
            record = self._read(prefix)
            if record is not None:
                return record  # an exact id is the answer whatever other ids it prefixes
        return self._current(_resolve_prefix("pod sandbox", prefix, iter(self._ids())))

    def delete(self, pod_id: str) -> None:
        """Remove a pod's record with its containers, freeing its name; no error if it is not
        there."""
        validate_identifier("pod id", pod_id)
        with self._exclusive():
            try:
                os.unlink(self._record_path(pod_id))
            except FileNotFoundError:
                return
            fsync_dir(self._dir)

    def list(self) -> list[PodRecord]:
        """Every pod, CREATING ones included, oldest first."""
        return self._read_all()

    # -- containers ----------------------------------------------------------------------------

    @staticmethod
    def _with_container(pod: PodRecord, container_id: str, container: ContainerRecord | None) -> PodRecord:
        """``pod`` with ``container`` under ``container_id`` (None: without it)."""
        containers = {cid: c for cid, c in pod.containers.items() if cid != container_id}
        if container is not None:
            containers[container_id] = container
        return dataclasses.replace(pod, containers=containers)

    def add_container(self, container: ContainerRecord) -> ContainerRecord:
        """Add a new container (CREATED) to its pod's record (durably); returns the stored copy.

        Raises NotFound if the pod is not there, FailedPrecondition if the container is not
        CREATED, AlreadyExists if the id is taken (in any pod) or another container of the pod
        has the same (name, attempt), InvalidArgument for a bad record.
        """
        container.check()
        if container.state is not INITIAL_CONTAINER_STATE:
            raise FailedPrecondition(f"container {container.container_id}: a new container is "
                                     f"{INITIAL_CONTAINER_STATE}, not {container.state}")
        cid, pod_id = container.container_id, container.pod_id

        def unused() -> None:
            for other in self._read_all():
                if cid in other.containers and other.pod_id != pod_id:
                    raise AlreadyExists(f"container {cid} belongs to pod {other.pod_id}")

        def change(pod: PodRecord | None) -> PodRecord:
            if pod is None:
                raise NotFound(f"pod sandbox {pod_id!r}")
            if cid in pod.containers:
                raise AlreadyExists(f"container {cid} belongs to pod {pod_id}")
            return self._with_container(pod, cid, container)

        stored = self._commit(pod_id, change, unused)
        assert stored is not None  # change gave a record
        return stored.containers[cid]

    def update_container(self, pod_id: str, container_id: str, /, **changes: Any) -> ContainerRecord:
        """Change some fields of a container in one step; returns the stored copy.

        Raises NotFound, FailedPrecondition for a state change :data:`CONTAINER_TRANSITIONS`
        does not allow, InvalidArgument for an unknown field or one that cannot change
        (container_id, pod_id, config).
        """
        def change(pod: PodRecord | None) -> PodRecord:
            old = pod.containers.get(container_id) if pod is not None else None
            if pod is None:
                raise NotFound(f"pod sandbox {pod_id!r}")
            if old is None:
                raise NotFound(f"container {container_id!r} in pod {pod_id}")
            new = _replaced(old, "container", ("container_id", "pod_id", "config"), changes)
            check_container_transition(container_id, old.state, new.state)
            return self._with_container(pod, container_id, new)

        stored = self._commit(pod_id, change)
        assert stored is not None  # change gave a record
        return stored.containers[container_id]

    def get_container(self, pod_id: str, container_id: str) -> ContainerRecord:
        """The container ``container_id`` of pod ``pod_id``; NotFound otherwise."""
        container = self._current(pod_id).containers.get(container_id)
        if container is None:
            raise NotFound(f"container {container_id!r} in pod {pod_id}")
        return container

    def find_container(self, container_id_or_prefix: str) -> ContainerRecord:
        """The container whose id is given or is the only one starting with it, across pods.

        NotFound if none matches, InvalidArgument naming the candidates if several do. A whole
        id (kubelet's every call) is looked up in the pod that held it, one record read, before
        every record is.
        """
        owner = self._owners.get(container_id_or_prefix) if isinstance(container_id_or_prefix, str) else None
        if owner is not None:
            pod = self._read(owner)
            found = pod.containers.get(container_id_or_prefix) if pod is not None else None
            if found is not None:
                return found  # an exact id is the answer whatever other ids it prefixes
            self._owners.pop(container_id_or_prefix, None)  # removed, or moved: never; look everywhere
        containers = {c.container_id: c for c in self.list_containers()}
        return containers[_resolve_prefix("container", container_id_or_prefix, iter(containers))]

    def delete_container(self, pod_id: str, container_id: str) -> None:
        """Remove a container from its pod's record; no error if it (or the pod) is not there."""
        def change(pod: PodRecord | None) -> PodRecord | None:
            if pod is None or container_id not in pod.containers:
                return None
            return self._with_container(pod, container_id, None)

        self._commit(pod_id, change)

    def list_containers(self, pod_id: str | None = None) -> builtins.list[ContainerRecord]:
        """Every container, oldest first (of one pod if ``pod_id`` is given; NotFound if that
        pod is not there)."""
        pods = [self.get(pod_id)] if pod_id is not None else self._read_all()
        found = [c for pod in pods for c in pod.containers.values()]
        return sorted(found, key=lambda c: (c.created_at, c.container_id))
