"""Facts about this machine that decide how an OCI runtime is driven (see :mod:`shim.runtime.oci`); whether
a child may lower its oom_score_adj is :func:`shim.kernel.linux.oom_score_adj_permitted`."""

from __future__ import annotations

import os

from shim.kernel import cgroups
from shim.kernel.cgroups import SandboxCgroup, systemd

__all__ = ["HYBRID_CONTROLLERS_FILE", "cgroup_hybrid", "cgroup_unified", "cgroups_path", "systemd_cgroups_path"]

#: The cgroup v2 controller list crun reads to refuse a hybrid layout.
HYBRID_CONTROLLERS_FILE = "/sys/fs/cgroup/unified/cgroup.controllers"


def cgroup_hybrid() -> bool:
    """True on a hybrid cgroup layout: v1 controllers mounted, and cgroup2 at /sys/fs/cgroup/unified."""
    found = cgroups.discover_hierarchies()
    v1_controllers = any(h.key != cgroups.V2 and any(not c.startswith("name=") for c in h.controllers)
                         for h in found)
    unified = any(h.key == cgroups.V2 and h.mountpoint == os.path.dirname(HYBRID_CONTROLLERS_FILE) for h in found)
    return v1_controllers and unified


def cgroup_unified() -> bool:
    """True where /sys/fs/cgroup is the cgroup v2 hierarchy itself: what runc and crun call unified
    mode, where their cgroup managers attach each container's device program (elsewhere they write
    the v1 devices controller)."""
    return any(h.key == cgroups.V2 and h.mountpoint == "/sys/fs/cgroup" for h in cgroups.discover_hierarchies())


def cgroups_path(cgroup: SandboxCgroup) -> str | None:
    """The OCI ``cgroupsPath`` that names ``cgroup``'s directories for a runtime started by this process.

    Relative (to the runtime's own cgroup, which is ours) when the directories are below our cgroup in
    every hierarchy, else absolute when they are the same path from every hierarchy's root; None if
    neither (the runtime then uses its default and the init is moved into ``cgroup`` after create).
    """
    relative, absolute = set(), set()
    paths = cgroup.process_paths()
    for hierarchy in cgroups.discover_hierarchies():
        directory = paths.get(hierarchy.key)
        if directory is None:
            continue
        own, root = hierarchy.directory(hierarchy.own_path), hierarchy.directory("/")
        if own is not None:
            relative.add(os.path.relpath(directory, own))
        if root is not None:
            absolute.add("/" + os.path.relpath(directory, root))
    if len(relative) == 1 and not (path := relative.pop()).startswith(".."):
        return path
    if len(absolute) == 1:
        return absolute.pop()
    return None


def systemd_cgroups_path(cgroup: SandboxCgroup) -> str:
    """The OCI ``cgroupsPath`` (``slice:prefix:name``) that makes the runtime's systemd driver start
    ``cgroup``'s scope: a pod slice's pause scope (its leaf), or a task's scope in its pod's slice."""
    if cgroup.is_slice:
        return systemd.runtime_cgroups_path(cgroup.unit, cgroup.leaf)
    return systemd.runtime_cgroups_path(os.path.basename(os.path.dirname(cgroup.paths[cgroups.V2])), cgroup.unit)
