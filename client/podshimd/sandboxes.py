"""RuntimeService's pod sandbox RPCs: RunPodSandbox, StopPodSandbox, RemovePodSandbox,
PodSandboxStatus, ListPodSandbox, StreamPodSandboxes. The semantics (rollback, idempotence, NOT_FOUND, ids by unique
prefix) are the pod layer's, :class:`client.cri.pod.PodService`."""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator
from typing import Any

from shim.cri import requests
from shim.cri.api import api_pb2

from client.phases import traced

from . import translate
from .chunks import chunks
from .handlers import Handlers

__all__ = ["Sandboxes"]


class Sandboxes(Handlers):
    """The pod sandbox handlers."""

    async def RunPodSandbox(self, request: api_pb2.RunPodSandboxRequest, context: Any) -> api_pb2.RunPodSandboxResponse:
        with traced("RunPodSandbox"):
            config = requests.pod_sandbox_config(request)
            pod_id = await self.finish(self.pods.run_pod_sandbox(config, runtime_handler=request.runtime_handler),
                                        pod_start=True)
        return api_pb2.RunPodSandboxResponse(pod_sandbox_id=pod_id)

    async def StopPodSandbox(self, request: api_pb2.StopPodSandboxRequest,
                             context: Any) -> api_pb2.StopPodSandboxResponse:
        with traced("StopPodSandbox"):
            await self.finish(self.pods.stop_pod_sandbox(request.pod_sandbox_id))
        return api_pb2.StopPodSandboxResponse()

    async def RemovePodSandbox(self, request: api_pb2.RemovePodSandboxRequest,
                               context: Any) -> api_pb2.RemovePodSandboxResponse:
        with traced("RemovePodSandbox"):
            await self.finish(self.pods.remove_pod_sandbox(request.pod_sandbox_id))
        return api_pb2.RemovePodSandboxResponse()

    async def PodSandboxStatus(self, request: api_pb2.PodSandboxStatusRequest,
                               context: Any) -> api_pb2.PodSandboxStatusResponse:
        # The statuses of the pod's containers go with the time they were read from (kubelet's
        # evented PLEG takes them instead of asking ContainerStatus once it sees a timestamp,
        # so a timestamp without them says the pod has no container): stamped before they
        # are read, as kubelet stamps the statuses it gathers itself.
        stamp = time.time_ns()
        status = await self.pods.pod_sandbox_status(request.pod_sandbox_id, verbose=request.verbose)
        containers = await self.pods.pod_container_statuses(status["id"])
        return api_pb2.PodSandboxStatusResponse(status=translate.pod_sandbox_status(status),
                                                info=translate.verbose_info(status.get("info")),
                                                containers_statuses=map(translate.container_status, containers),
                                                timestamp=stamp)

    async def ListPodSandbox(self, request: api_pb2.ListPodSandboxRequest,
                             context: Any) -> api_pb2.ListPodSandboxResponse:
        with traced("ListPodSandbox"):
            return await self._list_pod_sandboxes(request)

    async def StreamPodSandboxes(self, request: api_pb2.StreamPodSandboxesRequest,
                                 context: Any) -> AsyncIterator[api_pb2.StreamPodSandboxesResponse]:
        for chunk in chunks((await self._list_pod_sandboxes(request)).items):
            yield api_pb2.StreamPodSandboxesResponse(pod_sandboxes=chunk)

    async def _list_pod_sandboxes(self, request: api_pb2.ListPodSandboxRequest | api_pb2.StreamPodSandboxesRequest
                    ) -> api_pb2.ListPodSandboxResponse:
        found = await self.pods.list_pod_sandbox(translate.pod_sandbox_filter(request))
        return self._listed.response(found)

    @functools.cached_property
    def _listed(self) -> translate.PodSandboxes:
        """The encodings ListPodSandbox reuses for pods unchanged since it last listed them."""
        return translate.PodSandboxes()
