"""Containers made from images in the pod layer: the image a config names is looked up (missing:
NOT_FOUND, pull it first), its config makes the process, its snapshot (keyed by the container id)
is the root filesystem and goes with the container on every path; the pod's hosts, resolv.conf and
hostname are written at RunPodSandbox and removed with the pod.

The image store and snapshotter here are small stand-ins that record what they are asked (the
real ones are client/images'); the snapshots they make are empty, so the containers run on the
node's root filesystem, where /bin/sh is."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from shim.rpc.status import FailedPrecondition, InvalidArgument, NotFound

from client.cri.failpoints import ENV
from client.cri.pod import open_pod_service
from client.cri.rootfs import ContainerImage, StoreImages, image_not_found

from support.podtools import NodeRootImages, node_container, pod_config, pod_service

IMAGE = ContainerImage(image_id="sha256:" + "a" * 64, name="registry.test/app:1", image_ref="registry.test/app@sha256:"
                       + "b" * 64, chain_id="sha256:" + "c" * 64,
                       config={"Entrypoint": ["/bin/sh", "-c"], "Cmd": ["echo \"$GREETING from $PWD\""],
                               "Env": ["GREETING=image", "KEPT=yes"], "WorkingDir": "/tmp"})


class Images:
    """Images found by their name (a tag) or their id."""

    def __init__(self, *images: ContainerImage):
        self.images = {i.name: i for i in images} | {i.image_id: i for i in images}

    def container_image(self, reference: str) -> ContainerImage:
        try:
            return self.images[reference]
        except KeyError:
            raise image_not_found(reference) from None


class Snapshots:
    """Records prepare/remove; ``fail`` makes prepare raise."""

    def __init__(self, fail: Exception | None = None):
        self.live: dict[str, str] = {}
        self.fail = fail

    async def prepare(self, key: str, chain_id: str) -> list:
        if self.fail is not None:
            raise self.fail
        assert key not in self.live, f"snapshot {key} prepared twice"
        self.live[key] = chain_id
        return NodeRootImages().prepare(key, chain_id)  # the image's tree: the node's own, read-only

    def remove(self, key: str) -> None:
        self.live.pop(key, None)

    def read_file(self, chain_id: str, path: str) -> bytes:
        raise FileNotFoundError(path)


def image_container(name: str = "app", **fields) -> dict:
    return {"metadata": {"name": name}, "image": {"image": IMAGE.name}, **fields}


async def wait_exited(pods, container_id: str) -> dict:
    deadline = time.monotonic() + 10
    while (status := await pods.container_status(container_id))["state"] != "CONTAINER_EXITED":
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)  # the shim records the exit it reaps; nothing here to wait on
    return status


def log_lines(pods, container_id: str) -> list[str]:
    with open(pods.container_log_path(container_id)) as f:
        return [line.split(" ", 3)[3].rstrip("\n") for line in f]


async def test_pod_files_are_written_at_run_and_removed_with_the_pod(roots) -> None:
    cfg = pod_config()
    cfg["hostname"] = "web-0"
    cfg["dns_config"] = {"servers": ["10.96.0.10"], "searches": ["svc.cluster.local"], "options": ["ndots:5"]}
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(cfg)
        directory = os.path.join(roots[0], "pod-files", pod_id)
        with open(os.path.join(directory, "resolv.conf")) as f:
            assert f.read() == "search svc.cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n"
        with open(os.path.join(directory, "hostname")) as f:
            assert f.read() == "web-0\n"
        with open(os.path.join(directory, "hosts")) as f:
            assert f.read().splitlines()[1] == "127.0.0.1\tlocalhost"
        await pods.remove_pod_sandbox(pod_id)
        assert not os.path.exists(directory)


async def test_a_container_runs_its_images_entrypoint_and_cmd_with_its_env_and_working_dir(roots) -> None:
    snapshots = Snapshots()
    async with pod_service(roots, images=Images(IMAGE), snapshots=snapshots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        cid = await pods.create_container(pod_id, image_container())
        await pods.start_container(cid)
        assert (await wait_exited(pods, cid))["exit_code"] == 0
        assert log_lines(pods, cid) == ["image from /tmp"]


async def test_a_container_created_by_image_id_as_kubelet_does_shows_its_images_tag_in_its_status(roots) -> None:
    # kubelet creates a container with the id PullImage answered (the tag the user wrote is
    # user_specified_image); its status names the image by its tag, as containerd's does (kubectl
    # shows it as the pod's image), its list entry by the id it was created with.
    async with pod_service(roots, images=Images(IMAGE), snapshots=Snapshots()) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        cid = await pods.create_container(pod_id, image_container(
            image={"image": IMAGE.image_id, "user_specified_image": "app:1"}))
        status = await pods.container_status(cid)
        assert (status["image"], status["image_ref"]) == ({"image": IMAGE.name}, IMAGE.image_ref)
        assert [c["image"] for c in await pods.list_containers()] == [{"image": IMAGE.image_id}]


async def test_cri_command_env_and_working_dir_override_the_image(roots) -> None:
    async with pod_service(roots, images=Images(IMAGE), snapshots=Snapshots()) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        cid = await pods.create_container(pod_id, image_container(
            command=["/bin/sh", "-c", "echo $GREETING $KEPT $PWD"], working_dir="/",
            envs=[{"key": "GREETING", "value": "cri"}]))
        await pods.start_container(cid)
        await wait_exited(pods, cid)
        assert log_lines(pods, cid) == ["cri yes /"]


async def test_the_snapshot_is_keyed_by_the_container_and_removed_with_it(roots) -> None:
    snapshots = Snapshots()
    async with pod_service(roots, images=Images(IMAGE), snapshots=snapshots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        cid = await pods.create_container(pod_id, image_container())
        assert snapshots.live == {cid: IMAGE.chain_id}
        status = await pods.container_status(cid, verbose=True)
        assert status["image"] == {"image": IMAGE.name} and status["image_ref"] == IMAGE.image_ref
        assert status["info"]["image_id"] == IMAGE.image_id and status["info"]["snapshot_key"] == cid
        assert [(c["image"], c["image_ref"]) for c in await pods.list_containers()] == [
            ({"image": IMAGE.name}, IMAGE.image_id)]
        assert pods.image_in_use(IMAGE.image_id) == [cid]
        await pods.remove_container(cid)
        assert snapshots.live == {}
        assert pods.image_in_use(IMAGE.image_id) == []


async def test_removing_the_pod_removes_its_containers_snapshots(roots) -> None:
    snapshots = Snapshots()
    async with pod_service(roots, images=Images(IMAGE), snapshots=snapshots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        running = await pods.create_container(pod_id, image_container("a", command=["sleep", "60"]))
        await pods.start_container(running)
        await pods.create_container(pod_id, image_container("b"))
        assert len(snapshots.live) == 2
        await pods.remove_pod_sandbox(pod_id)
        assert snapshots.live == {}


async def test_a_create_the_shim_refuses_removes_the_snapshot_and_the_record(roots, tmp_path) -> None:
    snapshots = Snapshots()
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "app_0.log").symlink_to(tmp_path / "elsewhere")  # the shim refuses a log path that is a link
    cfg = pod_config()
    cfg["log_directory"] = str(logs)
    async with pod_service(roots, images=Images(IMAGE), snapshots=snapshots) as pods:
        pod_id = await pods.run_pod_sandbox(cfg)
        with pytest.raises(FailedPrecondition, match="symbolic link"):
            await pods.create_container(pod_id, image_container())
        assert snapshots.live == {} and await pods.list_containers() == []


async def test_a_snapshot_that_cannot_be_made_leaves_no_container(roots) -> None:
    async with pod_service(roots, images=Images(IMAGE), snapshots=Snapshots(fail=OSError(28, "No space left"))) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        with pytest.raises(OSError):
            await pods.create_container(pod_id, image_container())
        assert await pods.list_containers() == []


async def test_an_image_not_in_the_store_is_not_found_and_leaves_nothing(roots) -> None:
    snapshots = Snapshots()
    async with pod_service(roots, images=Images(IMAGE), snapshots=snapshots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        with pytest.raises(NotFound, match="image 'registry.test/other:1' not found: pull it first"):
            await pods.create_container(pod_id, {"metadata": {"name": "x"}, "image": {"image": "registry.test/other:1"}})
        assert snapshots.live == {} and await pods.list_containers() == []


async def test_without_an_image_store_a_named_image_is_not_found(roots) -> None:
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        with pytest.raises(NotFound, match="not found: pull it first"):
            await pods.create_container(pod_id, {**node_container(["true"]), "image": {"image": "busybox"}})


async def test_an_image_with_nothing_to_run_and_no_command_is_invalid(roots) -> None:
    empty = ContainerImage(image_id="sha256:" + "d" * 64, name="registry.test/empty:1", image_ref="x", chain_id="c")
    snapshots = Snapshots()
    async with pod_service(roots, images=Images(empty), snapshots=snapshots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        with pytest.raises(InvalidArgument, match="no command specified: .*registry.test/empty:1' has no Entrypoint"):
            await pods.create_container(pod_id, {"metadata": {"name": "x"}, "image": {"image": empty.name}})
        assert snapshots.live == {} and await pods.list_containers() == []


async def test_a_tty_container_runs_on_a_terminal_and_its_output_is_logged_as_stdout(roots) -> None:
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        cid = await pods.create_container(pod_id, {**node_container(["sh", "-c", "tty; echo err >&2"]),
                                                   "tty": True})
        await pods.start_container(cid)
        status = await wait_exited(pods, cid)
        assert status["exit_code"] == 0
        with open(status["log_path"]) as f:
            records = [line.split(" ", 3)[1:] for line in f.read().splitlines()]
        assert [stream for stream, _, _ in records] == ["stdout", "stdout"]
        assert records[0][2].startswith("/dev/pts/") and records[1][2] == "err"


async def test_container_status_shows_its_cri_mounts_not_the_pod_files(roots, tmp_path) -> None:
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        cid = await pods.create_container(pod_id, {**node_container(["true"]), "mounts": [
            {"container_path": "/data", "host_path": str(tmp_path), "readonly": True}]})
        assert (await pods.container_status(cid))["mounts"] == [
            {"container_path": "/data", "host_path": str(tmp_path), "readonly": True, "selinux_relabel": False,
             "propagation": "PROPAGATION_PRIVATE", "recursive_read_only": False}]


class Record:
    """An image store record as client/images keeps it (the fields StoreImages reads)."""

    def __init__(self, **fields):
        self.__dict__.update({"repo_tags": (), "repo_digests": (), "layers": (), "chain_id": "", "config": {},
                              **fields})


def test_store_images_makes_a_container_image_from_a_store_record():
    record = Record(image_id="sha256:" + "a" * 64, repo_tags=("r/app:1", "r/app:latest"),
                    repo_digests=("r/app@sha256:" + "b" * 64,), layers=("l1",), chain_id="sha256:" + "c" * 64,
                    config={"architecture": "amd64", "config": {"Cmd": ["sh"]}})
    lookup = StoreImages({"app": record}.get)
    assert lookup.lookup("app") == ContainerImage(
        image_id=record.image_id, name="r/app:1", image_ref="r/app@sha256:" + "b" * 64, chain_id=record.chain_id,
        config={"Cmd": ["sh"]})
    untagged = Record(image_id="sha256:" + "d" * 64)  # no tags, digests, layers or config
    assert StoreImages({"x": untagged}.get).lookup("x") == ContainerImage(
        image_id=untagged.image_id, name="x", image_ref=untagged.image_id, chain_id="", config={})


async def test_store_images_looks_up_on_the_callers_loop_not_in_a_worker_thread():
    # Its store resolves in memory; a worker thread's round trip cost hundreds of ms of a busy
    # daemon's loop per CreateContainer (a hundred pods at once).
    import threading

    from client.cri.rootfs import call

    threads = []

    def resolve(reference: str) -> Record:
        threads.append(threading.current_thread())
        return Record(image_id="sha256:" + "a" * 64)

    assert (await call(StoreImages(resolve).container_image, "app")).image_id == "sha256:" + "a" * 64
    assert threads == [threading.current_thread()]


def test_store_images_refuses_a_missing_or_unpacked_image_with_a_sentence():
    with pytest.raises(NotFound, match="image 'nope' not found: pull it first"):
        StoreImages({}.get).lookup("nope")
    with pytest.raises(FailedPrecondition, match="its layers are not unpacked"):
        StoreImages({"x": Record(image_id="i", layers=("l1",))}.get).lookup("x")


async def test_recovery_removes_container_snapshots_no_record_names_and_keeps_the_rest(roots, tmp_path) -> None:
    from client.images.snapshots import Snapshotter
    snapshotter = Snapshotter(str(tmp_path / "snapshots"))
    empty = ContainerImage(image_id="sha256:" + "e" * 64, name="registry.test/empty:1", image_ref="x", chain_id="",
                           config={"Cmd": ["true"]})
    root, runtime_root = roots
    async with open_pod_service(root, runtime_root, cni_conf_dir=os.path.join(root, "no-cni"), images=Images(empty),
                                snapshots=snapshotter) as pods:  # closed without removing its pods
        pod_id = await pods.run_pod_sandbox(pod_config())
        kept = await pods.create_container(pod_id, {"metadata": {"name": "kept"}, "image": {"image": empty.name}})
    orphan = "f" * 64  # a container whose record went, but a crash kept its snapshot
    snapshotter.prepare(orphan, "")
    snapshotter.prepare("not-a-container", "")  # someone else's: left alone
    async with pod_service(roots, images=Images(empty), snapshots=snapshotter) as pods:
        assert sorted(s.name for s in snapshotter.snapshots() if s.kind == "active") == sorted(
            [kept, "not-a-container"])
        await pods.remove_container(kept)
    assert [s.name for s in snapshotter.snapshots() if s.kind == "active"] == ["not-a-container"]
    snapshotter.remove("not-a-container")


CRASH_SCRIPT = """
import anyio, json, sys
from client.cri.failpoints import ENV
from client.cri.pod import open_pod_service
from client.cri.rootfs import ContainerImage
from client.images.snapshots import Snapshotter
class Images:
    def container_image(self, reference):
        return ContainerImage(image_id="sha256:" + "e" * 64, name=reference, image_ref="x", chain_id="",
                              config={"Cmd": ["true"]})
async def main(root, runtime_root, snapshots, cfg_json):
    async with open_pod_service(root, runtime_root, cni_conf_dir=root + "/no-cni", images=Images(),
                                snapshots=Snapshotter(snapshots)) as pods:
        pod_id = await pods.run_pod_sandbox(json.loads(cfg_json))
        print(json.dumps(pod_id), flush=True)
        await pods.create_container(pod_id, {"metadata": {"name": "c"}, "image": {"image": "registry.test/e:1"}})
anyio.run(main, *sys.argv[1:])
"""


async def test_a_crash_between_snapshot_and_task_is_undone_at_recovery_and_the_name_is_free_again(roots, tmp_path) -> None:
    """The CreateContainer never answered: its record and snapshot are removed at the next start
    (the pod's shim lives and has no such task), not shown as a container whose shim is gone."""
    from client.images.snapshots import Snapshotter
    snapshots = str(tmp_path / "snapshots")
    done = subprocess.run([sys.executable, "-c", CRASH_SCRIPT, *roots, snapshots, json.dumps(pod_config())],
                          capture_output=True, text=True, timeout=60, env={**os.environ, ENV: "create:after-rootfs"})
    assert done.returncode == -signal.SIGKILL, done.stderr
    pod_id = json.loads(done.stdout)
    snapshotter = Snapshotter(snapshots)
    image = ContainerImage(image_id="sha256:" + "e" * 64, name="registry.test/e:1", image_ref="x", chain_id="",
                           config={"Cmd": ["true"]})  # the script's
    async with pod_service(roots, images=Images(image), snapshots=snapshotter) as pods:
        assert await pods.list_containers() == []
        assert [s.name for s in snapshotter.snapshots() if s.kind == "active"] == []
        assert (await pods.pod_sandbox_status(pod_id))["state"] == "SANDBOX_READY"
        again = await pods.create_container(pod_id, {"metadata": {"name": "c"}, "image": {"image": "registry.test/e:1"}})
        assert [c["id"] for c in await pods.list_containers()] == [again]
        await pods.remove_pod_sandbox(pod_id)
        assert [s.name for s in snapshotter.snapshots() if s.kind == "active"] == []


async def test_every_container_sees_the_pods_hosts_resolv_conf_and_hostname(roots) -> None:
    cfg = pod_config()
    cfg["hostname"] = "web-0"
    cfg["dns_config"] = {"servers": ["10.96.0.10"], "searches": ["svc.cluster.local"]}
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(cfg)
        cid = await pods.create_container(pod_id, node_container(
            ["/bin/sh", "-c", "cat /etc/resolv.conf /etc/hostname; grep web-0 /etc/hosts || echo no-ip-line; "
                              "head -2 /etc/hosts"]))
        await pods.start_container(cid)
        await wait_exited(pods, cid)
        assert log_lines(pods, cid) == ["search svc.cluster.local", "nameserver 10.96.0.10", "web-0", "no-ip-line",
                                        "# podshim-managed hosts file.", "127.0.0.1\tlocalhost"]


async def test_a_cri_mount_replaces_the_pods_etc_hosts_and_host_paths_are_bound(roots, tmp_path) -> None:
    own_hosts = tmp_path / "hosts"
    own_hosts.write_text("10.0.0.1 kubelets-own\n")
    volume = tmp_path / "volume"
    volume.mkdir()
    (volume / "file").write_text("from the host\n")
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        cid = await pods.create_container(pod_id, {**node_container(
            ["/bin/sh", "-c", "cat /etc/hosts /srv/file; echo x > /srv/file || echo read-only"]), "mounts": [
                {"container_path": "/etc/hosts", "host_path": str(own_hosts)},
                {"container_path": "/srv", "host_path": str(volume), "readonly": True}]})
        await pods.start_container(cid)
        await wait_exited(pods, cid)
        lines = log_lines(pods, cid)
        assert lines[:2] == ["10.0.0.1 kubelets-own", "from the host"] and "read-only" in lines
        assert (volume / "file").read_text() == "from the host\n"


@pytest.fixture
def busybox_chain(tmp_path):
    """A real snapshotter holding one busybox layer with /image-file: (snapshotter, chain id)."""
    from client.images.snapshots import Snapshotter

    from support.imagebuild import busybox_layer, layer_tar
    tar = layer_tar(busybox_layer({"image-file": "from the image\n"}))
    path = tmp_path / "layer.tar"
    path.write_bytes(tar)
    snapshotter = Snapshotter(str(tmp_path / "snapshots"))
    chain = snapshotter.unpack([("sha256:" + hashlib.sha256(tar).hexdigest(), str(path),
                                 "application/vnd.oci.image.layer.v1.tar")])
    return snapshotter, chain


async def test_a_container_runs_on_its_images_layers_with_a_writable_layer_of_its_own(roots, busybox_chain) -> None:
    snapshotter, chain = busybox_chain
    image = ContainerImage(image_id="sha256:" + "b" * 64, name="registry.test/busybox:1", image_ref="x",
                           chain_id=chain, config={"Entrypoint": ["sh"], "Cmd": ["-c", "exit 3"], "Env": ["PATH=/bin"]})
    script = "cat /image-file; ls /new-file 2>/dev/null || echo no-new-file; echo written > /new-file"
    async with pod_service(roots, images=Images(image), snapshots=snapshotter) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        first, second = [await pods.create_container(pod_id, {"metadata": {"name": name}, "image": {"image": image.name},
                                                              "args": ["-c", script]}) for name in ("a", "b")]
        for cid in (first, second):
            await pods.start_container(cid)
            assert (await wait_exited(pods, cid))["exit_code"] == 0
            assert log_lines(pods, cid) == ["from the image", "no-new-file"]  # each its own upper layer
        assert {s.name for s in snapshotter.snapshots() if s.kind == "active"} == {first, second}
        await pods.remove_pod_sandbox(pod_id)
        assert [s.name for s in snapshotter.snapshots() if s.kind == "active"] == []
