"""A container's resources as kubelet gives them at CreateContainer, through podshimd's gRPC API, with
each runtime handler, in containers of the tests' busybox image: in the container's cgroup files and its process before it runs,
and a container the kernel's OOM killer killed reported as containerd reports it (exit code 137,
reason OOMKilled)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import json_format

from shim.cri.api import api_pb2

from support.critools import Podshimd, running_podshimd
from support.podtools import cgroup_file, container_config, pod_config
from support.shimtools import HANDLERS

#: What kubelet sends for a container with requests and limits: cpu 250m of a 100 ms period, 96 MiB,
#: a burstable pod's oom_score_adj, and a limit of 0 for each huge page size the node has.
RESOURCES = {"cpu_period": 100000, "cpu_quota": 25000, "cpu_shares": 256, "memory_limit_in_bytes": 96 << 20,
             "cpuset_cpus": "0", "cpuset_mems": "0", "oom_score_adj": 936,
             "hugepage_limits": [{"page_size": size, "limit": 0} for size in ("2MB", "1GB")
                                 if os.path.isdir(f"/sys/kernel/mm/hugepages/hugepages-"
                                                  f"{2048 if size == '2MB' else 1048576}kB")]}


@pytest.fixture(scope="module")
def image_daemon(test_images) -> Iterator[tuple[Podshimd, str]]:
    """A podshimd that pulled the tests' busybox image (from the plain-HTTP test registry), and the image's id."""
    directory = tempfile.mkdtemp(prefix="psd-res-")
    try:
        with running_podshimd(directory, config=f'[registries."{test_images.registry.host}"]\ninsecure = true\n') \
                as daemon:
            pulled = daemon.images().PullImage(api_pb2.PullImageRequest(
                image=api_pb2.ImageSpec(image=test_images.busybox.ref)))
            yield daemon, pulled.image_ref
    finally:
        shutil.rmtree(directory)


@pytest.fixture
def daemon(image_daemon) -> Podshimd:
    """The module's podshimd."""
    return image_daemon[0]


@pytest.fixture(params=HANDLERS)
def run(request, image_daemon):
    """run(command, resources) -> the id of a started busybox container with those ``linux.resources``,
    in a pod of the handler (removed after the test)."""
    daemon, image = image_daemon
    runtime = daemon.runtime()
    pod = pod_config()
    pod_id = runtime.RunPodSandbox(api_pb2.RunPodSandboxRequest(
        config=json_format.ParseDict(pod, api_pb2.PodSandboxConfig()), runtime_handler=request.param)).pod_sandbox_id

    def run(command: list[str], resources: dict) -> str:
        config = container_config(command)
        config["image"] = {"image": image}
        config["linux"]["resources"] = resources
        container_id = runtime.CreateContainer(api_pb2.CreateContainerRequest(
            pod_sandbox_id=pod_id, config=json_format.ParseDict(config, api_pb2.ContainerConfig()),
            sandbox_config=json_format.ParseDict(pod, api_pb2.PodSandboxConfig()))).container_id
        runtime.StartContainer(api_pb2.StartContainerRequest(container_id=container_id))
        return container_id
    try:
        yield run
    finally:
        runtime.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=pod_id))
        runtime.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=pod_id))


def status_of(daemon, container_id: str) -> api_pb2.ContainerStatus:
    return daemon.runtime().ContainerStatus(api_pb2.ContainerStatusRequest(container_id=container_id)).status


def exited(daemon, container_id: str, timeout: float = 60.0) -> api_pb2.ContainerStatus:
    """The container's status once it is EXITED; AssertionError if it is not within ``timeout``."""
    deadline = time.monotonic() + timeout
    while (status := status_of(daemon, container_id)).state != api_pb2.CONTAINER_EXITED:
        assert time.monotonic() < deadline, f"container {container_id} still {status.state} after {timeout} s"
        time.sleep(0.1)
    return status


def container_pid(daemon, container_id: str) -> int:
    status = daemon.runtime().ContainerStatus(api_pb2.ContainerStatusRequest(container_id=container_id, verbose=True))
    return json.loads(status.info["info"])["pid"]


def read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def test_a_containers_resources_are_in_its_cgroup_and_process(daemon, run) -> None:
    pid = container_pid(daemon, run(["sleep", "600"], RESOURCES))
    assert read(cgroup_file(pid, "cpu", "cpu.cfs_period_us")) == "100000"
    assert read(cgroup_file(pid, "cpu", "cpu.cfs_quota_us")) == "25000"
    assert read(cgroup_file(pid, "cpu", "cpu.shares")) == "256"
    assert read(cgroup_file(pid, "memory", "memory.limit_in_bytes")) == str(96 << 20)
    assert read(cgroup_file(pid, "cpuset", "cpuset.cpus")) == "0"
    assert read(cgroup_file(pid, "cpuset", "cpuset.mems")) == "0"
    assert read(f"/proc/{pid}/oom_score_adj") == "936"


def test_a_container_that_allocates_past_its_limit_is_reported_oom_killed(daemon, run) -> None:
    # tail keeps what it read until a newline, and /dev/zero has none.
    container_id = run(["tail", "/dev/zero"], {"memory_limit_in_bytes": 16 << 20,
                                               "memory_swap_limit_in_bytes": 16 << 20})
    status = exited(daemon, container_id)
    assert (status.exit_code, status.reason) == (137, "OOMKilled")


def test_a_container_stopped_with_sigkill_is_not_called_oom_killed(daemon, run) -> None:
    container_id = run(["sleep", "600"], {"memory_limit_in_bytes": 16 << 20})
    daemon.runtime().StopContainer(api_pb2.StopContainerRequest(container_id=container_id, timeout=0))
    status = status_of(daemon, container_id)
    assert (status.exit_code, status.reason) == (137, "Error")


def test_the_event_feed_says_oom_killed_in_the_stopped_event(daemon, run) -> None:
    events = daemon.runtime().GetContainerEvents(api_pb2.GetEventsRequest(), timeout=90)
    try:
        events.initial_metadata()  # sent once the stream is subscribed
        container_id = run(["tail", "/dev/zero"], {"memory_limit_in_bytes": 16 << 20,
                                                   "memory_swap_limit_in_bytes": 16 << 20})
        stopped = next(event for event in events if event.container_id == container_id
                       and event.container_event_type == api_pb2.CONTAINER_STOPPED_EVENT)
    finally:
        events.cancel()
    [status] = [s for s in stopped.containers_statuses if s.id == container_id]
    assert (status.state, status.exit_code, status.reason) == (api_pb2.CONTAINER_EXITED, 137, "OOMKilled")


@pytest.mark.parametrize("handler", HANDLERS)
def test_a_pods_resources_and_overhead_are_in_its_cgroup_before_any_container(daemon, handler) -> None:
    # kubelet gives the sum of its containers' resources, and the pod's overhead on top.
    pod = pod_config()
    pod["linux"]["resources"] = {"cpu_shares": 512, "memory_limit_in_bytes": 64 << 20}
    pod["linux"]["overhead"] = {"cpu_shares": 10, "memory_limit_in_bytes": 16 << 20}
    runtime = daemon.runtime()
    pod_id = runtime.RunPodSandbox(api_pb2.RunPodSandboxRequest(
        config=json_format.ParseDict(pod, api_pb2.PodSandboxConfig()), runtime_handler=handler)).pod_sandbox_id
    try:
        status = runtime.PodSandboxStatus(api_pb2.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=True))
        pause = json.loads(status.info["info"])["pid"]
        assert read(cgroup_file(pause, "memory", "memory.limit_in_bytes")) == str(80 << 20)
        assert read(cgroup_file(pause, "cpu", "cpu.shares")) == "522"
    finally:
        runtime.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=pod_id))
        runtime.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=pod_id))


def test_a_pod_asking_an_oom_score_of_its_own_is_refused_and_nothing_is_left(daemon) -> None:
    pod = pod_config()
    pod["linux"]["resources"] = {"oom_score_adj": 500}
    runtime = daemon.runtime()
    with pytest.raises(grpc.RpcError) as refused:
        runtime.RunPodSandbox(api_pb2.RunPodSandboxRequest(config=json_format.ParseDict(pod, api_pb2.PodSandboxConfig())))
    assert (refused.value.code(), refused.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, (
        "linux.resources.oom_score_adj cannot be applied: an OOM score is a process's: each container's is its own"))
    assert list(runtime.ListPodSandbox(api_pb2.ListPodSandboxRequest()).items) == []
