"""podshimd with ``sandbox_image`` (containerd's sandbox_image) as the real crictl drives it, against a
real local registry (tests/support/registry.py): the pause of every pod is the image's program, pulled on
demand, run from a snapshot ``sandbox-<pod id>`` of it with each runtime handler; a container runs
beside it; stopp/rmp, a failed pull and a kill -9 of podshimd leave nothing behind; RemoveImage
refuses the image while a pod uses it. Two pause images: catatonit (Entrypoint ["/catatonit",
"-P"]) and a tiny static C pause, so that nothing may assume catatonit."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from client.images.snapshots import Snapshotter

from support.critools import Podshimd, running_podshimd
from support.imagebuild import catatonit_pause_image, tiny_pause_image
from support.podtools import container_config, ns_inode, pod_config
from support.proctools import alive, wait_gone
from support.shimtools import HANDLERS

PAUSE_IMAGES = {"catatonit": catatonit_pause_image, "tiny": tiny_pause_image}


def daemon_config(registry_host: str, sandbox_image: str, extra: str = "") -> str:
    return (f'sandbox_image = "{sandbox_image}"\nruntime_handlers = {json.dumps(HANDLERS)}\n{extra}'
            f'[registries."{registry_host}"]\ninsecure = true\n')


@pytest.fixture(scope="module", params=list(PAUSE_IMAGES))
def pause_daemon(request, test_images) -> Iterator[tuple[Podshimd, object]]:
    """A podshimd whose sandbox_image is one of the pause images (not pulled yet), and that image."""
    image = PAUSE_IMAGES[request.param](test_images)
    directory = tempfile.mkdtemp(prefix="psd-sbi-")
    try:
        with running_podshimd(directory, config=daemon_config(test_images.registry.host, image.ref)) as daemon:
            yield daemon, image
    finally:
        shutil.rmtree(directory)


def active_snapshots(daemon: Podshimd) -> list[str]:
    return sorted(s.name for s in Snapshotter(os.path.join(daemon.state_root, "images", "snapshots")).snapshots()
                  if s.kind == "active")


def mounts_under(directory: str) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line for line in f if directory in line]


def write_json(path, doc) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize("handler", HANDLERS)
def test_runp_runs_the_sandbox_image_pause_and_rmp_leaves_nothing(pause_daemon, crictl, test_images, handler,
                                                                  tmp_path) -> None:
    daemon, image = pause_daemon
    pod_path = write_json(tmp_path / "pod.json", pod_config())
    pod_id = daemon.crictl(crictl, "runp", "--runtime", handler, pod_path).stdout.strip()
    try:
        info = json.loads(daemon.crictl(crictl, "inspectp", pod_id).stdout)["info"]
        pid, bundle = info["pid"], info["shim"]["bundle"]
        assert info["image"] == image.ref and info["image_id"].startswith("sha256:")
        assert active_snapshots(daemon) == [f"sandbox-{pod_id}"]
        # Its root is the snapshot the shim mounted, its argv the image's Entrypoint + Cmd.
        assert os.path.samefile(f"/proc/{pid}/root", os.path.join(bundle, "rootfs"))
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")[:-1]
        assert argv == [a.encode() for a in (*image.config.entrypoint, *(image.config.cmd or ()))]
        assert ns_inode(pid, "net") == os.stat(info["netns_path"]).st_ino
        with open(f"/proc/{pid}/status") as f:
            uid = next(line.split()[1] for line in f if line.startswith("Uid:"))
        assert uid == (image.config.user or "0").split(":")[0]  # the image's User
        # The image is pulled and cannot be removed while the pod uses it.
        refused = daemon.crictl(crictl, "rmi", image.ref, check=False)
        assert refused.returncode != 0 and "as its sandbox image; remove the pod first" in refused.stderr
        # A container runs in the pod, in the pause's namespaces.
        daemon.crictl(crictl, "pull", test_images.busybox.ref)
        ctr = {**container_config(["sleep", "60"], pid=0), "image": {"image": test_images.busybox.ref}}
        container_id = daemon.crictl(crictl, "create", pod_id, write_json(tmp_path / "c.json", ctr),
                                     pod_path).stdout.strip()
        daemon.crictl(crictl, "start", container_id)
        task = json.loads(daemon.crictl(crictl, "inspect", container_id).stdout)["info"]["pid"]
        assert [ns_inode(task, ns) for ns in ("net", "ipc", "uts", "pid")] == [
            ns_inode(pid, ns) for ns in ("net", "ipc", "uts", "pid")]
        daemon.crictl(crictl, "stopp", pod_id)
        assert wait_gone(pid) == []
        daemon.crictl(crictl, "rmp", pod_id)
    finally:
        daemon.remove_every_pod(crictl)
    assert active_snapshots(daemon) == [] and mounts_under(daemon.directory) == []
    assert daemon.sandbox_bundles() == [] and not os.path.exists(info["netns_path"])
    daemon.crictl(crictl, "rmi", image.ref)  # no pod uses it any more
    daemon.crictl(crictl, "rmi", test_images.busybox.ref)


@pytest.mark.parametrize("handler", HANDLERS)
def test_a_host_network_and_host_pid_pod_runs_the_sandbox_image_pause(pause_daemon, crictl, handler, tmp_path) -> None:
    daemon, image = pause_daemon
    cfg = pod_config(network=2, pid=2)
    cfg["linux"]["sysctls"] = {}  # the example's net.* ones are for a pod network
    pod_path = write_json(tmp_path / "pod.json", cfg)
    pod_id = daemon.crictl(crictl, "runp", "--runtime", handler, pod_path).stdout.strip()
    try:
        info = json.loads(daemon.crictl(crictl, "inspectp", pod_id).stdout)["info"]
        pid = info["pid"]
        assert os.path.samefile(f"/proc/{pid}/root", os.path.join(info["shim"]["bundle"], "rootfs"))
        assert ns_inode(pid, "net") == ns_inode(os.getpid(), "net")
        assert ns_inode(pid, "pid") == ns_inode(os.getpid(), "pid")
        daemon.crictl(crictl, "rmp", "-f", pod_id)
        assert wait_gone(pid) == []
    finally:
        daemon.remove_every_pod(crictl)
    assert active_snapshots(daemon) == [] and mounts_under(daemon.directory) == []


@pytest.fixture
def missing_daemon(test_images) -> Iterator[Podshimd]:
    """A podshimd whose sandbox_image the registry lacks (404) and whose second registry host
    nobody serves."""
    directory = tempfile.mkdtemp(prefix="psd-sbi-")
    try:
        with running_podshimd(directory, config=daemon_config(
                test_images.registry.host, test_images.registry.ref("test/no-such-pause:1.0"))) as daemon:
            yield daemon
    finally:
        shutil.rmtree(directory)


def test_a_sandbox_image_the_registry_lacks_fails_runp_with_the_pulls_status(missing_daemon, crictl, tmp_path) -> None:
    daemon = missing_daemon
    refused = daemon.crictl(crictl, "runp", write_json(tmp_path / "pod.json", pod_config()), check=False)
    assert refused.returncode != 0
    assert "code = NotFound desc = image" in refused.stderr and "test/no-such-pause:1.0" in refused.stderr
    assert daemon.crictl(crictl, "pods", "-q").stdout == ""
    assert daemon.pod_records() == [] and daemon.sandbox_bundles() == []
    assert active_snapshots(daemon) == [] and mounts_under(daemon.directory) == []


def test_an_unreachable_registry_fails_runp_as_unavailable(test_images, crictl, tmp_path) -> None:
    directory = tempfile.mkdtemp(prefix="psd-sbi-")
    try:
        # A port on loopback nobody listens on: connection refused at once.
        with running_podshimd(directory, config=daemon_config("127.0.0.1:9", "127.0.0.1:9/test/pause:1.0")) as daemon:
            refused = daemon.crictl(crictl, "runp", write_json(tmp_path / "pod.json", pod_config()), check=False)
            assert refused.returncode != 0 and "code = Unavailable desc =" in refused.stderr
            assert daemon.pod_records() == [] and daemon.sandbox_bundles() == []
            assert active_snapshots(daemon) == [] and mounts_under(daemon.directory) == []
    finally:
        shutil.rmtree(directory)


@pytest.mark.parametrize("failpoint", ["run:after-sandbox-snapshot", "run:after-create", "run:after-start",
                                       "remove:after-shutdown"])
def test_podshimd_killed_mid_way_is_rolled_back_at_restart(test_images, crictl, tmp_path, failpoint) -> None:
    image = tiny_pause_image(test_images)
    config = daemon_config(test_images.registry.host, image.ref)
    directory = tempfile.mkdtemp(prefix="psd-sbi-")
    pod_path = write_json(tmp_path / "pod.json", pod_config())
    try:
        with running_podshimd(directory, config=config, env={"PODSHIM_FAILPOINT": failpoint}) as daemon:
            pod_id = ""
            if failpoint.startswith("remove:"):
                pod_id = daemon.crictl(crictl, "runp", pod_path).stdout.strip()
                pid = json.loads(daemon.crictl(crictl, "inspectp", pod_id).stdout)["info"]["pid"]
                daemon.crictl(crictl, "rmp", "-f", pod_id, check=False)
            else:
                daemon.crictl(crictl, "runp", pod_path, check=False)
            assert daemon.process.wait(timeout=30) < 0  # killed at its failpoint
            assert active_snapshots(daemon) != []  # what it left for the restart to undo
        with running_podshimd(directory, config=config) as daemon:
            if pod_id:  # stopped and shut down: the pod is still there, NOTREADY, and rmp finishes it
                assert daemon.crictl(crictl, "pods", "-q").stdout.split() == [pod_id]
                assert not alive(pid)
                daemon.crictl(crictl, "rmp", pod_id)
            assert daemon.crictl(crictl, "pods", "-q").stdout == ""
            assert daemon.pod_records() == [] and daemon.sandbox_bundles() == []
            assert active_snapshots(daemon) == [] and mounts_under(directory) == []
    finally:
        shutil.rmtree(directory)


def test_a_sandbox_snapshot_no_pod_names_is_swept_at_start(test_images, crictl) -> None:
    image = tiny_pause_image(test_images)
    config = daemon_config(test_images.registry.host, image.ref)
    directory = tempfile.mkdtemp(prefix="psd-sbi-")
    try:
        with running_podshimd(directory, config=config) as daemon:
            daemon.crictl(crictl, "pull", image.ref)
            chain_id = json.loads(daemon.crictl(crictl, "inspecti", image.ref).stdout)["info"]["chainID"]
        orphan = f"sandbox-{secrets.token_hex(32)}"
        Snapshotter(os.path.join(directory, "state", "images", "snapshots")).prepare(orphan, chain_id)
        with running_podshimd(directory, config=config) as daemon:
            assert active_snapshots(daemon) == []
            daemon.crictl(crictl, "rmi", image.ref)
    finally:
        shutil.rmtree(directory)
