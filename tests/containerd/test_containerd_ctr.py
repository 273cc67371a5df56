"""A plain container on podshim's shim through containerd without its CRI: ``ctr run --runtime
io.containerd.podshim.v1`` (here the runtime's binary by its path, this checkout's). containerd starts
the shim with the container's own id and sends Task Create of that id: the shim makes the container a
pod of its own (tests/containerd/test_shim_protocol.py runs one) and applies ctr's default spec, its
tmpfs on /run and its RLIMIT_NOFILE 1024:1024 included, to the task and to an exec; nothing is left
once the container is removed."""

from __future__ import annotations

import os
import subprocess

from support.ctrdtools import containerd_binary

NOFILE_1024 = "Max open files            1024                 1024                 files"


def ctr_and_runtime(containerd, test_images) -> tuple[list[str], str]:
    """ctr's command for this containerd, with the test image pulled, and podshim's runtime binary."""
    ctr = [containerd_binary("ctr"), "--address", containerd.socket, "-n", "default"]
    pulled = subprocess.run([*ctr, "images", "pull", "--plain-http", test_images.busybox.ref], capture_output=True,
                            text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert pulled.returncode == 0, pulled.stderr
    return ctr, os.path.join(containerd.directory, "bin", "containerd-shim-podshim-v1")


def assert_nothing_left(containerd) -> None:
    assert containerd.shims() == [] and containerd.shim_sockets() == []
    assert os.listdir(os.path.join(containerd.state, "io.containerd.runtime.v2.task", "default")) == []


def test_ctr_run_with_its_default_spec_runs_with_its_tmpfs_on_run_and_leaves_nothing(containerd, test_images) -> None:
    ctr, runtime = ctr_and_runtime(containerd, test_images)
    try:
        # ctr's default spec: a tmpfs on /run, nosuid, strictatime, mode=755, size=65536k
        ran = subprocess.run([*ctr, "run", "--rm", "--runtime", runtime, test_images.busybox.ref, "plain1", "sh",
                              "-c", "touch /run/written && grep ' /run ' /proc/self/mountinfo && "
                              "grep 'Max open files' /proc/self/limits"],
                             capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert ran.returncode == 0, f"{ran.stderr}\n{containerd.log()[-6000:]}"
        line, limit = ran.stdout.splitlines()
        assert limit.rstrip() == NOFILE_1024  # ctr's default spec's process.rlimits
        fields = line.split()
        options, filesystem = fields[5].split(","), fields[fields.index("-") + 1:]
        assert "nosuid" in options and filesystem[0] == "tmpfs"
        assert "size=65536k" in filesystem[2] and "mode=755" in filesystem[2], line
    finally:
        subprocess.run([*ctr, "containers", "rm", "plain1"], capture_output=True, timeout=60)
    assert_nothing_left(containerd)


def test_ctr_task_exec_gets_the_rlimits_of_its_process_spec(containerd, test_images) -> None:
    ctr, runtime = ctr_and_runtime(containerd, test_images)
    try:
        ran = subprocess.run([*ctr, "run", "-d", "--runtime", runtime, test_images.busybox.ref, "plain2", "sleep", "60"],
                             capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert ran.returncode == 0, f"{ran.stderr}\n{containerd.log()[-6000:]}"
        # ctr's exec process spec is the container's with its own args: its rlimits are the spec's
        execd = subprocess.run([*ctr, "task", "exec", "--exec-id", "limits", "plain2", "grep", "Max open files",
                                "/proc/self/limits"], capture_output=True, text=True, timeout=60,
                               stdin=subprocess.DEVNULL)
        assert execd.returncode == 0, f"{execd.stderr}\n{containerd.log()[-6000:]}"
        assert execd.stdout.rstrip() == NOFILE_1024
    finally:
        subprocess.run([*ctr, "task", "kill", "-s", "SIGKILL", "plain2"], capture_output=True, timeout=60)
        subprocess.run([*ctr, "task", "rm", "-f", "plain2"], capture_output=True, timeout=60)
        subprocess.run([*ctr, "containers", "rm", "plain2"], capture_output=True, timeout=60)
    assert_nothing_left(containerd)
