"""OCI runtime backends: config.json as containerd's sandbox spec, and pods run by runc and crun.

The spec tests are pure. The pod tests run for real, once per runtime handler; a runtime is
skipped only when its binary is not installed (.ci/install installs both).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from shim.api.defaults import CATATONIT
from shim.kernel import devices, linux
from shim.kernel.reaper import Reaper
from shim.launch.template import stop_template
from shim.lib.files import flock_open
from shim.lib.idmaps import UserNamespace
from shim.rpc.status import AlreadyExists, DeadlineExceeded, FailedPrecondition, Internal, InvalidArgument, NotFound
from shim.runtime import pause, process
from shim.runtime.mounts import BindMount
from shim.runtime.oci import cli
from shim.runtime.oci import rootfs as pause_rootfs
from shim.runtime.oci import spec as specs

from support.podtools import node_container, ns_inode, pod_config, pod_service, shows_notready
from support.proctools import alive, wait_gone_async

HANDLERS = ["native", "runc", "crun"]
SETTLE = 10.0  # a bound for waiting on the machine, never a readiness sleep
NETNS = "/var/run/netns/podshim-test"


def runtime_binary(handler: str) -> str | None:
    return shutil.which(handler, path=os.pathsep.join([os.environ.get("PATH", ""), process.DEFAULT_PATH]))


def installed(handler: str) -> str:
    """``handler``, or a skip saying that its binary is not installed (the only reason to skip)."""
    if handler != "native" and runtime_binary(handler) is None:
        pytest.skip(f"{handler} is not installed (no {handler} binary in PATH or {process.DEFAULT_PATH})")
    return handler


@pytest.fixture(params=HANDLERS)
def handler(request) -> str:
    """Each runtime handler."""
    return installed(request.param)


@pytest.fixture(params=["runc", "crun"])
def oci_handler(request) -> str:
    """Each OCI runtime handler."""
    return installed(request.param)


def by_type(namespaces: list[dict]) -> dict[str, str | None]:
    return {ns["type"]: ns.get("path") for ns in namespaces}


def mount_at(spec: dict, destination: str) -> dict | None:
    return next((m for m in spec["mounts"] if m["destination"] == destination), None)


# -- the pause container's spec ----------------------------------------------------------------------


def test_sandbox_spec_runs_catatonit_pause_mode_on_a_read_only_root() -> None:
    spec = specs.sandbox_spec(sandbox_id="sb", rootfs="/run/podshim/pause-rootfs", netns_path=NETNS)
    assert spec["root"] == {"path": "/run/podshim/pause-rootfs", "readonly": True}
    proc = spec["process"]
    assert proc["args"] == ["/pause", "-P"] and proc["cwd"] == "/" and proc["terminal"] is False
    assert proc["user"] == {"uid": 0, "gid": 0} and proc["noNewPrivileges"] is True
    assert proc["env"] == [f"PATH={process.DEFAULT_PATH}"]
    assert proc["oomScoreAdj"] == -998


@pytest.mark.parametrize(("env", "runs_with"), [
    ((), [f"PATH={process.DEFAULT_PATH}"]),
    (("A=1",), ["A=1", f"PATH={process.DEFAULT_PATH}"]),
    (("PATH=/bin", "A=1"), ["PATH=/bin", "A=1"]),
    (("A=1", "A=2"), ["A=2", f"PATH={process.DEFAULT_PATH}"]),  # the last of a name wins, in the first one's place
    (("A=1", "PATH=/bin", "PATH=/sbin"), ["A=1", "PATH=/sbin"]),
    (("B=x=y", "A=", "B=z"), ["B=z", "A=", f"PATH={process.DEFAULT_PATH}"])])
def test_a_sandbox_images_pause_gets_the_environment_the_native_handler_gives_it(env, runs_with) -> None:
    spec = specs.sandbox_spec(sandbox_id="sb", rootfs="/r", netns_path=NETNS, args=("/p",), env=env)
    native = pause.PauseSpec(rootfs="/r", args=("/p",), env=env).env_map
    assert spec["process"]["env"] == runs_with
    assert [f"{name}={value}" for name, value in native.items()] == runs_with


def test_every_pause_says_its_pods_device_rules_and_a_privileged_pods_allows_every_device() -> None:
    spec = specs.sandbox_spec(sandbox_id="sb", rootfs="/r", netns_path=NETNS)
    assert spec["linux"]["resources"] == {"devices": devices.DEFAULT_RULES.to_oci()}
    assert spec["linux"]["resources"]["devices"][0] == {"allow": False, "access": "rwm"}  # containerd's deny-all
    spec = specs.sandbox_spec(sandbox_id="sb", rootfs="/r", netns_path=NETNS, privileged=True)
    assert spec["linux"]["resources"] == {"devices": [{"allow": True, "access": "rwm"}]}


def test_a_task_says_the_device_rules_it_is_given():
    fields = dict(sandbox_id="sb", args=["true"], env={}, cwd="/", rootfs="/b/rootfs", pause_pid=42, pid_mode="POD",
                  own_ipc=True, privileged=True)
    assert specs.task_spec(**fields)["linux"]["resources"] == {"devices": devices.DEFAULT_RULES.to_oci()}
    assert specs.task_spec(**fields, device_rules=devices.ALL_DEVICES)["linux"]["resources"] == {
        "devices": [{"allow": True, "access": "rwm"}]}


def test_pod_modes_give_new_pid_ipc_uts_mount_namespaces_and_join_the_netns() -> None:
    spec = specs.sandbox_spec(sandbox_id="sb", rootfs="/r", netns_path=NETNS, hostname="web")
    assert by_type(spec["linux"]["namespaces"]) == {"pid": None, "ipc": None, "uts": None, "mount": None,
                                                    "network": NETNS}
    assert spec["hostname"] == "web"


def test_host_network_drops_the_network_and_uts_namespaces_and_the_hostname() -> None:
    spec = specs.sandbox_spec(sandbox_id="sb", rootfs="/r", netns_path=None, hostname="web")
    assert set(by_type(spec["linux"]["namespaces"])) == {"pid", "ipc", "mount"}
    assert "hostname" not in spec


@pytest.mark.parametrize("pid_mode, ipc_mode, dropped", [("NODE", "POD", "pid"), ("POD", "NODE", "ipc")])
def test_node_pid_or_ipc_mode_drops_that_namespace(pid_mode, ipc_mode, dropped) -> None:
    spec = specs.sandbox_spec(sandbox_id="sb", rootfs="/r", netns_path=NETNS, pid_mode=pid_mode, ipc_mode=ipc_mode)
    kinds = set(by_type(spec["linux"]["namespaces"]))
    assert dropped not in kinds and kinds == {"pid", "ipc", "uts", "mount", "network"} - {dropped}


def test_dev_shm_is_a_64_mib_tmpfs_only_with_an_own_ipc_namespace():
    own = mount_at(specs.sandbox_spec(sandbox_id="sb", rootfs="/r", netns_path=NETNS), "/dev/shm")
    assert own["type"] == "tmpfs"
    assert {"mode=1777", f"size={64 << 20}", "nosuid", "nodev", "noexec"} <= set(own["options"])
    hosts = mount_at(specs.sandbox_spec(sandbox_id="sb", rootfs="/r", netns_path=NETNS, ipc_mode="NODE"), "/dev/shm")
    assert hosts["type"] == "bind" and hosts["source"] == "/dev/shm"  # the host's, as containerd does


def test_standard_mounts_and_runcs_masked_and_read_only_paths():
    spec = specs.sandbox_spec(sandbox_id="sb", rootfs="/r", netns_path=NETNS)
    assert mount_at(spec, "/proc")["type"] == "proc"
    assert mount_at(spec, "/dev")["type"] == "tmpfs"
    assert mount_at(spec, "/dev/pts")["type"] == "devpts"
    assert mount_at(spec, "/sys")["type"] == "sysfs" and "ro" in mount_at(spec, "/sys")["options"]
    assert "/proc/kcore" in spec["linux"]["maskedPaths"] and "/sys/firmware" in spec["linux"]["maskedPaths"]
    assert spec["linux"]["readonlyPaths"] == ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


def test_sysctls_and_cgroups_path_are_passed() -> None:
    spec = specs.sandbox_spec(sandbox_id="sb", rootfs="/r", netns_path=NETNS, cgroups_path="podshim/sb",
                            sysctls={"net.ipv4.ip_unprivileged_port_start": "0", "kernel.shmmax": "65536"})
    assert spec["linux"]["sysctl"] == {"net.ipv4.ip_unprivileged_port_start": "0", "kernel.shmmax": "65536"}
    assert spec["linux"]["cgroupsPath"] == "podshim/sb"


@pytest.mark.parametrize("sysctls, kwargs", [
    ({"kernel.pid_max": "4096"}, {"netns_path": NETNS}),            # not namespaced
    ({"net.ipv4.ip_forward": "1"}, {"netns_path": None}),           # host network
    ({"kernel.shmmax": "65536"}, {"netns_path": NETNS, "ipc_mode": "NODE"}),  # host IPC
])
def test_sysctls_that_would_change_the_host_are_refused(sysctls, kwargs) -> None:
    with pytest.raises(InvalidArgument, match="sysctl"):
        specs.sandbox_spec(sandbox_id="sb", rootfs="/r", sysctls=sysctls, **kwargs)


def test_oom_score_adj_none_leaves_it_to_the_runtime() -> None:
    spec = specs.sandbox_spec(sandbox_id="sb", rootfs="/r", netns_path=NETNS, oom_score_adj=None)
    assert "oomScoreAdj" not in spec["process"]


def test_lowering_oom_score_adj_is_permitted_only_with_cap_sys_resource(tmp_path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tx\nCapEff:\t000001fffeffffff\n")  # this machine: every capability but 24
    assert not linux.oom_score_adj_permitted(-998, str(status))
    status.write_text("Name:\tx\nCapEff:\t000001ffffffffff\n")
    assert linux.oom_score_adj_permitted(-998, str(status))
    with open("/proc/self/oom_score_adj") as f:
        own = int(f.read())
    assert linux.oom_score_adj_permitted(own, "/nonexistent")  # not lowering needs nothing


def test_task_spec_says_the_resources_runc_applies_and_the_process_oom_score_adj() -> None:
    spec = specs.task_spec(sandbox_id="sb", args=["true"], env={}, cwd="/", rootfs="/b/rootfs", pause_pid=42,
                           pid_mode="CONTAINER", own_ipc=True, oom_score_adj=500,
                           resources={"cpu_shares": 512, "cpu_quota_us": 25000, "cpu_period_us": 50000,
                                      "memory_limit_bytes": 1 << 26, "memory_swap_limit_bytes": 1 << 27,
                                      "cpuset_cpus": "0", "pids_limit": 30, "hugepage_limits": {"2MB": 0},
                                      "unified": {"memory.high": "1G"}})
    assert spec["process"]["oomScoreAdj"] == 500
    # Hugepage limits and unified are the shim's own writes (runc refuses them where not mounted / on v1).
    said = {key: value for key, value in spec["linux"]["resources"].items() if key != "devices"}
    assert said == {"cpu": {"shares": 512, "quota": 25000, "period": 50000, "cpus": "0"},
                    "memory": {"limit": 1 << 26, "swap": 1 << 27}, "pids": {"limit": 30}}


def test_task_spec_says_the_unified_map_where_the_cgroups_are_v2() -> None:
    # There the runtime's systemd driver makes the scope and says as unit properties what systemd
    # owns (pids.max as TasksMax): the shim's file write would be undone by systemd.
    spec = specs.task_spec(sandbox_id="sb", args=["true"], env={}, cwd="/", rootfs="/b/rootfs", pause_pid=42,
                           pid_mode="CONTAINER", own_ipc=True, unified_cgroups=True,
                           resources={"pids_limit": 30, "hugepage_limits": {"2MB": 0},
                                      "unified": {"pids.max": "12", "memory.high": "1G"}})
    said = {key: value for key, value in spec["linux"]["resources"].items() if key != "devices"}
    assert said == {"pids": {"limit": 30}, "unified": {"pids.max": "12", "memory.high": "1G"}}


def test_task_spec_joins_the_pause_namespaces_by_path() -> None:
    spec = specs.task_spec(sandbox_id="sb", args=["sh", "-c", "true"], env={"PATH": "/bin"}, cwd="/", rootfs="/b/rootfs",
                         pause_pid=42, pid_mode="CONTAINER", own_ipc=True, cgroups_path="podshim/sb/t")
    assert by_type(spec["linux"]["namespaces"]) == {"mount": None, "network": "/proc/42/ns/net",
                                                    "ipc": "/proc/42/ns/ipc", "uts": "/proc/42/ns/uts", "pid": None}
    assert spec["root"] == {"path": "/b/rootfs", "readonly": True} and "hostname" not in spec
    assert spec["process"]["args"] == ["sh", "-c", "true"] and spec["process"]["env"] == ["PATH=/bin"]
    pod = specs.task_spec(sandbox_id="sb", args=["true"], env={}, cwd="/", rootfs="/b/rootfs", pause_pid=42,
                        pid_mode="POD", own_ipc=True)
    assert by_type(pod["linux"]["namespaces"])["pid"] == "/proc/42/ns/pid"



POD_USERNS = UserNamespace.from_payload({"uids": [{"container_id": 0, "host_id": 100000, "length": 65536}],
                                         "gids": [{"container_id": 0, "host_id": 200000, "length": 65536}]})
MAPPINGS = {"uidMappings": [{"containerID": 0, "hostID": 100000, "size": 65536}],
            "gidMappings": [{"containerID": 0, "hostID": 200000, "size": 65536}]}


def test_a_pause_in_a_user_namespace_makes_it_with_the_pods_mappings_in_cnis_network_namespace() -> None:
    doc = specs.with_user_namespace(specs.sandbox_spec(sandbox_id="sb", rootfs="/r", netns_path="/run/netns/n"),
                                    POD_USERNS, sysfs_source="/b/userns/pause/sys")
    assert by_type(doc["linux"]["namespaces"]) == {"mount": None, "pid": None, "ipc": None, "uts": None,
                                                   "network": "/run/netns/n", "user": None}
    assert {key: doc["linux"][key] for key in MAPPINGS} == MAPPINGS
    # The host's sysfs the shim took, read-only: the user namespace may not mount CNI's namespace's.
    assert [m for m in doc["mounts"] if m["destination"] == "/sys"] == [
        {"destination": "/sys", "type": "bind", "source": "/b/userns/pause/sys",
         "options": ["rbind", "nosuid", "noexec", "nodev", "ro"]}]


def test_a_task_in_a_user_namespace_joins_the_pauses_and_leaves_the_network_namespace_out() -> None:
    doc = specs.with_user_namespace(specs.task_spec(sandbox_id="sb", args=["true"], env={}, cwd="/", rootfs="/b/r",
                                                    pause_pid=42, pid_mode="POD", own_ipc=True),
                                    POD_USERNS, sysfs_source="/b/userns/task-t/sys", pause_pid=42)
    # The runtime runs in the pod's network namespace: runc joins the user namespace first.
    assert by_type(doc["linux"]["namespaces"]) == {"mount": None, "ipc": "/proc/42/ns/ipc", "uts": "/proc/42/ns/uts",
                                                   "pid": "/proc/42/ns/pid", "user": "/proc/42/ns/user"}
    assert {key: doc["linux"][key] for key in MAPPINGS} == MAPPINGS


# -- the pause rootfs ----------------------------------------------------------------------------------


def test_pause_rootfs_is_built_once_with_the_static_catatonit(tmp_path) -> None:
    if not os.access(CATATONIT, os.X_OK):
        pytest.skip("catatonit is not installed")
    root = str(tmp_path / "run")
    rootfs = pause_rootfs.ensure_pause_rootfs(root)
    assert rootfs == os.path.join(root, pause_rootfs.PAUSE_ROOTFS_DIR)
    assert sorted(os.listdir(rootfs)) == ["dev", "pause", "proc", "sys"]
    with open(os.path.join(rootfs, "pause"), "rb") as a, open(CATATONIT, "rb") as b:
        assert a.read() == b.read()
    inode = os.stat(rootfs).st_ino
    assert pause_rootfs.ensure_pause_rootfs(root) == rootfs and os.stat(rootfs).st_ino == inode
    assert os.listdir(root) == [pause_rootfs.PAUSE_ROOTFS_DIR]  # no temporary directory left


def test_pause_rootfs_refuses_a_missing_or_dynamically_linked_pause(tmp_path) -> None:
    with pytest.raises(FailedPrecondition, match="catatonit"):
        pause_rootfs.ensure_pause_rootfs(str(tmp_path / "a"), source=str(tmp_path / "no-such"))
    sh = shutil.which("sh")
    assert sh is not None
    with pytest.raises(FailedPrecondition, match="dynamically linked"):
        pause_rootfs.ensure_pause_rootfs(str(tmp_path / "b"), source=os.path.realpath(sh))
    assert not os.path.exists(tmp_path / "b" / pause_rootfs.PAUSE_ROOTFS_DIR)


# -- a runtime on its own -------------------------------------------------------------------------------


async def test_runtime_create_start_state_kill_delete(oci_handler, reaper: Reaper, tmp_path) -> None:
    handler = oci_handler
    runtime_root = f"/tmp/podshim-oci-{secrets.token_hex(4)}"
    runtime = cli.OciCli.find(handler, os.path.join(runtime_root, handler), reaper=reaper)
    bundle = str(tmp_path / "bundle")
    os.makedirs(bundle)
    container = cli.Container(f"t-{secrets.token_hex(4)}", bundle)
    spec = specs.sandbox_spec(sandbox_id=container.container_id, rootfs=pause_rootfs.ensure_pause_rootfs(runtime_root),
                            netns_path=None, oom_score_adj=None)
    with open(os.path.join(bundle, "config.json"), "w") as f:
        json.dump(spec, f)
    try:
        pid = await runtime.create(container)
        exit_future = reaper.watch(pid)
        assert (await runtime.state(container))["status"] == "created"
        await runtime.start(container)
        await pause.wait_ready(pid, exit_future, specs.PAUSE_NAME)
        assert (await runtime.state(container))["status"] == "running"
        await runtime.kill(container, signal.SIGKILL)
        assert (await asyncio.wait_for(exit_future, SETTLE)).exit_status == 128 + signal.SIGKILL
        assert (await runtime.state(container))["status"] == "stopped"
        await runtime.delete(container)
        with pytest.raises(NotFound, match=f"{handler} state {container.container_id} failed: .*"):
            await runtime.state(container)
        await runtime.delete(container, force=True)  # a container the runtime does not know: fine
    finally:
        runtime.delete_now(container)
        shutil.rmtree(runtime_root, ignore_errors=True)


def fake_runtime(tmp_path, body: str) -> cli.OciCli:
    """A "runc" that is a shell script: ``$log`` is the --log file it was given."""
    script = tmp_path / "runc"
    script.write_text('#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = --log ] && log=$2; shift; done\n' + body + "\n")
    script.chmod(0o755)
    return cli.OciCli("runc", str(script), str(tmp_path / "state"))


@pytest.mark.parametrize("verb, logged, error", [
    ("start", 'container \\"x\\" does not exist', NotFound),
    ("start", "container with id exists: x already exists", AlreadyExists),
    ("start", "unable to apply cgroup configuration: write failed", Internal),
    ("create", "runc create failed: unable to start container process: exec: /no/such: no such file or directory",
     FailedPrecondition),  # the program's fault...
    ("create", "executable file /no/such not found in PATH: No such file or directory", FailedPrecondition),
    ("create", "nsexec[7]: failed to update /proc/self/oom_score_adj: Permission denied", Internal),  # ...or not
])
async def test_a_failed_call_is_a_typed_status_with_the_runtimes_words(verb, logged, error, reaper: Reaper,
                                                                        tmp_path) -> None:
    runtime = fake_runtime(tmp_path, f"echo '{{\"level\":\"error\",\"msg\":\"{logged}\"}}' >> \"$log\"; exit 1")
    runtime.reaper = reaper
    with pytest.raises(error, match=rf"runc {verb} x failed: .*{re.escape(logged.split()[-1])}"):
        await getattr(runtime, verb)(cli.Container("x", str(tmp_path)))


async def test_a_call_past_its_timeout_is_killed_and_deadline_exceeded(reaper: Reaper, tmp_path, monkeypatch) -> None:
    runtime = fake_runtime(tmp_path, "echo $$ > \"$log.pid\"; exec sleep 3600")
    runtime.reaper = reaper
    monkeypatch.setattr(cli, "START_TIMEOUT", 0.3)
    with pytest.raises(DeadlineExceeded, match="runc start x did not finish within 0.3 s"):
        async with asyncio.timeout(SETTLE):
            await runtime.start(cli.Container("x", str(tmp_path)))
    with open(tmp_path / "log.json.pid") as f:
        assert not alive(int(f.read()))  # killed, not left to sleep


# -- pods, for real, per handler -----------------------------------------------------------------------------


def runtime_containers(handler: str, runtime_root: str) -> list[str]:
    """Container ids in the runtime's state directory for the pod namespace (`<runtime> list -q`)."""
    root = os.path.join(runtime_root, handler, "k8s.io")
    if handler == "native" or not os.path.isdir(root):
        return []
    binary = runtime_binary(handler)
    assert binary is not None, f"no {handler} binary"
    out = subprocess.run([binary, "--root", root, "list", "-q"], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    return out.split()


@pytest.fixture
def roots(tmp_path):
    runtime_root = f"/tmp/podshim-oci-{secrets.token_hex(4)}"
    yield str(tmp_path / "root"), runtime_root
    stop_template(runtime_root)  # the Controller's default template, if one started
    # Whatever a failed test left in the runtime's state goes, then the roots (no mounts live there).
    for handler in ("runc", "crun"):
        if runtime_binary(handler):
            for container_id in runtime_containers(handler, runtime_root):
                subprocess.run([runtime_binary(handler), "--root", os.path.join(runtime_root, handler, "k8s.io"),
                                "delete", "--force", container_id], capture_output=True, timeout=30)
    shutil.rmtree(runtime_root, ignore_errors=True)


def nspid(pid: int) -> list[int]:
    with open(f"/proc/{pid}/status") as f:
        return [int(n) for line in f if line.startswith("NSpid:") for n in line.split()[1:]]


async def wait_exited(pods, container_id: str) -> dict:
    deadline = time.monotonic() + SETTLE
    while (status := await pods.container_status(container_id))["state"] != "CONTAINER_EXITED":
        assert time.monotonic() < deadline, status
        await asyncio.sleep(0.02)
    return status


async def test_pod_lifecycle_through_the_runtime_leaves_nothing(handler, roots) -> None:
    _, runtime_root = roots
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config(), runtime_handler=handler)
        status = await pods.pod_sandbox_status(pod_id, verbose=True)
        assert status["state"] == "SANDBOX_READY" and status["runtime_handler"] == handler
        info = status["info"]
        shim_info = info["shim"]
        assert shim_info["runtime_handler"] == handler
        pause_pid = info["pid"]
        assert nspid(pause_pid)[-1] == 1  # PID 1 of its own pid namespace
        assert ns_inode(pause_pid, "net") == os.stat(info["netns_path"]).st_ino
        cgroup_dirs = [v for k, v in shim_info.items() if k.startswith("cgroup.")]
        for directory in cgroup_dirs:  # the directories metrics, kill and cleanup use hold the pause
            with open(os.path.join(directory, "cgroup.procs")) as f:
                assert str(pause_pid) in f.read().split(), directory
        if handler != "native":
            assert runtime_containers(handler, runtime_root) == [pod_id]
            assert shim_info["oci.runtime"] == handler and shim_info["pause_binary"].endswith("/pause")

        # The container prints what it shares; it has exited by the time the test reads it.
        cid = await pods.create_container(pod_id, node_container(
            ["sh", "-c", "hostname; readlink /proc/self/ns/net /proc/self/ns/ipc /proc/self/ns/uts /proc/self/ns/pid;"
             " exit 3"]))
        await pods.start_container(cid)
        exited = await wait_exited(pods, cid)
        assert exited["exit_code"] == 3
        with open(pods.container_log_path(cid)) as f:
            records = [line.rstrip("\n").split(" ", 3) for line in f]
        assert all(r[0].endswith("Z") and r[1] == "stdout" and r[2] == "F" for r in records), records
        lines = [r[3] for r in records]
        assert lines[0] == "podshim-demo"  # the pod's hostname: the pause's UTS namespace
        for line, kind in zip(lines[1:4], ("net", "ipc", "uts"), strict=False):
            assert line == f"{kind}:[{ns_inode(pause_pid, kind)}]", (kind, lines)
        assert lines[4] != f"pid:[{ns_inode(pause_pid, 'pid')}]"  # CONTAINER pid mode: a pid ns of its own

        shim_pid = int(shim_info["shim_pid"])
        await pods.stop_pod_sandbox(pod_id)
        assert (await pods.pod_sandbox_status(pod_id))["state"] == "SANDBOX_NOTREADY"
        assert not await wait_gone_async(pause_pid, timeout=SETTLE)
        await pods.remove_pod_sandbox(pod_id)
        assert not await wait_gone_async(shim_pid, timeout=SETTLE)
        assert not os.path.exists(info["netns_path"])
        assert cgroup_dirs and not [d for d in cgroup_dirs if os.path.exists(d)]
        assert runtime_containers(handler, runtime_root) == []
        state_dir = os.path.join(runtime_root, handler, "k8s.io")
        assert not os.path.isdir(state_dir) or os.listdir(state_dir) == []


async def test_a_container_in_pod_pid_mode_shares_the_pause_pid_namespace(handler, roots) -> None:
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config(), runtime_handler=handler)
        pause_pid = (await pods.pod_sandbox_status(pod_id, verbose=True))["info"]["pid"]
        cid = await pods.create_container(pod_id, node_container(["sleep", "30"], pid=0))
        await pods.start_container(cid)
        pid = (await pods.container_status(cid, verbose=True))["info"]["pid"]
        assert ns_inode(pid, "pid") == ns_inode(pause_pid, "pid")
        await pods.stop_container(cid, timeout=0)
        assert (await pods.container_status(cid))["exit_code"] == 128 + signal.SIGKILL


async def test_a_host_network_pod_keeps_the_host_network_and_uts_namespaces(handler, roots) -> None:
    async with pod_service(roots) as pods:
        cfg = pod_config(network=2)
        cfg["linux"]["sysctls"] = {}
        pod_id = await pods.run_pod_sandbox(cfg, runtime_handler=handler)
        pause_pid = (await pods.pod_sandbox_status(pod_id, verbose=True))["info"]["pid"]
        for kind in ("net", "uts"):
            assert ns_inode(pause_pid, kind) == ns_inode(os.getpid(), kind), kind
        assert ns_inode(pause_pid, "ipc") != ns_inode(os.getpid(), "ipc")


async def test_a_program_that_cannot_run_fails_start_with_the_runtimes_words(oci_handler, roots) -> None:
    handler, runtime_root = oci_handler, roots[1]
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config(), runtime_handler=handler)
        cid = await pods.create_container(pod_id, node_container(["/no/such/program"]))
        with pytest.raises(FailedPrecondition, match=f"{handler} create .*/no/such/program"):
            await pods.start_container(cid)
        assert runtime_containers(handler, runtime_root) == [pod_id]  # the task's container is gone


async def test_podshim_delete_after_the_shim_was_killed_deletes_the_runtime_containers(oci_handler, roots) -> None:
    handler, runtime_root = oci_handler, roots[1]
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config(), runtime_handler=oci_handler)
        cid = await pods.create_container(pod_id, node_container(["sleep", "60"]))
        await pods.start_container(cid)
        task_pid = (await pods.container_status(cid, verbose=True))["info"]["pid"]
        info = (await pods.pod_sandbox_status(pod_id, verbose=True))["info"]
        shim_info = info["shim"]
        cgroup_dirs = [v for k, v in shim_info.items() if k.startswith("cgroup.")]
        assert sorted(runtime_containers(handler, runtime_root)) == [pod_id, f"{pod_id}+{cid}"]
        # The bundle's flock held here is "another process cleaning up": the Controller that
        # notices the dead shim leaves the pause and the task to us and only marks the pod.
        with flock_open(shim_info["bundle"], blocking=False, create=False) as held:
            assert held is not None
            os.kill(int(shim_info["shim_pid"]), signal.SIGKILL)
            assert not await wait_gone_async(int(shim_info["shim_pid"]), timeout=SETTLE)
            await shows_notready(pods, pod_id, SETTLE)
            assert alive(info["pid"]) and alive(task_pid)  # the pause and the task outlive their shim

            done = subprocess.run([sys.executable, "-m", "shim", "delete", "--namespace", "k8s.io", "--id", pod_id,
                                   "--bundle", shim_info["bundle"], "--runtime-root", runtime_root],
                                  capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["exit_status"] == 128 + signal.SIGKILL
        assert runtime_containers(handler, runtime_root) == []
        assert not await wait_gone_async(info["pid"], task_pid, timeout=SETTLE)
        assert not os.path.exists(info["netns_path"])
        assert not [d for d in cgroup_dirs if os.path.exists(d)]
        await pods.remove_pod_sandbox(pod_id)  # the pod layer still forgets it cleanly


async def test_an_unknown_runtime_handler_is_refused(roots) -> None:
    async with pod_service(roots) as pods:
        with pytest.raises(InvalidArgument, match="runtime handler"):
            await pods.run_pod_sandbox(pod_config(), runtime_handler="kata")
        assert pods.store.list() == []


def test_a_bind_whose_source_is_id_mapped_already_says_so_to_the_shim_only() -> None:
    bind = BindMount("/vol", "/state/image-volumes/p/i", ("rbind", "rprivate", "ro", "idmapped"))
    assert bind.idmapped and not BindMount("/vol", "/s", ("rbind",)).idmapped
    assert bind.to_oci() == {"destination": "/vol", "type": "bind", "source": "/state/image-volumes/p/i",
                             "options": ["rbind", "rprivate", "ro"]}


def test_a_root_the_pods_root_cannot_reach_is_refused_naming_the_directory() -> None:
    from shim.runtime.oci.userns import check_reachable
    top = tempfile.mkdtemp(prefix="podshim-reach-")  # right under /tmp: its parents let others search
    try:
        os.chmod(top, 0o711)
        closed = os.path.join(top, "closed")
        os.makedirs(os.path.join(closed, "bundle"))
        os.chmod(os.path.join(closed, "bundle"), 0o755)
        os.chmod(closed, 0o700)
        rootfs = os.path.join(closed, "bundle", "rootfs")
        with pytest.raises(FailedPrecondition, match=f"{closed} \\(mode 0700\\) does not let it search"):
            check_reachable(rootfs, POD_USERNS)
        os.chown(closed, -1, POD_USERNS.root_gid)
        os.chmod(closed, 0o710)  # the group of the pod's root may search it, as the shim opens its bundle
        check_reachable(rootfs, POD_USERNS)
    finally:
        shutil.rmtree(top)
