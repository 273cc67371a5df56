"""StopContainer: the stop signal, SIGKILL after the grace (containerd's container_stop.go)."""

from __future__ import annotations

import signal
import time

from shim.rpc.status import DeadlineExceeded, NotFound, RpcError, Unavailable

from client.cri.pod.base import CONTAINER_STOP_TIMEOUT, PodServiceBase, log
from client.cri.store import ContainerRecord, ContainerState


class ContainerStop(PodServiceBase):
    """The pod service's container stop part (:class:`client.cri.pod.PodService` is all of them)."""

    async def stop_container(self, container_id: str, timeout: float | None = None) -> None:
        """StopContainer: its stop signal (:attr:`ContainerRecord.stop_signal`), SIGKILL after
        ``timeout`` seconds (0: at once). Idempotent:
        stopping an exited, removed or unknown container succeeds."""
        async with self._held_container(container_id) as c:
            if c is not None:
                await self._stop_container(c, CONTAINER_STOP_TIMEOUT if timeout is None else timeout)

    async def _stop_container_quietly(self, c: ContainerRecord) -> None:
        """Stop a container of a pod being stopped or removed, at once and best effort (as
        containerd: the sandbox stop kills it anyway); a failure is logged."""
        try:
            await self._stop_container(c, 0)
        except RpcError as exc:
            log.warning("pod %s: stopping container %s failed: %s", c.pod_id, c.container_id, exc)

    async def _stop_container(self, c: ContainerRecord, timeout: float) -> None:
        c = await self._refresh_container(c)
        if c.state is not ContainerState.RUNNING:
            if c.state is ContainerState.CREATED:  # never started: it simply will not run
                await self._stored(self.store.update_container, c.pod_id, c.container_id, state=ContainerState.EXITED,
                                   finished_at=time.time_ns(), exit_code=0, reason="NeverStarted")
            return
        try:
            if timeout > 0:
                await self._task(c.pod_id, "Kill", {"task_id": c.container_id, "signal": c.stop_signal})
                try:
                    done = await self._task(c.pod_id, "Wait", {"task_id": c.container_id}, timeout=timeout)
                    await self._exited(c, done)
                    return
                except DeadlineExceeded:
                    pass
            await self._task(c.pod_id, "Kill", {"task_id": c.container_id, "signal": int(signal.SIGKILL), "all": True})
            await self._exited(c, await self._task(c.pod_id, "Wait", {"task_id": c.container_id}))
        except (Unavailable, NotFound):
            await self._shim_gone(c)
