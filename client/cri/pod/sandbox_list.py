"""ListPodSandbox: the pods, newest first, each a read-only entry (containerd's
sandbox_list.go)."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel

from shim.rpc.status import NotFound

from client.cri.pod.base import PodEntry, PodServiceBase, labels_match
from client.cri.store import PodRecord, PodState

#: The key that orders ListPodSandbox's entries (newest first).
_CREATED_AT = operator.itemgetter("created_at")


class SandboxList(PodServiceBase):
    """The pod service's sandbox list part (:class:`client.cri.pod.PodService` is all of them)."""

    async def list_pod_sandbox(self, filter: Mapping[str, Any] | None = None) -> list[PodEntry]:
        """ListPodSandbox: pods, newest first, filtered by ``id`` (prefix), ``state``
        (SANDBOX_READY / SANDBOX_NOTREADY) and ``label_selector`` (all must match). Each entry
        (id, metadata, state, created_at, labels, annotations, runtime_handler, ip, host_network)
        is a read-only :class:`PodEntry`."""
        f = filter or {}
        prefix, wanted, selector = f.get("id"), f.get("state"), f.get("label_selector")
        # Enum members bound once: each PodState.X costs a metaclass lookup, and these run per pod.
        creating, ready, current = PodState.CREATING, PodState.READY, self._current
        listed = self.store.list()
        # The store's list is a new one each time: used as it is, not copied.
        records = [r for r in listed if r.pod_id.startswith(prefix)] if prefix else listed
        removed: set[str] = set()  # by another process since the list was read
        # A followed pod's record is current (its shim's events keep it so); the pause of any
        # other ready pod is asked after, all at once.
        stale = [(i, r) for i, r in enumerate(records) if r.state is ready and r.pod_id not in current]

        async def refresh(i: int, record: PodRecord) -> None:
            try:
                records[i] = await self._refreshed(record)
            except NotFound:
                removed.add(record.pod_id)

        if stale:
            async with anyio.create_task_group() as tg:
                for i, record in stale:
                    tg.start_soon(refresh, i, record)
        entries, out = self._entries, []
        for record in records:
            if record.state is creating or record.pod_id in removed:
                continue
            kept = entries.get(record.pod_id)  # _entry_of's own first look, without a call per pod
            out.append(kept[1] if kept is not None and kept[0] is record else self._entry_of(record))
        if wanted or selector:
            out = [entry for entry in out if (not wanted or entry["state"] == wanted)
                   and (not selector or labels_match(entry["labels"], selector))]
        out.sort(key=_CREATED_AT, reverse=True)
        return out
