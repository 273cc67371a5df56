"""Container events for CRI's GetContainerEvents (kubelet's evented PLEG): what happened to which
container or pod, as it happens.

Two sources feed one stream per subscriber:

- the pod layer itself, for what it does: a container created, started or removed; a pod made
  (CREATED then STARTED, with the pod's id as the container id, as containerd sends them) or
  removed (DELETED);
- the shims, for what happens on its own: a container's process that exits (``/tasks/exit``) or a
  pause that exits (``/sandbox/exit``) is a STOPPED event.

Every event is stamped when it is sent (as containerd does), so their times follow their order.

The shims' events reach the feed through the pod layer, which follows each live pod's shim on
one event stream (``PodService._follow``) whatever the number of subscribers: it applies an exit
to the pod's records, then hands it to :meth:`EventFeed.shim_event`, which fans it out in memory.
So a subscriber costs the shims nothing, and sees an exit only once its record says so. Events
from before a subscription are not replayed, as with containerd. A subscriber that falls
:data:`EVENT_QUEUE_LIMIT` events behind is dropped: its iteration ends with ResourceExhausted, as
a shim drops a slow event subscriber.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectSendStream

from shim.api.topics import TOPIC_EXIT, TOPIC_TASK_EXIT
from shim.rpc.status import ResourceExhausted

__all__ = ["CONTAINER_CREATED", "CONTAINER_STARTED", "CONTAINER_STOPPED", "CONTAINER_DELETED",
           "EVENT_QUEUE_LIMIT", "ContainerEvent", "EventFeed", "EventStream"]

# CRI's ContainerEventType names.
CONTAINER_CREATED = "CONTAINER_CREATED_EVENT"
CONTAINER_STARTED = "CONTAINER_STARTED_EVENT"
CONTAINER_STOPPED = "CONTAINER_STOPPED_EVENT"
CONTAINER_DELETED = "CONTAINER_DELETED_EVENT"
#: Events a subscriber may have waiting before it is dropped (a shim's own limit).
EVENT_QUEUE_LIMIT = 1024


@dataclass(frozen=True)
class ContainerEvent:
    """One event: ``kind`` (a CRI ContainerEventType name) happened to ``container_id`` of pod
    ``pod_id`` at ``created_at`` (ns since the epoch). For a pod's own events both ids are the pod's."""

    container_id: str
    pod_id: str
    kind: str
    created_at: int

    @property
    def about_pod(self) -> bool:
        return self.container_id == self.pod_id


class EventStream:
    """What a subscriber iterates: events until it leaves; ResourceExhausted once it fell behind."""

    def __init__(self, receive: anyio.abc.ObjectReceiveStream[ContainerEvent]):
        self._receive = receive
        self.overflowed = False

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> ContainerEvent:
        try:
            return await self._receive.receive()
        except anyio.EndOfStream:
            if self.overflowed:
                raise ResourceExhausted(f"the event subscriber fell {EVENT_QUEUE_LIMIT} events behind and was "
                                        "dropped; subscribe again") from None
            raise StopAsyncIteration from None


class _Subscriber:
    def __init__(self, send: MemoryObjectSendStream[ContainerEvent], stream: EventStream):
        self.send = send
        self.stream = stream

    def offer(self, event: ContainerEvent) -> None:
        try:
            self.send.send_nowait(event)
        except anyio.WouldBlock:
            self.stream.overflowed = True
            self.send.close()  # the reader gets what is queued, then ResourceExhausted
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass


class EventFeed:
    """The pod layer's event fan-out: what is published goes to every subscriber of the moment."""

    def __init__(self) -> None:
        self._subscribers: set[_Subscriber] = set()

    def publish(self, kind: str, container_id: str, pod_id: str, created_at: int | None = None) -> None:
        """Send an event to every subscriber now (never blocks)."""
        event = ContainerEvent(container_id, pod_id, kind, created_at or time.time_ns())
        for subscriber in list(self._subscribers):
            subscriber.offer(event)

    def shim_event(self, pod_id: str, event: object) -> None:
        """An event of pod ``pod_id``'s shim, once the pod layer applied it: an exit goes out as a
        STOPPED event; the rest is nobody's business here."""
        stopped = _stopped(event, pod_id)
        if stopped is not None and self._subscribers:
            for subscriber in list(self._subscribers):
                subscriber.offer(stopped)

    @asynccontextmanager
    async def subscribe(self) -> AsyncIterator[EventStream]:
        """Subscribe until the block ends."""
        send, receive = anyio.create_memory_object_stream[ContainerEvent](EVENT_QUEUE_LIMIT)
        stream = EventStream(receive)
        subscriber = _Subscriber(send, stream)
        async with receive:
            self._subscribers.add(subscriber)
            try:
                yield stream
            finally:
                self._subscribers.discard(subscriber)
                send.close()


def _stopped(event: object, pod_id: str) -> ContainerEvent | None:
    """The STOPPED event of a shim's exit event; None for any other event. Stamped now, not with
    the exit's time: events go out in the order of their times (kubelet's cache drops an update
    older than what it has, and a fast exit can come before its STARTED event was sent)."""
    if not isinstance(event, dict) or not isinstance(event.get("event"), dict):
        return None
    body = event["event"]
    if event.get("topic") == TOPIC_TASK_EXIT and isinstance(body.get("task_id"), str):
        return ContainerEvent(body["task_id"], pod_id, CONTAINER_STOPPED, time.time_ns())
    if event.get("topic") == TOPIC_EXIT:
        return ContainerEvent(pod_id, pod_id, CONTAINER_STOPPED, time.time_ns())
    return None
