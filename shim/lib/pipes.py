"""Reading a child's pipe on the event loop without ever blocking it: the one reader that task
logs (:mod:`shim.runtime.crilog`) and exec output (:mod:`shim.runtime.execsync`) share."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import Callable

__all__ = ["READ_BYTES", "PipeReader", "wait_ready"]

log = logging.getLogger(__name__)

READ_BYTES = 64 * 1024


async def wait_ready(fd: int, writable: bool) -> None:
    """Wait on the running loop until the non-blocking ``fd`` is readable (or writable)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    add, remove = (loop.add_writer, loop.remove_writer) if writable else (loop.add_reader, loop.remove_reader)
    add(fd, wake)
    try:
        await ready
    finally:
        remove(fd)


class PipeReader:
    """Reads the non-blocking pipe ``fd`` with ``loop.add_reader`` until EOF.

    Each chunk read goes to ``on_data``; ``on_end`` is called once, at EOF or at :meth:`stop`,
    after which :attr:`eof` is done. The caller owns ``fd`` and closes it after :meth:`stop`.
    A read error is logged (naming ``name``) and counts as EOF; EIO, a terminal master's end, quietly.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, on_data: Callable[[bytes], None],
                 on_end: Callable[[], None] | None = None, *, name: str = "a pipe"):
        self._loop = loop
        self._fd = fd
        self._on_data = on_data
        self._on_end = on_end
        self._name = name
        self.eof: asyncio.Future[None] = loop.create_future()
        os.set_blocking(fd, False)
        loop.add_reader(fd, self._read, True)

    def _read(self, once: bool) -> None:
        while not self.eof.done():
            try:
                data = os.read(self._fd, READ_BYTES)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno != errno.EIO:  # EIO: a terminal's master once its slave is closed: its end
                    log.error("reading %s failed: %s", self._name, exc.strerror)
                data = b""
            if not data:
                self._finish()
                return
            self._on_data(data)
            if once:
                return

    def _finish(self) -> None:
        self._loop.remove_reader(self._fd)
        if self._on_end is not None:
            self._on_end()
        self.eof.set_result(None)

    def flush(self) -> None:
        """Read what the pipe holds now; keep reading afterwards."""
        if not self.eof.done():
            self._read(once=False)

    def stop(self) -> None:
        """Read what the pipe holds now, then stop reading (EOF or not)."""
        self.flush()
        if not self.eof.done():
            self._finish()
