"""RuntimeService's ListMetricDescriptors, ListPodSandboxMetrics and StreamPodSandboxMetrics: the
cadvisor-named metrics kubelet serves on /metrics/cadvisor when it takes pod and container stats
from the runtime (feature gate PodAndContainerStatsFromCRI), shaped by the pod layer
(:mod:`client.cri.podmetrics`) from the shims' cgroup readings, read only when asked.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from google.protobuf import json_format

from shim.cri.api import api_pb2

from client.cri import podmetrics

from .chunks import chunks
from .handlers import Handlers

__all__ = ["PodMetrics"]


class PodMetrics(Handlers):
    """ListMetricDescriptors, ListPodSandboxMetrics, StreamPodSandboxMetrics."""

    async def ListMetricDescriptors(self, request: api_pb2.ListMetricDescriptorsRequest,
                                    context: Any) -> api_pb2.ListMetricDescriptorsResponse:
        response = api_pb2.ListMetricDescriptorsResponse()
        json_format.ParseDict({"descriptors": podmetrics.descriptors()}, response)  # fills it in
        return response

    async def ListPodSandboxMetrics(self, request: api_pb2.ListPodSandboxMetricsRequest,
                                    context: Any) -> api_pb2.ListPodSandboxMetricsResponse:
        return api_pb2.ListPodSandboxMetricsResponse(pod_metrics=await self._metrics())

    async def StreamPodSandboxMetrics(self, request: api_pb2.StreamPodSandboxMetricsRequest,
                                      context: Any) -> AsyncIterator[api_pb2.StreamPodSandboxMetricsResponse]:
        for chunk in chunks(await self._metrics()):
            yield api_pb2.StreamPodSandboxMetricsResponse(pod_sandbox_metrics=chunk)

    async def _metrics(self) -> list[api_pb2.PodSandboxMetrics]:
        """Each ready pod's metrics, in the order ListPodSandbox lists the pods."""
        return [json_format.ParseDict(doc, api_pb2.PodSandboxMetrics()) for doc in await self.pods.list_pod_metrics()]
