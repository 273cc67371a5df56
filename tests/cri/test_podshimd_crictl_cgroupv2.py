"""Limits set with the real crictl and read back from the cgroup v2 files, under each cgroup driver
and handler (marker ``cgroupv2``: they run in the guest of tests/support/guest.py): a pod with CPU
and memory limits and a container with CPU shares and quota, memory and memory+swap limits, a
cpuset and a pids limit through podshimd; the container's v2 directory read, ``crictl update``
and read again, ``crictl stats`` against the same files; nothing left once the pod is removed."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

from support.critools import Podshimd, running_podshimd
from support.podtools import container_config, pod_config

pytestmark = pytest.mark.cgroupv2

HANDLERS = ["native"] + [h for h in ("runc", "crun") if shutil.which(h, path="/usr/sbin:/usr/bin:/sbin:/bin")]
MIB = 1 << 20

#: The pod's limits (CRI's LinuxContainerResources, as crictl's JSON says them) and their v2 files.
POD_RESOURCES = {"cpu_shares": 1024, "cpu_period": 100000, "cpu_quota": 200000, "memory_limit_in_bytes": 256 * MIB}
POD_FILES = {"cpu.weight": "39", "cpu.max": "200000 100000", "memory.max": str(256 * MIB)}
#: The container's, with pids.max through CRI's unified map (CRI has no pids field of its own).
RESOURCES = {"cpu_shares": 512, "cpu_period": 100000, "cpu_quota": 50000, "memory_limit_in_bytes": 96 * MIB,
             "memory_swap_limit_in_bytes": 128 * MIB, "cpuset_cpus": "0", "cpuset_mems": "0",
             "unified": {"pids.max": "30"}}
FILES = {"cpu.weight": "20", "cpu.max": "50000 100000", "memory.max": str(96 * MIB),
         "memory.swap.max": str(32 * MIB), "cpuset.cpus": "0", "cpuset.mems": "0"}
#: The unified map's pids.max: under the systemd driver it is also the scope's TasksMax, which
#: systemd writes over the file whenever it applies the unit (shim.kernel.cgroups.systemd).
PIDS_MAX = "30"
#: ``crictl update`` and what the files say after it (memory.swap.max is left: crictl sends no swap).
UPDATE = ["--cpu-share", "1024", "--cpu-period", "50000", "--cpu-quota", "25000", "--memory", str(64 * MIB)]
UPDATED = {**FILES, "cpu.weight": "39", "cpu.max": "25000 50000", "memory.max": str(64 * MIB)}


@pytest.fixture(scope="module", params=["cgroupfs", "systemd"])
def driver_daemon(request, test_images) -> Iterator[tuple[str, Podshimd]]:
    directory = tempfile.mkdtemp(prefix="psd-v2c-")
    try:
        with running_podshimd(directory, config=f'cgroup_driver = "{request.param}"\n',
                              image=test_images.busybox) as daemon:
            yield request.param, daemon
    finally:
        shutil.rmtree(directory)


def read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def v2_dir(pid: int) -> str:
    with open(f"/proc/{pid}/cgroup") as f:
        return "/sys/fs/cgroup" + next(line[3:].rstrip("\n") for line in f if line.startswith("0::"))


def files(directory: str, names) -> dict[str, str]:
    return {name: read(os.path.join(directory, name)) for name in names}


def unit_state(unit: str) -> str:
    return subprocess.run(["systemctl", "show", "-p", "ActiveState", "--value", unit], capture_output=True,
                          text=True, timeout=60).stdout.strip()


@pytest.mark.parametrize("handler", HANDLERS)
def test_crictl_sets_limits_on_v2_reads_them_back_updates_them_and_its_stats_are_the_v2_files(
        driver_daemon, crictl, handler, tmp_path):
    driver, daemon = driver_daemon
    top = f"podshimtest{secrets.token_hex(4)}"
    config = pod_config()
    config["linux"]["resources"] = POD_RESOURCES
    if driver == "systemd":
        config["linux"]["cgroup_parent"] = f"{top}-burstable-pod{secrets.token_hex(8)}.slice"
    pod_path = tmp_path / "pod.json"
    pod_path.write_text(json.dumps(config))
    container = container_config(["sleep", "600"])
    container["image"] = {"image": daemon.image}
    container["linux"]["resources"] = RESOURCES
    container_path = tmp_path / "container.json"
    container_path.write_text(json.dumps(container))
    pod_id = ""
    try:
        pod_id = daemon.crictl(crictl, "runp", "--runtime", handler, str(pod_path)).stdout.strip()
        container_id = daemon.crictl(crictl, "create", "--no-pull", pod_id, str(container_path),
                                     str(pod_path)).stdout.strip()
        daemon.crictl(crictl, "start", container_id)
        pid = json.loads(daemon.crictl(crictl, "inspect", container_id).stdout)["info"]["pid"]
        directory = v2_dir(pid)
        # crun's systemd driver runs its container in a sub-cgroup of its scope.
        scope = os.path.dirname(directory) if os.path.basename(directory) == "container" else directory
        pod_directory = os.path.dirname(scope)
        if driver == "systemd":
            assert scope.endswith(f"-{container_id}.scope") and pod_directory.endswith(".slice"), directory
            assert unit_state(os.path.basename(scope)) == "active"
        assert files(pod_directory, POD_FILES) == POD_FILES
        assert files(directory, FILES) == FILES
        pids_max = read(os.path.join(directory, "pids.max"))

        assert daemon.crictl(crictl, "update", *UPDATE, container_id).stdout.strip() == container_id
        assert files(directory, UPDATED) == UPDATED

        usage_before = int(files(directory, ["cpu.stat"])["cpu.stat"].split()[1])
        stats = json.loads(daemon.crictl(crictl, "stats", "-o", "json", container_id).stdout)["stats"][0]
        usage_after = int(files(directory, ["cpu.stat"])["cpu.stat"].split()[1])
        memory_current = int(read(os.path.join(directory, "memory.current")))
        assert stats["attributes"]["id"] == container_id
        # cpu.stat's usage_usec, read on either side of crictl's.
        assert usage_before * 1000 <= int(stats["cpu"]["usageCoreNanoSeconds"]["value"]) <= usage_after * 1000
        # A sleeping container's memory.current moves by a few pages at most meanwhile.
        assert abs(int(stats["memory"]["usageBytes"]["value"]) - memory_current) <= 256 << 10, (stats, memory_current)

        daemon.crictl(crictl, "rmp", "-f", pod_id)
        pod_id = ""
        assert not os.path.exists(directory) and not os.path.exists(pod_directory)
        if driver == "systemd":
            assert unit_state(os.path.basename(scope)) == "inactive"
            assert unit_state(os.path.basename(pod_directory)) == "inactive"
        assert pids_max == PIDS_MAX
    finally:
        if pod_id:
            daemon.crictl(crictl, "rmp", "-f", pod_id, check=False)
        if driver == "systemd":
            subprocess.run(["systemctl", "stop", f"{top}.slice"], capture_output=True, timeout=60)
