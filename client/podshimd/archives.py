"""``podshim.images.v1.Images``: image archives and pull progress, which CRI has no RPCs for, served by
podshimd beside CRI on its socket, so that the image store keeps one writer (podshimd, under its
state root's lock) while podshimctl imports and exports.

Each method is unary gRPC with a JSON object as request and reply (no generated code: CRI's schema
is not ours to extend):

- ``Import`` ``{"path": ABSOLUTE}`` -> ``{"images": [IMAGE...]}``: the archive's images, imported as
  :meth:`client.images.service.Images.import_archive` does. podshimd reads the file: it must be
  at that path on podshimd's node and in its mount namespace (podshimctl passes an absolute path).
- ``Export`` ``{"images": [NAME...], "path": ABSOLUTE, "format": "oci-archive"|"docker-archive"}`` ->
  ``{"images": [IMAGE...], "path": ..., "bytes": N}``: written by podshimd at that path.
- ``Pull`` ``{"image": NAME, "auth": {AuthConfig's fields}}`` -> ``{"image": IMAGE, "up_to_date": BOOL}``:
  PullImage, and whether the node had the image and every layer of it already (and the reference
  still names it): nothing was downloaded or unpacked.
- ``PullProgress`` ``{"image": NAME}`` -> ``{"pulling": BOOL, "layers": N, "layers_done": N,
  "bytes": N, "bytes_done": N}`` of the pull of NAME in flight (``layers`` and ``bytes`` 0 until
  its manifest is read).

IMAGE is ``{"id", "repo_tags", "repo_digests", "size"}``. Errors are statuses with a sentence, as
CRI's (the server maps what a handler raises: :mod:`shim.grpcwire.aio`).
"""

from __future__ import annotations

import json
import os
from typing import Any

from shim.grpcwire.aio import Method
from shim.rpc.status import InvalidArgument

from client.images.archive import FORMATS, OCI_ARCHIVE
from client.images.service import Images
from client.images.skopeo import AuthConfig
from client.images.store import ImageRecord

__all__ = ["SERVICE", "methods"]

SERVICE = "podshim.images.v1.Images"


def _image(record: ImageRecord) -> dict[str, Any]:
    return {"id": record.image_id, "repo_tags": list(record.repo_tags), "repo_digests": list(record.repo_digests),
            "size": record.size}


def _request(data: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(data or b"{}")
    except ValueError as exc:
        raise InvalidArgument(f"the request is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidArgument("the request is not a JSON object")
    return doc


def _string(doc: dict[str, Any], key: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{key} must be a non-empty string")
    return value


def _absolute(doc: dict[str, Any]) -> str:
    path = _string(doc, "path")
    if not os.path.isabs(path):
        raise InvalidArgument(f"path must be absolute (podshimd reads and writes it), not {path!r}")
    return path


class _Archives:
    """The methods; each ``(self, request: dict, context) -> dict``."""

    def __init__(self, images: Images) -> None:
        self.images = images

    async def Import(self, request: dict[str, Any], context: Any) -> dict[str, Any]:
        records = await self.images.import_archive(_absolute(request))
        return {"images": [_image(r) for r in records]}

    async def Export(self, request: dict[str, Any], context: Any) -> dict[str, Any]:
        path = _absolute(request)
        names = request.get("images")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
            raise InvalidArgument("images must be a non-empty list of image names")
        archive_format = request.get("format", OCI_ARCHIVE)
        if archive_format not in FORMATS:
            raise InvalidArgument(f"format must be one of {', '.join(FORMATS)}, not {archive_format!r}")
        records, size = await self.images.export_archive(names, path, archive_format)
        return {"images": [_image(r) for r in records], "path": path, "bytes": size}

    async def Pull(self, request: dict[str, Any], context: Any) -> dict[str, Any]:
        auth = request.get("auth") or {}
        if not isinstance(auth, dict) or not all(k in AuthConfig.__dataclass_fields__ and isinstance(v, str)
                                                 for k, v in auth.items()):
            raise InvalidArgument("auth must be an object of AuthConfig's string fields")
        record, up_to_date = await self.images.pull_reporting(_string(request, "image"), AuthConfig(**auth) or None)
        return {"image": _image(record), "up_to_date": up_to_date}

    async def PullProgress(self, request: dict[str, Any], context: Any) -> dict[str, Any]:
        return self.images.pull_progress(_string(request, "image"))


def _reply(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


def methods(images: Images) -> dict[str, Method]:
    """The service's methods, by path, for podshimd's gRPC server."""
    archives = _Archives(images)
    return {f"/{SERVICE}/{name}": Method(getattr(archives, name), _request, _reply, where=f"_Archives.{name}")
            for name in ("Import", "Export", "Pull", "PullProgress")}
