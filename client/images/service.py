"""The node's images: pull, list, status, remove, garbage collection; what CRI's ImageService
means, for podshimd (and anything else) to translate.

:class:`Images` owns ``<state root>/images``: the content store (``content/``), the image records
(``records/``, a file per image) and the :class:`~.pull.Puller`. Its rules:

- Concurrent pulls of one reference with the same credentials share one pull (one task per
  reference in this process); the callers all get its result or its error. A caller that goes
  away does not stop a pull others may wait for; :meth:`Images.aclose` cancels what is in flight.
- A pull unpacks each layer into a staging directory of the snapshotter as soon as its blob has
  arrived and is verified, while the rest download; once the config names the diff_ids, the
  staged layers are checked against them and committed, bottom up, by a rename. The layer blobs of
  the images recorded are offered to the pull (:meth:`.Puller.pull`'s ``reuse``): an image sharing
  them downloads and stages only its own layers.
- A layer blob the store had that fails its check when a pull unpacks it (damaged on disk) is
  removed and the image downloaded again, once, by that pull.
- What one pull unpacks is bounded (``max_unpacked_bytes``: its layers' uncompressed bytes
  together), and stops while the store's file system keeps a reserve free
  (:class:`.unpack.UnpackLimit`): past either, the pull is RESOURCE_EXHAUSTED with a sentence and
  what it unpacked is removed.
- An image is recorded only once all its blobs are verified in the content store and its layers
  are unpacked into committed snapshots (:mod:`.snapshots`, one per layer chain, shared between
  images; the record keeps the top chain id), so a failed, cancelled or killed pull leaves no
  record, and its temporary files go with it (or at the next start, when the content store
  empties ingest/ and the snapshotter its half-unpacked layers); the blobs and layers it had
  stored are collected as garbage once no pull is in flight.
- RemoveImage forgets the image with all its tags and digests (as containerd's CRI does) and
  garbage-collects the blobs and layer snapshots no image (nor, for snapshots, a container or a
  pod's sandbox) references, in a worker thread; an image a container uses, or a pod as its
  sandbox image, is refused with FAILED_PRECONDITION: :attr:`Images.in_use` is the hook the pod
  layer sets. Garbage is collected only while no pull is in flight (a pull's blobs and snapshots
  exist before its record does); a collection asked for meanwhile runs when the last pull ends,
  and a pull that starts while one runs waits for it.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from shim.lib.trees import remove_tree
from shim.rpc.status import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted

from .content import ContentStore
from .pull import PULL_PROGRESS_TIMEOUT, PULL_TIMEOUT, Progress, Pulled, Puller
from .reference import ReferenceError, parse
from .skopeo import SKOPEO, AuthConfig, RegistryHost
from .snapshots import Snapshotter, StagedLayer
from .store import ImageRecord, ImageStore, Layer
from .unpack import BadLayer, UnpackLimit

__all__ = ["IMAGES_DIR", "MAX_UNPACKED_BYTES", "Images", "image_user"]

log = logging.getLogger(__name__)

#: The image store, below the state root.
IMAGES_DIR = "images"
CONTENT_DIR = "content"
SNAPSHOTS_DIR = "snapshots"
#: The most one pull may unpack by default (uncompressed layer bytes, headers included): more
#: than the largest images in use (tens of GiB), far less than a decompression bomb can make.
MAX_UNPACKED_BYTES = 64 << 30


def image_user(config: dict[str, Any]) -> tuple[int | None, str]:
    """(uid, username) of an image config's User, as containerd's CRI reports them: a numeric
    user (``1000`` or ``1000:100``) is a uid, anything else a name; none when unset."""
    user = str((config.get("config") or {}).get("User") or "").split(":")[0]
    if not user:
        return None, ""
    try:
        return int(user), ""
    except ValueError:
        return None, user


@dataclass
class _PullProgress:
    """A pull in flight: what the puller reports, and the layer blobs that arrived verified."""

    pull: Progress = field(default_factory=Progress)
    layers_done: set[str] = field(default_factory=set)


class Images:
    """The images under ``<state_root>/images`` (see the module's docstring)."""

    def __init__(self, state_root: str, *, hosts: Iterable[RegistryHost] = (), pull_timeout: float = PULL_TIMEOUT,
                 progress_timeout: float = PULL_PROGRESS_TIMEOUT, platform: dict[str, str] | None = None,
                 skopeo: str = SKOPEO, max_unpacked_bytes: int = MAX_UNPACKED_BYTES) -> None:
        self.root = os.path.join(state_root, IMAGES_DIR)
        self.max_unpacked_bytes = max_unpacked_bytes
        self.content = ContentStore(os.path.join(self.root, CONTENT_DIR))
        self.store = ImageStore(self.root)
        self.puller = Puller(self.content, hosts=hosts, timeout=pull_timeout, progress_timeout=progress_timeout,
                             platform=platform, skopeo=skopeo)
        #: Whether a container or a pod uses the image (by id): falsy, True, or who uses it and what to
        #: remove first ("a container; remove the container first"); the pod layer sets it.
        self.in_use: Callable[[str], bool | str] = lambda image_id: False
        self.snapshots: Snapshotter | None = None  # made by open(): it cleans up as it starts
        # Pulls in flight by reference and credentials, and imports by ("archive PATH", None).
        self._pulls: dict[tuple[str, AuthConfig | None], asyncio.Task[Any]] = {}
        self._gc_pending = False
        self._collecting: asyncio.Future[Any] | None = None
        self._progress: dict[str, _PullProgress] = {}  # of the pulls in flight, by reference

    def open(self) -> Images:
        """Make the directories, remove what a killed pull left, read the records and collect the
        blobs no record references; returns self. Raises OSError, DataLoss (unreadable records)."""
        os.makedirs(os.path.dirname(self.root), exist_ok=True)
        self.store.load()
        self.content.open()
        self.snapshots = Snapshotter(os.path.join(self.root, SNAPSHOTS_DIR))
        try:
            self.collect_garbage()
        except OSError as exc:  # garbage left is no reason not to start: collected next time
            log.warning("collecting unreferenced blobs and snapshots failed: %s", exc)
        return self

    async def aclose(self) -> None:
        """Cancel the pulls in flight and wait for them to clean up, and for a garbage
        collection under way to end."""
        tasks: list[asyncio.Future[Any]] = list(self._pulls.values())
        for task in tasks:
            task.cancel()
        if self._collecting is not None:
            tasks.append(self._collecting)  # a collection in a thread cannot be cancelled: it ends
        if tasks:
            await asyncio.wait(tasks)
        if self._collecting is not None:  # started as the last cancelled pull ended
            await asyncio.wait([self._collecting])

    # -- reading -------------------------------------------------------------------------------

    def list(self, name: str = "") -> list[ImageRecord]:
        """Every image, or the one ``name`` names (id, id prefix, tag or digest reference)."""
        if name:
            found = self.store.resolve(name)
            return [found] if found is not None else []
        return sorted(self.store.list(), key=lambda r: (r.repo_tags, r.image_id))

    def status(self, name: str) -> ImageRecord | None:
        """The image ``name`` names, or None when the node has none such."""
        return self.store.resolve(name)

    # -- pulling -------------------------------------------------------------------------------

    async def pull(self, name: str, auth: AuthConfig | None = None) -> ImageRecord:
        """Pull the image ``name`` (a reference, normalised as containerd does) and record it;
        its record. Raises InvalidArgument for a bad reference and the pull's errors (RpcError
        with a sentence: NotFound, Unauthenticated, DataLoss, Unavailable, DeadlineExceeded...)."""
        try:
            ref = parse(name)
        except ReferenceError as exc:
            raise InvalidArgument(str(exc)) from None
        key = (str(ref), auth or None)
        task = self._pulls.get(key)
        if task is None:
            progress = _PullProgress()
            self._progress[str(ref)] = progress
            task = asyncio.ensure_future(self._pull(ref, auth, progress))
            self._pulls[key] = task
            task.add_done_callback(lambda done: self._pull_done(key, done))
        return await asyncio.shield(task)

    async def pull_reporting(self, name: str, auth: AuthConfig | None = None) -> tuple[ImageRecord, bool]:
        """:meth:`pull`, and whether the image was up to date: the node had it, with all its blobs
        and its layers unpacked, and ``name`` still names it (nothing was downloaded)."""
        try:
            before = self.store.resolve(str(parse(name)))
        except ReferenceError:
            before = None  # pull says why
        complete = before is not None and before.chain_id != "" and all(
            self.content.has(digest) for digest in before.blobs)
        record = await self.pull(name, auth)
        return record, complete and before is not None and before.image_id == record.image_id

    def pull_progress(self, name: str) -> dict[str, Any]:
        """How far the pull of ``name`` in flight is: ``pulling`` (False when none is), the
        image's ``layers`` and their ``bytes`` (0 until its manifest is read), ``layers_done``
        (downloaded and verified) and ``bytes_done`` (downloaded)."""
        try:
            progress = self._progress.get(str(parse(name)))
        except ReferenceError as exc:
            raise InvalidArgument(str(exc)) from None
        if progress is None:
            return {"pulling": False, "layers": 0, "layers_done": 0, "bytes": 0, "bytes_done": 0}
        done = progress.layers_done & progress.pull.layer_digests if progress.pull.layer_digests else progress.layers_done
        return {"pulling": True, "layers": progress.pull.layers, "layers_done": len(done),
                "bytes": progress.pull.bytes, "bytes_done": progress.pull.downloaded()}

    def _pull_done(self, key: tuple[str, AuthConfig | None], task: asyncio.Task[Any]) -> None:
        if self._pulls.get(key) is task:
            del self._pulls[key]
            if not any(other[0] == key[0] for other in self._pulls):
                self._progress.pop(key[0], None)
        if task.cancelled() or task.exception() is not None:
            if not task.cancelled():
                log.debug("pull of %s failed: %s", key[0], task.exception())  # retrieved: no warning at exit
            self._gc_pending = True  # the blobs and layers it stored before it failed belong to no image
        if self._gc_pending and not self._pulls:
            self._start_collecting()

    async def _pull(self, ref: Any, auth: AuthConfig | None, progress: _PullProgress) -> ImageRecord:
        while self._collecting is not None:  # a collection must not take what this pull finds stored
            await asyncio.wait([self._collecting])  # its failure is logged, not this pull's
        stored = self.store.resolve(str(ref)) is not None
        try:
            record = await self._pull_and_unpack(ref, auth, stored, progress)
        except BadLayer:
            # A layer blob the store had may have been damaged on disk since it was verified: that
            # one is removed and the image downloaded again, once. A layer just downloaded was
            # checked on its way: its error stands.
            if not stored or not await asyncio.to_thread(self._remove_damaged_layers, ref):
                raise
            record = await self._pull_and_unpack(ref, auth, False, progress)
        log.info("pulled %s: image %s (%d layers, %d bytes)", ref, record.short_id, len(record.layers), record.size)
        return self.store.add(record)

    async def _pull_and_unpack(self, ref: Any, auth: AuthConfig | None, stored: bool,
                               progress: _PullProgress) -> ImageRecord:
        """The image pulled and its layers unpacked (each staged as its blob arrives, committed
        once the config names their diff_ids); its record, not stored yet."""
        if self.snapshots is None:
            return self._record(await self.puller.pull(ref, auth, stored=stored, reuse=self._stored_layers(),
                                                       progress=progress.pull))
        staged: dict[str, StagedLayer] = {}  # by blob digest
        limit = UnpackLimit(self.max_unpacked_bytes, self.snapshots.root,
                            setting="image_pull_max_unpacked_bytes in config.toml")
        place = self.snapshots.staging()
        staging = place.__enter__()  # a mkdir and an uncontended flock: no await between it and the try
        try:
            def stage(digest: str, path: str) -> None:
                progress.layers_done.add(digest)
                if digest not in staged:  # a second copy (the tag moved) brings the same blobs again
                    staged[digest] = staging.stage(path, limit)

            pulled = await self.puller.pull(ref, auth, stored=stored, stage=stage,  # no stage() runs after it
                                            reuse=self._stored_layers(), progress=progress.pull)
            record = self._record(pulled)
            if record.layers:
                layers = [(layer.diff_id, self.content.path(layer.digest), layer.media_type) for layer in record.layers]
                by_diff_id = {layer.diff_id: staged[layer.digest] for layer in record.layers if layer.digest in staged}
                chain_id = await asyncio.to_thread(self.snapshots.unpack, layers, by_diff_id, limit=limit)
                record = replace(record, chain_id=chain_id)
            return record
        except ResourceExhausted as exc:
            raise ResourceExhausted(f"pulling image {ref}: {exc.message}") from None
        finally:
            # What was not committed (layers the node had) goes, off the event loop, also when cancelled.
            await asyncio.shield(asyncio.to_thread(place.__exit__, None, None, None))

    # -- archives ------------------------------------------------------------------------------

    async def import_archive(self, path: str) -> builtins.list[ImageRecord]:
        """Import the images of the archive at ``path`` (:mod:`.archive`: an OCI archive or a
        docker-archive) as a pull brings an image in: its blobs verified into the content store,
        its layers unpacked within ``max_unpacked_bytes``, each image recorded with the names the
        archive gives it only once every image is complete. An import runs as a pull does (garbage
        is not collected meanwhile; what a failed one stored is collected after it). Their records.
        Raises what :func:`.archive.read_archive` raises and the unpack's errors."""
        key = (f"archive {os.path.abspath(path)}", None)
        task = self._pulls.get(key)
        if task is None:
            task = asyncio.ensure_future(self._import(path))
            self._pulls[key] = task
            task.add_done_callback(lambda done: self._pull_done(key, done))
        return await asyncio.shield(task)

    async def _import(self, path: str) -> builtins.list[ImageRecord]:
        from .archive import read_archive

        while self._collecting is not None:  # a collection must not take what this import stores
            await asyncio.wait([self._collecting])
        work = self.content.temporary_dir("import-")
        try:
            images = await asyncio.to_thread(read_archive, path, self.content, work, self.puller.platform,
                                             self.max_unpacked_bytes)
            records = []
            limit = UnpackLimit(self.max_unpacked_bytes, self.snapshots.root if self.snapshots else self.root,
                                setting="image_pull_max_unpacked_bytes in config.toml")
            for image in images:
                diff_ids = image.config["rootfs"]["diff_ids"]
                layers = tuple(Layer(d.digest, d.size, d.media_type, str(diff_id))
                               for d, diff_id in zip(image.manifest.layers, diff_ids, strict=False))
                size = (os.path.getsize(self.content.path(image.manifest_digest)) + image.manifest.config.size
                        + sum(layer.size for layer in layers))
                record = ImageRecord(image_id=image.manifest.config.digest, repo_tags=tuple(map(str, image.names)),
                                     repo_digests=(), manifest_digest=image.manifest_digest,
                                     manifests=(image.manifest_digest,), config=image.config, layers=layers, size=size)
                if self.snapshots is not None and layers:
                    chain_id = await asyncio.to_thread(self.snapshots.unpack, [
                        (layer.diff_id, self.content.path(layer.digest), layer.media_type) for layer in layers],
                        limit=limit)
                    record = replace(record, chain_id=chain_id)
                records.append(record)
        except ResourceExhausted as exc:
            raise ResourceExhausted(f"importing {path}: {exc.message}") from None
        finally:
            await asyncio.shield(asyncio.to_thread(remove_tree, work, ignore_errors=True))
        stored = [self.store.add(record) for record in records]
        for record in stored:
            log.info("imported %s from %s: image %s (%d layers, %d bytes)", ", ".join(record.repo_tags) or "an "
                     "untagged image", path, record.short_id, len(record.layers), record.size)
        return stored

    async def export_archive(self, names: Iterable[str], path: str, archive_format: str) -> tuple[builtins.list[ImageRecord], int]:
        """Write the images ``names`` name to ``path`` as an archive of ``archive_format``
        (:mod:`.archive`); their records and the archive's size. Raises NotFound for a name that
        names no image, and what :func:`.archive.write_archive` raises."""
        from .archive import write_archive

        records = []
        for name in names:
            record = self.store.resolve(name)
            if record is None:
                raise NotFound(f"no such image {name!r} present")
            records.append(record)
        while self._collecting is not None:  # a removal's collection may take blobs of what it writes
            await asyncio.wait([self._collecting])
        size = await asyncio.to_thread(write_archive, path, records, self.content, archive_format)
        log.info("exported %s to %s (%d bytes)", ", ".join(r.short_id for r in records), path, size)
        return records, size

    def _stored_layers(self) -> set[str]:
        """The layer blobs of the images recorded: what a pull may take from the store."""
        return {layer.digest for record in self.store.list() for layer in record.layers}

    def _remove_damaged_layers(self, ref: Any) -> bool:
        """Check the stored layer blobs of the image ``ref`` names; remove the damaged ones.
        Whether there were any."""
        record = self.store.resolve(str(ref))
        damaged = [layer.digest for layer in (record.layers if record else ()) if not self.content.check(layer.digest)]
        if damaged:
            log.warning("image %s: layer blobs %s were damaged in the content store; removed, downloading them again",
                        ref, ", ".join(damaged))
        return bool(damaged)

    def _record(self, pulled: Pulled) -> ImageRecord:
        manifest = pulled.manifest
        diff_ids = pulled.config["rootfs"]["diff_ids"]
        layers = tuple(Layer(d.digest, d.size, d.media_type, str(diff_id)) for d, diff_id in zip(manifest.layers,
                                                                                                   diff_ids, strict=False))
        manifests = tuple(dict.fromkeys([pulled.repo_digest, pulled.manifest_digest]))
        size = (os.path.getsize(self.content.path(pulled.manifest_digest)) + manifest.config.size
                + sum(layer.size for layer in layers))
        ref = pulled.reference
        return ImageRecord(image_id=manifest.config.digest,
                           repo_tags=(str(ref),) if ref.tag is not None else (),
                           repo_digests=(str(ref.with_digest(pulled.repo_digest)),),
                           manifest_digest=pulled.manifest_digest, manifests=manifests, config=pulled.config,
                           layers=layers, size=size)

    # -- removing ------------------------------------------------------------------------------

    async def remove(self, name: str) -> ImageRecord | None:
        """Forget the image ``name`` names, all its tags and digests, and collect its blobs; the
        record removed, None when there was none (not an error: removal is idempotent). Raises
        FailedPrecondition while a container uses it."""
        record = self.store.resolve(name)
        if record is None:
            unreadable = self.store.unreadable(name)
            if unreadable is not None:  # left out at load: its file goes, and the blobs only it kept
                self.store.remove(unreadable)
                log.info("removed the record of image %s, which could not be read", unreadable)
                await self._collect_after_removal()
            return None
        user = self.in_use(record.image_id)
        if user:
            # The hook may say who uses it and what to remove ("pod X as its sandbox image; ...").
            who = user if isinstance(user, str) else "a container; remove the container first"
            raise FailedPrecondition(f"image {name!r} ({record.short_id}) is in use by {who}")
        self.store.remove(record.image_id)
        log.info("removed image %s (%s)", record.short_id, ", ".join(record.repo_tags) or "untagged")
        await self._collect_after_removal()
        return record

    async def _collect_after_removal(self) -> None:
        if self._pulls:
            self._gc_pending = True  # collected when the last pull ends
        else:
            await asyncio.wait([self._start_collecting()])  # a failure is logged: the image is removed

    def _start_collecting(self) -> asyncio.Future[Any]:
        """Collect garbage in a worker thread; pulls that start meanwhile wait for it."""
        if self._collecting is None:
            self._gc_pending = False
            self._collecting = asyncio.ensure_future(asyncio.to_thread(self.collect_garbage))
            self._collecting.add_done_callback(self._collected)
        return self._collecting

    def _collected(self, future: asyncio.Future[Any]) -> None:
        self._collecting = None
        if not future.cancelled() and future.exception() is not None:
            log.warning("collecting unreferenced blobs and snapshots failed: %s", future.exception())

    def collect_garbage(self) -> int:
        """Remove the blobs and layer snapshots no image references (blocking: file system
        work); how many blobs. Callers make sure no pull is in flight meanwhile."""
        unreferenced = self.content.digests() - self.store.referenced_blobs()
        for digest in unreferenced:
            self.content.remove(digest)
        if unreferenced:
            log.info("collected %d unreferenced blobs", len(unreferenced))
        if self.snapshots is not None:
            removed = self.snapshots.gc({r.chain_id for r in self.store.list() if r.chain_id})
            if removed.removed:
                log.info("collected %d unreferenced layer snapshots (%d bytes)", len(removed.removed),
                         removed.bytes)
        return len(unreferenced)
