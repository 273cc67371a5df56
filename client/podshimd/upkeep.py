"""RuntimeService's UpdateContainerResources, UpdatePodSandboxResources, ReopenContainerLog and
UpdateRuntimeConfig: changes
to what runs, not to its life. The semantics are the pod layer's (:class:`client.cri.pod.PodService`)
and the shim's (protocol.md 7.3, Update and ReopenLog)."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from shim.cri.api import api_pb2
from shim.rpc.status import InvalidArgument

from .handlers import Handlers

__all__ = ["Upkeep"]


def _fields(request: Message, name: str) -> dict[str, Any] | None:
    """The request's message field ``name`` as a dict with the proto's field names; None if unset."""
    return json_format.MessageToDict(getattr(request, name), preserving_proto_field_name=True) \
        if request.HasField(name) else None


class Upkeep(Handlers):
    """UpdateContainerResources, UpdatePodSandboxResources, ReopenContainerLog, UpdateRuntimeConfig."""

    async def UpdateContainerResources(self, request: api_pb2.UpdateContainerResourcesRequest,
                                       context: Any) -> api_pb2.UpdateContainerResourcesResponse:
        if request.HasField("windows"):
            raise InvalidArgument("windows resources cannot be applied to a Linux container")
        if request.annotations:
            raise InvalidArgument("annotations cannot be applied: no annotation changes how podshim updates a "
                                  "container's resources")
        await self.pods.update_container_resources(request.container_id, _fields(request, "linux"))
        return api_pb2.UpdateContainerResourcesResponse()

    async def UpdatePodSandboxResources(self, request: api_pb2.UpdatePodSandboxResourcesRequest,
                                        context: Any) -> api_pb2.UpdatePodSandboxResourcesResponse:
        await self.pods.update_pod_sandbox_resources(request.pod_sandbox_id, _fields(request, "overhead"),
                                                     _fields(request, "resources"))
        return api_pb2.UpdatePodSandboxResourcesResponse()

    async def ReopenContainerLog(self, request: api_pb2.ReopenContainerLogRequest,
                                 context: Any) -> api_pb2.ReopenContainerLogResponse:
        await self.pods.reopen_container_log(request.container_id)
        return api_pb2.ReopenContainerLogResponse()

    async def UpdateRuntimeConfig(self, request: api_pb2.UpdateRuntimeConfigRequest,
                                  context: Any) -> api_pb2.UpdateRuntimeConfigResponse:
        self.pods.update_runtime_config(request.runtime_config.network_config.pod_cidr)
        return api_pb2.UpdateRuntimeConfigResponse()
