"""The terminal sizes a client sends on its ``resize`` stream (exec -t, attach -t): JSON
``{"Width": W, "Height": H}`` values one after another, as kubectl's and crictl's Go client writes them."""

from __future__ import annotations

import json
import logging

from .session import Stream

__all__ = ["MAX_RESIZE_BYTES", "TerminalSizes"]

log = logging.getLogger("podshimd.streaming")

#: The most resize messages buffered without a newline.
MAX_RESIZE_BYTES = 4096


class TerminalSizes:
    """The terminal sizes a resize stream carries: JSON ``{"Width": W, "Height": H}`` values one after
    another (Go's json.Encoder puts a newline after each)."""

    def __init__(self, stream: Stream) -> None:
        self._stream = stream
        self._pending = ""
        self._decoder = json.JSONDecoder()

    async def next(self) -> tuple[int, int] | None:
        """The next size; None once the stream ended. A value that is not a size is skipped (logged)."""
        while True:
            text = self._pending.lstrip()
            if text:
                try:
                    value, end = self._decoder.raw_decode(text)
                except ValueError:
                    if len(text) > MAX_RESIZE_BYTES:
                        log.debug("dropping a resize message that is not JSON")
                        self._pending = ""
                else:
                    self._pending = text[end:]
                    try:
                        return int(value["Width"]), int(value["Height"])
                    except (KeyError, TypeError, ValueError, OverflowError):
                        log.debug("ignoring a bad resize message %r", value)
                        continue
            data = await self._stream.read()
            if not data:
                return None
            self._pending += data.decode(errors="replace")
