"""Container events for CRI's GetContainerEvents (kubelet's evented PLEG): what happened to which
container or pod, as it happens.

Two sources feed one stream per subscriber:

- the pod layer itself, for what it does: a container created, started or removed; a pod made
  (CREATED then STARTED, with the pod's id as the container id, as containerd sends them) or
  removed (DELETED);
- the shims, for what happens on its own: a container's process that exits (``/tasks/exit``) or a
  pause that exits (``/sandbox/exit``) is a STOPPED event.

Every event is stamped when it is sent (as containerd does), so their times follow their order.

Each subscriber watches every live pod's shim on a connection of its own (closing it is how a
shim stream ends: the protocol has no per-stream cancel), from the moment it subscribes and for
each pod started later. Events from before a subscription are not replayed, as with containerd.
A subscriber that falls :data:`EVENT_QUEUE_LIMIT` events behind is dropped: its iteration ends
with ResourceExhausted, as a shim drops a slow event subscriber.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc

from shim.rpc.api import EVENTS_SERVICE
from shim.rpc.client import Client
from shim.rpc.status import ResourceExhausted, RpcError
from shim.sandbox.events import TOPIC_EXIT, TOPIC_TASK_EXIT

__all__ = ["CONTAINER_CREATED", "CONTAINER_STARTED", "CONTAINER_STOPPED", "CONTAINER_DELETED",
           "EVENT_QUEUE_LIMIT", "ContainerEvent", "EventFeed", "EventStream"]

log = logging.getLogger(__name__)

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
    def __init__(self, send: anyio.abc.ObjectSendStream[ContainerEvent], stream: EventStream,
                 tg: anyio.abc.TaskGroup):
        self.send = send
        self.stream = stream
        self.tg = tg

    def offer(self, event: ContainerEvent) -> None:
        try:
            self.send.send_nowait(event)
        except anyio.WouldBlock:
            self.stream.overflowed = True
            self.send.close()  # the reader gets what is queued, then ResourceExhausted
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass


class EventFeed:
    """The pod layer's event fan-out. ``await shim_address(pod_id)`` is the address of a pod's
    shim (raising RpcError when it has none); ``namespace`` the shims' namespace."""

    def __init__(self, shim_address: Callable[[str], Awaitable[str]], namespace: str,
                 apply: Callable[[str, Any], Awaitable[None]] | None = None):
        self._shim_address = shim_address
        self._namespace = namespace
        # The pod layer's own handling of a shim event (the record updated), awaited before the
        # event goes out: a subscriber that reads the pod's status on a STOPPED event sees the exit.
        self._apply = apply
        self._subscribers: set[_Subscriber] = set()

    def publish(self, kind: str, container_id: str, pod_id: str, created_at: int | None = None) -> None:
        """Send an event to every subscriber now (never blocks)."""
        event = ContainerEvent(container_id, pod_id, kind, created_at or time.time_ns())
        for subscriber in list(self._subscribers):
            subscriber.offer(event)

    async def pod_started(self, pod_id: str) -> None:
        """A pod's sandbox runs: every subscriber starts watching its shim; returns once each is
        connected."""
        for subscriber in list(self._subscribers):
            await subscriber.tg.start(self._watch, subscriber, pod_id)

    @asynccontextmanager
    async def subscribe(self, live_pods: Iterable[str]) -> AsyncIterator[EventStream]:
        """Subscribe; the shims of ``live_pods`` (and of every pod started from now on) are watched
        until the block ends."""
        send, receive = anyio.create_memory_object_stream[ContainerEvent](EVENT_QUEUE_LIMIT)
        stream = EventStream(receive)
        async with receive, anyio.create_task_group() as tg:
            subscriber = _Subscriber(send, stream, tg)
            self._subscribers.add(subscriber)
            try:
                for pod_id in live_pods:
                    await tg.start(self._watch, subscriber, pod_id)
                yield stream
            finally:
                self._subscribers.discard(subscriber)
                send.close()
                tg.cancel_scope.cancel()

    async def _watch(self, subscriber: _Subscriber, pod_id: str,
                     *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Turn one shim's exit events into STOPPED events until its stream ends."""
        try:
            client = await Client.connect(await self._shim_address(pod_id), namespace=self._namespace)
        except RpcError as exc:
            log.info("pod %s: not watching its shim's events: %s", pod_id, exc.message, extra={"pod_id": pod_id})
            task_status.started()
            return
        async with client:
            task_status.started()
            try:
                async for event in client.stream(EVENTS_SERVICE, "Subscribe", {}):
                    stopped = _stopped(event, pod_id)
                    if stopped is not None:
                        if self._apply is not None:
                            await self._apply(pod_id, event)
                        subscriber.offer(stopped)
            except RpcError as exc:  # the shim went away, or dropped us for falling behind
                log.info("pod %s: its shim's event stream ended: %s", pod_id, exc.message, extra={"pod_id": pod_id})


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
