"""Exec, Stats, Update and ReopenLog of a running task, through a real shim, with each runtime
handler (native, runc, crun): checked on the kernel side (namespaces by inode, cgroup files, the
processes left) and on the log files."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import subprocess

import pytest

from shim.api.cgroups import expand_slice
from shim.kernel.cgroups import systemd
from shim.kernel.cgroups.hierarchies import discover_hierarchies, pure_v2
from shim.rpc import FailedPrecondition, InvalidArgument
from shim.runtime.execsync import EXEC_OUTPUT_LIMIT_BYTES

from support.proctools import fifo_writer, wait_gone_async
from support.shimtools import (
    WAIT,
    Shim,
    ShimLauncher,
    host_untouched,  # noqa: F401  (autouse: what this module's shims made is checked at the end)
    ns_inode,
)

HANDLERS = ["native"] + [h for h in ("runc", "crun") if shutil.which(h, path="/usr/sbin:/usr/bin:/sbin:/bin")]
#: Bound on waiting for killed processes to be gone (PID 1 reaps orphans slowly).
GONE_WAIT = 10.0


class Pod:
    """A running sandbox of one runtime handler, and helpers to run tasks in it."""

    def __init__(self, shim: Shim, cgroups: dict[str, str], log_dir: str):
        self.shim = shim
        self.cgroups = cgroups
        self.log_dir = log_dir
        self.call = shim.task  # a Task method for this sandbox

    def log_path(self, task_id: str) -> str:
        return os.path.join(self.log_dir, f"{task_id}.log")

    async def create(self, task_id: str, *args: str, **fields) -> None:
        await self.call("Create", task_id=task_id, args=list(args), log_path=self.log_path(task_id), **fields)

    async def run(self, task_id: str, *args: str, **fields) -> int:
        await self.create(task_id, *args, **fields)
        return (await self.call("Start", task_id=task_id))["pid"]

    def cgroup_file(self, task_id: str, controller: str, name: str) -> str:
        directory = next(path for key, path in self.cgroups.items() if controller in key.split(","))
        return os.path.join(directory, task_id, name)

    def task_pids(self, task_id: str) -> set[int]:
        with open(self.cgroup_file(task_id, "pids", "cgroup.procs")) as f:
            return {int(line) for line in f}


@pytest.fixture(params=HANDLERS)
async def pod(request, shims: ShimLauncher, tmp_path) -> Pod:
    shim = await shims.start()
    await shim.run_sandbox(options={"runtime_handler": request.param})
    info = await shim.info()
    cgroups = {key.removeprefix("cgroup."): path for key, path in info.items() if key.startswith("cgroup.")}
    return Pod(shim, cgroups, str(tmp_path))


def read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


# -- Exec --------------------------------------------------------------------------------------------

async def test_exec_returns_what_the_command_wrote_and_its_exit_status(pod) -> None:
    await pod.run("app", "sleep", "600")
    reply = await pod.call("Exec", task_id="app", args=["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert reply == {"exit_status": 3, "stdout": b"out\n", "stderr": b"err\n", "stdout_truncated": False,
                     "stderr_truncated": False, "timed_out": False}


async def test_exec_runs_in_the_tasks_namespaces_cgroup_environment_and_directory(pod) -> None:
    pid = await pod.run("app", "sleep", "600", env=["GREETING=hello"], cwd="/tmp")
    script = ("readlink /proc/self/ns/net /proc/self/ns/pid /proc/self/ns/mnt /proc/self/ns/uts; echo $GREETING; "
              "pwd; cat /proc/self/cgroup")
    lines = (await pod.call("Exec", task_id="app", args=["sh", "-c", script]))["stdout"].decode().splitlines()
    assert lines[:4] == [f"{kind}:[{ns_inode(pid, kind)}]" for kind in ("net", "pid", "mnt", "uts")]
    assert lines[4:6] == ["hello", "/tmp"]
    with open(f"/proc/{pid}/cgroup") as f:
        assert sorted(lines[6:]) == sorted(f.read().splitlines())


async def test_exec_output_past_the_limit_is_cut_and_flagged(pod) -> None:
    await pod.run("app", "sleep", "600")
    reply = await pod.call("Exec", task_id="app", args=["head", "-c", str(EXEC_OUTPUT_LIMIT_BYTES + 1), "/dev/zero"])
    assert (len(reply["stdout"]), reply["stdout_truncated"], reply["exit_status"]) == (EXEC_OUTPUT_LIMIT_BYTES, True, 0)


async def test_exec_past_its_timeout_is_killed_with_what_it_started(pod) -> None:
    pid = await pod.run("app", "sleep", "600")
    reply = await pod.call("Exec", task_id="app", timeout=WAIT + 2, timeout_secs=1,
                           args=["sh", "-c", "echo started; sleep 300 & sleep 300 & wait"])
    assert (reply["timed_out"], reply["exit_status"], reply["stdout"]) == (True, 137, b"started\n")
    assert not await wait_gone_async(*pod.task_pids("app") - {pid}, timeout=GONE_WAIT)
    assert pod.task_pids("app") == {pid}


async def test_exec_of_a_program_that_cannot_run_is_failed_precondition_and_leaves_no_process(pod) -> None:
    pid = await pod.run("app", "sleep", "600")
    with pytest.raises(FailedPrecondition, match="(?i)no such file"):
        await pod.call("Exec", task_id="app", args=["/no/such"])
    # crun runs in the task's cgroup (it has no cgroup manager here): its helper may still be exiting.
    assert not await wait_gone_async(*pod.task_pids("app") - {pid}, timeout=GONE_WAIT)
    assert pod.task_pids("app") == {pid}


async def test_exec_needs_a_running_task(pod) -> None:
    await pod.create("new", "true")
    with pytest.raises(FailedPrecondition, match="task new is not running: it has not been started"):
        await pod.call("Exec", task_id="new", args=["true"])
    await pod.run("done", "true")
    await pod.call("Wait", task_id="done")
    with pytest.raises(FailedPrecondition, match="task done is not running: it has exited"):
        await pod.call("Exec", task_id="done", args=["true"])


async def test_exec_with_bad_arguments_is_invalid(pod) -> None:
    await pod.run("app", "sleep", "600")
    with pytest.raises(InvalidArgument, match="field 'args' must be a non-empty array"):
        await pod.call("Exec", task_id="app", args=[])
    with pytest.raises(InvalidArgument, match="'timeout_secs' must not be negative"):
        await pod.call("Exec", task_id="app", args=["true"], timeout_secs=-1)


# -- Stats ---------------------------------------------------------------------------------------------

async def test_stats_are_the_task_cgroups_figures(pod) -> None:
    await pod.run("app", "sleep", "600")
    reply = await pod.call("Stats", task_id="app")
    data = reply["data"]
    assert reply["timestamp"] > 0 and data["unavailable"] == []
    assert data["pids_current"] == 1
    assert data["memory_usage_bytes"] >= data["memory_working_set_bytes"] >= 0
    assert int(read(pod.cgroup_file("app", "cpuacct", "cpuacct.usage"))) >= data["cpu_usage_ns"] > 0


async def test_stats_of_a_task_never_started_say_why_they_are_missing(pod) -> None:
    await pod.create("new", "true")
    data = (await pod.call("Stats", task_id="new"))["data"]
    assert data["unavailable"] == ["cgroup (the task was never started)"]
    assert data["memory_usage_bytes"] is None and data["cpu_usage_ns"] is None


# -- Create's resources ---------------------------------------------------------------------------------

#: What kubelet sends with every container that has requests and limits (its zero-valued hugepage
#: limits aside), as the shim's keys.
RESOURCES = {"cpu_shares": 512, "cpu_quota_us": 25000, "cpu_period_us": 50000, "memory_limit_bytes": 96 << 20,
             "cpuset_cpus": "0", "cpuset_mems": "0", "pids_limit": 30, "oom_score_adj": 500}


async def test_a_task_created_with_resources_has_them_in_its_cgroup_and_process_from_its_first_instruction(pod) -> None:
    # Its first act is to say its oom_score_adj: what it had when it began to run.
    pid = await pod.run("app", "sh", "-c", "cat /proc/self/oom_score_adj; exec sleep 600", resources=RESOURCES)
    assert read(pod.cgroup_file("app", "cpu", "cpu.shares")) == "512"
    assert read(pod.cgroup_file("app", "cpu", "cpu.cfs_quota_us")) == "25000"
    assert read(pod.cgroup_file("app", "cpu", "cpu.cfs_period_us")) == "50000"
    assert read(pod.cgroup_file("app", "memory", "memory.limit_in_bytes")) == str(96 << 20)
    assert read(pod.cgroup_file("app", "cpuset", "cpuset.cpus")) == "0"
    assert read(pod.cgroup_file("app", "cpuset", "cpuset.mems")) == "0"
    assert read(pod.cgroup_file("app", "pids", "pids.max")) == "30"
    assert read(f"/proc/{pid}/oom_score_adj") == "500"
    for _ in range(100):
        if os.path.exists(pod.log_path("app")) and read(pod.log_path("app")):
            break
        await asyncio.sleep(0.05)
    assert read(pod.log_path("app")).split(" ", 3)[3] == "500"


@pytest.mark.cgroupv2
async def test_on_pure_cgroup_v2_a_task_created_with_resources_has_them_in_its_v2_files(pod) -> None:
    await pod.run("app", "sleep", "600", resources={**RESOURCES, "memory_swap_limit_bytes": 128 << 20})
    v2 = os.path.join(pod.cgroups["unified"], "app")
    assert {name: read(os.path.join(v2, name)) for name in (
        "cpu.weight", "cpu.max", "memory.max", "memory.swap.max", "cpuset.cpus", "cpuset.mems", "pids.max")} == {
        "cpu.weight": "20", "cpu.max": "25000 50000", "memory.max": str(96 << 20), "memory.swap.max": str(32 << 20),
        "cpuset.cpus": "0", "cpuset.mems": "0", "pids.max": "30"}
    # The pod's cgroup hands its controllers to its tasks, so its pause is in a leaf of its own.
    assert read(os.path.join(pod.cgroups["unified"], ".pause", "cgroup.procs")) != ""
    assert read(os.path.join(pod.cgroups["unified"], "cgroup.procs")) == ""


@pytest.mark.cgroupv2
@pytest.mark.parametrize("handler", HANDLERS)
async def test_under_the_systemd_driver_a_pod_is_a_slice_with_its_pause_and_each_task_a_scope_and_nothing_is_left(
        handler, shims: ShimLauncher, tmp_path) -> None:
    top = f"podshimtest{secrets.token_hex(4)}"
    parent = f"{top}-burstable-pod{secrets.token_hex(4)}.slice"
    try:
        shim = await shims.start()
        await shim.run_sandbox(options={"runtime_handler": handler, "linux": {
            "cgroup_driver": "systemd", "cgroup_parent": parent, "resources": {"memory_limit_bytes": 256 << 20}}})
        pod_slice = systemd.pod_slice_name(parent, shim.namespace, shim.sandbox_id)
        directory = (await shim.info())["cgroup.unified"]
        assert directory == f"/sys/fs/cgroup{expand_slice(pod_slice)}"
        # The pod's resources: its slice's properties from its start.
        assert (_unit_property(pod_slice, "MemoryMax"), read(os.path.join(directory, "memory.max"))) == (
            str(256 << 20),) * 2
        # The pause, in a scope of its own that systemd knows (made by the shim, or by runc's or
        # crun's systemd driver); its placeholder gone.
        pause_unit = systemd.scope_name(shim.namespace, shim.sandbox_id)
        assert _unit_property(pause_unit, "ActiveState") == "active"
        assert len(_procs_below(os.path.join(directory, pause_unit))) == 1
        pod = Pod(shim, {"unified": directory}, str(tmp_path))
        await pod.run("app", "sleep", "600", resources={"cpu_quota_us": 25000, "cpu_period_us": 50000,
                                                        "memory_limit_bytes": 96 << 20})
        app_unit = systemd.scope_name(shim.namespace, shim.sandbox_id, "app")
        # crun runs its container in a sub-cgroup of the scope it starts, and limits that.
        app = os.path.join(directory, app_unit, *(["container"] if handler == "crun" else []))
        assert _unit_property(app_unit, "ActiveState") == "active"
        assert (read(os.path.join(app, "cpu.max")), read(os.path.join(app, "memory.max"))) == (
            "25000 50000", str(96 << 20))
        assert len(read(os.path.join(app, "cgroup.procs")).split()) == 1  # the task; its scope's holder aside
        assert len(read(os.path.join(directory, app_unit, ".hold", "cgroup.procs")).split()) == 1
        await pod.call("Update", task_id="app", resources={"memory_limit_bytes": 64 << 20})
        assert read(os.path.join(app, "memory.max")) == str(64 << 20)
        if handler != "crun":  # crun's scope has no limit of its own: its sub-cgroup has
            assert _unit_property(app_unit, "MemoryMax") == str(64 << 20)
        assert await shims.end(shim) == []
        assert not os.path.exists(directory)
        assert [_unit_property(unit, "ActiveState") for unit in (pod_slice, pause_unit, app_unit)] == ["inactive"] * 3
    finally:
        subprocess.run(["systemctl", "stop", f"{top}.slice"], capture_output=True, timeout=60)


@pytest.mark.cgroupv2
@pytest.mark.parametrize("handler", HANDLERS)
async def test_under_the_systemd_driver_a_killed_shims_units_are_stopped_by_its_cleanup(
        handler, shims: ShimLauncher, tmp_path) -> None:
    top = f"podshimtest{secrets.token_hex(4)}"
    try:
        shim = await shims.start()
        await shim.run_sandbox(options={"runtime_handler": handler,
                                        "linux": {"cgroup_driver": "systemd", "cgroup_parent": f"{top}-pod.slice"}})
        pod_slice = systemd.pod_slice_name(f"{top}-pod.slice", shim.namespace, shim.sandbox_id)
        directory = (await shim.info())["cgroup.unified"]
        await Pod(shim, {"unified": directory}, str(tmp_path)).run("app", "sleep", "600")
        app_unit = systemd.scope_name(shim.namespace, shim.sandbox_id, "app")
        shim.process.kill()
        await shim.process.exited()
        # The pause and the task hold theirs.
        assert [_unit_property(unit, "ActiveState") for unit in (pod_slice, app_unit)] == ["active"] * 2
        left = await shims.end(shim)  # `podshim delete`: the cleanup of a shim that is gone
        assert f"cgroup {directory}" in left
        assert not os.path.exists(directory)
        assert [_unit_property(unit, "ActiveState") for unit in (pod_slice, app_unit)] == ["inactive"] * 2
    finally:
        subprocess.run(["systemctl", "stop", f"{top}.slice"], capture_output=True, timeout=60)


def _procs_below(directory: str) -> list[str]:
    """The processes in cgroup ``directory`` and below it."""
    return [pid for root, _dirs, files in os.walk(directory) if "cgroup.procs" in files
            for pid in read(os.path.join(root, "cgroup.procs")).split()]


def _unit_property(unit: str, name: str) -> str:
    return subprocess.run(["systemctl", "show", "-p", name, "--value", unit], capture_output=True, text=True,
                          timeout=60).stdout.strip()


@pytest.mark.cgroupv2
async def test_on_cgroup_v2_a_task_sees_its_own_cgroup_as_the_root_of_its_cgroup_namespace(pod) -> None:
    await pod.run("app", "sh", "-c", "cat /proc/self/cgroup /sys/fs/cgroup/memory.max", resources={
        "memory_limit_bytes": 96 << 20})
    assert (await pod.call("Wait", task_id="app", timeout=60))["exit_status"] == 0
    said = [line.split(" ", 3)[3] for line in read(pod.log_path("app")).splitlines()]
    assert said == ["0::/", str(96 << 20)]


@pytest.mark.cgroupv2
async def test_on_cgroup_v2_an_exec_joins_its_tasks_cgroup_namespace(pod) -> None:
    await pod.run("app", "sleep", "600")
    reply = await pod.call("Exec", task_id="app", args=["cat", "/proc/self/cgroup"])
    assert (reply["exit_status"], reply["stdout"]) == (0, b"0::/\n")


@pytest.mark.cgroupv2
async def test_on_cgroup_v2_update_writes_the_tasks_v2_files_and_update_sandbox_the_pods(pod) -> None:
    await pod.run("app", "sleep", "600", resources={"memory_limit_bytes": 96 << 20})
    await pod.call("Update", task_id="app", resources={"cpu_shares": 1024, "cpu_quota_us": 50000,
                                                       "memory_limit_bytes": 64 << 20, "pids_limit": 20})
    app = os.path.join(pod.cgroups["unified"], "app")
    assert {name: read(os.path.join(app, name)) for name in ("cpu.weight", "cpu.max", "memory.max", "pids.max")} == {
        "cpu.weight": "39", "cpu.max": "50000 100000", "memory.max": str(64 << 20), "pids.max": "20"}
    await pod.shim.call("UpdateSandbox", resources={"memory_limit_bytes": 256 << 20, "cpu_quota_us": 200000,
                                                    "cpu_period_us": 100000})
    assert (read(os.path.join(pod.cgroups["unified"], "memory.max")),
            read(os.path.join(pod.cgroups["unified"], "cpu.max"))) == (str(256 << 20), "200000 100000")


@pytest.mark.cgroupv2
async def test_on_cgroup_v2_an_oom_kill_is_read_from_memory_events_and_reported_as_such(pod) -> None:
    await pod.run("app", "tail", "/dev/zero",
                  resources={"memory_limit_bytes": 16 << 20, "memory_swap_limit_bytes": 16 << 20})
    done = await pod.call("Wait", task_id="app", timeout=120)
    assert (done["exit_status"], done["oom_killed"]) == (137, True)
    events = dict(line.split() for line in read(os.path.join(pod.cgroups["unified"], "app", "memory.events"))
                  .splitlines())
    assert int(events["oom_kill"]) >= 1


async def test_a_task_that_allocates_past_its_memory_limit_is_killed_by_the_oom_killer_and_says_so(pod) -> None:
    # tail keeps what it read until a newline, and /dev/zero has none.
    await pod.run("app", "tail", "/dev/zero",
                  resources={"memory_limit_bytes": 16 << 20, "memory_swap_limit_bytes": 16 << 20})
    done = await pod.call("Wait", task_id="app", timeout=60)
    assert (done["exit_status"], done["oom_killed"]) == (137, True)
    assert (await pod.call("State", task_id="app"))["oom_killed"] is True


async def test_a_task_killed_otherwise_is_not_called_oom_killed(pod) -> None:
    await pod.run("app", "sleep", "600", resources={"memory_limit_bytes": 16 << 20})
    await pod.call("Kill", task_id="app", signal=9)
    done = await pod.call("Wait", task_id="app")
    assert (done["exit_status"], done["oom_killed"]) == (137, False)


@pytest.mark.parametrize("resources,named", [
    ({"unified": {"memory.max": "1G"}}, r"resources.unified\[memory.max\] cannot be applied: it is a cgroup v2 file"),
    ({"hugepage_limits": {"3MB": 0}}, r"resources.hugepage_limits\[3MB\] cannot be applied: this kernel has no 3MB"),
    ({"cpu_shares": 1}, "resources.cpu_shares 1 is out of range"),
    ({"oom_score_adj": 2000}, "resources.oom_score_adj 2000 is out of range"),
])
async def test_create_refuses_a_resource_the_host_cannot_apply_by_name_and_makes_nothing(pod, resources, named) -> None:
    with pytest.raises(InvalidArgument, match=named):
        await pod.create("app", "sleep", "600", resources=resources)
    assert (await pod.call("List"))["tasks"] == []


# -- Update --------------------------------------------------------------------------------------------

async def test_update_writes_the_task_cgroup(pod) -> None:
    await pod.run("app", "sleep", "600")
    await pod.call("Update", task_id="app", resources={"cpu_shares": 512, "memory_limit_bytes": 96 << 20,
                                                       "pids_limit": 20})
    assert read(pod.cgroup_file("app", "cpu", "cpu.shares")) == "512"
    assert read(pod.cgroup_file("app", "memory", "memory.limit_in_bytes")) == str(96 << 20)
    assert read(pod.cgroup_file("app", "pids", "pids.max")) == "20"


async def test_update_of_a_resource_the_host_cannot_apply_names_it_and_changes_nothing(pod) -> None:
    await pod.run("app", "sleep", "600")
    shares = read(pod.cgroup_file("app", "cpu", "cpu.shares"))
    with pytest.raises(InvalidArgument, match=r"resources.unified\[memory.high\] cannot be applied"):
        await pod.call("Update", task_id="app", resources={"cpu_shares": 300, "unified": {"memory.high": "1G"}})
    assert read(pod.cgroup_file("app", "cpu", "cpu.shares")) == shares


async def test_update_needs_a_running_task(pod) -> None:
    await pod.create("new", "true")
    with pytest.raises(FailedPrecondition, match="task new is not running"):
        await pod.call("Update", task_id="new", resources={"cpu_shares": 512})


# -- ReopenLog -----------------------------------------------------------------------------------------

async def test_reopen_log_writes_to_a_new_file_after_the_old_one_was_moved(pod, tmp_path) -> None:
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    await pod.run("app", "sh", "-c", f"echo before; read x < {fifo}; echo after")
    # The open returns once the task opened the FIFO: by then "before" is in its pipe.
    with os.fdopen(await asyncio.to_thread(fifo_writer, str(fifo), WAIT), "w") as go:
        os.rename(pod.log_path("app"), pod.log_path("app") + ".1")
        await pod.call("ReopenLog", task_id="app")
        go.write("x\n")
    await pod.call("Wait", task_id="app")
    assert [line.split(" ", 3)[3] for line in read(pod.log_path("app") + ".1").splitlines()] == ["before"]
    assert [line.split(" ", 3)[3] for line in read(pod.log_path("app")).splitlines()] == ["after"]


async def test_reopen_log_that_cannot_open_the_file_keeps_the_old_one(pod) -> None:
    await pod.run("app", "sleep", "600")
    os.rename(pod.log_path("app"), pod.log_path("app") + ".1")
    os.mkdir(pod.log_path("app"))  # a directory where the file was
    with pytest.raises(FailedPrecondition, match="cannot reopen log file .*; the task keeps writing to the file"):
        await pod.call("ReopenLog", task_id="app")
    reply = await pod.call("Exec", task_id="app", args=["true"])  # the task is unharmed
    assert reply["exit_status"] == 0


@pytest.mark.skipif(pure_v2(discover_hierarchies()), reason="cgroup v1: a pure v2 host mounts cgroup2 instead")
async def test_on_cgroup_v1_a_task_has_its_own_cgroups_on_sys_fs_cgroup_read_only_as_runc_makes_them(pod, request) -> None:
    # kubelet's e2e reads a container's limits there (in-place resize: /sys/fs/cgroup/cpu/cpu.cfs_quota_us).
    if request.node.callspec.params["pod"] != "native":
        pytest.skip("runc and crun tasks: their config.json has no cgroup mount yet (docs/handlers.md)")
    await pod.run("app", "sh", "-c", "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/cpu/cpu.cfs_quota_us; "
                  "cat /sys/fs/cgroup/pids/cgroup.procs | wc -l; "
                  "(echo 1 > /sys/fs/cgroup/cpu/cpu.shares) 2>/dev/null || echo read-only",
                  resources={"memory_limit_bytes": 96 << 20, "cpu_quota_us": 50000, "cpu_period_us": 100000})
    assert (await pod.call("Wait", task_id="app", timeout=60))["exit_status"] == 0
    said = [line.split(" ", 3)[3] for line in read(pod.log_path("app")).splitlines()]
    assert said[:2] == [str(96 << 20), "50000"], said
    assert 1 <= int(said[2]) <= 3, said  # the task's own cgroup: its processes, not the machine's
    assert said[3] == "read-only", said
