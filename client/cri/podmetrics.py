"""CRI's ListMetricDescriptors and ListPodSandboxMetrics: the metrics cadvisor names (kubelet
serves them on /metrics/cadvisor when it takes pod and container stats from the runtime,
feature gate PodAndContainerStatsFromCRI), from a shim's cgroup figures with ``details``
(protocol.md: SandboxMetrics, Stats) and the container's writable layer.

Every metric of a container carries the label values ``pod``, ``namespace`` (the pod's metadata),
``container`` (its name), ``id`` (its id) and ``image`` (the image its config names); the pod's
own metrics (its cgroup: the pause and every container; its network namespace's interfaces) carry
an empty ``container`` and ``image`` and the pod's id. Some metrics add labels of their own
(``interface``, ``device``, ``failure_type`` and ``scope``). Values are CRI's unsigned integers:
seconds are whole seconds, as containerd sends them. A figure the host does not keep is left out,
never sent as zero.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from shim.lib import mountinfo

__all__ = ["DESCRIPTORS", "container_metrics", "descriptors", "filesystem_device", "pod_metrics"]

BASE_LABELS = ("pod", "namespace", "container", "id", "image")
NETWORK_LABELS = (*BASE_LABELS, "interface")
DISK_LABELS = (*BASE_LABELS, "device")
FAILURE_LABELS = (*BASE_LABELS, "failure_type", "scope")

COUNTER, GAUGE = "COUNTER", "GAUGE"

#: name -> (help, label keys, type). The names are cadvisor's; the help is ours.
DESCRIPTORS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "container_cpu_usage_seconds_total": ("CPU time used, in seconds.", BASE_LABELS, COUNTER),
    "container_cpu_user_seconds_total": ("CPU time used in user mode, in seconds.", BASE_LABELS, COUNTER),
    "container_cpu_system_seconds_total": ("CPU time used in kernel mode, in seconds.", BASE_LABELS, COUNTER),
    "container_cpu_cfs_periods_total": ("CFS bandwidth enforcement periods elapsed.", BASE_LABELS, COUNTER),
    "container_cpu_cfs_throttled_periods_total": ("CFS periods in which the cgroup was throttled.", BASE_LABELS,
                                                  COUNTER),
    "container_cpu_cfs_throttled_seconds_total": ("Time the cgroup spent throttled, in seconds.", BASE_LABELS,
                                                  COUNTER),
    "container_memory_usage_bytes": ("Memory charged to the cgroup, page cache included, in bytes.", BASE_LABELS,
                                     GAUGE),
    "container_memory_working_set_bytes": ("Memory usage less inactive file pages, in bytes.", BASE_LABELS, GAUGE),
    "container_memory_rss": ("Anonymous memory (and swap cache), in bytes.", BASE_LABELS, GAUGE),
    "container_memory_cache": ("Page cache charged to the cgroup, in bytes.", BASE_LABELS, GAUGE),
    "container_memory_mapped_file": ("Memory-mapped file pages, in bytes.", BASE_LABELS, GAUGE),
    "container_memory_total_active_file_bytes": ("File pages on the active LRU list, in bytes.", BASE_LABELS, GAUGE),
    "container_memory_total_inactive_file_bytes": ("File pages on the inactive LRU list, in bytes.", BASE_LABELS,
                                                   GAUGE),
    "container_memory_kernel_usage": ("Kernel memory charged to the cgroup, in bytes.", BASE_LABELS, GAUGE),
    "container_memory_swap": ("Swap in use, in bytes.", BASE_LABELS, GAUGE),
    "container_memory_failcnt": ("Times the memory usage hit the limit (cgroup v1 only).", BASE_LABELS, COUNTER),
    "container_memory_max_usage_bytes": ("Highest memory usage recorded, in bytes.", BASE_LABELS, GAUGE),
    "container_memory_failures_total": ("Page faults, by type (pgfault, pgmajfault) and scope.", FAILURE_LABELS,
                                        COUNTER),
    "container_oom_events_total": ("Processes the OOM killer killed in the cgroup.", BASE_LABELS, COUNTER),
    "container_network_receive_bytes_total": ("Bytes received.", NETWORK_LABELS, COUNTER),
    "container_network_receive_packets_total": ("Packets received.", NETWORK_LABELS, COUNTER),
    "container_network_receive_packets_dropped_total": ("Packets dropped on receive.", NETWORK_LABELS, COUNTER),
    "container_network_receive_errors_total": ("Receive errors.", NETWORK_LABELS, COUNTER),
    "container_network_transmit_bytes_total": ("Bytes sent.", NETWORK_LABELS, COUNTER),
    "container_network_transmit_packets_total": ("Packets sent.", NETWORK_LABELS, COUNTER),
    "container_network_transmit_packets_dropped_total": ("Packets dropped on send.", NETWORK_LABELS, COUNTER),
    "container_network_transmit_errors_total": ("Send errors.", NETWORK_LABELS, COUNTER),
    "container_fs_usage_bytes": ("Bytes the container's writable layer takes.", DISK_LABELS, GAUGE),
    "container_fs_limit_bytes": ("Size of the filesystem holding the writable layer, in bytes.", DISK_LABELS, GAUGE),
    "container_fs_inodes_total": ("Inodes of the filesystem holding the writable layer.", DISK_LABELS, GAUGE),
    "container_fs_inodes_free": ("Free inodes of the filesystem holding the writable layer.", DISK_LABELS, GAUGE),
    **{f"container_pressure_{resource}_{kind}_seconds_total": (
        f"Time at least one of the cgroup's tasks waited for {resource}, in seconds (PSI some)." if kind == "waiting"
        else f"Time all of the cgroup's non-idle tasks were stalled on {resource} at once, in seconds (PSI full).",
        BASE_LABELS, COUNTER)
       for resource in ("cpu", "memory", "io") for kind in ("waiting", "stalled")},
    "container_fs_reads_bytes_total": ("Bytes read from the device.", DISK_LABELS, COUNTER),
    "container_fs_reads_total": ("Reads from the device completed.", DISK_LABELS, COUNTER),
    "container_fs_writes_bytes_total": ("Bytes written to the device.", DISK_LABELS, COUNTER),
    "container_fs_writes_total": ("Writes to the device completed.", DISK_LABELS, COUNTER),
    "container_blkio_device_usage_total": ("Bytes of block IO, by device and operation (Read, Write).",
                                           (*DISK_LABELS, "major", "minor", "operation"), COUNTER),
    "container_processes": ("Processes in the cgroup.", BASE_LABELS, GAUGE),
    "container_threads": ("Threads in the cgroup.", BASE_LABELS, GAUGE),
    "container_threads_max": ("The cgroup's task limit (pids.max); 0 when unlimited.", BASE_LABELS, GAUGE),
    "container_file_descriptors": ("Open file descriptors of the cgroup's processes.", BASE_LABELS, GAUGE),
    "container_sockets": ("Open sockets of the cgroup's processes.", BASE_LABELS, GAUGE),
    "container_last_seen": ("When the runtime last read the figures, in seconds since the epoch.", BASE_LABELS,
                            GAUGE),
    "container_start_time_seconds": ("When the container started, in seconds since the epoch.", BASE_LABELS, GAUGE),
    "container_spec_cpu_period": ("The cgroup's CFS period, in microseconds.", BASE_LABELS, GAUGE),
    "container_spec_cpu_quota": ("The cgroup's CFS quota per period, in microseconds; absent when unlimited.",
                                 BASE_LABELS, GAUGE),
    "container_spec_cpu_shares": ("The cgroup's CPU shares.", BASE_LABELS, GAUGE),
    "container_spec_memory_limit_bytes": ("The cgroup's memory limit, in bytes; 0 when unlimited.", BASE_LABELS,
                                          GAUGE),
    "container_spec_memory_reservation_limit_bytes": ("The cgroup's memory reservation (soft limit), in bytes; absent "
                                                      "when unlimited.", BASE_LABELS, GAUGE),
    "container_spec_memory_swap_limit_bytes": ("The cgroup's swap limit, in bytes; 0 when unlimited.",
                                               BASE_LABELS, GAUGE),
}

_SECOND = 1_000_000_000
#: metric name -> (where the figure is: "data" (metrics' own keys) or "details", key, divisor).
_CGROUP_FIGURES = {
    "container_cpu_usage_seconds_total": ("data", "cpu_usage_ns", _SECOND),
    "container_cpu_user_seconds_total": ("details", "cpu_user_ns", _SECOND),
    "container_cpu_system_seconds_total": ("details", "cpu_system_ns", _SECOND),
    "container_cpu_cfs_periods_total": ("details", "cpu_periods", 1),
    "container_cpu_cfs_throttled_periods_total": ("details", "cpu_throttled_periods", 1),
    "container_cpu_cfs_throttled_seconds_total": ("details", "cpu_throttled_ns", _SECOND),
    "container_memory_usage_bytes": ("data", "memory_usage_bytes", 1),
    "container_memory_working_set_bytes": ("data", "memory_working_set_bytes", 1),
    "container_memory_rss": ("details", "memory_rss_bytes", 1),
    "container_memory_cache": ("details", "memory_cache_bytes", 1),
    "container_memory_mapped_file": ("details", "memory_mapped_file_bytes", 1),
    "container_memory_total_active_file_bytes": ("details", "memory_active_file_bytes", 1),
    "container_memory_total_inactive_file_bytes": ("details", "memory_inactive_file_bytes", 1),
    "container_memory_kernel_usage": ("details", "memory_kernel_bytes", 1),
    "container_memory_swap": ("data", "memory_swap_bytes", 1),
    "container_memory_failcnt": ("details", "memory_failcnt", 1),
    "container_memory_max_usage_bytes": ("details", "memory_max_usage_bytes", 1),
    "container_oom_events_total": ("details", "oom_kills", 1),
    "container_processes": ("details", "processes", 1),
    "container_threads": ("details", "threads", 1),
    "container_threads_max": ("details", "pids_max", 1),
    "container_file_descriptors": ("details", "file_descriptors", 1),
    "container_sockets": ("details", "sockets", 1),
    "container_spec_cpu_period": ("details", "cpu_period_us", 1),
    "container_spec_cpu_quota": ("details", "cpu_quota_us", 1),
    "container_spec_cpu_shares": ("details", "cpu_shares", 1),
    "container_spec_memory_limit_bytes": ("data", "memory_limit_bytes", 1),
    "container_spec_memory_reservation_limit_bytes": ("details", "memory_reservation_bytes", 1),
    "container_spec_memory_swap_limit_bytes": ("data", "memory_swap_limit_bytes", 1),
}
#: The limits sent as 0 when the cgroup has none (cadvisor's convention; their help says so).
_ZERO_IS_UNLIMITED = {"container_spec_memory_limit_bytes", "container_spec_memory_swap_limit_bytes"}
_NETWORK_FIGURES = {
    "container_network_receive_bytes_total": "rx_bytes", "container_network_receive_packets_total": "rx_packets",
    "container_network_receive_packets_dropped_total": "rx_dropped",
    "container_network_receive_errors_total": "rx_errors",
    "container_network_transmit_bytes_total": "tx_bytes", "container_network_transmit_packets_total": "tx_packets",
    "container_network_transmit_packets_dropped_total": "tx_dropped",
    "container_network_transmit_errors_total": "tx_errors",
}
_BLOCK_IO_FIGURES = {"container_fs_reads_bytes_total": "read_bytes", "container_fs_reads_total": "reads",
                     "container_fs_writes_bytes_total": "write_bytes", "container_fs_writes_total": "writes"}
_FS_FIGURES = {"container_fs_usage_bytes": "usage_bytes", "container_fs_limit_bytes": "limit_bytes",
               "container_fs_inodes_total": "inodes_total", "container_fs_inodes_free": "inodes_free"}


def descriptors() -> list[dict[str, Any]]:
    """ListMetricDescriptors' descriptors, CRI-shaped."""
    return [{"name": name, "help": help_text, "label_keys": list(keys)}
            for name, (help_text, keys, _) in DESCRIPTORS.items()]


def _metric(name: str, timestamp: int, labels: list[str], value: Any) -> dict[str, Any] | None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return None
    return {"name": name, "timestamp": timestamp, "metric_type": DESCRIPTORS[name][2], "label_values": labels,
            "value": {"value": value}}


def _cgroup_metrics(timestamp: int, data: Mapping[str, Any], labels: list[str]) -> Iterator[dict[str, Any] | None]:
    details = data.get("details") or {}
    unavailable = data.get("unavailable") or ()
    for name, (source, key, divisor) in _CGROUP_FIGURES.items():
        value = (data if source == "data" else details).get(key)
        if value is None and name in _ZERO_IS_UNLIMITED and key in data and key not in unavailable:
            value = 0  # read, and unlimited
        yield _metric(name, timestamp, labels, value // divisor if isinstance(value, int) else None)
    for failure, key in (("pgfault", "memory_page_faults"), ("pgmajfault", "memory_major_page_faults")):
        yield _metric("container_memory_failures_total", timestamp, [*labels, failure, "hierarchy"], details.get(key))
    for resource in ("cpu", "memory", "io"):
        pressure = data.get(f"{resource}_pressure") or {}
        for kind, line in (("waiting", "some"), ("stalled", "full")):
            total = (pressure.get(line) or {}).get("total_us")
            yield _metric(f"container_pressure_{resource}_{kind}_seconds_total", timestamp, labels,
                          total // 1_000_000 if isinstance(total, int) else None)
    for number, counters in sorted((details.get("block_io") or {}).items()):
        device = [*labels, _device_name(number)]
        for name, key in _BLOCK_IO_FIGURES.items():
            yield _metric(name, timestamp, device, counters.get(key))
        for operation in ("Read", "Write"):
            yield _metric("container_blkio_device_usage_total", timestamp,
                          [*device, *number.split(":", 1), operation], counters.get(f"{operation.lower()}_bytes"))
    for interface, counters in sorted((details.get("network") or {}).items()):
        for name, key in _NETWORK_FIGURES.items():
            yield _metric(name, timestamp, [*labels, interface], counters.get(key))
    yield _metric("container_last_seen", timestamp, labels, timestamp // _SECOND)


def pod_metrics(pod_id: str, metadata: Mapping[str, Any], timestamp: int, data: Mapping[str, Any],
                containers: list[dict[str, Any]]) -> dict[str, Any]:
    """One pod's PodSandboxMetrics: its cgroup's and network's metrics (``data``: SandboxMetrics'
    with ``details``) and ``containers`` (each :func:`container_metrics`)."""
    labels = [str(metadata.get("name", "")), str(metadata.get("namespace", "")), "", pod_id, ""]
    metrics = [m for m in _cgroup_metrics(timestamp, data, labels) if m]
    return {"pod_sandbox_id": pod_id, "metrics": metrics, "container_metrics": containers}


def container_metrics(pod_metadata: Mapping[str, Any], container_id: str, name: str, image: str, started_at: int,
                      timestamp: int, data: Mapping[str, Any], filesystem: Mapping[str, Any] | None
                      ) -> dict[str, Any]:
    """One container's ContainerMetrics: its cgroup's (``data``: a task's Stats with ``details``),
    its start time (ns since the epoch; 0: not started) and ``filesystem`` (``device``,
    ``usage_bytes``, ``limit_bytes``, ``inodes_total``, ``inodes_free``; None when unknown)."""
    labels = [str(pod_metadata.get("name", "")), str(pod_metadata.get("namespace", "")), name, container_id, image]
    metrics = list(_cgroup_metrics(timestamp, data, labels))
    if started_at:
        metrics.append(_metric("container_start_time_seconds", timestamp, labels, started_at // _SECOND))
    if filesystem is not None:
        device = [*labels, str(filesystem.get("device", ""))]
        metrics += [_metric(name, timestamp, device, filesystem.get(key)) for name, key in _FS_FIGURES.items()]
    return {"container_id": container_id, "metrics": [m for m in metrics if m]}


def filesystem_device(path: str) -> str:
    """The source (``/dev/vda1``, ``overlay``) of the mount that holds ``path``: cadvisor's
    ``device`` label of a filesystem figure. OSError when mountinfo cannot be read."""
    path = os.path.realpath(path)
    best = max((m for m in mountinfo.read() if path == m.mount_point or
                path.startswith(m.mount_point.rstrip("/") + "/")), key=lambda m: len(m.mount_point), default=None)
    return best.source if best is not None else ""


def _device_name(number: str) -> str:
    """``/dev/<name>`` of block device ``MAJ:MIN`` as the kernel names it (its uevent), else the
    number itself."""
    try:
        with open(f"/sys/dev/block/{number}/uevent") as f:
            for line in f:
                if line.startswith("DEVNAME="):
                    return "/dev/" + line.strip().partition("=")[2]
    except OSError:
        pass
    return number
