"""containerd's CRI stats of podshim pods: ``crictl stats`` (the container's, from the shim's Task Stats)
and ``crictl statsp`` (the pod's, which containerd reads from the pod's cgroup parent, the containers'
from Task Stats) show the CPU time and memory the container really uses, as containerd decodes
github.com/containerd/cgroups' Metrics."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import signal
import time

import pytest

from support.ctrdtools import sleeping_pod

#: What the container holds in memory (a shell variable of that many bytes), and the CPU time making it takes.
HELD_BYTES = 32 << 20
#: Bound on the container's getting there.
SETTLE = 60.0


@pytest.fixture
def cgroup_parent():
    """An absolute cgroup parent of the test's own; its directories (and any a failed test left
    below them) removed after the test (set up before containerd: removed after it stopped)."""
    parent = f"/podshim-ctrd-{secrets.token_hex(4)}"
    yield parent
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f if line.split(" - ")[1].split()[0] in ("cgroup", "cgroup2")]
    for point in points:
        top = os.path.join(point, parent.lstrip("/"))
        for below, _, _ in sorted(os.walk(top), key=lambda entry: len(entry[0]), reverse=True):
            remove_cgroup(below)


def remove_cgroup(path: str) -> None:
    """Remove the cgroup directory ``path``, killing what a failed test left in it (its pods' processes)."""
    deadline = time.monotonic() + SETTLE
    while True:
        try:
            os.rmdir(path)
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
        with open(os.path.join(path, "cgroup.procs")) as f:
            for pid in map(int, f.read().split()):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def value(usage: dict, name: str) -> int:
    return int(usage[name]["value"])


def test_crictl_stats_and_statsp_show_a_podshim_containers_real_cpu_and_memory(cgroup_parent, containerd, crictl,
                                                                            directory, test_images) -> None:
    holder = f"x=$(head -c {HELD_BYTES} /dev/zero | tr '\\0' a); echo held; while sleep 1; do :; done"
    pod_id, cid = sleeping_pod(containerd, crictl, directory, test_images.busybox.ref, "busy",
                               command=("sh", "-c", holder), linux={"cgroup_parent": cgroup_parent})
    deadline = time.monotonic() + SETTLE
    while containerd.crictl(crictl, "logs", cid).stdout != "held\n":
        assert time.monotonic() < deadline, containerd.log()[-6000:]
        time.sleep(0.2)

    done = containerd.crictl(crictl, "stats", "-o", "json", "--id", cid)
    assert done.returncode == 0, f"{done.stderr}\n{containerd.log()[-6000:]}"
    [stats] = json.loads(done.stdout)["stats"]
    assert stats["attributes"]["id"] == cid
    # make the bytes, then hold them: CPU time, and at least those bytes in the working set
    assert value(stats["cpu"], "usageCoreNanoSeconds") > 1_000_000
    assert HELD_BYTES <= value(stats["memory"], "workingSetBytes") < 4 * HELD_BYTES

    done = containerd.crictl(crictl, "statsp", "-o", "json", "--id", pod_id)
    assert done.returncode == 0, f"{done.stderr}\n{containerd.log()[-6000:]}"
    [pod] = json.loads(done.stdout)["stats"]
    assert pod["attributes"]["id"] == pod_id
    linux = pod["linux"]
    assert value(linux["cpu"], "usageCoreNanoSeconds") >= value(stats["cpu"], "usageCoreNanoSeconds")
    assert value(linux["memory"], "workingSetBytes") >= HELD_BYTES
    [container] = linux["containers"]
    assert container["attributes"]["id"] == cid and value(container["memory"], "workingSetBytes") >= HELD_BYTES

    assert containerd.crictl(crictl, "stopp", pod_id).returncode == 0
    assert containerd.crictl(crictl, "rmp", pod_id).returncode == 0
    assert containerd.shims() == []
