"""A cgroup's figures as containerd reads them: the ``stats`` of Task Stats and the ``data`` of
SandboxMetrics' Metric, an Any of github.com/containerd/cgroups' ``io.containerd.cgroups.v1.Metrics``
(a cgroup whose memory or cpuacct figures come from v1 hierarchies) or ``io.containerd.cgroups.v2.Metrics``
(of the v2 one), the two types containerd's CRI decodes for ContainerStats and the pod's stats.

The figures are :meth:`SandboxCgroup.metrics` and :meth:`SandboxCgroup.details`' (shim.kernel.cgroups),
read when asked; a figure the host does not keep is left unset, never made up. A memory limit that
is none is the kernel's own "unlimited" value, which containerd takes as none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from google.protobuf.any_pb2 import Any as AnyMessage
from google.protobuf.message import Message

from shim.containerd.api import load

if TYPE_CHECKING:
    from shim.kernel.cgroups import SandboxCgroup

__all__ = ["cgroup_metrics", "V1_UNLIMITED", "V2_UNLIMITED"]

cg1 = load("cgroups.cgroup1.stats.metrics_pb2")
cg2 = load("cgroups.cgroup2.stats.metrics_pb2")

#: No memory limit, as each version's files say it and containerd's cgroups package reads it.
V1_UNLIMITED = 0x7FFFFFFFFFFFF000
V2_UNLIMITED = (1 << 64) - 1


def cgroup_metrics(cgroup: SandboxCgroup) -> AnyMessage:
    """The figures of ``cgroup`` and everything below it, as containerd's cgroups Metrics in an Any."""
    figures, details = cgroup.metrics(), cgroup.details()
    v1 = cgroup.v1_paths()
    message = _v1(figures, details) if "memory" in v1 or "cpuacct" in v1 else _v2(figures, details)
    return AnyMessage(type_url=message.DESCRIPTOR.full_name, value=message.SerializeToString())


def _set(message: Message, **fields: Any) -> Message:
    """``message`` with each of ``fields`` that is known (not None) set."""
    for name, value in fields.items():
        if value is not None:
            setattr(message, name, value)
    return message


def _limit(f: dict[str, Any], name: str, unlimited: int) -> int | None:
    """The limit ``name`` of the figures ``f``: ``unlimited`` when there is none, None when unknown."""
    if f[name] is not None:
        return int(f[name])
    return None if name in f["unavailable"] else unlimited


def _v1(f: dict[str, Any], d: dict[str, Any]) -> Message:
    metrics = cg1.Metrics()
    if f["pids_current"] is not None:
        metrics.pids.CopyFrom(_set(cg1.PidsStat(), current=f["pids_current"], limit=d["pids_max"]))
    if f["cpu_usage_ns"] is not None:
        metrics.cpu.usage.CopyFrom(_set(cg1.CPUUsage(), total=f["cpu_usage_ns"], kernel=d["cpu_system_ns"],
                                        user=d["cpu_user_ns"]))
        metrics.cpu.throttling.CopyFrom(_set(cg1.Throttle(), periods=d["cpu_periods"],
                                             throttled_periods=d["cpu_throttled_periods"],
                                             throttled_time=d["cpu_throttled_ns"]))
    if f["memory_usage_bytes"] is not None:
        memory = _set(cg1.MemoryStat(), total_cache=d["memory_cache_bytes"], total_rss=d["memory_rss_bytes"],
                      total_mapped_file=d["memory_mapped_file_bytes"], total_pg_fault=d["memory_page_faults"],
                      total_pg_maj_fault=d["memory_major_page_faults"],
                      total_active_file=d["memory_active_file_bytes"],
                      total_inactive_file=d["memory_inactive_file_bytes"])
        memory.usage.CopyFrom(_set(cg1.MemoryEntry(), usage=f["memory_usage_bytes"],
                                   limit=_limit(f, "memory_limit_bytes", V1_UNLIMITED),
                                   max=d["memory_max_usage_bytes"], failcnt=d["memory_failcnt"]))
        if d["memory_kernel_bytes"] is not None:
            memory.kernel.usage = d["memory_kernel_bytes"]
        metrics.memory.CopyFrom(memory)
    if d["oom_kills"] is not None:
        metrics.memory_oom_control.oom_kill = d["oom_kills"]
    for device, io in sorted((d["block_io"] or {}).items()):
        major, _, minor = device.partition(":")
        for entries, read, write in ((metrics.blkio.io_service_bytes_recursive, "read_bytes", "write_bytes"),
                                     (metrics.blkio.io_serviced_recursive, "reads", "writes")):
            for op, key in (("Read", read), ("Write", write)):
                if key in io:
                    entries.add(op=op, major=int(major), minor=int(minor), value=io[key])
    return metrics


def _psi(pressure: dict[str, dict[str, Any]] | None) -> Message | None:
    if pressure is None:
        return None
    stats = cg2.PSIStats()
    for kind in ("some", "full"):
        if kind in pressure:
            p = pressure[kind]
            getattr(stats, kind).CopyFrom(cg2.PSIData(avg10=p["avg10"], avg60=p["avg60"], avg300=p["avg300"],
                                                      total=p["total_us"]))
    return stats


def _v2(f: dict[str, Any], d: dict[str, Any]) -> Message:
    metrics = cg2.Metrics()
    if f["pids_current"] is not None:
        metrics.pids.CopyFrom(_set(cg2.PidsStat(), current=f["pids_current"], limit=d["pids_max"]))
    if f["cpu_usage_ns"] is not None:
        throttled = d["cpu_throttled_ns"]
        metrics.cpu.CopyFrom(_set(cg2.CPUStat(), usage_usec=f["cpu_usage_ns"] // 1000,
                                  user_usec=None if d["cpu_user_ns"] is None else d["cpu_user_ns"] // 1000,
                                  system_usec=None if d["cpu_system_ns"] is None else d["cpu_system_ns"] // 1000,
                                  nr_periods=d["cpu_periods"], nr_throttled=d["cpu_throttled_periods"],
                                  throttled_usec=None if throttled is None else throttled // 1000))
        if (psi := _psi(f["cpu_pressure"])) is not None:
            metrics.cpu.psi.CopyFrom(psi)
    if f["memory_usage_bytes"] is not None:
        memory = _set(cg2.MemoryStat(), usage=f["memory_usage_bytes"],
                      usage_limit=_limit(f, "memory_limit_bytes", V2_UNLIMITED), anon=d["memory_rss_bytes"],
                      file=d["memory_cache_bytes"], file_mapped=d["memory_mapped_file_bytes"],
                      active_file=d["memory_active_file_bytes"], inactive_file=d["memory_inactive_file_bytes"],
                      pgfault=d["memory_page_faults"], pgmajfault=d["memory_major_page_faults"],
                      max_usage=d["memory_max_usage_bytes"], swap_usage=f["memory_swap_bytes"],
                      swap_limit=_limit(f, "memory_swap_limit_bytes", V2_UNLIMITED))
        if (psi := _psi(f["memory_pressure"])) is not None:
            memory.psi.CopyFrom(psi)
        metrics.memory.CopyFrom(memory)
    if d["oom_kills"] is not None:
        metrics.memory_events.oom_kill = d["oom_kills"]
    for device, io in sorted((d["block_io"] or {}).items()):
        major, _, minor = device.partition(":")
        metrics.io.usage.add(major=int(major), minor=int(minor), rbytes=io.get("read_bytes", 0),
                             wbytes=io.get("write_bytes", 0), rios=io.get("reads", 0), wios=io.get("writes", 0))
    if (psi := _psi(f["io_pressure"])) is not None:
        metrics.io.psi.CopyFrom(psi)
    return metrics
