"""The sandbox's cgroup: one directory in every writable hierarchy, v1 and v2.

Hierarchies are discovered from /proc/self/cgroup and /proc/self/mountinfo, never hard-coded:
on a hybrid machine every mounted v1 controller (cpu, cpuacct, cpuset, memory, pids, blkio,
devices, freezer, name=systemd, ...) gets a directory, and so does the v2 hierarchy, which may
have no controllers and then only tracks membership (cpu.stat, cgroup.kill, cgroup.procs).

A hierarchy that refuses the mkdir with EROFS/EACCES/EPERM (v1 is mounted read-only inside
systemd-nspawn) is skipped and recorded in :attr:`SandboxCgroup.skipped`; metrics degrade to
"unavailable" rather than fail.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import logging
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from shim.kernel import linux, mountinfo
from shim.rpc.files import read_file
from shim.rpc.processes import process_alive
from shim.rpc.records import Record, set_field as _set
from shim.rpc.trees import walk
from shim.rpc.status import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, RpcError, error_from_oserror

__all__ = ["DEFAULT_PARENT", "METRIC_KEYS", "REMOVE_TIMEOUT", "UPDATE_KEYS", "RESOURCE_FILES", "V2", "V2_CONTROLLERS",
           "PAUSE_LEAF", "Hierarchy", "cpu_weight",
           "SandboxCgroup", "birth_in_v2_allowed", "huge_page_pool", "discover_hierarchies", "entry_files", "hold_parent", "no_metrics",
           "remove_stale_holds"]

log = logging.getLogger(__name__)

DEFAULT_PARENT = "podshim"
REMOVE_TIMEOUT = 1.0  # seconds rmdir retries EBUSY while killed tasks leave the group
V2 = "unified"  # the key of the cgroup v2 hierarchy in SandboxCgroup.paths

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
# v1 reports "no limit" as PAGE_COUNTER_MAX pages in bytes (9223372036854771712 with 4 KiB pages).
_UNLIMITED_BYTES = 1 << 62
#: The figures SandboxCgroup.metrics reports (protocol.md 7.1, SandboxMetrics).
METRIC_KEYS = ("cpu_usage_ns", "memory_usage_bytes", "memory_working_set_bytes", "memory_rss_bytes",
               "memory_page_faults", "memory_major_page_faults", "memory_limit_bytes", "pids_current",
               "memory_swap_bytes", "memory_swap_limit_bytes", "cpu_pressure", "memory_pressure", "io_pressure")
#: The figures SandboxCgroup.details reports (protocol.md, Stats and SandboxMetrics with ``details``).
DETAIL_KEYS = ("cpu_user_ns", "cpu_system_ns", "cpu_periods", "cpu_throttled_periods", "cpu_throttled_ns",
               "cpu_period_us", "cpu_quota_us", "cpu_shares", "memory_cache_bytes", "memory_mapped_file_bytes",
               "memory_rss_bytes", "memory_page_faults", "memory_major_page_faults", "memory_active_file_bytes",
               "memory_inactive_file_bytes", "memory_kernel_bytes", "memory_failcnt", "memory_max_usage_bytes",
               "memory_reservation_bytes", "oom_kills", "pids_max", "block_io")
#: The pressure (PSI) figures and their files in a cgroup v2 directory (the kernel keeps them for
#: every v2 cgroup, whichever controllers are enabled).
_PRESSURE = {"cpu_pressure": "cpu.pressure", "memory_pressure": "memory.pressure", "io_pressure": "io.pressure"}
#: Each resource of Update and Create (protocol.md 7.3) kept in a cgroup file: its controller, its
#: cgroup v1 file, where an OCI config's ``linux.resources`` says it (None: the shim's write only;
#: see :mod:`shim.runtime.oci.spec`), and its cgroup v2 file (``{size}``: the page size of a
#: hugepage limit). A controller mounted on v1 is written there; else, enabled on the task's v2
#: directory, in v2's file, the value converted: shares to cpu.weight (:func:`cpu_weight`), quota
#: and period together as cpu.max (``max`` for -1), the memory+swap limit less the memory limit as
#: memory.swap.max, -1 as ``max``. The others: ``oom_score_adj`` goes to /proc/<pid>/oom_score_adj,
#: ``unified`` to the task's v2 directory as named.
RESOURCE_FILES = {
    "cpu_shares": ("cpu", "cpu.shares", "cpu.shares", "cpu.weight"),
    "cpu_quota_us": ("cpu", "cpu.cfs_quota_us", "cpu.quota", "cpu.max"),
    "cpu_period_us": ("cpu", "cpu.cfs_period_us", "cpu.period", "cpu.max"),
    "memory_limit_bytes": ("memory", "memory.limit_in_bytes", "memory.limit", "memory.max"),
    "memory_swap_limit_bytes": ("memory", "memory.memsw.limit_in_bytes", "memory.swap", "memory.swap.max"),
    "cpuset_cpus": ("cpuset", "cpuset.cpus", "cpu.cpus", "cpuset.cpus"),
    "cpuset_mems": ("cpuset", "cpuset.mems", "cpu.mems", "cpuset.mems"),
    "pids_limit": ("pids", "pids.max", "pids.limit", "pids.max"),
    "hugepage_limits": ("hugetlb", "hugetlb.{size}.limit_in_bytes", None, "hugetlb.{size}.max"),
}
#: The keys SandboxCgroup.update accepts (protocol.md 7.3, Update).
UPDATE_KEYS = (*RESOURCE_FILES, "oom_score_adj", "unified")
#: Where the kernel lists its huge page sizes (hugepages-2048kB) and the pool of each.
HUGEPAGES_DIR = "/sys/kernel/mm/hugepages"
# Compiled at their first use (re's cache), not at import: a shim starts without them (issue #15).
_CPU_LIST = r"\d+(-\d+)?(,\d+(-\d+)?)*"
_PAGE_SIZE = r"\d+[KMGT]B"
# memory.stat's names (hierarchical totals on v1) of the figures metrics() reports.
_V1_MEMORY_STAT = {"inactive_file": "total_inactive_file", "rss": "total_rss", "pgfault": "total_pgfault",
                   "pgmajfault": "total_pgmajfault"}
_V2_MEMORY_STAT = {"inactive_file": "inactive_file", "rss": "anon", "pgfault": "pgfault", "pgmajfault": "pgmajfault"}


_PAGE_UNITS = {"K": 1, "M": 1 << 10, "G": 1 << 20, "T": 1 << 30}


def cpu_weight(shares: int) -> int:
    """The cgroup v2 cpu.weight (1 to 10000) of cgroup v1 cpu.shares (2 to 262144): the linear
    map runc 1.1 and crun 1.8 (Debian 12's) use, so a pod gets one weight whichever handler runs it."""
    return 1 + ((shares - 2) * 9999) // 262142


def huge_page_pool(size: str) -> int | None:
    """How many huge pages of ``size`` (``2MB``, as CRI and the hugetlb files write it) a process
    could have: the kernel's pool of them plus what it may overcommit; None when this kernel has
    no such page size."""
    directory = os.path.join(HUGEPAGES_DIR, f"hugepages-{int(size[:-2]) * _PAGE_UNITS[size[-2]]}kB")
    pages = [_read_int(directory, name) for name in ("nr_hugepages", "nr_overcommit_hugepages")]
    return None if pages[0] is None else pages[0] + (pages[1] or 0)


class Hierarchy(Record):
    """One mounted cgroup hierarchy as this process sees it."""

    __slots__ = ("key", "controllers", "mountpoint", "mount_root", "own_path")
    key: str  # v1: the controller list from /proc/self/cgroup ("cpu", "name=systemd"); v2: "unified"
    controllers: frozenset[str]
    mountpoint: str
    mount_root: str  # the hierarchy path mounted at mountpoint (not "/" inside a cgroup namespace)
    own_path: str  # this process's cgroup in the hierarchy

    def __init__(self, key: str, controllers: frozenset[str], mountpoint: str, mount_root: str,
                 own_path: str) -> None:
        _set(self, "key", key)
        _set(self, "controllers", controllers)
        _set(self, "mountpoint", mountpoint)
        _set(self, "mount_root", mount_root)
        _set(self, "own_path", own_path)

    def directory(self, cgroup_path: str) -> str | None:
        """The directory of hierarchy path ``cgroup_path``, or None if it is outside the mount."""
        # String work on normalised paths (os.path.relpath costs ten times as much, and a
        # sandbox's cgroup asks this thirty times).
        path = os.path.normpath("/" + cgroup_path.lstrip("/"))
        root = os.path.normpath("/" + self.mount_root.lstrip("/"))
        if path == root:
            return self.mountpoint
        if root == "/":
            rel = path[1:]
        elif path.startswith(root + "/"):
            rel = path[len(root) + 1:]
        else:
            return None
        return os.path.join(self.mountpoint, rel)


def no_metrics(reason: str) -> dict[str, Any]:
    """The metrics of what has no cgroup: every figure None, and ``reason`` as what is unavailable."""
    return {**dict.fromkeys(METRIC_KEYS), "unavailable": [reason]}


#: The cgroup mounts last read from /proc/self/mountinfo, with the device of each mount point then.
_mounts_seen: list[tuple[mountinfo.MountEntry, int]] = []


def _cgroup_mounts() -> list[mountinfo.MountEntry]:
    """Every cgroup mount (v1 and v2) this process sees.

    Reading and parsing mountinfo costs 0.2 ms, and cgroup mounts hardly ever change: the last
    reading is reused while every one of its mount points still is the filesystem it was (the
    same device; a stat each, 2 µs), else mountinfo is read again; and again when a hierarchy
    this process is in has no mount in it (:func:`discover_hierarchies`). What the check cannot
    see: a remount of the same filesystem with other options or another root at the same place.
    """
    if _mounts_seen:
        try:
            if all(os.stat(mount.mount_point).st_dev == dev for mount, dev in _mounts_seen):
                return [mount for mount, _ in _mounts_seen]
        except OSError:
            pass
    mounts = [m for m in mountinfo.read() if m.fstype in ("cgroup", "cgroup2")]
    seen = []
    for mount in mounts:
        try:
            seen.append((mount, os.stat(mount.mount_point).st_dev))
        except OSError:
            return mounts  # not kept: a mount point that cannot be looked at cannot be checked
    _mounts_seen[:] = seen
    return mounts


#: The last answer of discover_hierarchies that found every hierarchy mounted: (the
#: /proc/self/cgroup it read, the cgroup mounts it matched, the hierarchies).
_hierarchies_seen: list[tuple[bytes, list[mountinfo.MountEntry], list[Hierarchy]]] = []


def discover_hierarchies() -> list[Hierarchy]:
    """Every cgroup hierarchy this process belongs to and can see mounted, v1 and v2."""
    own = read_file("/proc/self/cgroup")
    mounts = _cgroup_mounts()
    # The answer is a function of our cgroups and the mounts: the last one is reused while both
    # read the same (matching them costs as much as reading them, twice that in a cold shim).
    if _hierarchies_seen and _hierarchies_seen[0][0] == own and _hierarchies_seen[0][1] == mounts:
        return list(_hierarchies_seen[0][2])
    lines = own.decode().splitlines()
    found, unmounted = _match_mounts(lines, mounts)
    if unmounted and _mounts_seen:
        # A hierarchy the kept reading does not show (mounted since?): read mountinfo again.
        _mounts_seen.clear()
        mounts = _cgroup_mounts()
        found, unmounted = _match_mounts(lines, mounts)
    # Not kept with a hierarchy unmounted: the next call reads mountinfo again for it.
    _hierarchies_seen[:] = [(own, mounts, found)] if not unmounted else []
    return list(found)


def _match_mounts(lines: list[str], mounts: list[mountinfo.MountEntry]) -> tuple[list[Hierarchy], int]:
    """The hierarchies of /proc/self/cgroup's ``lines`` found in ``mounts``, and how many were not."""
    found = []
    unmounted = 0
    for line in lines:
        hierarchy_id, names, own_path = line.split(":", 2)
        controllers = frozenset(names.split(",")) if names else frozenset()
        for mount in mounts:
            # The first mount of a hierarchy wins; later ones are bind mounts of the same.
            if hierarchy_id == "0" and mount.fstype == "cgroup2":
                found.append(Hierarchy(V2, controllers, mount.mount_point, mount.root, own_path))
                break
            if (hierarchy_id != "0" and mount.fstype == "cgroup"
                    and controllers <= frozenset(mount.super_options.split(","))):
                found.append(Hierarchy(names, controllers, mount.mount_point, mount.root, own_path))
                break
        else:
            unmounted += 1
    return found, unmounted


_birth_in_v2: list[bool] = []  # the answer of birth_in_v2_allowed, once known


def birth_in_v2_allowed() -> bool:
    """Whether this process can make a child born in a cgroup v2 directory (clone3 with
    CLONE_INTO_CGROUP): tried once, with a child born in our own v2 cgroup that exits at once,
    and remembered (a forked shim inherits its template's answer). False where the kernel (before
    5.7) or a seccomp filter (Docker's default answers clone3 ENOSYS) refuses it, or where there
    is no v2 hierarchy to try it on: then a process moves into its v2 cgroup by cgroup.procs.
    """
    if not _birth_in_v2:
        _birth_in_v2.append(_try_birth_in_v2())
    return _birth_in_v2[0]


def _try_birth_in_v2() -> bool:
    own = next((h.directory(h.own_path) for h in discover_hierarchies() if h.key == V2), None)
    if own is None:
        return False
    try:
        fd = os.open(own, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        old_mask = linux.block_all_signals()  # the child runs no Python handler: it only exits
        try:
            pid = linux.fork_into_cgroup(fd)
            if pid == 0:
                os._exit(0)
        finally:
            linux.set_signal_mask(old_mask)
    except OSError as exc:
        if exc.errno in linux.CLONE3_REFUSED or exc.errno in (errno.EBADF, errno.EOPNOTSUPP, errno.EBUSY):
            return False
        raise
    finally:
        os.close(fd)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass  # a reaper of this process took it
    return True


def entry_files(procs_files: Iterable[str]) -> tuple[list[str], list[str]]:
    """How a process with one thread enters the cgroups whose cgroup.procs files are given without
    the kernel's global cgroup_threadgroup_rwsem (whose writer waits an RCU grace period, 6-8 ms
    here, where a move takes 0.1 ms otherwise): ``(tasks files, v2 directories)``.

    In a v1 hierarchy, writing "0" to the directory's ``tasks`` file moves the writing thread
    alone, which takes no global lock; a v2 directory (the one kind with a
    ``cgroup.controllers`` file) is entered by being born there
    (:func:`shim.kernel.linux.fork_into_cgroup`). A directory that does not exist counts as v1:
    the write to its ``tasks`` file fails, naming it.
    """
    # Which mount a directory is below tells its kind without a lookup in each directory (a
    # missing name in a new cgroup directory costs 20 µs cold, ten of them per launch): the one
    # a v2 mount holds is still checked for its cgroup.controllers, and one below no known
    # cgroup mount too. A v1 directory taken for v2 (the mounts changed since they were read)
    # fails that check; a v2 one taken for v1 fails the launch at its tasks file, naming it.
    mounts = [mount for mount, _ in _mounts_seen] or _cgroup_mounts()
    tasks, v2_dirs = [], []
    for procs in procs_files:
        directory = os.path.dirname(procs)
        fstype = _mount_type(directory, mounts)
        if fstype != "cgroup" and os.path.exists(os.path.join(directory, "cgroup.controllers")):
            v2_dirs.append(directory)
        else:
            tasks.append(os.path.join(directory, "tasks"))
    return tasks, v2_dirs


def _mount_type(path: str, mounts: list[mountinfo.MountEntry]) -> str | None:
    """The filesystem type ("cgroup", "cgroup2") of the deepest of ``mounts`` that holds
    ``path``, by its name alone; None when none does."""
    best, fstype = -1, None
    for mount in mounts:
        point = mount.mount_point
        if len(point) > best and (path == point or path.startswith(point.rstrip("/") + "/")):
            best, fstype = len(point), mount.fstype
    return fstype


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
    those of a caller-given parent that :meth:`create` had to make itself.
    """

    __slots__ = ("name", "paths", "skipped", "owned_parents", "leaf")
    mutable = True
    name: str
    paths: dict[str, str]
    skipped: dict[str, str]
    owned_parents: dict[str, list[str]]
    leaf: str  # PAUSE_LEAF when the v2 directory hands controllers to its tasks, else ""

    def __init__(self, name: str, paths: dict[str, str], skipped: dict[str, str] | None = None,
                 owned_parents: dict[str, list[str]] | None = None, leaf: str = "") -> None:
        self.name = name
        self.paths = paths
        self.skipped = {} if skipped is None else skipped
        self.owned_parents = {} if owned_parents is None else owned_parents
        self.leaf = leaf

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
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise InvalidArgument(f"malformed cgroup record: {exc!r}") from None
        _validate(cgroup.name, None)
        if cgroup.leaf not in ("", PAUSE_LEAF):
            raise InvalidArgument(f"malformed cgroup record: leaf {cgroup.leaf!r}")
        if not all(os.path.isabs(path) for path in cgroup.paths.values()):
            raise InvalidArgument("malformed cgroup record: paths must be absolute")
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
                try:
                    found.update(_read_pids(directory))
                except OSError as exc:
                    raise error_from_oserror(exc, f"cannot list the processes of cgroup {directory}") from exc
        return found

    def metrics(self) -> dict[str, Any]:
        """Usage figures of this cgroup and everything below it; never raises.

        Keys (protocol.md, SandboxMetrics): ``cpu_usage_ns`` (cpuacct.usage, else v2 cpu.stat
        usage_usec × 1000), ``memory_usage_bytes`` (memory.usage_in_bytes, else memory.current),
        ``memory_working_set_bytes`` (usage minus inactive file pages, as cadvisor and
        containerd count it), ``memory_rss_bytes``, ``memory_page_faults``,
        ``memory_major_page_faults`` (memory.stat), ``memory_limit_bytes`` (None also when
        unlimited), ``pids_current`` (pids.current, v1's or v2's, counts tasks; without a pids
        controller, the processes in cgroup.procs are counted), ``memory_swap_bytes`` (v1: memory.memsw.usage_in_bytes less
        memory.usage_in_bytes; v2: memory.swap.current), ``memory_swap_limit_bytes`` (the swap
        alone: v1 memory.memsw.limit_in_bytes less memory.limit_in_bytes, v2 memory.swap.max;
        None also when unlimited), ``cpu_pressure``, ``memory_pressure``, ``io_pressure`` (the v2
        directory's PSI files: ``{"some": {"total_us", "avg10", "avg60", "avg300"}, "full": ...}``,
        the lines the kernel writes), and ``unavailable``: the names of the figures that could not
        be read (their value is None). Nothing is estimated.
        """
        v1 = self._v1_paths()
        v2 = self.paths.get(V2)

        cpu = _read_int(v1["cpuacct"], "cpuacct.usage") if "cpuacct" in v1 else None
        if cpu is None and v2 is not None:
            usec = _read_keyed(v2, "cpu.stat", "usage_usec")
            cpu = usec * 1000 if usec is not None else None

        memory = _read_int(v1["memory"], "memory.usage_in_bytes") if "memory" in v1 else None
        stat_names = _V1_MEMORY_STAT
        stat = _read_flat_keyed(v1["memory"], "memory.stat") if "memory" in v1 and memory is not None else None
        if memory is None and v2 is not None:
            memory = _read_int(v2, "memory.current")
            stat_names = _V2_MEMORY_STAT
            stat = _read_flat_keyed(v2, "memory.stat") if memory is not None else None
        stat = stat or {}
        inactive_file = stat.get(stat_names["inactive_file"])
        working_set = max(memory - inactive_file, 0) if memory is not None and inactive_file is not None else None

        raw = _read_text(v1["memory"], "memory.limit_in_bytes") if "memory" in v1 else None
        if raw is None and v2 is not None:
            raw = _read_text(v2, "memory.max")
        limit_known = raw == "max" or (raw or "").isdigit()
        limit = int(raw) if limit_known and raw != "max" and int(raw) < _UNLIMITED_BYTES else None

        pids = _read_int(v1["pids"], "pids.current") if "pids" in v1 else None
        if pids is None and v2 is not None:
            pids = _read_int(v2, "pids.current")  # v2 with its pids controller enabled
        if pids is None and v2 is not None and os.path.isdir(v2):
            try:
                pids = sum(len(_read_pids(d)) for d in _subtree(v2))
            except (OSError, ValueError):
                pids = None

        from_v1 = memory is not None and stat_names is _V1_MEMORY_STAT
        swap, swap_limit, swap_limit_known = _swap(v1["memory"] if from_v1 else None, v2, memory, raw)

        metrics: dict[str, Any] = {
            "cpu_usage_ns": cpu,
            "memory_usage_bytes": memory,
            "memory_working_set_bytes": working_set,
            "memory_rss_bytes": stat.get(stat_names["rss"]),
            "memory_page_faults": stat.get(stat_names["pgfault"]),
            "memory_major_page_faults": stat.get(stat_names["pgmajfault"]),
            "memory_limit_bytes": limit,
            "pids_current": pids,
            "memory_swap_bytes": swap,
            "memory_swap_limit_bytes": swap_limit,
            **{name: _read_pressure(v2, file) if v2 is not None else None for name, file in _PRESSURE.items()},
        }
        unlimited = {"memory_limit_bytes": limit_known, "memory_swap_limit_bytes": swap_limit_known}
        metrics["unavailable"] = [
            name for name, value in metrics.items() if value is None and not unlimited.get(name, False)
        ]
        return metrics

    def details(self) -> dict[str, Any]:
        """The figures beyond :meth:`metrics` that cadvisor's metrics name (CRI's
        ListPodSandboxMetrics), read only when asked; a figure the host does not keep is None.

        ``cpu_user_ns``, ``cpu_system_ns`` (v1 cpuacct.stat in clock ticks, v2 cpu.stat);
        ``cpu_periods``, ``cpu_throttled_periods``, ``cpu_throttled_ns`` (cpu.stat);
        ``memory_cache_bytes``, ``memory_mapped_file_bytes``, ``memory_rss_bytes``,
        ``memory_page_faults``, ``memory_major_page_faults`` (memory.stat, this cgroup's own
        and below it), ``memory_active_file_bytes``, ``memory_inactive_file_bytes``,
        ``memory_kernel_bytes`` (v1 memory.kmem.usage_in_bytes, v2 memory.stat kernel),
        ``memory_failcnt`` (v1 only), ``memory_max_usage_bytes`` (v1 memory.max_usage_in_bytes,
        v2 memory.peak), ``oom_kills``; the limits in force: ``cpu_period_us``, ``cpu_quota_us``
        (None when unlimited), ``cpu_shares`` (v2: cpu.weight mapped back), ``memory_reservation_bytes``
        (v1 soft limit, v2 memory.low; None when unlimited), ``pids_max`` (0 when unlimited, as
        cadvisor counts it); ``block_io``: ``{"MAJ:MIN": {"read_bytes", "write_bytes", "reads",
        "writes"}}`` of each device the cgroup did IO on (v1 blkio.throttle.io_service_bytes and
        io_serviced, recursive where the kernel has them; v2 io.stat).
        """
        v1 = self._v1_paths()
        v2 = self.paths.get(V2)
        figures: dict[str, Any] = dict.fromkeys(DETAIL_KEYS)
        figures["oom_kills"] = self.oom_kills()
        if "cpuacct" in v1:
            ticks = _read_flat_keyed(v1["cpuacct"], "cpuacct.stat") or {}
            hz = os.sysconf("SC_CLK_TCK")
            for key, name in (("cpu_user_ns", "user"), ("cpu_system_ns", "system")):
                if name in ticks:
                    figures[key] = ticks[name] * 1_000_000_000 // hz
        cpu_v1 = v1.get("cpu")
        cpu_stat = (_read_flat_keyed(cpu_v1, "cpu.stat") if cpu_v1 else None) or {}
        v2_cpu = (_read_flat_keyed(v2, "cpu.stat") if v2 is not None else None) or {}
        if figures["cpu_user_ns"] is None and "user_usec" in v2_cpu:
            figures["cpu_user_ns"] = v2_cpu["user_usec"] * 1000
            figures["cpu_system_ns"] = v2_cpu.get("system_usec", 0) * 1000
        if "nr_periods" in cpu_stat:
            figures.update(cpu_periods=cpu_stat["nr_periods"], cpu_throttled_periods=cpu_stat.get("nr_throttled"),
                           cpu_throttled_ns=cpu_stat.get("throttled_time"))
        elif "nr_periods" in v2_cpu:
            throttled = v2_cpu.get("throttled_usec")
            figures.update(cpu_periods=v2_cpu["nr_periods"], cpu_throttled_periods=v2_cpu.get("nr_throttled"),
                           cpu_throttled_ns=throttled * 1000 if throttled is not None else None)
        if cpu_v1 is not None:
            figures["cpu_period_us"] = _read_int(cpu_v1, "cpu.cfs_period_us")
            quota = _read_int(cpu_v1, "cpu.cfs_quota_us")
            figures["cpu_quota_us"] = quota if quota is not None and quota > 0 else None
            figures["cpu_shares"] = _read_int(cpu_v1, "cpu.shares")
        elif _enabled(v2, "cpu"):
            assert v2 is not None
            quota, _, period = (_read_text(v2, "cpu.max") or "").partition(" ")
            figures["cpu_period_us"] = int(period) if period.isdigit() else None
            figures["cpu_quota_us"] = int(quota) if quota.isdigit() else None
            weight = _read_int(v2, "cpu.weight")
            figures["cpu_shares"] = 2 + ((weight - 1) * 262142) // 9999 if weight is not None else None
        memory_v1 = v1.get("memory")
        if memory_v1 is not None and os.path.isdir(memory_v1):
            stat = _read_flat_keyed(memory_v1, "memory.stat") or {}
            for key, name in (("memory_cache_bytes", "total_cache"), ("memory_mapped_file_bytes", "total_mapped_file"),
                              ("memory_rss_bytes", "total_rss"), ("memory_page_faults", "total_pgfault"),
                              ("memory_major_page_faults", "total_pgmajfault"),
                              ("memory_active_file_bytes", "total_active_file"),
                              ("memory_inactive_file_bytes", "total_inactive_file")):
                figures[key] = stat.get(name)
            figures["memory_kernel_bytes"] = _read_int(memory_v1, "memory.kmem.usage_in_bytes")
            figures["memory_failcnt"] = _read_int(memory_v1, "memory.failcnt")
            figures["memory_max_usage_bytes"] = _read_int(memory_v1, "memory.max_usage_in_bytes")
            soft = _read_int(memory_v1, "memory.soft_limit_in_bytes")
            figures["memory_reservation_bytes"] = soft if soft is not None and soft < _UNLIMITED_BYTES else None
        elif v2 is not None and _enabled(v2, "memory"):
            stat = _read_flat_keyed(v2, "memory.stat") or {}
            for key, name in (("memory_cache_bytes", "file"), ("memory_mapped_file_bytes", "file_mapped"),
                              ("memory_rss_bytes", "anon"), ("memory_page_faults", "pgfault"),
                              ("memory_major_page_faults", "pgmajfault"), ("memory_active_file_bytes", "active_file"),
                              ("memory_inactive_file_bytes", "inactive_file"), ("memory_kernel_bytes", "kernel")):
                figures[key] = stat.get(name)
            figures["memory_max_usage_bytes"] = _read_int(v2, "memory.peak")
            low = _read_int(v2, "memory.low")
            figures["memory_reservation_bytes"] = low or None
        figures["block_io"] = _block_io(v1.get("blkio"), v2 if _enabled(v2, "io") else None)
        pids_dir = v1.get("pids") or (v2 if _enabled(v2, "pids") else None)
        if pids_dir is not None:
            raw = _read_text(pids_dir, "pids.max")
            figures["pids_max"] = 0 if raw == "max" else int(raw) if (raw or "").isdigit() else None
        return figures

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

    def oom_kills(self) -> int | None:
        """How many processes of this cgroup the kernel's OOM killer killed: v1's ``oom_kill`` of
        memory.oom_control, else v2's of memory.events; None when neither can be read."""
        v1 = self._v1_paths()
        if "memory" in v1:
            return _read_keyed(v1["memory"], "memory.oom_control", "oom_kill")
        v2 = self.paths.get(V2)
        return _read_keyed(v2, "memory.events", "oom_kill") if v2 is not None else None

    def _v1_paths(self) -> dict[str, str]:
        """controller -> directory, for every v1 hierarchy ("cpu,cpuacct" gives both)."""
        return {c: path for key, path in self.paths.items() if key != V2 for c in key.split(",")}

    def update(self, resources: Mapping[str, Any]) -> None:
        """Apply ``resources`` (protocol.md 7.3, Update) to this cgroup; keys absent or None are
        left as they are.

        Every key is checked first (its type and range, and that its file exists here), so a
        refusal writes nothing; if the kernel then refuses a write, the files written before it
        get their old contents back. Raises InvalidArgument naming the key (unknown key, bad
        value, a controller or file this host does not have, a write the kernel refuses),
        NotFound when the cgroup is gone, Internal for other errors.
        """
        writes = self._planned_writes(resources)
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
                        why = exc.strerror
                        if process_file and exc.errno in (errno.EACCES, errno.EPERM):
                            why += " (lowering it below the shim's own needs CAP_SYS_RESOURCE)"
                        raise InvalidArgument(f"resources.{key}: the kernel refused {value.decode()!r} for "
                                              f"{path}: {why}") from None
                    raise error_from_oserror(exc, f"cannot write {path}") from exc
                done.append((key, path, old))
        except BaseException:
            for key, path, old in reversed(done):
                try:
                    linux.write_file(path, _restorable(path, old))
                except OSError as exc:
                    log.error("cannot put back %s after a failed update: %s", path, exc.strerror)
            raise

    def check(self, resources: Mapping[str, Any]) -> None:
        """Check ``resources`` as :meth:`update` would, writing nothing: InvalidArgument naming
        the first key this cgroup's hierarchies cannot apply (the task cgroups below this one
        have the same files: Create checks a task's resources against the sandbox's cgroup)."""
        self._planned_writes(resources, pids=())

    def _planned_writes(self, resources: Mapping[str, Any],
                        pids: Iterable[int] | None = None) -> list[tuple[str, str, bytes]]:
        """(key, file, contents) for every write ``resources`` asks for, in the order the kernel
        accepts them; InvalidArgument for the first key that cannot be applied. ``oom_score_adj``
        is written for ``pids`` (None: the cgroup's processes now)."""
        unknown = sorted(set(resources) - set(UPDATE_KEYS))
        if unknown:
            raise InvalidArgument(f"resources.{unknown[0]} is not a resource podshim can update "
                                  f"(known: {', '.join(UPDATE_KEYS)})")
        v1, v2 = self._v1_paths(), self.paths.get(V2)
        writes: list[tuple[str, str, bytes]] = []

        enabled_v2: list[str] = []  # the v2 directory's controllers, read at the first need

        def file_of(key: str, **names: str) -> tuple[str, bool]:
            """The file of ``key``: its v1 controller's, else its v2 one's; and whether on v2."""
            controller, name, _, v2_name = RESOURCE_FILES[key.split("[")[0]]
            directory = v1.get(controller)
            on_v2 = False
            if directory is None and v2 is not None:
                if not enabled_v2:
                    enabled_v2[:] = (_read_text(v2, "cgroup.controllers") or "").split() or [""]
                if controller in enabled_v2:
                    directory, name, on_v2 = v2, v2_name, True
            if directory is None:
                raise InvalidArgument(f"resources.{key} cannot be applied: this host's {controller} controller is "
                                      "neither mounted on cgroup v1 nor enabled on the task's cgroup v2 directory")
            path = os.path.join(directory, name.format(**names))
            if not os.path.exists(path):
                raise InvalidArgument(f"resources.{key} cannot be applied: {path} does not exist on this host")
            return path, on_v2

        def integer(key: str, low: int, high: int | None = None, unlimited: bool = False) -> int | None:
            value = resources.get(key)
            if value is None:
                return None
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidArgument(f"resources.{key} must be an integer, not {type(value).__name__}")
            if unlimited and value == -1:
                return value
            if value < low or (high is not None and value > high):
                bounds = f"{low} to {high}" if high is not None else f"at least {low}"
                raise InvalidArgument(f"resources.{key} {value} is out of range ({'-1 or ' if unlimited else ''}"
                                      f"{bounds})")
            return value

        shares = integer("cpu_shares", 2, 262144)
        if shares is not None:
            path, on_v2 = file_of("cpu_shares")
            writes.append(("cpu_shares", path, b"%d" % (cpu_weight(shares) if on_v2 else shares)))
        period, quota = integer("cpu_period_us", 1000, 1000000), integer("cpu_quota_us", 1000, unlimited=True)
        for key, value in (("cpu_period_us", period), ("cpu_quota_us", quota)):
            if value is None:
                continue
            path, on_v2 = file_of(key)
            if not on_v2:
                writes.append((key, path, b"%d" % value))
            elif not any(write[1] == path for write in writes):  # v2: one cpu.max for both
                old_quota, _, old_period = (_read_text(v2 or "", "cpu.max") or "max 100000").partition(" ")
                new_quota = old_quota.encode() if quota is None else b"max" if quota == -1 else b"%d" % quota
                writes.append((key, path, new_quota + b" %d" % (period if period is not None else int(old_period))))

        memory = integer("memory_limit_bytes", 1, unlimited=True)
        swap = integer("memory_swap_limit_bytes", 1, unlimited=True)
        if memory is not None and swap is not None and swap != -1 and (memory == -1 or swap < memory):
            raise InvalidArgument(f"resources.memory_swap_limit_bytes {swap} is below memory_limit_bytes {memory}: "
                                  "it counts memory and swap together")
        memory_write = swap_write = None
        if memory is not None:
            path, on_v2 = file_of("memory_limit_bytes")
            memory_write = ("memory_limit_bytes", path, b"max" if on_v2 and memory == -1 else b"%d" % memory)
        if swap is not None:
            path, on_v2 = file_of("memory_swap_limit_bytes")
            if not on_v2:
                swap_write = ("memory_swap_limit_bytes", path, b"%d" % swap)
            elif swap == -1:
                swap_write = ("memory_swap_limit_bytes", path, b"max")
            else:  # v2 limits the swap alone: memory+swap less the memory limit
                limit = memory if memory is not None else _read_int(v2 or "", "memory.max")
                if limit is None or limit == -1:
                    raise InvalidArgument(f"resources.memory_swap_limit_bytes {swap} cannot be applied without a "
                                          "memory limit: on cgroup v2 the swap is limited as memory+swap less "
                                          "memory_limit_bytes")
                if swap < limit:
                    raise InvalidArgument(f"resources.memory_swap_limit_bytes {swap} is below the memory limit "
                                          f"{limit}: it counts memory and swap together")
                swap_write = ("memory_swap_limit_bytes", path, b"%d" % (swap - limit))
        # memory.memsw.limit_in_bytes may never be below memory.limit_in_bytes: raising the
        # memory limit past the current memsw limit must come after the memsw write (v1 only).
        if memory_write is not None and swap_write is not None and swap_write[1].endswith("memsw.limit_in_bytes"):
            current_swap = _read_int(os.path.dirname(swap_write[1]), "memory.memsw.limit_in_bytes")
            raising = memory == -1 or (current_swap is not None and memory > current_swap)
            writes += [swap_write, memory_write] if raising else [memory_write, swap_write]
        else:
            writes += [w for w in (memory_write, swap_write) if w is not None]

        for key in ("cpuset_cpus", "cpuset_mems"):
            value = resources.get(key)
            if value is None:
                continue
            if not isinstance(value, str) or not re.fullmatch(_CPU_LIST, value):
                raise InvalidArgument(f"resources.{key} must be a list such as '0-1,3', not {value!r}")
            writes.append((key, file_of(key)[0], value.encode()))

        pids_limit = integer("pids_limit", 1, unlimited=True)
        if pids_limit is not None:
            writes.append(("pids_limit", file_of("pids_limit")[0], b"max" if pids_limit == -1 else b"%d" % pids_limit))

        hugepages = resources.get("hugepage_limits")
        if hugepages is not None:
            if not isinstance(hugepages, Mapping):
                raise InvalidArgument("resources.hugepage_limits must map page sizes to byte limits")
            for size, limit in sorted(hugepages.items()):
                key = f"hugepage_limits[{size}]"
                if not isinstance(size, str) or not re.fullmatch(_PAGE_SIZE, size):
                    raise InvalidArgument(f"resources.{key}: the page size must be written like 2MB or 1GB")
                if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
                    raise InvalidArgument(f"resources.{key} must be a number of bytes, not {limit!r}")
                pool = huge_page_pool(size)
                if pool is None:
                    raise InvalidArgument(f"resources.{key} cannot be applied: this kernel has no {size} huge pages")
                if limit == 0 and "hugetlb" not in v1 and pool == 0 and not _enabled(v2, "hugetlb"):
                    continue  # no hugetlb controller, but none can be had: "none" holds as it is
                writes.append((key, file_of(key, size=size)[0], b"%d" % limit))

        adj = integer("oom_score_adj", -1000, 1000)
        if adj is not None:
            writes += [("oom_score_adj", f"/proc/{pid}/oom_score_adj", b"%d" % adj)
                       for pid in sorted(self.pids() if pids is None else pids)]

        unified = resources.get("unified")
        if unified is not None:
            if not isinstance(unified, Mapping):
                raise InvalidArgument("resources.unified must map cgroup v2 file names to values")
            for name, value in sorted(unified.items()):
                key = f"unified[{name}]"
                if not isinstance(name, str) or not isinstance(value, str):
                    raise InvalidArgument(f"resources.{key}: names and values must be strings")
                if "/" in name or name.startswith("cgroup.") or name in ("", ".", ".."):
                    raise InvalidArgument(f"resources.{key}: only a controller's file of the task's own cgroup "
                                          "may be written")
                controller = name.split(".")[0]
                enabled = (_read_text(v2, "cgroup.controllers") or "").split() if v2 is not None else []
                if controller not in enabled or not os.path.isfile(os.path.join(v2 or "", name)):
                    where = "on cgroup v1" if controller in v1 else "not mounted"
                    raise InvalidArgument(f"resources.{key} cannot be applied: it is a cgroup v2 file, and this "
                                          f"host's {controller} controller is {where}, not enabled on cgroup v2")
                writes.append((key, os.path.join(v2 or "", name), value.encode()))
        return writes

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
        whoever removes the hold prunes them).

        Idempotent: missing directories are fine. rmdir fails with EBUSY while killed tasks
        are still leaving the group, so that is retried for up to ``timeout`` seconds (this
        blocks; from the event loop use :meth:`aremove`). Raises FailedPrecondition when
        processes remain, the OS error's status for other errors.
        """
        for delay in self._removal(timeout):
            time.sleep(delay)

    async def aremove(self, timeout: float = REMOVE_TIMEOUT) -> None:
        """:meth:`remove` for the event loop: it waits out EBUSY without blocking the loop.

        It runs to its end even when the caller is cancelled (shielded, and bounded by
        ``timeout``), and only then is the cancellation raised: a cancelled caller never leaves
        behind a cgroup it was removing.
        """
        steps = self._removal(timeout)
        try:
            delay = next(steps)
        except StopIteration:
            return  # the usual case: all removed at once, without a task and a turn of the loop
        removal = asyncio.ensure_future(_pausing(steps, delay))
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

    def _removal(self, timeout: float) -> Iterator[float]:
        """The removal, pausing by yielding how long to wait before the next rmdir attempt."""
        deadline = time.monotonic() + timeout
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


async def _pausing(steps: Iterator[float], delay: float) -> None:
    """Run the rest of a removal (SandboxCgroup._removal) that asked to wait ``delay`` seconds."""
    await asyncio.sleep(delay)
    for delay in steps:
        await asyncio.sleep(delay)


def _pure_v2(hierarchies: list[Hierarchy]) -> bool:
    """Whether no controller is mounted on cgroup v1 (named hierarchies such as name=systemd aside)."""
    return not any(c for h in hierarchies if h.key != V2 for c in h.controllers if not c.startswith("name="))


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
        for knob, value in zip(_CPUSET_KNOBS, above):
            path = os.path.join(directory, knob)
            own = _read_bytes(path) if directory != target else b""
            if not own:
                linux.write_file(path, value)
                own = value
            values.append(own)
        above = values


def _subtree(path: str) -> list[str]:
    """``path`` and every cgroup below it, parents before children; [] if missing."""
    try:
        return [path, *(entry.path(path) for entry in walk(path) if entry.is_dir)]
    except (FileNotFoundError, NotADirectoryError):
        return []


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


def _read_bytes(path: str) -> bytes:
    return read_file(path).strip()


def _read_pids(directory: str) -> list[int]:
    try:
        return [int(line) for line in _read_bytes(os.path.join(directory, "cgroup.procs")).split()]
    except FileNotFoundError:
        return []  # removed while we walked


def _read_text(directory: str, name: str) -> str | None:
    try:
        return _read_bytes(os.path.join(directory, name)).decode()
    except (OSError, UnicodeDecodeError):
        return None


def _read_int(directory: str, name: str) -> int | None:
    text = _read_text(directory, name)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _read_flat_keyed(directory: str, name: str) -> dict[str, int] | None:
    """Every ``key value`` line of a flat-keyed file such as memory.stat; None if unreadable."""
    text = _read_text(directory, name)
    if text is None:
        return None
    values = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            values[parts[0]] = int(parts[1])
    return values


def _swap(v1_memory: str | None, v2: str | None, memory: int | None,
          memory_limit: str | None) -> tuple[int | None, int | None, bool]:
    """(swap in use, swap limit or None when unlimited, whether the limit was read) of a cgroup
    whose v1 memory directory is ``v1_memory`` (None: read v2's), whose memory usage is ``memory``
    and memory limit file reads ``memory_limit``. v1 counts memory and swap together (memsw)."""
    if v1_memory is not None:
        both = _read_int(v1_memory, "memory.memsw.usage_in_bytes")
        usage = max(both - memory, 0) if both is not None and memory is not None else None
        both_limit = _read_int(v1_memory, "memory.memsw.limit_in_bytes")
        if both_limit is None or memory_limit is None or not memory_limit.isdigit():
            return usage, None, False
        if both_limit >= _UNLIMITED_BYTES:
            return usage, None, True
        return usage, max(both_limit - int(memory_limit), 0), True
    if v2 is None:
        return None, None, False
    raw = _read_text(v2, "memory.swap.max")
    known = raw == "max" or (raw or "").isdigit()
    return _read_int(v2, "memory.swap.current"), int(raw) if known and raw != "max" else None, known


def _block_io(v1_blkio: str | None, v2: str | None) -> dict[str, dict[str, int]] | None:
    """Bytes and operations read and written, per device ``MAJ:MIN``, by the cgroup and below it;
    None when neither v1's blkio nor v2's io controller can be read."""
    devices: dict[str, dict[str, int]] = {}
    if v1_blkio is not None:
        found = False
        for stem, unit in (("blkio.throttle.io_service_bytes", "bytes"), ("blkio.throttle.io_serviced", "")):
            text = _read_text(v1_blkio, stem + "_recursive")
            text = text if text is not None else _read_text(v1_blkio, stem)
            if text is None:
                continue
            found = True
            for line in text.splitlines():
                parts = line.split()
                if len(parts) == 3 and parts[1] in ("Read", "Write") and parts[2].isdigit():
                    key = f"{parts[1].lower()}_bytes" if unit else f"{parts[1].lower()}s"
                    devices.setdefault(parts[0], {})[key] = int(parts[2])
        return devices if found else None
    if v2 is None:
        return None
    text = _read_text(v2, "io.stat")
    if text is None:
        return None
    for line in text.splitlines():
        device, *pairs = line.split()
        values = dict(pair.partition("=")[::2] for pair in pairs)
        devices[device] = {key: int(values[name]) for key, name in (("read_bytes", "rbytes"), ("write_bytes", "wbytes"),
                                                                    ("reads", "rios"), ("writes", "wios"))
                           if values.get(name, "").isdigit()}
    return devices


def _read_pressure(directory: str, name: str) -> dict[str, dict[str, Any]] | None:
    """A PSI file (``some avg10=0.00 avg60=0.00 avg300=0.00 total=12``, and a ``full`` line) as
    ``{"some": {"avg10": 0.0, "avg60": 0.0, "avg300": 0.0, "total_us": 12}, ...}``, each line the
    kernel writes; None when the file cannot be read or says something else."""
    text = _read_text(directory, name)
    if not text:
        return None
    found: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        kind, *pairs = line.split()
        values = dict(pair.partition("=")[::2] for pair in pairs)
        try:
            found[kind] = {"avg10": float(values["avg10"]), "avg60": float(values["avg60"]),
                           "avg300": float(values["avg300"]), "total_us": int(values["total"])}
        except (KeyError, ValueError):
            return None
    return found if "some" in found else None


def _restorable(path: str, old: bytes) -> bytes:
    """What to write to put ``path`` back to ``old`` (as it was read)."""
    if os.path.basename(path) in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes") and \
            old.isdigit() and int(old) >= _UNLIMITED_BYTES:
        return b"-1"  # the kernel's "unlimited" reads back as a number it refuses on write
    return old


def _enabled(directory: str | None, controller: str) -> bool:
    """Whether ``controller`` is enabled on the v2 cgroup ``directory``."""
    return directory is not None and controller in (_read_text(directory, "cgroup.controllers") or "").split()


def _read_keyed(directory: str, name: str, key: str) -> int | None:
    """The value of ``key`` in a flat-keyed file such as cpu.stat."""
    text = _read_text(directory, name)
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
            return int(parts[1])
    return None
