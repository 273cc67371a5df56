"""The cgroup drivers: the names CreateSandbox's ``cgroup_driver`` and podshimd's
``cgroup_driver`` take, and which ``cgroup_parent`` suits each (a slice name or its path for systemd, a
path for cgroupfs), checked alike by the shim's options and podshimd's config. No I/O: the driver
itself is :mod:`shim.kernel.cgroups.systemd`.
"""

from __future__ import annotations

import re

from shim.rpc.status import InvalidArgument

__all__ = ["CGROUPFS", "DRIVERS", "SYSTEMD", "check_parent", "expand_slice", "is_slice_name", "slice_of_parent"]

#: podshim makes and writes the cgroup directories itself.
CGROUPFS = "cgroupfs"
#: Each pod's cgroup is a unit systemd makes in the slice kubelet names (pure cgroup v2).
SYSTEMD = "systemd"
DRIVERS = (CGROUPFS, SYSTEMD)

_UNIT_CHARS = re.compile(r"[A-Za-z0-9:_.\\-]+")


def is_slice_name(parent: str) -> bool:
    """Whether ``parent`` is a slice's unit name (``kubepods-burstable.slice``), not a path."""
    return "/" not in parent and parent.endswith(".slice")


def expand_slice(name: str) -> str:
    """The cgroup path systemd gives slice ``name``: each ``-`` a level (``a-b.slice`` is
    ``/a.slice/a-b.slice``), ``-.slice`` the root. Raises InvalidArgument for a name systemd
    refuses as a slice (a ``/``, an empty level: ``--``, a leading or trailing ``-``)."""
    if name == "-.slice":
        return "/"
    stem = name[:-len(".slice")] if name.endswith(".slice") else ""
    if (not stem or "/" in name or not _UNIT_CHARS.fullmatch(name) or stem.startswith("-") or stem.endswith("-")
            or "--" in stem):
        raise InvalidArgument(f"cgroup parent {name!r} is not a slice name systemd accepts (such as "
                              "kubepods-burstable-pod<uid>.slice)")
    parts = stem.split("-")
    return "/" + "/".join("-".join(parts[:i]) + ".slice" for i in range(1, len(parts) + 1))


def check_parent(parent: str | None, driver: str) -> None:
    """InvalidArgument unless ``parent`` (None: the default) suits ``driver``: a slice name or its
    path for systemd (:func:`slice_of_parent`), a path for cgroupfs (a slice name there would be made into a directory of that name,
    outside the hierarchy kubelet meant)."""
    if driver not in DRIVERS:
        raise InvalidArgument(f"cgroup driver {driver!r} is not known (known: {', '.join(DRIVERS)})")
    if parent is None:
        return
    if driver == CGROUPFS and is_slice_name(parent):
        raise InvalidArgument(f"cgroup parent {parent!r} is a systemd slice, and the cgroup driver is cgroupfs: give "
                              "a cgroup path (/kubepods/...), or run podshimd with cgroup_driver = \"systemd\" and "
                              "kubelet with cgroupDriver: systemd")
    if driver == SYSTEMD:
        slice_of_parent(parent)


def slice_of_parent(parent: str) -> str:
    """The slice a parent names under the systemd driver: a slice's unit name
    (``kubepods-burstable-pod<uid>.slice``) as it is, or the cgroup path systemd gives that slice,
    as kubelet's systemd cgroup manager and critest send it
    (``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice``, ``/test.slice``):
    its last part, as containerd takes it. Raises InvalidArgument for any other path (systemd would
    put a slice of that last name elsewhere than the path says) and for a name systemd refuses."""
    if is_slice_name(parent):
        expand_slice(parent)
        return parent
    name = parent.rpartition("/")[2]
    if is_slice_name(name) and parent == expand_slice(name):
        return name
    raise InvalidArgument(f"cgroup parent {parent!r} is a path, and the cgroup driver is systemd: give a slice name "
                          "(kubepods-burstable-pod<uid>.slice) or the path systemd gives it "
                          "(/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice), "
                          "or use the cgroupfs driver")
