"""A sandbox's life through a real shim: every method in every state, the kernel objects it makes
(checked by inode and path), stopping, waiting, events and shutdown."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time

import pytest

from shim.api.names import SANDBOX_METHODS
from shim.kernel import netns
from shim.rpc import FailedPrecondition, InvalidArgument, NotFound

from support.shimtools import (
    WAIT,
    EventStream,
    ProcessRef,
    host_untouched,  # noqa: F401  (autouse: what this module's shims made is checked at the end)
    mounts_naming,
    ns_inode,
    spare_state_files,
)

# Each test runs twice: shims exec'd by `podshim start`, and forked by the session's template.
pytestmark = pytest.mark.usefixtures("spawn_mode")


NAMESPACES = ("net", "pid", "ipc", "uts", "mnt")


def _node_mode(kind: str) -> dict:
    """CreateSandbox options that put the sandbox in the host's namespace of ``kind``."""
    return {"linux": {"security_context": {"namespace_options": {kind: 2}}}}


def _nsenter(pid: int, flag: str, *argv: str) -> str:
    return subprocess.run(["nsenter", "-t", str(pid), flag, *argv], capture_output=True, text=True,
                          check=True, timeout=WAIT).stdout.strip()


def _nspid(pid: int) -> list[int]:
    with open(f"/proc/{pid}/status") as f:
        return [int(n) for line in f if line.startswith("NSpid:") for n in line.split()[1:]]


@pytest.fixture
def given_netns():
    """A network namespace the test makes itself (as a CNI-managing caller would); removed after."""
    path = netns.create_netns(netns.new_netns_path("podshim-it"))
    yield path
    netns.remove_netns(path)


# -- every method in every state ---------------------------------------------------------------


async def test_ping_answers_before_create(shim) -> None:
    assert await shim.call("PingSandbox") == {}


@pytest.mark.parametrize("method", sorted(set(SANDBOX_METHODS) - {"PingSandbox", "CreateSandbox", "ShutdownSandbox"}))
async def test_method_before_create_is_not_found(shim, method) -> None:
    with pytest.raises(NotFound):
        await shim.call(method)
    assert await shim.call("PingSandbox") == {}


async def test_status_of_a_created_sandbox(shim) -> None:
    await shim.call("CreateSandbox")
    status = await shim.call("SandboxStatus")
    assert status["sandbox_id"] == shim.sandbox_id
    assert (status["state"], status["pid"], status["exited_at"], status["exit_status"]) == ("created", 0, 0, 0)
    assert status["created_at"] > 0


async def test_start_returns_the_pause_pid_and_creation_time(shim) -> None:
    await shim.call("CreateSandbox")
    before = time.time_ns()
    started = await shim.call("StartSandbox")
    assert before <= started["created_at"] <= time.time_ns()
    status = await shim.call("SandboxStatus")
    assert (status["state"], status["pid"], status["created_at"]) == ("running", started["pid"], started["created_at"])
    with open(f"/proc/{started['pid']}/stat") as f:
        assert f.read().split()[3] == str(shim.pid)  # the shim, a subreaper, is its parent


async def test_update_writes_the_sandbox_cgroup_of_a_running_sandbox_only(shim) -> None:
    await shim.call("CreateSandbox")
    with pytest.raises(FailedPrecondition, match="cannot update sandbox .* while it is created"):
        await shim.call("UpdateSandbox", resources={"cpu_shares": 512})
    started = await shim.call("StartSandbox")
    with open(f"/proc/{started['pid']}/cgroup") as f:
        cpu = next(line.split(":", 2)[2].strip() for line in f if "cpu" in line.split(":")[1].split(","))
    await shim.call("UpdateSandbox", resources={"cpu_shares": 512})
    [mount] = [m for m in ("/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu") if os.path.isdir(m)][:1]
    with open(os.path.join(mount, cpu.lstrip("/"), "cpu.shares")) as f:
        assert f.read().strip() == "512"
    with pytest.raises(InvalidArgument, match="oom_score_adj cannot be applied to a sandbox"):
        await shim.call("UpdateSandbox", resources={"oom_score_adj": 100})
    with pytest.raises(InvalidArgument, match="resources must be a map"):
        await shim.call("UpdateSandbox")
    await shim.call("StopSandbox", timeout_secs=0)
    with pytest.raises(FailedPrecondition, match="while it is stopped"):
        await shim.call("UpdateSandbox", resources={"cpu_shares": 512})


async def test_a_sandbox_created_with_resources_has_them_in_its_cgroup_from_its_start(shim) -> None:
    with pytest.raises(InvalidArgument, match=r"linux.resources.cpu_sharez is not a resource \(known: cpu_shares"):
        await shim.call("CreateSandbox", options={"linux": {"resources": {"cpu_sharez": 512}}})
    with pytest.raises(InvalidArgument, match="linux.resources.oom_score_adj: it is a process's"):
        await shim.call("CreateSandbox", options={"linux": {"resources": {"oom_score_adj": 5}}})
    await shim.call("CreateSandbox", options={"linux": {"resources": {"cpu_shares": 384, "pids_limit": None}}})
    started = await shim.call("StartSandbox")
    with open(f"/proc/{started['pid']}/cgroup") as f:
        cpu = next(line.split(":", 2)[2].strip() for line in f if "cpu" in line.split(":")[1].split(","))
    [mount] = [m for m in ("/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu") if os.path.isdir(m)][:1]
    with open(os.path.join(mount, cpu.lstrip("/"), "cpu.shares")) as f:
        assert f.read().strip() == "384"


async def test_a_sandbox_whose_resources_the_kernel_refuses_does_not_start_and_leaves_no_cgroup(shim) -> None:
    await shim.call("CreateSandbox", options={"linux": {"resources": {"cpuset_cpus": "4095"}}})
    with pytest.raises(InvalidArgument, match="resources.cpuset_cpus: the kernel refused '4095'"):
        await shim.call("StartSandbox")
    assert (await shim.call("SandboxStatus"))["state"] == "created"
    assert not [key for key in await shim.info() if key.startswith("cgroup.")]  # removed, so no longer recorded


async def test_status_of_a_stopped_sandbox(shim) -> None:
    await shim.run_sandbox()
    await shim.call("StopSandbox", timeout_secs=0)
    status = await shim.call("SandboxStatus")
    assert (status["state"], status["exit_status"]) == ("stopped", 137)
    assert status["exited_at"] >= status["created_at"] > 0


async def test_verbose_status_names_the_sandbox_resources(shim) -> None:
    pid = await shim.run_sandbox()
    info = await shim.info()
    assert info["bundle"] == shim.bundle and info["socket"] == shim.socket_path
    assert info["shim_pid"] == str(shim.pid) and info["pause_binary"] == "/usr/bin/catatonit"
    assert info["netns_path"].startswith("/var/run/netns/podshim-")
    assert any(key.startswith("cgroup.") for key in info)
    for ns in NAMESPACES:
        assert info[f"ns.{ns}.path"] == f"/proc/{pid}/ns/{ns}"
        assert info[f"ns.{ns}.inode"] == str(ns_inode(pid, ns))


async def test_pause_runs_in_every_cgroup_the_status_names(shim) -> None:
    pid = await shim.run_sandbox()
    cgroups = [path for key, path in (await shim.info()).items() if key.startswith("cgroup.")]
    for path in cgroups:
        with open(os.path.join(path, "cgroup.procs")) as f:
            assert str(pid) in f.read().split(), path


async def test_metrics_of_a_running_sandbox(shim) -> None:
    await shim.run_sandbox()
    metrics = (await shim.call("SandboxMetrics"))["metrics"]
    assert metrics["sandbox_id"] == shim.sandbox_id and metrics["timestamp"] > 0
    data = metrics["data"]
    assert data["pids_current"] == 1
    assert data["cpu_usage_ns"] >= 0 and data["memory_usage_bytes"] >= 0
    assert all(data[name] is None for name in data["unavailable"])


async def test_metrics_before_start_say_what_is_unavailable(shim) -> None:
    await shim.call("CreateSandbox")
    data = (await shim.call("SandboxMetrics"))["metrics"]["data"]
    assert data["unavailable"] and data["pids_current"] is None


async def test_platform_names_this_host(shim) -> None:
    await shim.call("CreateSandbox")
    reply = (await shim.call("Platform"))["platform"]
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    assert reply["os"] == "linux" and reply["architecture"] == arch


# -- the pause's namespaces -------------------------------------------------------------------


async def test_pause_joins_the_sandbox_netns(shim) -> None:
    pid = await shim.run_sandbox()
    path = (await shim.info())["netns_path"]
    assert ns_inode(pid, "net") == os.stat(path).st_ino != ns_inode("self", "net")


@pytest.mark.parametrize("ns", ["pid", "ipc", "uts", "mnt"])
async def test_pause_has_its_own_namespace(shim, ns) -> None:
    pid = await shim.run_sandbox()
    assert ns_inode(pid, ns) != ns_inode("self", ns)


async def test_pause_is_pid_1_of_its_pid_namespace(shim) -> None:
    pid = await shim.run_sandbox()
    assert _nspid(pid) == [pid, 1]


async def test_hostname_is_set_in_the_sandbox_uts_namespace(shim) -> None:
    pid = await shim.run_sandbox(options={"hostname": "pod-a"})
    assert _nsenter(pid, "-u", "hostname") == "pod-a"
    assert platform.node() != "pod-a"


async def test_sysctl_is_applied_in_the_sandbox_netns(shim) -> None:
    key = "/proc/sys/net/ipv4/ip_unprivileged_port_start"
    pid = await shim.run_sandbox(options={"linux": {"sysctls": {"net.ipv4.ip_unprivileged_port_start": "80"}}})
    assert _nsenter(pid, "-n", "cat", key) == "80"
    with open(key) as f:
        assert f.read().strip() != "80"


async def test_a_net_core_sysctl_that_is_per_netns_is_applied_there(shim) -> None:
    key = "/proc/sys/net/core/somaxconn"
    with open(key) as f:
        host_value = f.read().strip()
    pod_value = "1025" if host_value != "1025" else "1026"
    pid = await shim.run_sandbox(options={"linux": {"sysctls": {"net.core.somaxconn": pod_value}}})
    assert _nsenter(pid, "-n", "cat", key) == pod_value
    with open(key) as f:
        assert f.read().strip() == host_value


async def test_host_network_mode_uses_the_host_netns_and_makes_none(shim) -> None:
    pid = await shim.run_sandbox(options=_node_mode("network"))
    assert ns_inode(pid, "net") == ns_inode("self", "net")
    assert (await shim.info())["netns_path"] == ""
    assert shim.record()["netns_path"] is None


async def test_node_pid_mode_uses_the_host_pid_namespace(shim) -> None:
    pid = await shim.run_sandbox(options=_node_mode("pid"))
    assert ns_inode(pid, "pid") == ns_inode("self", "pid")
    assert _nspid(pid) == [pid]


async def test_given_netns_path_is_used_and_kept_at_shutdown(shim, given_netns) -> None:
    inode = os.stat(given_netns).st_ino
    pid = await shim.run_sandbox(netns_path=given_netns)
    assert ns_inode(pid, "net") == inode
    await shim.call("ShutdownSandbox")
    await shim.process.exited()
    assert os.stat(given_netns).st_ino == inode
    assert mounts_naming(os.path.basename(given_netns))


# -- stop and wait ----------------------------------------------------------------------------


async def test_stop_with_a_timeout_sends_sigterm_and_catatonit_exits_0(shim) -> None:
    await shim.run_sandbox()
    await shim.call("StopSandbox", timeout_secs=30, timeout=10)
    assert (await shim.call("WaitSandbox"))["exit_status"] == 0


async def test_stop_with_timeout_0_kills_at_once(shim) -> None:
    await shim.run_sandbox()
    await shim.call("StopSandbox", timeout_secs=0)
    assert (await shim.call("WaitSandbox"))["exit_status"] == 137


async def test_stop_of_a_never_started_sandbox_succeeds(shim) -> None:
    await shim.call("CreateSandbox")
    assert await shim.call("StopSandbox") == {}
    assert (await shim.call("SandboxStatus"))["state"] == "stopped"
    assert (await shim.call("WaitSandbox"))["exit_status"] == 0


async def test_stop_twice_succeeds(shim) -> None:
    pause = ProcessRef(await shim.run_sandbox())
    try:
        await shim.call("StopSandbox", timeout_secs=0)
        assert await shim.call("StopSandbox", timeout_secs=0) == {}
        assert pause.has_exited()
    finally:
        pause.close()


async def test_wait_returns_at_once_after_exit(shim) -> None:
    await shim.run_sandbox()
    await shim.call("StopSandbox", timeout_secs=0)
    first = await shim.call("WaitSandbox")
    assert await shim.call("WaitSandbox", timeout=1) == first


async def test_builtin_pause_runs_and_exits_0_on_sigterm(shim) -> None:
    pid = await shim.run_sandbox(options={"pause_binary": "builtin"})
    assert (await shim.info())["pause_binary"] == "builtin"
    assert _nspid(pid) == [pid, 1]
    await shim.call("StopSandbox", timeout_secs=30, timeout=10)
    assert (await shim.call("WaitSandbox"))["exit_status"] == 0


# -- events -----------------------------------------------------------------------------------


async def test_every_step_publishes_its_event(shim) -> None:
    events = await EventStream.open(shim, await shim.connect())
    try:
        await shim.call("CreateSandbox")
        created = await events.next("/sandbox/create")
        assert created["event"]["netns_path"].startswith("/var/run/netns/podshim-")
        assert (created["namespace"], created["sandbox_id"]) == (shim.namespace, shim.sandbox_id)
        assert (await events.next("/sandbox/state"))["event"] == {"state": "created"}
        pid = (await shim.call("StartSandbox"))["pid"]
        assert (await events.next("/sandbox/start"))["event"] == {"pid": pid}
        assert (await events.next("/sandbox/state"))["event"] == {"state": "running"}
        await shim.call("StopSandbox", timeout_secs=0)
        assert (await events.next("/sandbox/exit"))["event"]["exit_status"] == 137
        assert (await events.next("/sandbox/state"))["event"] == {"state": "stopped"}
    finally:
        await events.aclose()


# -- shutdown ---------------------------------------------------------------------------------


async def test_shutdown_removes_what_the_sandbox_made_and_the_shim_exits(shim) -> None:
    pause = ProcessRef(await shim.run_sandbox())
    made = await shim.footprint()
    try:
        assert await shim.call("ShutdownSandbox") == {}
        await shim.process.exited()
        assert pause.has_exited()
    finally:
        pause.close()
    assert made.netns_path and made.cgroup_dirs
    assert made.remains() == []
    assert spare_state_files(shim.bundle) == []


async def test_shutdown_before_create_ends_the_shim(shim) -> None:
    assert await shim.call("ShutdownSandbox") == {}
    await shim.process.exited()
    assert not os.path.lexists(shim.socket_path)


_SERVE_TELLING_THE_CLOSE = """
import os, sys
from shim import daemon
from shim.launch.spawn import bind_listener
from shim.sandbox.sandbox import ShimConfig
namespace, sandbox_id, bundle, socket_path, runtime_root = sys.argv[1:6]
close_server = daemon._Shim._close_server

async def telling(self):
    print("socket there when the server closes:", os.path.lexists(socket_path), flush=True)
    await close_server(self)

daemon._Shim._close_server = telling
listener = bind_listener(socket_path)
print("listening", flush=True)
daemon.serve_forever(ShimConfig(namespace, sandbox_id, bundle, socket_path, runtime_root), listener)
"""


def test_a_shim_removes_its_socket_before_it_stops_listening(tmp_path):
    # Once it stops listening, a Spawn of the same sandbox may take the path (a socket nobody
    # accepts on is stale): a shim that unlinked it afterwards could remove the next shim's.
    from shim.api.names import SANDBOX_SERVICE
    from shim.api.paths import socket_path
    from shim.rpc import blocking

    bundle, runtime_root = str(tmp_path / "bundle"), str(tmp_path / "run")
    os.makedirs(bundle, mode=0o700)
    path = socket_path("it", "sock1", runtime_root)
    proc = subprocess.Popen([sys.executable, "-c", _SERVE_TELLING_THE_CLOSE, "it", "sock1", bundle, path,
                             runtime_root], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout.readline() == "listening\n", "the shim did not come up"
        assert blocking.call("unix://" + path, SANDBOX_SERVICE, "ShutdownSandbox", {"sandbox_id": "sock1"}) == {}
        assert proc.wait(WAIT) == 0
        assert proc.stdout.read() == "socket there when the server closes: False\n"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


async def test_shutdown_of_a_created_sandbox_removes_its_netns(shim) -> None:
    await shim.call("CreateSandbox")
    path = (await shim.info())["netns_path"]
    assert os.path.exists(path)
    await shim.call("ShutdownSandbox")
    await shim.process.exited()
    assert not os.path.lexists(path) and not mounts_naming(os.path.basename(path))
