"""A SPDY/3.1 session on an asyncio connection: the only code here that reads and writes the client's socket.

:class:`Session` feeds what it reads into the sans-IO :class:`~client.streaming.spdy.Connection`, answers
every stream the client opens (SYN_REPLY, as Kubernetes' servers do at once) and hands it to the
session's handler as a :class:`Stream`; handlers read and write streams with ``await``. Kubernetes'
clients do no SPDY flow control, so neither does the session: what bounds memory is that the reader
stops reading the socket while more than :data:`MAX_BUFFERED_BYTES` wait in streams for their
handlers (TCP then slows the client), and writers wait for the socket to drain.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any

from client.streaming import spdy

__all__ = ["MAX_BUFFERED_BYTES", "READ_BYTES", "StreamClosed", "Inbound", "Stream", "Session", "read_when_room"]

log = logging.getLogger("podshimd.streaming")

#: Bytes received and not yet taken by handlers, over all streams, above which reading pauses.
MAX_BUFFERED_BYTES = 4 << 20
#: How much one read from the socket asks for.
READ_BYTES = 256 * 1024


class StreamClosed(Exception):
    """Writing to a stream that was reset, closed for writing, or whose session ended."""


async def read_when_room(reader: asyncio.StreamReader, owner: Session | Any) -> bytes:
    """The client's next bytes, read once ``owner``'s streams keep at most MAX_BUFFERED_BYTES
    (``_buffered``; ``_room`` is set when that drops); b"" when the client is gone."""
    while owner._buffered > MAX_BUFFERED_BYTES:
        owner._room.clear()
        await owner._room.wait()
    try:
        return await reader.read(READ_BYTES)
    except ConnectionError:
        return b""


class Inbound:
    """What the client sent on one stream (or WebSocket channel), kept until its handler reads it.
    ``owner`` counts the bytes kept (``_buffered``) and hears of each that leaves (``_taken(n)``)."""

    def __init__(self, owner: Session | Any) -> None:
        self._owner = owner
        self._chunks: collections.deque[bytes] = collections.deque()
        self._readable = asyncio.Event()
        self._eof = False

    async def read(self) -> bytes:
        """The next bytes the client sent; b"" once it closed its side, reset the stream or went away."""
        while not self._chunks and not self._eof:
            self._readable.clear()
            await self._readable.wait()
        if not self._chunks:
            return b""
        data = self._chunks.popleft()
        self._owner._taken(len(data))
        return data

    def discard(self) -> None:
        """The handler will not read this stream any more: drop what it buffered, and what comes."""
        self._eof = True
        self._owner._taken(sum(map(len, self._chunks)))
        self._chunks.clear()
        self._readable.set()

    def _received(self, data: bytes, fin: bool) -> None:
        if data and not self._eof:
            self._chunks.append(data)
            self._owner._buffered += len(data)
        if fin:
            self._eof = True
        self._readable.set()


class Stream(Inbound):
    """One SPDY stream the client opened: its headers, what it sent, a way to answer."""

    def __init__(self, session: Session, stream_id: int, headers: spdy.HeaderList) -> None:
        super().__init__(session)
        self.session = session
        self.stream_id = stream_id
        self.headers = headers
        self.was_reset = False

    def header(self, name: str) -> str | None:
        """The first value of header ``name``, or None."""
        return spdy.header(self.headers, name)

    async def write(self, data: bytes) -> None:
        """Send ``data`` and wait until the socket takes more. Raises StreamClosed."""
        await self.session._send(self, data, fin=False)

    def close(self) -> None:
        """Half-close our side (FIN); nothing if already closed or gone."""
        self.session._end(self)

    def reset(self) -> None:
        """Abort the stream (RST_STREAM CANCEL) and drop what it buffered."""
        self.session._reset(self)

    # -- for the session -----------------------------------------------------------------------------
    def _ended(self, reset: bool) -> None:
        self.was_reset = self.was_reset or reset
        self.discard()


class Session:
    """Serve one upgraded connection until the client goes away. ``on_stream`` is called (in the
    read loop, so it must not block) with every stream the client opens, once it has been answered."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 on_stream: Callable[[Stream], None]) -> None:
        self._reader = reader
        self._writer = writer
        self._on_stream = on_stream
        self.conn = spdy.Connection(client_side=False, flow_control=False)
        self._streams: dict[int, Stream] = {}
        self._buffered = 0
        self._room = asyncio.Event()
        self._room.set()
        self.closed = False

    async def run(self, initial: bytes = b"") -> None:
        """Read and dispatch frames until the client closes the connection or breaks the protocol."""
        try:
            data = initial
            while True:
                if data:
                    try:
                        events = self.conn.receive_data(data)
                    except spdy.RemoteProtocolError as exc:
                        log.debug("streaming client broke SPDY: %s", exc)
                        self._flush()
                        return
                    for event in events:
                        self._dispatch(event)
                    self._flush()
                data = await read_when_room(self._reader, self)
                if not data:
                    return
        finally:
            self._close_all()

    def _dispatch(self, event: object) -> None:
        kind = type(event)
        if kind is spdy.DataReceived:
            assert isinstance(event, spdy.DataReceived)
            stream = self._streams.get(event.stream_id)
            if stream is not None:
                stream._received(event.data, event.fin)
                self._forget_if_done(stream)
        elif kind is spdy.StreamOpened:
            assert isinstance(event, spdy.StreamOpened)
            stream = Stream(self, event.stream_id, event.headers)
            self._streams[event.stream_id] = stream
            self.conn.reply(event.stream_id)
            if event.fin:
                stream._received(b"", True)
            self._on_stream(stream)
        elif kind is spdy.StreamReset:
            assert isinstance(event, spdy.StreamReset)
            stream = self._streams.pop(event.stream_id, None)
            if stream is not None:
                stream._ended(reset=True)
        elif kind is spdy.HeadersReceived:
            assert isinstance(event, spdy.HeadersReceived)
            stream = self._streams.get(event.stream_id)
            if stream is not None and event.fin:
                stream._received(b"", True)
                self._forget_if_done(stream)
        # PING is answered by the connection; SETTINGS, WINDOW_UPDATE and GOAWAY change nothing here.

    def _forget_if_done(self, stream: Stream) -> None:
        if stream.stream_id not in self.conn.open_streams:
            self._streams.pop(stream.stream_id, None)

    def _flush(self) -> None:
        data = self.conn.data_to_send()
        if data and not self._writer.is_closing():
            self._writer.write(data)

    def _taken(self, nbytes: int) -> None:
        self._buffered -= nbytes
        if self._buffered <= MAX_BUFFERED_BYTES:
            self._room.set()

    async def _send(self, stream: Stream, data: bytes, fin: bool) -> None:
        if self.closed or stream.stream_id not in self.conn.open_streams:
            raise StreamClosed(f"stream {stream.stream_id} is closed")
        try:
            self.conn.send_data(stream.stream_id, data, fin=fin)
        except spdy.LocalProtocolError as exc:
            raise StreamClosed(str(exc)) from None
        self._flush()
        self._forget_if_done(stream)
        try:
            await self._writer.drain()
        except ConnectionError as exc:
            raise StreamClosed(f"the client went away: {exc}") from None

    def _end(self, stream: Stream) -> None:
        if not self.closed:
            self.conn.end_stream(stream.stream_id)
            self._flush()
            self._forget_if_done(stream)

    def _reset(self, stream: Stream) -> None:
        if not self.closed:
            self.conn.reset_stream(stream.stream_id)
            self._flush()
        self._streams.pop(stream.stream_id, None)
        stream._ended(reset=True)

    def goaway(self) -> None:
        """Tell the client no more streams are taken (the session's work is done)."""
        if not self.closed:
            self.conn.goaway()
            self._flush()

    def _close_all(self) -> None:
        self.closed = True
        for stream in self._streams.values():
            stream._ended(reset=True)
        self._streams.clear()
        self._room.set()
