"""The README's first command ends in examples/quickstart.sh: it must keep working as written, with
the installed commands, on a machine with no registry and no network. Its by-hand path, pasted as a
block, must work too."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from shim.launch.template import stop_template

from support.netrelay import loopback_relay

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_quickstart_runs_a_pod_and_a_container_and_leaves_nothing() -> None:
    assert shutil.which("podshimd") and shutil.which("podshimctl"), "the installed commands (.ci/install)"
    done = subprocess.run([os.path.join(REPO, "examples", "quickstart.sh")], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "no pod, no pause, no shim, no netns, no socket, no record." in done.stdout
    assert "inet 10.88." in done.stdout  # the container saw the pod's address


def by_hand_lines() -> list[str]:
    """The README's by-hand path: the lines of the sh block after "By hand"."""
    with open(os.path.join(REPO, "README.md")) as f:
        return f.read().split("By hand,", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0].splitlines()


def test_the_readmes_by_hand_path_runs_pasted_as_a_block(test_images, outer_netns, tmp_path) -> None:
    # The block's lines as they are, in a bash -e that tidies up after them, with what a node has
    # and this machine must not give: the conflist goes to the daemon's own CNI dir (its leases in
    # the test's directory: the same edit as quickstart.sh's), podshimd runs in a network namespace
    # of the test's with roots of its own, and the tests' registry (plain HTTP: the README's
    # insecure-registry setting) serves the image that docker.io would.
    lines = by_hand_lines()
    install = "install -D -m 0644 examples/cni/10-podshim-bridge.conflist /etc/cni/net.d/10-podshim-bridge.conflist"
    assert lines[0] == install
    work, bin_dir, net_d = tmp_path / "work", tmp_path / "bin", tmp_path / "net.d"
    for directory in (work / "examples", bin_dir, net_d):
        directory.mkdir(parents=True)
    with open(os.path.join(REPO, "examples", "cni", "10-podshim-bridge.conflist")) as f:
        conflist = json.load(f)
    conflist["plugins"][0]["ipam"]["dataDir"] = str(tmp_path / "ipam")
    (net_d / "10-podshim-bridge.conflist").write_text(json.dumps(conflist))
    busybox = test_images.busybox
    with open(os.path.join(REPO, "examples", "container-config.json")) as f:
        container = json.load(f)
    container["image"]["image"] = busybox.ref
    (work / "examples" / "container-config.json").write_text(json.dumps(container))
    shutil.copy(os.path.join(REPO, "examples", "pod-config.json"), work / "examples")
    (tmp_path / "config.toml").write_text(f'[registries."{busybox.ref.split("/", 1)[0]}"]\ninsecure = true\n')
    (bin_dir / "podshimd").write_text(
        f"#!/bin/sh\nexec nsenter --net={outer_netns} -- {sys.executable} -m client.podshimd --config {tmp_path}/config.toml "
        f"--listen unix://{tmp_path}/run/podshimd.sock --runtime-root {tmp_path}/run --state-root {tmp_path}/state "
        f'--cni-conf-dir {net_d} "$@"\n')
    (bin_dir / "podshimctl").write_text(f'#!/bin/sh\nexec {sys.executable} -m client.cli "$@"\n')
    for command in bin_dir.iterdir():
        command.chmod(0o755)
    script = tmp_path / "by-hand.sh"
    script.write_text("trap 'for p in $(podshimctl pods -q 2>/dev/null); do podshimctl rmp \"$p\"; done; "
                      "kill %1 2>/dev/null; wait' EXIT\n" + "\n".join(lines[1:]) + "\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": REPO,
           "PODSHIM_ENDPOINT": f"unix://{tmp_path}/run/podshimd.sock"}
    try:
        with loopback_relay(outer_netns, int(busybox.ref.split("/", 1)[0].rpartition(":")[2])):
            done = subprocess.run(["bash", "-e", str(script)], cwd=work, env=env, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=300)
    finally:
        stop_template(f"{tmp_path}/run")  # the shim template the pod started, which outlives podshimd
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"podshimd: {tmp_path}/config.toml: OK\n" in done.stdout and "Traceback" not in done.stderr
    # The container's log (its hostname, its interfaces with the pod's address), then the pod's status.
    assert "podshim-demo\n" in done.stdout and "inet 10.88." in done.stdout, done.stdout
    assert '"netns_path": "/var/run/netns/podshim-' in done.stdout and "Removed sandbox " in done.stdout
    assert done.stderr.rstrip().endswith(": stopped"), done.stderr[-2000:]  # kill %1 stopped it cleanly
