"""RemovePodSandbox: a pod force-stopped, its containers, network, shim, files and record
removed (containerd's sandbox_remove.go)."""

from __future__ import annotations

import os

from shim.lib.podfiles import remove_pod_files
from shim.lib.trees import remove_tree

from client.cri.events import CONTAINER_DELETED
from client.cri.failpoints import failpoint
from client.cri.pod.base import PodServiceBase, sandbox_snapshot_key
from client.cri.store import PodRecord, PodState
from client.phases import phase


class SandboxRemove(PodServiceBase):
    """The pod service's sandbox remove part (:class:`client.cri.pod.PodService` is all of them)."""

    async def remove_pod_sandbox(self, pod_id: str) -> None:
        """RemovePodSandbox: force-stop if needed, remove containers, netns, shim and record.

        Idempotent: removing a removed or unknown pod succeeds.
        """
        async with self._held_pod(pod_id) as record:
            if record is None:
                return
            if record.state is not PodState.NOTREADY:
                await self._stop(record)
                record = self.store.get(record.pod_id)
            failpoint("remove:after-stop")
            for container in list(record.containers.values()):
                # A pod that went NOTREADY on its own (its pause died) was not stopped: a
                # container of it may still run, and a running task cannot be deleted.
                await self._stop_container_quietly(container)
                await self._delete_task(container)
                await self._remove_rootfs(record.pod_id, container.container_id)
                await self._release_volumes(record.pod_id, container.container_id, container.image_volumes.values())
                await self._stored(self.store.delete_container, record.pod_id, container.container_id)
                self._events.publish(CONTAINER_DELETED, container.container_id, record.pod_id)
            failpoint("remove:after-containers")
            # A stop that was cut short may not have finished DEL: run it again (DEL is idempotent).
            if not record.network_down:
                with phase("cni del"):
                    await self._teardown_network(record, strict=True)
            with phase("ShutdownSandbox"):
                await self._shutdown_sandbox(record.pod_id)
            failpoint("remove:after-shutdown")
            await self._remove_sandbox_rootfs(record)
            default_logs = os.path.join(self.log_root, record.pod_id)
            remove_tree(default_logs, ignore_errors=True)
            remove_pod_files(self._pod_files_dir(record.pod_id))
            with phase("store delete"):
                await self._stored(self.store.delete, record.pod_id)
            self._lifecycle("pod sandbox removed", pod_id=record.pod_id, record=record)
            failpoint("remove:after-record")
            self._events.publish(CONTAINER_DELETED, record.pod_id, record.pod_id)

    async def _remove_sandbox_rootfs(self, record: PodRecord) -> None:
        """Remove the pod's sandbox image snapshot, if it has one (the shim unmounted it at
        shutdown; the image is recorded on the pod before its snapshot is made)."""
        if self.snapshots is not None and record.sandbox_image_id:
            with phase("sandbox snapshot removal"):
                await self._remove_rootfs(record.pod_id, sandbox_snapshot_key(record.pod_id))
