"""Tasks (containers) through a real shim: their namespaces and cgroup (checked by inode and
path), their CRI logs, exits, kills, waits, and what the sandbox and ``podshim delete`` do to them.

Every process a test starts here is recorded; the module fails if any is still alive at its end
or if a task cgroup is left."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re

import pytest

from shim.api.names import TASK_SERVICE
from shim.kernel import linux, netns
from shim.lib.processes import process_alive
from shim.rpc import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound

from support.shimtools import (
    NODE_ROOT,
    WAIT,
    EventStream,
    ProcessRef,
    Shim,
    ShimLauncher,
    host_untouched,  # noqa: F401  (autouse: what this module's shims made is checked at the end)
    ns_inode,
)

# Each test runs twice: shims exec'd by `podshim start`, and forked by the session's template.
pytestmark = pytest.mark.usefixtures("spawn_mode")

HOSTNAME = "pod-host"
LOG_LINE = re.compile(rb"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?Z) (stdout|stderr) ([FP]) (.*)")
#: (pid, start time) of every task process started in this module, and every task cgroup.
STARTED: list[tuple[int, int | None]] = []
TASK_CGROUPS: list[str] = []


class Pod:
    """A running sandbox in a fresh shim, and the tasks a test runs in it."""

    def __init__(self, shim: Shim, pause_pid: int, cgroups: dict[str, str], log_dir: str):
        self.shim = shim
        self.pause_pid = pause_pid
        self.cgroups = cgroups  # hierarchy -> the sandbox's cgroup directory
        self.log_dir = log_dir

    async def call(self, method: str, client=None, **fields):
        caller = client or self.shim.client
        assert caller is not None  # (connected)
        return await caller.call(TASK_SERVICE, method,
                                                       {"sandbox_id": self.shim.sandbox_id, **fields}, timeout=WAIT)

    async def create(self, task_id: str, *args: str, pid_mode: str = "CONTAINER", **fields) -> None:
        TASK_CGROUPS.extend(os.path.join(path, task_id) for path in self.cgroups.values())
        if "rootfs" not in fields:
            fields.update(rootfs=NODE_ROOT, readonly_rootfs=True)
        await self.call("Create", task_id=task_id, args=list(args), log_path=self.log_path(task_id),
                        pid_mode=pid_mode, **fields)

    async def run(self, task_id: str, *args: str, pid_mode: str = "CONTAINER") -> int:
        """Create and start a task; returns its pid."""
        await self.create(task_id, *args, pid_mode=pid_mode)
        pid = (await self.call("Start", task_id=task_id))["pid"]
        STARTED.append((pid, linux.proc_start_time(pid)))
        return pid

    async def wait(self, task_id: str) -> dict:
        return await self.call("Wait", task_id=task_id)

    def log_path(self, task_id: str) -> str:
        return os.path.join(self.log_dir, "containers", f"{task_id}.log")

    def log(self, task_id: str) -> list[tuple[bytes, bytes, bytes]]:
        """(stream, tag, message) of each record; every line must be a CRI log line."""
        with open(self.log_path(task_id), "rb") as f:
            lines = f.read().split(b"\n")
        assert lines[-1] == b""
        records: list[tuple[bytes, bytes, bytes]] = []
        for line in lines[:-1]:
            match = LOG_LINE.fullmatch(line)
            assert match, f"not a CRI log line: {line[:100]!r}"
            stream, tag, message = match.group(2, 3, 4)
            records.append((stream, tag, message))
        return records

    def stdout(self, task_id: str) -> list[bytes]:
        return [message for stream, _, message in self.log(task_id) if stream == b"stdout"]


class FifoReader:
    """A FIFO a task writes to when it is ready; :meth:`wait` returns when it did (no polling)."""

    def __init__(self, path: str):
        self.path = path
        os.mkfifo(path)
        # Opened now, non-blocking, so the task's open for writing does not wait for us.
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)

    async def wait(self) -> None:
        loop = asyncio.get_running_loop()
        readable = loop.create_future()
        def ready() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(self._fd, ready)
        try:
            await asyncio.wait_for(readable, WAIT)
        finally:
            loop.remove_reader(self._fd)
            os.close(self._fd)


@pytest.fixture
async def pod(shims: ShimLauncher, tmp_path) -> Pod:
    shim = await shims.start()
    pause_pid = await shim.run_sandbox(options={"hostname": HOSTNAME})
    info = await shim.info()
    cgroups = {key.removeprefix("cgroup."): path for key, path in info.items() if key.startswith("cgroup.")}
    return Pod(shim, pause_pid, cgroups, str(tmp_path))


@pytest.fixture(scope="module", autouse=True)
def nothing_of_the_tasks_left():
    yield
    alive = [pid for pid, start in STARTED if start is not None and process_alive(pid, start)]
    for pid, start in STARTED:
        if pid in alive:
            with contextlib.suppress(ProcessLookupError):
                ref = ProcessRef(pid)  # pinned first, then checked: a reused pid is never signalled
                if process_alive(pid, start):
                    ref.kill()
                ref.close()
    cgroups = [path for path in TASK_CGROUPS if os.path.isdir(path)]
    assert not alive and not cgroups, f"tasks left behind: processes {alive}, cgroups {cgroups}"


# -- namespaces and cgroup -------------------------------------------------------------------


async def test_task_shares_net_ipc_and_uts_namespaces_with_the_pause(pod) -> None:
    pid = await pod.run("app", "sleep", "30")
    for kind in ("net", "ipc", "uts"):
        assert ns_inode(pid, kind) == ns_inode(pod.pause_pid, kind), kind
        assert ns_inode(pid, kind) != ns_inode("self", kind), kind


async def test_pod_pid_mode_shares_the_pause_pid_namespace_where_the_pause_is_pid_1(pod) -> None:
    await pod.run("app", "cat", "/proc/1/cmdline", pid_mode="POD")
    await pod.wait("app")
    with open(f"/proc/{pod.pause_pid}/cmdline", "rb") as f:
        pause_cmdline = f.read()
    assert pod.stdout("app") == [pause_cmdline]  # NUL-separated, no newline: one P record


async def test_pod_pid_mode_task_is_in_the_pause_pid_namespace_with_a_mount_namespace_and_the_pods_shm(pod) -> None:
    pid = await pod.run("app", "sleep", "30", pid_mode="POD")
    assert ns_inode(pid, "pid") == ns_inode(pod.pause_pid, "pid")
    assert ns_inode(pid, "mnt") not in (ns_inode(pod.pause_pid, "mnt"), ns_inode("self", "mnt"))
    assert os.stat(f"/proc/{pid}/root/dev/shm").st_dev == os.stat(f"/proc/{pod.pause_pid}/root/dev/shm").st_dev


async def test_container_pid_mode_task_is_pid_1_of_its_own_pid_namespace(pod) -> None:
    pid = await pod.run("app", "sleep", "30")
    with open(f"/proc/{pid}/status") as f:
        nspid = next(line.split()[1:] for line in f if line.startswith("NSpid:"))
    assert nspid == [str(pid), "1"]
    assert ns_inode(pid, "pid") not in (ns_inode(pod.pause_pid, "pid"), ns_inode("self", "pid"))
    assert ns_inode(pid, "mnt") not in (ns_inode(pod.pause_pid, "mnt"), ns_inode("self", "mnt"))


async def test_a_task_holds_none_of_the_hosts_netns_mounts_so_it_pins_none(pod) -> None:
    other = netns.create_netns(netns.new_netns_path("podshim-it"))
    try:
        pid = await pod.run("app", "sleep", "30")
        with open(f"/proc/{pid}/mountinfo") as f:
            assert not any("nsfs" in line.split() for line in f)
    finally:
        netns.remove_netns(other)
    assert not os.path.exists(other)


async def test_container_pid_mode_task_has_a_proc_of_its_own(pod) -> None:
    await pod.run("app", "sh", "-c", "cat /proc/1/comm; echo $$")
    await pod.wait("app")
    assert pod.stdout("app") == [b"sh", b"1"]


async def test_hostname_inside_is_the_sandbox_hostname(pod) -> None:
    await pod.run("app", "hostname")
    await pod.wait("app")
    assert pod.stdout("app") == [HOSTNAME.encode()]


async def test_task_cgroup_is_joined_before_exec(pod) -> None:
    pid = await pod.run("app", "sleep", "30")
    task_cgroup = os.path.join(pod.cgroups["memory"], "app")
    with open(os.path.join(task_cgroup, "cgroup.procs")) as f:
        assert f.read().split() == [str(pid)]
    # Charged from its first page: the launcher's pages before exec count too.
    with open(os.path.join(task_cgroup, "memory.max_usage_in_bytes")) as f:
        assert int(f.read()) > 0


async def test_the_program_sees_its_own_cgroup_from_its_first_instruction(pod) -> None:
    await pod.run("app", "cat", "/proc/self/cgroup", pid_mode="POD")
    await pod.wait("app")
    memory = next(line for line in pod.stdout("app") if b":memory:" in line)
    assert memory.endswith(b"/app")


# -- logs ------------------------------------------------------------------------------------


async def test_log_has_cri_lines_for_stdout_and_stderr(pod) -> None:
    await pod.run("app", "sh", "-c", "echo out; echo err >&2")
    await pod.wait("app")
    assert sorted(pod.log("app")) == [(b"stderr", b"F", b"err"), (b"stdout", b"F", b"out")]


async def test_a_line_longer_than_16_kib_is_split_into_partial_records(pod) -> None:
    await pod.run("app", "sh", "-c", "head -c 40000 /dev/zero | tr '\\0' a; echo")
    await pod.wait("app")
    assert [(tag, len(message)) for _, tag, message in pod.log("app")] == [(b"P", 16384), (b"P", 16384), (b"F", 7232)]


async def test_log_is_complete_when_wait_answers(pod) -> None:
    await pod.run("app", "seq", "1", "20000")
    await pod.wait("app")
    assert pod.stdout("app") == [str(n).encode() for n in range(1, 20001)]


async def test_env_and_cwd_are_given_to_the_program(pod) -> None:
    await pod.create("app", "sh", "-c", 'echo "$GREETING $PWD $PATH"', env=["GREETING=hello"], cwd="/tmp")
    await pod.call("Start", task_id="app")
    await pod.wait("app")
    assert pod.stdout("app") == [b"hello /tmp /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]


# -- exits, kills and waits ------------------------------------------------------------------


async def test_exit_code_is_recorded(pod) -> None:
    await pod.run("app", "sh", "-c", "exit 3")
    assert (await pod.wait("app"))["exit_status"] == 3
    state = await pod.call("State", task_id="app")
    assert (state["status"], state["exit_status"]) == ("stopped", 3)
    assert state["exited_at"] >= state["started_at"] >= state["created_at"] > 0


async def test_kill_9_reports_137_and_publishes_task_exit(pod) -> None:
    events = await EventStream.open(pod.shim, await pod.shim.connect())
    pid = await pod.run("app", "sleep", "30")
    await pod.call("Kill", task_id="app", signal=9)
    exited = await pod.wait("app")
    event = await events.next("/tasks/exit")
    assert event["event"] == {"task_id": "app", "pid": pid, "exit_status": 137, "exited_at": exited["exited_at"],
                              "oom_killed": False}
    assert exited["exit_status"] == 137
    await events.aclose()


async def test_kill_all_signals_every_process_of_the_task(pod, tmp_path) -> None:
    ready = FifoReader(str(tmp_path / "ready"))
    # The shell survives SIGUSR1 (it traps it); its two sleeps die of it only if they get it too.
    # The trap is set after the forks: a child forked with it would hold the shell's handler
    # until it resets it, and a SIGUSR1 in between would be lost. The shell waits until its own
    # SIGUSR1 came: the sleeps may get theirs first, and a shell that saw them die and exited
    # before its own arrived would never print.
    await pod.run("app", "sh", "-c", f"sleep 30 & sleep 30 & trap 'got=1; echo trapped' USR1; echo > {ready.path}; "
                  "until [ -n \"$got\" ]; do wait; done; wait", pid_mode="POD")
    await ready.wait()  # both sleeps are forked
    await pod.call("Kill", task_id="app", signal=10, all=True)
    assert (await pod.wait("app"))["exit_status"] == 0
    assert pod.stdout("app") == [b"trapped"]


async def test_concurrent_waits_all_get_the_exit(pod) -> None:
    await pod.run("app", "sleep", "30")
    clients = [await pod.shim.connect() for _ in range(3)]
    waits = [asyncio.create_task(pod.call("Wait", client, task_id="app")) for client in clients * 2]
    # Each State, sent on a connection after its Waits (tasks run in order), is answered once the
    # shim has started those Waits: then every Wait is blocked in the shim.
    for client in clients:
        assert (await asyncio.create_task(pod.call("State", client, task_id="app")))["status"] == "running"
    assert not any(wait.done() for wait in waits)
    await pod.call("Kill", task_id="app", signal=9)
    results = await asyncio.gather(*waits)
    assert len({(r["exit_status"], r["exited_at"]) for r in results}) == 1
    assert results[0]["exit_status"] == 137


async def test_wait_returns_at_once_after_exit(pod) -> None:
    await pod.run("app", "true")
    first = await pod.wait("app")
    assert await pod.wait("app") == first


async def test_a_client_deadline_ends_only_that_wait(pod) -> None:
    await pod.run("app", "sleep", "30")
    patient = asyncio.create_task(pod.wait("app"))
    with pytest.raises(Exception, match="deadline"):
        await pod.shim.client.call(TASK_SERVICE, "Wait", {"sandbox_id": pod.shim.sandbox_id, "task_id": "app"},
                                   timeout=0.05)
    assert not patient.done()
    await pod.call("Kill", task_id="app", signal=9)
    assert (await patient)["exit_status"] == 137


async def test_kill_of_an_exited_task_does_nothing(pod) -> None:
    await pod.run("app", "true")
    await pod.wait("app")
    assert await pod.call("Kill", task_id="app", signal=9) == {}
    assert (await pod.call("State", task_id="app"))["exit_status"] == 0


async def test_kill_of_a_task_never_started_is_a_failed_precondition(pod) -> None:
    await pod.create("app", "true")
    with pytest.raises(FailedPrecondition, match="not been started"):
        await pod.call("Kill", task_id="app")


# -- create, start, delete, list -------------------------------------------------------------


async def test_delete_while_running_is_a_failed_precondition(pod) -> None:
    await pod.run("app", "sleep", "30")
    with pytest.raises(FailedPrecondition, match="running"):
        await pod.call("Delete", task_id="app")
    assert (await pod.call("State", task_id="app"))["status"] == "running"


async def test_delete_of_a_stopped_task_removes_its_cgroup_and_forgets_it(pod) -> None:
    pid = await pod.run("app", "sh", "-c", "exit 7")
    exited = await pod.wait("app")
    assert await pod.call("Delete", task_id="app") == {**exited, "exit_status": 7, "pid": pid}
    assert not any(os.path.exists(os.path.join(path, "app")) for path in pod.cgroups.values())
    with pytest.raises(NotFound):
        await pod.call("State", task_id="app")


async def test_unknown_task_is_not_found(pod) -> None:
    for method in ("Start", "Kill", "Wait", "Delete", "State"):
        with pytest.raises(NotFound, match="task nope"):
            await pod.call(method, task_id="nope")


async def test_another_sandbox_id_is_not_found(pod) -> None:
    await pod.create("app", "true")
    with pytest.raises(NotFound):
        await pod.shim.client.call(TASK_SERVICE, "State", {"sandbox_id": "other", "task_id": "app"}, timeout=WAIT)


async def test_duplicate_task_id_already_exists(pod) -> None:
    await pod.create("app", "true")
    with pytest.raises(AlreadyExists):
        await pod.create("app", "true")


async def test_malformed_create_is_invalid_argument(pod):
    for fields in ({"args": []}, {"args": "true"}, {"log_path": "relative.log"}, {"pid_mode": "HOST"},
                   {"env": ["NOEQUALS"]}, {"task_id": "../x"}, {"cwd": "tmp"}, {"labels": {"a": 1}},
                   {"labels": {"app": "x" * 254}}, {"labels": {"bad key": "x"}}):
        request = {"task_id": "app", "args": ["true"], "log_path": pod.log_path("app"), **fields}
        with pytest.raises(InvalidArgument):
            await pod.call("Create", **request)
    assert (await pod.call("List"))["tasks"] == []


async def test_a_log_path_that_is_a_symlink_fails_create_and_nothing_is_written_through_it(pod, tmp_path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    os.makedirs(os.path.dirname(pod.log_path("app")))
    os.symlink(victim, pod.log_path("app"))
    with pytest.raises(FailedPrecondition, match=f"{pod.log_path('app')}: it is a symbolic link"):
        await pod.create("app", "echo", "hello")
    assert (await pod.call("List"))["tasks"] == []
    assert victim.read_bytes() == b"precious\n"


async def test_a_symlink_planted_at_the_log_path_after_create_fails_start(pod, tmp_path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    await pod.create("app", "echo", "hello")
    os.symlink(victim, pod.log_path("app"))
    with pytest.raises(FailedPrecondition, match=f"{pod.log_path('app')}: it is a symbolic link"):
        await pod.call("Start", task_id="app")
    assert victim.read_bytes() == b"precious\n"


async def test_create_needs_a_running_sandbox(shims, tmp_path) -> None:
    shim = await shims.start()
    await shim.call("CreateSandbox")
    with pytest.raises(FailedPrecondition, match="not running"):
        await shim.client.call(TASK_SERVICE, "Create", {"sandbox_id": shim.sandbox_id, "task_id": "app",
                                                        "args": ["true"], "log_path": str(tmp_path / "a.log")})


async def test_list_gives_every_task_state(pod) -> None:
    await pod.create("one", "true")
    pid = await pod.run("two", "sleep", "30", pid_mode="POD")
    tasks = {t["task_id"]: t for t in (await pod.call("List"))["tasks"]}
    assert {k: (t["status"], t["pid"], t["pid_mode"]) for k, t in tasks.items()} == {
        "one": ("created", 0, "CONTAINER"), "two": ("running", pid, "POD")}
    assert tasks["two"]["args"] == ["sleep", "30"] and tasks["two"]["log_path"] == pod.log_path("two")


async def test_exec_of_a_missing_binary_fails_clearly_and_leaves_nothing(pod) -> None:
    await pod.create("app", "/no/such")
    with pytest.raises(FailedPrecondition) as failure:
        await pod.call("Start", task_id="app")
    assert failure.value.message == "exec /no/such: No such file or directory"
    assert not any(os.path.exists(os.path.join(path, "app")) for path in pod.cgroups.values())
    with open(os.path.join(pod.cgroups["memory"], "cgroup.procs")) as f:
        assert f.read().split() == [str(pod.pause_pid)]
    assert (await pod.call("State", task_id="app"))["status"] == "created"
    assert pod.shim.record()["tasks"]["app"]["cgroup"] is None


async def test_program_not_on_path_fails_clearly(pod) -> None:
    await pod.create("app", "no-such-program")
    with pytest.raises(FailedPrecondition) as failure:
        await pod.call("Start", task_id="app")
    assert failure.value.message == "exec no-such-program: No such file or directory"


# -- with the sandbox ------------------------------------------------------------------------


async def test_stop_sandbox_kills_running_tasks_in_both_pid_modes(pod) -> None:
    events = await EventStream.open(pod.shim, await pod.shim.connect())
    pids = {"pod": await pod.run("pod", "sleep", "30", pid_mode="POD"),
            "container": await pod.run("container", "sleep", "30")}
    await pod.shim.call("StopSandbox", timeout_secs=10)
    for task_id, pid in pids.items():
        state = await pod.call("State", task_id=task_id)
        assert (state["status"], state["exit_status"]) == ("stopped", 137), task_id
        assert not process_alive(pid, None)
    exits = {(await events.next("/tasks/exit"))["event"]["task_id"] for _ in pids}
    assert exits == set(pids)
    await events.aclose()


async def test_no_task_starts_in_a_stopped_sandbox(pod) -> None:
    await pod.create("app", "true")
    await pod.shim.call("StopSandbox", timeout_secs=0)
    with pytest.raises(FailedPrecondition, match="not running"):
        await pod.call("Start", task_id="app")


async def test_shutdown_removes_task_cgroups_before_the_sandbox_cgroup(pod) -> None:
    await pod.run("app", "sleep", "30")
    await pod.shim.call("ShutdownSandbox")
    await pod.shim.process.exited()
    assert not any(os.path.exists(path) for path in pod.cgroups.values())


async def test_tasks_are_recorded_in_state_json_as_they_start(pod) -> None:
    pid = await pod.run("app", "sleep", "30", pid_mode="POD")
    record = pod.shim.record()["tasks"]["app"]
    assert (record["pid"], record["start_time"], record["status"]) == (pid, linux.proc_start_time(pid), "running")
    assert set(record["cgroup"]["paths"].values()) == {os.path.join(path, "app") for path in pod.cgroups.values()}


async def test_podshim_delete_after_a_shim_crash_kills_the_task_and_removes_its_cgroups(pod) -> None:
    pid = await pod.run("app", "sleep", "30")
    start_time = linux.proc_start_time(pid)
    pod.shim.process.kill()
    await pod.shim.process.exited()
    assert process_alive(pid, start_time)  # the task outlives its shim
    result = await asyncio.to_thread(pod.shim.delete)
    assert result.returncode == 0, result.stderr
    assert not process_alive(pid, start_time)
    assert not any(os.path.exists(path) for path in pod.cgroups.values())
    assert pod.shim.record()["tasks"]["app"]["exit"]["exit_status"] == 137
