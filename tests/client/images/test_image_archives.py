"""Importing image archives into the node's images (client/images/archive.py through
Images.import_archive) is held to a pull's rules: digests, size bounds, unpack bounds, and nothing
kept of a refused archive. Archives made here, member by member."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest
from test_image_pulls import assert_nothing_stored

from shim.rpc.status import DataLoss, InvalidArgument, ResourceExhausted

from client.images.service import Images

from support.layertools import make_layer, member

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def write_tar(path, files: dict[str, bytes]) -> str:
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


def oci_archive(path, layer_blob: bytes, layer_type: str, diff_id: str, *, config: bytes | None = None,
                name: str = "example.com/app:1") -> str:
    config = config or json.dumps({"rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": digest(config), "size": len(config)},
                           "layers": [{"mediaType": layer_type, "digest": digest(layer_blob),
                                       "size": len(layer_blob)}]}).encode()
    index = json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": digest(manifest), "size": len(manifest),
         "annotations": {"io.containerd.image.name": name}}]}).encode()
    blobs = {f"blobs/sha256/{digest(b)[7:]}": b for b in (config, manifest, layer_blob)}
    return write_tar(path, {"oci-layout": b'{"imageLayoutVersion": "1.0.0"}', "index.json": index, **blobs})


@pytest.fixture
async def images(tmp_path):
    images = Images(str(tmp_path / "state"), max_unpacked_bytes=1 << 20).open()
    yield images
    await images.aclose()


async def test_an_oci_archive_is_imported_with_its_name_and_unpacked(images, tmp_path) -> None:
    layer = make_layer(str(tmp_path / "layer"), [member("hello", data=b"hi\n")], "gzip")
    with open(layer.path, "rb") as f:
        blob = f.read()
    [record] = await images.import_archive(oci_archive(tmp_path / "a.tar", blob, layer.media_type, layer.diff_id))
    assert record.repo_tags == ("example.com/app:1",) and record.chain_id
    assert images.list("example.com/app:1") == [record]


async def test_a_decompression_bomb_is_refused_past_the_unpack_limit_and_nothing_is_kept(images, tmp_path) -> None:
    layer = make_layer(str(tmp_path / "bomb"), [member("zeros", data=bytes(16 << 20))], "gzip")  # 16 KiB of gzip
    with open(layer.path, "rb") as f:
        blob = f.read()
    path = oci_archive(tmp_path / "bomb.tar", blob, layer.media_type, layer.diff_id)
    with pytest.raises(ResourceExhausted, match=f"importing {path}: the image's layers unpack to more than 1048576 "
                                                "bytes"):
        await images.import_archive(path)
    await images.aclose()  # what it stored is collected once nothing is in flight
    assert_nothing_stored(images)


async def test_a_docker_archive_layer_that_is_not_its_diff_id_is_data_loss_and_nothing_is_kept(images, tmp_path) -> None:
    layer = make_layer(str(tmp_path / "layer"), [member("hello", data=b"hi\n")], "tar")
    with open(layer.path, "rb") as f:
        blob = f.read()
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": [digest(b"something else")]}}).encode()
    path = write_tar(tmp_path / "d.tar", {
        "manifest.json": json.dumps([{"Config": f"{digest(config)[7:]}.json", "RepoTags": ["app:1"],
                                      "Layers": ["l1/layer.tar"]}]).encode(),
        f"{digest(config)[7:]}.json": config, "l1/layer.tar": blob})
    with pytest.raises(DataLoss, match=f"archive {path}: layer l1/layer.tar is corrupt or truncated: its digest is "
                                       f"{digest(blob)}, but the image config's diff_id for it is"):
        await images.import_archive(path)
    await images.aclose()
    assert_nothing_stored(images)


async def test_a_config_past_a_pulls_bound_is_refused(images, tmp_path) -> None:
    layer = make_layer(str(tmp_path / "layer"), [member("hello", data=b"hi\n")], "gzip")
    with open(layer.path, "rb") as f:
        blob = f.read()
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": [layer.diff_id]},
                         "config": {"Labels": {"big": "x" * (5 << 20)}}}).encode()
    path = oci_archive(tmp_path / "big.tar", blob, layer.media_type, layer.diff_id, config=config)
    with pytest.raises(InvalidArgument, match="more than the 4194304 bytes an image config may have"):
        await images.import_archive(path)
    await images.aclose()
    assert_nothing_stored(images)
