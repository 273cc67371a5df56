"""The sandbox's cgroup (the cgroupfs driver): one directory in every writable hierarchy, v1 and v2.

Hierarchies are discovered (:mod:`shim.kernel.cgroups.hierarchies`): on a hybrid machine every mounted v1 controller (cpu, cpuacct, cpuset, memory, pids, blkio,
devices, freezer, name=systemd, ...) gets a directory, and so does the v2 hierarchy, which may
have no controllers and then only tracks membership (cpu.stat, cgroup.kill, cgroup.procs).

A hierarchy that refuses the mkdir with EROFS/EACCES/EPERM (v1 is mounted read-only inside
systemd-nspawn) is skipped and recorded in :attr:`SandboxCgroup.skipped`; metrics degrade to
"unavailable" rather than fail.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import time
from collections.abc import Iterator, Mapping
from typing import Any

from shim.api.cgroups import SYSTEMD, check_parent, expand_slice
from shim.kernel import linux
from shim.kernel.cgroups import stats, systemd
from shim.kernel.cgroups.hierarchies import V2, Hierarchy, discover_hierarchies
from shim.kernel.cgroups.hierarchies import pure_v2 as _pure_v2
from shim.kernel.cgroups.readers import read_bytes as _read_bytes
from shim.kernel.cgroups.readers import read_pids as _read_pids
from shim.kernel.cgroups.readers import read_text as _read_text
from shim.kernel.cgroups.readers import subtree as _subtree
from shim.kernel.cgroups.resources import planned_writes
from shim.kernel.cgroups.resources import restorable as _restorable
from shim.lib.processes import process_alive
from shim.rpc.records import Record
from shim.rpc.status import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, RpcError, error_from_oserror

__all__ = ["DEFAULT_PARENT", "REMOVE_TIMEOUT", "V2_CONTROLLERS", "PAUSE_LEAF", "SandboxCgroup", "hold_parent",
           "remove_stale_holds"]

log = logging.getLogger(__name__)

DEFAULT_PARENT = "podshim"
REMOVE_TIMEOUT = 1.0  # seconds rmdir retries EBUSY while killed tasks leave the group

#: The controllers enabled down a cgroup v2 tree (cgroup.subtree_control), each where available,
#: from the top of a sandbox's parent down to the sandbox's directory, whose tasks get them; never
#: in a task's directory (a leaf).
V2_CONTROLLERS = ("cpu", "cpuset", "io", "memory", "hugetlb", "pids")
#: The leaf of a sandbox's v2 directory that holds the sandbox's own processes (the pause) once that
#: directory hands controllers to its tasks: cgroup v2 lets no cgroup with processes of its own do
#: so. "." makes it a name no task id can take.
PAUSE_LEAF = ".pause"

_MKDIR_ATTEMPTS = 3
_SKIPPABLE = (errno.EROFS, errno.EACCES, errno.EPERM)

#: The placeholders of this process's scopes still waiting for their first process, by unit.
_placeholders: dict[str, systemd.Placeholder] = {}

#: The sub-cgroup of a task's scope where its holder waits (SandboxCgroup.hold); "." makes it a
#: name no task id can take.
HOLD_DIR = ".hold"

#: Name prefix of the directories that hold a default parent (:func:`hold_parent`); "." makes it
#: one no sandbox id can take (ids start with a letter or digit).
HOLD_PREFIX = ".held-by-"


def hold_parent(parent: str) -> SandboxCgroup:
    """An empty cgroup ``<parent>/.held-by-<our pid>`` that keeps ``parent`` (a default parent,
    podshim/<namespace>) from being pruned while we run: each sandbox then makes and removes its
    own directory alone. Making podshim/ and podshim/<namespace> again in every hierarchy for
    each sandbox (the last one prunes them) costs 3-4 ms against 0.8, and churns memory cgroups
    the kernel frees lazily. The shim template holds the parents of the namespaces it spawns
    into and removes its holds (and so the parents, once empty) when it exits. Raises as
    :meth:`SandboxCgroup.create`."""
    hold = SandboxCgroup.create(f"{HOLD_PREFIX}{os.getpid()}", parent)
    _holds.append(hold)
    return hold


#: The holds made by this process or, before it forked us, by our template (hold_parent): where
#: to look for one that keeps a sandbox's parents (SandboxCgroup.remove), removed or not.
_holds: list[SandboxCgroup] = []


def _parents_held(cgroup: SandboxCgroup) -> bool:
    """Whether a hold still keeps the parents ``cgroup`` owns, its own directories being gone:
    then removing them would fail (ENOTEMPTY, ten rmdirs for nothing), and whoever removes the
    hold prunes them (all the hold's directories go before its parents). A hold gone or going
    (its first directory removed) is not counted: the parents are tried as without one."""
    for hold in _holds:
        if hold is not cgroup and hold.owned_parents == cgroup.owned_parents and hold.paths \
                and os.path.isdir(next(iter(hold.paths.values()))):
            return True
    return False


def remove_stale_holds() -> list[str]:
    """Remove the holds (:func:`hold_parent`) below our default parent whose process is gone (a
    template killed before it could remove them) or is us (call it before holding anything), and
    the parents they leave empty; the directories removed. Never raises: what cannot be removed
    stays for the next sweep."""
    removed: list[str] = []
    try:
        hierarchies = discover_hierarchies()
    except OSError:
        return removed
    pure_v2 = _pure_v2(hierarchies)
    for hierarchy in hierarchies:
        top = hierarchy.directory(os.path.join(_base(hierarchy, DEFAULT_PARENT, pure_v2), DEFAULT_PARENT))
        if top is None:
            continue
        try:
            namespaces = [os.path.join(top, name) for name in os.listdir(top)]
        except OSError:
            continue
        for directory in namespaces:
            try:
                entries = os.listdir(directory)
            except OSError:
                continue
            for name in entries:
                # Our own pid too: the caller sweeps before it holds anything, so a hold with
                # our pid is a dead process's whose pid we were given (a restarted container).
                # A stale hold's pid may have been reused: it stays while that new process lives.
                pid_text = name[len(HOLD_PREFIX):]
                if name.startswith(HOLD_PREFIX) and (pid_text == str(os.getpid()) or not pid_text.isdigit()
                                                     or not process_alive(int(pid_text), None)):
                    try:
                        os.rmdir(os.path.join(directory, name))
                        removed.append(os.path.join(directory, name))
                    except OSError:
                        continue
            for empty in (directory, top):
                try:
                    os.rmdir(empty)
                    removed.append(empty)
                except OSError:
                    break
    return removed


def _validate(name: str, parent: str | None) -> None:
    if not name or "/" in name or "\0" in name or name in (".", ".."):
        raise InvalidArgument(f"cgroup name {name!r} must be one path component without '/', NUL or '..'")
    if parent is not None and parent != "/":
        parts = parent.strip("/").split("/")
        if "\0" in parent or any(part in ("", ".", "..") for part in parts):
            raise InvalidArgument(
                f"cgroup parent {parent!r} must be a path without empty, '.' or '..' parts or NUL"
            )


class SandboxCgroup(Record):
    """The sandbox's cgroup directories. Build with :meth:`create` or :meth:`from_dict`.

    ``paths`` maps a hierarchy key ("memory", "name=systemd", "unified") to its directory;
    ``skipped`` maps a hierarchy that could not be used to the reason; ``owned_parents`` the
    parent directories that are podshim's, which :meth:`remove` removes when they are empty:
    the default parent ("podshim" below the shim's own cgroup, shared by every sandbox), or
    those of a caller-given parent that :meth:`create` had to make itself. ``unit`` is the
    systemd scope whose delegated cgroup is ``paths``'s v2 directory (:meth:`create_scope`, the
    systemd driver), stopped by :meth:`remove`; "" under the cgroupfs driver.
    """

    __slots__ = ("name", "paths", "skipped", "owned_parents", "leaf", "unit")
    mutable = True
    name: str
    paths: dict[str, str]
    skipped: dict[str, str]
    owned_parents: dict[str, list[str]]
    #: PAUSE_LEAF when the v2 directory hands controllers to its tasks; a pod slice's pause scope; else ""
    leaf: str
    unit: str

    def __init__(self, name: str, paths: dict[str, str], skipped: dict[str, str] | None = None,
                 owned_parents: dict[str, list[str]] | None = None, leaf: str = "", unit: str = "") -> None:
        self.name = name
        self.paths = paths
        self.skipped = {} if skipped is None else skipped
        self.owned_parents = {} if owned_parents is None else owned_parents
        self.leaf = leaf
        self.unit = unit

    @classmethod
    def pod_slice(cls, name: str, parent_slice: str, unit: str, pause_unit: str) -> SandboxCgroup:
        """The systemd driver's pod cgroup, planned (nothing is made until :meth:`start_units`): the
        transient slice ``unit`` in ``parent_slice``, and in it the pause's scope ``pause_unit``
        (:attr:`leaf`). Recorded before it is made, so a shim killed meanwhile leaves a record that
        ``podshim delete`` stops it by. Raises InvalidArgument (bad name, a slice name systemd
        refuses), FailedPrecondition (a host with cgroup v1 controllers)."""
        _validate(name, None)
        check_parent(parent_slice, SYSTEMD)
        directory = _systemd_hierarchy().directory(expand_slice(unit))
        if directory is None:
            raise FailedPrecondition(f"the slice {unit} would be outside the mounted part of the cgroup v2 hierarchy")
        return cls(name, {V2: directory}, leaf=pause_unit, unit=unit)

    def task_scope(self, name: str, unit: str) -> SandboxCgroup:
        """A task's cgroup in this pod slice (:meth:`pod_slice`), planned: the scope ``unit`` in it."""
        _validate(name, None)
        return SandboxCgroup(name, {V2: os.path.join(self.paths[V2], unit)}, unit=unit)

    async def start_units(self, resources: Mapping[str, Any] | None = None, *, placeholder: bool = True) -> None:
        """Make the units of :meth:`pod_slice` (``resources``, Update's keys, the slice's properties
        from its start: :func:`systemd.slice_properties`) or of :meth:`task_scope`. A scope (the
        pause's, a task's) is started here with a placeholder (:class:`systemd.Placeholder`) as its
        first process until :meth:`release_placeholder`, or, without ``placeholder``, left for the
        OCI runtime's systemd driver to start with its container's init. Raises InvalidArgument (a
        resource a slice cannot have), FailedPrecondition (systemd unreachable or refusing a unit);
        what was made is the caller's to remove (:meth:`aremove`)."""
        manager = await systemd.manager()
        if self.is_slice:
            properties = systemd.slice_properties(resources or {})
            await manager.start_slice(self.unit, os.path.basename(os.path.dirname(self.paths[V2])) or "-.slice",
                                      properties)
            if placeholder:
                await _start_scope(manager, self.leaf, self.unit, os.path.join(self.paths[V2], self.leaf))
        elif placeholder:
            await _start_scope(manager, self.unit, os.path.basename(os.path.dirname(self.paths[V2])), self.paths[V2])

    def follow(self, pid: int) -> None:
        """For a task's scope an OCI runtime's systemd driver started: make the v2 directory the
        one process ``pid`` is in when that is below the scope (crun runs its container in a
        sub-cgroup ``container`` of its scope, and writes its limits there). A pod slice keeps its own."""
        if self.is_slice or V2 not in self.paths:
            return
        directory = _systemd_hierarchy().directory(systemd.own_cgroup(pid))
        if directory is not None and directory.startswith(self.paths[V2] + "/"):
            self.paths[V2] = directory

    @property
    def is_slice(self) -> bool:
        """Whether this is a pod slice of the systemd driver: its files are systemd's alone."""
        return self.unit.endswith(".slice")

    def hold(self) -> None:
        """Keep this task's scope (a systemd unit) until :meth:`release_placeholder`, past the exit
        of the task's processes: systemd stops a scope with no process left and removes its
        cgroup, and with it what the task's exit is read from (memory.events' ``oom_kill``). The
        holder (the scope's placeholder, or a new one for a scope an OCI runtime started) waits in
        the scope's sub-cgroup :data:`HOLD_DIR`, which is not the task's (:meth:`pids`). A holder
        that cannot be placed is logged: the task runs on, its OOM kills maybe unread."""
        if not self.unit or self.is_slice or V2 not in self.paths:
            return
        scope = self.paths[V2]
        while os.path.basename(scope) != self.unit and scope != "/":
            scope = os.path.dirname(scope)  # crun's task runs in a sub-cgroup of its scope
        holder = _placeholders.get(self.unit)
        if holder is None:
            holder = _placeholders[self.unit] = systemd.Placeholder()
        try:
            # Never the OOM killer's choice in the task's cgroup: a fork of the shim, its resident
            # size (shared with the shim) is larger than many a task's, and its death would let
            # the scope go with the very count the task's exit is read from.
            linux.write_file(f"/proc/{holder.pid}/oom_score_adj", b"-1000")
            os.makedirs(os.path.join(scope, HOLD_DIR), 0o755, exist_ok=True)
            linux.write_file(os.path.join(scope, HOLD_DIR, "cgroup.procs"), b"%d" % holder.pid)
        except OSError as exc:
            log.warning("cannot keep %s past its task's exit (%s): its OOM kills may be unread", self.unit, exc.strerror)
            self.release_placeholder()

    def release_placeholder(self) -> None:
        """Let the placeholder of :meth:`start_units` or the holder of :meth:`hold` go, once the
        process it held the scope for is in, or its exit was read (systemd stops a scope with no
        process left)."""
        for unit in (self.unit, self.leaf):
            placeholder = _placeholders.pop(unit, None)
            if placeholder is not None:
                placeholder.release()

    @classmethod
    def create(cls, name: str, parent: str | None = None) -> SandboxCgroup:
        """Make ``<parent>/<name>`` in every writable hierarchy.

        An absolute ``parent`` ("/kubepods/x") is relative to each hierarchy's root; a relative
        one, or None (meaning "podshim"), is relative to this process's own cgroup in that
        hierarchy. cpuset directories get cpuset.cpus/mems copied from their parent, or no
        task could join them. Raises InvalidArgument (bad name/parent), AlreadyExists (the
        directory exists in some hierarchy) or the OS error's status; on error nothing made is left behind.
        """
        _validate(name, parent)
        parent = DEFAULT_PARENT if parent is None else parent
        # "podshim" and anything below it (the shim's default, podshim/<namespace>) is ours.
        default_parent = parent == DEFAULT_PARENT or parent.startswith(DEFAULT_PARENT + "/")
        cgroup = cls(name, {})
        try:
            hierarchies = discover_hierarchies()
            # Only where no controller is on v1 (pure v2) are controllers handed down the v2 tree:
            # on a hybrid layout v2 tracks membership, and the machine's own v2 tree is left as it is.
            pure_v2 = _pure_v2(hierarchies)
            for hierarchy in hierarchies:
                base = _base(hierarchy, parent, pure_v2)
                parent_path = os.path.join(base, parent.lstrip("/"))
                # The parent's directory once, the target's and the last owned parent's from it
                # (the same as asking directory() for each, a third of the work in a new shim).
                parent_dir = hierarchy.directory(parent_path)
                target = (os.path.join(parent_dir, name) if parent_dir is not None
                          else hierarchy.directory(os.path.join(parent_path, name)))
                if target is None:
                    cgroup.skipped[hierarchy.key] = "the cgroup is outside the mounted part of the hierarchy"
                    continue
                try:
                    made = _make_dirs_retrying(target, copy_cpuset="cpuset" in hierarchy.controllers)
                except FileExistsError:
                    raise AlreadyExists(f"cgroup {target} already exists") from None
                except OSError as exc:
                    if exc.errno in _SKIPPABLE:
                        cgroup.skipped[hierarchy.key] = f"{exc.strerror} ({exc.filename})"
                        continue
                    raise error_from_oserror(exc, f"cannot create cgroup {target} ({exc.filename})") from exc
                cgroup.paths[hierarchy.key] = target
                if hierarchy.key == V2 and pure_v2:
                    top = hierarchy.directory(base)
                    if top is not None and _enable_controllers(top, target):
                        os.mkdir(os.path.join(target, PAUSE_LEAF), 0o755)
                        cgroup.leaf = PAUSE_LEAF
                # The default parent is pruned by whichever sandbox leaves it empty, so it does not
                # outlive its sandboxes when two shims raced to create it. A caller's parent
                # (e.g. /kubepods) is someone else's: only what we had to make is ours.
                cgroup.owned_parents[hierarchy.key] = (_parent_dirs(hierarchy, base, parent, parent_dir)
                                                       if default_parent else made[:-1])
        except BaseException:
            cgroup.remove()
            raise
        return cgroup

    def to_dict(self) -> dict[str, Any]:
        """A msgpack/JSON-friendly record; :meth:`from_dict` rebuilds the object."""
        return {
            "name": self.name,
            "paths": dict(self.paths),
            "skipped": dict(self.skipped),
            "owned_parents": {key: list(dirs) for key, dirs in self.owned_parents.items()},
            "leaf": self.leaf,
            "unit": self.unit,
        }

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> SandboxCgroup:
        """Rebuild from :meth:`to_dict`'s record. Raises InvalidArgument for a malformed record."""
        try:
            cgroup = cls(
                str(record["name"]),
                {str(k): str(v) for k, v in record["paths"].items()},
                {str(k): str(v) for k, v in record.get("skipped", {}).items()},
                {str(k): [str(d) for d in v] for k, v in record.get("owned_parents", {}).items()},
                str(record.get("leaf", "")),
                str(record.get("unit", "")),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise InvalidArgument(f"malformed cgroup record: {exc!r}") from None
        _validate(cgroup.name, None)
        if cgroup.leaf not in ("", PAUSE_LEAF) and not (cgroup.is_slice and cgroup.leaf.endswith(".scope")
                                                       and "/" not in cgroup.leaf):
            raise InvalidArgument(f"malformed cgroup record: leaf {cgroup.leaf!r}")
        if not all(os.path.isabs(path) for path in cgroup.paths.values()):
            raise InvalidArgument("malformed cgroup record: paths must be absolute")
        if cgroup.unit and (not cgroup.unit.endswith((".scope", ".slice")) or "/" in cgroup.unit):
            raise InvalidArgument(f"malformed cgroup record: unit {cgroup.unit!r}")
        return cgroup

    def process_paths(self) -> dict[str, str]:
        """:attr:`paths` with the v2 directory's :attr:`leaf` in its place: where the sandbox's
        own processes go."""
        if not self.leaf or V2 not in self.paths:
            return self.paths
        return {**self.paths, V2: os.path.join(self.paths[V2], self.leaf)}

    def procs_files(self) -> list[str]:
        """The cgroup.procs file of every hierarchy's directory for the sandbox's own processes."""
        return [os.path.join(path, "cgroup.procs") for path in self.process_paths().values()]

    def join(self, pid: int) -> None:
        """Move process ``pid`` (0: the caller) into the sandbox cgroup in every hierarchy.

        Raises NotFound when the process does not exist, the OS error's status for other errors.
        """
        data = str(pid).encode()
        for procs in self.procs_files():
            try:
                linux.write_file(procs, data)
            except ProcessLookupError:
                raise NotFound(f"process {pid} does not exist") from None
            except OSError as exc:
                raise error_from_oserror(exc, f"cannot move process {pid} into {procs}") from exc

    def pids(self) -> set[int]:
        """Every process in the sandbox cgroup or below it, in any hierarchy. Raises the OS error's status."""
        found: set[int] = set()
        for path in self.paths.values():
            for directory in _subtree(path):
                if os.path.basename(directory) == HOLD_DIR:
                    continue  # a scope's holder (hold) is not one of its processes
                try:
                    found.update(_read_pids(directory))
                except OSError as exc:
                    raise error_from_oserror(exc, f"cannot list the processes of cgroup {directory}") from exc
        return found

    def metrics(self) -> dict[str, Any]:
        """Usage figures of this cgroup and everything below it (:func:`shim.kernel.cgroups.stats.metrics`);
        never raises."""
        return stats.metrics(self.v1_paths(), self.paths.get(V2))

    def details(self) -> dict[str, Any]:
        """The figures beyond :meth:`metrics` that cadvisor's metrics name
        (:func:`shim.kernel.cgroups.stats.details`); read only when asked."""
        return stats.details(self.v1_paths(), self.paths.get(V2))

    def oom_kills(self) -> int | None:
        """How many processes of this cgroup the kernel's OOM killer killed; None when unreadable."""
        return stats.oom_kills(self.v1_paths(), self.paths.get(V2))

    def process_counts(self) -> dict[str, int | None]:
        """``processes``, ``threads``, ``file_descriptors`` and ``sockets`` (open descriptors that
        are sockets) of the processes in the cgroup and below it, counted in /proc now; a process
        that exits meanwhile is left out. All None when the cgroup's processes cannot be listed."""
        try:
            pids = self.pids()
        except RpcError:
            return dict.fromkeys(("processes", "threads", "file_descriptors", "sockets"))
        threads = descriptors = sockets = 0
        for pid in pids:
            try:
                threads += len(os.listdir(f"/proc/{pid}/task"))
                fd_dir = f"/proc/{pid}/fd"
                for fd in os.listdir(fd_dir):
                    descriptors += 1
                    try:
                        sockets += os.readlink(os.path.join(fd_dir, fd)).startswith("socket:")
                    except OSError:
                        continue  # closed meanwhile
            except OSError:
                continue  # exited meanwhile
        return {"processes": len(pids), "threads": threads, "file_descriptors": descriptors, "sockets": sockets}

    def v1_paths(self) -> dict[str, str]:
        """controller -> directory, for every v1 hierarchy ("cpu,cpuacct" gives both)."""
        return {c: path for key, path in self.paths.items() if key != V2 for c in key.split(",")}

    def update(self, resources: Mapping[str, Any]) -> None:
        """Apply ``resources`` (protocol.md 7.3, Update) to this cgroup; keys absent or None are
        left as they are.

        Every key is checked first (its type and range, and that its file exists here), so a
        refusal writes nothing; if the kernel then refuses a write, the files written before it
        get their old contents back. Raises InvalidArgument naming the key (unknown key, bad
        value, a controller or file this host does not have, a write the kernel refuses),
        NotFound when the cgroup is gone, Internal for other errors. A cgroup that is a systemd
        unit's (:attr:`unit`) is updated with :meth:`aupdate`, which sets the unit's properties too.
        """
        if self.unit:
            raise RuntimeError(f"the cgroup of {self.unit} is updated with aupdate, which sets the unit's properties")
        self._write_resources(resources)

    async def aupdate(self, resources: Mapping[str, Any]) -> None:
        """:meth:`update` for the event loop, and for a systemd unit's cgroup also the unit's
        properties (what systemd owns: a ``daemon-reload`` would otherwise put back the old
        values). FailedPrecondition when systemd refuses them."""
        if self.is_slice:
            # A pod's slice: its files are systemd's; what it has no property for is refused.
            await (await systemd.manager()).set_properties(self.unit, systemd.slice_properties(resources))
            return
        self._write_resources(resources)
        if self.unit:
            await (await systemd.manager()).set_properties(self.unit, systemd.unit_properties(resources))

    def _write_resources(self, resources: Mapping[str, Any]) -> None:
        writes = planned_writes(resources, self.v1_paths(), self.paths.get(V2), self.pids)
        done: list[tuple[str, str, bytes]] = []  # key, path, old contents
        try:
            for key, path, value in writes:
                process_file = path.startswith("/proc/")
                try:
                    old = _read_bytes(path)
                    linux.write_file(path, value)
                except (ProcessLookupError, FileNotFoundError) as exc:
                    if process_file:
                        continue  # that process of the task exited meanwhile: nothing to adjust
                    raise NotFound(f"cgroup file {path} is gone: the cgroup was removed") from exc
                except OSError as exc:
                    if exc.errno in (errno.EINVAL, errno.ERANGE, errno.EACCES, errno.EPERM, errno.EBUSY, errno.ENOSPC):
                        why = exc.strerror or str(exc)
                        if process_file and exc.errno in (errno.EACCES, errno.EPERM):
                            why += " (lowering it below the shim's own needs CAP_SYS_RESOURCE)"
                        raise InvalidArgument(f"resources.{key}: the kernel refused {value.decode()!r} for "
                                              f"{path}: {why}") from None
                    raise error_from_oserror(exc, f"cannot write {path}") from exc
                done.append((key, path, old))
        except BaseException:
            for _key, path, old in reversed(done):
                try:
                    linux.write_file(path, _restorable(path, old))
                except OSError as exc:
                    log.error("cannot put back %s after a failed update: %s", path, exc.strerror)
            raise

    def check(self, resources: Mapping[str, Any]) -> None:
        """Check ``resources`` as :meth:`update` would, writing nothing: InvalidArgument naming
        the first key this cgroup's hierarchies cannot apply (the task cgroups below this one
        have the same files: Create checks a task's resources against the sandbox's cgroup)."""
        planned_writes(resources, self.v1_paths(), self.paths.get(V2), lambda: ())

    def kill_all(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to every process in the sandbox cgroup and below.

        SIGKILL uses v2 cgroup.kill when the kernel has it (atomic: no fork escapes); otherwise
        each pid listed in cgroup.procs of every hierarchy is signalled, repeated until none is
        new, so a forking process cannot outrun it. Raises the OS error's status when the group cannot be
        read or killed.
        """
        v2 = self.paths.get(V2)
        if sig == signal.SIGKILL and v2 is not None and os.path.exists(os.path.join(v2, "cgroup.kill")):
            try:
                linux.write_file(os.path.join(v2, "cgroup.kill"), b"1")
                return
            except FileNotFoundError:
                return  # already removed: nothing left to kill
            except OSError as exc:
                raise error_from_oserror(exc, f"cannot kill cgroup {v2}") from exc
        signalled: set[int] = set()
        while True:
            # A pid listed in cgroup.procs is a member now; the window in which it could exit,
            # be reaped and be reused before kill() is a few microseconds.
            fresh = self.pids() - signalled
            if not fresh:
                return
            for pid in fresh:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            signalled |= fresh

    def child(self, name: str) -> SandboxCgroup:
        """Make ``<this cgroup>/<name>`` in every hierarchy this cgroup has (a task's cgroup).

        The child owns no parents: this cgroup removes itself. cpuset directories get
        cpuset.cpus/mems copied from this one. Raises InvalidArgument (bad name, or a name taken
        by a control file such as ``tasks``), AlreadyExists or the OS error's status; on error nothing made
        is left behind.
        """
        _validate(name, None)
        child = SandboxCgroup(name, {}, dict(self.skipped))
        try:
            for key, path in self.paths.items():
                target = os.path.join(path, name)
                try:
                    _make_dirs(target, copy_cpuset="cpuset" in key.split(","))
                except FileExistsError:
                    if not os.path.isdir(target):
                        raise InvalidArgument(f"cgroup name {name!r} is taken by a control file of {path}") from None
                    raise AlreadyExists(f"cgroup {target} already exists") from None
                except OSError as exc:
                    raise error_from_oserror(exc, f"cannot create cgroup {target} ({exc.filename})") from exc
                child.paths[key] = target
        except BaseException:
            child.remove()
            raise
        return child

    def remove(self, timeout: float = REMOVE_TIMEOUT) -> None:
        """Remove the sandbox directories (deepest first), then :attr:`owned_parents` that are empty,
        unless a hold of them made by this process or its template still stands (:func:`_parents_held`:
        whoever removes the hold prunes them); a systemd unit's cgroup (:attr:`unit`): what is
        below the scope, then the unit stopped.

        Idempotent: missing directories are fine. rmdir fails with EBUSY while killed tasks
        are still leaving the group, so that is retried for up to ``timeout`` seconds (this
        blocks, and a unit is stopped on a loop of its own: from the event loop use
        :meth:`aremove`). Raises FailedPrecondition when processes remain, the OS error's status
        for other errors.
        """
        for step in self._removal(timeout):
            if isinstance(step, str):
                systemd.stop_unit_blocking(step)
            else:
                time.sleep(step)

    async def aremove(self, timeout: float = REMOVE_TIMEOUT) -> None:
        """:meth:`remove` for the event loop: it waits out EBUSY and systemd's job without
        blocking the loop.

        It runs to its end even when the caller is cancelled (shielded, and bounded by
        ``timeout``), and only then is the cancellation raised: a cancelled caller never leaves
        behind a cgroup it was removing.
        """
        steps = self._removal(timeout)
        try:
            step = next(steps)
        except StopIteration:
            return  # the usual case: all removed at once, without a task and a turn of the loop
        removal = asyncio.ensure_future(_pausing(steps, step))
        cancelled: asyncio.CancelledError | None = None
        while not removal.done():
            try:
                await asyncio.wait([removal])  # cancelling this wait leaves the removal running
            except asyncio.CancelledError as exc:
                cancelled = exc
        if cancelled is not None:
            removal.exception()  # retrieved: the cancellation is what the caller gets
            raise cancelled
        removal.result()

    def _removal(self, timeout: float) -> Iterator[float | str]:
        """The removal, pausing by yielding how long to wait before the next rmdir attempt, or the
        name of a unit for the caller to stop (and wait for) before it goes on."""
        deadline = time.monotonic() + timeout
        if self.unit:
            self.release_placeholder()
            if not self.is_slice:
                # Below a scope is ours; its own directory is systemd's, gone with the unit. A
                # slice is systemd's throughout: stopping it stops the scopes in it.
                for path in self.paths.values():
                    for directory in _subtree(path)[:0:-1]:
                        yield from _rmdir(directory, deadline)
            yield self.unit
            return
        for path in self.paths.values():
            try:
                os.rmdir(path)  # the usual case: empty, no child cgroups left
                continue
            except FileNotFoundError:
                continue
            except OSError as exc:
                if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                    raise error_from_oserror(exc, f"cannot remove cgroup {path}") from exc
            for directory in _subtree(path)[::-1]:
                yield from _rmdir(directory, deadline)
        if _holds and _parents_held(self):
            return
        for dirs in self.owned_parents.values():
            for directory in reversed(dirs):
                try:
                    os.rmdir(directory)
                except OSError as exc:
                    # Another sandbox may live there, or be creating its directory right now.
                    if exc.errno not in (errno.ENOENT, errno.ENOTEMPTY, errno.EBUSY):
                        raise error_from_oserror(exc, f"cannot remove cgroup {directory}") from exc
                    break


def _systemd_hierarchy() -> Hierarchy:
    """The v2 hierarchy, on a host where it is the only one (the systemd driver's); else FailedPrecondition."""
    found = discover_hierarchies()
    v2 = next((h for h in found if h.key == V2), None)
    if v2 is None or not _pure_v2(found):
        raise FailedPrecondition("the systemd cgroup driver needs a host on pure cgroup v2; this one mounts cgroup "
                                 "v1 controllers: use cgroup_driver = \"cgroupfs\"")
    return v2


async def _start_scope(manager: systemd.Manager, unit: str, parent_slice: str, directory: str) -> None:
    """Start the scope ``unit`` (its cgroup ``directory``) in ``parent_slice`` with a placeholder
    as its first process, kept in :data:`_placeholders` until released."""
    placeholder = systemd.Placeholder()
    _placeholders[unit] = placeholder
    await manager.start_scope(unit, parent_slice, placeholder.pid, [])
    own = systemd.own_cgroup(placeholder.pid)
    if not directory.endswith(own):
        raise FailedPrecondition(f"systemd started {unit}, but its process is in {own}, not in {directory}")


async def _pausing(steps: Iterator[float | str], step: float | str) -> None:
    """Run the rest of a removal (SandboxCgroup._removal) from its step ``step``: a wait, or a unit
    to stop."""
    while True:
        if isinstance(step, str):
            await (await systemd.manager()).stop_unit(step)
        else:
            await asyncio.sleep(step)
        try:
            step = next(steps)
        except StopIteration:
            return


def _base(hierarchy: Hierarchy, parent: str, pure_v2: bool) -> str:
    """The hierarchy path ``parent`` is relative to: the root for an absolute one; else this
    process's own cgroup, but for the default parent on pure v2, which is at the root: our own
    cgroup has processes (us), so nothing below it could be handed a controller."""
    if parent.startswith("/"):
        return "/"
    if pure_v2 and (parent == DEFAULT_PARENT or parent.startswith(DEFAULT_PARENT + "/")):
        return "/"
    return hierarchy.own_path


def _enable_controllers(top: str, target: str) -> list[str]:
    """Enable each of :data:`V2_CONTROLLERS` that is available in the cgroup.subtree_control of the
    v2 directory ``top`` and of every one below it down to ``target`` included; the controllers
    ``target`` hands to its children then. A level that refuses one (it has processes of its own:
    EBUSY) hands it no further, and the resources that need it are refused by name at Update."""
    levels = [top]
    rel = os.path.relpath(target, top)
    for part in ([] if rel == "." else rel.split("/")):
        levels.append(os.path.join(levels[-1], part))
    enabled: list[str] = []
    for directory in levels:
        available = (_read_text(directory, "cgroup.controllers") or "").split()
        if not available:
            return []  # none here, none below (this machine's v2 hierarchy has none at all)
        enabled = (_read_text(directory, "cgroup.subtree_control") or "").split()
        for controller in V2_CONTROLLERS:
            if controller in available and controller not in enabled:
                try:
                    linux.write_file(os.path.join(directory, "cgroup.subtree_control"), b"+" + controller.encode())
                    enabled.append(controller)
                except OSError as exc:
                    log.debug("cannot enable the %s controller below %s: %s", controller, directory, exc.strerror)
    return enabled


def _parent_dirs(hierarchy: Hierarchy, base: str, parent: str, parent_dir: str | None) -> list[str]:
    """The directories of ``<base>/<parent>`` (``parent_dir``, already known) and each of its
    ancestors below ``base``, outermost first (podshim, podshim/<namespace>); those outside the
    mount left out."""
    parts = parent.strip("/").split("/")
    found = [hierarchy.directory(os.path.join(base, *parts[:i])) for i in range(1, len(parts))]
    found.append(parent_dir)
    return [d for d in found if d is not None]


def _make_dirs_retrying(target: str, *, copy_cpuset: bool) -> list[str]:
    # ENOENT: another sandbox's remove() took an empty parent away between our isdir() and
    # mkdir(); build the path again.
    for _ in range(_MKDIR_ATTEMPTS - 1):
        try:
            return _make_dirs(target, copy_cpuset=copy_cpuset)
        except FileNotFoundError:
            continue
    return _make_dirs(target, copy_cpuset=copy_cpuset)


def _make_dirs(target: str, *, copy_cpuset: bool) -> list[str]:
    """mkdir ``target`` and any missing parents; return what was made, outermost first.

    Raises FileExistsError when ``target`` exists.
    """
    made: list[str] = []
    try:
        try:
            os.mkdir(target, 0o755)  # the usual case: the parents exist (the template holds them)
            made.append(target)
        except FileNotFoundError:
            missing = [target]
            probe = os.path.dirname(target)
            while not os.path.isdir(probe):
                missing.append(probe)
                probe = os.path.dirname(probe)
            for directory in reversed(missing):
                try:
                    os.mkdir(directory, 0o755)
                except FileExistsError:
                    if directory == target:
                        raise
                    continue  # a sibling sandbox made the same parent just now: not ours
                made.append(directory)
        if copy_cpuset:
            _fill_cpuset(target)
    except BaseException:
        for directory in reversed(made):
            try:
                os.rmdir(directory)
            except OSError:
                pass
        raise
    return made


_CPUSET_KNOBS = ("cpuset.cpus", "cpuset.mems")


def _fill_cpuset(target: str) -> None:
    """Give the cpuset directory ``target`` (just made) its parent's cpus and mems, and so every
    ancestor whose own are empty, outermost first: a sibling sandbox may have made a shared
    parent a moment ago and not filled it yet, and a task cannot join a cpuset cgroup whose cpus
    or mems are empty (ENOSPC). ``target`` is ours and new: written without being read (the
    kernel's clone_children may have filled it already: the same values). An ancestor keeps a
    value it has. The usual case reads the two files of the parent and writes the two of
    ``target``."""
    levels = [target]
    while True:
        above = [_read_bytes(os.path.join(os.path.dirname(levels[-1]), knob)) for knob in _CPUSET_KNOBS]
        if all(above):
            break
        levels.append(os.path.dirname(levels[-1]))
    for directory in reversed(levels):
        values = []
        for knob, value in zip(_CPUSET_KNOBS, above, strict=False):
            path = os.path.join(directory, knob)
            own = _read_bytes(path) if directory != target else b""
            if not own:
                linux.write_file(path, value)
                own = value
            values.append(own)
        above = values


def _rmdir(directory: str, deadline: float) -> Iterator[float]:
    """rmdir ``directory``, yielding how long to wait before each retry while it is EBUSY."""
    delay = 0.001
    while True:
        try:
            os.rmdir(directory)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise error_from_oserror(exc, f"cannot remove cgroup {directory}") from exc
            if time.monotonic() >= deadline:
                raise FailedPrecondition(f"cgroup {directory} still has processes; kill them first") from None
        yield delay
        delay = min(delay * 2, 0.05)



