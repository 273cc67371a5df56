"""A busy disk, as a test makes one: every fsync of this process waits first, and how many were
waited for at once is counted; and some changes made at once, each in a thread of its own."""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from collections.abc import Callable
from typing import Any


class FsyncOverlap:
    """How many fsyncs of this process were in progress at once, at the most (``most``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._now = 0
        self.most = 0

    def __enter__(self) -> None:
        with self._lock:
            self._now += 1
            self.most = max(self.most, self._now)

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._now -= 1


def slow_fsyncs(monkeypatch: Any, seconds: float) -> FsyncOverlap:
    """Every ``os.fsync`` of this process waits ``seconds`` first (until ``monkeypatch`` is undone);
    the overlap of those waits is counted in what is returned."""
    real = os.fsync
    overlap = FsyncOverlap()

    def slow(fd: int) -> None:
        with overlap:
            time.sleep(seconds)
        real(fd)

    monkeypatch.setattr(os, "fsync", slow)
    return overlap


def at_once(count: int, change: Callable[[int], Any]) -> None:
    """``change(0)`` .. ``change(count - 1)`` made at once, each in a thread, all started together."""
    barrier = threading.Barrier(count)

    def together(i: int) -> Any:
        barrier.wait()
        return change(i)

    with concurrent.futures.ThreadPoolExecutor(count) as threads:
        list(threads.map(together, range(count)))
