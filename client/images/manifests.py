"""The OCI image model a pull reads: media types, descriptors, manifests and indexes, parsed and
checked (sans-IO: bytes in, typed values or a DataLoss/InvalidArgument/NotFound with a sentence out)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shim.lib.files import decode_json
from shim.rpc.status import DataLoss, InvalidArgument, NotFound

from .reference import ReferenceError, check_digest

__all__ = ["MANIFEST_V2", "MANIFEST_LIST_V2", "OCI_MANIFEST", "OCI_INDEX", "MEDIA_TYPES", "INDEXES", "Descriptor",
           "Manifest", "select_platform", "parse_manifest", "image_manifest"]

MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
MANIFEST_LIST_V2 = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
#: The manifest types a pull accepts (schema 1 is long deprecated and refused with a sentence).
MEDIA_TYPES = (MANIFEST_V2, OCI_MANIFEST, MANIFEST_LIST_V2, OCI_INDEX)
INDEXES = (MANIFEST_LIST_V2, OCI_INDEX)


@dataclass(frozen=True)
class Descriptor:
    """An OCI descriptor: a blob's media type, digest and size."""

    media_type: str
    digest: str
    size: int


@dataclass(frozen=True)
class Manifest:
    """One platform's image manifest: its config and its layers, lowest first."""

    media_type: str
    config: Descriptor
    layers: tuple[Descriptor, ...]


def select_platform(index: Mapping[str, Any], platform: Mapping[str, str], what: str) -> Descriptor:
    """The descriptor of ``platform``'s (os, architecture, variant) manifest in an index or
    manifest list, as containerd's platform matcher picks (a variant must match when both
    name one). Raises NotFound naming the platforms there are."""
    found = []
    manifests = index.get("manifests")
    if not isinstance(manifests, list):
        raise DataLoss(f"{what}: the index has no list of manifests")
    for entry in manifests:
        p = entry.get("platform") if isinstance(entry, dict) else None
        if not isinstance(p, dict):
            continue
        found.append(f"{p.get('os')}/{p.get('architecture')}" + (f"/{p['variant']}" if p.get("variant") else ""))
        if p.get("os") != platform["os"] or p.get("architecture") != platform["architecture"]:
            continue
        if p.get("variant") and platform.get("variant") and p["variant"] != platform["variant"]:
            continue
        return _descriptor(entry, what)
    wanted = f"{platform['os']}/{platform['architecture']}"
    raise NotFound(f"{what} has no image for {wanted} (it has: {', '.join(found) or 'none'})")


def _descriptor(entry: Any, what: str) -> Descriptor:
    if not isinstance(entry, dict):
        raise DataLoss(f"{what}: a descriptor is not an object")
    media_type, digest, size = entry.get("mediaType", ""), entry.get("digest"), entry.get("size")
    if not isinstance(digest, str) or not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise DataLoss(f"{what}: a descriptor has no valid digest and size")
    try:
        check_digest(digest)
    except ReferenceError as exc:
        raise DataLoss(f"{what}: {exc}") from None
    return Descriptor(str(media_type), digest, size)


def parse_manifest(data: bytes, what: str) -> tuple[str, dict[str, Any]]:
    """(media type, document) of a manifest or index. Raises DataLoss for one that is not JSON,
    InvalidArgument for a type a pull does not take (Docker schema 1)."""
    try:
        doc = decode_json(data, what)
    except ValueError as exc:
        raise DataLoss(str(exc)) from None
    if not isinstance(doc, dict):
        raise DataLoss(f"{what} is not a JSON object")
    media_type = doc.get("mediaType")
    if not media_type:  # OCI leaves it out; which one it is shows in its fields
        media_type = OCI_INDEX if "manifests" in doc else OCI_MANIFEST if "config" in doc else ""
    if doc.get("schemaVersion") == 1:
        raise InvalidArgument(f"{what} is a Docker schema 1 manifest, which podshim does not pull (it is "
                              "deprecated; push the image again with a current tool)")
    if media_type not in MEDIA_TYPES:
        raise InvalidArgument(f"{what} has the media type {media_type!r}, not an image manifest or index")
    return media_type, doc


def image_manifest(data: bytes, what: str) -> Manifest:
    """The :class:`Manifest` of one platform's manifest bytes. Raises DataLoss/InvalidArgument."""
    media_type, doc = parse_manifest(data, what)
    if media_type in INDEXES:
        raise DataLoss(f"{what} is an index where an image manifest was expected")
    layers = doc.get("layers")
    if not isinstance(layers, list):
        raise DataLoss(f"{what} has no list of layers")
    return Manifest(media_type, _descriptor(doc.get("config"), what), tuple(_descriptor(d, what) for d in layers))
