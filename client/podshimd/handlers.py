"""The base of every handler group: what a CRI handler may use.

A handler group is a class deriving from :class:`Handlers` whose methods are named after the
RPCs of one service and take ``(self, request, context)``; ``server.py`` lists the groups of each
service and composes them into the servicer (see :func:`client.podshimd.server.compose`). A
handler translates only: the request into the pod layer's types (:mod:`.translate`), one call to
:attr:`Handlers.pods`, the result back into a response. It raises to fail; the one place that
turns exceptions into a gRPC status is :mod:`.errors`, applied to every handler by ``compose``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

from client.cri.pod import PodService
from client.images.service import Images
from client.streaming.server import StreamingServer

from .config import Config

__all__ = ["Handlers", "Changes"]

log = logging.getLogger("podshimd")

_T = TypeVar("_T")


class Changes:
    """The pod changes in flight (runp, stopp, create, ...), each in a task of its own.

    A client that goes away (its deadline passed, crictl was interrupted) cancels its call, but
    the change it asked for still runs to its end or rolls itself back, as the pod layer does on
    failure: a cancelled call never leaves a half-made pod. The daemon waits for what is in flight
    when it stops (:meth:`drain`).
    """

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    async def finish(self, change: Awaitable[_T]) -> _T:
        """Run ``change`` to its end even if the caller is cancelled; return its result."""
        task = asyncio.ensure_future(change)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return await asyncio.shield(task)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        # A change whose caller went away has nobody to see its error: retrieve it here (no
        # "exception never retrieved" at exit) and log it; a caller still there got it too.
        if not task.cancelled() and task.exception() is not None:
            log.debug("a pod change failed: %s", task.exception())

    def __len__(self) -> int:
        return len(self._tasks)

    async def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the changes in flight; cancel what is left (each change
        rolls back what it did, shielded, on cancellation)."""
        if not self._tasks:
            return
        log.info("waiting up to %.0f s for %d pod change(s) in flight", timeout, len(self._tasks))
        _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)


class Handlers:
    """What a handler group has: the daemon's :attr:`config`, the pod layer (:attr:`pods`),
    :meth:`finish` for a call that changes pods, the :attr:`streaming` server and the node's
    :attr:`images`."""

    def __init__(self, config: Config, pods: PodService, changes: Changes, images: Images,
                 streaming: StreamingServer | None = None) -> None:
        self.config = config
        self.pods = pods
        self.images = images
        self._changes = changes
        self.streaming = streaming  # the server of Exec, Attach and PortForward URLs (RuntimeService only)

    async def finish(self, change: Awaitable[_T]) -> _T:
        """Run a change to the pods to its end even if the client goes away (see :class:`Changes`)."""
        return await self._changes.finish(change)
