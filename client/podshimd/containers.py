"""RuntimeService's container RPCs: CreateContainer, StartContainer, StopContainer,
RemoveContainer, ListContainers, StreamContainers, ContainerStatus. The semantics are the pod layer's,
:class:`client.cri.pod.PodService`; a container without an image is refused (shim.cri.requests)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from shim.cri import requests
from shim.cri.api import api_pb2

from client.phases import traced

from . import translate
from .chunks import chunks
from .handlers import Handlers

__all__ = ["Containers"]


class Containers(Handlers):
    """The container handlers."""

    async def CreateContainer(self, request: api_pb2.CreateContainerRequest,
                              context: Any) -> api_pb2.CreateContainerResponse:
        config = requests.container_config(request)
        with traced("CreateContainer"):
            container_id = await self.finish(self.pods.create_container(request.pod_sandbox_id, config))
        return api_pb2.CreateContainerResponse(container_id=container_id)

    async def StartContainer(self, request: api_pb2.StartContainerRequest,
                             context: Any) -> api_pb2.StartContainerResponse:
        with traced("StartContainer"):
            await self.finish(self.pods.start_container(request.container_id))
        return api_pb2.StartContainerResponse()

    async def StopContainer(self, request: api_pb2.StopContainerRequest,
                            context: Any) -> api_pb2.StopContainerResponse:
        # CRI: the timeout is in seconds, and its zero value means "forcibly, at once".
        await self.finish(self.pods.stop_container(request.container_id, timeout=float(request.timeout)))
        return api_pb2.StopContainerResponse()

    async def RemoveContainer(self, request: api_pb2.RemoveContainerRequest,
                              context: Any) -> api_pb2.RemoveContainerResponse:
        await self.finish(self.pods.remove_container(request.container_id))
        return api_pb2.RemoveContainerResponse()

    async def ContainerStatus(self, request: api_pb2.ContainerStatusRequest,
                              context: Any) -> api_pb2.ContainerStatusResponse:
        status = await self.pods.container_status(request.container_id, verbose=request.verbose)
        return api_pb2.ContainerStatusResponse(status=translate.container_status(status),
                                               info=translate.verbose_info(status.get("info")))

    async def ListContainers(self, request: api_pb2.ListContainersRequest,
                             context: Any) -> api_pb2.ListContainersResponse:
        return api_pb2.ListContainersResponse(containers=await self._list_containers(request))

    async def StreamContainers(self, request: api_pb2.StreamContainersRequest,
                               context: Any) -> AsyncIterator[api_pb2.StreamContainersResponse]:
        for chunk in chunks(await self._list_containers(request)):
            yield api_pb2.StreamContainersResponse(containers=chunk)

    async def _list_containers(self, request: api_pb2.ListContainersRequest | api_pb2.StreamContainersRequest
                    ) -> list[api_pb2.Container]:
        found = await self.pods.list_containers(translate.container_filter(request))
        return [translate.container(c) for c in found]
