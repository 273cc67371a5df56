"""RuntimeService's ListMetricDescriptors, ListPodSandboxMetrics and StreamPodSandboxMetrics: the
cadvisor-style metrics kubelet serves on /metrics/cadvisor when it takes pod and container stats
from the runtime (feature gate PodAndContainerStatsFromCRI).

podshimd describes no such metric and so reports none: every answer is an empty list (and the
stream ends without a message). Its pods' and containers' figures are served by the stats RPCs
(:mod:`.stats`), which kubelet reads for its summary API; naming a few of them under cadvisor's
metric names would be half of cadvisor's set passed off as the whole (docs/cri.md).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from client.criapi import api_pb2

from .chunks import chunks
from .handlers import Handlers

__all__ = ["PodMetrics"]


class PodMetrics(Handlers):
    """ListMetricDescriptors, ListPodSandboxMetrics, StreamPodSandboxMetrics."""

    async def ListMetricDescriptors(self, request: api_pb2.ListMetricDescriptorsRequest,
                                    context: Any) -> api_pb2.ListMetricDescriptorsResponse:
        return api_pb2.ListMetricDescriptorsResponse(descriptors=[])

    async def ListPodSandboxMetrics(self, request: api_pb2.ListPodSandboxMetricsRequest,
                                    context: Any) -> api_pb2.ListPodSandboxMetricsResponse:
        return api_pb2.ListPodSandboxMetricsResponse(pod_metrics=self._metrics())

    async def StreamPodSandboxMetrics(self, request: api_pb2.StreamPodSandboxMetricsRequest,
                                      context: Any) -> AsyncIterator[api_pb2.StreamPodSandboxMetricsResponse]:
        for chunk in chunks(self._metrics()):
            yield api_pb2.StreamPodSandboxMetricsResponse(pod_sandbox_metrics=chunk)

    def _metrics(self) -> list[api_pb2.PodSandboxMetrics]:
        """Each pod's metrics of the descriptors ListMetricDescriptors lists: none."""
        return []
