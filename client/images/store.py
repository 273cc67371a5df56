"""Image records: what images the node has, by id, tag and digest.

One JSON document, ``<state root>/images/images.json`` (``{"version": 1, "images": [...]}``),
rewritten atomically (temporary file, fsync, rename) on every change, so a reader or a daemon that
died mid-write sees the old records or the new ones. A record (:class:`ImageRecord`) is written only
once every blob it names is in the content store: a record is a complete image.

An image's id is its config's digest, as in containerd's CRI; its ``repo_tags`` and
``repo_digests`` are normalised references (``docker.io/library/busybox:latest``,
``host:5000/a@sha256:...``); a tag names one image at a time, so recording it on an image takes it
from whichever had it. :meth:`ImageStore.resolve` finds an image as containerd's CRI does: by id
(``sha256:HEX`` or ``HEX``), by a unique id prefix, by a tag or digest reference in any form
(``busybox`` finds ``docker.io/library/busybox:latest``). Sans-IO apart from load and save.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from shim.rpc.files import ensure_private_dir, read_json, write_atomic
from shim.rpc.status import DataLoss

from .reference import ReferenceError, parse

__all__ = ["STORE_VERSION", "RECORDS_FILE", "Layer", "ImageRecord", "ImageStore"]

#: The version of images.json's schema; a file of another version is refused, never guessed at.
STORE_VERSION = 1
RECORDS_FILE = "images.json"
_HEX_PREFIX = re.compile(r"(?:sha256:)?([a-f0-9]{1,64})")


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
        self.path = os.path.join(root, RECORDS_FILE)
        self._images: dict[str, ImageRecord] = {}

    def load(self) -> ImageStore:
        """Read the records (none when there is no file yet); returns self. Raises DataLoss with
        a sentence for a file podshim cannot read (another version, malformed)."""
        ensure_private_dir(self.root, 0o700, keep_mode=True)
        try:
            doc = read_json(self.path)
        except FileNotFoundError:
            self._images = {}
            return self
        except (OSError, ValueError) as exc:
            raise DataLoss(f"cannot read the image records {self.path}: {exc}") from None
        if not isinstance(doc, dict) or doc.get("version") != STORE_VERSION:
            version = doc.get("version") if isinstance(doc, dict) else None
            raise DataLoss(f"the image records {self.path} have version {version!r}; this podshim reads version "
                           f"{STORE_VERSION}")
        try:
            records = [ImageRecord.from_json(d) for d in doc["images"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise DataLoss(f"the image records {self.path} are malformed: {exc!r}") from None
        self._images = {r.image_id: r for r in records}
        return self

    def _save(self) -> None:
        doc = {"version": STORE_VERSION, "images": [r.to_json() for r in self._images.values()]}
        write_atomic(self.path, json.dumps(doc, indent=1, sort_keys=True).encode())

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
            for record in self._images.values():
                if ref in record.repo_tags or ref in record.repo_digests:
                    return record
        prefix = _HEX_PREFIX.fullmatch(text)
        if prefix:
            found = [r for r in self._images.values() if r.image_id.partition(":")[2].startswith(prefix[1])]
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
        for other in list(self._images.values()):
            if other.image_id == record.image_id:
                continue
            tags = tuple(t for t in other.repo_tags if t not in record.repo_tags)
            if tags != other.repo_tags:
                if tags or other.repo_digests:
                    self._images[other.image_id] = replace(other, repo_tags=tags)
                else:
                    del self._images[other.image_id]
        self._images[record.image_id] = record
        self._save()
        return record

    def remove(self, image_id: str) -> ImageRecord | None:
        """Forget the image ``image_id`` (all its tags and digests); the record that was there."""
        record = self._images.pop(image_id, None)
        if record is not None:
            self._save()
        return record

    def set_chain_id(self, image_id: str, chain_id: str) -> None:
        record = self._images.get(image_id)
        if record is not None and record.chain_id != chain_id:
            self._images[image_id] = replace(record, chain_id=chain_id)
            self._save()


def _union(a: Iterable[str], b: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys([*a, *b]))
