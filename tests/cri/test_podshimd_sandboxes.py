"""Pod sandboxes through podshimd as the real crictl drives them (runp, pods with filters,
inspectp, stopp, rmp), each checked on what crictl prints and on the kernel side (the pause's
namespaces and process); the CRI semantics a client relies on (NOT_FOUND for the status of an
unknown id, stop and remove idempotent and successful for an unknown id, ids by unique prefix, a
sentence with every error, nothing half-made after a failure); and a daemon that dies, even at kill -9 in the middle of RunPodSandbox."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

import grpc
import pytest
from google.protobuf import json_format

from shim.cri.api import api_pb2
from shim.launch.template import template_pid

from client.cri.failpoints import ACTION_ENV as FAILPOINT_ACTION_ENV
from client.cri.failpoints import ENV as FAILPOINT_ENV

from support.critools import running_podshimd
from support.podtools import ns_inode, pod_config
from support.proctools import alive, wait_gone

POD_ID = re.compile(r"^[0-9a-f]{64}$")


@pytest.fixture
def write(tmp_path):
    """Write a config as JSON; return its path."""
    def write(doc: dict, name: str = "config.json") -> str:
        path = tmp_path / name
        path.write_text(json.dumps(doc))
        return str(path)
    return write


def inspectp(daemon, crictl, pod_id: str) -> dict:
    return json.loads(daemon.crictl(crictl, "inspectp", pod_id).stdout)


def runp(daemon, crictl, write, **namespace_options) -> tuple[str, dict]:
    config = pod_config(**namespace_options)
    if namespace_options.get("network") == 2:
        del config["linux"]["sysctls"]  # network sysctls would change the host's network: refused
    pod_id = daemon.crictl(crictl, "runp", write(config)).stdout.strip()
    assert POD_ID.match(pod_id), pod_id
    return pod_id, config


def rpc_error(call, *args, **kwargs) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as failed:
        call(*args, **kwargs)
    return failed.value


def table(output: str) -> list[list[str]]:
    """crictl's table, split on its runs of two or more spaces, without the heading."""
    return [re.split(r"\s{2,}", line.strip()) for line in output.splitlines()[1:]]


# -- runp, inspectp, pods --------------------------------------------------------------------------

def test_runp_makes_a_ready_pod_whose_pause_holds_its_own_namespaces(daemon, crictl, write) -> None:
    pod_id, config = runp(daemon, crictl, write)
    found = inspectp(daemon, crictl, pod_id)
    status, info = found["status"], found["info"]
    assert status["id"] == pod_id and status["state"] == "SANDBOX_READY"
    assert status["metadata"] == config["metadata"]
    assert status["labels"] == config["labels"] and status["runtimeHandler"] == "native"
    assert status["linux"]["namespaces"]["options"]["pid"] == "CONTAINER"  # the example's pid: 1
    pause = info["pid"]
    with open(f"/proc/{pause}/cmdline", "rb") as f:
        assert f.read().split(b"\0")[0].endswith(b"catatonit")
    for kind in ("net", "pid", "ipc", "uts", "mnt"):
        assert ns_inode(pause, kind) != ns_inode(os.getpid(), kind), kind
    assert ns_inode(pause, "net") == os.stat(info["netns_path"]).st_ino
    hostname = subprocess.run(["nsenter", f"--uts=/proc/{pause}/ns/uts", "hostname"], capture_output=True, text=True)
    assert hostname.stdout.strip() == config["hostname"]
    assert info["network"] == "no CNI config: the pod has a network namespace with loopback only"


def test_pods_lists_ready_pods_newest_first_with_their_name_namespace_and_handler(daemon, crictl, write) -> None:
    first, config = runp(daemon, crictl, write)
    second, _ = runp(daemon, crictl, write)
    rows = table(daemon.crictl(crictl, "pods").stdout)
    assert [row[0] for row in rows] == [second[:13], first[:13]]
    assert rows[1][2:] == ["Ready", config["metadata"]["name"], "default", "1", "native"]


def test_pods_filters_by_id_prefix_state_and_label(daemon, crictl, write) -> None:
    ready, _ = runp(daemon, crictl, write)
    stopped, _ = runp(daemon, crictl, write)
    labelled = pod_config()
    labelled["labels"] = {"app": "other", "tier": "db"}
    other = daemon.crictl(crictl, "runp", write(labelled, "labelled.json")).stdout.strip()
    daemon.crictl(crictl, "stopp", stopped)

    def ids(*flags: str) -> list[str]:
        return daemon.crictl(crictl, "pods", "-q", *flags).stdout.split()

    assert ids("--id", ready[:10]) == [ready]
    assert set(ids("--state", "ready")) == {ready, other}
    assert ids("--state", "notready") == [stopped]
    assert ids("--label", "tier=db") == [other]
    assert set(ids("--label", "app=podshim-demo")) == {ready, stopped}
    assert ids("--label", "app=other", "--label", "tier=web") == []


def test_inspectp_info_is_containerd_shaped_json(daemon, crictl, write) -> None:
    pod_id, _ = runp(daemon, crictl, write)
    reply = daemon.runtime().PodSandboxStatus(api_pb2.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=True))
    assert list(reply.info) == ["info"]
    info = json.loads(reply.info["info"])
    assert info["sandbox_state"] == "running" and alive(info["pid"]) and info["shim_address"].startswith("unix://")
    quiet = daemon.runtime().PodSandboxStatus(api_pb2.PodSandboxStatusRequest(pod_sandbox_id=pod_id))
    assert dict(quiet.info) == {} and quiet.status.created_at > 0 and quiet.timestamp >= quiet.status.created_at


def test_an_unset_network_mode_is_pod_and_node_shares_the_daemons_network(daemon, crictl, write) -> None:
    config = pod_config()
    del config["linux"]["security_context"]
    pod_id = daemon.crictl(crictl, "runp", write(config)).stdout.strip()
    found = inspectp(daemon, crictl, pod_id)
    assert found["status"]["linux"]["namespaces"]["options"]["network"] == "POD"
    assert ns_inode(found["info"]["pid"], "net") != ns_inode(daemon.process.pid, "net")
    host, _ = runp(daemon, crictl, write, network=2)
    found = inspectp(daemon, crictl, host)
    assert found["status"]["linux"]["namespaces"]["options"]["network"] == "NODE"
    assert ns_inode(found["info"]["pid"], "net") == ns_inode(daemon.process.pid, "net")


def shim_argv(shim_pid: int) -> list[bytes]:
    with open(f"/proc/{shim_pid}/cmdline", "rb") as f:
        return f.read().split(b"\0")


def test_shims_are_forked_from_the_runtime_roots_template_by_default(daemon, crictl, write) -> None:
    pod_id, _ = runp(daemon, crictl, write)
    argv = shim_argv(int(inspectp(daemon, crictl, pod_id)["info"]["shim"]["shim_pid"]))
    assert b"template" in argv and b"start" not in argv  # a forked shim keeps the template's command line
    assert template_pid(daemon.runtime_root) != 0


def test_with_template_false_every_shim_is_execd(crictl, write) -> None:
    directory = tempfile.mkdtemp(prefix="psd-exec-")
    try:
        with running_podshimd(directory, config="template = false\n") as daemon:
            pod_id, _ = runp(daemon, crictl, write)
            argv = shim_argv(int(inspectp(daemon, crictl, pod_id)["info"]["shim"]["shim_pid"]))
            assert b"start" in argv and b"template" not in argv
            assert template_pid(daemon.runtime_root) == 0
            daemon.remove_every_pod(crictl)
    finally:
        shutil.rmtree(directory)


# -- stopp, rmp ------------------------------------------------------------------------------------

def test_stopp_ends_the_pause_and_the_pod_is_notready(daemon, crictl, write) -> None:
    pod_id, _ = runp(daemon, crictl, write)
    pause = inspectp(daemon, crictl, pod_id)["info"]["pid"]
    assert daemon.crictl(crictl, "stopp", pod_id).stdout == f"Stopped sandbox {pod_id}\n"
    assert not wait_gone(pause)
    assert inspectp(daemon, crictl, pod_id)["status"]["state"] == "SANDBOX_NOTREADY"
    assert table(daemon.crictl(crictl, "pods").stdout)[0][2] == "NotReady"


def test_rmp_leaves_no_pod_pause_shim_or_netns(daemon, crictl, write) -> None:
    pod_id, _ = runp(daemon, crictl, write)
    info = inspectp(daemon, crictl, pod_id)["info"]
    shim_pid, pause, netns = int(info["shim"]["shim_pid"]), info["pid"], info["netns_path"]
    # -f: crictl stops the ready pod first, then removes it.
    assert daemon.crictl(crictl, "rmp", "-f", pod_id).stdout == f"Stopped sandbox {pod_id}\nRemoved sandbox {pod_id}\n"
    assert not wait_gone(shim_pid, pause)
    assert not os.path.exists(netns)
    assert daemon.crictl(crictl, "pods", "-q").stdout == ""
    assert daemon.pod_records() == []
    assert daemon.sandbox_bundles() == []


def test_ids_may_be_given_by_unique_prefix(daemon, crictl, write) -> None:
    pod_id, _ = runp(daemon, crictl, write)
    assert inspectp(daemon, crictl, pod_id[:8])["status"]["id"] == pod_id
    daemon.crictl(crictl, "stopp", pod_id[:8])
    daemon.crictl(crictl, "rmp", pod_id[:8])
    assert daemon.crictl(crictl, "pods", "-q").stdout == ""


def test_stop_and_remove_are_idempotent_and_succeed_for_ids_never_seen(daemon, crictl, write) -> None:
    runtime = daemon.runtime()
    pod_id, _ = runp(daemon, crictl, write)
    for _ in range(2):
        runtime.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=pod_id))
    for _ in range(2):
        runtime.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=pod_id))
    runtime.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=pod_id))
    gone = rpc_error(runtime.PodSandboxStatus, api_pb2.PodSandboxStatusRequest(pod_sandbox_id=pod_id))
    assert gone.code() == grpc.StatusCode.NOT_FOUND
    # CRI: stop and remove "must not return an error if not found", as containerd answers.
    unknown = "f" * 64
    runtime.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=unknown))
    runtime.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=unknown))
    failed = rpc_error(runtime.PodSandboxStatus, api_pb2.PodSandboxStatusRequest(pod_sandbox_id=unknown))
    assert failed.code() == grpc.StatusCode.NOT_FOUND
    assert failed.details() == f"no pod sandbox has an id starting with {unknown!r}"
    assert daemon.sandbox_bundles() == [] and daemon.pod_records() == []


# -- bad requests ----------------------------------------------------------------------------------

@pytest.mark.parametrize("change, code, details", [
    (lambda c: c.pop("metadata"), grpc.StatusCode.INVALID_ARGUMENT, "metadata is required"),
    (lambda c: c["metadata"].pop("uid"), grpc.StatusCode.INVALID_ARGUMENT, "metadata.uid is required"),
    (lambda c: c.update(log_directory="relative/logs"), grpc.StatusCode.INVALID_ARGUMENT,
     "log_directory 'relative/logs' must be an absolute path"),
    (lambda c: c["linux"]["security_context"]["namespace_options"].update(ipc="CONTAINER"),
     grpc.StatusCode.INVALID_ARGUMENT, "linux.security_context.namespace_options.ipc is 'CONTAINER'; allowed: POD (0), NODE (2)"),
    (lambda c: c["linux"].update(sysctls={"kernel.no_such_sysctl": "1"}), None, "kernel.no_such_sysctl"),
    (lambda c: c["linux"].update(sysctls={"net.ipv4.ip_forward": ":"}), grpc.StatusCode.INVALID_ARGUMENT,
     "writing sysctl net.ipv4.ip_forward: the kernel refuses the value (Invalid argument)"),
])
def test_a_bad_config_gets_a_status_with_a_sentence_and_leaves_nothing(daemon, change, code, details) -> None:
    config = pod_config()
    change(config)
    request = api_pb2.RunPodSandboxRequest()
    json_format.ParseDict({"config": config}, request)
    failed = rpc_error(daemon.runtime().RunPodSandbox, request)
    assert failed.code() in ((code,) if code else (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION))
    assert details in failed.details() and "Traceback" not in failed.details()
    assert daemon.pod_records() == []
    assert daemon.sandbox_bundles() == []


def test_a_request_without_a_config_or_with_an_unknown_handler_is_invalid(daemon) -> None:
    runtime = daemon.runtime()
    failed = rpc_error(runtime.RunPodSandbox, api_pb2.RunPodSandboxRequest())
    assert (failed.code(), failed.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "config is required")
    request = api_pb2.RunPodSandboxRequest(runtime_handler="kata")
    json_format.ParseDict(pod_config(), request.config)
    failed = rpc_error(runtime.RunPodSandbox, request)
    assert failed.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert failed.details() == "runtime handler 'kata' is not configured (configured: native, runc, crun)"
    empty = rpc_error(runtime.StopPodSandbox, api_pb2.StopPodSandboxRequest())
    assert empty.code() == grpc.StatusCode.INVALID_ARGUMENT and "pod id" in empty.details()


def test_the_same_pod_name_twice_is_already_exists(daemon, crictl, write) -> None:
    path = write(pod_config())
    daemon.crictl(crictl, "runp", path)
    again = daemon.crictl(crictl, "runp", path, check=False)
    assert again.returncode != 0 and "code = AlreadyExists desc = pod name " in again.stderr
    assert len(daemon.crictl(crictl, "pods", "-q").stdout.split()) == 1


def test_a_client_that_goes_away_mid_runp_leaves_a_whole_pod(crictl) -> None:
    # The daemon freezes itself (SIGSTOP) at a step of RunPodSandbox: the call is surely in the
    # middle of its change when the client goes away (its deadline passes), with no timing.
    directory = tempfile.mkdtemp(prefix="psd-away-")
    try:
        with running_podshimd(directory, env={FAILPOINT_ENV: "run:after-create", FAILPOINT_ACTION_ENV: "stop"}) as daemon:
            config = pod_config()
            request = api_pb2.RunPodSandboxRequest()
            json_format.ParseDict({"config": config}, request)
            call = daemon.runtime().RunPodSandbox.future(request, timeout=60)
            _, status = os.waitpid(daemon.process.pid, os.WUNTRACED)
            assert os.WIFSTOPPED(status)
            call.cancel()  # the client goes away while the daemon is inside the change
            assert call.cancelled()
            os.kill(daemon.process.pid, signal.SIGCONT)
            # The change runs to its end in the daemon: the pod turns up, ready (a bound, not a sleep).
            deadline = time.monotonic() + 30
            while True:
                pods = daemon.runtime().ListPodSandbox(api_pb2.ListPodSandboxRequest()).items
                if [p.state for p in pods] == [api_pb2.SANDBOX_READY] or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert [(p.metadata.name, p.state) for p in pods] == [(config["metadata"]["name"], api_pb2.SANDBOX_READY)]
            daemon.crictl(crictl, "rmp", "-f", pods[0].id)
    finally:
        shutil.rmtree(directory)


# -- the daemon dies -------------------------------------------------------------------------------

def test_a_daemon_killed_and_restarted_finds_its_pods_and_shims_again(crictl, write) -> None:
    directory = tempfile.mkdtemp(prefix="psd-restart-")
    try:
        with running_podshimd(directory) as daemon:
            pod_id, _ = runp(daemon, crictl, write)
            info = inspectp(daemon, crictl, pod_id)["info"]
            daemon.process.send_signal(signal.SIGKILL)
            daemon.process.wait()
        assert alive(info["pid"]) and alive(int(info["shim"]["shim_pid"]))  # a daemon's death is not the pods'
        with running_podshimd(directory) as daemon:
            again = inspectp(daemon, crictl, pod_id)
            assert again["status"]["state"] == "SANDBOX_READY" and again["info"]["pid"] == info["pid"]
            assert again["info"]["shim_address"] == info["shim_address"]
            daemon.crictl(crictl, "rmp", "-f", pod_id)
            assert not wait_gone(info["pid"], int(info["shim"]["shim_pid"]))
    finally:
        shutil.rmtree(directory)


@pytest.mark.parametrize("failpoint", ["run:after-create", "run:after-start"])
def test_a_daemon_killed_in_the_middle_of_runp_rolls_the_pod_back_when_it_restarts(crictl, write, failpoint) -> None:
    directory = tempfile.mkdtemp(prefix="psd-crash-")
    try:
        with running_podshimd(directory, env={FAILPOINT_ENV: failpoint}) as daemon:
            died = daemon.crictl(crictl, "runp", write(pod_config()), check=False)
            assert died.returncode != 0 and daemon.process.wait() == -signal.SIGKILL
        sandboxes = os.path.join(directory, "state", "sandboxes", "k8s.io")
        (half_made,) = os.listdir(sandboxes)
        with open(os.path.join(sandboxes, half_made, "bootstrap.json")) as f:
            shim_socket = json.load(f)["address"].removeprefix("unix://")
        with running_podshimd(directory) as daemon:
            assert daemon.crictl(crictl, "pods", "-q").stdout == ""
            assert os.listdir(sandboxes) == [] and daemon.pod_records() == []
            assert not os.path.exists(shim_socket)
    finally:
        shutil.rmtree(directory)
