"""A shim's task events reach containerd's Events/Forward in the order they were published, each one:
an event published while the sender closes its idle connection is sent too, and events published
while containerd is away wait for it."""

from __future__ import annotations

import asyncio

import pytest

from shim.containerd import events
from shim.containerd.events import Publisher, task_events
from shim.rpc.client import Client

from support.eventsink import fake_containerd_events
from support.shimtools import WAIT

NAMESPACE = "k8s.io"


async def arrive(received: list, arrived: asyncio.Event, count: int) -> list[tuple[str, str]]:
    async with asyncio.timeout(WAIT):
        while len(received) < count:
            arrived.clear()
            await arrived.wait()
    return [(e.topic, task_events.TaskCreate.FromString(e.event.value).container_id) for e in received]


async def test_events_arrive_in_the_order_they_were_published(tmp_path) -> None:
    async with fake_containerd_events(str(tmp_path / "ttrpc.sock")) as (received, arrived):
        publisher = Publisher(str(tmp_path / "ttrpc.sock"), NAMESPACE)
        for n in range(5):
            publisher.publish("/tasks/create", task_events.TaskCreate(container_id=f"c{n}"))
        assert await arrive(received, arrived, 5) == [("/tasks/create", f"c{n}") for n in range(5)]
        assert {e.namespace for e in received} == {NAMESPACE}


async def test_an_event_published_while_the_idle_connection_closes_is_sent_too(tmp_path, monkeypatch) -> None:
    publisher = Publisher(str(tmp_path / "ttrpc.sock"), NAMESPACE)
    close = Client.aclose
    closings: list[Client] = []

    async def close_and_meanwhile_publish(client: Client) -> None:
        closings.append(client)
        if len(closings) == 1:
            publisher.publish("/tasks/delete", task_events.TaskCreate(container_id="late"))
        await close(client)

    monkeypatch.setattr(Client, "aclose", close_and_meanwhile_publish)
    async with fake_containerd_events(str(tmp_path / "ttrpc.sock")) as (received, arrived):
        publisher.publish("/tasks/create", task_events.TaskCreate(container_id="first"))
        assert await arrive(received, arrived, 2) == [("/tasks/create", "first"), ("/tasks/delete", "late")]


async def test_events_published_while_containerd_is_away_wait_for_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(events, "RETRY_DELAY", 0.05)
    publisher = Publisher(str(tmp_path / "ttrpc.sock"), NAMESPACE)
    publisher.publish("/tasks/create", task_events.TaskCreate(container_id="early"))
    await asyncio.sleep(0.2)  # a few attempts find nobody
    assert publisher.queue and publisher.dropped == 0
    async with fake_containerd_events(str(tmp_path / "ttrpc.sock")) as (received, arrived):
        publisher.publish("/tasks/start", task_events.TaskCreate(container_id="later"))
        assert await arrive(received, arrived, 2) == [("/tasks/create", "early"), ("/tasks/start", "later")]
        async with asyncio.timeout(WAIT):  # each taken off the queue once containerd answered its Forward
            while publisher.queue:
                await asyncio.sleep(0.01)


@pytest.fixture(autouse=True)
async def no_sender_left_behind():
    yield
    for task in asyncio.all_tasks():
        if task.get_coro().__qualname__ == "Publisher._send":
            task.cancel()
