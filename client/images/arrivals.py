"""Blobs as skopeo finishes them: each hashed (and handed to the caller's ``stage``) in a worker
thread as soon as it is in the layout, while the rest download.

skopeo (containers/image's ``oci_dest.go``) writes each blob to a temporary file in the layout,
fsyncs it, and renames it to ``blobs/sha256/<hex>`` once it has it all and its digest matched
(only the manifest is written in place, and it is never taken from there unchecked). So a layer
file named by its digest is complete: :class:`Arrivals` watches that directory for them."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor

from .content import BlobError, ContentStore, file_digest

__all__ = ["ARRIVAL_POLL", "ARRIVAL_WORKERS", "Arrivals", "layout_blob"]

log = logging.getLogger("client.images.pull")  # the pull's lines, under the one name

#: Seconds between two looks at skopeo's directory for blobs it has finished.
ARRIVAL_POLL = 0.005
#: Blobs hashed and staged side by side while the rest download.
ARRIVAL_WORKERS = 3
_BLOB_NAME = re.compile(r"[0-9a-f]{64}")


def layout_blob(blobs: str, digest: str) -> str:
    """Where an OCI layout's blobs/sha256 directory ``blobs`` keeps the blob ``digest``."""
    return os.path.join(blobs, digest.partition(":")[2])


class Arrivals:
    """The blobs skopeo has finished in a layout's blobs directory, each hashed (and handed to
    ``stage``) in a worker thread as soon as it is there (see the module docstring).

    ``verified`` maps a digest to the file that was hashed and matched it. ``stage(digest,
    path)`` is the caller's: it may fail (a config is no layer; the blob will be unpacked from
    the store then, and its error said), it must not keep ``path`` past its return.
    :meth:`aclose` waits for the workers: nothing of theirs runs once the pull is over.
    """

    def __init__(self, stage: Callable[[str, str], object] | None) -> None:
        self.stage = stage
        self.verified: dict[str, str] = {}
        self.skip: set[str] = set()  # digests not to stage (the config, once it is known)
        self.linked: dict[str, str] = {}  # digest -> layout path: stored blobs linked in (:meth:`seed`)
        self._seen: set[str] = set()
        self._futures: list[Future[None]] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._pool = ThreadPoolExecutor(ARRIVAL_WORKERS, thread_name_prefix="pull-blob")

    async def follow(self, directory: str) -> None:
        """Look at ``directory`` until cancelled."""
        while True:
            self.scan(directory)
            await asyncio.sleep(ARRIVAL_POLL)

    def scan(self, directory: str) -> None:
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return
        for name in names:
            path = os.path.join(directory, name)
            if _BLOB_NAME.fullmatch(name) and path not in self._seen:
                self._seen.add(path)
                self._futures.append(self._pool.submit(self._arrived, "sha256:" + name, path))

    def restart(self) -> None:
        """Forget the files seen: the directory is made again (a second copy)."""
        self._seen.clear()
        self.linked.clear()
        with self._lock:
            self.verified.clear()

    def seed(self, directory: str, content: ContentStore, digests: Iterable[str]) -> None:
        """Hard-link the stored blobs ``digests`` into ``directory`` (a layout's blobs/sha256, on
        the store's filesystem) before skopeo runs: it then reuses them (containers/image's OCI
        destination takes a blob whose file is there) and downloads only the others. Linked
        blobs are not hashed or staged on arrival (the puller hashes those the image has); one that cannot be
        linked is simply downloaded."""
        os.makedirs(directory, 0o700, exist_ok=True)
        for digest in digests:
            path = layout_blob(directory, digest)
            try:
                if not content.has(digest):  # a symbolic link in its place is not linked to: damage
                    continue
                os.link(content.path(digest), path)
            except (OSError, BlobError):
                continue  # not stored (any more), or no link here: downloaded
            self._seen.add(path)
            self.linked[digest] = path

    def verified_reuse(self, digest: str) -> None:
        """The linked blob ``digest`` was hashed and matched."""
        with self._lock:
            self.verified[digest] = self.linked[digest]

    def forget(self, digest: str) -> None:
        """The linked blob ``digest`` was damaged and is gone: its download is an arrival like any other."""
        path = self.linked.pop(digest)
        self._seen.discard(path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def _arrived(self, digest: str, path: str) -> None:
        if self._stopped.is_set():
            return
        try:
            if file_digest(path) != digest:
                return  # moving it in hashes it again and says what is wrong
        except OSError:
            return  # removed meanwhile (a second copy)
        with self._lock:
            self.verified[digest] = path
        if self.stage is not None and digest not in self.skip:
            try:
                self.stage(digest, path)
            except Exception as exc:  # noqa: BLE001 - unpacked again from the store, where its error counts
                log.debug("blob %s was not staged: %s", digest, exc)

    async def settle(self, directory: str) -> None:
        """Take what arrived last, and wait until every blob seen is hashed and staged."""
        self.scan(directory)
        if self._futures:
            await asyncio.wait([asyncio.wrap_future(f) for f in self._futures])

    async def aclose(self) -> None:
        """Stop: blobs not begun are not taken; wait for those under way (also when cancelled)."""
        self._stopped.set()
        for future in self._futures:
            future.cancel()
        running = [asyncio.wrap_future(f) for f in self._futures if not f.done()]
        cancelled = False
        while running:
            try:
                await asyncio.shield(asyncio.wait(running))
                break
            except asyncio.CancelledError:
                cancelled = True  # the threads cannot be stopped; what they write must not outlive us
                running = [f for f in running if not f.done()]
        self._pool.shutdown(wait=False)
        if cancelled:
            raise asyncio.CancelledError
