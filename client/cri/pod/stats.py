"""ContainerStats, ListContainerStats, PodSandboxStats, ListPodSandboxStats and
ListPodSandboxMetrics: cgroup and network figures read when asked (containerd's container_stats*.go,
sandbox_stats*.go, sandbox_metrics.go)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from shim.rpc.status import FailedPrecondition, NotFound, Unavailable

from client.cri import podmetrics, stats
from client.cri.pod.base import POD_STATE, PodServiceBase
from client.cri.rootfs import call
from client.cri.store import ContainerRecord, ContainerState, PodRecord, PodState


class Stats(PodServiceBase):
    """The pod service's stats part (:class:`client.cri.pod.PodService` is all of them)."""

    async def container_stats(self, container_id: str) -> dict[str, Any]:
        """ContainerStats, CRI-shaped: its cgroup's cpu and memory figures; a figure the host
        cannot give (or a container that has none: never started, its shim gone) is left out."""
        return await self._container_stats(await self._refresh_container(self._container(container_id)))

    async def list_container_stats(self, filter: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """ListContainerStats of the running containers, filtered as :meth:`list_containers`
        (``id``, ``pod_sandbox_id``, ``label_selector``)."""
        found = await self.list_containers({**(filter or {}), "state": "CONTAINER_RUNNING"})
        out = []
        for entry in found:
            try:
                out.append(await self._container_stats(self.store.get_container(entry["pod_sandbox_id"], entry["id"])))
            except NotFound:
                continue  # removed meanwhile
        return out

    async def _container_stats(self, c: ContainerRecord) -> dict[str, Any]:
        doc: dict[str, Any] = {"attributes": stats.attributes(c.container_id, c.config.get("metadata") or {},
                                                              c.labels, c.annotations)}
        if c.state is ContainerState.CREATED:
            return doc
        try:
            reply = await self._task(c.pod_id, "Stats", {"task_id": c.container_id})
        except (Unavailable, NotFound):
            return doc  # the shim or the task is gone: no figures
        timestamp, data = reply.get("timestamp") or time.time_ns(), reply.get("data") or {}
        figures = {"cpu": stats.cpu_usage(c.container_id, timestamp, data, self._cpu_rates),
                   "memory": stats.memory_usage(timestamp, data), "swap": stats.swap_usage(timestamp, data),
                   "io": stats.io_usage(timestamp, data)}
        return {**doc, **{k: v for k, v in figures.items() if v}}

    async def pod_stats(self, pod_id: str) -> dict[str, Any]:
        """PodSandboxStats, CRI-shaped: the pod's cgroup (the pause and every container) and its
        running containers' stats. FailedPrecondition unless the pod is ready."""
        record = await self._refreshed(self._pod(pod_id))
        if record.state is not PodState.READY:
            raise FailedPrecondition(f"pod {record.pod_id} is not ready ({POD_STATE[record.state]}): its sandbox "
                                     "has no usage to report")
        return await self._pod_stats(record)

    async def list_pod_stats(self, filter: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """ListPodSandboxStats of the ready pods, filtered by ``id`` (prefix) and ``label_selector``."""
        f = dict(filter or {})
        out = []
        for entry in await self.list_pod_sandbox({"id": f.get("id"), "state": "SANDBOX_READY",
                                                  "label_selector": f.get("label_selector")}):
            try:
                out.append(await self._pod_stats(self.store.get(entry["id"])))
            except (NotFound, FailedPrecondition):
                continue  # removed, or its shim died, meanwhile
        return out

    async def _pod_stats(self, record: PodRecord) -> dict[str, Any]:
        metrics = await self.controller.metrics(self.namespace, record.pod_id)
        timestamp, data = metrics.get("timestamp") or time.time_ns(), metrics.get("data") or {}
        containers = [await self._container_stats(c) for c in record.containers.values() if c.state is ContainerState.RUNNING]
        linux = {"cpu": stats.cpu_usage(record.pod_id, timestamp, data, self._cpu_rates),
                 "memory": stats.memory_usage(timestamp, data),
                 "process": stats.process_usage(timestamp, data),
                 "network": stats.network_usage(timestamp, data),
                 "io": stats.io_usage(timestamp, data),
                 "containers": containers}
        return {"attributes": stats.attributes(record.pod_id, record.config.get("metadata") or {}, record.labels,
                                               record.annotations),
                "linux": {k: v for k, v in linux.items() if v}}

    async def list_pod_metrics(self) -> list[dict[str, Any]]:
        """ListPodSandboxMetrics of the ready pods (:mod:`client.cri.podmetrics`): each pod's
        cgroup and network figures and its running containers'; read only when asked."""
        out = []
        for entry in await self.list_pod_sandbox({"state": "SANDBOX_READY"}):
            try:
                record = self.store.get(entry["id"])
                reply = await self.controller.metrics(self.namespace, record.pod_id, details=True)
            except (NotFound, FailedPrecondition, Unavailable):
                continue  # removed, or its shim died, meanwhile
            metadata = record.config.get("metadata") or {}
            containers = [await self._container_metrics(metadata, c) for c in record.containers.values()
                          if c.state is ContainerState.RUNNING]
            out.append(podmetrics.pod_metrics(record.pod_id, metadata, reply.get("timestamp") or time.time_ns(),
                                              reply.get("data") or {}, [c for c in containers if c is not None]))
        return out

    async def _container_metrics(self, pod_metadata: Mapping[str, Any], c: ContainerRecord) -> dict[str, Any] | None:
        """One running container's metrics; None when its shim or task is gone meanwhile."""
        try:
            reply = await self._task(c.pod_id, "Stats", {"task_id": c.container_id, "details": True})
        except (Unavailable, NotFound):
            return None
        image = (c.config.get("image") or {}).get("image", "")
        return podmetrics.container_metrics(pod_metadata, c.container_id, c.metadata.name, image, c.started_at,
                                            reply.get("timestamp") or time.time_ns(), reply.get("data") or {},
                                            await self._writable_layer(c.container_id))

    async def _writable_layer(self, container_id: str) -> dict[str, Any] | None:
        """The container's writable layer: its usage and its filesystem's size and inodes; None
        when the container has no snapshot of this snapshotter (a root of its own)."""
        measure = getattr(self.snapshots, "active_usage", None)
        if measure is None:
            return None
        try:
            upper, used = await call(measure, container_id)
            fs = await call(os.statvfs, upper)
            device = await call(podmetrics.filesystem_device, upper)
        except (NotFound, OSError):
            return None
        return {"device": device, "usage_bytes": used.bytes, "limit_bytes": fs.f_blocks * fs.f_frsize,
                "inodes_total": fs.f_files, "inodes_free": fs.f_ffree}
