"""Image volumes: a container's mount of an image (CRI ``Mount.image``), its files read-only.

As containerd 2's CRI plugin (``mutateImageMount``): the image must be in the store (kubelet pulls
it per its pull policy before CreateContainer and sends its id); a pod gets one volume per image,
a read-only view of the image's unpacked layers (:meth:`client.images.snapshots.Snapshotter.view`,
snapshot ``imagevolume-<pod id>-<image id hex>``) mounted on the node at
``<state root>/image-volumes/<pod id>/<image id hex>``, and each container binds it (or its
directory ``image_sub_path``, resolved inside the image: never out of it through ``..`` or a
symbolic link) read-only at its ``container_path``. In a pod with a user namespace, as containerd
2 does, the view's layers are id-mapped with the pod's mappings (:func:`shim.lib.rootfs.mount_rootfs`,
as a rootfs's lower layers are), so the image's files show their owners as in the image inside
the pod; a one-layer view (a bind) is id-mapped by the shim as any bind is. Unlike containerd, which keeps a pod's volumes
until the pod goes, a volume is released (unmounted, its snapshot removed) when the last container
of the pod that uses it is removed.

Who uses a volume is in the container records (``ContainerRecord.image_volumes``: container path →
image id), written before the volume is made and deleted after it is released, so after a restart
:meth:`ImageVolumes.sweep` releases exactly the volumes that no record names. Every method that
changes a pod's volumes runs under the pod's lock.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import anyio

from shim.cri.configs import Mount
from shim.lib.files import ensure_private_dir
from shim.lib.idmaps import IdMap
from shim.lib.rootfs import is_mount_point, mount_rootfs, open_in_root, parse_rootfs, root_needs_idmap, unmount_rootfs
from shim.rpc.status import FailedPrecondition, InvalidArgument, RpcError

from client.cri.rootfs import ImageLookup, Snapshotter, call, mount_dicts

__all__ = ["SNAPSHOT_PREFIX", "VOLUMES_DIR", "ImageVolumes", "mount_status"]

#: The directory of the state root the volumes are mounted under, one directory per pod.
VOLUMES_DIR = "image-volumes"
#: The key of a volume's snapshot: ``imagevolume-<pod id>-<image id hex>``.
SNAPSHOT_PREFIX = "imagevolume-"

log = logging.getLogger(__name__)


def _hex(image_id: str) -> str:
    return image_id.partition(":")[2] or image_id


class ImageVolumes:
    """A node's image volumes, under ``root`` (``<state root>/image-volumes``), of images found
    through ``images`` and viewed through ``snapshots``."""

    def __init__(self, root: str, images: ImageLookup, snapshots: Snapshotter | None):
        self.root = root
        self.images = images
        self.snapshots = snapshots

    def _target(self, pod_id: str, image_id: str) -> str:
        return os.path.join(self.root, pod_id, _hex(image_id))

    @staticmethod
    def _key(pod_id: str, image_id: str) -> str:
        return f"{SNAPSHOT_PREFIX}{pod_id}-{_hex(image_id)}"

    async def resolve(self, mounts: Sequence[Mount]) -> dict[str, str]:
        """The image id of each image volume of ``mounts`` (container path → id); NotFound, with
        a sentence, for an image that is not in the store."""
        ids = {}
        for mount in mounts:
            if mount.image_reference:
                image = await call(self.images.container_image, mount.image_reference)
                ids[mount.container_path] = image.image_id
        return ids

    async def mount(self, pod_id: str, mounts: Sequence[Mount], image_ids: Mapping[str, str],
                    userns_pid: int | None = None) -> tuple[dict[str, str], set[str]]:
        """Mount the pod's volume of each image in ``image_ids`` (from :meth:`resolve`) unless it is
        mounted already; ``userns_pid`` is the pod's pause when the pod has a user namespace, whose
        mappings a volume's layers are id-mapped with. Returns what each container path binds (the
        node path the shim binds) and the container paths whose source is id-mapped already (an
        overlay of id-mapped layers, which the shim binds as it is). InvalidArgument for an
        ``image_sub_path`` that is not a directory of the image; FailedPrecondition when the
        volume cannot be made (what this call mounted is released again)."""
        if image_ids and self.snapshots is None:
            raise FailedPrecondition("this runtime has no snapshotter to make an image volume from")
        sources: dict[str, str] = {}
        idmapped: set[str] = set()
        made: list[str] = []
        try:
            for mount in mounts:
                image_id = image_ids.get(mount.container_path)
                if image_id is None:
                    continue
                target = self._target(pod_id, image_id)
                if not await anyio.to_thread.run_sync(is_mount_point, target):
                    image = await call(self.images.container_image, image_id)
                    await self._make(pod_id, image_id, image.chain_id, userns_pid)
                    made.append(image_id)
                sources[mount.container_path] = await anyio.to_thread.run_sync(
                    _sub_path, target, mount.image_sub_path, mount.image_reference)
                if userns_pid is not None and not await anyio.to_thread.run_sync(root_needs_idmap, target):
                    idmapped.add(mount.container_path)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.release(pod_id, made)
            raise
        return sources, idmapped

    async def _make(self, pod_id: str, image_id: str, chain_id: str, userns_pid: int | None) -> None:
        assert self.snapshots is not None
        key = self._key(pod_id, image_id)
        await call(self.snapshots.remove, key)  # a leftover of a volume that was not mounted to the end
        mounts = mount_dicts(await call(self.snapshots.view, key, chain_id))
        target = self._target(pod_id, image_id)

        def attach() -> None:
            ensure_private_dir(self.root, 0o700)
            ensure_private_dir(os.path.dirname(target), 0o700)
            idmap = IdMap.of_process(userns_pid) if userns_pid is not None else None
            if userns_pid is not None and idmap is None:
                raise FailedPrecondition(f"the pod's pause ({userns_pid}) is not in a user namespace")
            try:
                mount_rootfs(parse_rootfs({"rootfs": mounts}), target, idmap)
            finally:
                if idmap is not None:
                    idmap.close()

        try:
            await anyio.to_thread.run_sync(attach)
        except (OSError, RpcError) as exc:
            await call(self.snapshots.remove, key)
            reason = exc.message if isinstance(exc, RpcError) else exc.strerror
            raise FailedPrecondition(f"cannot mount the image volume of image {image_id} on {target}: "
                                     f"{reason}") from None

    async def release(self, pod_id: str, image_ids: Iterable[str]) -> None:
        """Unmount the pod's volumes of ``image_ids`` and remove their snapshots (none there: no
        error), and the pod's directory once empty. A failure is logged, not raised: :meth:`sweep`
        tries again at the next start."""
        for image_id in image_ids:
            target = self._target(pod_id, image_id)
            try:
                await anyio.to_thread.run_sync(unmount_rootfs, target)
                if self.snapshots is not None:
                    await call(self.snapshots.remove, self._key(pod_id, image_id))
            except (OSError, RpcError) as exc:
                log.warning("pod %s: releasing the image volume of image %s failed: %s", pod_id, image_id, exc)

    async def sweep(self, found: Collection[tuple[str, str]], in_use: Collection[tuple[str, str]]) -> None:
        """Release each volume of ``found`` (:meth:`listed`) that ``in_use`` (pod id, image id hex:
        what the container records name) does not: what a process that died between a container's
        removal and its volume's release left. ``found`` is listed before the records are read, so
        that a create in flight, whose record comes first, is never taken for a leftover."""
        for pod_id, image_hex in sorted(set(found) - set(in_use)):
            log.warning("releasing the image volume of image %s in pod %s, which no container uses any more",
                        image_hex, pod_id)
            await self.release(pod_id, [image_hex])

    async def listed(self) -> set[tuple[str, str]]:
        """Every volume there is, as (pod id, image id hex): mounted directories and snapshots."""
        found: set[tuple[str, str]] = set()
        try:
            pods = os.listdir(self.root)
        except FileNotFoundError:
            pods = []
        for pod in pods:
            try:
                found |= {(pod, name) for name in os.listdir(os.path.join(self.root, pod))}
            except NotADirectoryError:
                continue
        if self.snapshots is not None and hasattr(self.snapshots, "snapshots"):
            for snapshot in await call(self.snapshots.snapshots):
                pod, sep, image = snapshot.name.removeprefix(SNAPSHOT_PREFIX).rpartition("-")
                if snapshot.kind == "active" and snapshot.name.startswith(SNAPSHOT_PREFIX) and sep:
                    found.add((pod, image))
        return found


def _sub_path(target: str, sub_path: str, reference: str) -> str:
    """The node path of ``sub_path`` inside the mounted image root ``target`` (the root for ""),
    resolved inside it: InvalidArgument, with a sentence, when it is missing or not a directory."""
    if not sub_path:
        return target
    root = os.open(target, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    resolved: list[str] = []
    try:
        fd = open_in_root(root, sub_path, resolved=resolved)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return target  # resolves to the image's root itself
        reason = "does not exist" if exc.errno in (errno.ENOENT, errno.ENOTDIR) else exc.strerror
        raise InvalidArgument(f"image_sub_path {sub_path!r} of image volume {reference!r} {reason} in the "
                              "image") from None
    finally:
        os.close(root)
    try:
        is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
    finally:
        os.close(fd)
    if not is_dir:
        raise InvalidArgument(f"image_sub_path {sub_path!r} of image volume {reference!r} is not a directory of "
                              "the image: only a directory can be mounted")
    return os.path.join(target, *resolved)


def mount_status(mount: Mount, image_volumes: Mapping[str, str]) -> dict[str, Any]:
    """A container's mount as ContainerStatus shows it; an image volume with its ImageSpec as
    given and ``image_ref`` the id of the image mounted (``image_volumes``: container path → id),
    what PullImage answered for it."""
    status: dict[str, Any] = {"container_path": mount.container_path, "host_path": mount.host_path,
                              "readonly": mount.readonly, "selinux_relabel": mount.selinux_relabel,
                              "propagation": mount.propagation, "recursive_read_only": mount.recursive_read_only}
    if mount.image_reference:
        status["image"] = {**mount.image, "image_ref": image_volumes.get(mount.container_path, "")}
        status["image_sub_path"] = mount.image_sub_path
    return status
