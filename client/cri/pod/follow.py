"""Following the shims: each pod's shim's exit events keep its record current (containerd's
events.go), and GetContainerEvents hands them on."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel

from shim.api.names import EVENTS_SERVICE
from shim.api.topics import TOPIC_EXIT, TOPIC_TASK_EXIT
from shim.rpc.status import Aborted, NotFound, RpcError

from client.cri.events import CONTAINER_CREATED, CONTAINER_STARTED, EventStream
from client.cri.pod.base import UNKNOWN_EXIT_CODE, PodServiceBase, log
from client.cri.store import ContainerState, PodRecord, PodState

#: The shim's sandbox state while the pause runs (shim.sandbox.sandbox.State.RUNNING).
_SANDBOX_RUNNING = "running"


class Following(PodServiceBase):
    """The pod service's follow part (:class:`client.cri.pod.PodService` is all of them)."""

    def keep_current(self, task_group: anyio.abc.TaskGroup) -> None:
        """Follow each pod's shim events in ``task_group`` (which must outlive every call):
        pods and containers that exit are marked NOTREADY and EXITED as it happens, so status
        and listings read the records instead of asking every shim. Without it (or for a pod
        not followed yet) they ask the shim, as before."""
        self._followers = task_group

    async def _start_following(self, pod_id: str) -> None:
        """Follow the pod's shim (once per process); returns when its record was reconciled."""
        if self._followers is None or pod_id in self._following:
            return
        self._following.add(pod_id)
        await self._followers.start(self._follow, pod_id)

    def _follow_soon(self, pod_id: str) -> None:
        if self._followers is not None and pod_id not in self._following:
            self._following.add(pod_id)
            self._followers.start_soon(self._follow, pod_id)

    async def _follow(self, pod_id: str, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Apply the shim's exit events to the pod's record while the shim lives. Never raises.

        Each round subscribes, then reconciles the record with the shim (what exited before the
        subscription is seen there, what exits after it comes as an event). A lost connection
        is judged by the Controller: a live shim is followed again on its new connection, a
        dead one leaves its pod NOTREADY and its containers EXITED. When this cannot tell (the
        stream failed on a live connection, another process holds the sandbox), it stops and
        the pod's readers ask the shim again."""
        started = False
        try:
            while True:
                try:
                    await self._load(pod_id)
                    client = self.controller.client_for(self.namespace, pod_id)
                except RpcError:
                    client = None
                if client is None:  # its connection was lost: the Controller reconnects, or buries it
                    if not await self._reconcile(pod_id):
                        return
                    continue
                lost = False

                async def apply_events(client: Any = client) -> None:
                    nonlocal lost
                    try:
                        async for event in client.stream(EVENTS_SERVICE, "Subscribe", {}):
                            await self._apply(pod_id, event)
                            self._events.shim_event(pod_id, event)  # to GetContainerEvents, once applied
                    except RpcError as exc:
                        # Its shim went away: after a stop or remove, as expected; otherwise the
                        # Controller reconnects or buries it and says so.
                        log.debug("pod %s: its shim's event stream ended: %s", pod_id, exc.message,
                                  extra={"pod_id": pod_id})
                    finally:
                        self._current.discard(pod_id)
                    lost = client.closed

                async with anyio.create_task_group() as tg:
                    tg.start_soon(apply_events)
                    # The stream task runs first and sends Subscribe before it waits; the status
                    # call below goes out after it on the same connection, and the shim handles
                    # requests in order, so no exit falls between the two.
                    await anyio.lowlevel.checkpoint()
                    live = await self._reconcile(pod_id)
                    if live:
                        self._current.add(pod_id)
                    else:
                        tg.cancel_scope.cancel()
                    if not started:
                        started = True
                        task_status.started()
                if not live or not lost:
                    return
        except Exception:
            log.exception("pod %s: following its shim failed", pod_id, extra={"pod_id": pod_id})
        finally:
            self._current.discard(pod_id)
            self._following.discard(pod_id)
            if not started:
                task_status.started()

    async def _reconcile(self, pod_id: str) -> bool:
        """Bring the pod's record and its containers' up to date by asking the shim; True while
        its shim lives (its events can be followed)."""
        try:
            record = self.store.get(pod_id)
        except NotFound:
            return False
        running = await self._sandbox_running(record)
        if running is None:
            return False  # another process holds the sandbox right now
        if not running and record.state is PodState.READY:
            await self._mark_notready(pod_id)
        for container in record.containers.values():
            try:
                await self._ask_container(container)
            except (Aborted, NotFound):
                pass
        try:
            self.controller.client_for(self.namespace, pod_id)
        except RpcError:
            return False
        return True

    async def _mark_notready(self, pod_id: str) -> PodRecord | None:
        # Another process (or task) may be stopping it right now: the store checks the move
        # against the record as it is then, and READY → NOTREADY twice is no move the second time.
        try:
            return await self._stored(self.store.update, pod_id, state=PodState.NOTREADY, stopped_at=time.time_ns())
        except NotFound:
            return None

    async def _apply(self, pod_id: str, event: Any) -> None:
        """One shim event: a pause that exited makes the pod NOTREADY, a task that exited its
        container EXITED (under the pod's lock: a StartContainer in flight writes RUNNING first)."""
        if not isinstance(event, dict) or not isinstance(event.get("event"), dict):
            return
        body = event["event"]
        if event.get("topic") == TOPIC_EXIT:
            if pod_id not in self._stopping:
                await self._mark_notready(pod_id)
        elif event.get("topic") == TOPIC_TASK_EXIT and isinstance(body.get("task_id"), str):
            async with self._hold(pod_id):
                try:
                    c = self.store.get_container(pod_id, body["task_id"])
                except NotFound:
                    return  # removed meanwhile, or not one of ours
                if c.state is not ContainerState.EXITED:
                    await self._exited(c, {"exit_status": body.get("exit_status", UNKNOWN_EXIT_CODE),
                                     "exited_at": body.get("exited_at") or time.time_ns(),
                                     "oom_killed": body.get("oom_killed") is True})

    async def _sandbox_running(self, record: PodRecord) -> bool | None:
        """True while the pod's pause runs, False once it is gone; None when this cannot be told
        now (another process holds its sandbox)."""
        try:
            await self._load(record.pod_id)
            status = await self.controller.status(self.namespace, record.pod_id)
        except Aborted:
            return None
        except RpcError:
            return False
        return bool(status.state == _SANDBOX_RUNNING)

    @asynccontextmanager
    async def events(self) -> AsyncIterator[EventStream]:
        """GetContainerEvents: ``async with pods.events() as events: async for event in events``.

        Containers and pods created, started and removed here, and every container or pause that
        exits (the shims' exit events, through the one stream per shim this process follows),
        from now on (:mod:`client.cri.events`). Every live pod is followed before it yields."""
        async with self._events.subscribe() as stream:
            for record in self.store.list():
                if record.state is PodState.READY:
                    await self._start_following(record.pod_id)
            yield stream

    async def _pod_ready(self, pod_id: str) -> None:
        self._events.publish(CONTAINER_CREATED, pod_id, pod_id)
        self._events.publish(CONTAINER_STARTED, pod_id, pod_id)
