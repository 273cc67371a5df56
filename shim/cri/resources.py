"""CRI's LinuxContainerResources (UpdateContainerResources) as the shim's Update ``resources``
(protocol.md 7.3), and a pod's (UpdatePodSandboxResources) as the shim's UpdateSandbox ``resources``.

CRI's fields are proto3 scalars, whose zero value means "not set": a field that is absent, null,
0, "" or empty is left out, so the shim leaves that resource as it is (containerd reads them the
same way). Hence ``oom_score_adj`` 0 cannot be asked for. Integers may be JSON numbers or decimal
strings (protobuf's JSON writes int64 as strings). The shim checks the values and names the field
it cannot apply; a field this module does not know is refused here, naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shim.rpc.status import InvalidArgument

__all__ = ["FIELDS", "shim_resources", "pod_resources"]

#: CRI's field -> the shim's key, for the scalar fields.
FIELDS = {
    "cpu_period": "cpu_period_us",
    "cpu_quota": "cpu_quota_us",
    "cpu_shares": "cpu_shares",
    "memory_limit_in_bytes": "memory_limit_bytes",
    "memory_swap_limit_in_bytes": "memory_swap_limit_bytes",
    "oom_score_adj": "oom_score_adj",
    "cpuset_cpus": "cpuset_cpus",
    "cpuset_mems": "cpuset_mems",
}
_STRINGS = ("cpuset_cpus", "cpuset_mems")


def _integer(path: str, value: Any) -> int:
    if isinstance(value, bool):
        raise InvalidArgument(f"{path} must be an integer, got bool")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value, 10)
        except ValueError:
            pass
    raise InvalidArgument(f"{path} must be an integer, got {value!r}")


def shim_resources(doc: Mapping[str, Any] | None, path: str = "linux") -> dict[str, Any]:
    """The shim's ``resources`` for CRI's LinuxContainerResources ``doc`` (field names as in the
    proto). Raises InvalidArgument naming the field (by ``path``) that is not CRI's or has the
    wrong type."""
    if doc is None:
        return {}
    if not isinstance(doc, Mapping):
        raise InvalidArgument(f"{path} must be an object")
    resources: dict[str, Any] = {}
    for field, value in doc.items():
        where = f"{path}.{field}"
        if value in (None, 0, "", [], {}) and not isinstance(value, bool):
            continue  # proto3's zero value: not set
        if field in _STRINGS:
            if not isinstance(value, str):
                raise InvalidArgument(f"{where} must be a string")
            resources[FIELDS[field]] = value
        elif field in FIELDS:
            number = _integer(where, value)
            if number != 0:
                resources[FIELDS[field]] = number
        elif field == "hugepage_limits":
            if not isinstance(value, list):
                raise InvalidArgument(f"{where} must be an array")
            limits = {}
            for i, item in enumerate(value):
                if not isinstance(item, Mapping) or not isinstance(item.get("page_size"), str):
                    raise InvalidArgument(f"{where}[{i}] must be an object with a page_size string")
                limits[item["page_size"]] = _integer(f"{where}[{i}].limit", item.get("limit") or 0)
            resources["hugepage_limits"] = limits
        elif field == "unified":
            if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                         for k, v in value.items()):
                raise InvalidArgument(f"{where} must map strings to strings")
            resources["unified"] = dict(value)
        else:
            raise InvalidArgument(f"{where} is not a field of CRI's LinuxContainerResources")
    return resources


#: The shim's keys whose pod value is the containers' sum plus the pod's overhead.
_SUMMED = ("cpu_shares", "cpu_quota_us", "memory_limit_bytes", "memory_swap_limit_bytes")


def pod_resources(overhead: Mapping[str, Any] | None, resources: Mapping[str, Any] | None) -> dict[str, Any]:
    """The shim's UpdateSandbox ``resources`` for UpdatePodSandboxResources' ``overhead`` and
    ``resources`` (CRI's LinuxContainerResources, proto field names; kubelet sends its pod cgroup's
    figures less the overhead, and the overhead).

    The pod's cgroup gets ``resources`` with the overhead added to each limit and weight that
    ``resources`` sets (CPU shares and quota, memory and memory+swap limits, each huge page size's
    limit); an overhead on a resource ``resources`` leaves unlimited is not applied (the pod stays
    unlimited there). Raises InvalidArgument naming the field for what cannot be applied to a pod:
    an oom_score_adj (a process's, not a cgroup's), an overhead on a resource that is not a quantity
    (cpusets, ``unified``) or whose CPU period differs from ``resources``'."""
    pod = shim_resources(resources, "resources")
    extra = shim_resources(overhead, "overhead")
    for name, doc in (("resources", pod), ("overhead", extra)):
        if "oom_score_adj" in doc:
            raise InvalidArgument(f"{name}.oom_score_adj cannot be applied to a pod: an OOM score is a process's, "
                                  "set for each container with UpdateContainerResources")
    for key in ("cpuset_cpus", "cpuset_mems", "unified"):
        if key in extra:
            raise InvalidArgument(f"overhead.{key} cannot be applied: an overhead adds quantities, and {key} "
                                  "is not one; set the pod's in resources")
    period = extra.pop("cpu_period_us", None)
    if period is not None and "cpu_quota_us" in extra and period != pod.get("cpu_period_us", period):
        raise InvalidArgument(f"overhead.cpu_period {period} differs from resources.cpu_period "
                              f"{pod['cpu_period_us']}: their quotas cannot be added")
    for key in _SUMMED:
        if key in pod and key in extra and pod[key] != -1:
            pod[key] += extra[key]
    for size, limit in (extra.get("hugepage_limits") or {}).items():
        if size in pod.get("hugepage_limits", {}):
            pod["hugepage_limits"][size] += limit
    return pod
