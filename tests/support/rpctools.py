"""Helpers shared by the wire tests: a raw request frame and a call made as another uid."""

from __future__ import annotations

import os
import socket
from typing import Any

from shim.rpc.frames import MessageType, encode_frame
from shim.rpc.messages import Request, encode_request

#: How many times slower this machine runs the tests than ours: the guest under software emulation
#: (tests/support/guest.py) sets it.
SLOWDOWN = float(os.environ.get("PODSHIM_TEST_SLOWDOWN") or 1)
WAIT = 5.0 * SLOWDOWN  # seconds; a bound for the test, not a readiness sleep
SERVICE = "test.v1.Echo"
NOBODY = 65534


def request_frame(stream_id: int, method: str = "Ping", payload: dict[str, Any] | None = None) -> bytes:
    return encode_frame(stream_id, MessageType.REQUEST, 0, encode_request(Request(SERVICE, method, payload or {})))


def call_as_nobody(path: str) -> int:
    """In a forked child: become uid nobody, send a Ping and say by exit code what came back."""
    try:
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(WAIT)
            sock.connect(path)
            try:
                sock.sendall(request_frame(1))
                reply = sock.recv(65536)
            except (BrokenPipeError, ConnectionResetError):
                reply = b""
        return 0 if reply == b"" else 1  # 0: closed without an answer
    except TimeoutError:
        return 2
    except BaseException:
        return 3
