"""The streaming server's asyncio transport (client/streaming/server.py, session.py) with a SPDY client of
our own codec: port-forward to a server on this machine's loopback (as for a host-network pod), a
client that goes away in the middle, and the server going on."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

from client.streaming import portforward, spdy
from client.streaming import server as server_module
from client.streaming.server import Backend, PortForwardRequest, StreamingServer

WAIT = 30.0  # bound on each step: a hang fails the test instead of stalling the run


class Client:
    """One upgraded connection speaking SPDY as Kubernetes' client does."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.conn = spdy.Connection(client_side=True, flow_control=False)
        self.data: dict[int, bytearray] = {}
        self.ended: set[int] = set()

    @classmethod
    async def connect(cls, url: str) -> Client:
        host_port, path = url.removeprefix("http://").split("/", 1)
        host, port = host_port.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"POST /{path} HTTP/1.1\r\nHost: {host_port}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
                     "X-Stream-Protocol-Version: portforward.k8s.io\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
        assert head.startswith(b"HTTP/1.1 101 "), head
        return cls(reader, writer)

    def send(self) -> None:
        self.writer.write(self.conn.data_to_send())

    async def until(self, done) -> None:
        """Read and collect stream data until ``done()``."""
        while not done():
            chunk = await asyncio.wait_for(self.reader.read(65536), WAIT)
            assert chunk, "the server closed the connection"
            for event in self.conn.receive_data(chunk):
                if isinstance(event, spdy.DataReceived):
                    self.data.setdefault(event.stream_id, bytearray()).extend(event.data)
                    if event.fin:
                        self.ended.add(event.stream_id)
            self.send()

    def forward(self, port: int, request_id: int) -> tuple[int, int]:
        """Open the error and data streams of one forwarded connection; (error id, data id)."""
        headers = [("port", str(port)), ("requestid", str(request_id))]
        error = self.conn.open_stream([("streamtype", "error"), *headers], fin=True)
        data = self.conn.open_stream([("streamtype", "data"), *headers])
        self.send()
        return error, data


async def echo_server() -> tuple[asyncio.Server, list[asyncio.Event]]:
    """Echoes each connection until its end; each connection's end sets an event of the list."""
    closed: list[asyncio.Event] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        done = asyncio.Event()
        closed.append(done)
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()
            done.set()

    return await asyncio.start_server(serve, "127.0.0.1", 0), closed


async def host_network(pod_id: str) -> str:
    return ""  # the pod's ports are this machine's loopback's


async def test_port_forward_echoes_through_the_server_and_closes_both_streams() -> None:
    server, _ = await echo_server()
    port = server.sockets[0].getsockname()[1]
    async with server, StreamingServer("127.0.0.1:0", Backend(pod_network=host_network)) as streaming:
        client = await Client.connect(streaming.url(PortForwardRequest("pod")))
        error, data = client.forward(port, 0)
        payload = os.urandom(300_000)
        client.conn.send_data(data, payload, fin=True)
        client.send()
        await client.until(lambda: {error, data} <= client.ended)
        assert bytes(client.data[data]) == payload and not client.data.get(error)  # no error
        client.writer.close()


async def test_nothing_listening_is_said_on_the_error_stream_and_the_session_goes_on() -> None:
    server, _ = await echo_server()
    port = server.sockets[0].getsockname()[1]
    with socket_bound_and_closed() as unused:
        async with server, StreamingServer("127.0.0.1:0", Backend(pod_network=host_network)) as streaming:
            client = await Client.connect(streaming.url(PortForwardRequest("pod")))
            error, data = client.forward(unused, 0)
            await client.until(lambda: {error, data} <= client.ended)
            assert bytes(client.data[error]) == (f"pod pod: cannot connect to port {unused} on the pod's "
                                                 "localhost: Connection refused").encode()
            error, data = client.forward(port, 1)  # the same session forwards the next connection
            client.conn.send_data(data, b"again", fin=True)
            client.send()
            await client.until(lambda: {error, data} <= client.ended)
            assert bytes(client.data[data]) == b"again"
            client.writer.close()


async def test_a_client_that_goes_away_mid_stream_closes_the_pod_side_and_the_server_goes_on() -> None:
    server, closed = await echo_server()
    port = server.sockets[0].getsockname()[1]
    async with server, StreamingServer("127.0.0.1:0", Backend(pod_network=host_network)) as streaming:
        client = await Client.connect(streaming.url(PortForwardRequest("pod")))
        _, data = client.forward(port, 0)
        client.conn.send_data(data, b"half")
        client.send()
        await client.until(lambda: bytes(client.data.get(data, b"")) == b"half")
        client.writer.transport.abort()  # gone, no FIN, no GOAWAY
        await asyncio.wait_for(closed[0].wait(), WAIT)  # the server closed the pod-side connection
        again = await Client.connect(streaming.url(PortForwardRequest("pod")))
        error, data = again.forward(port, 0)
        again.conn.send_data(data, b"next", fin=True)
        again.send()
        await again.until(lambda: {error, data} <= again.ended)
        assert bytes(again.data[data]) == b"next"
        again.writer.close()


async def test_one_session_forwards_at_most_max_forwards_connections_at_once(monkeypatch) -> None:
    monkeypatch.setattr(portforward, "MAX_FORWARDS", 2)
    server, closed = await echo_server()
    port = server.sockets[0].getsockname()[1]
    async with server, StreamingServer("127.0.0.1:0", Backend(pod_network=host_network)) as streaming:
        client = await Client.connect(streaming.url(PortForwardRequest("pod")))
        held = [client.forward(port, n) for n in range(2)]
        for n, (_, data) in enumerate(held):  # both forwarded: each echoes
            client.conn.send_data(data, f"held {n}".encode())
            client.send()
            await client.until(lambda data=data, n=n: bytes(client.data.get(data, b"")) == f"held {n}".encode())
        error, data = client.forward(port, 2)
        await client.until(lambda: {error, data} <= client.ended)
        assert bytes(client.data[error]) == (b"pod pod: this port-forward session already forwards 2 connections: "
                                             b"close one first")
        client.conn.send_data(held[0][1], b"", fin=True)  # one ends ...
        client.send()
        await client.until(lambda: held[0][1] in client.ended)
        error, data = client.forward(port, 3)  # ... and the next one is forwarded
        client.conn.send_data(data, b"next", fin=True)
        client.send()
        await client.until(lambda: {error, data} <= client.ended)
        assert bytes(client.data[data]) == b"next" and not client.data.get(error)
        client.writer.close()


async def test_connections_without_a_token_are_capped_and_dropped_after_the_head_timeout(monkeypatch) -> None:
    """Anyone who reaches the port can connect: idle connections cannot take the daemon's descriptors."""
    monkeypatch.setattr(server_module, "MAX_UNAUTHENTICATED", 3)
    monkeypatch.setattr(server_module, "HEAD_TIMEOUT", 1.0)
    async with StreamingServer("127.0.0.1:0", Backend(pod_network=host_network)) as streaming:
        idle = [await asyncio.open_connection("127.0.0.1", streaming.port) for _ in range(3)]
        reader, writer = await asyncio.open_connection("127.0.0.1", streaming.port)
        assert await asyncio.wait_for(reader.read(), WAIT) == b""  # one more: closed at once
        writer.close()
        for reader, writer in idle:  # the idle ones: closed when their head timeout runs out
            assert await asyncio.wait_for(reader.read(), WAIT) == b""
            writer.close()
        server, _ = await echo_server()
        async with server:  # and a client with a token is served again
            client = await Client.connect(streaming.url(PortForwardRequest("pod")))
            error, data = client.forward(server.sockets[0].getsockname()[1], 0)
            client.conn.send_data(data, b"served", fin=True)
            client.send()
            await client.until(lambda: {error, data} <= client.ended)
            assert bytes(client.data[data]) == b"served"
            client.writer.close()


@contextmanager
def socket_bound_and_closed() -> Iterator[int]:
    """A loopback port that was just free (bound, then closed): nothing listens there."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    yield port
