"""Image archives: the images of an OCI archive or a docker-archive into the content store, and
images out of it as either, for nodes without a registry.

The two formats, as the tools that make them write them:

- **OCI archive** (``ctr images export``, ``skopeo copy … oci-archive:FILE[:NAME]``, ``podman save
  --format oci-archive``): a tar of an OCI image layout: ``oci-layout``, ``index.json`` whose
  ``manifests`` are image manifests or indexes (the image's name in the annotation
  ``io.containerd.image.name``, or ``org.opencontainers.image.ref.name`` when that is a whole
  reference), and every blob at ``blobs/sha256/HEX``.
- **docker-archive** (``docker save``, ``podman save``, ``skopeo copy … docker-archive:FILE``):
  a tar with ``manifest.json``, a list of ``{"Config": PATH, "RepoTags": [...], "Layers": [PATH...]}``;
  the config's sha256 is the image's id, the layers are tars (uncompressed as docker writes them:
  their sha256 is the config's diff_id). An OCI manifest with those blobs is made for it, as
  containerd's import makes one.

:func:`read_archive` is what a pull's download is for an archive: every blob it keeps is verified
(the sha256 its name or descriptor gives, before it counts; a docker layer's against its diff_id)
and moved into the content store; a manifest or config past a pull's size bounds, an archive that
is truncated or damaged, a blob whose bytes are not its digest, are refused with a pull's
status and sentence (DATA_LOSS names the blob). The archive is read as a tar and never unpacked by
its names: each blob is copied to a file of ours under the content store's ingest/. Unpacking the
layers and recording the images are the caller's (:meth:`client.images.service.Images.import_archive`,
with a pull's unpack bounds). :func:`write_archive` writes images from the store as either format,
into a temporary file renamed onto the destination once complete.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from shim.lib.files import decode_json
from shim.rpc.status import DataLoss, InvalidArgument, NotFound, ResourceExhausted, Unimplemented

from .content import BlobError, ContentStore, sha256_digest
from .imageconfig import MAX_CONFIG_BYTES, check_config
from .manifests import (
    MANIFEST_LIST_V2,
    OCI_INDEX,
    OCI_MANIFEST,
    Descriptor,
    Manifest,
    image_manifest,
    parse_manifest,
    select_platform,
)
from .reference import Reference, ReferenceError, parse

__all__ = ["OCI_ARCHIVE", "DOCKER_ARCHIVE", "FORMATS", "MAX_MANIFEST_BYTES", "ArchivedImage", "read_archive",
           "write_archive"]

OCI_ARCHIVE = "oci-archive"
DOCKER_ARCHIVE = "docker-archive"
FORMATS = (OCI_ARCHIVE, DOCKER_ARCHIVE)
#: The largest index.json, manifest.json or manifest read (containers/image's bound on a manifest).
MAX_MANIFEST_BYTES = 4 << 20
_CHUNK = 1 << 20
_OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
_LAYER_TYPES = {"gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
                "zstd": "application/vnd.oci.image.layer.v1.tar+zstd", "tar": "application/vnd.oci.image.layer.v1.tar"}
_NAME_ANNOTATION = "io.containerd.image.name"
_REF_ANNOTATION = "org.opencontainers.image.ref.name"
_BLOB = re.compile(r"blobs/sha256/([0-9a-f]{64})")


@dataclass(frozen=True)
class ArchivedImage:
    """One image of an archive, its blobs now in the content store: ``names`` its references (tags;
    none when the archive names it by a bare tag or not at all)."""

    names: tuple[Reference, ...]
    manifest_digest: str
    manifest: Manifest
    config: dict[str, Any]


class _Archive:
    """The members of a tar by normalised name; reads them bounded and verified."""

    def __init__(self, path: str, tar: tarfile.TarFile) -> None:
        self.path = path
        self.tar = tar
        self.members = {os.path.normpath(m.name).lstrip("/"): m for m in tar.getmembers()}

    def open(self, name: str) -> IO[bytes]:
        member = self.members.get(os.path.normpath(name).lstrip("/"))
        source = self.tar.extractfile(member) if member is not None else None  # a link: its target's data
        if source is None:
            raise DataLoss(f"archive {self.path}: it has no file {name!r}")
        return source

    def read(self, name: str, limit: int, what: str) -> bytes:
        with self.open(name) as source:
            data = source.read(limit + 1)
        if len(data) > limit:
            raise InvalidArgument(f"archive {self.path}: {what} is larger than the {limit} bytes an import takes")
        return data

    def json(self, name: str, what: str) -> Any:
        try:
            return decode_json(self.read(name, MAX_MANIFEST_BYTES, what), f"archive {self.path}: {what}")
        except ValueError as exc:
            raise DataLoss(str(exc)) from None

    def blob_bytes(self, name: str, digest: str, limit: int, what: str) -> bytes:
        """A small blob's bytes, checked against ``digest``."""
        data = self.read(name, limit, what)
        if sha256_digest(data) != digest:
            raise DataLoss(f"archive {self.path}: blob {digest} is corrupt or truncated: its content's digest is "
                           f"{sha256_digest(data)}")
        return data

    def copy(self, name: str, destination: str) -> tuple[str, int]:
        """Copy the member ``name`` to the new file ``destination``; its (sha256 digest, size)."""
        hasher, size = hashlib.sha256(), 0
        with self.open(name) as source, open(destination, "xb") as out:
            while chunk := source.read(_CHUNK):
                hasher.update(chunk)
                out.write(chunk)
                size += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        return "sha256:" + hasher.hexdigest(), size


class _Importer:
    """One archive's images into the content store (see :func:`read_archive`)."""

    def __init__(self, archive: _Archive, content: ContentStore, work: str, platform: Mapping[str, str],
                 max_bytes: int) -> None:
        self.archive, self.content, self.work, self.platform = archive, content, work, platform
        self.budget = max_bytes
        self.path = archive.path

    def layer(self, name: str, digest: str | None = None, size: int | None = None) -> tuple[str, int]:
        """Move the layer member ``name`` into the store (checked against ``digest`` and ``size``
        when the archive gives them); its (digest, size)."""
        member = self.archive.members.get(os.path.normpath(name).lstrip("/"))
        if member is not None and member.isfile():
            self.budget -= member.size
            if self.budget < 0:
                raise ResourceExhausted(f"archive {self.path}: its layers are larger than image_pull_max_unpacked_bytes")
        temporary = os.path.join(self.work, f"layer-{len(os.listdir(self.work))}")
        actual, copied = self.archive.copy(name, temporary)
        if digest is not None and actual != digest:
            raise DataLoss(f"archive {self.path}: blob {digest} is corrupt or truncated: its content's digest is "
                           f"{actual}")
        try:
            self.content.add_file(temporary, actual, size, verified=True)
        except BlobError as exc:
            raise DataLoss(f"archive {self.path}: {exc}") from None
        return actual, copied

    def oci(self) -> list[ArchivedImage]:
        index = self.archive.json("index.json", "index.json")
        if not isinstance(index, dict) or not isinstance(index.get("manifests"), list):
            raise DataLoss(f"archive {self.path}: index.json has no list of manifests")
        images = []
        for entry in index["manifests"]:
            if not isinstance(entry, dict):
                raise DataLoss(f"archive {self.path}: index.json has a descriptor that is not an object")
            annotations: dict[str, Any] = entry["annotations"] if isinstance(entry.get("annotations"), dict) else {}
            names = _names([annotations.get(_NAME_ANNOTATION), annotations.get(_REF_ANNOTATION)])
            descriptor = _descriptor(entry, self.path)
            platform = entry.get("platform")
            if isinstance(platform, dict) and (platform.get("os"), platform.get("architecture")) != \
                    (self.platform["os"], self.platform["architecture"]):
                continue  # another platform's image of a multi-platform archive
            images.append(self._oci_image(descriptor, names))
        if not images:
            raise NotFound(f"archive {self.path} has no image for {self.platform['os']}/{self.platform['architecture']}")
        return images

    def _oci_image(self, descriptor: Descriptor, names: tuple[Reference, ...]) -> ArchivedImage:
        what = f"manifest {descriptor.digest}"
        data = self.archive.blob_bytes(_blob_name(descriptor.digest), descriptor.digest, MAX_MANIFEST_BYTES, what)
        media_type, doc = parse_manifest(data, f"archive {self.path}: {what}")
        if media_type in (OCI_INDEX, MANIFEST_LIST_V2):
            self.content.add_bytes(data, descriptor.digest)
            chosen = select_platform(doc, self.platform, f"archive {self.path}: index {descriptor.digest}")
            what = f"manifest {chosen.digest}"
            data = self.archive.blob_bytes(_blob_name(chosen.digest), chosen.digest, MAX_MANIFEST_BYTES, what)
            descriptor = chosen
        manifest = image_manifest(data, f"archive {self.path}: {what}")
        config_data = self._config_bytes(manifest.config, _blob_name(manifest.config.digest))
        config = _config(config_data, manifest.config.digest, len(manifest.layers), self.path)
        for layer in manifest.layers:
            self.layer(_blob_name(layer.digest), layer.digest, layer.size)
        self.content.add_bytes(config_data, manifest.config.digest)
        self.content.add_bytes(data, descriptor.digest)
        return ArchivedImage(names, descriptor.digest, manifest, config)

    def _config_bytes(self, descriptor: Descriptor, name: str) -> bytes:
        if descriptor.size > MAX_CONFIG_BYTES:
            raise InvalidArgument(f"archive {self.path}: config {descriptor.digest} is {descriptor.size} bytes, more "
                                  f"than the {MAX_CONFIG_BYTES} bytes an image config may have")
        return self.archive.blob_bytes(name, descriptor.digest, MAX_CONFIG_BYTES, f"config {descriptor.digest}")

    def docker(self) -> list[ArchivedImage]:
        entries = self.archive.json("manifest.json", "manifest.json")
        if not isinstance(entries, list) or not entries:
            raise DataLoss(f"archive {self.path}: manifest.json is not a list of images")
        return [self._docker_image(entry) for entry in entries]

    def _docker_image(self, entry: Any) -> ArchivedImage:
        if not isinstance(entry, dict) or not isinstance(entry.get("Config"), str) or \
                not isinstance(entry.get("Layers"), list) or not all(isinstance(p, str) for p in entry["Layers"]):
            raise DataLoss(f"archive {self.path}: manifest.json has an entry without Config and Layers")
        config_data = self.archive.read(entry["Config"], MAX_CONFIG_BYTES, f"config {entry['Config']}")
        config_digest = sha256_digest(config_data)
        named = re.fullmatch(r"(?:blobs/sha256/)?([0-9a-f]{64})(?:\.json)?", os.path.normpath(entry["Config"]))
        if named and named[1] != config_digest.partition(":")[2]:
            raise DataLoss(f"archive {self.path}: blob sha256:{named[1]} is corrupt or truncated: its content's "
                           f"digest is {config_digest}")
        config_descriptor = Descriptor(_OCI_CONFIG, config_digest, len(config_data))
        config = _config(config_data, config_digest, len(entry["Layers"]), self.path)
        layers = []
        for name, diff_id in zip(entry["Layers"], config["rootfs"]["diff_ids"], strict=False):
            digest, size = self.layer(name)
            kind = _compression(self.content.path(digest))
            if kind == "tar" and digest != diff_id:
                raise DataLoss(f"archive {self.path}: layer {name} is corrupt or truncated: its digest is {digest}, "
                               f"but the image config's diff_id for it is {diff_id}")
            layers.append(Descriptor(_LAYER_TYPES[kind], digest, size))
        manifest = Manifest(OCI_MANIFEST, config_descriptor, tuple(layers))
        data = _manifest_bytes(manifest)
        self.content.add_bytes(config_data, config_digest)
        manifest_digest = sha256_digest(data)
        self.content.add_bytes(data, manifest_digest)
        return ArchivedImage(_names(entry.get("RepoTags") or []), manifest_digest, manifest, config)


def read_archive(path: str, content: ContentStore, work: str, platform: Mapping[str, str],
                 max_bytes: int) -> list[ArchivedImage]:
    """The images of the archive at ``path`` (OCI archive or docker-archive, plain or gzip'd),
    their blobs verified and added to ``content`` (``work``: an empty directory of ours on the
    store's filesystem, for the copies); the images of ``platform`` only. Raises NotFound (no
    such file, no image for this platform), InvalidArgument (not an archive, past a size bound),
    DataLoss (damaged, truncated, a blob that is not its digest), ResourceExhausted (layers past
    ``max_bytes``). Blocking."""
    try:
        with tarfile.open(path, "r:*") as tar:
            archive = _Archive(path, tar)
            importer = _Importer(archive, content, work, platform, max_bytes)
            if "index.json" in archive.members and "oci-layout" in archive.members:
                return importer.oci()
            if "manifest.json" in archive.members:
                return importer.docker()
            raise InvalidArgument(f"{path} is neither an OCI archive (oci-layout, index.json) nor a docker-archive "
                                  "(manifest.json)")
    except FileNotFoundError:
        raise NotFound(f"archive {path} does not exist") from None
    except IsADirectoryError:
        raise InvalidArgument(f"archive {path} is a directory, not a tar archive") from None
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno is not None:
            raise
        raise DataLoss(f"archive {path} is not a tar archive, or is damaged or truncated: {exc}") from None


# -- export ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Exported:
    """What an archive gets of one image: its names, its manifest (digest, media type, size), its
    config and layers as (digest, media type, diff_id)."""

    names: tuple[str, ...]
    manifest: Descriptor
    config: str
    layers: tuple[tuple[str, str, str], ...]


def write_archive(destination: str, images: Sequence[Any], content: ContentStore, archive_format: str) -> int:
    """Write ``images`` (image records) from ``content`` as an archive of ``archive_format`` (OCI
    archive or docker-archive) at ``destination``, through a temporary file beside it renamed
    into place when complete (nothing is left of a failed export); its size. Raises DataLoss for
    a blob that is missing or damaged in the store, OSError for the file's failures. Blocking."""
    if archive_format not in FORMATS:
        raise InvalidArgument(f"archive format {archive_format!r} is not one of {', '.join(FORMATS)}")
    exported = [_Exported(tuple(image.repo_tags), Descriptor(_manifest_type(content, image.manifest_digest),
                                                             image.manifest_digest, _size(content,
                                                                                          image.manifest_digest)),
                          image.image_id, tuple((layer.digest, layer.media_type, layer.diff_id) for layer in image.layers))
                for image in images]
    directory = os.path.dirname(os.path.abspath(destination))
    temporary = os.path.join(directory, f".{os.path.basename(destination)}.{os.getpid()}.partial")
    try:
        with open(temporary, "xb") as out:
            with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
                if archive_format == OCI_ARCHIVE:
                    _write_oci(tar, exported, content)
                else:
                    _write_docker(tar, exported, content, directory)
            out.flush()
            os.fsync(out.fileno())
            size = out.tell()
        os.chmod(temporary, 0o644)
        os.rename(temporary, destination)
        return size
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise


def _write_oci(tar: tarfile.TarFile, images: Sequence[_Exported], content: ContentStore) -> None:
    _add_bytes(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
    manifests = []
    for image in images:
        for name in image.names or ("",):
            annotations = {_NAME_ANNOTATION: name, _REF_ANNOTATION: name.rpartition(":")[2]} if name else {}
            manifests.append({"mediaType": image.manifest.media_type, "digest": image.manifest.digest,
                              "size": image.manifest.size, **({"annotations": annotations} if annotations else {})})
    _add_bytes(tar, "index.json", json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX,
                                              "manifests": manifests}, sort_keys=True).encode())
    written: set[str] = set()
    for image in images:
        for digest in (image.manifest.digest, image.config, *(d for d, _, _ in image.layers)):
            if digest not in written:
                written.add(digest)
                _add_blob(tar, _blob_name(digest), content, digest)


def _write_docker(tar: tarfile.TarFile, images: Sequence[_Exported], content: ContentStore, work: str) -> None:
    entries, written = [], set()
    for image in images:
        config_name = image.config.partition(":")[2] + ".json"
        if config_name not in written:
            written.add(config_name)
            _add_blob(tar, config_name, content, image.config)
        layers = []
        for digest, _media_type, diff_id in image.layers:
            name = f"{diff_id.partition(':')[2]}/layer.tar"  # docker's layers are uncompressed: named by diff_id
            layers.append(name)
            if name not in written:
                written.add(name)
                _add_uncompressed(tar, name, content, digest, diff_id, work)
        entries.append({"Config": config_name, "RepoTags": [_docker_tag(n) for n in image.names], "Layers": layers})
    _add_bytes(tar, "manifest.json", json.dumps(entries).encode())


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))


def _add_blob(tar: tarfile.TarFile, name: str, content: ContentStore, digest: str) -> None:
    """The store's blob ``digest`` as the member ``name``, checked against its digest as it is copied."""
    path = content.path(digest)
    try:
        with open(path, "rb") as source:
            info = tar.gettarinfo(fileobj=source, arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode = 0o644
            checked = _Hashing(source)
            tar.addfile(info, checked)
    except FileNotFoundError:
        raise DataLoss(f"blob {digest} is missing from the content store: pull the image again") from None
    if checked.digest() != digest:
        raise DataLoss(f"blob {digest} was damaged in the content store: pull the image again")


def _add_uncompressed(tar: tarfile.TarFile, name: str, content: ContentStore, digest: str, diff_id: str,
                      work: str) -> None:
    """The layer ``digest`` uncompressed (its sha256 checked against ``diff_id``) as the member ``name``."""
    path = content.path(digest)
    kind = _compression(path)
    if kind == "tar":
        _add_blob(tar, name, content, digest)
        return
    fd, temporary = _temporary(work)
    try:
        hasher = hashlib.sha256()
        with open(fd, "wb") as out:
            for chunk in _decompressed(path, kind):
                hasher.update(chunk)
                out.write(chunk)
        if "sha256:" + hasher.hexdigest() != diff_id:
            raise DataLoss(f"layer {digest} in the content store does not uncompress to its diff_id {diff_id}: pull "
                           "the image again")
        with open(temporary, "rb") as source:
            info = tar.gettarinfo(fileobj=source, arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode = 0o644
            tar.addfile(info, source)
    finally:
        os.unlink(temporary)


def _temporary(directory: str) -> tuple[int, str]:
    import tempfile

    return tempfile.mkstemp(prefix=".layer-", dir=directory)


def _decompressed(path: str, kind: str) -> Iterator[bytes]:
    if kind == "gzip":
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                yield inflater.decompress(chunk)
        yield inflater.flush()
        return
    zstd = shutil.which("zstd")
    if zstd is None:
        raise Unimplemented("exporting a zstd layer as a docker-archive needs the zstd program (apt-get install zstd)")
    with subprocess.Popen([zstd, "-dc", path], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL) as process:
        assert process.stdout is not None
        while chunk := process.stdout.read(_CHUNK):
            yield chunk
    if process.returncode != 0:
        raise DataLoss(f"layer {path} is not valid zstd data")


class _Hashing(io.RawIOBase):
    """A file read through, hashed as it is read."""

    def __init__(self, source: IO[bytes]) -> None:
        self.source = source
        self.hasher = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.source.read(size)
        self.hasher.update(data)
        return data

    def digest(self) -> str:
        return "sha256:" + self.hasher.hexdigest()


# -- helpers ---------------------------------------------------------------------------------------

def _blob_name(digest: str) -> str:
    return f"blobs/sha256/{digest.partition(':')[2]}"


def _descriptor(entry: Mapping[str, Any], path: str) -> Descriptor:
    digest, size = entry.get("digest"), entry.get("size")
    if not isinstance(digest, str) or not _BLOB.fullmatch(_blob_name(digest)) or not digest.startswith("sha256:") \
            or not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise DataLoss(f"archive {path}: index.json has a descriptor without a valid sha256 digest and size")
    return Descriptor(str(entry.get("mediaType", "")), digest, size)


def _names(candidates: Sequence[Any]) -> tuple[Reference, ...]:
    """The references among ``candidates`` that name an image with a tag (a bare tag, as
    ``org.opencontainers.image.ref.name`` may be, names none)."""
    found: list[Reference] = []
    for text in candidates:
        if not isinstance(text, str) or not text or ("/" not in text and ":" not in text):
            continue
        try:
            ref = parse(text)
        except ReferenceError:
            continue
        if ref.tag is not None and ref not in found:
            found.append(ref)
    return tuple(found)


def _config(data: bytes, digest: str, layers: int, path: str) -> dict[str, Any]:
    """The image config ``data`` decoded and checked (a diff_id for each of its ``layers``)."""
    what = f"archive {path}: config {digest}"
    try:
        config = decode_json(data, what)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    return check_config(config, what, layers)


def _manifest_bytes(manifest: Manifest) -> bytes:
    def descriptor(d: Descriptor) -> dict[str, Any]:
        return {"mediaType": d.media_type, "digest": d.digest, "size": d.size}

    return json.dumps({"schemaVersion": 2, "mediaType": manifest.media_type, "config": descriptor(manifest.config),
                       "layers": [descriptor(d) for d in manifest.layers]}, sort_keys=True,
                      separators=(",", ":")).encode()


def _compression(path: str) -> str:
    with open(path, "rb") as f:
        head = f.read(4)
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if head == b"\x28\xb5\x2f\xfd":
        return "zstd"
    return "tar"


def _manifest_type(content: ContentStore, digest: str) -> str:
    try:
        return parse_manifest(content.read(digest), f"manifest {digest}")[0]
    except BlobError as exc:
        raise DataLoss(f"{exc}: pull the image again") from None


def _size(content: ContentStore, digest: str) -> int:
    return os.path.getsize(content.path(digest))


def _docker_tag(name: str) -> str:
    """docker's spelling of a normalised reference (``busybox:latest`` for docker.io/library/...)."""
    return name.removeprefix("docker.io/library/").removeprefix("docker.io/")

