"""The socket-facing half of a connection: the only code that reads and writes sockets.

A :class:`Channel` is an asyncio protocol (it runs on uvloop when installed) that feeds what it
reads into a sans-IO connection (:mod:`.connection`) and hands the events to its subclass.
Writes are coalesced per loop iteration: a burst of answers costs one ``send`` syscall, which
is where pipelined throughput comes from. When the peer stops reading, we stop reading too.
"""

from __future__ import annotations

import asyncio
import logging
import select
from typing import Any

from shim.rpc.addresses import PeerCredentials, parse_address, peer_credentials
from shim.rpc.frames import RemoteProtocolError

__all__ = ["PeerCredentials", "Channel", "peer_credentials", "parse_address", "install_uvloop"]

log = logging.getLogger(__name__)

#: A burst of writes leaves in chunks of this many frames rather than all at the end of the loop
#: iteration, so the peer starts on the first calls while we produce the rest. With one chunk per
#: iteration the two processes took turns instead of overlapping (bench/rpc_bench.py, 1,000 calls
#: in flight, quiet 2-CPU VM: about 35,000 calls/s with one chunk, 54,000-63,000 with 64 frames).
FLUSH_FRAMES = 64


def install_uvloop() -> bool:
    """Make uvloop the event loop policy when it is installed; return whether it is."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency, but stay usable without it
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


class Channel(asyncio.Protocol):
    """Base protocol: buffered writes, read-side flow control, connection bookkeeping."""

    conn: Any  # a ServerConnection or ClientConnection

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._writable = asyncio.Event()
        self._writable.set()
        self.closed = asyncio.Event()

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except RemoteProtocolError as exc:
            log.warning("closing connection: %s", exc)
            self.abort()
            return
        self.handle_events(events)

    def eof_received(self) -> bool:
        try:
            events = self.conn.receive_data(b"")
        except RemoteProtocolError as exc:
            log.info("closing connection: %s", exc)
            self.abort()
            return False
        self.handle_events(events)
        if self._peer_hung_up():
            # The peer closed the connection, not just its write side: nobody will read an
            # answer, and closing cancels the calls still open (protocol.md, "Cancellation").
            self.abort()
            return False
        return True  # a half-close: keep our side open, in-flight answers still go out

    def _peer_hung_up(self) -> bool:
        # read() returns EOF both after the peer's shutdown(SHUT_WR) and after its close();
        # only a close() sets POLLHUP on our end of an AF_UNIX stream socket.
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        if sock is None:
            return False
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        return any(revents & select.POLLHUP for _, revents in poller.poll(0))

    #: Stop reading while the peer is not reading our answers. Only the server does: a
    #: client that stopped reading because its own requests are still queued would deadlock
    #: against a server that stopped reading because its answers are.
    pause_reading_when_blocked = False

    def pause_writing(self) -> None:
        self._writable.clear()
        if self.pause_reading_when_blocked and self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._writable.set()
        if self.pause_reading_when_blocked and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._out.clear()
        self._writable.set()
        self.closed.set()
        self.on_lost(exc)

    # -- for subclasses ---------------------------------------------------------------------
    def handle_events(self, events: list[Any]) -> None:
        raise NotImplementedError

    def on_lost(self, exc: Exception | None) -> None:
        """Called once when the connection is gone."""

    def write(self, data: bytes) -> None:
        """Queue bytes; they leave at the end of this loop iteration, in one syscall per
        :data:`FLUSH_FRAMES` frames."""
        if self.closed.is_set():
            return
        out = self._out
        out.append(data)
        if len(out) >= FLUSH_FRAMES:
            self._send_queued()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._send_queued()

    def _send_queued(self) -> None:
        if not self._out or self.transport is None or self.transport.is_closing():
            self._out.clear()
            return
        data = self._out[0] if len(self._out) == 1 else b"".join(self._out)
        self._out.clear()
        self.transport.write(data)

    async def drain(self) -> None:
        """Wait until the peer reads again (for streams that could outpace it)."""
        await self._writable.wait()

    def close(self) -> None:
        """Send what is queued, then close."""
        if self.transport is not None and not self.transport.is_closing():
            self._flush()
            self.transport.close()

    def abort(self) -> None:
        """Close at once, dropping what is queued."""
        self._out.clear()
        if self.transport is not None:
            self.transport.abort()
