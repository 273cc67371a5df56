"""CRI protobuf messages to the pod layer's types and back; no semantics here.

A request's config is read by the shared CRI layer (:mod:`shim.cri.requests`, which containerd's
CreateSandbox on the shim uses too); a list request's filter here. Results go back from the pod
layer's CRI-shaped dicts with ``json_format.ParseDict``, field by field as the proto names them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.message import Message

from shim.cri.api import api_pb2

from client.cri.pod import PodEntry, keep_newest

_M = TypeVar("_M", bound=Message)
_Labelled = TypeVar("_Labelled", api_pb2.PodSandbox, api_pb2.Container)

__all__ = [
    "pod_sandbox_filter", "container_filter",
    "pod_sandbox_status", "pod_sandbox", "PodSandboxes", "container_status", "container", "verbose_info",
]

# The fields of each message the pod layer's dicts fill (the rest stay at their zero values).
_POD_SANDBOX_STATUS = ("id", "metadata", "state", "created_at", "network", "linux", "labels", "annotations",
                       "runtime_handler")
_POD_METADATA = ("name", "uid", "namespace", "attempt")
_CONTAINER_STATUS = ("id", "metadata", "state", "created_at", "started_at", "finished_at", "exit_code", "image",
                     "image_ref", "reason", "message", "labels", "annotations", "log_path", "mounts", "image_id",
                     "stop_signal", "user", "resources")
_CONTAINER_METADATA = ("name", "attempt")


def pod_sandbox_filter(request: api_pb2.ListPodSandboxRequest | api_pb2.StreamPodSandboxesRequest) -> dict[str, Any]:
    """The pod layer's filter of a ListPodSandbox or StreamPodSandboxes request (unset fields match
    everything)."""
    f = request.filter
    return {"id": f.id or None,
            "state": api_pb2.PodSandboxState.Name(f.state.state) if f.HasField("state") else None,
            "label_selector": dict(f.label_selector)}


def container_filter(request: api_pb2.ListContainersRequest | api_pb2.StreamContainersRequest) -> dict[str, Any]:
    """The pod layer's filter of a ListContainers or StreamContainers request (unset fields match
    everything)."""
    f = request.filter
    return {"id": f.id or None, "pod_sandbox_id": f.pod_sandbox_id or None,
            "state": api_pb2.ContainerState.Name(f.state.state) if f.HasField("state") else None,
            "label_selector": dict(f.label_selector)}


#: How many pods' and containers' status encodings are kept (:func:`_message`), about 2 KiB each.
_STATUSES_KEPT = 1024
_encoded: dict[type[Message], dict[str, tuple[str, bytes]]] = {}


def _message(cls: type[_M], doc: Mapping[str, Any], fields: tuple[str, ...]) -> _M:
    """``cls`` filled from ``doc``'s ``fields``. The last encoding of each object's (by its ``id``)
    is kept with the JSON of what it was made from, and is the answer again while that is the
    same: kubelet asks the same statuses over and over (several times per pod and second while
    pods start), and ParseDict costs about ten times telling that they did not change."""
    picked = {k: doc[k] for k in fields if doc.get(k) is not None}
    try:
        made_from = json.dumps(picked, sort_keys=True)
    except (TypeError, ValueError):  # not JSON's shape: ParseDict says what is wrong
        made_from = ""
    kept = _encoded.setdefault(cls, {})
    object_id = str(doc.get("id") or "")
    last = kept.get(object_id)
    if made_from and last is not None and last[0] == made_from:
        again: _M = cls.FromString(last[1])
        return again
    message: _M = cls()
    json_format.ParseDict(picked, message)  # fills it in
    if made_from and object_id:
        keep_newest(kept, object_id, (made_from, message.SerializeToString()), _STATUSES_KEPT)
    return message


def pod_sandbox_status(doc: Mapping[str, Any]) -> api_pb2.PodSandboxStatus:
    """A pod layer's pod status as CRI's PodSandboxStatus."""
    return _message(api_pb2.PodSandboxStatus, doc, _POD_SANDBOX_STATUS)


def pod_sandbox(doc: Mapping[str, Any]) -> api_pb2.PodSandbox:
    """A pod layer's pod list entry as CRI's PodSandbox. Built field by field, not through
    json_format (a listing makes one per pod, and ParseDict's reflection costs ~20x more); an
    empty map is left out, not passed (filling a map field costs more than the rest together)."""
    metadata = doc.get("metadata") or {}
    pod = api_pb2.PodSandbox(
        id=doc["id"], state=api_pb2.PodSandboxState.Value(doc["state"]), created_at=doc["created_at"],
        metadata=api_pb2.PodSandboxMetadata(**{k: metadata[k] for k in _POD_METADATA if metadata.get(k) is not None}),
        runtime_handler=doc.get("runtime_handler") or "")
    return _with_maps(pod, doc)


def _with_maps(message: _Labelled, doc: Mapping[str, Any]) -> _Labelled:
    """``message`` with the labels and annotations of ``doc`` (an empty map is left out)."""
    if doc.get("labels"):
        message.labels.update(doc["labels"])
    if doc.get("annotations"):
        message.annotations.update(doc["annotations"])
    return message


class PodSandboxes:
    """ListPodSandbox's answers. A listing joins its pods' encoded PodSandboxes (serialized
    messages concatenated are their merge: the repeated ``items`` in order), and the encoding of
    a :class:`~client.cri.pod.PodEntry` (read-only, made only by the pod layer, once per stored
    record) is kept under the pod's id with the entry itself, so a pod listed again as the same
    entry costs a lookup, not a message; a listing of PodEntries equal to the last such listing
    is that listing's bytes again. A pod that changed is a new entry and is encoded again; the
    encoding of any other mapping is never kept (it is encoded again unless its whole listing
    equals that last one). Only the last :attr:`kept` pods' encodings are kept (a removed pod's
    goes when newer ones push it out).
    """

    def __init__(self, kept: int = 4096) -> None:
        self.kept = kept
        self._encoded: dict[str, tuple[PodEntry, bytes]] = {}
        self._last: tuple[list[PodEntry], bytes] = ([], b"")  # PodEntries only

    def response(self, entries: Sequence[Mapping[str, Any]]) -> api_pb2.ListPodSandboxResponse:
        """The ListPodSandboxResponse of the pod layer's ``entries``, in their order (a new
        message each time)."""
        if entries == self._last[0]:  # PodEntries: each is the same object, or equal
            data = self._last[1]
        else:
            encoded = self._encoded
            parts = []
            for entry in entries:
                kept = encoded.get(entry["id"])
                parts.append(kept[1] if kept is not None and kept[0] is entry else self._encode(entry))
            data = b"".join(parts)
            pod_entries = [entry for entry in entries if type(entry) is PodEntry]
            if len(pod_entries) == len(entries):
                self._last = (pod_entries, data)
        response: api_pb2.ListPodSandboxResponse = api_pb2.ListPodSandboxResponse.FromString(data)
        return response

    def _encode(self, entry: Mapping[str, Any]) -> bytes:
        data: bytes = api_pb2.ListPodSandboxResponse(items=[pod_sandbox(entry)]).SerializeToString()
        if type(entry) is PodEntry:
            keep_newest(self._encoded, entry["id"], (entry, data), self.kept)
        return data


def container_status(doc: Mapping[str, Any]) -> api_pb2.ContainerStatus:
    """A pod layer's container status as CRI's ContainerStatus (``image`` always set: clients
    read ``status.image.image`` without a check)."""
    return _message(api_pb2.ContainerStatus, {**doc, "image": doc.get("image") or {}}, _CONTAINER_STATUS)


def container(doc: Mapping[str, Any]) -> api_pb2.Container:
    """A pod layer's container list entry as CRI's Container (``image`` always set, as above).
    Built field by field as :func:`pod_sandbox` is (a listing makes one per container, kubelet
    lists them every second)."""
    metadata = doc.get("metadata") or {}
    made = api_pb2.Container(
        id=doc["id"], pod_sandbox_id=doc["pod_sandbox_id"],
        metadata=api_pb2.ContainerMetadata(**{k: metadata[k] for k in _CONTAINER_METADATA if metadata.get(k) is not None}),
        image=api_pb2.ImageSpec(**(doc.get("image") or {})), image_ref=doc.get("image_ref") or "",
        state=api_pb2.ContainerState.Value(doc["state"]), created_at=doc.get("created_at") or 0,
        image_id=doc.get("image_id") or "")
    return _with_maps(made, doc)


def verbose_info(info: Mapping[str, Any] | None) -> dict[str, str]:
    """A verbose status's ``info`` map as containerd writes it: one key, ``info``, whose value is
    the JSON of everything the runtime knows (crictl inspect/inspectp print it parsed)."""
    if info is None:
        return {}
    return {"info": json.dumps(info, sort_keys=True, default=str)}
