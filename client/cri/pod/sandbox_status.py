"""PodSandboxStatus, and where a ready pod's network is (for PortForward); a record is brought
up to date with its pause first (containerd's sandbox_status.go)."""

from __future__ import annotations

from typing import Any

from shim.cri.configs import PodSandboxConfig
from shim.rpc.status import FailedPrecondition, RpcError

from client.cri.cni import addresses_in_place
from client.cri.pod.base import POD_STATE, PodServiceBase, log, sandbox_snapshot_key
from client.cri.store import PodRecord, PodState


class SandboxStatus(PodServiceBase):
    """The pod service's sandbox status part (:class:`client.cri.pod.PodService` is all of them)."""

    async def pod_sandbox_status(self, pod_id: str, verbose: bool = False) -> dict[str, Any]:
        """PodSandboxStatus, CRI-shaped; ``verbose`` adds ``info`` (pid, netns, shim address, CNI)."""
        record = await self._refreshed(self._pod(pod_id))
        cfg = self._config_of(record)
        status = {
            "id": record.pod_id,
            "metadata": cfg.metadata.to_json(),
            "state": POD_STATE[record.state],
            "created_at": record.created_at,
            "network": {"ip": record.ip, "additional_ips": [{"ip": ip} for ip in record.additional_ips]},
            "linux": {"namespaces": {"options": {
                "network": cfg.namespace_options.network,
                "pid": cfg.namespace_options.pid,
                "ipc": cfg.namespace_options.ipc,
            }}},
            "labels": record.labels,
            "annotations": record.annotations,
            "runtime_handler": record.runtime_handler,
        }
        if verbose:
            status["info"] = await self._verbose_info(record, cfg)
        return status

    async def _verbose_info(self, record: PodRecord, cfg: PodSandboxConfig) -> dict[str, Any]:
        info: dict[str, Any] = {"pid": record.pid or 0, "netns_path": record.netns_path,
                                "sandbox_namespace": record.sandbox_namespace}
        if record.sandbox_image:  # containerd's "image": the sandbox image
            info.update(image=record.sandbox_image, image_id=record.sandbox_image_id,
                        snapshot_key=sandbox_snapshot_key(record.pod_id))
        try:
            await self._load(record.pod_id)
            st = await self.controller.status(self.namespace, record.pod_id, verbose=True)
            info.update(shim_address=st.address, sandbox_state=st.state, shim=dict(st.info))
        except RpcError as exc:
            info.update(shim_address="", sandbox_state="unknown", shim_error=str(exc))
        if cfg.host_network:
            info["network"] = "host network: no CNI"
        elif self.cni is None or (cni_config := self.cni.config()) is None:
            info["network"] = "no CNI config: the pod has a network namespace with loopback only"
        else:
            info["network"] = f"CNI network {cni_config.name!r}"
            info["cni_result"] = record.cni_result
            if record.state is PodState.READY:
                try:
                    await self.cni.check(record.pod_id, record.netns_path, prev_result=record.cni_result,
                                         runtime_config=cfg.cni_runtime_config())
                    info["cni_check"] = "ok"
                except RpcError as exc:
                    info["cni_check"] = await self._check_failed(record, exc)
        return info

    async def _check_failed(self, record: PodRecord, exc: RpcError) -> str:
        """What a failed CNI CHECK of a READY pod means: on a pod whose interface holds the
        addresses ADD gave it, a plugin that cannot CHECK (Debian's portmap 1.1.1 on IPv6), a
        WARNING and not an error; otherwise the error."""
        if not await addresses_in_place(record.netns_path, record.cni_result):
            return str(exc)
        log.warning("pod %s: %s; its network works (its interface has the addresses CNI ADD gave it), so the "
                    "plugin cannot CHECK it", record.pod_id, exc.message, extra={"pod_id": record.pod_id})
        return f"warning: {exc.message}; the pod's network works (its interface has the addresses CNI ADD gave it)"

    async def _refreshed(self, record: PodRecord) -> PodRecord:
        """The record, marked NOTREADY if its pause is no longer running. Raises NotFound if
        another process removed the pod meanwhile."""
        if record.state is not PodState.READY or record.pod_id in self._current:
            return record  # kept current by its shim's events (_follow)
        self._follow_soon(record.pod_id)
        if await self._sandbox_running(record) is False:
            return await self._mark_notready(record.pod_id) or self.store.get(record.pod_id)
        return record

    async def pod_network(self, pod_id: str) -> tuple[str, str]:
        """Where a READY pod's network is, for PortForward: its full id and the path of its network
        namespace, "" for a host-network pod (the host's). Raises NotFound, FailedPrecondition (not ready)."""
        record = await self._refreshed(self._pod(pod_id))
        if record.state is not PodState.READY:
            raise FailedPrecondition(f"pod {record.pod_id} is not ready (it is {record.state}): its network is gone")
        if self._config_of(record).host_network:
            return record.pod_id, ""
        return record.pod_id, record.netns_path
