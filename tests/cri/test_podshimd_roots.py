"""Which directory belongs to whom (docs/roots.md), on a node that runs podshimd: a Controller
pointed at podshimd's state root (``podshimctl --root STATE``) refuses it and touches nothing of
podshimd's; pointed at podshimd's bundle root, it lists podshimd's pods and still changes nothing.
One state root has one podshimd, and podshimd refuses a Controller's bundle root."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

from client.controller.bundles import make_bundle

from support.critools import REPO, podshimd_argv, running_podshimd
from support.podtools import pod_config

PODSHIMCTL = [sys.executable, "-m", "client.cli"]


def ctl(*argv: str) -> subprocess.CompletedProcess:
    result = subprocess.run([*PODSHIMCTL, *argv], cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True,
                            text=True, timeout=120)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def footprint(state_root: str) -> dict[str, list[str]]:
    """What podshimd keeps: image blobs and snapshots, each pod's files and bundle."""
    found = {}
    for part in ("images/content/blobs/sha256", "images/snapshots", "pod-files", "sandboxes/k8s.io", "pods"):
        path = os.path.join(state_root, part)
        found[part] = sorted(os.listdir(path)) if os.path.isdir(path) else []
    return found


def test_podshimctl_on_podshimds_state_root_refuses_it_and_touches_nothing(test_images, tmp_path) -> None:
    directory = tempfile.mkdtemp(prefix="psd-roots-")
    config = f'[registries."{test_images.registry.host}"]\ninsecure = true\n'
    try:
        with running_podshimd(directory, config=config) as daemon:
            on_daemon = ["--runtime-root", daemon.runtime_root]
            try:
                check_roots(daemon, on_daemon, test_images, tmp_path)
            finally:
                for pod_id in ctl(*on_daemon, "pods", "-q").stdout.split():
                    ctl(*on_daemon, "stopp", pod_id)
                    ctl(*on_daemon, "rmp", pod_id)
    finally:
        shutil.rmtree(directory)


def check_roots(daemon, on_daemon: list[str], test_images, tmp_path) -> None:
    """Pull an image and run a pod on ``daemon``; then a Controller on its state root, and on its
    bundle root."""
    assert ctl(*on_daemon, "pull", test_images.busybox.ref).returncode == 0
    pod_file = tmp_path / "pod.json"
    pod_file.write_text(json.dumps(pod_config()))
    ran = ctl(*on_daemon, "runp", str(pod_file))
    assert ran.returncode == 0, ran.stderr
    pod_id = ran.stdout.strip()
    before = footprint(daemon.state_root)
    assert all(before.values()), before  # an image, a pod, its files and its bundle

    listed = ctl("--root", daemon.state_root, "--runtime-root", daemon.runtime_root, "sandbox", "list", "-A")
    assert listed.returncode == 1 and listed.stdout == ""
    assert listed.stderr == (
        f"FAILED_PRECONDITION: {daemon.state_root} is podshimd's state root, not a Controller's bundle root "
        f"({daemon.state_root}/.podshim-layout says so); it is left alone; a Controller opened on it would "
        f"take podshimd's images and pods for sandboxes. podshimd's sandboxes are in "
        f"{daemon.state_root}/sandboxes (podshimctl --root {daemon.state_root}/sandboxes -n k8s.io)\n")
    assert footprint(daemon.state_root) == before

    bundles = os.path.join(daemon.state_root, "sandboxes")
    seen = ctl("--root", bundles, "--runtime-root", daemon.runtime_root, "sandbox", "list", "-A", "--json")
    assert seen.returncode == 0, seen.stderr
    assert [(s["namespace"], s["sandbox_id"], s["state"]) for s in json.loads(seen.stdout)] == [
        ("k8s.io", pod_id, "running")]
    assert footprint(daemon.state_root) == before


def test_a_second_podshimd_on_one_state_root_refuses_to_start_and_names_the_first(tmp_path) -> None:
    first_dir, second_dir = tempfile.mkdtemp(prefix="psd-one-"), tempfile.mkdtemp(prefix="psd-two-")
    try:
        with running_podshimd(first_dir) as first:
            with open(os.path.join(first.state_root, "podshimd.lock")) as f:
                assert f.read() == f"{first.process.pid}\n"
            # Its own runtime root and socket; the first one's state root.
            open(os.path.join(second_dir, "config.toml"), "w").close()
            second = subprocess.run(podshimd_argv(second_dir, "--state-root", first.state_root), cwd=REPO,
                                    stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
            assert second.returncode == 1
            assert second.stderr.splitlines()[-1] == (
                f"podshimd: another podshimd (pid {first.process.pid}) serves the state root {first.state_root}: "
                "one state root has one daemon; stop that one, or give this one a state root of its own")
            assert not os.path.exists(os.path.join(second_dir, "run", "podshimd.sock"))
            assert first.process.poll() is None
        assert not os.path.exists(os.path.join(first.state_root, "podshimd.lock"))  # the first left nothing
    finally:
        shutil.rmtree(first_dir)
        shutil.rmtree(second_dir)


def test_podshimd_refuses_a_state_root_marked_as_a_controllers_bundle_root(tmp_path) -> None:
    directory = tempfile.mkdtemp(prefix="psd-bnd-")
    try:
        state_root = os.path.join(directory, "state")
        make_bundle(state_root, "default", "sb1")  # a Controller's: a bundle root
        open(os.path.join(directory, "config.toml"), "w").close()
        started = subprocess.run(podshimd_argv(directory), cwd=REPO, stdin=subprocess.DEVNULL,
                                 capture_output=True, text=True, timeout=60)
        assert started.returncode == 1
        assert started.stderr.splitlines()[-1] == (
            f"podshimd: {state_root} is a Controller's bundle root, not podshimd's state root "
            f"({state_root}/.podshim-layout says so); it is left alone; give podshimd a state root of its own "
            "(its sandboxes' bundles go to STATE_ROOT/sandboxes)")
        assert sorted(os.listdir(state_root)) == [".podshim-layout", "default"]
    finally:
        shutil.rmtree(directory)
