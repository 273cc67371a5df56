"""What the pod layer needs of images: the image a container names, and its root filesystem.

The pod layer does not own images: the image store (``client/images``) and its snapshotter do.
These are the two small interfaces it calls, so that podshimctl, tests and podshimd plug in
what they have; :class:`NoImages` is the answer of a pod service without an image store.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from shim.rpc.status import FailedPrecondition, NotFound

__all__ = ["ContainerImage", "ImageLookup", "NoImages", "Snapshotter", "StoreImages", "call", "image_not_found",
           "mount_dicts"]


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
        unique id prefix); NotFound when the store has no such image. May be a coroutine
        function; a plain one runs in a worker thread (:func:`call`)."""


class Snapshotter(Protocol):
    """client/images' snapshotter as the pod layer uses it (plain methods run in a worker thread,
    coroutine functions are awaited: :func:`call`)."""

    def prepare(self, key: str, chain_id: str) -> Any:
        """A writable snapshot ``key`` on the layers ``chain_id``: its mounts (containerd's
        mount.Mount: objects with ``to_dict()`` or dicts ``{type, source, options}``)."""

    def view(self, key: str, chain_id: str) -> Any:
        """A snapshot ``key`` on the layers ``chain_id`` and the mounts of a read-only view of
        them (an image volume's)."""

    def remove(self, key: str) -> Any:
        """Remove snapshot ``key``; no error when it is gone."""

    def read_file(self, chain_id: str, path: str) -> Any:
        """The bytes of ``path`` in the layers ``chain_id`` (None when it is not there)."""


class NoImages:
    """The image lookup of a pod service that has no image store: every image is not found."""

    def container_image(self, reference: str) -> ContainerImage:
        raise image_not_found(reference)


async def call(method: Callable[..., Any], *args: Any) -> Any:
    """``method(*args)``: awaited when it is a coroutine function, else run in a worker thread (the
    snapshotter's methods do file system work that must not stall the event loop)."""
    if inspect.iscoroutinefunction(method):
        return await method(*args)
    result = await anyio.to_thread.run_sync(method, *args)
    return await result if inspect.isawaitable(result) else result


def mount_dicts(mounts: Iterable[Any]) -> list[dict[str, Any]]:
    """Snapshot mounts as Task.Create ``rootfs`` entries (``{type, source, options}``)."""
    return [m.to_dict() if hasattr(m, "to_dict") else dict(m) for m in mounts]


class StoreImages:
    """The :class:`ImageLookup` of an image store whose ``resolve(reference)`` gives its record
    (``image_id``, ``repo_tags``, ``repo_digests``, ``config``: the whole OCI image config,
    ``layers``, ``chain_id``) or None (client/images' ImageStore, which resolves in memory: so
    the lookup is a coroutine, run on the caller's loop, not a worker thread's round trip)."""

    def __init__(self, resolve: Callable[[str], Any]):
        self._resolve = resolve

    async def container_image(self, reference: str) -> ContainerImage:
        return self.lookup(reference)

    def lookup(self, reference: str) -> ContainerImage:
        """:meth:`container_image`, blocking."""
        record = self._resolve(reference)
        if record is None:
            raise image_not_found(reference)
        if record.layers and not record.chain_id:
            raise FailedPrecondition(f"image {reference!r} is in the store but its layers are not unpacked: "
                                     "pull it again")
        config = record.config.get("config") if isinstance(record.config, Mapping) else None
        return ContainerImage(image_id=record.image_id,
                              name=record.repo_tags[0] if record.repo_tags else reference,
                              image_ref=record.repo_digests[0] if record.repo_digests else record.image_id,
                              chain_id=record.chain_id, config=config if isinstance(config, Mapping) else {})


def image_not_found(reference: str) -> NotFound:
    """containerd's sentence, with what to do about it."""
    return NotFound(f"image {reference!r} not found: pull it first")
