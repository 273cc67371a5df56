"""CRI's ContainerStats and PodSandboxStats from a shim's cgroup figures (protocol.md: SandboxMetrics'
``data``, the same for a task's Stats).

The dicts use CRI's field names (``usage_core_nano_seconds``, ``working_set_bytes``); each figure
is CRI's ``UInt64Value`` message, ``{"value": n}``. A figure the shim could not read is left out,
never zero: a client then sees it unset, as CRI means it. ``usage_nano_cores`` is the CPU rate
since the previous sample of the same container or pod (containerd computes it the same way), so
the first sample has none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["CpuRates", "attributes", "cpu_usage", "memory_usage", "process_usage"]

#: How many containers and pods a CpuRates remembers the previous sample of.
MAX_REMEMBERED = 16384


def _value(data: Mapping[str, Any], key: str) -> dict[str, int] | None:
    value = data.get(key)
    return {"value": value} if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _present(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if v is not None}


class CpuRates:
    """The previous CPU sample of each container and pod, for ``usage_nano_cores``."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[int, int]] = {}  # id -> (timestamp ns, usage ns)

    def rate(self, key: str, timestamp: int, usage: int) -> int | None:
        """Nanoseconds of CPU per second since the previous sample of ``key``; None for the first
        one (or when the clock or the counter went backwards: a new cgroup under the same id)."""
        previous = self._last.get(key)
        if previous is None and len(self._last) >= MAX_REMEMBERED:
            self._last.pop(next(iter(self._last)))
        self._last[key] = (timestamp, usage)
        if previous is None or timestamp <= previous[0] or usage < previous[1]:
            return None
        return (usage - previous[1]) * 1_000_000_000 // (timestamp - previous[0])

    def forget(self, key: str) -> None:
        self._last.pop(key, None)


def attributes(object_id: str, metadata: Mapping[str, Any], labels: Mapping[str, str],
               annotations: Mapping[str, str]) -> dict[str, Any]:
    """ContainerAttributes / PodSandboxAttributes."""
    return {"id": object_id, "metadata": dict(metadata), "labels": dict(labels), "annotations": dict(annotations)}


def cpu_usage(key: str, timestamp: int, data: Mapping[str, Any], rates: CpuRates) -> dict[str, Any] | None:
    """CpuUsage, or None when the shim had no CPU figure."""
    usage = _value(data, "cpu_usage_ns")
    if usage is None:
        return None
    rate = rates.rate(key, timestamp, usage["value"])
    return _present({"timestamp": timestamp, "usage_core_nano_seconds": usage,
                     "usage_nano_cores": {"value": rate} if rate is not None else None})


def memory_usage(timestamp: int, data: Mapping[str, Any]) -> dict[str, Any] | None:
    """MemoryUsage, or None when the shim had no memory figure. ``available_bytes`` is the limit
    less the working set, only when there is a limit."""
    working_set = _value(data, "memory_working_set_bytes")
    limit = _value(data, "memory_limit_bytes")
    available = None
    if working_set is not None and limit is not None:
        available = {"value": max(limit["value"] - working_set["value"], 0)}
    figures = {
        "working_set_bytes": working_set,
        "available_bytes": available,
        "usage_bytes": _value(data, "memory_usage_bytes"),
        "rss_bytes": _value(data, "memory_rss_bytes"),
        "page_faults": _value(data, "memory_page_faults"),
        "major_page_faults": _value(data, "memory_major_page_faults"),
    }
    if not any(figures.values()):
        return None
    return _present({"timestamp": timestamp, **figures})


def process_usage(timestamp: int, data: Mapping[str, Any]) -> dict[str, Any] | None:
    """ProcessUsage, or None when the shim could not count the processes."""
    count = _value(data, "pids_current")
    return {"timestamp": timestamp, "process_count": count} if count is not None else None
