"""The shim's task events, forwarded to containerd: ``containerd.services.events.ttrpc.v1.Events/Forward``
on containerd's ttrpc address (``TTRPC_ADDRESS``), as containerd's own shims publish them.

:class:`Publisher` queues each event (never blocking the call that made it) and one task sends them
in order over one protobuf connection, made when the first event comes and made again after
containerd went away (a restarted containerd gets what was queued meanwhile). At most
:data:`QUEUE_LIMIT` events wait; beyond that the oldest is dropped, and the log says so. A shim
that exits closes its publisher (:meth:`Publisher.aclose`), which sends what is still queued
within a bound and logs how many it could not.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any

from google.protobuf.any_pb2 import Any as AnyMessage
from google.protobuf.message import Message

from shim.api.topics import TOPIC_TASK_EXIT
from shim.containerd.api import load
from shim.containerd.services import timestamp
from shim.rpc.codecs import PROTOBUF
from shim.rpc.status import DeadlineExceeded, RpcError, Unavailable
from shim.sandbox.events import EventBus

__all__ = ["EVENTS_SERVICE", "QUEUE_LIMIT", "Publisher", "task_events"]

log = logging.getLogger(__name__)

task_events = load("events.task_pb2")
events_pb2 = load("services.ttrpc.events.v1.events_pb2")
envelope_pb2 = load("types.event_pb2")

EVENTS_SERVICE = "containerd.services.events.ttrpc.v1.Events"
#: Events waiting for containerd at most.
QUEUE_LIMIT = 1024
#: Seconds one Forward may take, and between two attempts to reach containerd.
FORWARD_TIMEOUT = 5.0
RETRY_DELAY = 1.0


class Publisher:
    """Forwards events of ``namespace`` to containerd at ``address`` (see the module's docstring)."""

    def __init__(self, address: str, namespace: str):
        self.address = address if "://" in address else f"unix://{address}"
        self.namespace = namespace
        self.queue: collections.deque[bytes] = collections.deque()
        self.sender: asyncio.Task[None] | None = None
        self.follower: asyncio.Task[None] | None = None
        self.dropped = 0
        self.closed = False

    def publish(self, topic: str, event: Message) -> None:
        """Queue ``event`` (a message of containerd's events/task.proto) under ``topic``."""
        if self.closed:
            log.warning("event %s published after the shim's publisher closed; dropped", topic)
            return
        envelope = envelope_pb2.Envelope(
            timestamp=timestamp(time.time_ns()), namespace=self.namespace, topic=topic,
            event=AnyMessage(type_url=event.DESCRIPTOR.full_name, value=event.SerializeToString()))
        if len(self.queue) >= QUEUE_LIMIT:
            self.queue.popleft()
            self.dropped += 1
            log.warning("containerd at %s is not taking events: %d dropped so far", self.address, self.dropped)
        self.queue.append(events_pb2.ForwardRequest(envelope=envelope).SerializeToString())
        self._sending()

    def follow(self, bus: EventBus) -> asyncio.Task[None]:
        """Forward the exits of the shim's tasks that ``bus`` publishes, as TaskExit."""
        async def follow() -> None:
            subscription = bus.subscribe()
            try:
                while True:
                    event = await subscription.get()
                    if event["topic"] == TOPIC_TASK_EXIT:
                        e = event["event"]
                        self.publish("/tasks/exit", task_events.TaskExit(
                            container_id=e["task_id"], id=e["task_id"], pid=e["pid"], exit_status=e["exit_status"],
                            exited_at=timestamp(e["exited_at"])))
            finally:
                subscription.close()

        self.follower = asyncio.ensure_future(follow())
        return self.follower

    async def aclose(self, timeout: float) -> int:
        """Stop following and send what is queued, waiting at most ``timeout`` seconds for
        containerd to take it; then stop sending. Returns how many events were not sent (the log
        names the number too)."""
        self.closed = True
        if self.follower is not None:
            self.follower.cancel()
            await asyncio.wait([self.follower])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.queue and loop.time() < deadline:
            await asyncio.wait([self._sending()], timeout=deadline - loop.time())
        sender, self.sender = self.sender, None
        if sender is not None and not sender.done():
            sender.cancel()
            await asyncio.wait([sender])  # its connection closed, as it always closes it
        left = len(self.queue)
        if left:
            log.warning("%d event(s) for containerd at %s not sent within %gs of the shim's exit; dropped",
                        left, self.address, timeout)
            self.queue.clear()
        return left

    def _sending(self) -> asyncio.Task[None]:
        """The task that sends the queue, started when none runs."""
        if self.sender is None or self.sender.done():
            self.sender = asyncio.ensure_future(self._send())
        return self.sender

    async def _send(self) -> None:
        from shim.rpc.client import Client

        client: Any = None
        try:
            while self.queue:
                if client is None or client.closed:
                    try:
                        client = await Client.connect(self.address, codec=PROTOBUF, timeout=FORWARD_TIMEOUT)
                    except RpcError as exc:
                        log.warning("cannot forward events to containerd: %s", exc.message)
                        await asyncio.sleep(RETRY_DELAY)
                        continue
                request = self.queue[0]
                try:
                    await client.call(EVENTS_SERVICE, "Forward", request, timeout=FORWARD_TIMEOUT,
                                      metadata={"containerd-namespace": [self.namespace]})
                except (Unavailable, DeadlineExceeded) as exc:  # gone or stuck: again, on a new connection
                    log.warning("forwarding an event to containerd failed: %s", exc.message)
                    await client.aclose()
                    client = None
                    await asyncio.sleep(RETRY_DELAY)
                    continue
                except RpcError as exc:  # refused: sending it again would be refused again
                    log.error("containerd refused an event (dropped): %s", exc)
                if self.queue and self.queue[0] is request:
                    self.queue.popleft()
        finally:
            # No longer the sender before the first await of closing: an event published while
            # the idle connection closes starts a sender of its own rather than wait for the next.
            if self.sender is asyncio.current_task():
                self.sender = None
            if client is not None:
                await client.aclose()
