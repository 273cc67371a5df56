"""containerd's ttrpc Events service, faked: what a shim forwards to containerd, kept in order."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

from google.protobuf import empty_pb2

from shim.containerd.events import EVENTS_SERVICE, events_pb2
from shim.rpc import Server


@contextlib.asynccontextmanager
async def fake_containerd_events(path: str) -> AsyncIterator[tuple[list[Any], asyncio.Event]]:
    """containerd's ttrpc Events service at ``path``: the envelopes forwarded to it, in order."""
    received: list[Any] = []
    arrived = asyncio.Event()

    async def forward(ctx: Any, payload: Any) -> bytes:  # (protobuf=True: payload is the message's bytes)
        received.append(events_pb2.ForwardRequest.FromString(payload).envelope)
        arrived.set()
        reply: bytes = empty_pb2.Empty().SerializeToString()
        return reply

    server = Server()
    server.register(EVENTS_SERVICE, {"Forward": forward}, protobuf=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen()
    await server.start(sock)
    try:
        yield received, arrived
    finally:
        await server.aclose()


async def events_arrived(received: list[Any], arrived: asyncio.Event, count: int, timeout: float) -> None:
    """Wait until ``count`` events have arrived at :func:`fake_containerd_events`; TimeoutError
    after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while len(received) < count:
            arrived.clear()
            await arrived.wait()
