"""CreateContainer: a task of the pod's shim, on a snapshot of its image, with the process,
mounts, devices and confinement its config makes (containerd's container_create.go)."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel

from shim.cri import security, signals
from shim.cri.configs import ContainerConfig, PodSandboxConfig
from shim.lib.podfiles import PodFiles
from shim.rpc.status import FailedPrecondition, InvalidArgument, NotFound

from client.cri import cdi
from client.cri.events import CONTAINER_CREATED
from client.cri.failpoints import failpoint
from client.cri.mounts import container_mounts
from client.cri.pod.base import POD_STATE, PodServiceBase, keep_newest, new_id
from client.cri.process import container_process
from client.cri.rootfs import ContainerImage, call, mount_dicts
from client.cri.store import ContainerRecord, PodRecord, PodState
from client.phases import phase

#: How many images' /etc/passwd and /etc/group are kept (by chain id), read once for the containers of each.
_USER_FILES_KEPT = 64


class ContainerCreate(PodServiceBase):
    """The pod service's container create part (:class:`client.cri.pod.PodService` is all of them)."""

    async def create_container(self, pod_id: str, config: ContainerConfig | Mapping[str, Any],
                               sandbox_config: PodSandboxConfig | Mapping[str, Any] | None = None) -> str:
        """CreateContainer in a READY pod; returns the container id.

        ``sandbox_config`` is CRI's copy of the pod's config, sent along by kubelet: when given,
        it must be the pod's (same metadata and log directory), since the pod's own config is
        what the container is made from. Raises NotFound (pod), FailedPrecondition (pod not
        READY), InvalidArgument (config, or a sandbox_config of another pod), AlreadyExists
        (same name and attempt in the pod).
        """
        cfg = config if isinstance(config, ContainerConfig) else ContainerConfig.from_json(config)
        pod = self._pod(pod_id)
        if sandbox_config is not None:
            _check_sandbox_config(pod, self._config_of(pod), sandbox_config)
        async with self._hold(pod.pod_id):
            with phase("pod"):
                pod = await self._refreshed(self.store.get(pod.pod_id))
            if pod.state is not PodState.READY:
                raise FailedPrecondition(f"pod {pod.pod_id} is not ready ({POD_STATE[pod.state]})")
            pod_cfg = self._config_of(pod)
            _check_pod_namespaces(cfg, pod_cfg)
            container_id = new_id()
            log_path = self._log_path(pod, cfg)
            with phase("image"):
                image = await self._container_image(cfg)
            process = container_process(cfg, image.config if image else None,
                                        hostname=pod_cfg.hostname or socket.gethostname())
            volume_ids = await self.image_volumes.resolve(cfg.mounts)
            with phase("user files"):
                read_file = await self._user_files(image)
            confinement = security.task_fields(cfg.security, pod_privileged=pod_cfg.security.privileged,
                                               read_file=read_file, image_user=process.image_user)
            devices = cdi.resolve(cfg.cdi_devices, self.cdi_spec_dirs)
            env = cdi.merge_env(process.env, devices.env)
            user = confinement["user"]
            user["additional_gids"] = sorted({*user["additional_gids"], *devices.additional_gids})
            for node in devices.devices:  # a CDI node is the container user's unless its spec says (as CDI's)
                for key in ("uid", "gid"):
                    if key not in node and user[key] > 0:
                        node[key] = user[key]
            # The record comes first: whatever is made for the container from here on (its
            # snapshot, its task) is found through it, by a rollback or after a crash.
            with phase("store add"):
                await self._stored(self.store.add_container, ContainerRecord(
                    container_id, pod.pod_id, cfg.to_json(), log_path=log_path,
                    image_id=image.image_id if image else "", image_ref=image.image_ref if image else "",
                    image_name=image.name if image else "", image_volumes=volume_ids, user=dict(user),
                    stop_signal=_stop_signal(cfg, image)))
            try:
                volumes, idmapped = await self.image_volumes.mount(
                    pod.pod_id, cfg.mounts, volume_ids,
                    pod.pid if pod_cfg.namespace_options.userns is not None else None)
                mounts = container_mounts(cfg.mounts, self._pod_files(pod.pod_id), readonly_rootfs=cfg.readonly_rootfs,
                                          image_sources=volumes, idmapped=idmapped)
                mounts += devices.mounts
                with phase("snapshot"):
                    rootfs = await self._prepare_rootfs(container_id, image)
                failpoint("create:after-rootfs")
                with phase("Task Create"):
                    await self._task(pod.pod_id, "Create", {
                        "task_id": container_id, "args": list(process.args), "env": env,
                        "cwd": process.cwd, "log_path": log_path, "pid_mode": cfg.pid_mode, "labels": dict(cfg.labels),
                        "pid_target": self._pid_target(pod.pod_id, cfg),
                        "rootfs": rootfs, "readonly_rootfs": cfg.readonly_rootfs, "mounts": mounts, "stdin": cfg.stdin,
                        "terminal": cfg.tty, "resources": cfg.shim_resources,
                        "devices": [device.to_json() for device in cfg.devices] + devices.devices,
                        "hooks": devices.hooks,
                        **confinement})
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await self._remove_rootfs(pod.pod_id, container_id)
                    await self._release_volumes(pod.pod_id, container_id, volume_ids.values())
                    await self._stored(self.store.delete_container, pod.pod_id, container_id)
                raise
        self._events.publish(CONTAINER_CREATED, container_id, pod.pod_id)
        self._lifecycle("container %s created", cfg.metadata.name, pod_id=pod.pod_id, container_id=container_id)
        return container_id

    def _log_path(self, pod: PodRecord, cfg: ContainerConfig) -> str:
        base = self._config_of(pod).log_directory or os.path.join(self.log_root, pod.pod_id)
        relative = cfg.log_path or f"{cfg.metadata.name}_{cfg.metadata.attempt}.log"
        path = os.path.normpath(os.path.join(base, relative))
        if os.path.commonpath([path, os.path.normpath(base)]) != os.path.normpath(base):
            raise InvalidArgument(f"log_path {relative!r} escapes the pod's log directory")
        # Below the pod's log directory (kubelet's, or ours), the log goes to its own path only:
        # a link there (made by whatever can write there) would send it, and the directories the
        # shim makes for it, anywhere on the node. The file itself the shim opens O_NOFOLLOW.
        parts = os.path.relpath(path, os.path.normpath(base)).split("/")[:-1]
        for i in range(len(parts)):
            directory = os.path.join(base, *parts[:i + 1])
            try:
                st = os.lstat(directory)
            except FileNotFoundError:
                break  # made by the shim, below what exists
            except OSError as exc:
                raise FailedPrecondition(f"log_path {relative!r}: cannot look at {directory}: {exc.strerror}") from None
            if stat.S_ISLNK(st.st_mode):
                raise InvalidArgument(f"log_path {relative!r} goes through a symbolic link in the pod's log directory "
                                      f"({directory}), which podshim does not follow for a log file")
        return path

    async def _container_image(self, cfg: ContainerConfig) -> ContainerImage | None:
        """The image the container names (None: it names none and runs on a root of its own, empty
        but for its mounts). NotFound when the store does not have it."""
        if not cfg.image:
            return None
        image: ContainerImage = await call(self.images.container_image, cfg.image)
        return image

    def _pid_target(self, pod_id: str, cfg: ContainerConfig) -> str | None:
        """The task whose pid namespace a TARGET container joins: its target, a container of the
        same pod (InvalidArgument otherwise, as containerd's validateTargetContainer)."""
        if cfg.pid_mode != "TARGET":
            return None
        try:
            target = self.store.find_container(cfg.target_id)
        except NotFound:
            target = None
        if target is None or target.pod_id != pod_id:
            raise InvalidArgument(f"target container {cfg.target_id!r} of pid mode TARGET is not a container "
                                  f"of pod {pod_id}")
        return target.container_id

    async def _user_files(self, image: ContainerImage | None) -> security.ReadFile:
        """``read_file`` for the container's /etc/passwd and /etc/group: its image's (read from
        the snapshotter once per chain of layers, which never changes: the pods of a Deployment
        start from one image), or the node's for a container without an image (whose root has none)."""
        if image is None or self.snapshots is None:
            return security.host_read_file
        files = self._user_files_of.get(image.chain_id)
        if files is None:
            files = {}
            for path in security.USER_FILES:
                try:
                    files[path] = await call(self.snapshots.read_file, image.chain_id, path)
                except FileNotFoundError:
                    files[path] = None
            keep_newest(self._user_files_of, image.chain_id, files, _USER_FILES_KEPT)
        return files.get

    def _pod_files(self, pod_id: str) -> dict[str, str]:
        """Container path → node path of the pod's hosts, resolv.conf and hostname; {} for a pod
        made before podshim wrote them."""
        return PodFiles(self._pod_files_dir(pod_id)).written()

    async def _prepare_rootfs(self, container_id: str, image: ContainerImage | None) -> list[dict[str, Any]]:
        """The container's root filesystem mounts: a writable snapshot of its image, keyed by the
        container's id; [] without an image (the shim binds the node's / read-only)."""
        if image is None:
            return []
        if self.snapshots is None:
            raise FailedPrecondition(f"image {image.name!r} is there but this runtime has no snapshotter to make "
                                     "a container's root filesystem from it")
        return mount_dicts(await call(self.snapshots.prepare, container_id, image.chain_id))


def _check_pod_namespaces(cfg: ContainerConfig, pod_cfg: PodSandboxConfig) -> None:
    """InvalidArgument unless the container's network and IPC modes are POD or the pod's own, and its
    user namespace is the pod's: a container always joins its pod's network, IPC and user namespaces
    (as with containerd)."""
    for what, mode, pods in (("network", cfg.network_mode, pod_cfg.namespace_options.network),
                             ("ipc", cfg.ipc_mode, pod_cfg.namespace_options.ipc)):
        if mode not in ("POD", pods):
            raise InvalidArgument(f"linux.security_context.namespace_options.{what} {mode} cannot be applied: a "
                                  f"container joins its pod's {what} namespace, and the pod's is {pods}")
    if cfg.userns is not None and cfg.userns != pod_cfg.namespace_options.userns:
        raise InvalidArgument("linux.security_context.namespace_options.userns_options cannot be applied: a container "
                              "joins its pod's user namespace, and its mappings are not the pod's")


def _check_sandbox_config(pod: PodRecord, own: PodSandboxConfig,
                          sandbox_config: PodSandboxConfig | Mapping[str, Any]) -> None:
    """InvalidArgument unless ``sandbox_config`` is ``own``, the config of ``pod`` (metadata, log directory)."""
    given = sandbox_config if isinstance(sandbox_config, PodSandboxConfig) else PodSandboxConfig.from_json(sandbox_config)
    if given.metadata.key != own.metadata.key:
        raise InvalidArgument(f"sandbox_config is for pod {given.metadata.key!r}, but pod {pod.pod_id} "
                              f"is {own.metadata.key!r}")
    if given.log_directory != own.log_directory:
        raise InvalidArgument(f"sandbox_config has log_directory {given.log_directory!r}, but pod {pod.pod_id} "
                              f"was run with {own.log_directory!r}")


def _stop_signal(cfg: ContainerConfig, image: ContainerImage | None) -> int:
    """The signal StopContainer sends first: the config's, else the image's StopSignal, else the
    default (containerd's order). InvalidArgument when the image's names no signal."""
    if cfg.stop_signal is not None:
        return cfg.stop_signal
    named = (image.config.get("StopSignal") if image is not None else None) or ""
    if not named:
        return int(signals.DEFAULT_STOP)
    try:
        return signals.from_image(named)
    except ValueError as exc:
        raise InvalidArgument(f"image {image.name if image else ''}: {exc}") from None
