"""RuntimeService's ContainerStats, ListContainerStats, StreamContainerStats, PodSandboxStats,
ListPodSandboxStats and StreamPodSandboxStats (``crictl stats``, ``crictl statsp``; kubelet's CRI stats provider). The figures are the shims'
cgroup readings (protocol.md: SandboxMetrics, Task Stats), shaped by the pod layer
(:mod:`client.cri.stats`); a figure the host cannot give is left unset, never zero."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from google.protobuf import json_format

from shim.cri.api import api_pb2

from .chunks import chunks
from .handlers import Handlers

__all__ = ["Stats"]


def _container_stats(doc: Mapping[str, Any]) -> api_pb2.ContainerStats:
    stats = api_pb2.ContainerStats()
    json_format.ParseDict(doc, stats, ignore_unknown_fields=True)  # fills it in
    return stats


def _pod_stats(doc: Mapping[str, Any]) -> api_pb2.PodSandboxStats:
    stats = api_pb2.PodSandboxStats()
    json_format.ParseDict(doc, stats, ignore_unknown_fields=True)
    return stats


class Stats(Handlers):
    """The stats handlers."""

    async def ContainerStats(self, request: api_pb2.ContainerStatsRequest,
                             context: Any) -> api_pb2.ContainerStatsResponse:
        return api_pb2.ContainerStatsResponse(stats=_container_stats(await self.pods.container_stats(
            request.container_id)))

    async def ListContainerStats(self, request: api_pb2.ListContainerStatsRequest,
                                 context: Any) -> api_pb2.ListContainerStatsResponse:
        return api_pb2.ListContainerStatsResponse(stats=await self._listed_container_stats(request))

    async def StreamContainerStats(self, request: api_pb2.StreamContainerStatsRequest,
                                   context: Any) -> AsyncIterator[api_pb2.StreamContainerStatsResponse]:
        for chunk in chunks(await self._listed_container_stats(request)):
            yield api_pb2.StreamContainerStatsResponse(container_stats=chunk)

    async def _listed_container_stats(self, request: api_pb2.ListContainerStatsRequest | api_pb2.StreamContainerStatsRequest
                               ) -> list[api_pb2.ContainerStats]:
        f = request.filter
        found = await self.pods.list_container_stats({"id": f.id or None, "pod_sandbox_id": f.pod_sandbox_id or None,
                                                      "label_selector": dict(f.label_selector)})
        return [_container_stats(doc) for doc in found]

    async def PodSandboxStats(self, request: api_pb2.PodSandboxStatsRequest,
                              context: Any) -> api_pb2.PodSandboxStatsResponse:
        return api_pb2.PodSandboxStatsResponse(stats=_pod_stats(await self.pods.pod_stats(request.pod_sandbox_id)))

    async def ListPodSandboxStats(self, request: api_pb2.ListPodSandboxStatsRequest,
                                  context: Any) -> api_pb2.ListPodSandboxStatsResponse:
        return api_pb2.ListPodSandboxStatsResponse(stats=await self._listed_pod_stats(request))

    async def StreamPodSandboxStats(self, request: api_pb2.StreamPodSandboxStatsRequest,
                                    context: Any) -> AsyncIterator[api_pb2.StreamPodSandboxStatsResponse]:
        for chunk in chunks(await self._listed_pod_stats(request)):
            yield api_pb2.StreamPodSandboxStatsResponse(pod_sandbox_stats=chunk)

    async def _listed_pod_stats(self, request: api_pb2.ListPodSandboxStatsRequest | api_pb2.StreamPodSandboxStatsRequest
                         ) -> list[api_pb2.PodSandboxStats]:
        f = request.filter
        found = await self.pods.list_pod_stats({"id": f.id or None, "label_selector": dict(f.label_selector)})
        return [_pod_stats(doc) for doc in found]
