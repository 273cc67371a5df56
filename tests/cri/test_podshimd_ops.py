"""podshimd's operational RPCs as the real crictl (and, where crictl has no verb, a gRPC
client) sees them: ExecSync, container and pod stats, UpdateContainerResources, ReopenContainerLog,
GetContainerEvents, UpdateRuntimeConfig, ImageFsInfo; the Prometheus endpoint scraped over
loopback; log lines that name their pod and container. Each is checked on what crictl prints and
on the kernel side (the cgroup files, the processes left)."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time

import grpc
import pytest

from shim.cri.api import api_pb2

from client.podshimd.images import IMAGE_STORE_DIR, usage

from support.critools import HOST_PYTHON_MOUNTS, REPO, running_podshimd, scrape_metrics
from support.podtools import cgroup_file, container_config, ns_inode, pod_config
from support.proctools import fifo_writer, wait_gone

#: The daemon's metrics endpoint, on an ephemeral loopback port.
METRICS_CONFIG = 'metrics_address = "127.0.0.1:0"\n'
#: Bound on a gRPC call in these tests (events wait for the container that exits on its own).
CALL_TIMEOUT = 60
#: What the allocating container touches.
ALLOCATED = 64 << 20


@pytest.fixture(scope="module")
def module_daemon(test_images):
    """One podshimd for the module, with its metrics endpoint on (the critools ``daemon`` fixture
    uses this one and removes every pod after each test)."""
    directory = tempfile.mkdtemp(prefix="psd-")
    try:
        with running_podshimd(directory, config=METRICS_CONFIG, image=test_images.busybox) as d:
            yield d
    finally:
        shutil.rmtree(directory)


@pytest.fixture
def pod(daemon, crictl, tmp_path):
    """A ready pod: its id and the path of its config."""
    path = tmp_path / "pod.json"
    path.write_text(json.dumps(pod_config()))
    return daemon.crictl(crictl, "runp", str(path)).stdout.strip(), str(path)


def run(daemon, crictl, pod, command: list[str], name: str = "c", **fields) -> str:
    """Create and start a container running ``command`` in ``pod`` (with more of its config's
    ``fields``); its id."""
    container_id = daemon.create_container(pod[0], {**container_config(command, name=name), **fields}, pod[1])
    daemon.crictl(crictl, "start", container_id)
    return container_id


def info(daemon, crictl, container_id: str) -> dict:
    return json.loads(daemon.crictl(crictl, "inspect", container_id).stdout)["info"]


def read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def allocating(daemon, crictl, pod, tmp_path) -> str:
    """Start a container that touches ALLOCATED bytes and keeps them; return its id once it has
    (it says so on a FIFO)."""
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # open before the writer: it never blocks on us
    try:
        script = (f"b = bytearray({ALLOCATED}); b[::4096] = b'x' * len(b[::4096]); "
                  f"open({str(fifo)!r}, 'w').write('ready'); import time; time.sleep(600)")
        container_id = run(daemon, crictl, pod, ["python3", "-c", script], name="alloc",
                           mounts=[*HOST_PYTHON_MOUNTS, {"container_path": str(tmp_path), "host_path": str(tmp_path)}])
        readable, _, _ = select.select([reader], [], [], CALL_TIMEOUT)
        assert readable and os.read(reader, 16) == b"ready", "the container did not say it allocated"
    finally:
        os.close(reader)
    return container_id


# -- ExecSync ----------------------------------------------------------------------------------------

def test_exec_sync_returns_stdout_stderr_and_the_exit_code(daemon, crictl, pod, tmp_path) -> None:
    container_id = run(daemon, crictl, pod, ["sleep", "600"])
    reply = daemon.runtime().ExecSync(api_pb2.ExecSyncRequest(
        container_id=container_id, cmd=["sh", "-c", "echo out; echo err >&2; exit 3"]), timeout=CALL_TIMEOUT)
    assert (reply.stdout, reply.stderr, reply.exit_code) == (b"out\n", b"err\n", 3)


def test_crictl_exec_s_prints_both_streams_and_a_non_zero_exit_as_crictl_does(daemon, crictl, pod, tmp_path) -> None:
    container_id = run(daemon, crictl, pod, ["sleep", "600"])
    ok = daemon.crictl(crictl, "exec", "-s", container_id, "sh", "-c", "echo out; echo err >&2")
    assert ok.stdout == "out\n\nerr\n\n"  # crictl prints each stream with Println
    failed = daemon.crictl(crictl, "exec", "-s", container_id, "sh", "-c", "echo out; echo err >&2; exit 3",
                           check=False)
    # crictl turns a non-zero exit into an error of its own (exit status 1) that quotes stderr.
    assert failed.returncode == 1
    assert "command 'sh -c echo out; echo err >&2; exit 3' exited with 3: err" in failed.stderr


def test_exec_sync_runs_in_the_containers_namespaces_and_cgroup(daemon, crictl, pod, tmp_path) -> None:
    container_id = run(daemon, crictl, pod, ["sleep", "600"])
    pid = info(daemon, crictl, container_id)["pid"]
    reply = daemon.runtime().ExecSync(api_pb2.ExecSyncRequest(
        container_id=container_id, cmd=["sh", "-c", "readlink /proc/self/ns/pid; readlink /proc/self/ns/net; "
                                                    "cat /proc/self/cgroup"]), timeout=CALL_TIMEOUT)
    lines = reply.stdout.decode().splitlines()
    assert lines[0] == f"pid:[{ns_inode(pid, 'pid')}]" and lines[1] == f"net:[{ns_inode(pid, 'net')}]"
    with open(f"/proc/{pid}/cgroup") as f:
        assert sorted(lines[2:]) == sorted(f.read().splitlines())


def test_exec_sync_timeout_kills_the_command_and_leaves_no_process(daemon, crictl, pod, tmp_path) -> None:
    container_id = run(daemon, crictl, pod, ["sleep", "600"], name="t")
    pid = info(daemon, crictl, container_id)["pid"]
    procs = cgroup_file(pid, "pids", "cgroup.procs")
    timed_out = daemon.crictl(crictl, "exec", "-s", "--timeout", "1", container_id, "sh", "-c",
                              "sleep 300 & sleep 300 & wait", check=False)
    assert timed_out.returncode == 1
    # kubelet's client turns DEADLINE_EXCEEDED into its timeout error, which crictl prints with %q.
    assert 'command timed out: \\"sh -c sleep 300 & sleep 300 & wait\\" timed out after 1s' in timed_out.stderr
    # Killed, they leave the container's cgroup (their zombies, if any, wait for its PID 1).
    left = {int(p) for p in read(procs).split()} - {pid}
    assert not wait_gone(*left), f"processes left by the exec: {left}"
    assert read(procs).split() == [str(pid)]


def test_exec_sync_in_a_container_that_is_not_running_is_failed_precondition(daemon, crictl, pod, tmp_path) -> None:
    container_id = daemon.create_container(pod[0], container_config(["sleep", "600"]), pod[1])
    with pytest.raises(grpc.RpcError) as caught:
        daemon.runtime().ExecSync(api_pb2.ExecSyncRequest(container_id=container_id, cmd=["true"]),
                                  timeout=CALL_TIMEOUT)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.details() == f"container {container_id} is not running (it is CONTAINER_CREATED)"


def test_exec_sync_of_a_program_that_does_not_exist_says_so(daemon, crictl, pod, tmp_path) -> None:
    container_id = run(daemon, crictl, pod, ["sleep", "600"])
    with pytest.raises(grpc.RpcError) as caught:
        daemon.runtime().ExecSync(api_pb2.ExecSyncRequest(container_id=container_id, cmd=["/no/such"]),
                                  timeout=CALL_TIMEOUT)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "exec /no/such: No such file or directory" in caught.value.details()


# -- stats ---------------------------------------------------------------------------------------------

def human_bytes(text: str) -> float:
    """crictl's units.HumanSize back to bytes (decimal units)."""
    found = re.fullmatch(r"([\d.]+)([kMGT]?B)", text)
    assert found, f"{text!r} is not a size crictl prints"
    number, unit = found.groups()
    return float(number) * {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}[unit]


def table(output: str) -> list[list[str]]:
    return [re.split(r"\s{2,}", line.strip()) for line in output.splitlines()[1:] if line.strip()]


def test_crictl_stats_shows_the_memory_a_container_allocated(daemon, crictl, pod, tmp_path) -> None:
    container_id = allocating(daemon, crictl, pod, tmp_path)
    rows = table(daemon.crictl(crictl, "stats", "-s", "1").stdout)
    assert [row[0] for row in rows] == [container_id[:13]]
    _, name, cpu, memory, disk, inodes, _swap = rows[0]
    assert name == "alloc" and float(cpu) >= 0 and human_bytes(memory) >= ALLOCATED and (disk, inodes) == ("0B", "0")
    stats = json.loads(daemon.crictl(crictl, "stats", "-o", "json", container_id).stdout)["stats"][0]
    pid = info(daemon, crictl, container_id)["pid"]
    assert stats["attributes"]["id"] == container_id
    assert int(stats["memory"]["workingSetBytes"]["value"]) >= ALLOCATED
    assert int(stats["memory"]["usageBytes"]["value"]) >= int(stats["memory"]["workingSetBytes"]["value"])
    # usage_in_bytes of the container's cgroup read now: at least what crictl saw a moment ago.
    assert int(read(cgroup_file(pid, "memory", "memory.usage_in_bytes"))) >= ALLOCATED
    assert int(stats["cpu"]["usageCoreNanoSeconds"]["value"]) > 0
    assert "writableLayer" not in stats  # no image, no writable layer: unset, not zero


def test_crictl_statsp_shows_the_pod_with_its_containers(daemon, crictl, pod, tmp_path) -> None:
    container_id = allocating(daemon, crictl, pod, tmp_path)
    with open(pod[1]) as f:
        name = json.load(f)["metadata"]["name"]
    rows = table(daemon.crictl(crictl, "statsp", "-s", "1").stdout)
    assert [row[:2] for row in rows] == [[name, pod[0][:13]]]
    assert float(rows[0][2]) >= 0 and human_bytes(rows[0][3]) >= ALLOCATED
    stats = json.loads(daemon.crictl(crictl, "statsp", "-o", "json", "--id", pod[0]).stdout)["stats"][0]
    assert stats["attributes"]["id"] == pod[0] and stats["attributes"]["metadata"]["name"] == name
    linux = stats["linux"]
    assert int(linux["process"]["processCount"]["value"]) >= 2  # the pause and the container
    assert [c["attributes"]["id"] for c in linux["containers"]] == [container_id]
    assert int(linux["memory"]["workingSetBytes"]["value"]) >= ALLOCATED


def test_a_stopped_pod_has_no_stats(daemon, crictl, pod) -> None:
    daemon.crictl(crictl, "stopp", pod[0])
    assert json.loads(daemon.crictl(crictl, "statsp", "-o", "json").stdout) == {"stats": []}
    with pytest.raises(grpc.RpcError) as caught:
        daemon.runtime().PodSandboxStats(api_pb2.PodSandboxStatsRequest(pod_sandbox_id=pod[0]), timeout=CALL_TIMEOUT)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION


# -- UpdateContainerResources ----------------------------------------------------------------------------

def test_crictl_update_writes_the_containers_cgroup(daemon, crictl, pod, tmp_path) -> None:
    container_id = run(daemon, crictl, pod, ["sleep", "600"])
    pid = info(daemon, crictl, container_id)["pid"]
    out = daemon.crictl(crictl, "update", "--memory", str(128 << 20), "--cpu-share", "512", "--cpu-quota", "50000",
                        "--cpu-period", "100000", container_id)
    assert out.stdout.strip() == container_id
    assert read(cgroup_file(pid, "memory", "memory.limit_in_bytes")) == str(128 << 20)
    assert read(cgroup_file(pid, "cpu", "cpu.shares")) == "512"
    assert read(cgroup_file(pid, "cpu", "cpu.cfs_quota_us")) == "50000"
    assert read(cgroup_file(pid, "cpu", "cpu.cfs_period_us")) == "100000"
    line = next(line for line in daemon.log().splitlines() if "container resources updated" in line)
    assert f" pod_id={pod[0]} container_id={container_id}: " in line


def test_container_status_reports_the_resources_as_created_and_then_as_updated(daemon, crictl, pod, tmp_path) -> None:
    # kubelet reads them back (in-place resize); containerd keeps them in its container's status.
    container_id = run(daemon, crictl, pod, ["sleep", "600"],
                       linux={"resources": {"cpu_shares": 20, "cpu_period": 100000, "cpu_quota": 50000}})
    runtime = daemon.runtime()

    def resources() -> api_pb2.LinuxContainerResources:
        request = api_pb2.ContainerStatusRequest(container_id=container_id)
        return runtime.ContainerStatus(request, timeout=CALL_TIMEOUT).status.resources.linux

    before = resources()
    assert (before.cpu_shares, before.cpu_period, before.cpu_quota, before.memory_limit_in_bytes) == (20, 100000, 50000, 0)
    runtime.UpdateContainerResources(api_pb2.UpdateContainerResourcesRequest(
        container_id=container_id, linux=api_pb2.LinuxContainerResources(cpu_shares=40, memory_limit_in_bytes=64 << 20)),
        timeout=CALL_TIMEOUT)
    runtime.UpdateContainerResources(api_pb2.UpdateContainerResourcesRequest(
        container_id=container_id, linux=api_pb2.LinuxContainerResources(cpu_shares=80)), timeout=CALL_TIMEOUT)
    after = resources()
    assert (after.cpu_shares, after.memory_limit_in_bytes) == (80, 64 << 20)  # the second update keeps the first's
    assert (after.cpu_period, after.cpu_quota) == (100000, 50000)  # as created
    assert read(cgroup_file(info(daemon, crictl, container_id)["pid"], "cpu", "cpu.shares")) == "80"


def test_a_resource_that_cannot_be_applied_is_invalid_argument_naming_it_and_changes_nothing(daemon, crictl, pod,
                                                                                             tmp_path) -> None:
    container_id = run(daemon, crictl, pod, ["sleep", "600"])
    pid = info(daemon, crictl, container_id)["pid"]
    shares = read(cgroup_file(pid, "cpu", "cpu.shares"))
    request = api_pb2.UpdateContainerResourcesRequest(container_id=container_id, linux=api_pb2.LinuxContainerResources(
        cpu_shares=300, hugepage_limits=[api_pb2.HugepageLimit(page_size="2MB", limit=1 << 21)]))
    with pytest.raises(grpc.RpcError) as caught:
        daemon.runtime().UpdateContainerResources(request, timeout=CALL_TIMEOUT)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("resources.hugepage_limits[2MB] cannot be applied")
    annotated = api_pb2.UpdateContainerResourcesRequest(container_id=container_id, annotations={"tuning": "on"},
                                                        linux=api_pb2.LinuxContainerResources(cpu_shares=300))
    with pytest.raises(grpc.RpcError) as caught:
        daemon.runtime().UpdateContainerResources(annotated, timeout=CALL_TIMEOUT)
    assert (caught.value.code(), caught.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, (
        "annotations cannot be applied: no annotation changes how podshim updates a container's resources"))
    assert read(cgroup_file(pid, "cpu", "cpu.shares")) == shares


# -- ReopenContainerLog ---------------------------------------------------------------------------------

def test_reopen_container_log_after_the_log_was_moved(daemon, crictl, pod, tmp_path) -> None:
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    container_id = run(daemon, crictl, pod, ["sh", "-c", f"echo before; read x < {fifo}; echo after"],
                       mounts=[{"container_path": str(tmp_path), "host_path": str(tmp_path)}])
    status = json.loads(daemon.crictl(crictl, "inspect", container_id).stdout)
    log_path, pid = status["status"]["logPath"], status["info"]["pid"]
    # Opening the FIFO for writing returns once the container opened it: "before" is written by then.
    with os.fdopen(fifo_writer(str(fifo), CALL_TIMEOUT), "w") as go:
        os.rename(log_path, log_path + ".1")
        daemon.runtime().ReopenContainerLog(api_pb2.ReopenContainerLogRequest(container_id=container_id),
                                            timeout=CALL_TIMEOUT)
        go.write("x\n")
    assert not wait_gone(pid, timeout=30)
    deadline = time.monotonic() + 30  # the shim reports the exit it reaped: a moment after it is gone
    while json.loads(daemon.crictl(crictl, "inspect", container_id).stdout)["status"]["state"] != "CONTAINER_EXITED":
        assert time.monotonic() < deadline, "the container is gone but not reported EXITED"
        time.sleep(0.05)
    assert [line.split(" ", 3)[3] for line in read(log_path + ".1").splitlines()] == ["before"]
    assert [line.split(" ", 3)[3] for line in read(log_path).splitlines()] == ["after"]


def test_reopen_log_of_an_exited_container_is_failed_precondition(daemon, crictl, pod, tmp_path) -> None:
    container_id = run(daemon, crictl, pod, ["true"])
    assert not wait_gone(info(daemon, crictl, container_id)["pid"], timeout=30)
    with pytest.raises(grpc.RpcError) as caught:
        daemon.runtime().ReopenContainerLog(api_pb2.ReopenContainerLogRequest(container_id=container_id),
                                            timeout=CALL_TIMEOUT)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION


# -- GetContainerEvents ----------------------------------------------------------------------------------

def test_get_container_events_sees_a_container_created_started_and_exiting(daemon, crictl, pod, tmp_path) -> None:
    events = daemon.runtime().GetContainerEvents(api_pb2.GetEventsRequest(), timeout=CALL_TIMEOUT)
    try:
        events.initial_metadata()  # sent once the stream is subscribed
        container_id = run(daemon, crictl, pod, ["sh", "-c", "exit 3"])
        seen = []
        for event in events:
            if event.container_id == container_id:
                seen.append(event)
            if event.container_event_type == api_pb2.CONTAINER_STOPPED_EVENT:
                break
    finally:
        events.cancel()
    assert [api_pb2.ContainerEventType.Name(e.container_event_type) for e in seen] == [
        "CONTAINER_CREATED_EVENT", "CONTAINER_STARTED_EVENT", "CONTAINER_STOPPED_EVENT"]
    stopped = seen[-1]
    assert stopped.pod_sandbox_status.id == pod[0]
    [status] = [s for s in stopped.containers_statuses if s.id == container_id]
    assert (status.state, status.exit_code) == (api_pb2.CONTAINER_EXITED, 3)
    assert seen[0].created_at <= seen[1].created_at <= stopped.created_at


def test_get_container_events_sees_a_pod_removed(daemon, crictl, pod) -> None:
    events = daemon.runtime().GetContainerEvents(api_pb2.GetEventsRequest(), timeout=CALL_TIMEOUT)
    try:
        events.initial_metadata()
        daemon.crictl(crictl, "rmp", "-f", pod[0])
        kinds = []
        for event in events:
            if event.container_id == pod[0]:
                kinds.append(api_pb2.ContainerEventType.Name(event.container_event_type))
            if event.container_event_type == api_pb2.CONTAINER_DELETED_EVENT:
                break
    finally:
        events.cancel()
    assert kinds == ["CONTAINER_STOPPED_EVENT", "CONTAINER_DELETED_EVENT"]


def test_pod_sandbox_status_carries_every_containers_status_and_when_it_was_read(daemon, crictl, pod) -> None:
    """kubelet's evented PLEG takes a pod's container statuses from PodSandboxStatus once its
    timestamp is set: a container missing there is one kubelet runs again."""
    exited = run(daemon, crictl, pod, ["true"], name="done")
    assert not wait_gone(info(daemon, crictl, exited)["pid"], timeout=30)
    running = run(daemon, crictl, pod, ["sleep", "1000"], name="up")
    before = time.time_ns()
    reply = daemon.runtime().PodSandboxStatus(api_pb2.PodSandboxStatusRequest(pod_sandbox_id=pod[0][:12]),
                                              timeout=CALL_TIMEOUT)
    after = time.time_ns()
    assert before <= reply.timestamp <= after
    by_id = {s.id: s for s in reply.containers_statuses}
    assert set(by_id) == {exited, running}
    for container_id in (exited, running):
        alone = daemon.runtime().ContainerStatus(api_pb2.ContainerStatusRequest(container_id=container_id),
                                                 timeout=CALL_TIMEOUT).status
        assert by_id[container_id] == alone
    assert (by_id[exited].state, by_id[exited].exit_code) == (api_pb2.CONTAINER_EXITED, 0)
    assert by_id[running].state == api_pb2.CONTAINER_RUNNING


# -- stop signals ---------------------------------------------------------------------------------------

#: Exits with the number of the signal it got: 3 (QUIT), 10 (USR1) or 15 (TERM).
TRAPS = ["sh", "-c", "trap 'exit 3' QUIT; trap 'exit 10' USR1; trap 'exit 15' TERM; while true; do sleep 0.1; done"]


def test_stop_container_sends_the_configs_signal_else_the_images_else_sigterm(daemon, crictl, pod,
                                                                                test_images) -> None:
    from support.imagebuild import ImageConfig

    quits = test_images.build("stops-with-quit", config=ImageConfig(stop_signal="SIGQUIT"))
    daemon.crictl(crictl, "pull", quits.ref)
    cases: list[tuple[str, dict, int, int]] = [
             ("image", {"image": {"image": quits.ref}}, 3, api_pb2.SIGNAL_SIGQUIT),
             ("config", {"image": {"image": quits.ref}, "stop_signal": "SIGNAL_SIGUSR1"}, 10, api_pb2.SIGNAL_SIGUSR1),
             ("default", {}, 15, api_pb2.SIGNAL_SIGTERM)]
    for name, fields, exit_code, named in cases:
        container_id = run(daemon, crictl, pod, TRAPS, name=name, **fields)
        status = daemon.runtime().ContainerStatus(api_pb2.ContainerStatusRequest(container_id=container_id),
                                                  timeout=CALL_TIMEOUT).status
        assert status.stop_signal == named, name
        daemon.runtime().StopContainer(api_pb2.StopContainerRequest(container_id=container_id, timeout=20),
                                       timeout=CALL_TIMEOUT)
        status = daemon.runtime().ContainerStatus(api_pb2.ContainerStatusRequest(container_id=container_id),
                                                  timeout=CALL_TIMEOUT).status
        assert (status.state, status.exit_code) == (api_pb2.CONTAINER_EXITED, exit_code), name


def test_a_stop_signal_that_names_no_signal_is_refused_at_create(daemon, crictl, pod, test_images) -> None:
    from support.imagebuild import ImageConfig

    with pytest.raises(grpc.RpcError) as bad_config:  # a number CRI's Signal enum does not have
        daemon.create_container(pod[0], {**container_config(["true"], name="bad"), "stop_signal": 999}, pod[1])
    assert bad_config.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "stop_signal: 999 is not one of CRI's Signal names" in bad_config.value.details()
    nope = test_images.build("stops-with-nope", config=ImageConfig(stop_signal="SIGNOPE"))
    daemon.crictl(crictl, "pull", nope.ref)
    with pytest.raises(grpc.RpcError) as bad_image:
        daemon.create_container(pod[0], {**container_config(["true"], name="nope"), "image": {"image": nope.ref}}, pod[1])
    assert bad_image.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "StopSignal 'SIGNOPE' is not a signal" in bad_image.value.details()
    assert daemon.runtime().ListContainers(api_pb2.ListContainersRequest(), timeout=CALL_TIMEOUT).containers == []


# -- UpdateRuntimeConfig, ImageFsInfo ---------------------------------------------------------------------

def test_update_runtime_config_records_the_pod_cidr_crictl_info_shows(daemon, crictl) -> None:
    daemon.runtime().UpdateRuntimeConfig(api_pb2.UpdateRuntimeConfigRequest(runtime_config=api_pb2.RuntimeConfig(
        network_config=api_pb2.NetworkConfig(pod_cidr="10.244.3.0/24"))), timeout=CALL_TIMEOUT)
    assert json.loads(daemon.crictl(crictl, "info").stdout)["podCIDR"] == "10.244.3.0/24"
    with pytest.raises(grpc.RpcError) as caught:
        daemon.runtime().UpdateRuntimeConfig(api_pb2.UpdateRuntimeConfigRequest(runtime_config=api_pb2.RuntimeConfig(
            network_config=api_pb2.NetworkConfig(pod_cidr="10.244.3.0/33"))), timeout=CALL_TIMEOUT)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == "pod CIDR '10.244.3.0/33' is not a network such as 10.244.0.0/24"
    assert json.loads(daemon.crictl(crictl, "info").stdout)["podCIDR"] == "10.244.3.0/24"


def test_crictl_imagefsinfo_measures_the_image_store(daemon, crictl) -> None:
    [found] = json.loads(daemon.crictl(crictl, "imagefsinfo").stdout)["status"]["imageFilesystems"]
    store = os.path.join(daemon.state_root, IMAGE_STORE_DIR)
    assert found["fsId"]["mountpoint"] == store
    used, inodes = usage(store)  # an empty store: its directories (content, snapshots, ...), each counted once
    assert found["inodesUsed"]["value"] == str(inodes)
    assert int(found["usedBytes"]["value"]) == used
    assert int(found["timestamp"]) > 0


# -- metrics -------------------------------------------------------------------------------------------

def test_the_metrics_endpoint_counts_pods_containers_and_calls(daemon, crictl, pod, tmp_path) -> None:
    running = run(daemon, crictl, pod, ["sleep", "600"])
    daemon.create_container(pod[0], container_config(["true"], name="new"), pod[1])
    found = scrape_metrics(daemon)
    assert found['podshimd_pods{state="SANDBOX_READY"}'] == 1
    assert found['podshimd_pods{state="SANDBOX_NOTREADY"}'] == 0
    assert found['podshimd_containers{state="CONTAINER_RUNNING"}'] == 1
    assert found['podshimd_containers{state="CONTAINER_CREATED"}'] == 1
    assert found['podshimd_cri_request_duration_seconds_count{method="StartContainer"}'] >= 1
    assert found['podshimd_cri_requests_total{code="OK",method="RunPodSandbox"}'] >= 1
    assert found["process_resident_memory_bytes"] > 0
    daemon.crictl(crictl, "stop", running)
    before = scrape_metrics(daemon).get('podshimd_cri_requests_total{code="NOT_FOUND",method="ContainerStatus"}', 0)
    daemon.crictl(crictl, "inspect", "0" * 64, check=False)
    after = scrape_metrics(daemon)
    assert after['podshimd_cri_requests_total{code="NOT_FOUND",method="ContainerStatus"}'] == before + 1
    assert after['podshimd_containers{state="CONTAINER_EXITED"}'] == 1


# -- podshimctl's exec, stats, statsp -----------------------------------------------------------------

def ctl(daemon, *argv: str) -> subprocess.CompletedProcess:
    """podshimctl with the daemon's runtime root (its default endpoint is the daemon's socket)."""
    result = subprocess.run([sys.executable, "-m", "client.cli", "--runtime-root", daemon.runtime_root, *argv],
                            cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    assert b"Traceback" not in result.stderr, result.stderr
    return result


def test_podshimctl_exec_passes_both_streams_and_exits_with_the_commands_status(daemon, crictl, pod, tmp_path) -> None:
    container_id = run(daemon, crictl, pod, ["sleep", "600"])
    done = ctl(daemon, "exec", container_id[:12], "sh", "-c", "echo out; echo err >&2; exit 3")
    assert (done.returncode, done.stdout, done.stderr) == (3, b"out\n", b"err\n")
    timed_out = ctl(daemon, "exec", "--timeout", "1", container_id, "sleep", "60")
    assert timed_out.returncode == 1
    assert timed_out.stderr == b"DEADLINE_EXCEEDED: command 'sleep 60' timed out after 1 s and was killed\n"


def test_podshimctl_stats_and_statsp_show_the_allocated_memory(daemon, crictl, pod, tmp_path) -> None:
    container_id = allocating(daemon, crictl, pod, tmp_path)
    rows = [line.split() for line in ctl(daemon, "stats", "-s", "0.5").stdout.decode().splitlines()]
    assert rows[0] == ["CONTAINER", "NAME", "CPU", "%", "MEMORY", "USAGE"]
    assert rows[1][:2] == [container_id[:13], "alloc"] and float(rows[1][2]) >= 0
    assert rows[1][3].endswith("MiB") and float(rows[1][3][:-3]) >= ALLOCATED >> 20
    pods = [line.split() for line in ctl(daemon, "statsp", "-s", "0").stdout.decode().splitlines()]
    assert pods[1][0] == pod[0][:13] and pods[1][2] == "-"  # one sample: no CPU rate
    assert float(pods[1][3][:-3]) >= ALLOCATED >> 20 and pods[1][5] == "1"
