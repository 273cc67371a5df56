"""The HTTP/1.1 request that opens a streaming session and its answer, sans-IO.

The client sends ``POST /portforward/TOKEN`` (or ``/exec/``, ``/attach/``) with ``Connection: Upgrade``,
``Upgrade: SPDY/3.1`` and one or more ``X-Stream-Protocol-Version`` headers, its sub-protocols in order
of preference. The server answers ``101 Switching Protocols`` naming the one it chose, after which the
same connection speaks SPDY/3.1; or a plain-text HTTP error, which the client shows to its user
("unable to upgrade connection: ..."). Kubernetes' negotiation: the first of the client's protocols
the server supports wins; none in common is 403 with ``X-Accepted-Stream-Protocol-Versions``.
"""

from __future__ import annotations

from dataclasses import dataclass

from shim.rpc.frames import NEED_DATA

__all__ = ["MAX_HEAD_BYTES", "SPDY_31", "Request", "HttpError", "RequestReader", "negotiate",
           "switching_protocols", "error_response"]

#: The largest request head read (the line and headers); a client sends a few hundred bytes.
MAX_HEAD_BYTES = 16 * 1024
SPDY_31 = "SPDY/3.1"
PROTOCOL_HEADER = "x-stream-protocol-version"
ACCEPTED_HEADER = "X-Accepted-Stream-Protocol-Versions"

_REASONS = {101: "Switching Protocols", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 500: "Internal Server Error", 503: "Service Unavailable"}


@dataclass(frozen=True, slots=True)
class Request:
    """A parsed request head: header names lower case, each with its values in order."""

    method: str
    target: str
    headers: tuple[tuple[str, str], ...]

    def values(self, name: str) -> list[str]:
        """Every value of ``name``, comma-separated lists split, blanks dropped."""
        return [part.strip() for key, value in self.headers if key == name for part in value.split(",")
                if part.strip()]


class HttpError(Exception):
    """An HTTP answer to send instead of upgrading: ``status``, a sentence, extra headers."""

    def __init__(self, status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


class RequestReader:
    """Collects bytes until the request head ends; :meth:`next_event` gives the :class:`Request` (or
    NEED_DATA); :attr:`trailing` is what came after it (the first SPDY bytes, if the client did not wait)."""

    def __init__(self, max_bytes: int = MAX_HEAD_BYTES) -> None:
        self._buf = bytearray()
        self.max_bytes = max_bytes
        self.trailing = b""

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next_event(self) -> Request | object:
        """The request, or NEED_DATA. Raises HttpError (400) for a head that is too long or malformed."""
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buf) > self.max_bytes:
                raise HttpError(400, f"the request head is longer than {self.max_bytes} bytes")
            return NEED_DATA
        if end > self.max_bytes:
            raise HttpError(400, f"the request head is longer than {self.max_bytes} bytes")
        head = bytes(self._buf[:end])
        self.trailing = bytes(self._buf[end + 4:])
        self._buf.clear()
        return _parse(head)


def _parse(head: bytes) -> Request:
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        raise HttpError(400, "the request head is not text") from None
    line, *lines = text.split("\r\n")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, f"not an HTTP/1.1 request line: {line[:100]!r}")
    headers = []
    for raw in lines:
        name, sep, value = raw.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(400, f"malformed header line {raw[:100]!r}")
        headers.append((name.lower(), value.strip()))
    return Request(parts[0], parts[1], tuple(headers))


def negotiate(request: Request, supported: tuple[str, ...]) -> str:
    """The sub-protocol to speak: the client's first that is in ``supported``. Raises HttpError: 400
    when the request is no SPDY/3.1 upgrade, 403 (listing what is accepted) when nothing is shared."""
    if "upgrade" not in {v.lower() for v in request.values("connection")} or \
            SPDY_31.lower() not in {v.lower() for v in request.values("upgrade")}:
        raise HttpError(400, f"this is a streaming endpoint: the request must upgrade the connection to {SPDY_31} "
                             "(Connection: Upgrade, Upgrade: SPDY/3.1)")
    offered = request.values(PROTOCOL_HEADER)
    if not offered:
        raise HttpError(400, "unable to upgrade: X-Stream-Protocol-Version is required")
    for protocol in offered:
        if protocol in supported:
            return protocol
    raise HttpError(403, f"unable to upgrade: unable to negotiate protocol: client supports {offered}, "
                         f"server accepts {list(supported)}",
                    tuple((ACCEPTED_HEADER, p) for p in supported))


def switching_protocols(protocol: str) -> bytes:
    """The 101 answer that starts SPDY/3.1 speaking ``protocol``."""
    return (f"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: {SPDY_31}\r\n"
            f"X-Stream-Protocol-Version: {protocol}\r\n\r\n").encode("latin-1")


def error_response(error: HttpError) -> bytes:
    """A plain-text HTTP error answer; the connection is closed after it."""
    body = (error.message + "\n").encode()
    lines = [f"HTTP/1.1 {error.status} {_REASONS.get(error.status, 'Error')}",
             "Content-Type: text/plain; charset=utf-8", f"Content-Length: {len(body)}", "Connection: close",
             *(f"{name}: {value}" for name, value in error.headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
