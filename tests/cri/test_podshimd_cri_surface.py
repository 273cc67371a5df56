"""podshimd's CRI surface as Kubernetes 1.37 speaks it (k8s.io/cri-api at the pin): every method
of RuntimeService and ImageService is served or answers UNIMPLEMENTED with a sentence of its own;
RuntimeConfig and Status say what podshim really has (crictl runtime-config, crictl info); the
Stream* RPCs answer what their List counterparts answer, in chunks."""

from __future__ import annotations

import json
import os
import socket

import grpc
import pytest
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message

from shim.cri.api import api_pb2, api_pb2_grpc
from shim.cri.resources import pod_resources
from shim.grpcwire.aio import Server
from shim.rpc.status import InvalidArgument

from client.podshimd import checkpoints, chunks, server
from client.podshimd.handlers import Handlers

from support.podtools import cgroup_file, container_config, pod_config

#: Bound on one call of these tests.
CALL_TIMEOUT = 20
#: The methods podshimd does not serve, each answered UNIMPLEMENTED with its reason (docs/cri.md).
NOT_SERVED = {"CheckpointContainer", "CheckpointPod", "RestorePod"}
#: The runtime handlers podshimd offers by default.
HANDLERS = ("native", "runc", "crun")


def call(daemon, service: str, method: MethodDescriptor, request: Message) -> tuple[grpc.StatusCode, str]:
    """Call ``method`` of ``service`` with ``request`` over the daemon's channel, by its descriptor
    (no generated stub): (its status code, its details); a stream is read to its end."""
    path = f"/{service}/{method.name}"
    response = api_pb2.__dict__[method.output_type.name].FromString
    channel = daemon._channel()
    try:
        if method.server_streaming:
            for _ in channel.unary_stream(path, request_serializer=lambda m: m.SerializeToString(),
                                              response_deserializer=response)(request, timeout=3):
                pass
        else:
            channel.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                                response_deserializer=response)(request, timeout=CALL_TIMEOUT)
    except grpc.RpcError as exc:
        return exc.code(), exc.details()
    return grpc.StatusCode.OK, ""


def test_every_method_of_the_pinned_cri_is_served_or_unimplemented_with_a_sentence(daemon) -> None:
    unimplemented = {}
    for service in api_pb2.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            request = api_pb2.__dict__[method.input_type.name]()
            code, details = call(daemon, service.full_name, method, request)
            if code == grpc.StatusCode.UNIMPLEMENTED:
                unimplemented[method.name] = details
    assert set(unimplemented) == NOT_SERVED
    for name, details in unimplemented.items():
        assert details.startswith(f"{name} is not supported: ") and len(details) > len(name) + 30


def test_checkpoints_are_refused_saying_why(daemon) -> None:
    with pytest.raises(grpc.RpcError) as failed:
        daemon.runtime().CheckpointPod(api_pb2.CheckpointPodRequest(pod_sandbox_id="x", output_path="/tmp/x.tar"))
    assert failed.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert failed.value.details() == ("CheckpointPod is not supported: podshim cannot checkpoint or restore "
                                      f"processes ({checkpoints.criu_state()})")


@pytest.mark.parametrize("script, said", [
    # Debian 12's criu 3.17.1 on Linux 6.13 and later (it does not know the [vvar_vclock] mapping).
    ("echo 'Error (criu/vdso.c:381): vdso: Unexpected rt vDSO area bounds' >&2\necho 'Error (criu/crtools.c:260): "
     "Could not initialize kernel features detection.' >&2\nexit 1",
     f"check fails on Linux {os.uname().release}: Error (criu/vdso.c:381): vdso: Unexpected rt vDSO area bounds"),
    ("exit 0", "check passes, but podshim has no checkpoint code"),
])
def test_the_reason_is_what_criu_check_finds(tmp_path, script, said) -> None:
    criu = tmp_path / "criu"
    criu.write_text(f"#!/bin/sh\n[ \"$1\" = check ] || exit 2\n{script}\n")
    criu.chmod(0o755)
    assert checkpoints.criu_state(str(criu)) == f"{criu} {said}"


def test_the_reason_says_when_criu_is_not_installed(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(checkpoints, "DEFAULT_PATH", str(tmp_path))
    assert checkpoints.criu_state() == "criu is not installed"


# -- RuntimeConfig and Status ----------------------------------------------------------------------

def test_runtime_config_answers_the_cgroup_driver_in_force(daemon, crictl) -> None:
    answer = daemon.runtime().RuntimeConfig(api_pb2.RuntimeConfigRequest(), timeout=CALL_TIMEOUT)
    assert answer.linux.cgroup_driver == api_pb2.CgroupDriver.CGROUPFS
    assert daemon.crictl(crictl, "runtime-config").stdout.split() == ["cgroup", "driver:", "CGROUPFS"]


def test_status_lists_each_runtime_handler_and_the_default_with_no_feature_podshim_lacks(daemon, crictl) -> None:
    status = daemon.runtime().Status(api_pb2.StatusRequest(), timeout=CALL_TIMEOUT)
    assert [h.name for h in status.runtime_handlers] == ["", "native", "runc", "crun"]
    for handler in status.runtime_handlers:
        assert handler.HasField("features")
        assert handler.features.recursive_read_only_mounts
        assert handler.features.user_namespaces
    assert status.HasField("features")
    assert status.features.supplemental_groups_policy
    assert not status.features.user_namespaces_host_network and not status.features.mount_options
    info = json.loads(daemon.crictl(crictl, "info").stdout)
    assert [h.get("name", "") for h in info["runtimeHandlers"]] == ["", "native", "runc", "crun"]
    assert info["config"]["cgroup_driver"] == "cgroupfs"


# -- UpdatePodSandboxResources ----------------------------------------------------------------------

MiB = 1 << 20


def read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


@pytest.fixture
def pod(request, daemon, crictl, tmp_path):
    """A ready pod with a running container: (pod id, the pause's pid, the container's pid). Its
    runtime handler is the test's ``pod`` parameter, if it has one (the default handler else)."""
    path = tmp_path / "pod.json"
    path.write_text(json.dumps(pod_config()))
    pod_id = daemon.crictl(crictl, "runp", "--runtime", getattr(request, "param", ""), str(path)).stdout.strip()
    container_id = daemon.create_container(pod_id, container_config(["sleep", "60"]), str(path))
    daemon.crictl(crictl, "start", container_id)
    pause = json.loads(daemon.crictl(crictl, "inspectp", pod_id).stdout)["info"]["pid"]
    pid = json.loads(daemon.crictl(crictl, "inspect", container_id).stdout)["info"]["pid"]
    return pod_id, pause, pid


def update_pod(daemon, pod_id: str, overhead: dict | None = None, **resources) -> None:
    request = api_pb2.UpdatePodSandboxResourcesRequest(pod_sandbox_id=pod_id,
                                                        resources=api_pb2.LinuxContainerResources(**resources))
    if overhead is not None:
        request.overhead.CopyFrom(api_pb2.LinuxContainerResources(**overhead))
    daemon.runtime().UpdatePodSandboxResources(request, timeout=CALL_TIMEOUT)


@pytest.mark.parametrize("pod", HANDLERS, indirect=True)
def test_pod_resources_and_overhead_are_written_to_the_pods_cgroup(daemon, pod) -> None:
    pod_id, pause, pid = pod
    container_memory = read(cgroup_file(pid, "memory", "memory.limit_in_bytes"))
    update_pod(daemon, pod_id, overhead={"cpu_period": 100000, "cpu_quota": 10000, "cpu_shares": 100,
                                         "memory_limit_in_bytes": 64 * MiB},
               cpu_period=100000, cpu_quota=50000, cpu_shares=512, memory_limit_in_bytes=256 * MiB)
    assert read(cgroup_file(pause, "cpu", "cpu.cfs_quota_us")) == "60000"
    assert read(cgroup_file(pause, "cpu", "cpu.cfs_period_us")) == "100000"
    assert read(cgroup_file(pause, "cpu", "cpu.shares")) == "612"
    assert read(cgroup_file(pause, "memory", "memory.limit_in_bytes")) == str(320 * MiB)
    # The container's cgroup is below the pod's, and keeps its own limits.
    assert os.path.dirname(cgroup_file(pid, "memory", "")).startswith(os.path.dirname(cgroup_file(pause, "memory", "")))
    assert read(cgroup_file(pid, "memory", "memory.limit_in_bytes")) == container_memory
    update_pod(daemon, pod_id, memory_limit_in_bytes=128 * MiB)  # an overhead is not kept: this is the limit
    assert read(cgroup_file(pause, "memory", "memory.limit_in_bytes")) == str(128 * MiB)
    assert read(cgroup_file(pause, "cpu", "cpu.shares")) == "612"  # unset: left as it is


@pytest.mark.parametrize("overhead,resources,message", [
    ({"cpuset_cpus": "0"}, {}, "overhead.cpuset_cpus cannot be applied: an overhead adds quantities"),
    ({}, {"oom_score_adj": 100}, "resources.oom_score_adj cannot be applied to a pod"),
    ({"cpu_period": 50000, "cpu_quota": 1000}, {"cpu_period": 100000, "cpu_quota": 5000},
     "overhead.cpu_period 50000 differs from resources.cpu_period 100000"),
    ({}, {"memory_limit_in_bytes": 64 * MiB, "cpu_shares": 1}, "resources.cpu_shares 1 is out of range"),
])
def test_what_cannot_be_applied_to_a_pod_is_refused_and_nothing_changes(daemon, pod, overhead, resources, message) -> None:
    pod_id, pause, _ = pod
    before = {name: read(cgroup_file(pause, controller, name)) for controller, name in
              (("memory", "memory.limit_in_bytes"), ("cpu", "cpu.shares"), ("cpu", "cpu.cfs_quota_us"))}
    with pytest.raises(grpc.RpcError) as failed:
        update_pod(daemon, pod_id, overhead=overhead, **resources)
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in failed.value.details()
    assert {name: read(cgroup_file(pause, controller, name)) for controller, name in
            (("memory", "memory.limit_in_bytes"), ("cpu", "cpu.shares"), ("cpu", "cpu.cfs_quota_us"))} == before


def test_updating_an_unknown_or_stopped_pod_says_so(daemon, crictl, pod) -> None:
    with pytest.raises(grpc.RpcError) as failed:
        update_pod(daemon, "f" * 64, cpu_shares=512)
    assert failed.value.code() == grpc.StatusCode.NOT_FOUND
    daemon.crictl(crictl, "stopp", pod[0])
    with pytest.raises(grpc.RpcError) as failed:
        update_pod(daemon, pod[0], cpu_shares=512)
    assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "is not ready" in failed.value.details()


def test_an_overhead_adds_only_to_what_the_pod_limits() -> None:
    assert pod_resources({"memory_limit_in_bytes": "100", "cpu_shares": "10", "hugepage_limits": [
        {"page_size": "2MB", "limit": "4"}]}, {"cpu_shares": "502", "hugepage_limits": [
            {"page_size": "2MB", "limit": "8"}]}) == {"cpu_shares": 512, "hugepage_limits": {"2MB": 12}}
    assert pod_resources(None, None) == {}
    with pytest.raises(InvalidArgument, match="overhead.unified cannot be applied"):
        pod_resources({"unified": {"memory.high": "1"}}, {})


# -- ContainerStatus and Container ------------------------------------------------------------------

def test_a_container_names_its_image_by_the_id_pullimage_answered_and_its_stop_signal(daemon, pod) -> None:
    runtime = daemon.runtime()
    [listed] = runtime.ListContainers(api_pb2.ListContainersRequest(), timeout=CALL_TIMEOUT).containers
    status = runtime.ContainerStatus(api_pb2.ContainerStatusRequest(container_id=listed.id),
                                     timeout=CALL_TIMEOUT).status
    pulled = daemon.images().PullImage(api_pb2.PullImageRequest(image=status.image), timeout=CALL_TIMEOUT).image_ref
    assert listed.image_id == status.image_id == pulled != ""
    assert status.stop_signal == api_pb2.Signal.SIGNAL_SIGTERM


def test_images_are_the_same_for_every_runtime_handler_and_an_unknown_one_is_refused(daemon, pod) -> None:
    images = daemon.images()
    [listed] = daemon.runtime().ListContainers(api_pb2.ListContainersRequest(), timeout=CALL_TIMEOUT).containers
    name = listed.image.image
    for handler in ("", "native", "runc", "crun"):
        spec = api_pb2.ImageSpec(image=name, runtime_handler=handler)
        assert images.ImageStatus(api_pb2.ImageStatusRequest(image=spec), timeout=CALL_TIMEOUT).image.id == \
            listed.image_id
    unknown = api_pb2.ImageSpec(image=name, runtime_handler="kata")
    for call in (lambda: images.PullImage(api_pb2.PullImageRequest(image=unknown), timeout=CALL_TIMEOUT),
                 lambda: images.ImageStatus(api_pb2.ImageStatusRequest(image=unknown), timeout=CALL_TIMEOUT),
                 lambda: images.RemoveImage(api_pb2.RemoveImageRequest(image=unknown), timeout=CALL_TIMEOUT),
                 lambda: images.ListImages(api_pb2.ListImagesRequest(filter=api_pb2.ImageFilter(image=unknown)),
                                           timeout=CALL_TIMEOUT)):
        with pytest.raises(grpc.RpcError) as failed:
            call()
        assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "runtime_handler 'kata' is not a runtime handler of this node (runtime_handlers: native, runc, crun)" \
            in failed.value.details()


# -- stats: pressure and swap ----------------------------------------------------------------------

def v2_pressure(pid: int, name: str) -> dict[str, int]:
    """The ``total`` of each line of process ``pid``'s cgroup v2 pressure file ``name``, in ns."""
    with open(f"/proc/{pid}/cgroup") as f:
        path = next(line.split(":", 2)[2].strip() for line in f if line.startswith("0::"))
    with open(os.path.join("/sys/fs/cgroup/unified", path.lstrip("/"), name)) as f:
        return {line.split()[0]: int(line.split()[-1].removeprefix("total=")) * 1000 for line in f}


@pytest.mark.parametrize("pod", HANDLERS, indirect=True)
def test_stats_carry_the_cgroups_pressure_and_swap(daemon, crictl, pod) -> None:
    pod_id, pause, pid = pod
    container_id = daemon.runtime().ListContainers(api_pb2.ListContainersRequest(), timeout=CALL_TIMEOUT).containers[0].id
    stats = daemon.runtime().ContainerStats(api_pb2.ContainerStatsRequest(container_id=container_id),
                                            timeout=CALL_TIMEOUT).stats
    for usage, name in ((stats.cpu, "cpu.pressure"), (stats.memory, "memory.pressure"), (stats.io, "io.pressure")):
        after = v2_pressure(pid, name)
        assert usage.timestamp > 0 and usage.HasField("psi") and usage.psi.HasField("Some"), name
        assert usage.psi.Some.Total <= after["some"] and usage.psi.Full.Total <= after["full"]
    assert stats.HasField("swap") and stats.swap.swap_usage_bytes.value >= 0
    pod_stats = daemon.runtime().PodSandboxStats(api_pb2.PodSandboxStatsRequest(pod_sandbox_id=pod_id),
                                                 timeout=CALL_TIMEOUT).stats.linux
    assert pod_stats.io.psi.Some.Total <= v2_pressure(pause, "io.pressure")["some"]
    assert pod_stats.cpu.HasField("psi") and pod_stats.memory.HasField("psi")
    shown = json.loads(daemon.crictl(crictl, "stats", "-o", "json", container_id).stdout)["stats"][0]
    assert "psi" in shown["cpu"] and "psi" in shown["memory"] and "swap" in shown


# -- Stream* ---------------------------------------------------------------------------------------

def streamed(responses, field: str) -> list:
    """The items of every message of a stream, in order; each message holds at least one."""
    items = []
    for response in responses:
        chunk = list(getattr(response, field))
        assert chunk, "a message of a Stream* RPC holds at least one item"
        items += chunk
    return items


@pytest.fixture
def pods(daemon, crictl, tmp_path):
    """Three ready pods (labels app=a, a, b), each with a running container; their ids."""
    ids = []
    for i, app in enumerate("aab"):
        path = tmp_path / f"pod{i}.json"
        config = pod_config(name=f"p{i}")
        config["labels"] = {"app": app}
        path.write_text(json.dumps(config))
        pod_id = daemon.crictl(crictl, "runp", str(path)).stdout.strip()
        container = container_config(["sleep", "60"], name="c")
        container["labels"] = {"app": app}
        daemon.crictl(crictl, "start", daemon.create_container(pod_id, container, str(path)))
        ids.append(pod_id)
    return ids


def test_streams_answer_what_the_lists_answer_with_the_same_filters(daemon, pods) -> None:
    runtime = daemon.runtime()
    selectors = [{}, {"app": "a"}, {"app": "b"}, {"app": "none"}]
    for labels in selectors:
        listed = runtime.ListPodSandbox(api_pb2.ListPodSandboxRequest(filter=api_pb2.PodSandboxFilter(
            label_selector=labels)), timeout=CALL_TIMEOUT).items
        assert streamed(runtime.StreamPodSandboxes(api_pb2.StreamPodSandboxesRequest(filter=api_pb2.PodSandboxFilter(
            label_selector=labels)), timeout=CALL_TIMEOUT), "pod_sandboxes") == list(listed)
        listed = runtime.ListContainers(api_pb2.ListContainersRequest(filter=api_pb2.ContainerFilter(
            label_selector=labels)), timeout=CALL_TIMEOUT).containers
        assert streamed(runtime.StreamContainers(api_pb2.StreamContainersRequest(filter=api_pb2.ContainerFilter(
            label_selector=labels)), timeout=CALL_TIMEOUT), "containers") == list(listed)
    assert len(streamed(runtime.StreamPodSandboxes(api_pb2.StreamPodSandboxesRequest(filter=api_pb2.PodSandboxFilter(
        id=pods[1][:12])), timeout=CALL_TIMEOUT), "pod_sandboxes")) == 1
    # Stats carry figures of the moment: the same items (by id), not the same values.
    listed = runtime.ListContainerStats(api_pb2.ListContainerStatsRequest(filter=api_pb2.ContainerStatsFilter(
        pod_sandbox_id=pods[2])), timeout=CALL_TIMEOUT).stats
    stream = streamed(runtime.StreamContainerStats(api_pb2.StreamContainerStatsRequest(
        filter=api_pb2.ContainerStatsFilter(pod_sandbox_id=pods[2])), timeout=CALL_TIMEOUT), "container_stats")
    assert [s.attributes for s in stream] == [s.attributes for s in listed] and len(stream) == 1
    assert stream[0].cpu.usage_core_nano_seconds.value > 0
    listed = runtime.ListPodSandboxStats(api_pb2.ListPodSandboxStatsRequest(filter=api_pb2.PodSandboxStatsFilter(
        label_selector={"app": "a"})), timeout=CALL_TIMEOUT).stats
    stream = streamed(runtime.StreamPodSandboxStats(api_pb2.StreamPodSandboxStatsRequest(
        filter=api_pb2.PodSandboxStatsFilter(label_selector={"app": "a"})), timeout=CALL_TIMEOUT), "pod_sandbox_stats")
    assert sorted(s.attributes.id for s in stream) == sorted(s.attributes.id for s in listed) == sorted(pods[:2])
    images = daemon.images()
    assert streamed(images.StreamImages(api_pb2.StreamImagesRequest(), timeout=CALL_TIMEOUT), "images") == \
        list(images.ListImages(api_pb2.ListImagesRequest(), timeout=CALL_TIMEOUT).images)


def test_a_listing_larger_than_a_chunk_is_streamed_in_several_each_item_once(daemon, crictl, tmp_path) -> None:
    # Five pods and five containers of ~250 KiB of annotations each (a pod's most is 256 KiB):
    # more than a chunk's 1 MiB, so at least two messages of each.
    for i in range(5):
        config = pod_config(name=f"big{i}")
        config["annotations"] = {"big": f"{i}" * (250 << 10)}
        path = tmp_path / f"big{i}.json"
        path.write_text(json.dumps(config))
        pod_id = daemon.crictl(crictl, "runp", str(path)).stdout.strip()
        container = container_config(["sleep", "60"])
        container["annotations"] = {"big": f"{i}" * (250 << 10)}
        daemon.create_container(pod_id, container, str(path))
    runtime = daemon.runtime()
    for stream, field, listed in (
            (runtime.StreamPodSandboxes(api_pb2.StreamPodSandboxesRequest(), timeout=CALL_TIMEOUT), "pod_sandboxes",
             runtime.ListPodSandbox(api_pb2.ListPodSandboxRequest(), timeout=CALL_TIMEOUT).items),
            (runtime.StreamContainers(api_pb2.StreamContainersRequest(), timeout=CALL_TIMEOUT), "containers",
             runtime.ListContainers(api_pb2.ListContainersRequest(), timeout=CALL_TIMEOUT).containers)):
        messages = list(stream)
        assert len(messages) >= 2 and all(m.ByteSize() <= chunks.CHUNK_BYTES for m in messages)
        assert streamed(messages, field) == list(listed) and len(listed) == 5


def test_a_stream_with_nothing_to_answer_ends_without_a_message(daemon) -> None:
    runtime = daemon.runtime()
    assert list(runtime.StreamPodSandboxes(api_pb2.StreamPodSandboxesRequest(filter=api_pb2.PodSandboxFilter(
        id="nothing")), timeout=CALL_TIMEOUT)) == []
    assert list(runtime.StreamPodSandboxMetrics(api_pb2.StreamPodSandboxMetricsRequest(), timeout=CALL_TIMEOUT)) == []


def test_crictl_checkpoint_says_podshim_cannot(daemon, crictl, pod, tmp_path) -> None:
    container_id = daemon.runtime().ListContainers(api_pb2.ListContainersRequest(),
                                                   timeout=CALL_TIMEOUT).containers[0].id
    failed = daemon.crictl(crictl, "checkpoint", "--export", str(tmp_path / "c.tar"), container_id, check=False)
    assert failed.returncode != 0 and "code = Unimplemented desc = CheckpointContainer is not supported: podshim " \
        f"cannot checkpoint or restore processes ({checkpoints.criu_state()})" in failed.stderr
    assert not (tmp_path / "c.tar").exists()


# -- chunks ----------------------------------------------------------------------------------------

def test_chunks_hold_each_item_once_in_order_within_the_byte_limit() -> None:
    items = [api_pb2.PodSandbox(id=f"{i:064x}", annotations={"a": "x" * (i * 37 % 900)}) for i in range(3000)]
    limit = 64 << 10
    found = list(chunks.chunks(items, limit))
    assert [item for chunk in found for item in chunk] == items
    assert len(found) > 1 and all(found)
    for chunk in found:
        encoded = api_pb2.StreamPodSandboxesResponse(pod_sandboxes=chunk).ByteSize()
        assert encoded == sum(chunks.encoded_size(item) for item in chunk) <= limit


def test_an_item_larger_than_the_limit_goes_alone() -> None:
    big, small = api_pb2.Image(id="x" * 5000), api_pb2.Image(id="y")
    assert list(chunks.chunks([small, big, small], 1000)) == [[small], [big], [small]]
    assert list(chunks.chunks([], 1000)) == []


def test_the_default_chunk_stays_well_under_grpcs_default_4_mib_message() -> None:
    assert chunks.CHUNK_BYTES * 4 <= 4 << 20


# -- composition -----------------------------------------------------------------------------------

async def test_a_method_no_group_serves_answers_unimplemented_with_a_sentence_unary_or_streaming(tmp_path) -> None:
    # What a newer proto's methods get until a group serves them (no group here: every method).
    bare = server.compose("RuntimeService", ())
    grpc_server = Server(server.methods(bare()))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(f"{tmp_path}/s.sock")
    listener.listen()
    endpoint = f"unix://{tmp_path}/s.sock"
    await grpc_server.start(listener)
    try:
        async with grpc.aio.insecure_channel(endpoint) as channel:
            runtime = api_pb2_grpc.RuntimeServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await runtime.Version(api_pb2.VersionRequest(), timeout=CALL_TIMEOUT)
            assert (failed.value.code(), failed.value.details()) == (
                grpc.StatusCode.UNIMPLEMENTED, "podshimd does not implement runtime.v1.RuntimeService.Version yet")
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                async for _ in runtime.StreamPodSandboxes(api_pb2.StreamPodSandboxesRequest(), timeout=CALL_TIMEOUT):
                    pass
            assert (failed.value.code(), failed.value.details()) == (
                grpc.StatusCode.UNIMPLEMENTED,
                "podshimd does not implement runtime.v1.RuntimeService.StreamPodSandboxes yet")
    finally:
        await grpc_server.stop(0)


def test_two_handler_groups_may_not_share_a_name_not_even_a_helpers() -> None:
    class First(Handlers):
        def _list(self) -> str:
            return "first"

    class Second(Handlers):
        def _list(self) -> str:
            return "second"

    with pytest.raises(TypeError, match="_list is defined by both .*First and .*Second"):
        server.compose("RuntimeService", (First, Second))
