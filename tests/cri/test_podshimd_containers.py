"""Containers through podshimd as the real crictl drives them (create, start, ps with
filters, inspect, logs, stop with a timeout, rm; create goes over gRPC, a config that names
no image getting the tests' busybox), each checked on what crictl prints and on the
kernel side (which of the pause's namespaces the container's process shares); CRI's proto3 zero
values (no namespace_options: the pod's PID namespace); the CRI semantics a client relies on; and
what podshimd does not do yet answering UNIMPLEMENTED with a sentence; a container without an
image refused."""

from __future__ import annotations

import json
import os
import re
import time

import grpc
import pytest
from google.protobuf import json_format

from shim.cri.api import api_pb2

from support.podtools import container_config, ns_inode, pod_config
from support.proctools import wait_gone

CONTAINER_ID = re.compile(r"^[0-9a-f]{64}$")


@pytest.fixture
def pod(daemon, crictl, tmp_path):
    """A ready pod: its id, and the path of its config (crictl create wants it)."""
    path = tmp_path / "pod.json"
    path.write_text(json.dumps(pod_config()))
    return daemon.crictl(crictl, "runp", str(path)).stdout.strip(), str(path)


def create(daemon, pod, config: dict) -> str:
    """Create a container in ``pod`` (of the tests' busybox when its config names no image)."""
    container_id = daemon.create_container(pod[0], config, pod[1])
    assert CONTAINER_ID.match(container_id), container_id
    return container_id


def inspect(daemon, crictl, container_id: str) -> dict:
    return json.loads(daemon.crictl(crictl, "inspect", container_id).stdout)


def pause_pid(daemon, crictl, pod_id: str) -> int:
    return json.loads(daemon.crictl(crictl, "inspectp", pod_id).stdout)["info"]["pid"]


def table(output: str) -> list[list[str]]:
    return [re.split(r"\s{2,}", line.strip()) for line in output.splitlines()[1:]]


def wait_exited(daemon, crictl, container_id: str) -> dict:
    """The container's status once it exited (it runs a command that ends by itself): its process
    is gone, then the shim's exit event reaches the daemon a moment later."""
    status = daemon.runtime().ContainerStatus(api_pb2.ContainerStatusRequest(container_id=container_id, verbose=True))
    pid = json.loads(status.info["info"])["pid"]
    assert not wait_gone(pid, timeout=30)
    deadline = time.monotonic() + 30
    while (found := inspect(daemon, crictl, container_id))["status"]["state"] == "CONTAINER_RUNNING":
        assert time.monotonic() < deadline, f"container {container_id} still RUNNING 30 s after its process ended"
        time.sleep(0.05)
    return found


# -- create, start, ps, inspect, logs ---------------------------------------------------------------

def test_a_container_runs_in_the_pods_namespaces_and_logs_what_it_prints(daemon, crictl, pod, tmp_path) -> None:
    config = container_config(["/bin/sh", "-c", "echo out; echo err >&2; hostname; exec sleep 60"], pid=1)
    config["labels"] = {"role": "web"}
    container_id = create(daemon, pod, config)
    assert inspect(daemon, crictl, container_id)["status"]["state"] == "CONTAINER_CREATED"
    assert daemon.crictl(crictl, "start", container_id).stdout.strip() == container_id
    found = inspect(daemon, crictl, container_id)
    status, info = found["status"], found["info"]
    assert status["state"] == "CONTAINER_RUNNING" and status["metadata"] == {"name": "c", "attempt": 0}
    assert status["image"]["image"] == daemon.image and status["imageRef"].startswith(daemon.image.rpartition(":")[0] + "@sha256:")
    assert status["labels"] == {"role": "web"} and status["logPath"].endswith("/c_0.log")
    pid, pause = info["pid"], pause_pid(daemon, crictl, pod[0])
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        assert f.read().split(b"\0")[:2] == [b"sleep", b"60"]
    for kind in ("net", "ipc", "uts"):
        assert ns_inode(pid, kind) == ns_inode(pause, kind), kind
    assert ns_inode(pid, "pid") not in (ns_inode(pause, "pid"), ns_inode(os.getpid(), "pid"))  # CONTAINER mode
    rows = table(daemon.crictl(crictl, "ps").stdout)
    assert rows == [[container_id[:13], rows[0][1], rows[0][2], "Running", "c", "0",
                     pod[0][:13], "unknown", "unknown"]]  # no pod name or namespace label
    logs = daemon.crictl(crictl, "logs", container_id)
    assert logs.stdout.splitlines()[0] == "out" and logs.stderr == "err\n"
    with open(pod[1]) as f:
        assert logs.stdout.splitlines()[1] == json.load(f)["hostname"]


def test_a_container_without_namespace_options_shares_the_pods_pid_namespace(daemon, crictl, pod, tmp_path) -> None:
    config = {"metadata": {"name": "plain"}, "command": ["sleep", "60"]}
    container_id = create(daemon, pod, config)
    daemon.crictl(crictl, "start", container_id)
    pid = inspect(daemon, crictl, container_id)["info"]["pid"]
    assert ns_inode(pid, "pid") == ns_inode(pause_pid(daemon, crictl, pod[0]), "pid")
    assert inspect(daemon, crictl, container_id)["info"]["pid_mode"] == "POD"


def test_ps_filters_by_state_pod_id_and_label(daemon, crictl, pod, tmp_path) -> None:
    running = create(daemon, pod, {**container_config(["sleep", "60"], name="run"), "labels": {"tier": "a"}})
    created = create(daemon, pod, {**container_config(["true"], name="new"), "labels": {"tier": "b"}})
    daemon.crictl(crictl, "start", running)

    def ids(*flags: str) -> list[str]:
        return daemon.crictl(crictl, "ps", "-q", *flags).stdout.split()

    assert ids() == [running]  # running ones unless -a
    assert ids("-a") == [created, running]  # newest first
    assert ids("-a", "--state", "created") == [created]
    assert ids("-a", "--label", "tier=b") == [created]
    assert ids("-a", "--pod", pod[0][:12]) == [created, running]
    assert ids("-a", "--id", running[:12]) == [running]
    assert ids("-a", "--pod", "0" * 12) == []


# -- stop, rm --------------------------------------------------------------------------------------

def test_stop_sends_sigterm_and_sigkill_after_the_timeout(daemon, crictl, pod, tmp_path) -> None:
    stubborn = create(daemon, pod, container_config(
        ["/bin/sh", "-c", "trap '' TERM; echo ready; while :; do sleep 1; done"], name="stubborn"))
    # In the pod's PID namespace (catatonit is its PID 1): a PID 1 of its own would ignore SIGTERM.
    polite = create(daemon, pod, container_config(["sleep", "60"], name="polite", pid=0))
    for container_id in (stubborn, polite):
        daemon.crictl(crictl, "start", container_id)
    assert daemon.crictl(crictl, "stop", "--timeout", "1", stubborn, polite).stdout.split() == [stubborn, polite]
    killed, terminated = inspect(daemon, crictl, stubborn)["status"], inspect(daemon, crictl, polite)["status"]
    assert (killed["state"], killed["exitCode"], killed["reason"]) == ("CONTAINER_EXITED", 137, "Error")
    assert (terminated["state"], terminated["exitCode"]) == ("CONTAINER_EXITED", 143)
    daemon.crictl(crictl, "stop", polite)  # stopping an exited container is fine


def test_a_container_that_ends_by_itself_is_exited_with_its_status(daemon, crictl, pod, tmp_path) -> None:
    container_id = create(daemon, pod, container_config(["/bin/sh", "-c", "exit 3"]))
    daemon.crictl(crictl, "start", container_id)
    status = wait_exited(daemon, crictl, container_id)["status"]
    assert (status["state"], status["exitCode"], status["reason"]) == ("CONTAINER_EXITED", 3, "Error")
    assert status["finishedAt"] >= status["startedAt"]


def test_rm_removes_a_running_container_with_force_and_removing_twice_is_fine(daemon, crictl, pod, tmp_path) -> None:
    container_id = create(daemon, pod, container_config(["sleep", "60"]))
    daemon.crictl(crictl, "start", container_id)
    pid = inspect(daemon, crictl, container_id)["info"]["pid"]
    # -f: crictl stops it first (printing its id), then removes it (printing it again).
    assert daemon.crictl(crictl, "rm", "-f", container_id).stdout.split() == [container_id, container_id]
    assert not wait_gone(pid)
    assert daemon.crictl(crictl, "ps", "-qa").stdout == ""
    runtime = daemon.runtime()
    runtime.RemoveContainer(api_pb2.RemoveContainerRequest(container_id=container_id))
    runtime.StopContainer(api_pb2.StopContainerRequest(container_id=container_id))
    with pytest.raises(grpc.RpcError) as gone:
        runtime.ContainerStatus(api_pb2.ContainerStatusRequest(container_id=container_id))
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND


def test_rmp_stops_and_removes_the_pods_containers(daemon, crictl, pod, tmp_path) -> None:
    container_id = create(daemon, pod, container_config(["sleep", "60"]))
    daemon.crictl(crictl, "start", container_id)
    pid = inspect(daemon, crictl, container_id)["info"]["pid"]
    daemon.crictl(crictl, "stopp", pod[0])
    assert not wait_gone(pid)
    assert inspect(daemon, crictl, container_id)["status"]["state"] == "CONTAINER_EXITED"
    daemon.crictl(crictl, "rmp", pod[0])
    assert daemon.crictl(crictl, "ps", "-qa").stdout == ""


# -- what a client gets wrong ----------------------------------------------------------------------

def test_unknown_ids_are_not_found_with_a_sentence(daemon) -> None:
    runtime = daemon.runtime()
    unknown = "e" * 64
    for call, request in ((runtime.StartContainer, api_pb2.StartContainerRequest(container_id=unknown)),
                          (runtime.ContainerStatus, api_pb2.ContainerStatusRequest(container_id=unknown))):
        with pytest.raises(grpc.RpcError) as failed:
            call(request)
        assert failed.value.code() == grpc.StatusCode.NOT_FOUND
        assert failed.value.details() == f"no container has an id starting with {unknown!r}"


def test_stop_and_remove_of_an_unknown_container_succeed(daemon) -> None:
    # CRI: StopContainer and RemoveContainer "must not return an error if not found", as containerd answers.
    runtime = daemon.runtime()
    unknown = "e" * 64
    runtime.StopContainer(api_pb2.StopContainerRequest(container_id=unknown, timeout=1))
    runtime.RemoveContainer(api_pb2.RemoveContainerRequest(container_id=unknown))
    assert list(runtime.ListContainers(api_pb2.ListContainersRequest()).containers) == []


def test_bad_container_requests_get_a_status_with_a_sentence(daemon, crictl, pod, tmp_path) -> None:
    runtime = daemon.runtime()

    def create_request(pod_id: str, config: dict | None) -> api_pb2.CreateContainerRequest:
        request = api_pb2.CreateContainerRequest(pod_sandbox_id=pod_id)
        if config is not None:
            json_format.ParseDict(config, request.config)
        return request

    cases = [
        (create_request(pod[0], None), grpc.StatusCode.INVALID_ARGUMENT, "config is required"),
        (create_request(pod[0], {"metadata": {"name": "x"}, "command": ["true"]}), grpc.StatusCode.INVALID_ARGUMENT,
         "config.image.image is empty: a container needs an image, which is its root filesystem (podshimd runs "
         "no container without one)"),
        (create_request(pod[0], {**container_config(["true"]), "image": {"image": "busybox"}}),
         grpc.StatusCode.NOT_FOUND, "image 'busybox' not found: pull it first"),
        (create_request(pod[0], {**container_config(["true"]), "image": {"image": daemon.image}, "linux": {"security_context": {
            "namespace_options": {"pid": 7}}}}), grpc.StatusCode.INVALID_ARGUMENT,
         "linux.security_context.namespace_options.pid is 7; allowed: POD (0), CONTAINER (1), NODE (2), TARGET (3)"),
        (create_request("d" * 64, {**container_config(["true"]), "image": {"image": daemon.image}}), grpc.StatusCode.NOT_FOUND,
         f"no pod sandbox has an id starting with {'d' * 64!r}"),
    ]
    for request, code, details in cases:
        with pytest.raises(grpc.RpcError) as failed:
            runtime.CreateContainer(request)
        assert (failed.value.code(), failed.value.details()) == (code, details)
    container_id = create(daemon, pod, container_config(["sleep", "60"]))
    with pytest.raises(grpc.RpcError) as twice:
        runtime.CreateContainer(create_request(pod[0], {**container_config(["sleep", "60"]), "image": {"image": daemon.image}}))
    assert twice.value.code() == grpc.StatusCode.ALREADY_EXISTS
    daemon.crictl(crictl, "start", container_id)
    again = daemon.crictl(crictl, "start", container_id, check=False)
    assert again.returncode != 0 and "code = FailedPrecondition desc = container " in again.stderr
    daemon.crictl(crictl, "stopp", pod[0])
    with pytest.raises(grpc.RpcError) as notready:
        create(daemon, pod, container_config(["sleep", "60"], name="late"))
    assert (notready.value.code(), notready.value.details()) == (
        grpc.StatusCode.FAILED_PRECONDITION, f"pod {pod[0]} is not ready (SANDBOX_NOTREADY)")
    assert daemon.crictl(crictl, "ps", "-qa").stdout.split() == [container_id]


