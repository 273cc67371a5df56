"""A busy disk, as a test makes one: every fsync of this process waits first; and how long some
changes made at once, each in a thread of its own, took on it."""

from __future__ import annotations

import concurrent.futures
import os
import time
from collections.abc import Callable
from typing import Any


def slow_fsyncs(monkeypatch: Any, seconds: float) -> None:
    """Every ``os.fsync`` of this process waits ``seconds`` first (until ``monkeypatch`` is undone)."""
    real = os.fsync

    def slow(fd: int) -> None:
        time.sleep(seconds)
        real(fd)

    monkeypatch.setattr(os, "fsync", slow)


def seconds_at_once(count: int, change: Callable[[int], Any]) -> float:
    """``change(0)`` .. ``change(count - 1)`` made at once, each in a thread; how long they took."""
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(count) as threads:
        list(threads.map(change, range(count)))
    return time.monotonic() - started
