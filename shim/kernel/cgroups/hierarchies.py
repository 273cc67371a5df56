"""The cgroup hierarchies this process sees: v1 controllers and the v2 one, found from
/proc/self/cgroup and /proc/self/mountinfo, never hard-coded, and how a process enters them."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable

from shim.kernel import linux
from shim.lib import mountinfo
from shim.lib.files import read_file
from shim.rpc.records import Record
from shim.rpc.records import set_field as _set

__all__ = ["V2", "Hierarchy", "birth_in_v2_allowed", "discover_hierarchies", "entry_files", "pure_v2"]

V2 = "unified"  # the key of the cgroup v2 hierarchy in SandboxCgroup.paths


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




def pure_v2(hierarchies: list[Hierarchy]) -> bool:
    """Whether no controller is mounted on cgroup v1 (named hierarchies such as name=systemd aside)."""
    return not any(c for h in hierarchies if h.key != V2 for c in h.controllers if not c.startswith("name="))

