"""Where a pod operation's time goes: the duration of each of its phases, on one log line.

Turned on by ``PODSHIM_TRACE=1`` in the environment of the process that runs the pod layer
(podshimd); off, it costs one context-variable read per phase. The pod layer opens a trace per
operation with :func:`traced` and marks its steps with :func:`phase`; code below it (the
Controller, the CNI runner) marks its own steps the same way, and they land in the trace of the
operation they run for (a context variable: tasks started inside inherit it)::

    2026-12-01T08:00:00.123Z INFO client.phases[812] pod_id=5c0f...: runp 21.4 ms: record 0.9,
        spawn 4.1, CreateSandbox 2.8, StartSandbox 9.7, cni loopback ADD 6.0, ...

Phases that run at the same time (overlapping steps) each count their own wall time, so the
phases may add up to more than the total.
"""

from __future__ import annotations

import contextvars
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ENABLED", "phase", "traced"]

log = logging.getLogger(__name__)

#: Whether phase timings are taken (``PODSHIM_TRACE`` set to anything but "" or "0").
ENABLED = os.environ.get("PODSHIM_TRACE", "") not in ("", "0")

_TRACE: contextvars.ContextVar[list[tuple[str, float]] | None] = contextvars.ContextVar("phase_trace", default=None)


@contextmanager
def traced(operation: str) -> Iterator[None]:
    """Time ``operation`` and the phases marked inside it; log them at INFO when it ends."""
    if not ENABLED:
        yield
        return
    phases: list[tuple[str, float]] = []
    token = _TRACE.set(phases)
    started = time.perf_counter()
    failed = True
    try:
        yield
        failed = False
    finally:
        total = time.perf_counter() - started
        _TRACE.reset(token)
        log.info("%s %.1f ms%s: %s", operation, total * 1000, " (failed)" if failed else "",
                 ", ".join(f"{name} {seconds * 1000:.1f}" for name, seconds in phases) or "no phases")


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Mark a step of the operation being traced (nothing when none is)."""
    phases = _TRACE.get()
    if phases is None:
        yield
        return
    started = time.perf_counter()
    try:
        yield
    finally:
        phases.append((name, time.perf_counter() - started))
