"""ListContainers (containerd's container_list.go)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shim.rpc.status import Aborted, NotFound

from client.cri.pod.base import NO_IMAGE, PodServiceBase, labels_match


class ContainerList(PodServiceBase):
    """The pod service's container list part (:class:`client.cri.pod.PodService` is all of them)."""

    async def list_containers(self, filter: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """ListContainers, filtered by ``id`` (prefix), ``pod_sandbox_id`` (prefix), ``state``
        (CONTAINER_CREATED / RUNNING / EXITED) and ``label_selector``."""
        f = dict(filter or {})
        out: list[dict[str, Any]] = []
        for c in self.store.list_containers():
            if f.get("id") and not c.container_id.startswith(f["id"]):
                continue
            if f.get("pod_sandbox_id") and not c.pod_id.startswith(f["pod_sandbox_id"]):
                continue
            try:
                c = await self._refresh_container(c)
            except Aborted:
                pass  # another process holds its pod's sandbox right now: listed as last recorded
            except NotFound:
                continue  # removed by another process since the list was read
            if f.get("state") and f"CONTAINER_{c.state}" != f["state"]:
                continue
            if not labels_match(c.labels, f.get("label_selector")):
                continue
            out.append({"id": c.container_id, "pod_sandbox_id": c.pod_id,
                        "metadata": dict(c.config.get("metadata") or {}), "image": {"image": (c.config.get("image") or {}).get("image") or NO_IMAGE},
                        "image_ref": c.image_id or NO_IMAGE, "image_id": c.image_id or None,
                        "state": f"CONTAINER_{c.state}",
                        "created_at": c.created_at, "labels": c.labels, "annotations": c.annotations,
                        "exit_code": c.exit_code})
        out.sort(key=lambda c: c["created_at"], reverse=True)
        return out
