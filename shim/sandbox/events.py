"""The shim's event bus: every subscriber gets every event, and a slow one cannot hurt the rest.

Events are maps ``{topic, namespace, sandbox_id, timestamp, event}`` (protocol.md, "Events").
Each subscriber has a bounded queue; a subscriber that falls :data:`QUEUE_LIMIT` events behind is
dropped (its stream ends with RESOURCE_EXHAUSTED) rather than growing the shim's memory.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from shim.rpc.status import ResourceExhausted

__all__ = ["QUEUE_LIMIT", "EventBus", "Subscription"]

QUEUE_LIMIT = 1024


class Subscription:
    """One subscriber's queue; iterate with ``await sub.get()``."""

    def __init__(self, bus: EventBus):
        self._bus = bus
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(QUEUE_LIMIT)
        self.overflowed = False

    async def get(self) -> dict[str, Any]:
        """The next event. Raises ResourceExhausted once a subscriber that fell behind has
        drained what it was sent before it was dropped."""
        if self.overflowed and self._queue.empty():
            raise ResourceExhausted(f"event subscriber fell {QUEUE_LIMIT} events behind and was dropped")
        return await self._queue.get()

    def _offer(self, event: dict[str, Any]) -> None:
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            # Overflow only happens with a full queue, so the reader always finds events to
            # drain before it reaches the check in get().
            self.overflowed = True
            self._bus.unsubscribe(self)

    def close(self) -> None:
        self._bus.unsubscribe(self)


class EventBus:
    """Fan-out of shim events to any number of subscribers."""

    def __init__(self, namespace: str, sandbox_id: str):
        self.namespace = namespace
        self.sandbox_id = sandbox_id
        self._subs: set[Subscription] = set()

    def subscribe(self) -> Subscription:
        sub = Subscription(self)
        self._subs.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subs.discard(sub)

    @property
    def subscriber_count(self) -> int:
        return len(self._subs)

    def publish(self, topic: str, event: dict[str, Any]) -> None:
        """Send an event to every subscriber (never blocks)."""
        envelope = {
            "topic": topic,
            "namespace": self.namespace,
            "sandbox_id": self.sandbox_id,
            "timestamp": time.time_ns(),
            "event": event,
        }
        for sub in list(self._subs):
            sub._offer(envelope)
