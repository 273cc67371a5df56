"""ContainerStatus, and how a container's record is brought up to date with its task
(containerd's container_status.go)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from shim.cri import security, signals
from shim.rpc.status import NotFound, Unavailable

from client.cri.imagevolumes import mount_status
from client.cri.pod.base import NO_IMAGE, UNKNOWN_EXIT_CODE, PodServiceBase
from client.cri.store import ContainerRecord, ContainerState

#: The record state of each task status the shim reports (shim.sandbox.tasks.Status values).
_TASK_STATE = {"created": ContainerState.CREATED, "running": ContainerState.RUNNING,
               "stopped": ContainerState.EXITED}


class ContainerStatus(PodServiceBase):
    """The pod service's container status part (:class:`client.cri.pod.PodService` is all of them)."""

    async def pod_container_statuses(self, pod_id: str) -> list[dict[str, Any]]:
        """ContainerStatus of every container of the pod ``pod_id`` (its full id), oldest first;
        a container removed meanwhile is left out. Raises NotFound if the pod is not there."""
        statuses = []
        for c in self.store.list_containers(pod_id):
            try:
                statuses.append(await self.container_status(c.container_id))
            except NotFound:
                continue
        return statuses

    async def container_status(self, container_id: str, verbose: bool = False) -> dict[str, Any]:
        """ContainerStatus, CRI-shaped."""
        c = await self._refresh_container(self._container(container_id))
        cfg = self._container_config_of(c)
        status = {
            "id": c.container_id,
            "pod_sandbox_id": c.pod_id,
            "metadata": dict(c.config.get("metadata") or {}),
            "state": f"CONTAINER_{c.state}",
            "created_at": c.created_at,
            "started_at": c.started_at,
            "finished_at": c.finished_at,
            "exit_code": c.exit_code if c.exit_code is not None else 0,
            "image": {"image": c.image_name or cfg.image or NO_IMAGE},
            "image_ref": c.image_ref or NO_IMAGE,
            "reason": c.reason,
            "message": c.message,
            "labels": c.labels,
            "annotations": c.annotations,
            "log_path": c.log_path,
            "image_id": c.image_id or None,
            "stop_signal": signals.to_cri(c.stop_signal),
            "mounts": [mount_status(m, c.image_volumes) for m in cfg.mounts],
            # What the container has now: as created, then as UpdateContainerResources changed it
            # (kubelet reads it back for in-place resize; without it kubelet reports what it asked).
            "resources": {"linux": {**cfg.resources, **c.resources}},
        }
        user = security.process_user(c.pid) if c.state is ContainerState.RUNNING and c.pid else None
        if user is None and c.user is not None:  # no process (yet, or any more): the ids it is given
            user = security.user_status(c.user["uid"], c.user["gid"], list(c.user.get("additional_gids") or ()))
        if user is not None:
            status["user"] = user
        if verbose:
            status["info"] = {"pid": c.pid or 0, "args": list(cfg.argv), "pid_mode": cfg.pid_mode,
                              "image_id": c.image_id, "snapshot_key": c.container_id if c.image_id else ""}
        return status

    def container_log_path(self, container_id: str) -> str:
        """Where a container's CRI-format log is."""
        return self._container(container_id).log_path

    async def _refresh_container(self, c: ContainerRecord) -> ContainerRecord:
        """Bring the record up to date with the shim (a container may have exited on its own)."""
        if c.state is ContainerState.EXITED or c.pod_id in self._current:
            return c  # an exit of a followed pod's container is in its record already (_follow)
        return await self._ask_container(c)

    async def _ask_container(self, c: ContainerRecord) -> ContainerRecord:
        if c.state is ContainerState.EXITED:
            return c
        try:
            st = await self._task_call(await self._shim(c.pod_id), c.pod_id, "State", {"task_id": c.container_id})
        except Unavailable:
            return await self._shim_gone(c)
        except NotFound:
            if c.state is ContainerState.CREATED:
                # A live shim without the task: its CreateContainer has not made it yet (in flight
                # here or in another process), or died before it did (recovery removes the record).
                return c
            return await self._stored(self.store.update_container, c.pod_id, c.container_id,
                                      state=ContainerState.EXITED, exit_code=UNKNOWN_EXIT_CODE,
                                      finished_at=c.finished_at or time.time_ns(), reason="Unknown",
                                      message="its task is gone from the pod's shim")
        state = _TASK_STATE.get(st.get("status"), c.state)
        if state is c.state:
            return c
        if state is ContainerState.EXITED:
            return await self._exited(c, st)
        return await self._stored(self.store.update_container, c.pod_id, c.container_id, state=state,
                                  pid=st.get("pid"), started_at=st.get("started_at") or c.started_at)

    async def _exited(self, c: ContainerRecord, done: Mapping[str, Any]) -> ContainerRecord:
        """The container EXITED as the shim's exit (Wait, State or ``/tasks/exit``) says."""
        code = done.get("exit_status", UNKNOWN_EXIT_CODE)
        reason = exit_reason(code, done.get("oom_killed") is True)
        exited = await self._stored(self.store.update_container, c.pod_id, c.container_id,
                                    state=ContainerState.EXITED, exit_code=code,
                                    finished_at=done.get("exited_at") or time.time_ns(), reason=reason)
        self._lifecycle("container exited with status %s (%s)", code, reason, pod_id=c.pod_id,
                        container_id=c.container_id)
        return exited

    async def _shim_gone(self, c: ContainerRecord) -> ContainerRecord:
        return await self._stored(self.store.update_container, c.pod_id, c.container_id, state=ContainerState.EXITED,
                                  exit_code=UNKNOWN_EXIT_CODE, finished_at=c.finished_at or time.time_ns(),
                                  reason="Unknown", message="the pod's shim is gone")


def exit_reason(exit_code: int, oom_killed: bool) -> str:
    """ContainerStatus's ``reason`` for an exit, as containerd gives it: ``OOMKilled`` when the
    shim says the kernel's OOM killer killed a process of the container (its cgroup's count, not
    a guess from the exit code), else ``Completed`` (0) or ``Error``."""
    if oom_killed:
        return "OOMKilled"
    return "Completed" if exit_code == 0 else "Error"
