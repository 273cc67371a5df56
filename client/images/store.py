"""Image records: what images the node has, by id, tag and digest.

One JSON file per image, ``<state root>/images/records/<id hex>.json`` (the record's fields and
``"version": 1``), written atomically (temporary file, fsync, rename) when that image changes, so
a pull or a removal writes what it changes and nothing else, and a reader or a daemon that died
mid-write sees the old record or the new one. A record (:class:`ImageRecord`) is written only
once every blob it names is in the content store: a record is a complete image. The one
``images.json`` of earlier versions is split into these files the first time the store is loaded.

A record that cannot be read (damaged, another version, a config whose fields have the wrong
types) is left out with a WARNING naming its file: one bad record never keeps the node's other
images from being listed. :meth:`ImageStore.remove` by its id removes its file.

An image's id is its config's digest, as in containerd's CRI; its ``repo_tags`` and
``repo_digests`` are normalised references (``docker.io/library/busybox:latest``,
``host:5000/a@sha256:...``); a tag names one image at a time, so recording it on an image takes it
from whichever had it. :meth:`ImageStore.resolve` finds an image as containerd's CRI does: by id
(``sha256:HEX`` or ``HEX``), by a unique id prefix, by a tag or digest reference in any form
(``busybox`` finds ``docker.io/library/busybox:latest``). Sans-IO apart from load and the writes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from shim.lib.files import (
    decode_json,
    ensure_private_dir,
    fsync_dir,
    read_json,
    read_regular,
    unlink_quietly,
    write_atomic,
)
from shim.rpc.status import DataLoss, InvalidArgument

from .imageconfig import MAX_CONFIG_BYTES, check_config
from .reference import ReferenceError, parse

__all__ = ["STORE_VERSION", "RECORDS_DIR", "LEGACY_RECORDS_FILE", "Layer", "ImageRecord", "ImageStore"]

log = logging.getLogger(__name__)

#: The version of a record's schema; a record of another version is left out, never guessed at.
STORE_VERSION = 1
RECORDS_DIR = "records"
#: Where earlier versions kept every record in one document; split into RECORDS_DIR at load.
LEGACY_RECORDS_FILE = "images.json"
#: The largest record file read: a config (at most MAX_CONFIG_BYTES) with the rest of the record.
MAX_RECORD_BYTES = 2 * MAX_CONFIG_BYTES + (1 << 20)
_HEX_PREFIX = re.compile(r"(?:sha256:)?([a-f0-9]{1,64})")
_RECORD_NAME = re.compile(r"([a-f0-9]{64})\.json")


@dataclass(frozen=True)
class Layer:
    """One layer: its blob (compressed, as the registry serves it) and its diff_id (the sha256
    of the uncompressed tar, from the image config)."""

    digest: str
    size: int
    media_type: str
    diff_id: str


@dataclass(frozen=True)
class ImageRecord:
    """One image (see the module's docstring)."""

    image_id: str
    repo_tags: tuple[str, ...]
    repo_digests: tuple[str, ...]
    manifest_digest: str
    manifests: tuple[str, ...]  # every manifest and index blob it keeps (the repo digests' and this platform's)
    config: dict[str, Any] = field(repr=False)
    layers: tuple[Layer, ...] = ()
    size: int = 0  # bytes of its blobs (compressed layers, config, manifest), as containerd's CRI counts
    chain_id: str = ""  # the snapshot of all its layers, once unpacked ("" before)

    @property
    def blobs(self) -> set[str]:
        """Every blob in the content store this image needs."""
        return {*self.manifests, self.image_id, *(layer.digest for layer in self.layers)}

    @property
    def short_id(self) -> str:
        return self.image_id.partition(":")[2][:12]

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["layers"] = [asdict(layer) for layer in self.layers]
        return doc

    @classmethod
    def from_json(cls, doc: Any) -> ImageRecord:
        """A record from its JSON form. Raises ValueError (KeyError, TypeError) when it is malformed."""
        if not isinstance(doc, dict):
            raise ValueError("an image record is not an object")
        layers = tuple(Layer(str(d["digest"]), int(d["size"]), str(d["media_type"]), str(d["diff_id"]))
                       for d in doc["layers"])
        config = doc["config"]
        if not isinstance(config, dict):
            raise ValueError("an image record's config is not an object")
        return cls(str(doc["image_id"]), tuple(map(str, doc["repo_tags"])), tuple(map(str, doc["repo_digests"])),
                   str(doc["manifest_digest"]), tuple(map(str, doc["manifests"])), config, layers,
                   int(doc["size"]), str(doc.get("chain_id", "")))


class ImageStore:
    """The records under ``root`` (``<state root>/images``)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.directory = os.path.join(root, RECORDS_DIR)
        self._images: dict[str, ImageRecord] = {}
        self._unreadable: dict[str, str] = {}  # image id -> its record's file, left out at load

    def load(self) -> ImageStore:
        """Read the records (splitting an earlier version's images.json into files first); a
        record that cannot be read is left out with a WARNING. Returns self. Raises OSError when
        the directories cannot be made or listed, DataLoss for an images.json of another version."""
        ensure_private_dir(self.root, 0o700, keep_mode=True)
        ensure_private_dir(self.directory, 0o700)
        self._migrate()
        self._images, self._unreadable = {}, {}
        written: dict[str, int] = {}
        for name in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            match = _RECORD_NAME.fullmatch(name)
            if match is None:
                if name.startswith("."):
                    unlink_quietly(path)  # a write a killed process had not renamed into place
                else:
                    log.warning("%s is not an image record (its name is not <id hex>.json); leaving it alone", path)
                continue
            image_id = "sha256:" + match[1]
            try:
                record, written[image_id] = self._read(path, image_id)
            except (OSError, ValueError, InvalidArgument) as exc:
                log.warning("image record %s cannot be read, so image %s is left out: %s (RemoveImage %s removes "
                            "it; pull the image again to have it back)", path, image_id, _reason(exc), image_id)
                self._unreadable[image_id] = path
                continue
            self._images[image_id] = record
        self._give_each_tag_one_image(written)
        return self

    def _give_each_tag_one_image(self, written: dict[str, int]) -> None:
        """A tag on several records (a tag move cut short between its two writes) stays on the
        record written last, and is taken from the others."""
        holders: dict[str, list[tuple[int, str]]] = {}
        for record in self._images.values():
            for tag in record.repo_tags:
                holders.setdefault(tag, []).append((written[record.image_id], record.image_id))
        for tag, held in holders.items():
            if len(held) < 2:
                continue
            keep = max(held)[1]
            log.warning("tag %s was on %d images (a change was cut short); it stays on %s, recorded last", tag,
                        len(held), keep)
            for _, image_id in held:
                if image_id != keep:
                    self._take_tags(self._images[image_id], (tag,))

    @staticmethod
    def _read(path: str, image_id: str) -> tuple[ImageRecord, int]:
        """The record in ``path``, which must be of ``image_id``, and when it was written (ns).
        Raises OSError, ValueError or InvalidArgument saying what is wrong."""
        doc = decode_json(read_regular(path, MAX_RECORD_BYTES), path)
        if not isinstance(doc, dict) or doc.get("version") != STORE_VERSION:
            version = doc.get("version") if isinstance(doc, dict) else None
            raise ValueError(f"it has version {version!r}; this podshim reads version {STORE_VERSION}")
        try:
            record = ImageRecord.from_json(doc)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"it is malformed: {exc!r}") from None
        if record.image_id != image_id:
            raise ValueError(f"it holds the record of {record.image_id}")
        check_config(record.config, "its config", len(record.layers))
        written = doc.get("written_ns", 0)
        return record, written if isinstance(written, int) else 0

    def _migrate(self) -> None:
        """Split an earlier version's images.json into record files, then remove it."""
        legacy = os.path.join(self.root, LEGACY_RECORDS_FILE)
        try:
            doc = read_json(legacy)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            aside = legacy + ".unreadable"
            os.replace(legacy, aside)
            log.warning("the image records %s cannot be read, so their images are left out: %s; moved to %s",
                        legacy, exc, aside)
            return
        if not isinstance(doc, dict) or doc.get("version") != STORE_VERSION:
            version = doc.get("version") if isinstance(doc, dict) else None
            raise DataLoss(f"the image records {legacy} have version {version!r}; this podshim reads version "
                           f"{STORE_VERSION}")
        docs = doc.get("images")
        for number, item in enumerate(docs if isinstance(docs, list) else []):
            try:
                self._write(ImageRecord.from_json(item), sync_dir=False)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("image record %d of %s is malformed, so its image is left out: %r", number, legacy, exc)
        fsync_dir(self.directory)
        os.unlink(legacy)
        fsync_dir(self.root)
        log.info("split the image records of %s into %s", legacy, self.directory)

    def _path(self, image_id: str) -> str:
        return os.path.join(self.directory, image_id.partition(":")[2] + ".json")

    def _write(self, record: ImageRecord, *, sync_dir: bool = True) -> None:
        doc = {"version": STORE_VERSION, "written_ns": time.time_ns(), **record.to_json()}
        write_atomic(self._path(record.image_id), json.dumps(doc, sort_keys=True, ensure_ascii=False).encode(),
                     sync_dir=sync_dir)

    # -- reading -------------------------------------------------------------------------------

    def list(self) -> list[ImageRecord]:
        """Every image, in no particular order."""
        return list(self._images.values())

    def get(self, image_id: str) -> ImageRecord | None:
        return self._images.get(image_id)

    def resolve(self, text: str) -> ImageRecord | None:
        """The image ``text`` names: an id, a unique id prefix, or a reference (tag or digest) in
        any form; None when it names none (or an id prefix more than one image has)."""
        if not text:
            return None
        by_id = self._images.get(text) or self._images.get("sha256:" + text)
        if by_id is not None:
            return by_id
        try:
            ref = str(parse(text))
        except ReferenceError:
            ref = None
        if ref is not None:
            for record in list(self._images.values()):  # (a copy: a pull may add one meanwhile)
                if ref in record.repo_tags or ref in record.repo_digests:
                    return record
        prefix = _HEX_PREFIX.fullmatch(text)
        if prefix:
            found = [r for r in list(self._images.values()) if r.image_id.partition(":")[2].startswith(prefix[1])]
            if len(found) == 1:
                return found[0]
        return None

    def referenced_blobs(self) -> set[str]:
        """Every blob some image needs."""
        return set().union(*(r.blobs for r in self._images.values()))

    # -- changing ------------------------------------------------------------------------------

    def add(self, record: ImageRecord) -> ImageRecord:
        """Record ``record``, merged with the record of the same id (tags and digests added); its
        tags are taken from any other image that had them (an image left with no tag and no
        digest is removed). Returns the image's record as stored."""
        old = self._images.get(record.image_id)
        if old is not None:
            record = replace(record, repo_tags=_union(old.repo_tags, record.repo_tags),
                             repo_digests=_union(old.repo_digests, record.repo_digests),
                             manifests=_union(old.manifests, record.manifests),
                             chain_id=record.chain_id or old.chain_id)
        self._write(record)
        self._images[record.image_id] = record
        self._unreadable.pop(record.image_id, None)  # its file is this record now
        for other in list(self._images.values()):
            if other.image_id != record.image_id:
                self._take_tags(other, record.repo_tags)
        return record

    def _take_tags(self, record: ImageRecord, tags: Iterable[str]) -> None:
        """Take ``tags`` from ``record``'s image; an image left with no tag and no digest is removed."""
        kept = tuple(t for t in record.repo_tags if t not in tags)
        if kept == record.repo_tags:
            return
        if kept or record.repo_digests:
            self._images[record.image_id] = replace(record, repo_tags=kept)
            self._write(self._images[record.image_id])
        else:
            self.remove(record.image_id)

    def remove(self, image_id: str) -> ImageRecord | None:
        """Forget the image ``image_id`` (all its tags and digests), removing its record's file,
        also one that could not be read at load; the record that was there."""
        record = self._images.get(image_id)
        if record is None and image_id not in self._unreadable:
            return None
        unlink_quietly(self._path(image_id))
        fsync_dir(self.directory)
        self._images.pop(image_id, None)
        self._unreadable.pop(image_id, None)
        return record

    def unreadable(self, text: str) -> str | None:
        """The id of the image whose record could not be read that ``text`` names (its id, with
        or without ``sha256:``), or None."""
        image_id = text if text.startswith("sha256:") else "sha256:" + text
        return image_id if image_id in self._unreadable else None

    def set_chain_id(self, image_id: str, chain_id: str) -> None:
        record = self._images.get(image_id)
        if record is not None and record.chain_id != chain_id:
            self._images[image_id] = replace(record, chain_id=chain_id)
            self._write(self._images[image_id])


def _reason(exc: Exception) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return exc.message if isinstance(exc, InvalidArgument) else str(exc)


def _union(a: Iterable[str], b: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys([*a, *b]))
