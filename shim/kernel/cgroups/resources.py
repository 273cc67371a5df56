"""The resource writes: each resource of Update and Create, the cgroup file it is kept in on v1
and on v2, and the checked, converted writes a request asks for."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from shim.kernel.cgroups.readers import enabled as _enabled
from shim.kernel.cgroups.readers import read_int as _read_int
from shim.kernel.cgroups.readers import read_text as _read_text
from shim.rpc.status import InvalidArgument

__all__ = ["RESOURCE_FILES", "UPDATE_KEYS", "HUGEPAGES_DIR", "UNLIMITED_BYTES", "cpu_weight", "huge_page_pool",
           "planned_writes", "restorable"]

# v1 reports "no limit" as PAGE_COUNTER_MAX pages in bytes (9223372036854771712 with 4 KiB pages).
UNLIMITED_BYTES = 1 << 62
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



def planned_writes(resources: Mapping[str, Any], v1: Mapping[str, str], v2: str | None,
                   pids: Callable[[], Iterable[int]]) -> list[tuple[str, str, bytes]]:
    """(key, file, contents) for every write ``resources`` asks for, in the order the kernel
    accepts them; InvalidArgument for the first key that cannot be applied. ``oom_score_adj``
    is written for the processes ``pids()`` lists. ``v1`` maps each v1 controller to the cgroup's
    directory, ``v2`` is its v2 directory."""
    unknown = sorted(set(resources) - set(UPDATE_KEYS))
    if unknown:
        raise InvalidArgument(f"resources.{unknown[0]} is not a resource podshim can update "
                              f"(known: {', '.join(UPDATE_KEYS)})")
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
    if memory is not None and memory_write is not None and swap_write is not None \
            and swap_write[1].endswith("memsw.limit_in_bytes"):
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
                   for pid in sorted(pids())]

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


def restorable(path: str, old: bytes) -> bytes:
    """What to write to put ``path`` back to ``old`` (as it was read)."""
    if os.path.basename(path) in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes") and \
            old.isdigit() and int(old) >= UNLIMITED_BYTES:
        return b"-1"  # the kernel's "unlimited" reads back as a number it refuses on write
    return old

