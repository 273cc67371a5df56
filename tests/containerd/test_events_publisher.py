"""A shim's task events reach containerd's Events/Forward in the order they were published, each one:
an event published while the sender closes its idle connection is sent too, and events published
while containerd is away wait for it. Closing the publisher (the shim exits) sends what is queued
within its bound, then says how many it could not send."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from shim.containerd import events
from shim.containerd.events import Publisher, task_events
from shim.rpc.client import Client
from shim.sandbox.events import EventBus

from support.eventsink import events_arrived, fake_containerd_events
from support.shimtools import WAIT

NAMESPACE = "k8s.io"


async def arrive(received: list, arrived: asyncio.Event, count: int) -> list[tuple[str, str]]:
    await events_arrived(received, arrived, count, WAIT)
    return [(e.topic, task_events.TaskCreate.FromString(e.event.value).container_id) for e in received]


@pytest.fixture
async def publisher(tmp_path) -> AsyncIterator[Publisher]:
    """A publisher to containerd at tmp_path/ttrpc.sock, closed at the end (nothing left sending)."""
    it = Publisher(str(tmp_path / "ttrpc.sock"), NAMESPACE)
    try:
        yield it
    finally:
        await it.aclose(0)
        assert it.sender is None


def created(container_id: str) -> Any:
    return task_events.TaskCreate(container_id=container_id)


async def test_events_arrive_in_the_order_they_were_published(publisher, tmp_path) -> None:
    async with fake_containerd_events(str(tmp_path / "ttrpc.sock")) as (received, arrived):
        for n in range(5):
            publisher.publish("/tasks/create", created(f"c{n}"))
        assert await arrive(received, arrived, 5) == [("/tasks/create", f"c{n}") for n in range(5)]
        assert {e.namespace for e in received} == {NAMESPACE}


async def test_an_event_published_while_the_idle_connection_closes_is_sent_too(publisher, tmp_path,
                                                                              monkeypatch) -> None:
    close = Client.aclose
    closings: list[Client] = []

    async def close_and_meanwhile_publish(client: Client) -> None:
        closings.append(client)
        if len(closings) == 1:
            publisher.publish("/tasks/delete", created("late"))
        await close(client)

    monkeypatch.setattr(Client, "aclose", close_and_meanwhile_publish)
    async with fake_containerd_events(str(tmp_path / "ttrpc.sock")) as (received, arrived):
        publisher.publish("/tasks/create", created("first"))
        assert await arrive(received, arrived, 2) == [("/tasks/create", "first"), ("/tasks/delete", "late")]


async def test_events_published_while_containerd_is_away_wait_for_it(publisher, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(events, "RETRY_DELAY", 0.05)
    publisher.publish("/tasks/create", created("early"))
    await asyncio.sleep(0.2)  # a few attempts find nobody
    assert publisher.queue and publisher.dropped == 0
    async with fake_containerd_events(str(tmp_path / "ttrpc.sock")) as (received, arrived):
        publisher.publish("/tasks/start", created("later"))
        assert await arrive(received, arrived, 2) == [("/tasks/create", "early"), ("/tasks/start", "later")]
        async with asyncio.timeout(WAIT):  # each taken off the queue once containerd answered its Forward
            while publisher.queue:
                await asyncio.sleep(0.01)


async def test_closing_sends_what_is_still_queued_and_then_takes_no_more(publisher, tmp_path, caplog) -> None:
    async with fake_containerd_events(str(tmp_path / "ttrpc.sock")) as (received, arrived):
        for n in range(3):
            publisher.publish("/tasks/exit", created(f"c{n}"))
        assert await publisher.aclose(WAIT) == 0
        assert [task_events.TaskCreate.FromString(e.event.value).container_id for e in received] == ["c0", "c1", "c2"]
        with caplog.at_level(logging.WARNING, logger=events.__name__):
            publisher.publish("/tasks/delete", created("after"))
        assert not publisher.queue and publisher.sender is None
        assert "published after the shim's publisher closed; dropped" in caplog.text


async def test_closing_while_containerd_is_away_gives_up_at_its_bound_and_says_how_many(
        publisher, monkeypatch, caplog) -> None:
    monkeypatch.setattr(events, "RETRY_DELAY", 0.05)
    publisher.publish("/tasks/exit", created("a"))
    publisher.publish("/tasks/delete", created("a"))
    with caplog.at_level(logging.WARNING, logger=events.__name__):
        async with asyncio.timeout(WAIT):
            assert await publisher.aclose(0.3) == 2
    assert not publisher.queue and publisher.sender is None
    assert "2 event(s) for containerd" in caplog.text and "not sent within 0.3s" in caplog.text


async def test_closing_stops_following_the_sandboxs_exits(publisher) -> None:
    bus = EventBus(NAMESPACE, "sandbox")
    follower = publisher.follow(bus)
    await publisher.aclose(0)
    assert follower.cancelled()
