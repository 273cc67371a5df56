"""Exec and attach over a WebSocket (RFC 6455): the ``channel.k8s.io`` protocols as Kubernetes' kubelet
serves them, beside SPDY.

kubelet hands its streaming URL a connection upgraded to a WebSocket when its own client asked for
one (the API server's ``/exec`` and ``/attach`` opened with a WebSocket, as e2e's "remote command
execution over websockets" spec and older clients do). The request is a ``GET`` with ``Upgrade:
websocket``, ``Sec-WebSocket-Key`` and version 13; the sub-protocol is the client's first of
:data:`PROTOCOLS` (none offered: ``channel.k8s.io``). Every message carries one channel: stdin 0,
stdout 1, stderr 2, error 3, resize 4 (its first byte; in the base64 protocols an ASCII digit and
then the data in base64, as text). The server opens with an empty message on its lowest output
channel (stdout, else stderr, else error), as kubelet does. v5 adds the client's close signal
(channel 255, then the channel it closes: stdin's end). The error channel says how the command
ended as the SPDY protocol of the same version does (v4 and v5: a JSON ``metav1.Status``; v1 a
sentence, nothing on success; :func:`~client.streaming.remotecommand.status_message`), and then the
server closes the connection (close frame 1000).

The channels are handed to the exec/attach handler as the SPDY streams are
(:class:`~client.streaming.remotecommand.RemoteCommandSession`): it takes the ones the request
asked for and resets the others, whose messages are then dropped.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import logging
import struct
from collections.abc import Callable

from shim.rpc.frames import NEED_DATA

from .session import MAX_BUFFERED_BYTES, Inbound, StreamClosed, read_when_room
from .upgrade import HttpError, Request

__all__ = ["PROTOCOLS", "CHANNELS", "MAX_MESSAGE_BYTES", "WebSocketError", "is_websocket", "negotiate",
           "switching_protocols", "accept_key", "encode_frame", "FrameReader", "Channel", "WebSocketSession",
           "spdy_protocol"]

log = logging.getLogger("podshimd.streaming")

#: The sub-protocols served, the client's first shared one wins.
PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io", "v4.base64.channel.k8s.io", "channel.k8s.io",
             "base64.channel.k8s.io")
#: The channel of each stream, by number.
CHANNELS = ("stdin", "stdout", "stderr", "error", "resize")
#: v5's close signal: a message on this channel whose byte names the channel the client closed.
CLOSE_SIGNAL = 255
#: The largest message taken from a client (a stdin chunk; kubectl sends at most 32 KiB).
MAX_MESSAGE_BYTES = 1 << 20
#: Seconds the close frame may take to leave.
CLOSE_DRAIN = 5.0
_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_CONTINUATION, _TEXT, _BINARY, _CLOSE, _PING, _PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


class WebSocketError(Exception):
    """The client broke RFC 6455 (the connection is closed with status ``code``)."""

    def __init__(self, message: str, code: int = 1002) -> None:
        super().__init__(message)
        self.code = code


def is_websocket(request: Request) -> bool:
    return "websocket" in {v.lower() for v in request.values("upgrade")}


def negotiate(request: Request) -> str:
    """The sub-protocol of a WebSocket upgrade ("" when the client offered none: the binary
    channel protocol). Raises HttpError (400) for a broken handshake, 403 when no protocol is shared."""
    if request.method != "GET":
        raise HttpError(400, f"a WebSocket upgrade is a GET, not a {request.method}")
    if "upgrade" not in {v.lower() for v in request.values("connection")}:
        raise HttpError(400, "a WebSocket upgrade needs Connection: Upgrade")
    if "13" not in request.values("sec-websocket-version"):
        raise HttpError(400, "unsupported WebSocket version: Sec-WebSocket-Version must be 13",
                        (("Sec-WebSocket-Version", "13"),))
    keys = request.values("sec-websocket-key")
    try:
        valid = len(keys) == 1 and len(base64.b64decode(keys[0], validate=True)) == 16
    except binascii.Error:
        valid = False
    if not valid:
        raise HttpError(400, "a WebSocket upgrade needs one Sec-WebSocket-Key of 16 bytes in base64")
    offered = request.values("sec-websocket-protocol")
    if not offered:
        return ""
    for protocol in offered:
        if protocol in PROTOCOLS:
            return protocol
    raise HttpError(403, f"unable to upgrade: unable to negotiate protocol: client supports {offered}, "
                         f"server accepts {list(PROTOCOLS)}")


def accept_key(key: str) -> str:
    """Sec-WebSocket-Accept for the client's Sec-WebSocket-Key."""
    return base64.b64encode(hashlib.sha1((key + _GUID).encode("latin-1")).digest()).decode("latin-1")


def switching_protocols(request: Request, protocol: str) -> bytes:
    """The 101 answer that makes the connection a WebSocket speaking ``protocol``."""
    lines = ["HTTP/1.1 101 Switching Protocols", "Upgrade: websocket", "Connection: Upgrade",
             f"Sec-WebSocket-Accept: {accept_key(request.values('sec-websocket-key')[0])}"]
    if protocol:
        lines.append(f"Sec-WebSocket-Protocol: {protocol}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def spdy_protocol(protocol: str) -> str:
    """The SPDY sub-protocol whose error-channel message and streams a WebSocket protocol shares."""
    return "v4.channel.k8s.io" if protocol.startswith(("v4.", "v5.")) else "channel.k8s.io"


def encode_frame(opcode: int, payload: bytes, mask: bytes | None = None) -> bytes:
    """One final frame (a server's is unmasked; a client's has a 4-byte ``mask``)."""
    size = len(payload)
    head = bytes([0x80 | opcode])
    flag = 0x80 if mask is not None else 0
    if size < 126:
        head += bytes([flag | size])
    elif size < 1 << 16:
        head += bytes([flag | 126]) + struct.pack("!H", size)
    else:
        head += bytes([flag | 127]) + struct.pack("!Q", size)
    if mask is None:
        return head + payload
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


class FrameReader:
    """Sans-IO: feed what the connection reads; :meth:`next_message` gives (opcode, payload) of each
    whole message or control frame (fragments joined), or NEED_DATA. Raises WebSocketError."""

    def __init__(self, *, client_side: bool = False, max_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self._buf = bytearray()
        self._expect_mask = not client_side
        self._max = max_bytes
        self._fragments: bytearray | None = None
        self._fragment_opcode = 0

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next_message(self) -> tuple[int, bytes] | object:
        while True:
            frame = self._next_frame()
            if frame is NEED_DATA:
                return NEED_DATA
            assert isinstance(frame, tuple)
            fin, opcode, payload = frame
            if opcode >= _CLOSE:
                if not fin or len(payload) > 125:
                    raise WebSocketError("a control frame is fragmented or longer than 125 bytes")
                return opcode, payload
            if opcode == _CONTINUATION:
                if self._fragments is None:
                    raise WebSocketError("a continuation frame without a message to continue")
                self._fragments += payload
            elif opcode in (_TEXT, _BINARY):
                if self._fragments is not None:
                    raise WebSocketError("a new message before the last one's final fragment")
                self._fragments, self._fragment_opcode = bytearray(payload), opcode
            else:
                raise WebSocketError(f"unknown opcode {opcode:#x}")
            if len(self._fragments) > self._max:
                raise WebSocketError(f"a message longer than {self._max} bytes", 1009)
            if fin:
                message, self._fragments = bytes(self._fragments), None
                return self._fragment_opcode, message

    def _next_frame(self) -> tuple[bool, int, bytes] | object:
        buf = self._buf
        if len(buf) < 2:
            return NEED_DATA
        first, second = buf[0], buf[1]
        if first & 0x70:
            raise WebSocketError("reserved bits set (no extension was agreed)")
        masked, size, offset = bool(second & 0x80), second & 0x7F, 2
        if masked != self._expect_mask:
            raise WebSocketError("a client's frames must be masked, a server's must not")
        if size == 126:
            if len(buf) < 4:
                return NEED_DATA
            size, offset = struct.unpack_from("!H", buf, 2)[0], 4
        elif size == 127:
            if len(buf) < 10:
                return NEED_DATA
            size, offset = struct.unpack_from("!Q", buf, 2)[0], 10
        if size > self._max:
            raise WebSocketError(f"a frame longer than {self._max} bytes", 1009)
        mask = b""
        if masked:
            if len(buf) < offset + 4:
                return NEED_DATA
            mask, offset = bytes(buf[offset:offset + 4]), offset + 4
        if len(buf) < offset + size:
            return NEED_DATA
        payload = bytes(buf[offset:offset + size])
        del buf[:offset + size]
        if mask:
            key = (mask * (size // 4 + 1))[:size]
            payload = (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(size, "big")
        return bool(first & 0x80), first & 0x0F, payload


class Channel(Inbound):
    """One channel, with the methods of a SPDY stream that exec and attach use."""

    def __init__(self, session: WebSocketSession, number: int) -> None:
        super().__init__(session)
        self.session = session
        self.number = number
        self.was_reset = False

    def header(self, name: str) -> str | None:
        return CHANNELS[self.number] if name == "streamtype" else None

    async def write(self, data: bytes) -> None:
        if self.was_reset:
            raise StreamClosed(f"channel {self.number} is not in use")
        await self.session._send_message(self.number, data)

    def close(self) -> None:
        """Our side of the channel is done; the error channel's close ends the connection."""
        if self.number == CHANNELS.index("error"):
            self.session.finish()

    def reset(self) -> None:
        self.was_reset = True
        self.discard()


class WebSocketSession:
    """Serve one WebSocket connection until the client goes away or the handler ends the command.
    ``on_stream`` gets every channel at the start (it takes the ones it wants and resets the rest)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, protocol: str,
                 on_stream: Callable[[Channel], None]) -> None:
        self._reader, self._writer = reader, writer
        self.protocol = protocol
        self._base64 = "base64" in protocol
        self._on_stream = on_stream
        self.channels = [Channel(self, number) for number in range(len(CHANNELS))]
        self._frames = FrameReader()
        self._buffered = 0
        self._room = asyncio.Event()
        self._room.set()
        self._finished = asyncio.Event()
        self.closed = False

    async def run(self, initial: bytes = b"") -> None:
        """Read and dispatch messages until the client closes, breaks the protocol or the command ends."""
        for channel in self.channels:
            self._on_stream(channel)
        opening = next((c for c in self.channels[1:4] if not c.was_reset), None)
        reading = asyncio.ensure_future(self._read_loop(initial))
        try:
            if opening is not None:
                await self._send_message(opening.number, b"")
            finished = asyncio.ensure_future(self._finished.wait())
            await asyncio.wait({reading, finished}, return_when=asyncio.FIRST_COMPLETED)
            finished.cancel()
            if self._finished.is_set() and not self.closed:
                self._write(encode_frame(_CLOSE, struct.pack("!H", 1000)))
                with contextlib.suppress(TimeoutError, ConnectionError):
                    await asyncio.wait_for(self._writer.drain(), CLOSE_DRAIN)
        except StreamClosed:
            pass
        finally:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
            self._close_all()

    def finish(self) -> None:
        """The command's outcome is written: close the connection."""
        self._finished.set()

    async def _read_loop(self, data: bytes) -> None:
        while True:
            if data:
                self._frames.feed(data)
                try:
                    while (message := self._frames.next_message()) is not NEED_DATA:
                        assert isinstance(message, tuple)
                        if not self._dispatch(*message):
                            return
                except WebSocketError as exc:
                    log.debug("streaming WebSocket client broke the protocol: %s", exc)
                    self._write(encode_frame(_CLOSE, struct.pack("!H", exc.code)))
                    return
            data = await read_when_room(self._reader, self)
            if not data:
                return

    def _dispatch(self, opcode: int, payload: bytes) -> bool:
        """Handle one message; False when the connection is to end."""
        if opcode == _CLOSE:
            self._write(encode_frame(_CLOSE, payload[:2]))
            return False
        if opcode == _PING:
            self._write(encode_frame(_PONG, payload))
            return True
        if opcode == _PONG or not payload:
            return True
        if self._base64:
            if opcode != _TEXT:
                raise WebSocketError(f"{self.protocol} carries text messages", 1003)
            try:
                number, data = int(payload[:1]), base64.b64decode(payload[1:], validate=True)
            except (ValueError, binascii.Error):
                raise WebSocketError("a base64 channel message that is not a digit and base64", 1007) from None
        else:
            if opcode != _BINARY:
                raise WebSocketError(f"{self.protocol or 'channel.k8s.io'} carries binary messages", 1003)
            number, data = payload[0], payload[1:]
        if number == CLOSE_SIGNAL and self.protocol.startswith("v5."):
            if data and data[0] < len(self.channels):
                self.channels[data[0]]._received(b"", True)  # what came before it is still read
            return True
        if number < len(self.channels):
            self.channels[number]._received(data, False)
        return True

    def _taken(self, nbytes: int) -> None:
        self._buffered -= nbytes
        if self._buffered <= MAX_BUFFERED_BYTES:
            self._room.set()

    async def _send_message(self, number: int, data: bytes) -> None:
        if self.closed or self._finished.is_set():
            raise StreamClosed("the WebSocket is closed")
        if self._base64:
            frame = encode_frame(_TEXT, str(number).encode() + base64.b64encode(data))
        else:
            frame = encode_frame(_BINARY, bytes([number]) + data)
        self._write(frame)
        try:
            await self._writer.drain()
        except ConnectionError as exc:
            raise StreamClosed(f"the client went away: {exc}") from None

    def _write(self, data: bytes) -> None:
        if not self._writer.is_closing():
            self._writer.write(data)

    def _close_all(self) -> None:
        self.closed = True
        for channel in self.channels:
            channel.discard()
        self._room.set()
