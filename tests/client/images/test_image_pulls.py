"""Pulls from a real registry (Debian's docker-registry on 127.0.0.1, tests/support/registry.py) into the
image store, and what a pull that fails or is interrupted leaves: nothing that looks complete."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import socket
import stat
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from shim.lib.trees import remove_tree, walk
from shim.rpc.status import (
    DataLoss,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unauthenticated,
)

from client.images import pull as pull_module
from client.images.content import ContentStore
from client.images.pull import Puller
from client.images.service import Images
from client.images.skopeo import AuthConfig, RegistryHost
from client.images.snapshots import Snapshotter, Staging, chain_ids

from support.imagebuild import BUSYBOX_ROOTFS_CHECKS
from support.layertools import make_layer, member
from support.registry import AUTH, Registry

SKOPEO = shutil.which("skopeo")


def images_for(tmp_path, *registries: Registry, **kwargs) -> Images:
    hosts = [RegistryHost(r.host, insecure=True) for r in registries]
    return Images(str(tmp_path / "state"), hosts=hosts, **kwargs).open()


def snapshotter(images: Images) -> Snapshotter:
    """The store's snapshotter (open() made it)."""
    assert images.snapshots is not None
    return images.snapshots


def leftovers(images: Images) -> list[str]:
    """What a pull left in the store's scratch space."""
    return os.listdir(images.content.ingest)


def assert_complete(images: Images, record) -> None:
    """Every blob the record names is in the content store, verified."""
    for digest in record.blobs:
        assert images.content.has(digest), digest


# -- pulls that work --------------------------------------------------------------------------------

async def test_an_oci_image_is_pulled_with_its_registry_digest_and_config(tmp_path, test_images) -> None:
    images = images_for(tmp_path, test_images.registry)
    busybox = test_images.busybox
    record = await images.pull(busybox.ref)
    assert record.repo_tags == (busybox.ref,)
    assert record.repo_digests == (busybox.by_digest,)
    assert record.manifest_digest == busybox.digest
    assert record.config["config"]["Cmd"] == ["sh"]
    assert record.image_id.startswith("sha256:") and images.content.has(record.image_id)
    assert len(record.layers) == 3 and all(layer.diff_id.startswith("sha256:") for layer in record.layers)
    assert record.size == sum(os.path.getsize(images.content.path(d)) for d in record.blobs)
    assert_complete(images, record)
    assert leftovers(images) == []
    blob = images.content.path(record.image_id)
    assert stat.S_IMODE(os.stat(blob).st_mode) == 0o600
    assert blob.startswith(str(tmp_path / "state" / "images" / "content" / "blobs" / "sha256") + "/")


async def test_a_pull_unpacks_the_layers_into_a_snapshot(tmp_path, test_images) -> None:
    images = images_for(tmp_path, test_images.registry)
    record = await images.pull(test_images.busybox.ref)
    assert record.chain_id == chain_ids(layer.diff_id for layer in record.layers)[-1]
    assert snapshotter(images).has(record.chain_id)
    for path, content in BUSYBOX_ROOTFS_CHECKS.items():  # whiteouts and opaque directories applied
        assert snapshotter(images).read_file(record.chain_id, path) == content, path


async def test_an_image_of_zstd_layers_is_pulled_and_unpacked(tmp_path, test_images) -> None:
    busybox = test_images.busybox
    zstd_ref = busybox.registry.ref("test/busybox-zstd:1.0")
    # Recompressed on the way through a layout: a copy between registries would reuse the gzip blobs.
    layout = f"oci:{tmp_path / 'zstd'}:x"
    for argv in (["--src-tls-verify=false", "--dest-compress", "--dest-compress-format", "zstd",
                  f"docker://{busybox.ref}", layout],
                 ["--dest-tls-verify=false", layout, f"docker://{zstd_ref}"]):
        subprocess.run(["skopeo", "copy", "--quiet", *argv], check=True, capture_output=True, timeout=120)
    images = images_for(tmp_path, test_images.registry)
    record = await images.pull(zstd_ref)
    assert {layer.media_type for layer in record.layers} == {"application/vnd.oci.image.layer.v1.tar+zstd"}
    for path, content in BUSYBOX_ROOTFS_CHECKS.items():
        assert snapshotter(images).read_file(record.chain_id, path) == content, path


async def test_an_image_of_uncompressed_layers_is_pulled_as_it_is_served(tmp_path, test_images) -> None:
    layer = make_layer(str(tmp_path / "plain"), [member("plain", data=b"not compressed")])  # a plain tar
    with open(layer.path, "rb") as f:
        blob = f.read()
    config = {"rootfs": {"type": "layers", "diff_ids": [layer.diff_id]}}
    ref = test_images.registry.push_raw("test/plain:1", json.dumps(config).encode(), [(blob, layer.media_type)])
    images = images_for(tmp_path, test_images.registry)
    record = await images.pull(ref)
    assert [(r.media_type, r.diff_id) for r in record.layers] == [(layer.media_type, layer.diff_id)]
    assert record.layers[0].digest == layer.diff_id  # the blob is the tar itself
    assert snapshotter(images).read_file(record.chain_id, "plain") == b"not compressed"


async def test_a_docker_schema2_image_is_pulled_as_it_is_served(tmp_path, test_images) -> None:
    images = images_for(tmp_path, test_images.registry)
    record = await images.pull(test_images.busybox_v2s2.ref)
    assert record.repo_digests == (test_images.busybox_v2s2.by_digest,)
    manifest = json.loads(images.content.read(record.manifest_digest))
    assert manifest["mediaType"] == "application/vnd.docker.distribution.manifest.v2+json"
    assert_complete(images, record)


async def test_an_index_is_resolved_to_linux_amd64_and_keeps_the_index_digest(tmp_path, test_images) -> None:
    images = images_for(tmp_path, test_images.registry)
    multiarch = test_images.multiarch
    record = await images.pull(multiarch.ref)
    assert record.repo_digests == (multiarch.by_digest,)  # what the tag named: the index
    assert record.manifest_digest == multiarch.platforms["linux/amd64"]
    assert record.config["architecture"] == "amd64"
    assert images.content.has(multiarch.digest)
    assert not images.content.has(multiarch.platforms["linux/arm64"])  # only this platform is pulled
    assert_complete(images, record)


async def test_a_docker_manifest_list_is_resolved_and_its_manifest_and_config_kept_as_served(tmp_path, test_images) -> None:
    # skopeo converts schema 2 to OCI in the layout it copies into: the registry's own manifest and
    # config must still be what the store keeps (the image id is the registry's config digest).
    listed = test_images.build("v2s2-list", [{"listed": "yes"}], format="v2s2", platforms=["linux/amd64", "linux/arm64"])
    images = images_for(tmp_path, test_images.registry)
    record = await images.pull(listed.ref)
    assert record.repo_digests == (listed.by_digest,)
    assert record.manifest_digest == listed.platforms["linux/amd64"]
    manifest = json.loads(images.content.read(record.manifest_digest))
    assert manifest["mediaType"] == "application/vnd.docker.distribution.manifest.v2+json"
    assert record.image_id == manifest["config"]["digest"]
    assert snapshotter(images).read_file(record.chain_id, "listed") == b"yes"
    assert_complete(images, record)


async def test_an_index_without_this_platform_is_not_found(tmp_path, test_images) -> None:
    images = images_for(tmp_path, test_images.registry, platform={"os": "linux", "architecture": "s390x"})
    with pytest.raises(NotFound, match=r"has no image for linux/s390x \(it has: linux/amd64, linux/arm64\)"):
        await images.pull(test_images.multiarch.ref)
    assert images.list() == [] and leftovers(images) == []


async def test_a_pull_by_digest_records_no_tag(tmp_path, test_images) -> None:
    images = images_for(tmp_path, test_images.registry)
    record = await images.pull(test_images.busybox.by_digest)
    assert record.repo_tags == ()
    assert record.repo_digests == (test_images.busybox.by_digest,)


async def test_a_reference_with_tag_and_digest_pulls_the_digest(tmp_path, test_images) -> None:
    images = images_for(tmp_path, test_images.registry)
    busybox = test_images.busybox
    record = await images.pull(f"{busybox.registry.host}/{busybox.repo}:no-such-tag@{busybox.digest}")
    assert record.repo_digests == (busybox.by_digest,) and record.repo_tags == ()


async def test_an_image_is_found_by_id_prefix_tag_and_digest(tmp_path, test_images) -> None:
    images = images_for(tmp_path, test_images.registry)
    busybox = test_images.busybox
    record = await images.pull(busybox.ref)
    hex_id = record.image_id.partition(":")[2]
    for name in (record.image_id, hex_id, hex_id[:12], busybox.ref, busybox.by_digest):
        assert images.status(name) == record, name
    assert images.list(busybox.ref) == [record]
    assert images.status(f"{busybox.registry.host}/{busybox.repo}:2.0") is None


async def test_a_second_pull_of_a_stored_image_downloads_nothing(tmp_path, test_images, monkeypatch) -> None:
    images = images_for(tmp_path, test_images.registry)
    first = await images.pull(test_images.busybox.ref)
    runs = record_skopeo_runs(tmp_path, images)
    again = await images.pull(test_images.busybox.ref)
    assert again == first
    assert [argv[1] for argv in runs()] == ["inspect"]  # the manifest is asked for; no copy


async def test_a_registry_is_pulled_from_through_its_mirror(tmp_path, test_images) -> None:
    mirror = test_images.registry.host
    images = Images(str(tmp_path / "state"), hosts=[RegistryHost("registry.invalid", mirrors=(mirror,)),
                                                    RegistryHost(mirror, insecure=True)]).open()
    record = await images.pull("registry.invalid/test/busybox:1.0")  # .invalid never resolves: only the mirror can
    assert record.repo_tags == ("registry.invalid/test/busybox:1.0",)
    assert record.repo_digests == (f"registry.invalid/test/busybox@{test_images.busybox.digest}",)


async def test_records_survive_a_restart(tmp_path, test_images) -> None:
    images = images_for(tmp_path, test_images.registry)
    record = await images.pull(test_images.busybox.ref)
    reopened = images_for(tmp_path, test_images.registry)
    assert reopened.list() == [record]
    assert_complete(reopened, record)


# -- layers unpacked as they arrive; blobs damaged on disk heal ------------------------------------------

async def test_each_layer_is_unpacked_as_its_blob_arrives_and_committed_by_a_rename(tmp_path, test_images,
                                                                                    monkeypatch) -> None:
    images = images_for(tmp_path, test_images.registry)

    def not_after_the_download(*args):
        raise AssertionError("a layer was unpacked from the content store, after the download")
    monkeypatch.setattr(images.snapshots, "_unpack_layer", not_after_the_download)
    record = await images.pull(test_images.busybox.ref)
    assert snapshotter(images).has(record.chain_id)
    for path, content in BUSYBOX_ROOTFS_CHECKS.items():
        assert snapshotter(images).read_file(record.chain_id, path) == content, path
    assert leftovers(images) == [] and staging_dirs(images) == []


async def test_a_pull_downloads_and_unpacks_only_the_layers_the_node_lacks(tmp_path, test_images, monkeypatch) -> None:
    base = test_images.build("reuse-base", [{"reuse/base": "the base"}, {"reuse/middle": "the middle"}])
    top = test_images.build("reuse-top", [{"reuse/top": "the top"}], base="reuse-base")
    images = images_for(tmp_path, test_images.registry)
    first = await images.pull(base.ref)
    unpacked: list[str] = []  # blobs unpacked: staged as they arrive, or from the store at the end
    stage, unpack_layer = Staging.stage, snapshotter(images)._unpack_layer

    def counted(unpack, path, *args):
        done = unpack(*args)
        unpacked.append("sha256:" + os.path.basename(path))
        return done
    monkeypatch.setattr(Staging, "stage", lambda self, path, limit=None: counted(stage, path, self, path, limit))
    monkeypatch.setattr(images.snapshots, "_unpack_layer", lambda chain_id, diff_id, path, media_type, limit: (
        counted(unpack_layer, path, chain_id, diff_id, path, media_type, limit)))
    served = len(test_images.registry.blob_gets())
    second = await images.pull(top.ref)
    new = second.layers[-1].digest
    assert [layer.digest for layer in second.layers[:-1]] == [layer.digest for layer in first.layers]
    assert set(test_images.registry.blob_gets()[served:]) == {new, second.image_id}  # only what the node lacked
    assert unpacked == [new]
    assert_complete(images, second)
    assert snapshotter(images).read_file(second.chain_id, "reuse/top") == b"the top"
    for record in (first, second):
        assert snapshotter(images).read_file(record.chain_id, "reuse/middle") == b"the middle"
        for path, content in BUSYBOX_ROOTFS_CHECKS.items():
            assert snapshotter(images).read_file(record.chain_id, path) == content, path
    assert leftovers(images) == [] and staging_dirs(images) == []


def staging_dirs(images: Images) -> list[str]:
    assert images.snapshots is not None  # (open)
    return [name for name in os.listdir(os.path.join(snapshotter(images).root, "snapshots"))
            if not name.isdigit()]


def flip_a_byte(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))


async def test_a_layer_blob_damaged_in_the_store_is_replaced_by_the_next_download(tmp_path, test_images) -> None:
    first = test_images.build("heal-top", [{"heal": "shared layer"}], base=None)
    second = test_images.build("heal-under", [{"under": "another base"}, {"heal": "shared layer"}], base=None)
    images = images_for(tmp_path, test_images.registry)
    record = await images.pull(first.ref)
    shared = record.layers[-1].digest
    flip_a_byte(images.content.path(shared))
    # the shared layer sits on another base in the second image: its blob is unpacked again
    other = await images.pull(second.ref)
    assert other.layers[-1].digest == shared
    assert snapshotter(images).read_file(other.chain_id, "heal") == b"shared layer"
    assert images.content.check(shared)
    assert_complete(images, other)


async def test_a_damaged_layer_blob_an_index_shares_is_downloaded_again(tmp_path, test_images) -> None:
    first = test_images.build("heal-index-top", [{"heal-index": "shared layer"}], base=None)
    second = test_images.build("heal-index", [{"under": "another base"}, {"heal-index": "shared layer"}], base=None,
                               platforms=("linux/amd64", "linux/arm64"))
    images = images_for(tmp_path, test_images.registry)
    shared = (await images.pull(first.ref)).layers[-1].digest
    flip_a_byte(images.content.path(shared))
    served = len(test_images.registry.blob_gets())
    # an index: the manifest is known only once skopeo has copied, so the damage shows after it
    other = await images.pull(second.ref)
    assert other.layers[-1].digest == shared
    assert shared in test_images.registry.blob_gets()[served:]
    assert snapshotter(images).read_file(other.chain_id, "heal-index") == b"shared layer"
    assert images.content.check(shared)
    assert_complete(images, other)
    assert leftovers(images) == [] and staging_dirs(images) == []


async def test_a_config_damaged_in_the_store_is_downloaded_again_by_the_next_pull(tmp_path, test_images) -> None:
    images = images_for(tmp_path, test_images.registry)
    record = await images.pull(test_images.busybox.ref)
    blob = images.content.path(record.image_id)
    with open(blob, "r+b") as f:
        f.truncate(os.path.getsize(blob) // 2)
    runs = record_skopeo_runs(tmp_path, images)
    assert await images.pull(test_images.busybox.ref) == record
    assert images.content.check(record.image_id)
    assert "copy" in [argv[1] for argv in runs()]


async def test_a_layer_blob_damaged_in_the_store_is_fetched_again_when_it_is_unpacked(tmp_path, test_images) -> None:
    images = images_for(tmp_path, test_images.registry)
    record = await images.pull(test_images.busybox.ref)
    flip_a_byte(images.content.path(record.layers[0].digest))
    snapshotter(images).gc(set())  # the layer snapshots are lost: the next pull unpacks the stored blobs
    assert await images.pull(test_images.busybox.ref) == record
    assert snapshotter(images).has(record.chain_id)
    assert all(images.content.check(layer.digest) for layer in record.layers)
    assert leftovers(images) == [] and staging_dirs(images) == []


def link_a_copy(path: str, elsewhere) -> None:
    """The blob file ``path`` replaced by a symbolic link to a copy of it (same bytes) in ``elsewhere``."""
    copy = os.path.join(elsewhere, "copy-" + os.path.basename(path))
    shutil.copyfile(path, copy)
    os.unlink(path)
    os.symlink(copy, path)


async def test_a_layer_blob_replaced_by_a_symbolic_link_is_downloaded_again(tmp_path, test_images) -> None:
    first = test_images.build("link-top", [{"link": "shared layer"}], base=None)
    second = test_images.build("link-under", [{"under": "another base"}, {"link": "shared layer"}], base=None)
    images = images_for(tmp_path, test_images.registry)
    shared = (await images.pull(first.ref)).layers[-1].digest
    link_a_copy(images.content.path(shared), tmp_path)
    served = len(test_images.registry.blob_gets())
    other = await images.pull(second.ref)
    assert shared in test_images.registry.blob_gets()[served:]
    assert not os.path.islink(images.content.path(shared)) and images.content.check(shared)
    assert snapshotter(images).read_file(other.chain_id, "link") == b"shared layer"
    assert_complete(images, other)
    assert leftovers(images) == [] and staging_dirs(images) == []


async def test_a_layer_blob_replaced_by_a_symbolic_link_is_fetched_again_when_it_is_unpacked(tmp_path, test_images) -> None:
    images = images_for(tmp_path, test_images.registry)
    record = await images.pull(test_images.busybox.ref)
    link_a_copy(images.content.path(record.layers[0].digest), tmp_path)
    snapshotter(images).gc(set())  # the layer snapshots are lost: the next pull unpacks the stored blobs
    served = len(test_images.registry.blob_gets())
    assert await images.pull(test_images.busybox.ref) == record
    assert record.layers[0].digest in test_images.registry.blob_gets()[served:]
    assert not os.path.islink(images.content.path(record.layers[0].digest))
    assert all(images.content.check(layer.digest) for layer in record.layers)
    assert leftovers(images) == [] and staging_dirs(images) == []


async def test_a_config_replaced_by_a_symbolic_link_is_downloaded_again_by_the_next_pull(tmp_path, test_images) -> None:
    images = images_for(tmp_path, test_images.registry)
    record = await images.pull(test_images.busybox.ref)
    link_a_copy(images.content.path(record.image_id), tmp_path)
    assert await images.pull(test_images.busybox.ref) == record
    assert not os.path.islink(images.content.path(record.image_id)) and images.content.check(record.image_id)


# -- credentials ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def auth_image(test_images, auth_registry):
    return test_images.push(test_images.busybox, auth_registry)


async def test_basic_auth_with_the_right_credentials_pulls(tmp_path, auth_image) -> None:
    images = images_for(tmp_path, auth_image.registry)
    record = await images.pull(auth_image.ref, AuthConfig(username=AUTH[0], password=AUTH[1]))
    assert record.repo_digests == (auth_image.by_digest,)


async def test_basic_auth_from_the_auth_field_pulls(tmp_path, auth_image) -> None:
    images = images_for(tmp_path, auth_image.registry)
    auth = base64.b64encode(f"{AUTH[0]}:{AUTH[1]}".encode()).decode()
    record = await images.pull(auth_image.ref, AuthConfig(auth=auth, server_address=f"http://{auth_image.registry.host}/"))
    assert record.repo_tags == (auth_image.ref,)


async def test_no_credentials_is_unauthorized_with_a_sentence(tmp_path, auth_image) -> None:
    images = images_for(tmp_path, auth_image.registry)
    with pytest.raises(Unauthenticated, match="wants credentials to pull .* give credentials"):
        await images.pull(auth_image.ref)
    assert images.list() == [] and leftovers(images) == []


async def test_wrong_credentials_are_unauthorized_with_a_sentence(tmp_path, auth_image) -> None:
    images = images_for(tmp_path, auth_image.registry)
    with pytest.raises(Unauthenticated, match="refused the credentials given"):
        await images.pull(auth_image.ref, AuthConfig(username=AUTH[0], password="wrong"))
    assert images.list() == [] and leftovers(images) == []


async def test_credentials_for_another_registry_are_not_sent(tmp_path, auth_image) -> None:
    images = images_for(tmp_path, auth_image.registry)
    with pytest.raises(Unauthenticated):
        await images.pull(auth_image.ref, AuthConfig(username=AUTH[0], password=AUTH[1],
                                                     server_address="other.example:5000"))


async def test_a_bad_auth_field_is_invalid(tmp_path, auth_image) -> None:
    images = images_for(tmp_path, auth_image.registry)
    with pytest.raises(InvalidArgument, match="not base64 'username:password'"):
        await images.pull(auth_image.ref, AuthConfig(auth="%%%"))


async def test_credentials_are_never_on_skopeos_command_line(tmp_path, auth_image) -> None:
    images = images_for(tmp_path, auth_image.registry)
    runs = record_skopeo_runs(tmp_path, images)
    await images.pull(auth_image.ref, AuthConfig(username=AUTH[0], password=AUTH[1]))
    assert runs() and not any(AUTH[1] in arg for argv in runs() for arg in argv)


# -- pulls that fail: a sentence, nothing half-stored, and the next pull works ------------------------

async def test_an_image_the_registry_lacks_is_not_found(tmp_path, test_images) -> None:
    images = images_for(tmp_path, test_images.registry)
    with pytest.raises(NotFound, match=r"image .*/test/nothere:1\.0 not found: .* has no such repository"):
        await images.pull(test_images.registry.ref("test/nothere:1.0"))
    assert images.list() == [] and leftovers(images) == []


async def test_a_bad_reference_is_invalid(tmp_path) -> None:
    images = Images(str(tmp_path / "state")).open()
    with pytest.raises(InvalidArgument, match="must be lowercase"):
        await images.pull("Busybox")


@contextlib.contextmanager
def damaged_blob(test_images, damage) -> Iterator[tuple[Any, str]]:
    """One of a fresh image's layers damaged in the registry's storage by ``damage(data) -> bytes``."""
    image = test_images.build("damaged", [{"damaged": os.urandom(64).hex()}])
    status, _, body = image.registry.get(f"/v2/{image.repo}/manifests/{image.digest}",
                                         {"Accept": "application/vnd.oci.image.manifest.v1+json"})
    layer = json.loads(body)["layers"][-1]["digest"]
    path = image.registry.blob_path(layer)
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(damage(data))
    try:
        yield image, layer
    finally:
        with open(path, "wb") as f:
            f.write(data)


@pytest.mark.parametrize("damage", [
    pytest.param(lambda data: data[:-1] + bytes([data[-1] ^ 0xFF]), id="corrupt"),
    pytest.param(lambda data: data[: len(data) // 2], id="truncated"),
])
async def test_a_damaged_blob_is_refused_naming_it_and_the_next_pull_works(tmp_path, test_images, damage) -> None:
    images = images_for(tmp_path, test_images.registry)
    with damaged_blob(test_images, damage) as (image, layer):
        with pytest.raises(DataLoss, match=f"blob {layer} is corrupt or truncated"):
            await images.pull(image.ref)
        assert images.list() == [] and leftovers(images) == []
        assert not images.content.has(layer)
    record = await images.pull(image.ref)
    assert_complete(images, record)


async def test_a_blob_the_registry_lost_is_not_found_naming_it(tmp_path, test_images) -> None:
    images = images_for(tmp_path, test_images.registry)
    with damaged_blob(test_images, lambda data: data) as (image, layer):
        os.rename(image.registry.blob_path(layer), image.registry.blob_path(layer) + ".away")
        try:
            with pytest.raises(NotFound, match=f"blob {layer} not found"):
                await images.pull(image.ref)
        finally:
            os.rename(image.registry.blob_path(layer) + ".away", image.registry.blob_path(layer))
    assert images.list() == [] and leftovers(images) == []


def raw_image(tmp_path, registry: Registry, name: str, config: object | bytes) -> str:
    """An image of one gzip layer and ``config`` (JSON, or bytes as they are) pushed as it is."""
    layer = make_layer(str(tmp_path / "layer"), [member("f", data=b"x")], "gzip")
    with open(layer.path, "rb") as f:
        blob = f.read()
    data = config if isinstance(config, bytes) else json.dumps(config).encode()
    return registry.push_raw(f"test/{name}:1", data, [(blob, layer.media_type)])


def assert_nothing_stored(images: Images) -> None:
    assert images.list() == [] and leftovers(images) == []
    assert images.snapshots is not None  # (open)
    assert images.content.digests() == set() and snapshotter(images).snapshots() == []
    assert os.listdir(os.path.join(snapshotter(images).root, "snapshots")) == []


@pytest.mark.parametrize("config, says", [
    ([1, 2], "is a JSON array, not an object"),
    ({"rootfs": "layers"}, "rootfs is the string 'layers', not an object with the layers' diff_ids"),
    ({"rootfs": ["layers"]}, "rootfs is an array, not an object with the layers' diff_ids"),
    ({"rootfs": {"type": "layers", "diff_ids": "sha256:x"}}, "rootfs.diff_ids is the string 'sha256:x', not an array"),
    ({"rootfs": {"type": "layers", "diff_ids": [7]}}, r"rootfs.diff_ids\[0\] is the number 7, not a sha256 digest"),
    ({"rootfs": {"type": "layers", "diff_ids": []}}, "lists 0 diff_ids in rootfs.diff_ids for 1 layers"),
    ({"rootfs": {"type": "layers", "diff_ids": ["DIFF"]}, "config": "sh"}, "config is the string 'sh', not an object"),
    ({"rootfs": {"type": "layers", "diff_ids": ["DIFF"]}, "config": {"Env": "A=1"}},
     "config.Env is the string 'A=1', not an array of strings"),
    ({"rootfs": {"type": "layers", "diff_ids": ["DIFF"]}, "config": {"User": 0}}, "config.User is the number 0, not a string"),
    ({"rootfs": {"type": "layers", "diff_ids": ["DIFF"]}, "config": {"Labels": {"a": 1}}},
     "config.Labels is an object, not an object of strings"),
    ({"rootfs": {"type": "layers", "diff_ids": ["DIFF"]}, "os": ["linux"]}, "os is an array, not a string"),
])
async def test_an_image_config_of_the_wrong_shape_is_refused_naming_the_field_and_nothing_is_stored(
        tmp_path, test_images, config, says) -> None:
    diff_id = make_layer(str(tmp_path / "layer"), [member("f", data=b"x")], "gzip").diff_id
    config = json.loads(json.dumps(config).replace('"DIFF"', json.dumps(diff_id)))
    ref = raw_image(tmp_path, test_images.registry, "badconfig", config)
    images = images_for(tmp_path, test_images.registry)
    with pytest.raises(InvalidArgument, match=says):
        await images.pull(ref)
    assert_nothing_stored(images)


async def test_an_image_config_past_4_mib_is_refused_with_a_sentence(tmp_path, test_images) -> None:
    diff_id = make_layer(str(tmp_path / "layer"), [member("f", data=b"x")], "gzip").diff_id
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": [diff_id]},
                         "config": {"Labels": {"big": "x" * (5 << 20)}}}).encode()
    ref = raw_image(tmp_path, test_images.registry, "bigconfig", config)
    images = images_for(tmp_path, test_images.registry)
    with pytest.raises(InvalidArgument, match=f"is {len(config)} bytes, more than the 4194304 bytes an image config "
                                              "may have"):
        await images.pull(ref)
    assert_nothing_stored(images)


async def test_a_decompression_bomb_is_refused_past_the_pulls_limit_and_nothing_is_kept(tmp_path, test_images) -> None:
    layer = make_layer(str(tmp_path / "bomb"), [member("zeros", data=bytes(16 << 20))], "gzip")  # 16 KiB of gzip
    with open(layer.path, "rb") as f:
        blob = f.read()
    config = {"rootfs": {"type": "layers", "diff_ids": [layer.diff_id]}}
    ref = test_images.registry.push_raw("test/bomb:1", json.dumps(config).encode(), [(blob, layer.media_type)])
    images = images_for(tmp_path, test_images.registry, max_unpacked_bytes=1 << 20)
    with pytest.raises(ResourceExhausted, match=f"pulling image {ref}: the image's layers unpack to more than "
                                                r"1048576 bytes, the most one pull may write \(image_pull_max_unpacked"
                                                r"_bytes in config.toml\); nothing of it was kept"):
        await images.pull(ref)
    await images.aclose()  # the failed pull's blobs are collected
    assert_nothing_stored(images)


class Hanging:
    """A TCP server on 127.0.0.1 that accepts connections and never answers."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.connected = threading.Event()  # set at the first connection


@pytest.fixture
def hanging_registry() -> Iterator[Hanging]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    hanging = Hanging(f"127.0.0.1:{server.getsockname()[1]}")
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(conn)
            hanging.connected.set()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield hanging
    finally:
        stop.set()
        server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join()
        for conn in accepted:
            conn.close()


async def test_a_registry_that_hangs_is_a_timeout_with_a_sentence(tmp_path, hanging_registry) -> None:
    host = hanging_registry.host
    images = Images(str(tmp_path / "state"), hosts=[RegistryHost(host, insecure=True)], pull_timeout=1.0).open()
    said = rf"pulling image {host}/x:1 did not finish within 1 s \(image_pull_timeout\); it was killed"
    with pytest.raises(DeadlineExceeded, match=said):
        await images.pull(f"{host}/x:1")
    assert images.list() == [] and leftovers(images) == []


async def test_a_registry_that_stops_answering_is_given_up_after_the_progress_timeout(tmp_path, hanging_registry) -> None:
    host = hanging_registry.host
    images = Images(str(tmp_path / "state"), hosts=[RegistryHost(host, insecure=True)], progress_timeout=1.0).open()
    said = rf"pulling image {host}/x:1 made no progress for 1 s \(image_pull_progress_timeout\); it was killed"
    with pytest.raises(DeadlineExceeded, match=said):
        await images.pull(f"{host}/x:1")
    assert images.list() == [] and leftovers(images) == []


async def test_the_progress_watch_looks_at_a_pulls_directory_in_one_walk(tmp_path, monkeypatch):
    puller = Puller(ContentStore(str(tmp_path / "content")).open(), progress_timeout=0.04)
    work = puller.content.temporary_dir("pull-")
    for part in ("image", "tmp"):
        os.mkdir(os.path.join(work, part))
    loop, looked = asyncio.get_running_loop(), asyncio.Event()
    walked: list[str] = []

    def recorded(top, *args, **kwargs):
        walked.append(top)
        if len(walked) == 4:
            loop.call_soon_threadsafe(looked.set)
        return walk(top, *args, **kwargs)
    monkeypatch.setattr(pull_module, "walk", recorded)

    class Unending:
        """A stand-in for the pull's timeout that never fires, however slow the walks are."""

        def reschedule(self, when: float | None) -> None:
            pass
    watch = asyncio.ensure_future(puller._watch(work, Unending()))
    try:
        await looked.wait()
    finally:
        watch.cancel()
        await asyncio.wait([watch])
    assert set(walked) == {work}  # the layout (image/) and skopeo's tmp/ with it


async def test_a_cancelled_pull_leaves_nothing_and_no_skopeo(tmp_path, hanging_registry) -> None:
    host = hanging_registry.host
    images = Images(str(tmp_path / "state"), hosts=[RegistryHost(host, insecure=True)]).open()
    runs = record_skopeo_runs(tmp_path, images)
    pull = asyncio.ensure_future(images.pull(f"{host}/x:1"))
    assert await asyncio.to_thread(hanging_registry.connected.wait, 60)  # skopeo is talking to the registry
    assert leftovers(images) != []  # the pull's work directory
    await images.aclose()
    with pytest.raises(asyncio.CancelledError):
        await pull
    assert images.list() == [] and leftovers(images) == []
    for pid in skopeo_pids(runs):
        assert not os.path.exists(f"/proc/{pid}"), "skopeo outlived its pull"


async def test_concurrent_pulls_of_one_image_share_one_download(tmp_path, test_images) -> None:
    images = images_for(tmp_path, test_images.registry)
    runs = record_skopeo_runs(tmp_path, images)
    records = await asyncio.gather(*(images.pull(test_images.busybox.ref) for _ in range(5)))
    assert all(record == records[0] for record in records)
    assert sorted(argv[1] for argv in runs()) == ["copy", "inspect"]  # one pull: one inspect, one copy


# -- removal and garbage collection -------------------------------------------------------------------

async def test_remove_forgets_the_image_and_collects_its_blobs(tmp_path, test_images) -> None:
    images = images_for(tmp_path, test_images.registry)
    busybox = await images.pull(test_images.busybox.ref)
    other = await images.pull(test_images.build("other", [{"other": "x"}]).ref)
    shared = busybox.blobs & other.blobs
    assert shared  # the busybox layers
    assert await images.remove(test_images.busybox.ref) == busybox
    assert images.list() == [other]
    assert images.content.digests() == other.blobs
    assert all(images.content.has(d) for d in shared)
    # other is busybox plus a layer: busybox's layers stay, as the snapshots below other's
    assert {s.name for s in snapshotter(images).snapshots()} == set(chain_ids(layer.diff_id for layer in other.layers))
    assert snapshotter(images).has(busybox.chain_id)


async def test_remove_collects_the_snapshots_no_image_uses(tmp_path, test_images) -> None:
    images = images_for(tmp_path, test_images.registry)
    alone = await images.pull(test_images.build("alone", [{"a": "1"}, {"b": "2"}], base=None).ref)
    assert len(snapshotter(images).snapshots()) == 2
    await images.remove(alone.image_id)
    assert snapshotter(images).snapshots() == [] and images.content.digests() == set()
    assert await images.remove(test_images.busybox.ref) is None  # gone already: no error


async def test_an_image_deeper_than_the_recursion_limit_is_removed_leaving_nothing_and_the_store_opens(
        tmp_path, test_images) -> None:
    images = images_for(tmp_path, test_images.registry)
    deep = "/".join(["d"] * 1100) + "/f"
    try:
        record = await images.pull(test_images.build("deep", [{deep: "deep"}], base=None).ref)
        assert snapshotter(images).read_file(record.chain_id, deep) == b"deep"
        await images.remove(record.image_id)
        assert os.listdir(os.path.join(snapshotter(images).root, "snapshots")) == []
        assert images_for(tmp_path, test_images.registry).list() == []  # what podshimd does at start
    finally:
        remove_tree(str(tmp_path / "state"))


async def test_leftovers_that_cannot_be_removed_are_warnings_and_the_store_opens(tmp_path, caplog) -> None:
    images = Images(str(tmp_path / "state")).open()
    busy = [os.path.join(images.content.ingest, "pull-x"), os.path.join(snapshotter(images).root, "snapshots", "trash-x")]
    mounted = []
    try:
        for path in busy:  # a mount point in each: never entered, never removed
            os.makedirs(path)
            subprocess.run(["mount", "-t", "tmpfs", "tmpfs", path], check=True)
            mounted.append(path)
        Images(str(tmp_path / "state")).open()
        assert f"cannot remove what an earlier process left in {images.content.ingest}" in caplog.text
        assert f"cannot remove {busy[1]}, left for the next start to remove" in caplog.text
    finally:
        for path in mounted:
            subprocess.run(["umount", path], check=True)
    Images(str(tmp_path / "state")).open()
    assert not any(os.path.exists(path) for path in busy)


async def test_a_failed_collection_is_logged_and_the_image_removed_all_the_same(tmp_path, test_images, monkeypatch,
                                                                                 caplog) -> None:
    images = images_for(tmp_path, test_images.registry)
    record = await images.pull(test_images.busybox.ref)

    def broken_gc(keep):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(images.snapshots, "gc", broken_gc)
    assert await images.remove(test_images.busybox.ref) == record
    assert images.list() == []
    assert "collecting unreferenced blobs and snapshots failed: [Errno 5] Input/output error" in caplog.text
    monkeypatch.undo()
    assert await images.pull(test_images.busybox.ref) == record  # and the next pull works


async def test_an_image_in_use_is_not_removed(tmp_path, test_images) -> None:
    images = images_for(tmp_path, test_images.registry)
    record = await images.pull(test_images.busybox.ref)
    images.in_use = lambda image_id: image_id == record.image_id
    with pytest.raises(FailedPrecondition, match="is in use by a container; remove the container first"):
        await images.remove(test_images.busybox.ref)
    assert images.list() == [record]
    assert_complete(images, record)


async def test_a_tag_moves_to_the_image_pulled_last(tmp_path, test_images) -> None:
    images = images_for(tmp_path, test_images.registry)
    first = await images.pull(test_images.build("moving", [{"v": "1"}], tag="1.0").ref)
    second_image = test_images.build("moving", [{"v": "2"}], tag="1.0")
    second = await images.pull(second_image.ref)
    assert second.image_id != first.image_id
    assert images.status(second_image.ref) == second
    kept = images.store.get(first.image_id)
    assert kept is not None and kept.repo_tags == ()  # still there by its digest, untagged


# -- helpers --------------------------------------------------------------------------------------------

def record_skopeo_runs(tmp_path, images: Images):
    """Make ``images`` run skopeo through a wrapper that logs each command line; a function
    returning the logged command lines (after skopeo's global options)."""
    log = tmp_path / "skopeo-runs"
    wrapper = tmp_path / "skopeo-wrapper"
    wrapper.write_text(f"#!/bin/sh\necho \"$$ $*\" >> {log}\nexec {SKOPEO} \"$@\"\n")
    wrapper.chmod(0o755)
    images.puller.skopeo = str(wrapper)

    def runs() -> list[list[str]]:
        if not log.exists():
            return []
        lines = [line.split() for line in log.read_text().splitlines()]
        # pid, then skopeo's global options (each with a value), then the command
        out = []
        for words in lines:
            rest = words[1:]
            while rest and rest[0].startswith("--"):
                rest = rest[2:]
            out.append([words[0], *rest])
        return out
    return runs


def skopeo_pids(runs) -> list[int]:
    return [int(argv[0]) for argv in runs()]
