"""shim.runtime.pause on the real kernel: the pause's namespaces, cgroup, signals and failure paths.

Every pause is killed by (pid, start time) and reaped; every netns and cgroup is removed.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import uvloop

from shim.api.defaults import CATATONIT
from shim.kernel import cgroups, linux, netns
from shim.kernel.cgroups import SandboxCgroup, hierarchies
from shim.kernel.reaper import ExitInfo, Reaper
from shim.lib.processes import signal_process
from shim.rpc.status import FailedPrecondition, Internal, InvalidArgument, NotFound
from shim.runtime import process
from shim.runtime.pause import BUILTIN, NODE, PauseSpec, launch, validate_sysctls

from support.imagebuild import BUSYBOX, tiny_pause_binary
from support.shimtools import host_netns_bound_at

WAIT = 5.0  # seconds; a bound for the test, not a readiness sleep
needs_catatonit = pytest.mark.skipif(not os.access(CATATONIT, os.X_OK), reason="apt-get install catatonit")
BINARIES = [pytest.param(CATATONIT, id="catatonit", marks=needs_catatonit), pytest.param(BUILTIN, id="builtin")]


@pytest.fixture
def make_netns():
    """Create netns files; each is unmounted and deleted afterwards."""
    paths = []

    def make() -> str:
        paths.append(netns.new_netns_path(f"podshim-test-{os.getpid()}"))
        return netns.create_netns(paths[-1])

    yield make
    for path in paths:
        netns.remove_netns(path)


@pytest.fixture
def cgroup():
    parent = f"podshim-test-pause-{os.getpid()}-{secrets.token_hex(4)}"
    cgroup = SandboxCgroup.create("sandbox", parent)
    yield cgroup
    cgroup.kill_all()
    cgroup.remove()


def _all_children() -> set[int]:
    """Pids whose parent is this process (zombies included)."""
    me = str(os.getpid())
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = linux.proc_stat(int(entry))
            if stat is not None and stat[linux.STAT_PPID - 1] == me:
                found.add(int(entry))
    return found


_others: set[int] = set()


@pytest.fixture(autouse=True)
def _children_of_others():
    """The children this process had before the test: a session fixture's (the local registry
    tests/support/registry.py runs for the whole session, say), not the test's."""
    _others.clear()
    _others.update(_all_children())
    yield


def _children() -> set[int]:
    """Pids whose parent is this process (zombies included), but those of others."""
    return _all_children() - _others


def _status(pid: int, field: str) -> list[str]:
    with open(f"/proc/{pid}/status") as f:
        return next(line.split()[1:] for line in f if line.startswith(field + ":"))


def _nsenter(pid: int, flags: str, *argv: str) -> str:
    return subprocess.run(["nsenter", "-t", str(pid), flags, *argv], check=True, capture_output=True, text=True).stdout


def _same_ns(pid: int, kind: str) -> bool:
    return linux.ns_inode(f"/proc/{pid}/ns/{kind}") == linux.ns_inode(f"/proc/self/ns/{kind}")


# -- namespaces ------------------------------------------------------------------------------


@pytest.mark.parametrize("binary", BINARIES)
async def test_pause_is_pid_1_of_its_own_pid_namespace(start, binary) -> None:
    pause = await start(pause_binary=binary)
    assert _status(pause.pid, "NSpid") == [str(pause.pid), "1"]
    assert not _same_ns(pause.pid, "pid")
    assert pause.binary == binary


@needs_catatonit
async def test_pause_is_catatonit_when_installed_by_default(start) -> None:
    pause = await start()
    assert pause.binary == CATATONIT
    with open(f"/proc/{pause.pid}/cmdline", "rb") as f:
        assert f.read().split(b"\0")[:2] == [CATATONIT.encode(), b"-P"]


async def test_node_pid_mode_shares_host_pid_ns(start) -> None:
    pause = await start(pid_mode=NODE)
    assert _same_ns(pause.pid, "pid")
    assert _status(pause.pid, "NSpid") == [str(pause.pid)]


@pytest.mark.parametrize("binary", BINARIES)
async def test_pause_joins_the_given_netns(start, make_netns, binary) -> None:
    path = make_netns()
    pause = await start(netns_path=path, pause_binary=binary)
    assert linux.ns_inode(f"/proc/{pause.pid}/ns/net") == os.stat(path).st_ino


async def test_host_network_keeps_host_net_and_uts_namespaces(start) -> None:
    pause = await start(netns_path=None, hostname="ignored-with-host-network")
    assert _same_ns(pause.pid, "net") and _same_ns(pause.pid, "uts")
    assert socket.gethostname() != "ignored-with-host-network"


async def test_hostname_is_set_in_the_pause_uts_namespace(start, make_netns) -> None:
    host = socket.gethostname()
    pause = await start(netns_path=make_netns(), hostname="pod-hostname")
    assert _nsenter(pause.pid, "-u", "hostname").strip() == "pod-hostname"
    assert socket.gethostname() == host


async def test_pause_has_its_own_ipc_namespace_with_a_sized_shm(start) -> None:
    pause = await start(shm_size_bytes=1 << 20)
    assert not _same_ns(pause.pid, "ipc")
    with open(f"/proc/{pause.pid}/mountinfo") as f:
        shm = [line.split() for line in f if line.split()[4] == "/dev/shm"][-1]  # in its own root
    assert shm[-3:] == ["tmpfs", "shm", "rw,size=1024k"]
    assert {"nosuid", "nodev", "noexec"} <= set(shm[5].split(","))


async def test_node_ipc_mode_shares_host_ipc_namespace(start) -> None:
    pause = await start(ipc_mode=NODE)
    assert _same_ns(pause.pid, "ipc")


def _tree(root: str) -> set[str]:
    """Every path under ``root`` (as seen from inside it), without following symbolic links."""
    found = set()
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            found.add(os.path.join(directory, name)[len(root):])
    return found


@pytest.mark.parametrize("binary", BINARIES)
async def test_the_pause_root_holds_its_program_and_the_pod_shm_only(start, binary) -> None:
    pause = await start(pause_binary=binary)
    program = {"/usr", "/usr/bin", CATATONIT} if binary == CATATONIT else set()
    assert _tree(f"/proc/{pause.pid}/root") == program | {"/dev", "/dev/shm"}
    assert os.readlink(f"/proc/{pause.pid}/cwd") == "/"


async def test_the_pause_root_is_read_only_and_not_the_host(start) -> None:
    pause = await start()
    root = f"/proc/{pause.pid}/root"
    assert os.stat(root).st_ino != os.stat("/").st_ino or os.stat(root).st_dev != os.stat("/").st_dev
    with pytest.raises(OSError) as failed:
        open(f"{root}/canary", "w").close()
    assert failed.value.errno == errno.EROFS
    assert not os.path.exists("/canary")


async def test_a_host_ipc_pause_has_no_shm_in_its_root(start) -> None:
    pause = await start(ipc_mode=NODE, pause_binary=BUILTIN)
    assert _tree(f"/proc/{pause.pid}/root") == set()


async def test_pause_mounts_stay_out_of_the_host(start) -> None:
    def proc_and_shm_mounts() -> list[str]:
        with open("/proc/self/mountinfo") as f:
            return [line for line in f if line.split()[4] in ("/proc", "/dev/shm")]

    before = proc_and_shm_mounts()
    await start()  # mounts its root and a tmpfs /dev/shm of its own
    assert proc_and_shm_mounts() == before


@pytest.mark.parametrize("binary", BINARIES)
async def test_the_pause_mount_namespace_holds_no_mount_of_the_host(start, make_netns, binary) -> None:
    other = make_netns()  # a netns bind mount it must not pin
    pause = await start(netns_path=make_netns(), pause_binary=binary)
    with open(f"/proc/{pause.pid}/mountinfo") as f:
        mount_points = [line.split()[4] for line in f]
    program = [CATATONIT] if binary == CATATONIT else []
    assert mount_points == ["/", *program, "/dev/shm"]
    assert os.path.realpath(other) not in mount_points


# -- sysctls ---------------------------------------------------------------------------------


async def test_sysctl_applied_inside_netns_only(start, make_netns) -> None:
    knob = "/proc/sys/net/ipv4/ip_unprivileged_port_start"
    with open(knob) as f:
        host_value = f.read().strip()
    pod_value = "80" if host_value != "80" else "81"
    pause = await start(netns_path=make_netns(), sysctls={"net.ipv4.ip_unprivileged_port_start": pod_value})
    assert _nsenter(pause.pid, "-n", "cat", knob).strip() == pod_value
    with open(knob) as f:
        assert f.read().strip() == host_value


async def test_ipc_sysctl_applied_inside_ipc_namespace_only(start) -> None:
    knob = "/proc/sys/kernel/msgmax"
    with open(knob) as f:
        host_value = f.read().strip()
    pod_value = str(int(host_value) + 1)
    pause = await start(sysctls={"kernel.msgmax": pod_value})
    assert _nsenter(pause.pid, "-i", "cat", knob).strip() == pod_value
    with open(knob) as f:
        assert f.read().strip() == host_value


@pytest.mark.parametrize("key", ["kernel.panic", "vm.swappiness", "kernel.hostname", "fs.file-max"])
async def test_host_sysctl_is_refused(reaper, key) -> None:
    with pytest.raises(InvalidArgument, match="change the host"):
        await launch(PauseSpec(netns_path="/nonexistent", sysctls={key: "1"}), reaper)
    assert _children() == set()


def test_net_sysctl_with_host_network_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="host network"):
        validate_sysctls({"net.ipv4.ip_forward": "1"}, host_network=True, host_ipc=False)


def test_ipc_sysctl_with_host_ipc_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="host IPC"):
        validate_sysctls({"kernel.shmmax": "1"}, host_network=False, host_ipc=True)


@pytest.mark.parametrize("key", ["net..x", "net/ipv4/ip_forward", "net", "net.ipv4.conf.all.rp_filter\n"])
def test_malformed_sysctl_name_is_refused(key) -> None:
    with pytest.raises(InvalidArgument, match="malformed"):
        validate_sysctls({key: "1"}, host_network=False, host_ipc=False)


async def test_net_sysctl_is_never_written_into_the_host_netns_joined_by_another_path(start, tmp_path) -> None:
    # The launcher writes the sysctls, so it checks by inode where they would land, whatever
    # the caller checked before. The value is the host's own, so a launcher that wrote it
    # anyway would change nothing.
    with open("/proc/sys/net/ipv4/ip_forward") as f:
        host_value = f.read().strip()
    with host_netns_bound_at(str(tmp_path)) as path:
        with pytest.raises(InvalidArgument, match="host's network namespace"):
            await start(netns_path=path, sysctls={"net.ipv4.ip_forward": host_value})
    assert _children() == set()


async def test_unknown_sysctl_fails_with_its_name_and_leaves_nothing(reaper, make_netns) -> None:
    path = make_netns()
    with pytest.raises(InvalidArgument, match="net.ipv4.no_such_knob"):
        await launch(PauseSpec(netns_path=path, sysctls={"net.ipv4.no_such_knob": "1"}), reaper)
    assert _children() == set()


# -- cgroup and process attributes -----------------------------------------------------------


async def test_cgroup_joined_before_exec(start, cgroup) -> None:
    pause = await start(cgroup=cgroup)
    with open(os.path.join(cgroup.paths["memory"], "cgroup.procs")) as f:
        assert f.read().split() == [str(pause.pid)]
    assert cgroup.pids() == {pause.pid}
    # Charged from its first page: the launcher's pages before exec count too.
    with open(os.path.join(cgroup.paths["memory"], "memory.max_usage_in_bytes")) as f:
        assert int(f.read()) > 0


async def test_oom_score_adj_is_written(start) -> None:
    pause = await start(oom_score_adj=500)
    with open(f"/proc/{pause.pid}/oom_score_adj") as f:
        assert f.read().strip() == "500"


async def test_lowering_oom_score_adj_without_the_capability_only_warns(start, caplog) -> None:
    # The first such failure is a warning, later ones are logged at debug level.
    with caplog.at_level(logging.DEBUG, logger="shim.runtime.process"):
        pause = await start()  # default -998
    with open(f"/proc/{pause.pid}/oom_score_adj") as f:
        value = f.read().strip()
    assert value == "-998" or "oom_score_adj" in caplog.text  # CAP_SYS_RESOURCE is dropped on some machines


@pytest.mark.parametrize("binary", BINARIES)
async def test_pause_holds_only_dev_null_and_its_own_fds(start, binary) -> None:
    pause = await start(pause_binary=binary)
    fd_dir = f"/proc/{pause.pid}/fd"
    targets = {fd: os.readlink(os.path.join(fd_dir, fd)) for fd in os.listdir(fd_dir)}
    # Opened before it left the host's root, so named by their path below the mount they are on.
    files = {fd: os.stat(os.path.join(fd_dir, fd)).st_rdev for fd, target in targets.items()
             if not target.startswith("anon_inode:")}
    assert set(files) == {"0", "1", "2"}
    assert set(files.values()) == {os.stat("/dev/null").st_rdev}
    assert {targets[fd] for fd in targets.keys() - files.keys()} <= {"anon_inode:[signalfd]"}


async def test_pause_is_in_its_own_session(start):
    pause = await start()
    assert linux.proc_stat(pause.pid)[5] == str(pause.pid)  # field 6: session id


# -- signals ---------------------------------------------------------------------------------


@pytest.mark.parametrize("binary", BINARIES)
async def test_pause_exits_0_on_sigterm(start, binary) -> None:
    pause = await start(pause_binary=binary)
    assert signal_process(pause.pid, pause.start_time, signal.SIGTERM)
    assert (await asyncio.wait_for(pause.exit, WAIT)).exit_status == 0


@pytest.mark.parametrize("binary", BINARIES)
async def test_sigterm_right_after_launch_is_never_lost(start, binary) -> None:
    for _ in range(5):
        pause = await start(pause_binary=binary)
        signal_process(pause.pid, pause.start_time, signal.SIGTERM)
        assert (await asyncio.wait_for(pause.exit, WAIT)).exit_status == 0


@needs_catatonit
async def test_catatonit_is_ready_at_exec_with_every_signal_blocked(start, monkeypatch) -> None:
    # Its masks are never polled: it is exec'd with every signal blocked, so a SIGTERM sent
    # before it set up its signalfd waits, pending, and ends it.
    async def no_polling(*args):
        raise AssertionError("catatonit's signal masks were polled")

    monkeypatch.setattr("shim.runtime.pause.wait_ready", no_polling)
    for _ in range(5):
        pause = await start(pause_binary=CATATONIT)
        signal_process(pause.pid, pause.start_time, signal.SIGTERM)
        assert (await asyncio.wait_for(pause.exit, WAIT)).exit_status == 0


async def test_a_pause_of_another_name_is_ready_once_it_blocks_sigterm_itself(start, tmp_path) -> None:
    # Not known to block its signals itself: exec'd with none blocked, and watched.
    program = tmp_path / "tiny-pause"  # it catches SIGTERM (a static program: the pause's root has no libc)
    program.write_bytes(tiny_pause_binary(str(tmp_path)))
    program.chmod(0o755)
    pause = await start(pause_binary=str(program))
    assert int(_status(pause.pid, "SigCgt")[0], 16) & 1 << (signal.SIGTERM - 1)
    signal_process(pause.pid, pause.start_time, signal.SIGTERM)
    assert (await asyncio.wait_for(pause.exit, WAIT)).exit_status == 0


@pytest.mark.parametrize("binary", BINARIES)
async def test_kill_9_reported_as_137(start, binary) -> None:
    pause = await start(pause_binary=binary)
    assert signal_process(pause.pid, pause.start_time, signal.SIGKILL)
    assert (await asyncio.wait_for(pause.exit, WAIT)).exit_status == 137


async def test_signalling_the_pause_refuses_another_start_time(start) -> None:
    pause = await start()
    assert not signal_process(pause.pid, pause.start_time + 1, signal.SIGKILL)
    assert linux.proc_start_time(pause.pid) == pause.start_time
    assert not pause.exit.done()


async def test_signalling_the_pause_after_exit_returns_false(start) -> None:
    pause = await start()
    signal_process(pause.pid, pause.start_time, signal.SIGKILL)
    await asyncio.wait_for(pause.exit, WAIT)
    assert not signal_process(pause.pid, pause.start_time, signal.SIGKILL)


# -- failures --------------------------------------------------------------------------------


async def test_exec_failure_reports_the_step_and_leaves_nothing(reaper, tmp_path) -> None:
    not_a_program = tmp_path / "pause"
    not_a_program.write_bytes(b"\x7fELF\x02\x01".ljust(64, b"\0"))  # a static ELF by its header, and no more
    not_a_program.chmod(0o755)
    with pytest.raises(Internal, match=rf"exec {not_a_program}: Exec format error \(errno 8\)"):
        await launch(PauseSpec(pause_binary=str(not_a_program)), reaper)
    assert _children() == set()


async def test_a_dynamically_linked_pause_binary_is_refused_before_anything_starts(reaper) -> None:
    # Its root holds nothing but the program: no loader, no libc.
    with pytest.raises(FailedPrecondition, match="/bin/sleep must be a static executable: it is dynamically linked"):
        await launch(PauseSpec(pause_binary="/bin/sleep"), reaper)
    assert _children() == set()


async def test_pause_that_exits_at_once_is_reported_and_reaped(reaper, tmp_path) -> None:
    true = tmp_path / "true"
    true.symlink_to(BUSYBOX)  # busybox-static's true, by the name it runs as
    with pytest.raises(Internal, match="exited during start with status 0"):
        await launch(PauseSpec(pause_binary=str(true)), reaper)
    assert _children() == set()


async def test_launcher_failure_names_its_step(reaper) -> None:
    gone = SandboxCgroup.from_dict({"name": "gone", "paths": {"pids": "/sys/fs/cgroup/pids/podshim-never-made"}})
    with pytest.raises(Internal, match=r"at joining cgroup /sys/fs/cgroup/pids/podshim-never-made: "
                                       r"No such file or directory \(errno 2\)"):
        await launch(PauseSpec(cgroup=gone), reaper)
    assert _children() == set()


@pytest.mark.parametrize("yields", [1, 2, 3, 5, 8, 13])
async def test_cancelled_launch_leaves_nothing(reaper, yields) -> None:
    task = asyncio.create_task(launch(PauseSpec(), reaper))
    for _ in range(yields):  # cancel at different points of the launch
        await asyncio.sleep(0)
    assert _children()  # the launcher is forked: this is a cancellation mid-launch
    task.cancel()
    try:
        pause = await task
    except asyncio.CancelledError:
        pass
    else:  # it finished first: this run tests nothing, but must not leak either
        signal_process(pause.pid, pause.start_time, signal.SIGKILL)
        await asyncio.wait_for(pause.exit, WAIT)
    assert _children() == set()


async def test_missing_netns_is_not_found_and_nothing_is_started(reaper) -> None:
    with pytest.raises(NotFound):
        await launch(PauseSpec(netns_path=netns.new_netns_path("podshim-never-made")), reaper)
    assert _children() == set()


async def test_missing_pause_binary_is_a_failed_precondition(reaper) -> None:
    with pytest.raises(FailedPrecondition):
        await launch(PauseSpec(pause_binary="/nonexistent/pause"), reaper)


@pytest.mark.parametrize(
    "spec",
    [
        {"pid_mode": "CONTAINER"},
        {"ipc_mode": "TARGET"},
        {"pause_binary": "catatonit"},
        {"oom_score_adj": 1001},
        {"shm_size_bytes": 0},
        {"netns_path": None, "sysctls": {"net.core.somaxconn": "1"}},
    ],
)
async def test_bad_spec_is_invalid_argument(reaper, spec) -> None:
    with pytest.raises(InvalidArgument):
        await launch(PauseSpec(**spec), reaper)


async def test_bad_hostname_is_invalid_argument(reaper, make_netns) -> None:
    with pytest.raises(InvalidArgument):
        await launch(PauseSpec(netns_path=make_netns(), hostname="x" * 65), reaper)


async def test_launch_needs_an_installed_reaper() -> None:
    with pytest.raises(FailedPrecondition):
        await launch(PauseSpec(), Reaper())


def test_launch_on_uvloop() -> None:
    async def scenario() -> int:
        reaper = Reaper()
        reaper.install()
        try:
            pause = await launch(PauseSpec(), reaper)
            signal_process(pause.pid, pause.start_time, signal.SIGTERM)
            return (await asyncio.wait_for(pause.exit, WAIT)).exit_status
        finally:
            reaper.uninstall()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(scenario()) == 0


def test_launch_in_a_shim_started_by_posix_spawn_leaves_no_signal_ignored(tmp_path) -> None:
    # glibc's posix_spawn leaves its own signals (32, 33) ignored in what it starts, and its
    # sigaction refuses to reset them: a launch there once failed at "chdir /" with EINVAL,
    # then left them ignored in the task.
    script = tmp_path / "launch.py"
    script.write_text(
        "import asyncio, signal\n"
        "from shim.kernel.reaper import Reaper\n"
        "from shim.runtime import process\n"
        "from shim.runtime.pause import PauseSpec, launch\n"
        "ignored = int(next(l for l in open('/proc/self/status') if l.startswith('SigIgn:')).split()[1], 16)\n"
        "assert ignored >> 31 & 1, 'not started the way this test needs'\n"
        "async def main():\n"
        "    reaper = Reaper(); reaper.install()\n"
        "    task = await process.launch(process.ProcessSpec(\n"
        "        name='task t', argv=('grep', '-q', 'SigIgn:\\t0000000000000000', '/proc/self/status')), reaper)\n"
        "    assert (await task.exit).exit_status == 0\n"
        "    pause = await launch(PauseSpec(), reaper)\n"
        "    process.signal_process(pause.pid, pause.start_time, signal.SIGKILL)\n"
        "    await pause.exit\n"
        "asyncio.run(main())\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        pid = os.posix_spawn(sys.executable, [sys.executable, str(script)], env,
                             file_actions=[(os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, out, 2)])
    finally:
        os.close(out)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, (tmp_path / "out").read_text()


async def test_a_process_that_has_already_been_reaped_started_no_later_than_it_exited() -> None:
    # A process that exits at once may be reaped, its exit stamped, before its launcher reads
    # the clock for its start.
    loop = asyncio.get_running_loop()
    reaped = loop.create_future()
    reaped.set_result(ExitInfo(pid=42, exit_status=3, exited_at_ns=1000))
    assert process.started_at_ns(reaped) == 1000
    running = loop.create_future()
    before = time.time_ns()
    assert before <= process.started_at_ns(running) <= time.time_ns()


async def test_a_process_that_exits_at_once_starts_no_later_than_it_exits(reaper) -> None:
    launched = await process.launch(process.ProcessSpec(name="task t", argv=("true",)), reaper)
    exited = await asyncio.wait_for(launched.exit, WAIT)
    assert launched.started_at_ns <= exited.exited_at_ns


# -- how it is forked --------------------------------------------------------------------------


@pytest.fixture
def forks(monkeypatch) -> list[str]:
    """The names of the child functions the launch forks (shim.runtime.process._fork), in order."""
    children: list[str] = []
    real_fork = process._fork

    def fork(child, *args, **kwargs):
        children.append(child.__name__)
        return real_fork(child, *args, **kwargs)

    monkeypatch.setattr(process, "_fork", fork)
    return children


async def test_a_pod_pause_is_cloned_straight_into_its_namespaces_and_cgroup(start, cgroup, make_netns, forks) -> None:
    # One copy of the shim (clone3 with the new namespaces and the v2 cgroup), not a launcher
    # that unshares and forks again.
    pause = await start(netns_path=make_netns(), cgroup=cgroup)
    assert forks == ["_child_direct"]
    assert cgroup.pids() == {pause.pid}
    with open(f"/proc/{pause.pid}/status") as f:
        nspid = next(line.split()[1:] for line in f if line.startswith("NSpid:"))
    assert nspid == [str(pause.pid), "1"]  # PID 1 of its own pid namespace, from its birth
    assert os.readlink(f"/proc/{pause.pid}/ns/pid") != os.readlink("/proc/self/ns/pid")


async def test_with_another_thread_running_the_pause_comes_from_a_launcher(start, cgroup, forks) -> None:
    # A raw clone3 child of a process with other threads could meet a lock one of them held
    # (malloc's): then the launcher path, whose os.fork() takes care of that.
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        pause = await start(cgroup=cgroup)
    finally:
        release.set()
        other.join()
    assert forks == ["_child_a"] and cgroup.pids() == {pause.pid}


async def test_where_clone3_is_refused_the_launcher_moves_itself_first_and_forks(start, cgroup, make_netns,
                                                                                 monkeypatch, forks) -> None:
    # A seccomp filter that answers clone3 with ENOSYS (Docker's default): the launcher path, A
    # moving itself into the v2 cgroup before it joins any namespace (tests/shim/test_clone3_refused.py
    # has a whole shim, and an exec into a task, that way).
    def refused(flags, cgroup_fd=-1):
        raise OSError(errno.ENOSYS, "clone3 refused")

    monkeypatch.setattr(linux, "clone3", refused)
    monkeypatch.setattr(hierarchies, "_birth_in_v2", [])  # asked again, and refused
    assert cgroups.birth_in_v2_allowed() is False
    pause = await start(netns_path=make_netns(), cgroup=cgroup)
    assert forks == ["_child_a"] and cgroup.pids() == {pause.pid}
