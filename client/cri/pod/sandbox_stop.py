"""StopPodSandbox: containers stopped, network torn down, sandbox stopped (containerd's
sandbox_stop.go)."""

from __future__ import annotations

import time

from shim.rpc.status import FailedPrecondition, NotFound

from client.cri.failpoints import failpoint
from client.cri.pod.base import SANDBOX_STOP_TIMEOUT, PodServiceBase
from client.cri.store import PodRecord, PodState
from client.phases import phase


class SandboxStop(PodServiceBase):
    """The pod service's sandbox stop part (:class:`client.cri.pod.PodService` is all of them)."""

    async def stop_pod_sandbox(self, pod_id: str) -> None:
        """StopPodSandbox: containers stopped, network torn down, sandbox stopped: NOTREADY.

        Idempotent: stopping a stopped, removed or unknown pod succeeds, and a pod whose shim is
        already dead stops too. Raises FailedPrecondition for a pod still being created.
        """
        async with self._held_pod(pod_id) as record:
            if record is not None:
                await self._stop(record)

    async def _stop(self, record: PodRecord) -> None:
        if record.state is PodState.CREATING:  # only a crash leftover: its RunPodSandbox held the lock
            raise FailedPrecondition(f"pod {record.pod_id} is still being created")
        # The pause's exit event is this stop's doing, and the stop writes NOTREADY itself: the
        # follower leaves it alone meanwhile. A stop that fails leaves the record to be asked
        # about again (not current) in case the pause exited all the same.
        self._stopping.add(record.pod_id)
        try:
            await self._stop_pod(record)
        except BaseException:
            self._current.discard(record.pod_id)
            raise
        finally:
            self._stopping.discard(record.pod_id)

    async def _stop_pod(self, record: PodRecord) -> None:
        for container in record.containers.values():
            await self._stop_container_quietly(container)
        failpoint("stop:after-containers")
        if not record.network_down:
            with phase("cni del"):
                await self._teardown_network(record, strict=True)
        failpoint("stop:after-network")
        await self._load(record.pod_id)
        try:
            with phase("StopSandbox"):
                await self.controller.stop(self.namespace, record.pod_id, timeout=SANDBOX_STOP_TIMEOUT)
        except NotFound:
            pass
        failpoint("stop:after-sandbox")
        if record.state is not PodState.NOTREADY or not record.network_down:
            with phase("store update"):
                await self._stored(self.store.update, record.pod_id, state=PodState.NOTREADY, network_down=True,
                                   stopped_at=record.stopped_at or time.time_ns())
            self._lifecycle("pod sandbox stopped", pod_id=record.pod_id, record=record)
