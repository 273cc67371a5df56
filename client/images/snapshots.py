"""Layer snapshots, kept as containerd's overlayfs snapshotter keeps them.

An image's layers are unpacked once each and shared between images: a committed snapshot holds
one layer on top of its parent and is named by its chain id (OCI image-spec config.md, what
containerd's ``identity.ChainID`` computes): ``chain(L1) = diff_id(L1)``, ``chain(L1..n) =
sha256(chain(L1..n-1) + " " + diff_id(Ln))``. A container gets an active snapshot: its own
upper and work directories over its image's layers, mounted as one overlay.

Layout under ``root`` (``<state root>/images/snapshots``)::

    snapshots/<n>/fs             a committed layer (an overlay lower dir), or an active upper dir
    snapshots/<n>/work           an active snapshot's overlay work dir
    snapshots/tmp-<chain>-<rnd>  a layer being unpacked, renamed to snapshots/<n> once complete
    snapshots/trash-<rnd>        a removed snapshot being deleted
    snapshots/stage-<rnd>/<n>/fs layers a pull unpacks while the rest of its image downloads
                                 (:meth:`Snapshotter.staging`), renamed to snapshots/<n> when committed
    metadata/committed/<chain hex>.json, metadata/active/<sha256(key) hex>.json
                                 one record per snapshot (:data:`RECORD_SCHEMA`), written atomically
    locks/<chain hex>            flock'd while that chain is unpacked, or prepared on
    locks/stage-<rnd>            flock'd while that staging directory is in use
    lock                         flock'd while records and snapshot numbers change

Numbers, not chain ids, name the directories so that an overlay's lowerdir option stays short
(the kernel takes one page of mount options), as containerd does.

A snapshot exists when its record does. The record is written after its directory is complete
and renamed into place, and removed before its directory is, so a half-unpacked or half-removed
snapshot never looks committed; :class:`Snapshotter` removes such leftovers when it starts.
Unpacking a chain locks each chain id in it, in order from the base (so two images sharing a base
take their locks in the same order): exclusively the layers it unpacks, so that concurrent unpacks
of one chain, in threads or processes, unpack each layer once; shared the committed ones it builds
on, so that images sharing a base unpack side by side and gc (which needs a chain's lock
exclusively) cannot take a layer an unpack or a prepare is building on.

Every method blocks (file system work): async callers run them in a worker thread.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import logging
import os
import re
import stat
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from shim.lib import mountinfo
from shim.lib.files import (
    decode_json,
    ensure_private_dir,
    flock_open,
    fsync_dir,
    read_regular,
    rename_noreplace,
    unlink_quietly,
    write_json_atomic,
)
from shim.lib.trees import remove_tree, walk
from shim.rpc.status import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound

from .unpack import LayerStats, UnpackLimit, apply_layer, compression_of

__all__ = ["GcResult", "Mount", "RECORD_SCHEMA", "Snapshot", "Snapshotter", "StagedLayer", "Staging", "Usage",
           "UNPACK_WORKERS", "chain_ids"]

#: The version of the record format; a record of another version is refused, never guessed at.
RECORD_SCHEMA = 1
#: Layers of one image unpacked side by side (each in its own directory, each with its own
#: decompressing thread): enough to overlap one layer's file creation with another's inflating.
UNPACK_WORKERS = 3
#: How many symbolic links :meth:`Snapshotter.read_file` follows in one path (Linux's MAXSYMLINKS).
MAX_SYMLINKS = 40
#: The most :meth:`Snapshotter.read_file` reads: it is for configuration files (/etc/passwd).
READ_FILE_MAX_BYTES = 16 << 20
#: The most lower layers one overlay stacks (the kernel's OVL_MAX_STACK). Options longer than a
#: page are no limit: the shim mounts those through fsconfig, a ``lowerdir+`` per layer.
MAX_LAYERS = 500

log = logging.getLogger(__name__)
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_OVERLAY_INDEX_PARAMETER = "/sys/module/overlay/parameters/index"
_COMMITTED, _ACTIVE = "committed", "active"
#: A record's fields and their JSON types; a record with another is not read.
_RECORD_FIELDS: dict[str, Any] = {"kind": str, "name": str, "id": int, "parent": (str, type(None)),
                                  "diff_id": (str, type(None)), "bytes": int, "inodes": int, "created_ns": int}
#: The most a snapshot record file may hold (they are a few hundred bytes).
RECORD_MAX_BYTES = 64 << 10


@dataclass(frozen=True)
class Mount:
    """One mount of a snapshot's root file system, containerd's ``types.Mount`` without target."""

    type: str
    source: str
    options: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "source": self.source, "options": list(self.options)}


@dataclass(frozen=True)
class Snapshot:
    """A snapshot's record. ``name`` is the chain id of a committed snapshot, the key of an
    active one; ``parent`` the chain id below it (None for a base layer or an empty image);
    ``bytes`` and ``inodes`` what its layer holds (committed; 0 for active, see usage())."""

    kind: str
    name: str
    snapshot_id: int
    parent: str | None
    diff_id: str | None
    bytes: int
    inodes: int
    created_ns: int


@dataclass(frozen=True)
class Usage:
    """Apparent size of file data and number of inodes, committed layers and active upper dirs."""

    bytes: int
    inodes: int


def _tree_usage(top: str) -> Usage:
    """Apparent size of the regular files below ``top`` (a tree of any depth) and its inodes,
    ``top`` excluded. FileNotFoundError when ``top`` does not exist."""
    total_bytes = total_inodes = 0
    for entry in walk(top):
        total_inodes += 1
        if entry.is_dir:
            continue
        try:
            st = entry.stat()
        except FileNotFoundError:
            continue  # the container removed it meanwhile
        if stat.S_ISREG(st.st_mode):
            total_bytes += st.st_size
    return Usage(total_bytes, total_inodes)


@dataclass(frozen=True)
class GcResult:
    """What :meth:`Snapshotter.gc` removed: chain ids, and the bytes and inodes they held."""

    removed: tuple[str, ...]
    bytes: int
    inodes: int


@dataclass(frozen=True)
class StagedLayer:
    """A layer unpacked ahead of its chain (:meth:`Staging.stage`): ``path`` holds its ``fs``
    directory; ``stats`` say what it is (its diff_id is checked when it is committed)."""

    path: str
    stats: LayerStats


class Staging:
    """A directory of the snapshotter's where layers are unpacked before their chain is known (a
    pull unpacks each layer as its blob arrives, before the image config names the diff_ids).
    Made by :meth:`Snapshotter.staging`; :meth:`Snapshotter.unpack` commits a staged layer by
    renaming it. Thread-safe."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._numbers = itertools.count()

    def stage(self, blob_path: str, limit: UnpackLimit | None = None) -> StagedLayer:
        """Unpack the layer blob at ``blob_path`` (compression read from its first bytes). Raises
        what apply_layer raises; nothing of a failed layer is left."""
        path = os.path.join(self.directory, str(next(self._numbers)))
        return StagedLayer(path, _unpack_into(path, blob_path, limit=limit))


def _unpack_into(path: str, blob_path: str, media_type: str | None = None, *,
                 diff_id: str | None = None, limit: UnpackLimit | None = None) -> LayerStats:
    """Make the directory ``path`` (0700) and unpack the layer blob ``blob_path`` into its
    ``fs``. Raises what apply_layer raises; nothing of a failed layer is left."""
    os.mkdir(path, 0o700)
    try:
        os.mkdir(os.path.join(path, "fs"))
        os.chmod(os.path.join(path, "fs"), 0o755)  # not the umask's: it is the image's root
        return apply_layer(os.path.join(path, "fs"), blob_path, media_type, diff_id=diff_id, limit=limit)
    except BaseException:
        remove_tree(path, ignore_errors=True)
        raise


def chain_ids(diff_ids: Iterable[str]) -> list[str]:
    """The chain id of each prefix of ``diff_ids`` (bottom layer first), as containerd's
    identity.ChainIDs computes them. InvalidArgument for a diff_id that is not sha256:<hex>."""
    out: list[str] = []
    for diff_id in diff_ids:
        _check_digest(diff_id, "diff_id")
        out.append(diff_id if not out else
                   "sha256:" + hashlib.sha256(f"{out[-1]} {diff_id}".encode()).hexdigest())
    return out


def _check_digest(value: object, what: str) -> str:
    if not isinstance(value, str) or not _DIGEST.fullmatch(value):
        raise InvalidArgument(f"{what} {value!r} is not a sha256 digest (sha256:<64 hex digits>)")
    return value


class Snapshotter:
    """Committed layer snapshots and active overlay snapshots under ``root``.

    Making one creates the directories (0700) and removes what a killed process left: layers
    half unpacked, snapshots half made or half removed. Raises OSError when ``root`` cannot be
    made or used.
    """

    def __init__(self, root: str) -> None:
        self.root = root
        self._dirs = os.path.join(root, "snapshots")
        self._meta = {kind: os.path.join(root, "metadata", kind) for kind in (_COMMITTED, _ACTIVE)}
        self._locks = os.path.join(root, "locks")
        for path in (root, self._dirs, os.path.dirname(self._meta[_COMMITTED]), *self._meta.values(),
                     self._locks):
            ensure_private_dir(path, 0o700)
        try:
            self._remove_leftovers()
        except (OSError, ValueError) as exc:  # a leftover never keeps the node's images from being used
            log.warning("cannot remove what a killed process left in %s; trying again at the next start: %s",
                        root, exc)

    # -- committed snapshots -------------------------------------------------------------------

    def unpack(self, layers: Sequence[tuple[str, str, str | None]],
               staged: Mapping[str, StagedLayer] | None = None, *, limit: UnpackLimit | None = None) -> str:
        """Make the committed snapshots of an image's layers, (diff_id, blob path, media type)
        from the bottom layer up, and return the top chain id ("" for no layers).

        Layers committed already (by this image or another sharing them) are reused; the missing
        ones are taken from ``staged`` (by diff_id: layers of a :meth:`staging` unpacked ahead,
        used when their diff_id and compression are the layer's) or else unpacked side by side,
        then committed from the bottom up. A concurrent call for the same chain, in this process
        or another, waits and reuses this one's work.

        ``limit`` counts what the layers unpacked here write (client.images.unpack.UnpackLimit).

        Raises InvalidArgument for a bad diff_id; BadLayer (client.images.unpack, INVALID_ARGUMENT)
        for a layer that is corrupt, escapes its directory or does not match its diff_id, naming
        it; Unimplemented for zstd without the zstd program; ResourceExhausted past ``limit``;
        OSError for the machine's failures. Nothing of a failed layer is left; layers below it
        that were complete stay committed.
        """
        with ExitStack() as held:
            return self._unpack(layers, held, staged or {}, limit)

    @contextmanager
    def unpacked(self, layers: Sequence[tuple[str, str, str | None]],
                 staged: Mapping[str, StagedLayer] | None = None, *, limit: UnpackLimit | None = None
                 ) -> Iterator[str]:
        """As :meth:`unpack`, and the chain stays locked until the block ends: gc keeps it
        meanwhile, so a pull records its image's chain id before a concurrent gc could take the
        layers for unused. (The layers this call unpacked stay locked exclusively: other unpacks
        and prepares of them wait for the block, which should be short.) Raises what unpack raises."""
        with ExitStack() as held:
            yield self._unpack(layers, held, staged or {}, limit)

    @contextmanager
    def staging(self) -> Iterator[Staging]:
        """A :class:`Staging` directory for the block; what is left in it (layers not committed)
        is removed at its end, or when the snapshotter starts after a crash."""
        token = os.urandom(6).hex()
        directory = os.path.join(self._dirs, f"stage-{token}")
        with flock_open(os.path.join(self._locks, f"stage-{token}"), unlink=True):
            os.mkdir(directory, 0o700)
            try:
                yield Staging(directory)
            finally:
                self._discard(directory)

    def _unpack(self, layers: Sequence[tuple[str, str, str | None]], held: ExitStack,
                staged: Mapping[str, StagedLayer], limit: UnpackLimit | None) -> str:
        layers = list(layers)
        chain = chain_ids(diff_id for diff_id, _, _ in layers)
        if not chain:
            return ""
        missing = [i for i, chain_id in enumerate(chain) if not self._hold(held, chain_id)]
        if not missing:  # another caller unpacked them while we waited for the locks
            return chain[-1]
        built: dict[int, tuple[str, LayerStats]] = {}
        ready = dict(staged)
        for i in missing:
            diff_id, _, media_type = layers[i]
            # A staged directory commits once (a diff_id again in the chain is unpacked again); one
            # that is not this layer's is left, and the layer unpacked from its blob says why.
            layer = ready.pop(diff_id, None)
            if (layer is not None and layer.stats.diff_id == diff_id
                    and layer.stats.compression == compression_of(media_type) is not None):
                built[i] = (layer.path, layer.stats)
        try:
            with ThreadPoolExecutor(max(1, min(len(missing) - len(built), UNPACK_WORKERS)),
                                    thread_name_prefix="unpack") as pool:
                futures = {i: pool.submit(self._unpack_layer, chain[i], *layers[i], limit)
                           for i in missing if i not in built}
                failed: tuple[int, BaseException] | None = None
                for i, future in futures.items():
                    try:
                        built[i] = future.result()
                    except BaseException as exc:
                        failed = failed or (i, exc)  # the lowest layer's: the one to fix first
            # The complete layers below a failed one are committed: a retry starts above them.
            complete = [i for i in missing if failed is None or i < failed[0]]
            self._commit([(built.pop(i), chain[i], chain[i - 1] if i else None, layers[i][0]) for i in complete])
            if failed is not None:
                raise failed[1]
        finally:
            for tmp, _ in built.values():
                self._discard(tmp)
        return chain[-1]

    def has(self, chain_id: str) -> bool:
        """Whether the committed snapshot ``chain_id`` exists ("", the empty image, always does)."""
        return not chain_id or self._record(_COMMITTED, chain_id) is not None

    def stat(self, name: str) -> Snapshot:
        """The record of the committed snapshot ``name`` (a chain id) or else of the active
        snapshot ``name`` (a key). NotFound when there is neither."""
        doc = self._record(_COMMITTED, name) if _DIGEST.fullmatch(name) else None
        doc = doc or self._record(_ACTIVE, name)
        if doc is None:
            raise NotFound(f"snapshot {name!r} does not exist")
        return _snapshot(doc)

    def snapshots(self) -> list[Snapshot]:
        """Every snapshot's record, committed and active."""
        return [_snapshot(doc) for kind in (_COMMITTED, _ACTIVE) for doc in self._records(kind)]

    def read_file(self, chain_id: str, path: str, *, max_bytes: int = READ_FILE_MAX_BYTES) -> bytes | None:
        """The content of ``path`` in the image whose top layer is ``chain_id``, as its overlay
        would show it (upper layers over lower ones, whiteouts and opaque directories honoured,
        symbolic links followed inside the image's root, never outside it); None when the path
        does not exist there ("" is the empty image, where nothing does).

        Raises NotFound when ``chain_id`` is not committed; FailedPrecondition when the path is
        a directory or not a regular file, loops through symbolic links, or the file is larger
        than ``max_bytes``.
        """
        layers = [self._fs(doc) for doc in self._chain_records(chain_id)]
        todo = deque(path.split("/"))
        names: list[str] = []  # the resolved directories on the way, none a link
        stacks = [layers]  # for each of them (the root first), the layers that show a directory there
        links = 0
        while todo:
            name = todo.popleft()
            if name in ("", "."):
                continue
            if name == "..":
                if names:  # ".." of the root is the root, so a link cannot climb out
                    names.pop()
                    stacks.pop()
                continue
            rel = "/".join([*names, name])
            dirs, found = self._lookup(stacks[-1], rel)
            if dirs:
                names.append(name)
                stacks.append(dirs)
                continue
            if found is None:
                return None
            layer, st = found
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > MAX_SYMLINKS:
                    raise FailedPrecondition(f"{path} in image {chain_id}: too many levels of symbolic links")
                target = os.readlink(os.path.join(layer, rel))
                if target.startswith("/"):
                    names, stacks = [], [layers]
                todo.extendleft(reversed(target.split("/")))
                continue
            if any(part not in ("", ".") for part in todo):
                return None  # a file used as a directory: ENOTDIR, the path is not there
            if not stat.S_ISREG(st.st_mode):
                raise FailedPrecondition(f"{path} in image {chain_id} is not a regular file")
            if st.st_size > max_bytes:
                raise FailedPrecondition(f"{path} in image {chain_id} is {st.st_size} bytes, more than the "
                                         f"{max_bytes} read_file reads")
            fd = os.open(os.path.join(layer, rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with open(fd, "rb") as f:
                return f.read(max_bytes + 1)[:max_bytes]
        raise FailedPrecondition(f"{path} in image {chain_id} is a directory")

    @staticmethod
    def _lookup(stack: list[str], rel: str) -> tuple[list[str], tuple[str, os.stat_result] | None]:
        """What overlayfs shows at ``rel`` given the layers (top first) that show its parent as a
        directory: the layers where it is a directory too (down to an opaque one), or else the
        top non-directory, or neither (absent, or hidden by a whiteout)."""
        dirs: list[str] = []
        for layer in stack:
            path = os.path.join(layer, rel)
            try:
                st = os.lstat(path)
            except (FileNotFoundError, NotADirectoryError):
                continue
            if stat.S_ISDIR(st.st_mode):
                dirs.append(layer)
                try:
                    if os.getxattr(path, "trusted.overlay.opaque", follow_symlinks=False) == b"y":
                        break
                except OSError as exc:
                    if exc.errno not in (errno.ENODATA, errno.ENOTSUP):
                        raise
                continue
            if dirs or (stat.S_ISCHR(st.st_mode) and st.st_rdev == 0):
                break  # a file under a directory is hidden; a whiteout hides what is below
            return [], (layer, st)
        return dirs, None

    # -- active snapshots ----------------------------------------------------------------------

    def prepare(self, key: str, chain_id: str) -> list[Mount]:
        """Make the active snapshot ``key`` over the committed ``chain_id`` (a container's root
        file system) and return the mounts that show it: one overlay (``lowerdir`` top layer
        first, its own ``upperdir`` and ``workdir``, and ``index=off`` as containerd adds it where
        the kernel has that option), or for the empty image ("" or None) a bind mount of its empty
        upper directory.

        Raises InvalidArgument for an empty key, AlreadyExists when ``key`` exists, NotFound when
        ``chain_id`` is not committed, FailedPrecondition when the image has more layers than one
        overlay can stack (:data:`MAX_LAYERS`).
        """
        if not isinstance(key, str) or not key:
            raise InvalidArgument("a snapshot key must be a non-empty string")
        with ExitStack() as held:
            if chain_id:
                held.enter_context(self._chain_lock(chain_id, shared=True))  # gc keeps it meanwhile
            held.enter_context(self._global_lock())
            if self._record(_ACTIVE, key) is not None:
                raise AlreadyExists(f"snapshot {key!r} exists already")
            parents = self._chain_records(chain_id)
            snapshot_id = self._next_id()
            directory = os.path.join(self._dirs, str(snapshot_id))
            os.mkdir(directory, 0o700)
            try:
                os.mkdir(os.path.join(directory, "fs"))
                os.chmod(os.path.join(directory, "fs"), 0o755)
                os.mkdir(os.path.join(directory, "work"), 0o700)
                if parents:
                    # The overlay's root takes the upper dir's owner and mode: the image's.
                    top = os.lstat(self._fs(parents[0]))
                    os.chown(os.path.join(directory, "fs"), top.st_uid, top.st_gid)
                    os.chmod(os.path.join(directory, "fs"), stat.S_IMODE(top.st_mode))
                doc = _record(_ACTIVE, key, snapshot_id, chain_id or None, None, 0, 0)
                mounts = self._mounts(doc, parents)
                # The directory's fsync once the lock is let go: the prepares of a hundred
                # containers at once wait for the disk together, not one after another.
                write_json_atomic(self._record_path(_ACTIVE, key), doc, sync_dir=False)
            except BaseException:
                remove_tree(directory, ignore_errors=True)
                raise
        fsync_dir(self._meta[_ACTIVE])
        return mounts

    def view(self, key: str, chain_id: str) -> list[Mount]:
        """Make the snapshot ``key`` over the committed ``chain_id`` as :meth:`prepare` does, and
        return the mounts of a read-only view of the image's layers (what an image volume shows):
        an overlay of the lower layers alone (``ro``), or for an image of one layer, or the empty
        image, a read-only bind of its directory (overlayfs needs two layers without an upper
        one), as containerd's overlay snapshotter views. Its upper directory stays unused and
        goes with :meth:`remove`. Raises as :meth:`prepare`."""
        writable = self.prepare(key, chain_id)
        parents = self._chain_records(chain_id)
        if len(parents) > 1:
            lower = next(o for o in writable[0].options if o.startswith("lowerdir="))
            return [Mount("overlay", "overlay", (lower, "ro"))]
        directory = self._fs(parents[0]) if parents else writable[0].source
        return [Mount("bind", directory, ("ro", "rbind"))]

    def mounts(self, key: str) -> list[Mount]:
        """The mounts of the active snapshot ``key`` again. NotFound when it does not exist."""
        doc = self._record(_ACTIVE, key)
        if doc is None:
            raise NotFound(f"snapshot {key!r} does not exist")
        return self._mounts(doc, self._chain_records(doc["parent"] or ""))

    def remove(self, key: str) -> bool:
        """Remove the active snapshot ``key`` with its upper and work directories; False when
        there was none. Unmount it first: FailedPrecondition while its overlay is mounted here."""
        with self._global_lock():
            doc = self._record(_ACTIVE, key)
            if doc is None:
                return False
            upper = self._fs(doc)
            if _mounted_upper(upper):
                raise FailedPrecondition(f"snapshot {key!r} is still mounted (upperdir {upper}); unmount it first")
            trash = self._to_trash(doc)
        self._discard(trash)
        return True

    def _mounts(self, doc: dict[str, Any], parents: list[dict[str, Any]]) -> list[Mount]:
        upper = self._fs(doc)
        if not parents:
            return [Mount("bind", upper, ("rw", "rbind"))]
        options: tuple[str, ...] = (f"lowerdir={':'.join(self._fs(p) for p in parents)}", f"upperdir={upper}",
                   f"workdir={os.path.join(os.path.dirname(upper), 'work')}")
        if os.path.exists(_OVERLAY_INDEX_PARAMETER):
            # As containerd: layers are shared by many overlays, and the inodes index (when a
            # kernel turns it on by default) ties an upper dir to the lowers of its first mount.
            options += ("index=off",)
        if len(parents) > MAX_LAYERS:
            raise FailedPrecondition(f"the image has {len(parents)} layers, more than the {MAX_LAYERS} one overlay "
                                     "can stack")
        return [Mount("overlay", "overlay", options)]

    # -- gc and usage --------------------------------------------------------------------------

    def gc(self, keep_chain_ids: Iterable[str]) -> GcResult:
        """Remove the committed snapshots that neither an image (``keep_chain_ids``: every
        image's top chain id) nor an active snapshot uses, directly or as a parent. A chain
        being unpacked or prepared on meanwhile is kept. Returns what was removed.

        The caller keeps the chain ids of images still being pulled: a layer committed and not
        yet recorded by its image looks unused.
        """
        with self._global_lock():
            committed = {doc["name"]: doc for doc in self._records(_COMMITTED)}
            roots = set(keep_chain_ids) | {doc["parent"] for doc in self._records(_ACTIVE) if doc["parent"]}
            keep = self._with_parents(roots, committed)

            def depth(doc: dict[str, Any]) -> int:
                return len(self._with_parents({doc["name"]}, committed))

            removed, trash = [], []
            for doc in sorted((d for d in committed.values() if d["name"] not in keep), key=depth, reverse=True):
                if doc["name"] in keep:
                    continue  # the parent of one skipped below
                with self._chain_lock(doc["name"], blocking=False, unlink=True) as locked:
                    if not locked:  # being unpacked or prepared on now: keep it and what is below it
                        keep |= self._with_parents({doc["name"]}, committed)
                        continue
                    trash.append(self._to_trash(doc))
                    removed.append(doc)
        for path in trash:
            self._discard(path)
        return GcResult(tuple(doc["name"] for doc in removed), sum(doc["bytes"] for doc in removed),
                        sum(doc["inodes"] for doc in removed))

    def usage(self) -> Usage:
        """Bytes (apparent size of file data) and inodes of every snapshot: committed layers as
        recorded when unpacked, active upper directories as they are now."""
        total_bytes = total_inodes = 0
        for doc in self._records(_COMMITTED):
            total_bytes += doc["bytes"]
            total_inodes += doc["inodes"]
        for doc in self._records(_ACTIVE):
            try:
                used = _tree_usage(self._fs(doc))
            except FileNotFoundError:
                continue  # removed meanwhile
            total_bytes += used.bytes
            total_inodes += used.inodes
        return Usage(total_bytes, total_inodes)

    def active_usage(self, key: str) -> tuple[str, Usage]:
        """The upper directory of the active snapshot ``key`` (what its container writes) and
        its usage now, as :meth:`usage` counts it. NotFound when there is no such snapshot."""
        doc = self._record(_ACTIVE, key)
        if doc is None:
            raise NotFound(f"snapshot {key!r} does not exist")
        upper = self._fs(doc)
        try:
            return upper, _tree_usage(upper)
        except FileNotFoundError:
            raise NotFound(f"snapshot {key!r} was removed") from None

    # -- records, ids and locks ----------------------------------------------------------------

    def _record_path(self, kind: str, name: str) -> str:
        stem = name.partition(":")[2] if kind == _COMMITTED else hashlib.sha256(name.encode()).hexdigest()
        return os.path.join(self._meta[kind], stem + ".json")

    def _record(self, kind: str, name: str) -> dict[str, Any] | None:
        if kind == _COMMITTED:
            _check_digest(name, "chain id")
        try:
            doc = self._load(self._record_path(kind, name))
        except FileNotFoundError:
            return None
        return doc if doc is not None and doc["name"] == name else None

    def _records(self, kind: str) -> list[dict[str, Any]]:
        docs = []
        for entry in os.listdir(self._meta[kind]):
            if entry.endswith(".json") and not entry.startswith("."):
                try:
                    doc = self._load(os.path.join(self._meta[kind], entry))
                except FileNotFoundError:
                    continue  # removed meanwhile
                if doc is not None:
                    docs.append(doc)
        return docs

    @staticmethod
    def _load(path: str) -> dict[str, Any] | None:
        """The record in ``path``; None for one that cannot be read, which is removed with a
        WARNING: its snapshot is gone (its directory, unrecorded, is a leftover) and what needs
        it unpacks it again. Raises FileNotFoundError."""
        try:
            doc = decode_json(read_regular(path, RECORD_MAX_BYTES), path)
            if not isinstance(doc, dict) or doc.get("schema") != RECORD_SCHEMA:
                raise ValueError(f"it is not a snapshot record of schema {RECORD_SCHEMA}")
            for key, kinds in _RECORD_FIELDS.items():
                if not isinstance(doc.get(key), kinds) or isinstance(doc.get(key), bool):
                    raise ValueError(f"its {key} is {doc.get(key)!r}")
        except FileNotFoundError:
            raise
        except (OSError, ValueError) as exc:
            log.warning("snapshot record %s cannot be read, so its snapshot is dropped: %s", path, exc)
            unlink_quietly(path)
            return None
        return doc

    def _write_record(self, doc: dict[str, Any]) -> None:
        write_json_atomic(self._record_path(doc["kind"], doc["name"]), doc)

    def _chain_records(self, chain_id: str | None) -> list[dict[str, Any]]:
        """The committed records of ``chain_id`` and its parents, top first. NotFound when one
        is missing ("" or None is the empty image: no records)."""
        docs: list[dict[str, Any]] = []
        name = chain_id
        while name:
            doc = self._record(_COMMITTED, name)
            if doc is None:
                raise NotFound(f"snapshot {name} does not exist" + (f" (a parent of {chain_id})" if docs else ""))
            docs.append(doc)
            name = doc["parent"]
        return docs

    def _with_parents(self, names: set[str], committed: dict[str, dict[str, Any]]) -> set[str]:
        out: set[str] = set()
        for name in names:
            while name in committed and name not in out:
                out.add(name)
                name = committed[name]["parent"]
        return out

    def _fs(self, doc: dict[str, Any]) -> str:
        return os.path.join(self._dirs, str(doc["id"]), "fs")

    def _next_id(self) -> int:
        """A snapshot number no directory and no record has (called under the global lock)."""
        used = [int(entry) for entry in os.listdir(self._dirs) if entry.isdigit()]
        used += [doc["id"] for kind in (_COMMITTED, _ACTIVE) for doc in self._records(kind)]
        return max(used, default=0) + 1

    def _unpack_layer(self, chain_id: str, diff_id: str, blob_path: str, media_type: str | None,
                      limit: UnpackLimit | None) -> tuple[str, LayerStats]:
        tmp = os.path.join(self._dirs, f"tmp-{chain_id.partition(':')[2]}-{os.urandom(4).hex()}")
        return tmp, _unpack_into(tmp, blob_path, media_type, diff_id=diff_id, limit=limit)

    def _commit(self, layers: list[tuple[tuple[str, LayerStats], str, str | None, str]]) -> None:
        """Commit unpacked layers, ((directory, stats), chain id, parent, diff_id) from the bottom
        up: each directory renamed to its number, then the records written in that order (a
        record names a complete directory, and its parent's record comes first), with one fsync
        of each directory for the batch."""
        if not layers:
            return
        with self._global_lock():
            snapshot_id = self._next_id()
            moved: list[tuple[str, dict[str, Any]]] = []
            try:
                for (tmp, stats), chain_id, parent, diff_id in layers:
                    directory = os.path.join(self._dirs, str(snapshot_id))
                    if not rename_noreplace(tmp, directory):
                        os.rename(tmp, directory)  # no renameat2 here; the global lock keeps the number ours
                    moved.append((directory, _record(_COMMITTED, chain_id, snapshot_id, parent, diff_id, stats.bytes,
                                                     stats.inodes)))
                    snapshot_id += 1
                fsync_dir(self._dirs)
                while moved:
                    doc = moved[0][1]
                    write_json_atomic(self._record_path(_COMMITTED, doc["name"]), doc, sync_dir=False)
                    moved.pop(0)
                fsync_dir(self._meta[_COMMITTED])
            except BaseException:
                for directory, _ in moved:  # not recorded: not committed
                    self._discard(directory)
                raise

    def _to_trash(self, doc: dict[str, Any]) -> str:
        """Remove ``doc``'s record, then move its directory aside for :meth:`_discard` (called
        under the global lock: the rest of the deleting need not hold it)."""
        os.unlink(self._record_path(doc["kind"], doc["name"]))
        trash = os.path.join(self._dirs, f"trash-{os.urandom(6).hex()}")
        try:
            os.rename(os.path.join(self._dirs, str(doc["id"])), trash)
        except FileNotFoundError:
            pass
        return trash

    @staticmethod
    def _discard(path: str) -> None:
        """Remove ``path``; what cannot be removed is a warning, and is tried again at the next
        start (a trash or unrecorded directory is a leftover)."""
        try:
            remove_tree(path)
        except OSError as exc:
            log.warning("cannot remove %s, left for the next start to remove: %s", path, exc)

    def _remove_leftovers(self) -> None:
        """Remove what a killed process left: trash, layers it was unpacking (whose chain lock
        nobody holds now), directories without a record (made but never recorded)."""
        with self._global_lock():
            referenced = set()
            for kind in (_COMMITTED, _ACTIVE):
                for doc in self._records(kind):
                    referenced.add(str(doc["id"]))
            stale = []
            for entry in os.listdir(self._dirs):
                if entry.startswith("trash-") or (entry.isdigit() and entry not in referenced):
                    stale.append(entry)
                elif entry.startswith("tmp-"):
                    with self._chain_lock("sha256:" + entry.split("-")[1], blocking=False) as locked:
                        if locked:
                            stale.append(entry)
                elif entry.startswith("stage-"):
                    with flock_open(os.path.join(self._locks, entry), blocking=False, unlink=True) as fd:
                        if fd is not None:  # its pull is gone
                            stale.append(entry)
            for entry in stale:
                self._discard(os.path.join(self._dirs, entry))

    @contextmanager
    def _global_lock(self) -> Iterator[None]:
        with flock_open(os.path.join(self.root, "lock")):
            yield

    def _hold(self, held: ExitStack, chain_id: str) -> bool:
        """Lock ``chain_id`` until ``held`` closes: shared if it is committed (it is built on:
        gc keeps it), exclusive if not (this caller unpacks it; others wait). True when committed."""
        while True:
            with ExitStack() as shared:
                shared.enter_context(self._chain_lock(chain_id, shared=True))
                if self._record(_COMMITTED, chain_id) is not None:
                    held.enter_context(shared.pop_all())
                    return True
            held_now = ExitStack()
            held_now.enter_context(self._chain_lock(chain_id))
            if self._record(_COMMITTED, chain_id) is None:
                held.enter_context(held_now)
                return False
            held_now.close()  # committed by another while we waited: go back to a shared lock

    @contextmanager
    def _chain_lock(self, chain_id: str, *, shared: bool = False, blocking: bool = True,
                    unlink: bool = False) -> Iterator[bool]:
        hexdigest = chain_id.partition(":")[2]
        if not re.fullmatch(r"[0-9a-f]{64}", hexdigest):
            yield True  # a leftover with a name no unpack makes: nobody can hold its lock
            return
        with flock_open(os.path.join(self._locks, hexdigest), shared=shared, blocking=blocking, unlink=unlink) as fd:
            yield fd is not None


def _record(kind: str, name: str, snapshot_id: int, parent: str | None, diff_id: str | None, size: int,
            inodes: int) -> dict[str, Any]:
    return {"schema": RECORD_SCHEMA, "kind": kind, "name": name, "id": snapshot_id, "parent": parent,
            "diff_id": diff_id, "bytes": size, "inodes": inodes, "created_ns": time.time_ns()}


def _snapshot(doc: dict[str, Any]) -> Snapshot:
    return Snapshot(doc["kind"], doc["name"], doc["id"], doc["parent"], doc["diff_id"], doc["bytes"],
                    doc["inodes"], doc["created_ns"])


def _mounted_upper(upper: str) -> bool:
    """Whether an overlay mounted in this mount namespace uses ``upper`` as its upper dir."""
    needle = f"upperdir={upper}"
    try:
        return any(needle in mount.super_options.split(",") for mount in mountinfo.read())
    except OSError:
        return False
