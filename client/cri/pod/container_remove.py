"""RemoveContainer: a container force-stopped, its task, snapshot and record removed
(containerd's container_remove.go)."""

from __future__ import annotations

from shim.rpc.status import NotFound, Unavailable

from client.cri.events import CONTAINER_DELETED
from client.cri.pod.base import PodServiceBase, log
from client.cri.rootfs import call
from client.cri.store import ContainerRecord


class ContainerRemove(PodServiceBase):
    """The pod service's container remove part (:class:`client.cri.pod.PodService` is all of them)."""

    async def remove_container(self, container_id: str) -> None:
        """RemoveContainer: force-stops a running container, then forgets it. Idempotent:
        removing a removed or unknown container succeeds."""
        async with self._held_container(container_id) as c:
            if c is None:
                return
            await self._stop_container(c, 0)
            await self._delete_task(c)
            await self._remove_rootfs(c.pod_id, c.container_id)
            await self._release_volumes(c.pod_id, c.container_id, c.image_volumes.values())
            await self._stored(self.store.delete_container, c.pod_id, c.container_id)
        self._cpu_rates.forget(c.container_id)
        self._events.publish(CONTAINER_DELETED, c.container_id, c.pod_id)
        self._lifecycle("container removed", pod_id=c.pod_id, container_id=c.container_id)

    async def _delete_task(self, c: ContainerRecord) -> None:
        try:
            await self._task(c.pod_id, "Delete", {"task_id": c.container_id})
        except (Unavailable, NotFound):
            pass  # the shim or the task is gone already

    async def _remove_rootfs(self, pod_id: str, container_id: str) -> None:
        """Remove a container's snapshot (none, or gone already: no error). A failure is logged,
        not raised: the snapshot's key is the container id, and the next recovery removes
        snapshots of containers that are no more."""
        if self.snapshots is None:
            return
        try:
            await call(self.snapshots.remove, container_id)
        except Exception as exc:  # noqa: BLE001 (logged; recovery sweeps it)
            log.warning("pod %s: removing the root filesystem snapshot %s failed: %s", pod_id, container_id, exc)
