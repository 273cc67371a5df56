"""/proc/PID/mountinfo, parsed in one place for every reader: the cgroup hierarchies
(:mod:`shim.kernel.cgroups`), the pod layer's propagation checks (:mod:`client.cri.mounts`), the
image store's overlay check (:mod:`client.images.snapshots`) and the benchmarks' clean-up.

Each line is ``ID PARENT MAJ:MIN ROOT MOUNT-POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER-OPTIONS``
(proc(5)); the kernel writes a space, tab, newline or backslash in a path as an octal escape
(``\\040``), which :func:`unescape` undoes. No ctypes here: the commands that read the mount
table import this cheaply.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["MOUNTINFO", "MountEntry", "parse", "read", "unescape"]

#: The mount table of the reader's own mount namespace.
MOUNTINFO = "/proc/self/mountinfo"

_ESCAPE = re.compile(r"\\([0-7]{3})")


class MountEntry(NamedTuple):
    """One line of mountinfo."""

    mount_id: int
    parent_id: int
    root: str  # the path, within its filesystem, of the tree mounted here
    mount_point: str
    options: str  # the mount's own (rw, nosuid, ...)
    optional: tuple[str, ...]  # shared:N, master:N, propagate_from:N, unbindable
    fstype: str
    source: str
    super_options: str  # the filesystem's (an overlay's lowerdir=..., a cgroup's controllers)

    @property
    def shared(self) -> bool:
        """Whether mounts and unmounts below it propagate to its peers (and theirs to it)."""
        return any(o.startswith("shared:") for o in self.optional)

    @property
    def slave(self) -> bool:
        """Whether it receives the mounts and unmounts of a master's peer group."""
        return any(o.startswith("master:") for o in self.optional)


def unescape(field: str) -> str:
    """A path field of mountinfo (root, mount point, source) as the path it names."""
    if "\\" not in field:
        return field
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse(text: str) -> list[MountEntry]:
    """The mounts of a mountinfo text, in its order (a later mount is on top of an earlier one at
    the same point). A line that is not a mount (no separator, too few fields) is skipped."""
    mounts = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            end = fields.index("-", 6)
            mount_id, parent_id = int(fields[0]), int(fields[1])
        except (ValueError, IndexError):
            continue
        if len(fields) < end + 4:
            continue
        mounts.append(MountEntry(mount_id, parent_id, unescape(fields[3]), unescape(fields[4]), fields[5],
                                 tuple(fields[6:end]), fields[end + 1], unescape(fields[end + 2]),
                                 fields[end + 3]))
    return mounts


def read(path: str = MOUNTINFO) -> list[MountEntry]:
    """The mounts of a mountinfo file (this process's, unless told). Raises OSError."""
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        return parse(f.read())
