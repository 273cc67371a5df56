"""podshimd on pure cgroup v2 under the systemd cgroup driver, as kubelet drives it there (marker
``cgroupv2``: they run in the guest of tests/support/guest.py): RuntimeConfig says systemd, a pod given a
kubelet slice is a slice of its own in it and each container a scope systemd knows, a container's limits are in its
v2 files and UpdateContainerResources changes them, an OOM kill is reported as OOMKilled, the
container sees its own cgroup as its root, and nothing is left once the pod is removed. critest's OOM
spec is run in its own shape under both drivers and every handler (native, runc, crun)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest
from google.protobuf import json_format

from shim.api.cgroups import expand_slice
from shim.cri.api import api_pb2

from support.critools import Podshimd, running_podshimd
from support.podtools import container_config, pod_config

pytestmark = pytest.mark.cgroupv2

HANDLERS = ["native"] + [h for h in ("runc", "crun") if shutil.which(h, path="/usr/sbin:/usr/bin:/sbin:/bin")]


@contextlib.contextmanager
def driver_daemon(test_images, driver: str) -> Iterator[tuple[Podshimd, str]]:
    """A podshimd with ``cgroup_driver = driver`` that pulled the tests' busybox, and the image's id."""
    directory = tempfile.mkdtemp(prefix="psd-v2-")
    try:
        config = f'cgroup_driver = "{driver}"\n[registries."{test_images.registry.host}"]\ninsecure = true\n'
        with running_podshimd(directory, config=config) as daemon:
            pulled = daemon.images().PullImage(api_pb2.PullImageRequest(
                image=api_pb2.ImageSpec(image=test_images.busybox.ref)))
            yield daemon, pulled.image_ref
    finally:
        shutil.rmtree(directory)


@pytest.fixture(scope="module")
def image_daemon(test_images) -> Iterator[tuple[Podshimd, str]]:
    """:func:`driver_daemon` under the systemd driver."""
    with driver_daemon(test_images, "systemd") as made:
        yield made


@pytest.fixture(scope="module")
def cgroupfs_daemon(test_images) -> Iterator[tuple[Podshimd, str]]:
    """:func:`driver_daemon` under the cgroupfs driver."""
    with driver_daemon(test_images, "cgroupfs") as made:
        yield made


def unit_property(unit: str, name: str) -> str:
    return subprocess.run(["systemctl", "show", "-p", name, "--value", unit], capture_output=True, text=True,
                          timeout=60).stdout.strip()


class Pod:
    """A pod of one handler in a kubelet-named slice of the test's own, or in the parent critest
    gives under ``critest_driver`` (none for cgroupfs, a slice's path for systemd: one of the
    test's own here); removed (and its slices stopped) at the end."""

    def __init__(self, daemon: Podshimd, image: str, handler: str, critest_driver: str | None = None,
                 privileged: bool = False) -> None:
        self.daemon, self.image, self.runtime = daemon, image, daemon.runtime()
        self.top = f"podshimtest{secrets.token_hex(4)}"
        self.parent = {None: f"{self.top}-burstable-pod{secrets.token_hex(8)}.slice", "cgroupfs": "",
                       "systemd": f"/{self.top}.slice"}[critest_driver]
        self.config = pod_config()
        self.config["linux"]["cgroup_parent"] = self.parent
        self.config["linux"]["security_context"]["privileged"] = privileged
        self.log_directory = tempfile.mkdtemp(prefix="psd-v2-logs-")
        self.config["log_directory"] = self.log_directory
        self.pod_id = self.runtime.RunPodSandbox(api_pb2.RunPodSandboxRequest(
            config=json_format.ParseDict(self.config, api_pb2.PodSandboxConfig()),
            runtime_handler=handler)).pod_sandbox_id

    def run(self, command: list[str], resources: dict) -> str:
        config = container_config(command)
        config["log_path"] = f"{secrets.token_hex(4)}.log"
        config["image"] = {"image": self.image}
        config["linux"]["resources"] = resources
        container_id = self.runtime.CreateContainer(api_pb2.CreateContainerRequest(
            pod_sandbox_id=self.pod_id, config=json_format.ParseDict(config, api_pb2.ContainerConfig()),
            sandbox_config=json_format.ParseDict(self.config, api_pb2.PodSandboxConfig()))).container_id
        self.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=container_id))
        return container_id

    def status(self, container_id: str) -> api_pb2.ContainerStatus:
        return self.runtime.ContainerStatus(api_pb2.ContainerStatusRequest(container_id=container_id)).status

    def exited(self, container_id: str, timeout: float = 120.0) -> api_pb2.ContainerStatus:
        deadline = time.monotonic() + timeout
        while (status := self.status(container_id)).state != api_pb2.CONTAINER_EXITED:
            assert time.monotonic() < deadline, f"container {container_id} still {status.state} after {timeout} s"
            time.sleep(0.2)
        return status

    def pid(self, container_id: str) -> int:
        status = self.runtime.ContainerStatus(api_pb2.ContainerStatusRequest(container_id=container_id, verbose=True))
        return json.loads(status.info["info"])["pid"]

    def remove(self) -> None:
        self.runtime.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=self.pod_id))
        self.runtime.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=self.pod_id))
        shutil.rmtree(self.log_directory, ignore_errors=True)


@contextlib.contextmanager
def removed_after(made: Pod) -> Iterator[Pod]:
    """``made``, removed at the end, and its test's top slice stopped (kubelet's, made by systemd
    as the pod slice's parent)."""
    try:
        yield made
    finally:
        try:
            made.remove()
        finally:
            subprocess.run(["systemctl", "stop", f"{made.top}.slice"], capture_output=True, timeout=60)


@pytest.fixture(params=HANDLERS)
def pod(request, image_daemon) -> Iterator[Pod]:
    daemon, image = image_daemon
    with removed_after(Pod(daemon, image, request.param)) as made:
        yield made


def read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def v2_dir(pid: int) -> str:
    """Process ``pid``'s cgroup v2 directory, as this process sees it."""
    with open(f"/proc/{pid}/cgroup") as f:
        path = next(line[3:].rstrip("\n") for line in f if line.startswith("0::"))
    return "/sys/fs/cgroup" + path


def test_runtime_config_answers_the_systemd_driver(image_daemon) -> None:
    daemon, _ = image_daemon
    answer = daemon.runtime().RuntimeConfig(api_pb2.RuntimeConfigRequest())
    assert answer.linux.cgroup_driver == api_pb2.CgroupDriver.SYSTEMD


def test_a_pod_is_a_slice_its_containers_scopes_their_limits_land_update_changes_them_and_nothing_is_left(pod) -> None:
    container_id = pod.run(["sleep", "600"], {"cpu_period": 100000, "cpu_quota": 25000, "cpu_shares": 256,
                                               "memory_limit_in_bytes": 96 << 20})
    directory = v2_dir(pod.pid(container_id))  # crun: a sub-cgroup of its scope, where its limits are
    scope = directory if directory.endswith(".scope") else os.path.dirname(directory)
    unit, pod_slice = os.path.basename(scope), os.path.basename(os.path.dirname(scope))
    # The container: a scope systemd knows, in the pod's own slice in kubelet's pod slice.
    assert os.path.dirname(scope) == "/sys/fs/cgroup" + expand_slice(pod_slice)
    assert pod_slice.startswith(pod.parent[:-len(".slice")] + "-")
    assert unit.endswith(f"-{container_id}.scope") and unit_property(unit, "ActiveState") == "active"
    assert {name: read(os.path.join(directory, name)) for name in ("cpu.max", "cpu.weight", "memory.max")} == {
        "cpu.max": "25000 100000", "cpu.weight": "10", "memory.max": str(96 << 20)}
    pod.runtime.UpdateContainerResources(api_pb2.UpdateContainerResourcesRequest(
        container_id=container_id, linux=api_pb2.LinuxContainerResources(
            cpu_period=100000, cpu_quota=50000, cpu_shares=512, memory_limit_in_bytes=64 << 20)))
    assert {name: read(os.path.join(directory, name)) for name in ("cpu.max", "cpu.weight", "memory.max")} == {
        "cpu.max": "50000 100000", "cpu.weight": "20", "memory.max": str(64 << 20)}
    if scope == directory:  # crun's scope has no limit of its own: its sub-cgroup has
        assert unit_property(unit, "MemoryMax") == str(64 << 20)
    pod.remove()
    assert not os.path.exists(os.path.dirname(scope))
    assert [unit_property(name, "ActiveState") for name in (unit, pod_slice)] == ["inactive"] * 2


def test_a_container_sees_its_own_cgroup_as_its_root(pod) -> None:
    container_id = pod.run(["cat", "/proc/self/cgroup"], {})
    assert pod.exited(container_id).exit_code == 0
    log = os.path.join(pod.log_directory, pod.status(container_id).log_path)
    assert [line.split(" ", 3)[3] for line in read(log).splitlines()] == ["0::/"]


def test_a_container_that_allocates_past_its_limit_is_reported_oom_killed(pod) -> None:
    # tail keeps what it read until a newline, and /dev/zero has none.
    container_id = pod.run(["tail", "/dev/zero"], {"memory_limit_in_bytes": 16 << 20,
                                                   "memory_swap_limit_in_bytes": 16 << 20})
    status = pod.exited(container_id)
    assert (status.exit_code, status.reason) == (137, "OOMKilled")


@pytest.mark.parametrize("handler", HANDLERS)
@pytest.mark.parametrize("driver", ["cgroupfs", "systemd"])
def test_critests_oom_container_exits_137_oomkilled(request, driver, handler) -> None:
    # critest's "runtime should output OOMKilled reason": a privileged pod under the driver's parent
    # as critest gives it (none for cgroupfs, a slice's path for systemd), a container that is not
    # privileged, memory and memory+swap at 15 MiB, and dd reading /dev/zero in 20 MiB blocks.
    daemon, image = request.getfixturevalue("image_daemon" if driver == "systemd" else "cgroupfs_daemon")
    with removed_after(Pod(daemon, image, handler, critest_driver=driver, privileged=True)) as pod:
        container_id = pod.run(["sh", "-c", "dd if=/dev/zero of=/dev/null bs=20M"],
                               {"memory_limit_in_bytes": 15 << 20, "memory_swap_limit_in_bytes": 15 << 20})
        status = pod.exited(container_id)
        assert (status.exit_code, status.reason) == (137, "OOMKilled")
