"""CRI's ContainerStats and PodSandboxStats from a shim's cgroup figures (protocol.md: SandboxMetrics'
``data``, the same for a task's Stats).

The dicts use CRI's field names (``usage_core_nano_seconds``, ``working_set_bytes``); each figure
is CRI's ``UInt64Value`` message, ``{"value": n}``. A figure the shim could not read is left out,
never zero: a client then sees it unset, as CRI means it. ``usage_nano_cores`` is the CPU rate
since the previous sample of the same container or pod (containerd computes it the same way), so
the first sample has none. Pressure (PSI) is the kernel's for the cgroup (cgroup v2 only), with its
``total`` in nanoseconds as CRI counts it (the kernel's microseconds × 1000). A pod's network is
the counters of each interface of its network namespace but loopback, the default one ``eth0``
(CNI's) or else the first, as containerd reports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from client.cri.cni import POD_IFNAME

__all__ = ["CpuRates", "attributes", "cpu_usage", "memory_usage", "network_usage", "process_usage", "swap_usage",
           "io_usage"]

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


def _psi(data: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    """CRI's PsiStats of the shim's pressure figure ``key``; None when the shim had none."""
    pressure = data.get(key)
    if not isinstance(pressure, Mapping):
        return None
    psi = {}
    for kind, name in (("some", "Some"), ("full", "Full")):
        figures = pressure.get(kind)
        if isinstance(figures, Mapping):
            psi[name] = {"Total": figures["total_us"] * 1000, "Avg10": figures["avg10"], "Avg60": figures["avg60"],
                         "Avg300": figures["avg300"]}
    return psi or None


def cpu_usage(key: str, timestamp: int, data: Mapping[str, Any], rates: CpuRates) -> dict[str, Any] | None:
    """CpuUsage, or None when the shim had no CPU figure."""
    usage = _value(data, "cpu_usage_ns")
    psi = _psi(data, "cpu_pressure")
    if usage is None and psi is None:
        return None
    rate = rates.rate(key, timestamp, usage["value"]) if usage is not None else None
    return _present({"timestamp": timestamp, "usage_core_nano_seconds": usage,
                     "usage_nano_cores": {"value": rate} if rate is not None else None, "psi": psi})


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
        "psi": _psi(data, "memory_pressure"),
    }
    if not any(figures.values()):
        return None
    return _present({"timestamp": timestamp, **figures})


def swap_usage(timestamp: int, data: Mapping[str, Any]) -> dict[str, Any] | None:
    """SwapUsage, or None when the shim had no swap figure. ``swap_available_bytes`` is the swap
    limit less the swap in use, only when there is a limit."""
    usage = _value(data, "memory_swap_bytes")
    if usage is None:
        return None
    limit = _value(data, "memory_swap_limit_bytes")
    available = {"value": max(limit["value"] - usage["value"], 0)} if limit is not None else None
    return _present({"timestamp": timestamp, "swap_usage_bytes": usage, "swap_available_bytes": available})


def io_usage(timestamp: int, data: Mapping[str, Any]) -> dict[str, Any] | None:
    """IoUsage (its pressure), or None when the shim had none."""
    psi = _psi(data, "io_pressure")
    return {"timestamp": timestamp, "psi": psi} if psi is not None else None


def process_usage(timestamp: int, data: Mapping[str, Any]) -> dict[str, Any] | None:
    """ProcessUsage, or None when the shim could not count the processes."""
    count = _value(data, "pids_current")
    return {"timestamp": timestamp, "process_count": count} if count is not None else None


def network_usage(timestamp: int, data: Mapping[str, Any]) -> dict[str, Any] | None:
    """NetworkUsage of a pod, or None when the shim read no interface (a pod on the host's
    network, whose figures are the node's; a pause gone)."""
    counters = data.get("network")
    if not isinstance(counters, Mapping) or not counters:
        return None
    interfaces = [_present({"name": name, "rx_bytes": _value(figures, "rx_bytes"),
                            "rx_errors": _value(figures, "rx_errors"), "tx_bytes": _value(figures, "tx_bytes"),
                            "tx_errors": _value(figures, "tx_errors")})
                  for name, figures in sorted(counters.items())]
    default = next((i for i in interfaces if i["name"] == POD_IFNAME), interfaces[0])
    return {"timestamp": timestamp, "default_interface": default, "interfaces": interfaces}
