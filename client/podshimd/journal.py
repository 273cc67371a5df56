"""podshimd's log lines straight to systemd's journal, with their level and fields, when it runs
under systemd.

Why the journal's native protocol and not text on stderr: a line on stderr reaches the journal as
one MESSAGE at the unit's default priority, so ``journalctl -p warning`` would miss podshimd's
warnings, and the pod a line is about would be words in the text, not a field to select on.
Sent natively, each line is an entry of its own with ``PRIORITY`` (its level), ``POD_ID``,
``CONTAINER_ID``, ``POD_NAMESPACE`` and ``POD_NAME`` (when the line is about a pod:
:mod:`client.cri.logcontext`), ``LOGGER`` (the Python logger), ``CODE_FILE``, ``CODE_LINE`` and
``CODE_FUNC``, so that ``journalctl -u podshimd -p warning`` and ``journalctl -u podshimd
POD_ID=…`` select what an operator asks for, and a traceback stays in its line's entry.

When: systemd sets ``JOURNAL_STREAM`` (``DEVICE:INODE``) to the stream it connected to the
service's stdout and stderr; podshimd sends natively only when its stderr is that stream (so
``podshimd 2>file`` under systemd still writes the file) and the journal's socket takes a
datagram. The protocol (systemd's "Native Journal Protocol"): one datagram per entry on
``/run/systemd/journal/socket``, a ``KEY=value`` line per field, a value with a newline sent as
the key, a newline, its length (64-bit little-endian) and its bytes. An entry the socket refuses
(larger than a datagram may be, or journald gone) is written to stderr instead, as text: no line
is lost.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import sys
from typing import IO

__all__ = ["JOURNAL_SOCKET", "JournalHandler", "journal_stream", "priority"]

JOURNAL_SOCKET = "/run/systemd/journal/socket"
#: syslog priorities of Python's levels (the journal's PRIORITY field).
_PRIORITIES = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6))
#: The record attributes :mod:`client.cri.logcontext` sets, and their journal fields.
_FIELDS = (("pod_id", "POD_ID"), ("container_id", "CONTAINER_ID"), ("pod_namespace", "POD_NAMESPACE"),
           ("pod_name", "POD_NAME"))


def priority(level: int) -> int:
    """The syslog priority of a Python log level (DEBUG and below: 7, debug)."""
    return next((p for at_least, p in _PRIORITIES if level >= at_least), 7)


def journal_stream(stream: IO[str] | None = None, environ: dict[str, str] | None = None) -> bool:
    """Whether ``stream`` (stderr) is the journal stream systemd gave the service (``JOURNAL_STREAM``)."""
    value = (os.environ if environ is None else environ).get("JOURNAL_STREAM", "")
    device, sep, inode = value.partition(":")
    if not sep or not device.isdigit() or not inode.isdigit():
        return False
    try:
        st = os.fstat((stream or sys.stderr).fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (int(device), int(inode))


def _field(key: str, value: str) -> bytes:
    data = value.encode("utf-8", "replace")
    if b"\n" in data:
        return key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
    return key.encode() + b"=" + data + b"\n"


class JournalHandler(logging.Handler):
    """Sends each record as one journal entry (see the module's docstring); ``fallback`` (a
    handler writing text to stderr) takes what the journal refuses."""

    def __init__(self, identifier: str, fallback: logging.Handler, path: str = JOURNAL_SOCKET) -> None:
        super().__init__()
        self.identifier = identifier
        self.fallback = fallback
        self.path = path
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    def entry(self, record: logging.LogRecord) -> bytes:
        """The datagram of ``record``."""
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + logging.Formatter().formatException(record.exc_info)
        if record.stack_info:
            message += "\n" + record.stack_info
        fields = [("MESSAGE", message), ("PRIORITY", str(priority(record.levelno))),
                  ("SYSLOG_IDENTIFIER", self.identifier), ("LOGGER", record.name),
                  ("CODE_FILE", record.pathname), ("CODE_LINE", str(record.lineno)), ("CODE_FUNC", record.funcName)]
        fields += [(key, str(value)) for attribute, key in _FIELDS if (value := getattr(record, attribute, ""))]
        return b"".join(_field(key, value) for key, value in fields)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            data = self.entry(record)
        except Exception:
            self.handleError(record)
            return
        try:
            self._socket.sendto(data, self.path)
        except OSError:  # too large for a datagram, or no journald: the line goes to stderr
            self.fallback.handle(record)

    def close(self) -> None:
        self._socket.close()
        super().close()


def install(identifier: str) -> bool:
    """Under systemd with stderr on the journal (:func:`journal_stream`), send the root logger's
    lines to the journal, its stderr handler kept for what the journal refuses; whether it did.
    Call after the stderr handler is set up (:func:`client.cri.logcontext.install` included)."""
    root = logging.getLogger()
    if not journal_stream() or len(root.handlers) != 1 or not os.path.exists(JOURNAL_SOCKET):
        return False
    fallback = root.handlers[0]
    handler = JournalHandler(identifier, fallback)
    for kept in fallback.filters:  # the ids of client.cri.logcontext
        handler.addFilter(kept)
    root.handlers[:] = [handler]
    return True
