"""StartContainer (containerd's container_start.go)."""

from __future__ import annotations

from shim.rpc.status import FailedPrecondition

from client.cri.events import CONTAINER_STARTED
from client.cri.pod.base import PodServiceBase
from client.cri.store import ContainerState


class ContainerStart(PodServiceBase):
    """The pod service's container start part (:class:`client.cri.pod.PodService` is all of them)."""

    async def start_container(self, container_id: str) -> None:
        """StartContainer; FailedPrecondition unless it is CREATED."""
        c = self._container(container_id)
        async with self._hold(c.pod_id):
            c = self.store.get_container(c.pod_id, c.container_id)
            if c.state is not ContainerState.CREATED:
                raise FailedPrecondition(f"container {c.container_id} is {c.state}, not CREATED")
            started = await self._task(c.pod_id, "Start", {"task_id": c.container_id})
            await self._stored(self.store.update_container, c.pod_id, c.container_id, state=ContainerState.RUNNING,
                               pid=started["pid"], started_at=started["started_at"])
        self._events.publish(CONTAINER_STARTED, c.container_id, c.pod_id)
        self._lifecycle("container started (pid %s)", started["pid"], pod_id=c.pod_id, container_id=c.container_id)
