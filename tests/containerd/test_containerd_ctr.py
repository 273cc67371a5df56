"""A plain container on podshim's shim through containerd without its CRI: ``ctr run --runtime
io.containerd.podshim.v1`` (here the runtime's binary by its path, this checkout's). containerd starts
the shim with the container's own id and sends Task Create of that id: the shim makes the container a
pod of its own (tests/containerd/test_shim_protocol.py runs one), but ctr's default spec mounts a tmpfs
on /run, which podshim's shim does not yet give containerd's containers: refused with that sentence,
and nothing is left."""

from __future__ import annotations

import os
import subprocess

from support.ctrdtools import containerd_binary


def test_ctr_run_with_its_default_spec_is_refused_for_its_tmpfs_and_leaves_nothing(containerd, test_images):
    ctr = [containerd_binary("ctr"), "--address", containerd.socket, "-n", "default"]
    pulled = subprocess.run([*ctr, "images", "pull", "--plain-http", test_images.busybox.ref], capture_output=True,
                            text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert pulled.returncode == 0, pulled.stderr
    runtime = os.path.join(containerd.directory, "bin", "containerd-shim-podshim-v1")
    ran = subprocess.run([*ctr, "run", "--rm", "--runtime", runtime, test_images.busybox.ref, "plain1", "true"],
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert ran.returncode != 0
    assert "config.json mounts[6] (/run) is a 'tmpfs' mount: podshim's shim binds host paths only" in ran.stderr
    subprocess.run([*ctr, "containers", "rm", "plain1"], capture_output=True, timeout=60)
    assert containerd.shims() == [] and containerd.shim_sockets() == []
    assert os.listdir(os.path.join(containerd.state, "io.containerd.runtime.v2.task", "default")) == []
