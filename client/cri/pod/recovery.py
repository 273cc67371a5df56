"""Recovery at start: pods a crash left half-made rolled back, containers a dead create left
removed, every pod reconciled with its shim, snapshots nothing names swept."""

from __future__ import annotations

import re

import anyio
import anyio.abc
import anyio.lowlevel

from shim.rpc.status import NotFound, RpcError

from client.cri.pod.base import SANDBOX_SNAPSHOT_PREFIX, PodServiceBase, log
from client.cri.rootfs import call
from client.cri.store import ContainerState, PodRecord, PodState

#: A pod's or container's id (:func:`client.cri.pod.base.new_id`); a snapshot key of this form is a container's.
_ID = re.compile(r"[0-9a-f]{64}")


class Recovery(PodServiceBase):
    """The pod service's recovery part (:class:`client.cri.pod.PodService` is all of them)."""

    async def recover(self) -> None:
        """Roll back pods a crash left half-made; reconcile READY pods with their shims.

        A CREATING pod whose RunPodSandbox is still running, here or in another process, is
        left alone (its lock is held); see :meth:`PodStore.claim_incomplete`.
        """
        for record in self.store.list():
            if record.state is not PodState.CREATING:
                continue
            lock = self.store.claim_incomplete(record.pod_id)
            if lock is None:
                continue
            try:
                log.warning("pod %s was being created by a process that died; rolling it back", record.pod_id)
                await self._rollback(self.store.get(record.pod_id))
            except RpcError as exc:  # the record stays CREATING: the next recovery tries again
                log.warning("pod %s: rolling it back failed: %s", record.pod_id, exc)
            finally:
                lock.release()
        # Every pod is reconciled with its shim (a pause or container may have exited while no
        # process followed it) before this returns, all at once; from then on the shims' events
        # keep the records current.
        async with anyio.create_task_group() as tg:
            for record in self.store.list():
                if record.state is not PodState.CREATING:
                    tg.start_soon(self._drop_unmade_then_follow, record)
        await self._sweep_snapshots()
        await self._sweep_image_volumes()

    async def _drop_unmade_then_follow(self, record: PodRecord) -> None:
        """Remove the containers a CreateContainer that died left: CREATED records whose task the
        pod's live shim does not have, while nobody holds the pod (a create in flight holds its
        lock from before the record until the task is made). Then follow the pod's shim."""
        unmade = [c for c in record.containers.values() if c.state is ContainerState.CREATED]
        lock = self.store.lock_pod(record.pod_id) if unmade else None
        if lock is not None and lock.try_acquire():
            try:
                shim = await self._shim(record.pod_id)
                for c in unmade:
                    try:
                        await self._task_call(shim, record.pod_id, "State", {"task_id": c.container_id})
                    except NotFound:
                        log.warning("container %s was being created by a process that died before its task was "
                                    "made; removing it", c.container_id,
                                    extra={"pod_id": record.pod_id, "container_id": c.container_id})
                        await self._remove_rootfs(record.pod_id, c.container_id)
                        await self._release_volumes(record.pod_id, c.container_id, c.image_volumes.values())
                        await self._stored(self.store.delete_container, record.pod_id, c.container_id)
            except RpcError:
                pass  # no live shim (or it does not answer): the records are judged when it is followed
            finally:
                lock.release()
        await self._start_following(record.pod_id)

    async def _sweep_snapshots(self) -> None:
        """Remove container snapshots that no container record names, and sandbox image snapshots
        (``sandbox-<pod id>``) that no pod record names: what a process that died between removing
        a record and its snapshot left (a record is written before its snapshot is made and
        deleted after it is removed, so the snapshots are listed first: one listed there whose
        record is not read after it is a leftover, never a create in flight)."""
        if self.snapshots is None or not hasattr(self.snapshots, "snapshots"):
            return
        try:
            snapshots = await call(self.snapshots.snapshots)
        except Exception as exc:  # noqa: BLE001 (recovery goes on; the next start tries again)
            log.warning("cannot list the container snapshots: %s", exc)
            return
        known = {c.container_id for c in self.store.list_containers()}
        pods = {record.pod_id for record in self.store.list()}
        for snapshot in snapshots:
            if snapshot.kind != "active":
                continue
            if _ID.fullmatch(snapshot.name) and snapshot.name not in known:
                log.warning("removing the snapshot of container %s, which no pod has any more", snapshot.name)
                await self._remove_rootfs("-", snapshot.name)
            pod_id = snapshot.name.removeprefix(SANDBOX_SNAPSHOT_PREFIX)
            if pod_id != snapshot.name and _ID.fullmatch(pod_id) and pod_id not in pods:
                log.warning("removing the sandbox image snapshot of pod %s, which is no more", pod_id)
                await self._remove_rootfs(pod_id, snapshot.name)

    async def _sweep_image_volumes(self) -> None:
        """Release the image volumes no container record names (listed before the records are
        read, as :meth:`_sweep_snapshots` lists the snapshots)."""
        try:
            found = await self.image_volumes.listed()
        except (OSError, RpcError) as exc:
            log.warning("cannot list the image volumes: %s", exc)
            return
        in_use = {(c.pod_id, image_id.partition(":")[2]) for c in self.store.list_containers()
                  for image_id in c.image_volumes.values()}
        await self.image_volumes.sweep(found, in_use)
