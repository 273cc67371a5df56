"""The blocking transport of :mod:`shim.grpcwire.client`: one unix socket per channel, reused
by its calls one after another, each call's deadline enforced on every read and write."""

from __future__ import annotations

import socket
import time

from shim.grpcwire.client import Connection, Outcome
from shim.rpc.status import Code

__all__ = ["Channel"]

_READ_BYTES = 256 * 1024


class Channel:
    """Unary gRPC calls to the server listening on the unix socket ``path``; connects on the first
    call and again after the server ended a connection. Never raises for the server's or the
    socket's failures: :meth:`call` returns them as an :class:`Outcome`."""

    def __init__(self, path: str):
        self.path = path
        self._sock: socket.socket | None = None
        self._conn: Connection | None = None

    def call(self, method_path: str, request: bytes, timeout: float | None) -> Outcome:
        """Call ``method_path`` (``/package.Service/Method``) with the serialised ``request``, within
        ``timeout`` seconds (None: as long as it takes); its outcome (DEADLINE_EXCEEDED when the time ran out, UNAVAILABLE when
        the socket failed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._conn is None or not self._conn.usable:
            self.close()
            outcome = self._connect(deadline)
            if outcome is not None:
                return outcome
        sock, conn = self._sock, self._conn
        assert sock is not None and conn is not None
        conn.start_call(method_path, request, timeout)
        try:
            while True:
                self._send(sock, conn, deadline)
                result = conn.next_outcome()
                if isinstance(result, Outcome):
                    self._send(sock, conn, deadline)  # a reset of the stream, window updates
                    return result
                sock.settimeout(_remaining(deadline))
                conn.receive_data(sock.recv(_READ_BYTES))
        except (TimeoutError, _Expired):
            conn.fail(Outcome(Code.DEADLINE_EXCEEDED, f"no reply within the call's deadline of {timeout or 0:g} s"))
        except (BrokenPipeError, ConnectionResetError) as exc:
            conn.fail(Outcome(Code.UNAVAILABLE, f"the server closed the connection ({exc.strerror or exc})"))
        except OSError as exc:
            conn.fail(Outcome(Code.UNAVAILABLE, f"the connection failed: {exc.strerror or exc}"))
        result = conn.next_outcome()
        assert isinstance(result, Outcome)  # fail() settled the call
        return result

    def close(self) -> None:
        """Close the socket (a call after this connects again)."""
        if self._sock is not None:
            self._sock.close()
        self._sock = self._conn = None

    def _connect(self, deadline: float | None) -> Outcome | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.settimeout(_remaining(deadline))
            sock.connect(self.path)
        except (TimeoutError, _Expired):
            sock.close()
            return Outcome(Code.DEADLINE_EXCEEDED, f"could not connect to {self.path} within the call's deadline")
        except OSError as exc:
            sock.close()
            return Outcome(Code.UNAVAILABLE, f"cannot connect to {self.path}: {exc.strerror or exc}")
        self._sock, self._conn = sock, Connection()
        return None

    @staticmethod
    def _send(sock: socket.socket, conn: Connection, deadline: float | None) -> None:
        data = conn.data_to_send()
        if data:
            sock.settimeout(_remaining(deadline))
            sock.sendall(data)


class _Expired(Exception):
    pass


def _remaining(deadline: float | None) -> float | None:
    """Seconds to the deadline (for a socket timeout; None blocks); _Expired once it passed."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise _Expired
    return left
