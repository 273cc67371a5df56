"""RuntimeService's GetContainerEvents: the server stream kubelet's evented PLEG reads. The events
are the pod layer's (:mod:`client.cri.events`: what it does, and the exits the shims report);
each goes out with the pod's status and its containers' statuses as they are when it is sent,
as containerd sends them (a removed pod's DELETED event has none)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from shim.cri.api import api_pb2
from shim.rpc.status import NotFound

from client.cri.events import ContainerEvent

from . import translate
from .handlers import Handlers

__all__ = ["Events"]


class Events(Handlers):
    """GetContainerEvents."""

    async def GetContainerEvents(self, request: api_pb2.GetEventsRequest,
                                 context: Any) -> AsyncIterator[api_pb2.ContainerEventResponse]:
        async with self.pods.events() as events:
            # Sent now rather than with the first event: a client that waits for the stream's
            # initial metadata knows it is subscribed, and misses nothing from then on.
            await context.send_initial_metadata(())
            async for event in events:
                yield await self._response(event)

    async def _response(self, event: ContainerEvent) -> api_pb2.ContainerEventResponse:
        response = api_pb2.ContainerEventResponse(
            container_id=event.container_id, created_at=event.created_at,
            container_event_type=api_pb2.ContainerEventType.Value(event.kind))
        try:
            pod = await self.pods.pod_sandbox_status(event.pod_id)
            containers = await self.pods.pod_container_statuses(pod["id"])
        except NotFound:
            return response  # removed meanwhile (or the event is its removal)
        response.pod_sandbox_status.CopyFrom(translate.pod_sandbox_status(pod))
        response.containers_statuses.extend(map(translate.container_status, containers))
        return response
