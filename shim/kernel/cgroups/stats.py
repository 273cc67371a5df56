"""A cgroup's figures: usage (SandboxMetrics), the details cadvisor names, OOM kills, read from
v1's files where a controller is mounted there, else from v2's."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from shim.kernel.cgroups.readers import enabled as _enabled
from shim.kernel.cgroups.readers import read_flat_keyed as _read_flat_keyed
from shim.kernel.cgroups.readers import read_int as _read_int
from shim.kernel.cgroups.readers import read_keyed as _read_keyed
from shim.kernel.cgroups.readers import read_pids as _read_pids
from shim.kernel.cgroups.readers import read_text as _read_text
from shim.kernel.cgroups.readers import subtree as _subtree
from shim.kernel.cgroups.resources import UNLIMITED_BYTES as _UNLIMITED_BYTES

__all__ = ["METRIC_KEYS", "DETAIL_KEYS", "details", "metrics", "no_metrics", "oom_kills"]

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
# memory.stat's names (hierarchical totals on v1) of the figures metrics() reports.
_V1_MEMORY_STAT = {"inactive_file": "total_inactive_file", "rss": "total_rss", "pgfault": "total_pgfault",
                   "pgmajfault": "total_pgmajfault"}
_V2_MEMORY_STAT = {"inactive_file": "inactive_file", "rss": "anon", "pgfault": "pgfault", "pgmajfault": "pgmajfault"}


def no_metrics(reason: str) -> dict[str, Any]:
    """The metrics of what has no cgroup: every figure None, and ``reason`` as what is unavailable."""
    return {**dict.fromkeys(METRIC_KEYS), "unavailable": [reason]}


def metrics(v1: Mapping[str, str], v2: str | None) -> dict[str, Any]:
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
    limit = int(raw) if raw is not None and raw.isdigit() and int(raw) < _UNLIMITED_BYTES else None

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


def details(v1: Mapping[str, str], v2: str | None) -> dict[str, Any]:
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
    figures: dict[str, Any] = dict.fromkeys(DETAIL_KEYS)
    figures["oom_kills"] = oom_kills(v1, v2)
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
        quota_text, _, period = (_read_text(v2, "cpu.max") or "").partition(" ")
        figures["cpu_period_us"] = int(period) if period.isdigit() else None
        figures["cpu_quota_us"] = int(quota_text) if quota_text.isdigit() else None
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
        figures["pids_max"] = 0 if raw == "max" else int(raw) if raw is not None and raw.isdigit() else None
    return figures



def oom_kills(v1: Mapping[str, str], v2: str | None) -> int | None:
    """How many processes of this cgroup the kernel's OOM killer killed: v1's ``oom_kill`` of
    memory.oom_control, else v2's of memory.events; None when neither can be read."""
    if "memory" in v1:
        return _read_keyed(v1["memory"], "memory.oom_control", "oom_kill")
    return _read_keyed(v2, "memory.events", "oom_kill") if v2 is not None else None


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
    return _read_int(v2, "memory.swap.current"), int(raw) if raw is not None and raw.isdigit() else None, known


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

