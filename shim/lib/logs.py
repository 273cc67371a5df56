"""Log lines as every podshim program writes them: a UTC timestamp, the level, the logger and pid."""

from __future__ import annotations

import logging
import sys
import time

__all__ = ["setup_logging"]


def setup_logging(debug: bool = False) -> None:
    """Log lines with a UTC timestamp to stderr (the bundle's log file for a detached shim)."""
    handler = logging.StreamHandler(sys.stderr)
    formatter = logging.Formatter("%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s[%(process)d]: %(message)s",
                                  "%Y-%m-%dT%H:%M:%S")
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else logging.INFO)
