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
import collections
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

from client.cri.pod import PodService
from client.images.service import Images
from client.phases import phase
from client.streaming.server import StreamingServer

from .config import Config

__all__ = ["Handlers", "Changes", "Turns"]

log = logging.getLogger("podshimd")

_T = TypeVar("_T")


class Changes:
    """The pod changes in flight (runp, stopp, create, ...), each in a task of its own.

    A client that goes away (its deadline passed, crictl was interrupted) cancels its call, but
    the change it asked for still runs to its end or rolls itself back, as the pod layer does on
    failure: a cancelled call never leaves a half-made pod. The daemon waits for what is in flight
    when it stops (:meth:`drain`).

    Pod starts (RunPodSandbox) take turns: at most ``pod_starts`` of them run at once (0: no
    limit), the others wait in the order they came. A node asked for many pods at once (kubelet
    starts every new pod's sandbox together) then finishes them one after another instead of all
    of them late, and the steps of the pods already started (their containers' create and start,
    which never wait) and kubelet's status reads are not held up behind a hundred half-made
    sandboxes. A call cancelled while it waits for its turn starts nothing.
    """

    def __init__(self, pod_starts: int = 0) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._turns = Turns(pod_starts) if pod_starts > 0 else None
        #: Pod starts running now (past their turn).
        self.starts_running = 0

    @property
    def starts_waiting(self) -> int:
        """Pod starts waiting for their turn."""
        return 0 if self._turns is None else self._turns.waiting

    async def finish(self, change: Coroutine[Any, Any, _T], *, pod_start: bool = False) -> _T:
        """Run ``change`` to its end even if the caller is cancelled; return its result. A
        ``pod_start`` waits for its turn first (and is closed unstarted if the caller is cancelled
        meanwhile); it holds its turn until it has ended, whether or not its caller is still there."""
        if pod_start and self._turns is not None:
            try:
                with phase("waiting for a turn"):
                    await self._turns.take()
            except BaseException:
                change.close()  # never started: nothing to roll back
                raise
        task = asyncio.ensure_future(change)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        if pod_start:
            self.starts_running += 1
            task.add_done_callback(self._start_ended)
        return await asyncio.shield(task)

    def _start_ended(self, task: asyncio.Task[Any]) -> None:
        self.starts_running -= 1
        if self._turns is not None:
            self._turns.give_back()

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


class Turns:
    """``count`` turns, taken in the order they were asked for (a FIFO semaphore)."""

    def __init__(self, count: int) -> None:
        self.free = count
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def waiting(self) -> int:
        """Callers waiting for a turn."""
        return len(self._waiters)

    async def take(self) -> None:
        """Return once a turn is this caller's; a caller cancelled meanwhile holds none."""
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give_back()  # handed a turn as it was cancelled: the next one's
            elif waiter in self._waiters:  # (a give_back may have passed it over already)
                self._waiters.remove(waiter)
            raise

    def give_back(self) -> None:
        """A turn ends: the longest waiter takes it, or it is free."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.free += 1


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

    async def finish(self, change: Coroutine[Any, Any, _T], *, pod_start: bool = False) -> _T:
        """Run a change to the pods to its end even if the client goes away; a ``pod_start``
        after waiting for its turn (see :class:`Changes`)."""
        return await self._changes.finish(change, pod_start=pod_start)
