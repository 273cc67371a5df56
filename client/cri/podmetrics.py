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
from typing import Any, NamedTuple

from shim.lib import mountinfo

__all__ = ["DESCRIPTORS", "container_metrics", "descriptors", "filesystem_device", "pod_metrics"]

BASE_LABELS = ("pod", "namespace", "container", "id", "image")
NETWORK_LABELS = (*BASE_LABELS, "interface")
DISK_LABELS = (*BASE_LABELS, "device")
FAILURE_LABELS = (*BASE_LABELS, "failure_type", "scope")

COUNTER, GAUGE = "COUNTER", "GAUGE"
_SECOND = 1_000_000_000


class Metric(NamedTuple):
    """One metric: its descriptor (help, label keys, type) and where its figure is read from:
    ``source`` "data" (a reading's own keys), "details", "network" (each interface's counters),
    "block_io" (each device's), "filesystem" (the writable layer's), or "" (computed apart);
    ``key`` in it; ``divisor`` turns the reading into the metric's unit."""

    help: str
    labels: tuple[str, ...]
    type: str
    source: str = ""
    key: str = ""
    divisor: int = 1


def _counter(help_text: str, source: str = "", key: str = "", divisor: int = 1,
             labels: tuple[str, ...] = BASE_LABELS) -> Metric:
    return Metric(help_text, labels, COUNTER, source, key, divisor)


def _gauge(help_text: str, source: str = "", key: str = "", divisor: int = 1,
           labels: tuple[str, ...] = BASE_LABELS) -> Metric:
    return Metric(help_text, labels, GAUGE, source, key, divisor)


def _pressure(resource: str, kind: str) -> Metric:
    return _counter(f"Time at least one of the cgroup's tasks waited for {resource}, in seconds (PSI some)."
                    if kind == "waiting" else
                    f"Time all of the cgroup's non-idle tasks were stalled on {resource} at once, in seconds (PSI full).")


#: name -> Metric. The names are cadvisor's; the help is ours.
DESCRIPTORS: dict[str, Metric] = {
    "container_cpu_usage_seconds_total": _counter("CPU time used, in seconds.", "data", "cpu_usage_ns", _SECOND),
    "container_cpu_user_seconds_total": _counter("CPU time used in user mode, in seconds.",
                                                 "details", "cpu_user_ns", _SECOND),
    "container_cpu_system_seconds_total": _counter("CPU time used in kernel mode, in seconds.",
                                                   "details", "cpu_system_ns", _SECOND),
    "container_cpu_cfs_periods_total": _counter("CFS bandwidth enforcement periods elapsed.",
                                                "details", "cpu_periods"),
    "container_cpu_cfs_throttled_periods_total": _counter("CFS periods in which the cgroup was throttled.",
                                                          "details", "cpu_throttled_periods"),
    "container_cpu_cfs_throttled_seconds_total": _counter("Time the cgroup spent throttled, in seconds.",
                                                          "details", "cpu_throttled_ns", _SECOND),
    "container_memory_usage_bytes": _gauge("Memory charged to the cgroup, page cache included, in bytes.",
                                           "data", "memory_usage_bytes"),
    "container_memory_working_set_bytes": _gauge("Memory usage less inactive file pages, in bytes.",
                                                 "data", "memory_working_set_bytes"),
    "container_memory_rss": _gauge("Anonymous memory (and swap cache), in bytes.", "details", "memory_rss_bytes"),
    "container_memory_cache": _gauge("Page cache charged to the cgroup, in bytes.", "details", "memory_cache_bytes"),
    "container_memory_mapped_file": _gauge("Memory-mapped file pages, in bytes.",
                                           "details", "memory_mapped_file_bytes"),
    "container_memory_total_active_file_bytes": _gauge("File pages on the active LRU list, in bytes.",
                                                       "details", "memory_active_file_bytes"),
    "container_memory_total_inactive_file_bytes": _gauge("File pages on the inactive LRU list, in bytes.",
                                                         "details", "memory_inactive_file_bytes"),
    "container_memory_kernel_usage": _gauge("Kernel memory charged to the cgroup, in bytes.",
                                            "details", "memory_kernel_bytes"),
    "container_memory_swap": _gauge("Swap in use, in bytes.", "data", "memory_swap_bytes"),
    "container_memory_failcnt": _counter("Times the memory usage hit the limit (cgroup v1 only).",
                                         "details", "memory_failcnt"),
    "container_memory_max_usage_bytes": _gauge("Highest memory usage recorded, in bytes.",
                                               "details", "memory_max_usage_bytes"),
    "container_memory_failures_total": _counter("Page faults, by type (pgfault, pgmajfault) and scope.",
                                                labels=FAILURE_LABELS),
    "container_oom_events_total": _counter("Processes the OOM killer killed in the cgroup.", "details", "oom_kills"),
    **{f"container_network_{way}_{name}_total": _counter(help_text, "network", f"{prefix}_{key}", labels=NETWORK_LABELS)
       for way, prefix, verb, noun in (("receive", "rx", "received", "receive"), ("transmit", "tx", "sent", "send"))
       for name, key, help_text in (("bytes", "bytes", f"Bytes {verb}."), ("packets", "packets", f"Packets {verb}."),
                                    ("packets_dropped", "dropped", f"Packets dropped on {noun}."),
                                    ("errors", "errors", f"{noun.capitalize()} errors."))},
    "container_fs_usage_bytes": _gauge("Bytes the container's writable layer takes.", "filesystem", "usage_bytes",
                                       labels=DISK_LABELS),
    "container_fs_limit_bytes": _gauge("Size of the filesystem holding the writable layer, in bytes.",
                                       "filesystem", "limit_bytes", labels=DISK_LABELS),
    "container_fs_inodes_total": _gauge("Inodes of the filesystem holding the writable layer.",
                                        "filesystem", "inodes_total", labels=DISK_LABELS),
    "container_fs_inodes_free": _gauge("Free inodes of the filesystem holding the writable layer.",
                                       "filesystem", "inodes_free", labels=DISK_LABELS),
    **{f"container_pressure_{resource}_{kind}_seconds_total": _pressure(resource, kind)
       for resource in ("cpu", "memory", "io") for kind in ("waiting", "stalled")},
    "container_fs_reads_bytes_total": _counter("Bytes read from the device.", "block_io", "read_bytes",
                                               labels=DISK_LABELS),
    "container_fs_reads_total": _counter("Reads from the device completed.", "block_io", "reads",
                                         labels=DISK_LABELS),
    "container_fs_writes_bytes_total": _counter("Bytes written to the device.", "block_io", "write_bytes",
                                                labels=DISK_LABELS),
    "container_fs_writes_total": _counter("Writes to the device completed.", "block_io", "writes",
                                          labels=DISK_LABELS),
    "container_blkio_device_usage_total": _counter("Bytes of block IO, by device and operation (Read, Write).",
                                                   labels=(*DISK_LABELS, "major", "minor", "operation")),
    "container_processes": _gauge("Processes in the cgroup.", "details", "processes"),
    "container_threads": _gauge("Threads in the cgroup.", "details", "threads"),
    "container_threads_max": _gauge("The cgroup's task limit (pids.max); 0 when unlimited.", "details", "pids_max"),
    "container_file_descriptors": _gauge("Open file descriptors of the cgroup's processes.",
                                         "details", "file_descriptors"),
    "container_sockets": _gauge("Open sockets of the cgroup's processes.", "details", "sockets"),
    "container_last_seen": _gauge("When the runtime last read the figures, in seconds since the epoch."),
    "container_start_time_seconds": _gauge("When the container started, in seconds since the epoch."),
    "container_spec_cpu_period": _gauge("The cgroup's CFS period, in microseconds.", "details", "cpu_period_us"),
    "container_spec_cpu_quota": _gauge("The cgroup's CFS quota per period, in microseconds; absent when unlimited.",
                                       "details", "cpu_quota_us"),
    "container_spec_cpu_shares": _gauge("The cgroup's CPU shares.", "details", "cpu_shares"),
    "container_spec_memory_limit_bytes": _gauge("The cgroup's memory limit, in bytes; 0 when unlimited.",
                                                "data", "memory_limit_bytes"),
    "container_spec_memory_reservation_limit_bytes": _gauge("The cgroup's memory reservation (soft limit), in bytes; "
                                                            "absent when unlimited.",
                                                            "details", "memory_reservation_bytes"),
    "container_spec_memory_swap_limit_bytes": _gauge("The cgroup's swap limit, in bytes; 0 when unlimited.",
                                                     "data", "memory_swap_limit_bytes"),
}


def _read_from(*sources: str) -> dict[str, Metric]:
    return {name: metric for name, metric in DESCRIPTORS.items() if metric.source in sources}


_CGROUP_FIGURES = _read_from("data", "details")
#: The limits sent as 0 when the cgroup has none (cadvisor's convention; their help says so).
_ZERO_IS_UNLIMITED = {"container_spec_memory_limit_bytes", "container_spec_memory_swap_limit_bytes"}
_NETWORK_FIGURES = {name: metric.key for name, metric in _read_from("network").items()}
_BLOCK_IO_FIGURES = {name: metric.key for name, metric in _read_from("block_io").items()}
_FS_FIGURES = {name: metric.key for name, metric in _read_from("filesystem").items()}


def descriptors() -> list[dict[str, Any]]:
    """ListMetricDescriptors' descriptors, CRI-shaped."""
    return [{"name": name, "help": help_text, "label_keys": list(keys)}
            for name, (help_text, keys, *_) in DESCRIPTORS.items()]


def _metric(name: str, timestamp: int, labels: list[str], value: Any) -> dict[str, Any] | None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return None
    return {"name": name, "timestamp": timestamp, "metric_type": DESCRIPTORS[name].type, "label_values": labels,
            "value": {"value": value}}


def _cgroup_metrics(timestamp: int, data: Mapping[str, Any], labels: list[str]) -> Iterator[dict[str, Any] | None]:
    details = data.get("details") or {}
    unavailable = data.get("unavailable") or ()
    for name, (*_, source, key, divisor) in _CGROUP_FIGURES.items():
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
    for interface, counters in sorted((data.get("network") or {}).items()):
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
