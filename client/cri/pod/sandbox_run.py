"""RunPodSandbox: record the pod, create and start its sandbox, set its network up; every
step rolled back when one fails (containerd's sandbox_run.go)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel

from shim.api.handlers import NATIVE  # "native" (the default, also for ""), "runc", "crun"
from shim.cri import security
from shim.cri.configs import PodSandboxConfig
from shim.lib.podfiles import remove_pod_files, write_pod_files
from shim.rpc.status import FailedPrecondition, Internal, InvalidArgument, NotFound, RpcError

from client.cri.cni import primary_ip
from client.cri.concurrency import together
from client.cri.failpoints import failpoint
from client.cri.logcontext import about
from client.cri.pod.base import PodServiceBase, log, new_id, sandbox_snapshot_key
from client.cri.rootfs import ContainerImage, call, mount_dicts
from client.cri.store import PodRecord, PodState
from client.phases import phase


class SandboxRun(PodServiceBase):
    """The pod service's sandbox run part (:class:`client.cri.pod.PodService` is all of them)."""

    async def run_pod_sandbox(self, config: PodSandboxConfig | Mapping[str, Any],
                              runtime_handler: str | None = None) -> str:
        """RunPodSandbox: make, start and network a pod; return its id.

        Raises InvalidArgument (bad config, unknown runtime handler), AlreadyExists (a pod with
        the same name, namespace, uid and attempt), or the error of the step that failed, after
        rolling back everything done before it.
        """
        cfg = config if isinstance(config, PodSandboxConfig) else PodSandboxConfig.from_json(config)
        pause = security.pause_fields(cfg.security)  # refuses what cannot be honoured (AppArmor, ...) up front
        handler = runtime_handler or self.default_runtime_handler
        if handler not in self.runtime_handlers:
            raise InvalidArgument(f"runtime handler {handler!r} is not configured "
                                  f"(configured: {', '.join(self.runtime_handlers)})")
        pod_id = new_id()
        # The pod's lock is held from before its CREATING record exists until it is READY or
        # gone: a CREATING record whose lock is free is what a crash leaves, for recovery.
        async with self._hold(pod_id), about(pod_id):
            with phase("store create"):
                record = await self._stored(self.store.create, PodRecord(
                    pod_id, cfg.to_json(), handler, PodState.CREATING, sandbox_namespace=self.namespace))
            failpoint("run:after-record")
            try:
                await self._bring_up(record, cfg, pause)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await self._rollback(self.store.get(pod_id))
                raise
        with phase("events"):
            await self._pod_ready(pod_id)
            await self._start_following(pod_id)
        self._lifecycle("pod sandbox ready (runtime handler %s)", handler, pod_id=pod_id)
        return pod_id

    async def _bring_up(self, record: PodRecord, cfg: PodSandboxConfig, pause: dict[str, Any]) -> None:
        ns, pod_id = self.namespace, record.pod_id
        options = self._shim_options(cfg, record.runtime_handler, pause)
        rootfs = await self._sandbox_rootfs(pod_id, cfg, options) if self.sandbox_image else None
        await self.controller.create(ns, pod_id, options=options, rootfs=rootfs, annotations=dict(cfg.annotations))
        failpoint("run:after-create")
        netns = ""
        if not cfg.host_network:  # CreateSandbox made it (the pause joins it when it starts)
            with phase("SandboxStatus"):
                status = await self.controller.status(ns, pod_id, verbose=True)
            netns = status.info.get("netns_path", "")
            # Recorded before any plugin runs: a crash from here on leaves a record whose
            # rollback DELs the network in the right namespace.
            with phase("store update"):
                await self._stored(self.store.update, pod_id, netns_path=netns)
        # The pause starts while the plugins set the network up, as the network needs only the
        # namespace (containerd sets it up before it starts the sandbox at all). Either failing
        # cancels the other; the caller's rollback undoes both (CniRunner.add undoes its own part).
        started: list[Any] = []
        network: list[Any] = []

        async def start() -> None:
            with phase("StartSandbox"):
                started.append(await self.controller.start(ns, pod_id))
            failpoint("run:after-start")

        async def add_network() -> None:
            if not cfg.host_network and self.cni is not None:
                with phase("cni add"):
                    network.append(await self.cni.add(pod_id, netns, runtime_config=cfg.cni_runtime_config()))

        await together(start, add_network)
        failpoint("run:after-network")
        ip, raw = "", None
        extra: tuple[str, ...] = ()
        if network:
            ip, extra = primary_ip(network[0])
            raw = network[0].raw
        try:
            write_pod_files(self._pod_files_dir(pod_id), cfg, (ip, *extra) if ip else extra)
        except OSError as exc:
            raise Internal(f"cannot write the pod's hosts, resolv.conf and hostname files: {exc}") from None
        with phase("store update"):
            await self._stored(self.store.update, pod_id, state=PodState.READY, pid=started[0].pid, cni_result=raw,
                               ip=ip, additional_ips=tuple(extra))
        failpoint("run:after-ready")

    def _shim_options(self, cfg: PodSandboxConfig, handler: str, pause: dict[str, Any]) -> dict[str, Any]:
        """CreateSandbox's options: the config's, the runtime handler's and ``pause``, the pause's
        confinement (:func:`shim.cri.security.pause_fields`)."""
        options = {**cfg.to_shim_options(), "runtime_handler": handler}
        options["linux"] = {**options["linux"], "pause_process": pause}
        if not cfg.cgroup_parent and self.cgroup_parent:
            options["linux"] = {**options["linux"], "cgroup_parent": self.cgroup_parent}
        if cfg.shim_pod_resources:
            # The pod's own resources, as UpdatePodSandboxResources writes them: the pod's cgroup's
            # from its start (under the systemd driver its scope's properties from the first).
            options["linux"] = {**options["linux"], "resources": cfg.shim_pod_resources}
        if self.cgroup_driver != "cgroupfs":
            options["linux"] = {**options["linux"], "cgroup_driver": self.cgroup_driver}
        if handler == NATIVE and self.pause_binary is not None:
            options["pause_binary"] = self.pause_binary
        return options

    async def _sandbox_rootfs(self, pod_id: str, cfg: PodSandboxConfig, options: dict[str, Any]) -> list[dict[str, Any]]:
        """The pause from the sandbox image: the image (pulled when missing) recorded on the pod,
        ``options`` given its ``pause_image`` (Entrypoint + Cmd, Env, WorkingDir) and its User
        (unless the pod names one), and the mounts of its snapshot ``sandbox-<pod id>``. Raises
        the pull's errors, FailedPrecondition for an image without a program or without a
        snapshotter to run it from."""
        image = await self._sandbox_image()
        if self.snapshots is None:
            raise FailedPrecondition(f"sandbox image {self.sandbox_image!r} cannot run: this runtime has no "
                                     "snapshotter")
        args = [*(image.config.get("Entrypoint") or []), *(image.config.get("Cmd") or [])]
        if not args:
            raise FailedPrecondition(f"sandbox image {self.sandbox_image!r} has neither Entrypoint nor Cmd: "
                                     "it names no pause program")
        options.pop("pause_binary", None)  # the image's program is the pause
        options["pause_image"] = {"args": args, "env": list(image.config.get("Env") or []),
                                  "cwd": image.config.get("WorkingDir") or "/", "image": image.name}
        user = str(image.config.get("User") or "")
        if user:  # only the user changes: the rest of the pause's confinement stands (_shim_options)
            pause = {**options["linux"]["pause_process"],
                     "user": security.pause_user(cfg.security, user, await self._user_files(image))}
            options["linux"] = {**options["linux"], "pause_process": pause}
        # Recorded before the snapshot is made: a rollback, RemoveImage and GC see it from then on.
        with phase("store update"):
            await self._stored(self.store.update, pod_id, sandbox_image=image.name, sandbox_image_id=image.image_id)
        with phase("sandbox snapshot"):
            mounts = mount_dicts(await call(self.snapshots.prepare, sandbox_snapshot_key(pod_id), image.chain_id))
        failpoint("run:after-sandbox-snapshot")
        return mounts

    async def _sandbox_image(self) -> ContainerImage:
        """The sandbox image from the store, pulled first when the store lacks it (as containerd
        pulls its sandbox_image on demand); the pull's errors as they are."""
        image: ContainerImage
        try:
            image = await call(self.images.container_image, self.sandbox_image)
            return image
        except NotFound:
            if self.pull is None:
                raise
        with phase("pull sandbox image"):
            await self.pull(self.sandbox_image)
        image = await call(self.images.container_image, self.sandbox_image)
        return image

    async def _rollback(self, record: PodRecord) -> None:
        """Undo whatever of a pod exists; every step tolerates what is already gone."""
        await self._teardown_network(record, strict=False)
        await self._shutdown_sandbox(record.pod_id)
        await self._remove_sandbox_rootfs(record)
        remove_pod_files(self._pod_files_dir(record.pod_id))
        await self._stored(self.store.delete, record.pod_id)

    async def _teardown_network(self, record: PodRecord, *, strict: bool) -> None:
        cfg = self._config_of(record)
        if self.cni is None or cfg.host_network:
            return
        try:  # a netns that is gone is fine: CNI DEL is told so (CniRunner.delete)
            await self.cni.delete(record.pod_id, record.netns_path, prev_result=record.cni_result,
                                  runtime_config=cfg.cni_runtime_config())
        except RpcError as exc:
            if strict:
                raise
            log.warning("pod %s: CNI DEL failed during rollback: %s", record.pod_id, exc)

    async def _shutdown_sandbox(self, pod_id: str) -> None:
        await self._load(pod_id)  # NotFound must mean gone, not "made by another process"
        try:
            await self.controller.shutdown(self.namespace, pod_id)
        except NotFound:
            pass
