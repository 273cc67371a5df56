"""podshimd's ImageService as the real crictl drives it against a real local registry
(tests/support/registry.py): pull (plain and with basic auth), images, inspecti (verbose: the image config),
rmi with garbage collection of the blobs, imagefsinfo; and the errors a client sees."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator

import grpc
import pytest

from shim.cri.api import api_pb2
from shim.lib.trees import remove_tree

from support.critools import Podshimd, running_podshimd
from support.imagebuild import BUSYBOX_ROOTFS_CHECKS
from support.layertools import deep_tree, make_layer, member
from support.podtools import container_config, pod_config
from support.proctools import wait_gone
from support.registry import AUTH


@pytest.fixture(scope="module")
def image_daemon(test_images, auth_registry) -> Iterator[Podshimd]:
    """A podshimd whose config marks the test registries as plain HTTP."""
    config = "".join(f'[registries."{r.host}"]\ninsecure = true\n' for r in (test_images.registry, auth_registry))
    directory = tempfile.mkdtemp(prefix="psd-img-")
    try:
        with running_podshimd(directory, config=config) as daemon:
            yield daemon
    finally:
        shutil.rmtree(directory)


@pytest.fixture
def daemon(image_daemon, crictl) -> Iterator[Podshimd]:
    """The module's daemon; every image a test pulled is removed after it."""
    yield image_daemon
    for image in json.loads(image_daemon.crictl(crictl, "images", "-o", "json").stdout)["images"]:
        image_daemon.crictl(crictl, "rmi", image["id"])


def blobs(daemon: Podshimd) -> set[str]:
    path = os.path.join(daemon.state_root, "images", "content", "blobs", "sha256")
    return {"sha256:" + name for name in os.listdir(path)} if os.path.isdir(path) else set()


def listed(daemon: Podshimd, crictl: str) -> list[dict]:
    return json.loads(daemon.crictl(crictl, "images", "-o", "json").stdout)["images"]


def test_crictl_pull_images_inspecti_rmi(daemon, crictl, test_images) -> None:
    busybox = test_images.busybox
    pulled = daemon.crictl(crictl, "pull", busybox.ref)
    assert pulled.stdout.startswith("Image is up to date for sha256:")
    image_id = pulled.stdout.split()[-1]
    [image] = listed(daemon, crictl)
    assert image["id"] == image_id
    assert image["repoTags"] == [busybox.ref] and image["repoDigests"] == [busybox.by_digest]
    assert int(image["size"]) > 0
    inspected = json.loads(daemon.crictl(crictl, "inspecti", busybox.ref).stdout)
    assert inspected["status"]["id"] == image_id
    assert inspected["info"]["imageSpec"]["config"]["Cmd"] == ["sh"]
    assert inspected["info"]["imageSpec"]["rootfs"]["diff_ids"]
    assert image_id in blobs(daemon)
    removed = daemon.crictl(crictl, "rmi", busybox.ref)
    assert f"Deleted: {busybox.ref}" in removed.stdout
    assert listed(daemon, crictl) == []
    assert blobs(daemon) == set()  # garbage-collected


def test_pullimage_answers_the_image_id_and_removal_is_idempotent(daemon, test_images) -> None:
    images = daemon.images()
    spec = api_pb2.ImageSpec(image=test_images.busybox_v2s2.ref)
    ref = images.PullImage(api_pb2.PullImageRequest(image=spec)).image_ref
    status = images.ImageStatus(api_pb2.ImageStatusRequest(image=spec, verbose=False))
    assert status.image.id == ref and ref.startswith("sha256:") and not status.info
    assert images.ImageStatus(api_pb2.ImageStatusRequest(image=api_pb2.ImageSpec(image=ref[7:19]))).image.id == ref
    images.RemoveImage(api_pb2.RemoveImageRequest(image=spec))
    images.RemoveImage(api_pb2.RemoveImageRequest(image=spec))  # not there any more: no error
    assert not images.ImageStatus(api_pb2.ImageStatusRequest(image=spec)).HasField("image")


def test_list_images_with_a_filter_lists_the_image_it_names(daemon, crictl, test_images) -> None:
    other = test_images.build("listed", [{"listed": "1"}])
    daemon.crictl(crictl, "pull", test_images.busybox.ref)
    daemon.crictl(crictl, "pull", other.ref)
    images = daemon.images()
    every = images.ListImages(api_pb2.ListImagesRequest()).images
    assert len(every) == 2
    only = images.ListImages(api_pb2.ListImagesRequest(filter=api_pb2.ImageFilter(
        image=api_pb2.ImageSpec(image=other.ref)))).images
    assert [i.repo_tags for i in only] == [[other.ref]]


def test_one_image_pulled_by_two_names_is_one_image_with_both(daemon, crictl, test_images) -> None:
    daemon.crictl(crictl, "pull", test_images.busybox.ref)
    daemon.crictl(crictl, "pull", test_images.multiarch.ref)  # its linux/amd64 image is busybox
    [image] = listed(daemon, crictl)
    assert image["repoTags"] == [test_images.busybox.ref, test_images.multiarch.ref]
    assert image["repoDigests"] == [test_images.busybox.by_digest, test_images.multiarch.by_digest]


def test_crictl_pull_with_credentials(daemon, crictl, test_images, auth_registry) -> None:
    image = test_images.push(test_images.busybox, auth_registry)
    refused = daemon.crictl(crictl, "pull", image.ref, check=False)
    assert refused.returncode != 0
    assert (f"code = Unauthenticated desc = unauthorized: {auth_registry.host} wants credentials to pull "
            f"{image.ref}; give credentials") in refused.stderr
    wrong = daemon.crictl(crictl, "pull", "--creds", f"{AUTH[0]}:nope", image.ref, check=False)
    assert "refused the credentials given" in wrong.stderr
    daemon.crictl(crictl, "pull", "--creds", f"{AUTH[0]}:{AUTH[1]}", image.ref)
    assert [i["repoTags"] for i in listed(daemon, crictl)] == [[image.ref]]


def test_a_pull_of_an_image_the_registry_lacks_is_not_found(daemon, crictl, test_images) -> None:
    ref = test_images.registry.ref("test/nothere:1.0")
    failed = daemon.crictl(crictl, "pull", ref, check=False)
    assert failed.returncode != 0
    assert f"code = NotFound desc = image {ref} not found" in failed.stderr
    assert listed(daemon, crictl) == [] and blobs(daemon) == set()


def test_a_bad_reference_is_invalid_argument(daemon) -> None:
    with pytest.raises(grpc.RpcError) as failed:
        daemon.images().PullImage(api_pb2.PullImageRequest(image=api_pb2.ImageSpec(image="Bad/Name")))
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "must be lowercase" in failed.value.details()


def test_imagefsinfo_counts_what_a_pull_stored(daemon, crictl, test_images) -> None:
    def used() -> int:
        [info] = json.loads(daemon.crictl(crictl, "imagefsinfo").stdout)["status"]["imageFilesystems"]
        return int(info["usedBytes"]["value"])
    before = used()
    daemon.crictl(crictl, "pull", test_images.busybox.ref)
    assert used() > before + 1_000_000  # busybox is about a megabyte compressed


def test_imagefsinfo_measures_a_tree_deeper_than_path_max(image_daemon) -> None:
    # What a container makes in its own root file system is in its upper directory, in the store.
    upper = os.path.join(image_daemon.state_root, "images", "snapshots", "snapshots", "9999", "fs")
    os.makedirs(upper)
    try:
        deep_tree(upper, 2100)  # 4,200 bytes of path below the upper directory
        [fs] = image_daemon.images().ImageFsInfo(api_pb2.ImageFsInfoRequest()).image_filesystems
        assert fs.inodes_used.value > 2100
    finally:
        remove_tree(os.path.dirname(upper))


def test_hostile_images_get_a_status_and_a_sentence_leave_nothing_and_never_keep_podshimd_from_starting(
        test_images, tmp_path) -> None:
    registry = test_images.registry

    def raw(name: str, members: list, diff_ids: list | None = None) -> str:
        layer = make_layer(str(tmp_path / name), members, "gzip")
        with open(layer.path, "rb") as f:
            blob = f.read()
        config = {"rootfs": {"type": "layers", "diff_ids": [layer.diff_id] if diff_ids is None else diff_ids}}
        return registry.push_raw(f"test/{name}:1", json.dumps(config).encode(), [(blob, layer.media_type)])
    deep = raw("deep1100", [member("/".join(["d"] * 1100) + "/f", data=b"deep")])
    pax = raw("pax3000", [member("/".join(["d"] * 3000) + "/f", data=b"deep")])
    listed_config = registry.push_raw("test/configlist:1", b"[]", [])
    directory = tempfile.mkdtemp(prefix="psd-hostile-")
    config = f'[registries."{registry.host}"]\ninsecure = true\n'
    snapshots = os.path.join(directory, "state", "images", "snapshots", "snapshots")
    records = os.path.join(directory, "state", "images", "records")
    try:
        with running_podshimd(directory, config=config) as daemon:
            images = daemon.images()
            deep_id = images.PullImage(api_pb2.PullImageRequest(image=api_pb2.ImageSpec(image=deep))).image_ref
            images.RemoveImage(api_pb2.RemoveImageRequest(image=api_pb2.ImageSpec(image=deep_id)))
            assert os.listdir(snapshots) == []  # no trash-… left
            for ref, says in ((pax, "is a path of 6001 bytes, longer than the 4096 bytes Linux takes"),
                              (listed_config, "is a JSON array, not an object")):
                with pytest.raises(grpc.RpcError) as failed:
                    images.PullImage(api_pb2.PullImageRequest(image=api_pb2.ImageSpec(image=ref)))
                assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT and says in failed.value.details()
                assert os.listdir(snapshots) == []  # no tmp-… or stage-… left
            kept = images.PullImage(api_pb2.PullImageRequest(image=api_pb2.ImageSpec(image=test_images.busybox.ref)))
        bad = os.path.join(records, "0" * 64 + ".json")
        with open(bad, "w") as f:
            f.write('{"version": 1, "image_id": "sha256:' + "0" * 64 + '", "config": []}')
        with running_podshimd(directory, config=config) as daemon:  # it starts, and lists every other image
            images = daemon.images()
            assert [i.id for i in images.ListImages(api_pb2.ListImagesRequest()).images] == [kept.image_ref]
            assert images.ImageStatus(api_pb2.ImageStatusRequest(image=api_pb2.ImageSpec(
                image=test_images.busybox.ref))).image.id == kept.image_ref
            images.RemoveImage(api_pb2.RemoveImageRequest(image=api_pb2.ImageSpec(image="0" * 64)))
            assert not os.path.exists(bad)
            with open(os.path.join(directory, "podshimd.log")) as log:
                assert f"image record {bad} cannot be read" in log.read()
    finally:
        remove_tree(directory)


def test_a_container_runs_on_its_pulled_image_which_is_not_removed_until_the_container_is(daemon, crictl,
                                                                                           test_images, tmp_path):
    busybox = test_images.busybox
    daemon.crictl(crictl, "pull", busybox.ref)
    pod_path = tmp_path / "pod.json"
    pod_path.write_text(json.dumps(pod_config()))
    pod_id = daemon.crictl(crictl, "runp", str(pod_path)).stdout.strip()
    try:
        config = {**container_config(["sleep", "60"]), "image": {"image": busybox.ref}}
        (tmp_path / "ctr.json").write_text(json.dumps(config))
        container_id = daemon.crictl(crictl, "create", pod_id, str(tmp_path / "ctr.json"), str(pod_path)).stdout.strip()
        assert json.loads(daemon.crictl(crictl, "inspect", container_id).stdout)["status"]["imageRef"] == \
            busybox.by_digest
        daemon.crictl(crictl, "start", container_id)
        shown = daemon.crictl(crictl, "exec", "-s", container_id, "cat", "/podshim-test/kept").stdout
        assert shown.strip() == BUSYBOX_ROOTFS_CHECKS["podshim-test/kept"].decode().strip()  # the layers, merged
        refused = daemon.crictl(crictl, "rmi", busybox.ref, check=False)
        assert refused.returncode != 0
        assert "code = FailedPrecondition desc = image" in refused.stderr and "is in use by a container" in refused.stderr
        assert listed(daemon, crictl) != []
        daemon.crictl(crictl, "rm", "-f", container_id)
    finally:
        daemon.crictl(crictl, "rmp", "-f", pod_id)
    daemon.crictl(crictl, "rmi", busybox.ref)
    assert listed(daemon, crictl) == [] and blobs(daemon) == set()


def test_an_image_on_a_base_the_node_has_fetches_only_its_own_blobs_and_both_run(daemon, crictl, test_images,
                                                                                  tmp_path) -> None:
    base = test_images.build("cri-shared-base", [{"shared/base": "the base layer"}])
    top = test_images.build("cri-shared-top", [{"shared/top": "the top layer"}], base="cri-shared-base")
    daemon.crictl(crictl, "pull", base.ref)
    served = len(test_images.registry.blob_gets())
    daemon.crictl(crictl, "pull", top.ref)
    [own_layer] = [digest for digest in _layers(top) if digest not in _layers(base)]
    fetched = test_images.registry.blob_gets()[served:]
    assert own_layer in fetched and not set(fetched) & set(_layers(base))  # the shared blobs are taken from the node
    pod_path = tmp_path / "pod.json"
    pod_path.write_text(json.dumps(pod_config()))
    pod_id = daemon.crictl(crictl, "runp", str(pod_path)).stdout.strip()
    try:
        for name, image, path, content in (("base", base, "shared/base", "the base layer"),
                                           ("top", top, "shared/top", "the top layer"),
                                           ("top-base", top, "shared/base", "the base layer")):
            config = {**container_config(["sleep", "60"], name=name), "image": {"image": image.ref}}
            (tmp_path / f"{name}.json").write_text(json.dumps(config))
            container_id = daemon.crictl(crictl, "create", pod_id, str(tmp_path / f"{name}.json"),
                                         str(pod_path)).stdout.strip()
            daemon.crictl(crictl, "start", container_id)
            assert daemon.crictl(crictl, "exec", "-s", container_id, "cat", "/" + path).stdout.strip() == content, name
    finally:
        daemon.crictl(crictl, "rmp", "-f", pod_id)


def _layers(image) -> list[str]:
    status, _, body = image.registry.get(f"/v2/{image.repo}/manifests/{image.digest}",
                                         {"Accept": "application/vnd.oci.image.manifest.v1+json"})
    assert status == 200
    return [layer["digest"] for layer in json.loads(body)["layers"]]


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(child) for child in f.read().split()]


def test_a_pull_cut_short_by_kill_9_of_the_daemon_leaves_nothing_after_restart(crictl, tmp_path) -> None:
    registry = socket.socket()  # accepts (the kernel does, into the backlog) and never answers
    registry.bind(("127.0.0.1", 0))
    registry.listen(8)
    host = f"127.0.0.1:{registry.getsockname()[1]}"
    config = f'[registries."{host}"]\ninsecure = true\n'
    directory = tempfile.mkdtemp(prefix="psd-k9-")
    ingest = os.path.join(directory, "state", "images", "content", "ingest")
    try:
        with running_podshimd(directory, config=config) as daemon:
            client = subprocess.Popen([crictl, "--image-endpoint", daemon.endpoint, "--timeout", "60s", "pull",
                                       f"{host}/x:1"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
            try:
                registry.settimeout(60)
                connection, _ = registry.accept()  # skopeo is asking the registry
                connection.close()
                skopeos = children(daemon.process.pid)  # the pull's inspect and copy
                assert skopeos
                assert os.listdir(ingest) != []
                daemon.process.kill()
                daemon.process.wait()
                assert not wait_gone(*skopeos, timeout=30), "skopeo outlived the daemon"
            finally:
                client.kill()
                client.wait()
        with running_podshimd(directory, config=config) as daemon:
            assert os.listdir(ingest) == []
            assert listed(daemon, crictl) == [] and blobs(daemon) == set()
    finally:
        registry.close()
        shutil.rmtree(directory)
