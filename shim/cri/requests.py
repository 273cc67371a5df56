"""CRI's RunPodSandbox and CreateContainer requests as the config model (:mod:`shim.cri.configs`).

A config goes proto → dict (``json_format``, with the proto's own field names: crictl's JSON
spelling) → the crictl-JSON parser of :mod:`shim.cri.configs`, which validates every field and
applies CRI's proto3 zero values (an unset NamespaceMode is POD), so a config means the same
whether it came from podshimd, containerd's CreateSandbox, podshimctl or a test. The way back,
the pod layer's results as CRI messages, is podshimd's (:mod:`client.podshimd.translate`).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from shim.cri.api import api_pb2
from shim.cri.configs import ContainerConfig, PodSandboxConfig
from shim.rpc.status import InvalidArgument

__all__ = ["pod_sandbox_config", "container_config"]


def _as_dict(message: Message) -> dict[str, Any]:
    """The message as crictl's JSON spells it: proto field names, and a ``bytes`` field (an env
    value since CRI 1.37) as its text, not protobuf JSON's base64 (which a reader of text would take
    for the value itself)."""
    doc: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    _bytes_as_text(message, doc, "")
    return doc


def _bytes_as_text(message: Message, doc: dict[str, Any], path: str) -> None:
    """Put the UTF-8 text of each set ``bytes`` field of ``message`` in ``doc`` (its dict);
    InvalidArgument naming a field that is not UTF-8 text or holds a NUL (nothing here carries
    binary data)."""
    for field, value in message.ListFields():
        where = f"{path}{field.name}"
        if field.type == field.TYPE_BYTES:
            values = list(value) if field.is_repeated else [value]
            try:
                texts = [v.decode() for v in values]
            except UnicodeDecodeError:
                raise InvalidArgument(f"{where} is not UTF-8 text: binary values are not supported") from None
            if any("\0" in text for text in texts):
                raise InvalidArgument(f"{where} holds a NUL byte, which no environment value can")
            doc[field.name] = texts if field.is_repeated else texts[0]
        elif field.message_type is not None and not field.message_type.GetOptions().map_entry:
            if field.is_repeated:
                for i, item in enumerate(value):
                    _bytes_as_text(item, doc[field.name][i], f"{where}[{i}].")
            else:
                _bytes_as_text(value, doc[field.name], f"{where}.")


def _required(request: Message, field: str) -> Message:
    if not request.HasField(field):
        raise InvalidArgument(f"{field} is required")
    return getattr(request, field)


def pod_sandbox_config(request: api_pb2.RunPodSandboxRequest) -> PodSandboxConfig:
    """The request's PodSandboxConfig; InvalidArgument naming the field that is wrong or missing."""
    return PodSandboxConfig.from_json(_as_dict(_required(request, "config")))


def container_config(request: api_pb2.CreateContainerRequest) -> ContainerConfig:
    """The request's ContainerConfig; InvalidArgument naming the field that is wrong or missing.
    A container must name its image, its root filesystem (as containerd requires): without one
    it would have none but what the node gives it."""
    config = ContainerConfig.from_json(_as_dict(_required(request, "config")))
    if not config.image:
        raise InvalidArgument("config.image.image is empty: a container needs an image, which is its root "
                              "filesystem (podshimd runs no container without one)")
    return config
