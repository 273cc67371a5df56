"""What the pod layer needs of images: the image a container names, and its root filesystem.

The pod layer does not own images: the image store (``client/images``) and its snapshotter do.
These are the two small interfaces it calls, so that podshimctl, tests and podshimd plug in
what they have; :class:`NoImages` is the answer of a pod service without an image store.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from shim.rpc.status import NotFound

__all__ = ["ContainerImage", "ImageLookup", "NoImages", "Snapshotter", "call", "image_not_found"]


@dataclass(frozen=True)
class ContainerImage:
    """An image as a container uses it: ``image_id`` (its config digest), ``name`` (its first repo
    tag, else the reference it was asked by: CRI's ``image.image`` of a container status),
    ``image_ref`` (its first repo digest, else its id: CRI's ``image_ref``), ``config`` (the
    ``config`` object of its OCI image config: Entrypoint, Cmd, Env, WorkingDir, User) and
    ``chain_id`` (the snapshot its unpacked layers are)."""

    image_id: str
    name: str
    image_ref: str
    chain_id: str
    config: Mapping[str, Any] = field(default_factory=dict)


class ImageLookup(Protocol):
    def container_image(self, reference: str) -> Any:
        """The :class:`ContainerImage` of ``reference`` (an id, a tag, a digest reference, or a
        unique id prefix), or an awaitable of it; NotFound when the store has no such image."""


class Snapshotter(Protocol):
    def prepare(self, key: str, chain_id: str) -> Any:
        """A writable snapshot ``key`` on the layers ``chain_id``: its mounts (containerd's
        mount.Mount as ``{type, source, options}``), or an awaitable of them."""

    def remove(self, key: str) -> Any:
        """Remove snapshot ``key``; no error when it is gone."""

    def read_file(self, chain_id: str, path: str) -> Any:
        """The bytes of ``path`` in the layers ``chain_id`` (FileNotFoundError when missing)."""


class NoImages:
    """The image lookup of a pod service that has no image store: every image is not found."""

    def container_image(self, reference: str) -> ContainerImage:
        raise image_not_found(reference)


async def call(result: Any) -> Any:
    """``result``, awaited when it is awaitable: the interfaces above may be sync or async."""
    if inspect.isawaitable(result):
        return await result
    return result


def image_not_found(reference: str) -> NotFound:
    """containerd's sentence, with what to do about it."""
    return NotFound(f"image {reference!r} not found: pull it first")
