"""Log lines as every podshim program writes them: a UTC timestamp, the level, the logger and pid."""

from __future__ import annotations

import logging
import sys
import time

__all__ = ["setup_logging"]


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler :func:`setup_logging` installs (its class tells it from any other)."""


def setup_logging(debug: bool = False) -> None:
    """Log lines with a UTC timestamp to stderr (the bundle's log file for a detached shim).

    Nothing is done when this process logs so already (a shim forked from the template, which
    set it up): making the handler anew and setting the level (which clears the cache of every
    logger) would write to pages the shim otherwise shares with the template."""
    root = logging.getLogger()
    level = logging.DEBUG if debug else logging.INFO
    installed = root.handlers
    if (len(installed) == 1 and type(installed[0]) is _Handler and installed[0].stream is sys.stderr
            and root.level == level):
        return
    handler = _Handler(sys.stderr)
    formatter = logging.Formatter("%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s[%(process)d]: %(message)s",
                                  "%Y-%m-%dT%H:%M:%S")
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    root.handlers[:] = [handler]
    root.setLevel(level)
