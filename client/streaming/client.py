"""The client side of the streaming server, blocking and without asyncio: what podshimctl's ``exec -i``,
``exec -t``, ``attach`` and ``port-forward`` speak, as crictl does.

:func:`connect` sends the HTTP/1.1 upgrade on the URL a CRI Exec, Attach or PortForward call returned
and gives a :class:`Session`: one SPDY/3.1 connection (:mod:`.spdy`'s codec, without flow control, as
Kubernetes' spdystream) driven by one ``selectors`` loop that also watches the caller's descriptors
(stdin, a listening socket, a signal's wakeup pipe). Bytes for the server are queued and written as the
socket takes them, so that a large stdin never blocks the reading of the command's output.
"""

from __future__ import annotations

import functools
import json
import os
import select
import selectors
import socket
from collections.abc import Callable
from urllib.parse import urlsplit

from . import spdy
from .upgrade import SPDY_31

__all__ = ["StreamingError", "Session", "connect", "remote_command", "port_forward", "EXEC_PROTOCOL",
           "PORT_FORWARD_PROTOCOL"]

#: What exec and attach speak (crictl's first choice): the end is a JSON metav1.Status on the error stream.
EXEC_PROTOCOL = "v4.channel.k8s.io"
PORT_FORWARD_PROTOCOL = "portforward.k8s.io"

#: Seconds to connect and to get the upgrade's answer.
CONNECT_TIMEOUT = 30.0
#: Bytes queued for the server above which the caller's descriptors are not read (back-pressure).
MAX_QUEUED = 1 << 20
_READ = 64 * 1024


class StreamingError(Exception):
    """The streaming server cannot be reached or refused the session; ``str()`` says why."""


def connect(url: str, protocols: tuple[str, ...]) -> Session:
    """A session on ``url`` (``http://HOST:PORT/exec/TOKEN``...) speaking the first of ``protocols`` the
    server accepts. Raises StreamingError."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.port is None:
        raise StreamingError(f"podshimd returned a streaming URL this client cannot use: {url!r}")
    try:
        sock = socket.create_connection((parts.hostname, parts.port), timeout=CONNECT_TIMEOUT)
    except OSError as exc:
        raise StreamingError(f"cannot reach podshimd's streaming server at {parts.netloc}: "
                             f"{exc.strerror or exc}") from None
    try:
        offers = "".join(f"X-Stream-Protocol-Version: {p}\r\n" for p in protocols)
        sock.sendall(f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: Upgrade\r\n"
                     f"Upgrade: {SPDY_31}\r\n{offers}Content-Length: 0\r\n\r\n".encode("latin-1"))
        head, rest = _response_head(sock)
    except OSError as exc:
        sock.close()
        raise StreamingError(f"podshimd's streaming server at {parts.netloc}: {exc.strerror or exc}") from None
    except StreamingError:
        sock.close()
        raise
    status_line, *lines = head.decode("latin-1").split("\r\n")
    if not status_line.startswith("HTTP/1.1 101 "):
        body = rest
        try:
            sock.settimeout(2.0)
            while chunk := sock.recv(_READ):
                body += chunk
        except OSError:
            pass
        sock.close()
        reason = body.decode(errors="replace").strip() or status_line
        raise StreamingError(f"unable to upgrade connection: {reason}")
    chosen = next((line.split(":", 1)[1].strip() for line in lines
                   if line.lower().startswith("x-stream-protocol-version:")), protocols[0])
    return Session(sock, chosen, rest)


def _response_head(sock: socket.socket) -> tuple[bytes, bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(_READ)
        if not chunk:
            raise StreamingError("podshimd's streaming server closed the connection before answering")
        buf += chunk
        if len(buf) > 64 * 1024:
            raise StreamingError("podshimd's streaming server answered with an overlong head")
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head, rest


class Session:
    """One SPDY connection and a loop over it and the caller's descriptors.

    ``on_event(event)`` gets each SPDY event; :meth:`watch` adds a descriptor whose callback runs when it
    is readable (while little is queued for the server). :meth:`run` loops until :meth:`stop`."""

    def __init__(self, sock: socket.socket, protocol: str, early: bytes = b"") -> None:
        self.protocol = protocol
        self.sock = sock
        sock.setblocking(False)
        self.conn = spdy.Connection(client_side=True, flow_control=False)
        self.on_event: Callable[[spdy.Event], None] = lambda event: None
        self._selector = selectors.PollSelector()  # stdin may be a regular file: epoll refuses those
        self._selector.register(sock, selectors.EVENT_READ, None)
        self._watched: dict[int, Callable[[], None]] = {}
        self._out = bytearray()
        self._early = early
        self._running = False
        self.closed = False  # the server closed the connection

    # -- what the caller does ---------------------------------------------------------------------
    def open_stream(self, headers: list[tuple[str, str]], *, fin: bool = False) -> int:
        return self.conn.open_stream(headers, fin=fin)

    def send(self, stream_id: int, data: bytes, *, fin: bool = False) -> None:
        self.conn.send_data(stream_id, data, fin=fin)

    def end(self, stream_id: int) -> None:
        self.conn.end_stream(stream_id)

    def watch(self, fd: int, callback: Callable[[], None]) -> None:
        self._watched[fd] = callback
        self._selector.register(fd, selectors.EVENT_READ, fd)

    def unwatch(self, fd: int) -> None:
        if self._watched.pop(fd, None) is not None:
            self._selector.unregister(fd)

    def stop(self) -> None:
        self._running = False

    def run(self) -> None:
        """Loop until :meth:`stop` (or the server closes the connection)."""
        self._running = True
        if self._early:
            early, self._early = self._early, b""
            self._received(early)
        while self._running and not self.closed:
            self._flush()
            want_write = bool(self._out)
            self._selector.modify(self.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if want_write else 0),
                                  None)
            for key, mask in self._selector.select():
                if key.data is None:
                    if mask & selectors.EVENT_WRITE:
                        self._write()
                    if mask & selectors.EVENT_READ:
                        self._read()
                elif len(self._out) < MAX_QUEUED and key.data in self._watched:
                    self._watched[key.data]()
                if not self._running or self.closed:
                    break
        self._flush()
        self._drain()

    def close(self) -> None:
        self._selector.close()
        self.sock.close()

    # -- the socket ---------------------------------------------------------------------------------
    def _flush(self) -> None:
        self._out += self.conn.data_to_send()
        self._write()

    def _write(self) -> None:
        if not self._out or self.closed:
            return
        try:
            sent = self.sock.send(self._out)
        except BlockingIOError:
            return
        except OSError:
            self.closed = True
            return
        del self._out[:sent]

    def _drain(self) -> None:
        """Write what is still queued (a last FIN), bounded: the session is over."""
        if not self._out or self.closed:
            return
        self.sock.setblocking(True)
        self.sock.settimeout(5.0)
        try:
            self.sock.sendall(self._out)
        except OSError:
            pass
        self._out.clear()

    def _read(self) -> None:
        try:
            data = self.sock.recv(_READ)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return
        self._received(data)

    def _received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except spdy.ProtocolError as exc:
            self.closed = True
            raise StreamingError(f"podshimd's streaming server broke the SPDY protocol: {exc}") from None
        for event in events:
            self.on_event(event)


def read_some(fd: int) -> bytes | None:
    """What ``fd`` has: b"" at its end (an error reads as the end), None when nothing is there yet."""
    try:
        return os.read(fd, _READ)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            select.select([], [fd], [], 1.0)


def remote_command(url: str, *, stdin: int | None, tty: bool, stderr: bool = True,
                   size: Callable[[], tuple[int, int] | None] | None = None, resize_fd: int | None = None,
                   stdout_fd: int = 1, stderr_fd: int = 2) -> int:
    """Run an exec or attach session on ``url``: the bytes of the descriptor ``stdin`` (None: no stdin
    stream) to the command, its output to ``stdout_fd``/``stderr_fd``. With ``tty``, ``size()`` is the
    terminal's (columns, rows), sent at once and again each time ``resize_fd`` is readable (a signal's
    wakeup pipe, drained here). Returns the command's exit status. Raises StreamingError."""
    session = connect(url, (EXEC_PROTOCOL,))
    try:
        error = session.open_stream([("streamtype", "error")], fin=True)
        streams = {}
        if stdin is not None:
            streams["stdin"] = session.open_stream([("streamtype", "stdin")])
        streams["stdout"] = session.open_stream([("streamtype", "stdout")])
        if stderr and not tty:
            streams["stderr"] = session.open_stream([("streamtype", "stderr")])
        resize = session.open_stream([("streamtype", "resize")]) if tty else None
        outputs = {streams["stdout"]: stdout_fd}
        if "stderr" in streams:
            outputs[streams["stderr"]] = stderr_fd
        status = bytearray()
        ended: list[bool] = []

        def send_size() -> None:
            current = size() if size is not None else None
            if resize is not None and current is not None:
                try:
                    session.send(resize, json.dumps({"Width": current[0], "Height": current[1]}).encode())
                except spdy.LocalProtocolError:  # the server closed it: the session is ending
                    pass

        def on_event(event: spdy.Event) -> None:
            if isinstance(event, spdy.DataReceived):
                if event.stream_id in outputs and event.data:
                    _write_all(outputs[event.stream_id], event.data)
                elif event.stream_id == error:
                    status.extend(event.data)
                if event.stream_id == error and event.fin:
                    ended.append(True)
                    session.stop()
            elif isinstance(event, spdy.StreamReset) and event.stream_id == error:
                session.stop()

        def from_stdin(stdin: int) -> None:
            data = read_some(stdin)
            if data is None:
                return
            try:
                if data:
                    session.send(streams["stdin"], data)
                else:
                    session.end(streams["stdin"])
            except spdy.LocalProtocolError:  # the server closed the command's stdin
                data = b""
            if not data:
                session.unwatch(stdin)

        def resized(resize_fd: int) -> None:
            read_some(resize_fd)
            send_size()

        session.on_event = on_event
        send_size()
        if stdin is not None:
            session.watch(stdin, functools.partial(from_stdin, stdin))
        if resize_fd is not None and resize is not None:
            session.watch(resize_fd, functools.partial(resized, resize_fd))
        session.run()
    finally:
        session.close()
    if not ended:
        raise StreamingError("podshimd's streaming server ended the session before the command's end")
    return _exit_status(bytes(status))


def _exit_status(message: bytes) -> int:
    """The exit status a v4 error stream reports (a JSON metav1.Status). Raises StreamingError for a
    command that did not run."""
    if not message:
        return 0
    try:
        status = json.loads(message)
    except ValueError:
        raise StreamingError(message.decode(errors="replace")) from None
    if status.get("status") == "Success":
        return 0
    if status.get("reason") == "NonZeroExitCode":
        for cause in (status.get("details") or {}).get("causes") or []:
            if cause.get("reason") == "ExitCode":
                try:
                    return int(cause.get("message"))
                except (TypeError, ValueError):
                    break
    raise StreamingError(status.get("message") or message.decode(errors="replace"))


def port_forward(url: str, listeners: list[tuple[socket.socket, int]], say: Callable[[str], None]) -> None:
    """Forward each connection accepted on a listener to its remote port in the pod, over one
    ``portforward.k8s.io`` session on ``url``, until the server ends it (or KeyboardInterrupt).
    ``say(sentence)`` gets what the server reports for a connection it could not forward."""
    session = connect(url, (PORT_FORWARD_PROTOCOL,))
    request_ids = iter(range(1 << 62))
    by_stream: dict[int, socket.socket] = {}  # data stream -> local connection
    errors: dict[int, bytearray] = {}  # error stream -> what it said
    half_closed: dict[int, set[str]] = {}  # data stream -> "in" and/or "out" once ended

    def finish(data_id: int, direction: str) -> None:
        """One direction of a forwarded connection ended ("in": the local side's, "out": the pod's;
        "reset": both); the connection is closed once both have."""
        done = half_closed.setdefault(data_id, set())
        done.update(("in", "out") if direction == "reset" else (direction,))
        local = by_stream.get(data_id)
        if local is None:
            return
        if done >= {"in", "out"}:
            session.unwatch(local.fileno())
            local.close()
            del by_stream[data_id], half_closed[data_id]
        elif direction == "out":
            try:
                local.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def accept(listener: socket.socket, remote: int) -> None:
        try:
            local, _ = listener.accept()
        except OSError:
            return
        headers = [("port", str(remote)), ("requestid", str(next(request_ids)))]
        error_id = session.open_stream([("streamtype", "error"), *headers], fin=True)
        data_id = session.open_stream([("streamtype", "data"), *headers])
        errors[error_id] = bytearray()
        by_stream[data_id] = local

        def from_local() -> None:
            data = read_some(local.fileno())
            if data is None:
                return
            try:
                if data:
                    session.send(data_id, data)
                else:
                    session.end(data_id)
            except spdy.LocalProtocolError:
                data = b""
            if not data:
                session.unwatch(local.fileno())
                finish(data_id, "in")

        session.watch(local.fileno(), from_local)

    def on_event(event: spdy.Event) -> None:
        if isinstance(event, spdy.DataReceived):
            if event.stream_id in errors:
                errors[event.stream_id].extend(event.data)
                if event.fin:
                    said = errors.pop(event.stream_id)
                    if said:
                        say(said.decode(errors="replace"))
            elif event.stream_id in by_stream:
                if event.data:
                    try:
                        by_stream[event.stream_id].sendall(event.data)
                    except OSError:
                        finish(event.stream_id, "reset")
                        session.conn.reset_stream(event.stream_id)
                        return
                if event.fin:
                    finish(event.stream_id, "out")
        elif isinstance(event, spdy.StreamReset) and event.stream_id in by_stream:
            finish(event.stream_id, "reset")

    session.on_event = on_event
    for listener, remote in listeners:
        session.watch(listener.fileno(), functools.partial(accept, listener, remote))
    try:
        session.run()
    finally:
        for local in by_stream.values():
            local.close()
        session.close()
    if session.closed:
        raise StreamingError("podshimd's streaming server ended the port-forward session")
