"""UpdateContainerResources, UpdatePodSandboxResources and ReopenContainerLog (containerd's
container_update_resources.go, sandbox_update_resources.go, container_log_reopen.go)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shim.cri.configs import set_fields
from shim.cri.resources import pod_resources, shim_resources
from shim.rpc.status import FailedPrecondition

from client.cri.logcontext import about
from client.cri.pod.base import POD_STATE, PodServiceBase, log
from client.cri.store import PodState


class ContainerUpdate(PodServiceBase):
    """The pod service's container update part (:class:`client.cri.pod.PodService` is all of them)."""

    async def update_container_resources(self, container_id: str, linux: Mapping[str, Any] | None) -> None:
        """UpdateContainerResources: apply CRI's LinuxContainerResources ``linux`` (proto field
        names; zero values mean "leave as it is") to a running container's cgroup. Raises
        InvalidArgument naming a field that cannot be applied (nothing is changed then), NotFound,
        FailedPrecondition (not running: a created container has no cgroup yet)."""
        resources = shim_resources(linux)
        c = await self._running(container_id)
        if not resources:
            return
        with about(c.pod_id, c.container_id):
            await self._task(c.pod_id, "Update", {"task_id": c.container_id, "resources": resources})
            await self._stored(self.store.update_container, c.pod_id, c.container_id,
                               resources={**c.resources, **set_fields(linux or {})})
            log.info("container resources updated: %s", ", ".join(f"{k}={v}" for k, v in sorted(resources.items())))

    async def update_pod_sandbox_resources(self, pod_id: str, overhead: Mapping[str, Any] | None,
                                           resources: Mapping[str, Any] | None) -> None:
        """UpdatePodSandboxResources: apply CRI's pod-level LinuxContainerResources (``resources``
        plus ``overhead``, :func:`shim.cri.resources.pod_resources`) to the pod's cgroup, which
        holds its pause and every container. Raises InvalidArgument naming a field that cannot be
        applied (nothing is changed then), NotFound, FailedPrecondition (the pod is not ready)."""
        wanted = pod_resources(overhead, resources)
        record = await self._refreshed(self._pod(pod_id))
        if record.state is not PodState.READY:
            raise FailedPrecondition(f"pod {record.pod_id} is not ready ({POD_STATE[record.state]}): its cgroup "
                                     "is gone or going")
        if not wanted:
            return
        with about(record.pod_id):
            await self.controller.update(self.namespace, record.pod_id, wanted)
            log.info("pod resources updated: %s", ", ".join(f"{k}={v}" for k, v in sorted(wanted.items())))

    async def reopen_container_log(self, container_id: str) -> None:
        """ReopenContainerLog: the container's log file is opened again (created if it was moved),
        after a rotation. Raises NotFound, FailedPrecondition (not running; the file cannot be
        opened: the previous one stays in use)."""
        c = await self._running(container_id)
        with about(c.pod_id, c.container_id):
            await self._task(c.pod_id, "ReopenLog", {"task_id": c.container_id})
