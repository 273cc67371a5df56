"""shim.kernel.cgroups on the real kernel, under this process's own cgroups, with unique names."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys

import pytest

from shim.api.cgroups import expand_slice
from shim.kernel import cgroups, linux
from shim.kernel.cgroups import V2, SandboxCgroup, discover_hierarchies, hierarchies
from shim.kernel.cgroups import resources as resources_module
from shim.kernel.cgroups import sandbox as cgroup_sandbox
from shim.rpc.status import AlreadyExists, FailedPrecondition, InvalidArgument

WAIT = 10.0  # seconds; a bound for the test, not a readiness sleep


def _unique(kind: str) -> str:
    return f"podshim-test-{kind}-{os.getpid()}-{secrets.token_hex(4)}"


@pytest.fixture
def make_cgroup():
    """Create sandbox cgroups; each is emptied and removed afterwards, with the test's parents."""
    made: list[SandboxCgroup] = []

    def make(name: str | None = None, parent: str | None = None) -> SandboxCgroup:
        cgroup = SandboxCgroup.create(name or _unique("sb"), _unique("parent") if parent is None else parent)
        made.append(cgroup)
        return cgroup

    yield make
    for cgroup in made:
        cgroup.kill_all()
        cgroup.remove()
    # remove() keeps parents it did not make itself (another sandbox's); these are the test's.
    for parent in {os.path.dirname(path) for cgroup in made for path in cgroup.paths.values()}:
        if "podshim-test-parent-" in parent:
            try:
                os.rmdir(parent)
            except FileNotFoundError:
                pass


@pytest.fixture
def sleeper():
    """Start ``sleep 60`` children; each is killed and reaped afterwards (no reaper here)."""
    pids = []

    def start() -> int:
        pid = os.posix_spawn("/bin/sleep", ["/bin/sleep", "60"], {})
        pids.append(pid)
        return pid

    yield start
    for pid in pids:
        try:
            if os.waitpid(pid, os.WNOHANG) == (0, 0):  # unreaped: the pid is still our child's
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        except ChildProcessError:
            pass  # the test reaped it


def _own_cgroups() -> dict[str, str]:
    with open("/proc/self/cgroup") as f:
        return {names or V2: path for _, names, path in (line.rstrip("\n").split(":", 2) for line in f)}


def _wait_status(pid: int) -> int:
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_directory_in_every_writable_hierarchy(make_cgroup) -> None:
    cgroup = make_cgroup()
    assert set(cgroup.paths) | set(cgroup.skipped) == {h.key for h in discover_hierarchies()}
    assert all(os.path.isdir(path) for path in cgroup.paths.values())
    assert V2 in cgroup.paths


def test_relative_parent_nests_under_own_cgroup(make_cgroup) -> None:
    parent = _unique("parent")
    cgroup = make_cgroup("sb", parent)
    own = _own_cgroups()
    for hierarchy in discover_hierarchies():
        if hierarchy.key in cgroup.paths:
            expected = os.path.join(hierarchy.mountpoint, own[hierarchy.key].lstrip("/"), parent, "sb")
            assert cgroup.paths[hierarchy.key] == os.path.normpath(expected)


def test_default_parent_is_podshim(make_cgroup) -> None:
    name = _unique("sb")
    cgroup = SandboxCgroup.create(name)
    try:
        assert all(path.endswith(f"/podshim/{name}") for path in cgroup.paths.values())
        assert all(dirs == [os.path.dirname(path)] for path, dirs in zip(cgroup.paths.values(),
                                                                          cgroup.owned_parents.values(), strict=False))
    finally:
        cgroup.remove()


def test_default_parent_is_pruned_by_the_last_sandbox_even_if_it_did_not_make_it(monkeypatch) -> None:
    # A unique default parent, so no other sandbox on this machine can be using it.
    monkeypatch.setattr(cgroup_sandbox, "DEFAULT_PARENT", _unique("parent"))
    first = SandboxCgroup.create(_unique("sb"))
    try:
        second = SandboxCgroup.create(_unique("sb"))
    except BaseException:
        first.remove()
        raise
    first.remove()
    assert all(os.path.isdir(os.path.dirname(path)) for path in second.paths.values())
    second.remove()
    assert not any(os.path.exists(os.path.dirname(path)) for path in second.paths.values())


def test_a_given_parent_that_existed_is_kept(make_cgroup) -> None:
    first = make_cgroup()
    parent = os.path.basename(os.path.dirname(first.paths["pids"]))
    second = make_cgroup(parent=parent)  # found the parent: not its own
    second.remove()
    assert all(os.path.isdir(path) for path in first.paths.values())


def test_absolute_parent_is_relative_to_the_hierarchy_root(make_cgroup) -> None:
    # Under our own memory cgroup, so the test stays inside this session's memory accounting
    # (joined, not concatenated: that cgroup may be the root, "/").
    parent = os.path.join(_own_cgroups()["memory"], _unique("parent"))
    cgroup = make_cgroup("sb", parent)
    for hierarchy in discover_hierarchies():
        if hierarchy.key in cgroup.paths:
            assert cgroup.paths[hierarchy.key] == f"{hierarchy.mountpoint}{parent}/sb"


def test_cpuset_gets_cpus_and_mems_of_its_parent(make_cgroup) -> None:
    cgroup = make_cgroup()
    cpuset = cgroup.paths["cpuset"]
    for knob in ("cpuset.cpus", "cpuset.mems"):
        with open(os.path.join(cpuset, knob)) as mine, open(os.path.join(os.path.dirname(cpuset), knob)) as parent:
            assert mine.read() == parent.read() != "\n"


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a\0b"])
def test_bad_name_is_refused(name) -> None:
    with pytest.raises(InvalidArgument):
        SandboxCgroup.create(name, _unique("parent"))


@pytest.mark.parametrize("parent", ["../x", "a/../b", "a//b", "./a", "a\0b", "/.."])
def test_bad_parent_is_refused(parent) -> None:
    with pytest.raises(InvalidArgument):
        SandboxCgroup.create(_unique("sb"), parent)


def test_existing_cgroup_is_refused_and_left_intact(make_cgroup) -> None:
    cgroup = make_cgroup()
    parent = os.path.basename(os.path.dirname(cgroup.paths["pids"]))
    with pytest.raises(AlreadyExists):
        SandboxCgroup.create(cgroup.name, parent)
    assert all(os.path.isdir(path) for path in cgroup.paths.values())


def test_to_dict_round_trips_through_json(make_cgroup) -> None:
    cgroup = make_cgroup()
    assert SandboxCgroup.from_dict(json.loads(json.dumps(cgroup.to_dict()))) == cgroup


@pytest.mark.parametrize("record", [{}, {"name": "x", "paths": ["/a"]}, {"name": "x", "paths": {"cpu": "rel"}}])
def test_malformed_record_is_refused(record) -> None:
    with pytest.raises(InvalidArgument):
        SandboxCgroup.from_dict(record)


def test_join_moves_a_process_into_every_hierarchy(make_cgroup, sleeper) -> None:
    cgroup = make_cgroup()
    pid = sleeper()
    cgroup.join(pid)
    for procs in cgroup.procs_files():
        with open(procs) as f:
            assert str(pid) in f.read().split()
    assert cgroup.pids() == {pid}


def test_metrics_report_the_members_usage(make_cgroup, sleeper) -> None:
    cgroup = make_cgroup()
    cgroup.join(sleeper())
    metrics = cgroup.metrics()
    for name in ("cpu_usage_ns", "memory_usage_bytes", "pids_current"):
        assert isinstance(metrics[name], int) or name in metrics["unavailable"]
    if "pids_current" not in metrics["unavailable"]:
        assert metrics["pids_current"] == 1


def test_memory_limit_is_none_when_unlimited(make_cgroup) -> None:
    metrics = make_cgroup().metrics()
    assert metrics["memory_limit_bytes"] is None


def test_metrics_never_raise() -> None:
    gone = SandboxCgroup.from_dict({"name": "gone", "paths": {"memory": "/nonexistent/a", V2: "/nonexistent/b",
                                                              "cpuacct": "/nonexistent/c", "pids": "/nonexistent/d"}})
    metrics = gone.metrics()
    assert metrics["unavailable"] == ["cpu_usage_ns", "memory_usage_bytes", "memory_working_set_bytes",
                                      "memory_rss_bytes", "memory_page_faults", "memory_major_page_faults",
                                      "memory_limit_bytes", "pids_current", "memory_swap_bytes",
                                      "memory_swap_limit_bytes", "cpu_pressure", "memory_pressure", "io_pressure"]
    assert [metrics[k] for k in metrics["unavailable"]] == [None] * 13


def test_pressure_is_the_v2_directorys_psi_as_the_kernel_writes_it(make_cgroup, sleeper) -> None:
    cgroup = make_cgroup()
    cgroup.join(sleeper())
    metrics = cgroup.metrics()
    for name, file in (("cpu_pressure", "cpu.pressure"), ("memory_pressure", "memory.pressure"),
                       ("io_pressure", "io.pressure")):
        with open(os.path.join(cgroup.paths[V2], file)) as f:
            lines = {line.split()[0]: dict(p.split("=") for p in line.split()[1:]) for line in f}
        assert set(metrics[name]) == set(lines) and "some" in lines, name
        for kind, figures in metrics[name].items():
            assert set(figures) == {"avg10", "avg60", "avg300", "total_us"}
            assert 0 <= figures["total_us"] <= int(lines[kind]["total"])  # read after: it only grows
            assert all(isinstance(figures[k], float) for k in ("avg10", "avg60", "avg300"))


def test_swap_is_memsw_less_memory_and_its_limit_the_difference_of_the_limits(make_cgroup, sleeper) -> None:
    cgroup = make_cgroup()
    cgroup.join(sleeper())
    metrics = cgroup.metrics()
    assert isinstance(metrics["memory_swap_bytes"], int) and metrics["memory_swap_bytes"] >= 0
    assert metrics["memory_swap_limit_bytes"] is None and "memory_swap_limit_bytes" not in metrics["unavailable"]
    cgroup.update({"memory_limit_bytes": 64 << 20, "memory_swap_limit_bytes": 96 << 20})
    assert cgroup.metrics()["memory_swap_limit_bytes"] == 32 << 20


def test_on_cgroup_v2_alone_swap_and_pressure_come_from_its_files(tmp_path) -> None:
    files = {"memory.current": "1000", "memory.stat": "anon 600\ninactive_file 100\n", "memory.max": "4096",
             "memory.swap.current": "300", "memory.swap.max": "2048", "cgroup.procs": "",
             "cpu.pressure": "some avg10=1.50 avg60=0.25 avg300=0.00 total=1234\n"
                             "full avg10=0.00 avg60=0.00 avg300=0.00 total=56",
             "memory.pressure": "some avg10=0.00 avg60=0.00 avg300=0.00 total=7\n"
                                "full avg10=0.00 avg60=0.00 avg300=0.00 total=8",
             "io.pressure": "some avg10=0.00 avg60=0.00 avg300=0.00 total=9"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    metrics = SandboxCgroup.from_dict({"name": "v2", "paths": {V2: str(tmp_path)}}).metrics()
    assert (metrics["memory_swap_bytes"], metrics["memory_swap_limit_bytes"]) == (300, 2048)
    assert metrics["cpu_pressure"] == {"some": {"avg10": 1.5, "avg60": 0.25, "avg300": 0.0, "total_us": 1234},
                                       "full": {"avg10": 0.0, "avg60": 0.0, "avg300": 0.0, "total_us": 56}}
    assert metrics["io_pressure"] == {"some": {"avg10": 0.0, "avg60": 0.0, "avg300": 0.0, "total_us": 9}}
    (tmp_path / "memory.swap.max").write_text("max")
    (tmp_path / "cpu.pressure").write_text("some nonsense")
    metrics = SandboxCgroup.from_dict({"name": "v2", "paths": {V2: str(tmp_path)}}).metrics()
    assert metrics["memory_swap_limit_bytes"] is None and "memory_swap_limit_bytes" not in metrics["unavailable"]
    assert metrics["cpu_pressure"] is None and "cpu_pressure" in metrics["unavailable"]


def _memory_file(cgroup: SandboxCgroup, name: str) -> str:
    memory = next(path for key, path in cgroup.paths.items() if "memory" in key.split(","))
    return os.path.join(memory, name)


def test_working_set_is_usage_less_inactive_file_pages(make_cgroup, sleeper) -> None:
    cgroup = make_cgroup()
    cgroup.join(sleeper())
    metrics = cgroup.metrics()
    with open(_memory_file(cgroup, "memory.stat")) as f:
        stat = dict(line.split() for line in f)
    # Both read after metrics(): usage can only have grown by the sleeper's few pages since.
    assert 0 <= metrics["memory_working_set_bytes"] <= metrics["memory_usage_bytes"]
    assert metrics["memory_rss_bytes"] >= 0 and metrics["memory_page_faults"] <= int(stat["total_pgfault"])
    assert metrics["memory_major_page_faults"] <= int(stat["total_pgmajfault"])
    assert "memory_working_set_bytes" not in metrics["unavailable"]


def test_memory_a_member_touches_is_in_the_usage_and_working_set(make_cgroup) -> None:
    cgroup = make_cgroup()
    before = cgroup.metrics()
    ready_r, ready_w = os.pipe()
    # The child joins first, then touches 32 MiB (v1 charges pages where they are touched), says
    # so, and waits to be killed.
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            cgroup.join(0)
            block = bytearray(32 << 20)
            block[::4096] = b"x" * len(block[::4096])
            os.write(ready_w, b"1")
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
            signal.sigwait({signal.SIGUSR1})
        finally:
            os._exit(0)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"1"
        metrics = cgroup.metrics()
        assert metrics["memory_working_set_bytes"] - (before["memory_working_set_bytes"] or 0) >= 32 << 20
        assert metrics["memory_rss_bytes"] >= 32 << 20
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(ready_r)


# -- update ----------------------------------------------------------------------------------


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def _v1_file(cgroup: SandboxCgroup, controller: str, name: str) -> str:
    directory = next(path for key, path in cgroup.paths.items() if key != V2 and controller in key.split(","))
    return os.path.join(directory, name)


def test_update_writes_each_resource_to_its_cgroup_file(make_cgroup) -> None:
    cgroup = make_cgroup().child("task")
    cpus = _read(_v1_file(cgroup, "cpuset", "cpuset.cpus")).split(",")[0].split("-")[0]
    cgroup.update({"cpu_shares": 512, "cpu_period_us": 50000, "cpu_quota_us": 25000,
                   "memory_limit_bytes": 64 << 20, "memory_swap_limit_bytes": 128 << 20,
                   "cpuset_cpus": cpus, "cpuset_mems": "0", "pids_limit": 42})
    assert _read(_v1_file(cgroup, "cpu", "cpu.shares")) == "512"
    assert _read(_v1_file(cgroup, "cpu", "cpu.cfs_period_us")) == "50000"
    assert _read(_v1_file(cgroup, "cpu", "cpu.cfs_quota_us")) == "25000"
    assert _read(_memory_file(cgroup, "memory.limit_in_bytes")) == str(64 << 20)
    assert _read(_memory_file(cgroup, "memory.memsw.limit_in_bytes")) == str(128 << 20)
    assert _read(_v1_file(cgroup, "cpuset", "cpuset.cpus")) == cpus
    assert _read(_v1_file(cgroup, "pids", "pids.max")) == "42"


def test_update_leaves_absent_and_none_keys_alone(make_cgroup) -> None:
    cgroup = make_cgroup().child("task")
    shares = _read(_v1_file(cgroup, "cpu", "cpu.shares"))
    cgroup.update({"cpu_shares": None, "pids_limit": 7})
    assert _read(_v1_file(cgroup, "cpu", "cpu.shares")) == shares
    assert _read(_v1_file(cgroup, "pids", "pids.max")) == "7"


def test_update_minus_one_means_no_limit(make_cgroup) -> None:
    cgroup = make_cgroup().child("task")
    cgroup.update({"memory_limit_bytes": 64 << 20, "pids_limit": 5, "cpu_quota_us": 20000})
    cgroup.update({"memory_limit_bytes": -1, "pids_limit": -1, "cpu_quota_us": -1})
    assert int(_read(_memory_file(cgroup, "memory.limit_in_bytes"))) >= 1 << 62
    assert _read(_v1_file(cgroup, "pids", "pids.max")) == "max"
    assert _read(_v1_file(cgroup, "cpu", "cpu.cfs_quota_us")) == "-1"


def test_raising_memory_past_the_swap_limit_writes_swap_first(make_cgroup) -> None:
    cgroup = make_cgroup().child("task")
    cgroup.update({"memory_limit_bytes": 32 << 20, "memory_swap_limit_bytes": 32 << 20})
    cgroup.update({"memory_limit_bytes": 256 << 20, "memory_swap_limit_bytes": 512 << 20})
    assert _read(_memory_file(cgroup, "memory.limit_in_bytes")) == str(256 << 20)
    assert _read(_memory_file(cgroup, "memory.memsw.limit_in_bytes")) == str(512 << 20)


@pytest.mark.parametrize("resources,named", [
    ({"cpu_shares": 1}, "resources.cpu_shares 1 is out of range"),
    ({"cpu_period_us": 10}, "resources.cpu_period_us 10 is out of range"),
    ({"memory_limit_bytes": "64M"}, "resources.memory_limit_bytes must be an integer"),
    ({"memory_limit_bytes": 64 << 20, "memory_swap_limit_bytes": 32 << 20}, "resources.memory_swap_limit_bytes"),
    ({"cpuset_cpus": "all"}, "resources.cpuset_cpus must be a list"),
    ({"hugepage_limits": {"2MB": 2 << 20}}, r"resources.hugepage_limits\[2MB\] cannot be applied"),
    ({"hugepage_limits": {"3MB": 0}}, r"resources.hugepage_limits\[3MB\] cannot be applied: this kernel has no 3MB"),
    ({"unified": {"memory.high": "1G"}}, r"resources.unified\[memory.high\] cannot be applied: it is a cgroup v2 "
                                         r"file, and this host's memory controller is on cgroup v1"),
    ({"unified": {"cgroup.procs": "1"}}, r"resources.unified\[cgroup.procs\]: only a controller's file"),
    ({"blkio_weight": 10}, "resources.blkio_weight is not a resource podshim can update"),
])
def test_a_resource_that_cannot_be_applied_is_refused_by_name_and_nothing_is_written(make_cgroup, resources, named) -> None:
    cgroup = make_cgroup().child("task")
    shares = _read(_v1_file(cgroup, "cpu", "cpu.shares"))
    with pytest.raises(InvalidArgument, match=named):
        cgroup.update({"cpu_shares": 300, **resources})
    assert _read(_v1_file(cgroup, "cpu", "cpu.shares")) == shares


def test_a_write_the_kernel_refuses_puts_back_what_was_written_before_it(make_cgroup) -> None:
    cgroup = make_cgroup().child("task")
    shares = _read(_v1_file(cgroup, "cpu", "cpu.shares"))
    # CPU 4095 passes the check (a CPU list) but is not among the parent's CPUs.
    with pytest.raises(InvalidArgument, match="resources.cpuset_cpus: the kernel refused '4095'"):
        cgroup.update({"cpu_shares": 300, "cpuset_cpus": "4095"})
    assert _read(_v1_file(cgroup, "cpu", "cpu.shares")) == shares


def test_oom_score_adj_goes_to_every_member(make_cgroup, sleeper) -> None:
    cgroup = make_cgroup().child("task")
    pids = [sleeper(), sleeper()]
    for pid in pids:
        cgroup.join(pid)
    cgroup.update({"oom_score_adj": 500})
    assert [_read(f"/proc/{pid}/oom_score_adj") for pid in pids] == ["500", "500"]


def test_kill_all_sigkills_every_member(make_cgroup, sleeper) -> None:
    cgroup = make_cgroup()
    pids = [sleeper(), sleeper()]
    for pid in pids:
        cgroup.join(pid)
    cgroup.kill_all()
    assert [_wait_status(pid) for pid in pids] == [-signal.SIGKILL] * 2


def test_kill_all_sends_other_signals_to_each_member(make_cgroup, sleeper) -> None:
    cgroup = make_cgroup()
    pid = sleeper()
    cgroup.join(pid)
    cgroup.kill_all(signal.SIGTERM)
    assert _wait_status(pid) == -signal.SIGTERM


def test_remove_is_idempotent(make_cgroup) -> None:
    cgroup = make_cgroup()
    cgroup.remove()
    cgroup.remove()
    assert not any(os.path.exists(path) for path in cgroup.paths.values())
    assert not any(os.path.exists(d) for dirs in cgroup.owned_parents.values() for d in dirs)


def test_remove_keeps_a_parent_another_sandbox_uses(make_cgroup) -> None:
    first = make_cgroup()
    parent = os.path.basename(os.path.dirname(first.paths["pids"]))
    second = make_cgroup(parent=parent)
    first.remove()
    assert all(os.path.isdir(path) for path in second.paths.values())


def test_remove_removes_child_cgroups_first(make_cgroup) -> None:
    cgroup = make_cgroup()
    for path in cgroup.paths.values():
        os.mkdir(os.path.join(path, "container"))
    cgroup.remove()
    assert not any(os.path.exists(path) for path in cgroup.paths.values())


def test_remove_right_after_kill_all_succeeds(make_cgroup, sleeper) -> None:
    cgroup = make_cgroup()
    cgroup.join(sleeper())
    cgroup.kill_all()
    cgroup.remove()  # retries EBUSY while the killed task leaves
    assert not any(os.path.exists(path) for path in cgroup.paths.values())


def test_remove_with_a_live_member_is_refused(make_cgroup, sleeper) -> None:
    cgroup = make_cgroup()
    cgroup.join(sleeper())
    with pytest.raises(FailedPrecondition, match="still has processes"):
        cgroup.remove(timeout=0.05)


def test_child_is_made_in_every_hierarchy_of_its_parent(make_cgroup) -> None:
    parent = make_cgroup()
    child = parent.child("task")
    assert child.paths == {key: os.path.join(path, "task") for key, path in parent.paths.items()}
    assert all(os.path.isdir(path) for path in child.paths.values())
    assert child.owned_parents == {}


def test_child_joins_and_goes_with_its_parent(make_cgroup, sleeper) -> None:
    parent = make_cgroup()
    child = parent.child("task")
    pid = sleeper()
    child.join(pid)
    assert parent.pids() == child.pids() == {pid}
    parent.kill_all()
    parent.remove()
    assert not any(os.path.exists(path) for path in child.paths.values())


def test_child_named_like_a_control_file_is_refused(make_cgroup) -> None:
    parent = make_cgroup()
    with pytest.raises(InvalidArgument, match="control file"):
        parent.child("cgroup.procs")
    assert not any(os.path.isdir(os.path.join(path, "cgroup.procs")) for path in parent.paths.values())


def test_existing_child_is_refused(make_cgroup) -> None:
    parent = make_cgroup()
    parent.child("task")
    with pytest.raises(AlreadyExists):
        parent.child("task")


async def test_aremove_waits_for_members_without_blocking_the_loop(make_cgroup, sleeper) -> None:
    cgroup = make_cgroup()
    cgroup.join(sleeper())
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    running = asyncio.create_task(ticker())
    with pytest.raises(FailedPrecondition, match="still has processes"):
        await cgroup.aremove(timeout=0.05)
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running
    assert ticks > 10  # the loop kept running while aremove waited


def test_aremove_of_an_empty_cgroup_finishes_in_its_first_step(make_cgroup) -> None:
    cgroup = make_cgroup()
    removal = cgroup.aremove()
    with pytest.raises(StopIteration):
        removal.send(None)  # no task made, no turn of the event loop waited for
    assert not [path for path in cgroup.paths.values() if os.path.exists(path)]


async def test_a_cancelled_aremove_still_removes_the_cgroup_before_the_cancellation_is_raised(make_cgroup, sleeper) -> None:
    cgroup = make_cgroup()
    pid = sleeper()
    cgroup.join(pid)
    caller = asyncio.create_task(cgroup.aremove(timeout=WAIT))
    for _ in range(3):  # the caller runs, its removal starts and finds the cgroup busy
        await asyncio.sleep(0)
    caller.cancel()
    await asyncio.sleep(0)  # the cancellation reaches the caller...
    assert not caller.done()  # ...which waits for its removal
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert not [path for path in cgroup.paths.values() if os.path.exists(path)]


def test_read_only_hierarchy_is_skipped_and_recorded() -> None:
    # Read-only like v1 inside systemd-nspawn: a read-only bind remount in a private mount
    # namespace of a forked child, so the machine's own cgroup mounts are untouched.
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            linux.unshare(linux.CLONE_NEWNS)
            linux.mount(None, "/", None, linux.MS_PRIVATE | linux.MS_REC)
            pids_mount = next(h.mountpoint for h in discover_hierarchies() if h.key == "pids")
            linux.mount(None, pids_mount, None, linux.MS_REMOUNT | linux.MS_BIND | linux.MS_RDONLY)
            os.write(write_fd, json.dumps(SandboxCgroup.create(_unique("sb"), _unique("parent")).to_dict()).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    try:
        record = json.loads(os.read(read_fd, 65536))
    finally:
        os.close(read_fd)
        os.waitpid(pid, 0)
    cgroup = SandboxCgroup.from_dict(record)
    cgroup.remove()  # here the hierarchy is writable: the test process cleans up
    assert "pids" not in cgroup.paths and "Read-only" in cgroup.skipped["pids"]
    assert "memory" in cgroup.paths


def test_entry_files_are_v1_tasks_files_and_the_v2_directory(make_cgroup) -> None:
    cgroup = make_cgroup()
    tasks, v2_dirs = cgroups.entry_files(cgroup.procs_files())
    v1 = {key: path for key, path in cgroup.paths.items() if key != V2}
    assert sorted(tasks) == sorted(os.path.join(path, "tasks") for path in v1.values())
    assert v2_dirs == ([cgroup.paths[V2]] if V2 in cgroup.paths else [])


def _in_cgroup(pid: int, hierarchy_id: str) -> str:
    with open(f"/proc/{pid}/cgroup") as f:
        return next(line.rstrip("\n").split(":", 2)[2] for line in f if line.split(":", 1)[0] == hierarchy_id)


def test_a_thread_writing_0_to_tasks_moves_only_itself_and_a_child_is_born_in_the_v2_cgroup(make_cgroup) -> None:
    # What a launcher (shim.runtime.process) does: its one thread enters each v1 cgroup by its
    # tasks file, and its child is born in the v2 one (clone3 CLONE_INTO_CGROUP).
    cgroup = make_cgroup()
    if V2 not in cgroup.paths:
        pytest.skip("no cgroup v2 hierarchy on this machine")
    tasks, (v2_dir,) = cgroups.entry_files(cgroup.procs_files())
    report_r, report_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the launcher: one thread
        code = 1
        try:
            os.close(done_w)  # so that the child sees EOF once the test closes its end
            os.close(report_r)
            for path in tasks:
                linux.write_file(path, b"0")
            fd = os.open(v2_dir, os.O_RDONLY | os.O_DIRECTORY)
            child = linux.fork_into_cgroup(fd)
            if child == 0:
                os.write(report_w, b"%d\n" % os.getpid())
                os.read(done_r, 1)  # until the test is done looking
                os._exit(0)
            os.waitpid(child, 0)
            code = 0
        finally:
            os._exit(code)
    os.close(report_w)
    os.close(done_r)
    try:
        child = int(os.read(report_r, 32))
        # Both in every v1 cgroup; in v2 the child alone, born there: the launcher stayed put.
        for path in tasks:
            with open(os.path.join(os.path.dirname(path), "cgroup.procs")) as f:
                assert set(map(int, f.read().split())) == {pid, child}
        with open(os.path.join(v2_dir, "cgroup.procs")) as f:
            assert f.read().split() == [str(child)]
        assert cgroup.paths[V2].endswith(_in_cgroup(child, "0")) and _in_cgroup(pid, "0") != _in_cgroup(child, "0")
    finally:
        os.close(done_w)
        os.close(report_r)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_holds_of_processes_that_are_gone_are_swept_with_the_parents_they_kept(monkeypatch) -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)  # a pid nobody has now
    namespace = _unique("ns")
    monkeypatch.setattr(os, "getpid", lambda: pid)
    stale = cgroups.hold_parent(f"{cgroup_sandbox.DEFAULT_PARENT}/{namespace}")
    monkeypatch.setattr(os, "getpid", lambda: 1)
    live = cgroups.hold_parent(f"{cgroup_sandbox.DEFAULT_PARENT}/{namespace}x")  # a live process's (PID 1)
    monkeypatch.undo()
    own = cgroups.hold_parent(f"{cgroup_sandbox.DEFAULT_PARENT}/{namespace}y")  # ours: swept (see its docstring)
    try:
        assert all(os.path.basename(path) == f".held-by-{pid}" for path in stale.paths.values())
        removed = cgroups.remove_stale_holds()
        assert set(stale.paths.values()) | set(own.paths.values()) <= set(removed)
        assert not any(os.path.exists(os.path.dirname(path)) for path in stale.paths.values())
        assert all(os.path.isdir(path) for path in live.paths.values())
    finally:
        stale.remove()
        live.remove()
        own.remove()
    assert not any(os.path.exists(os.path.dirname(path)) for path in live.paths.values())


def test_the_cgroup_mounts_are_read_again_when_a_mount_point_is_no_longer_what_it_was() -> None:
    first = hierarchies._cgroup_mounts()
    assert first and hierarchies._cgroup_mounts() == first  # the kept reading, checked by device
    mount, dev = hierarchies._mounts_seen[0]
    hierarchies._mounts_seen[0] = (mount, dev + 1)  # as if another filesystem were mounted there now
    try:
        assert hierarchies._cgroup_mounts() == first  # read again from mountinfo
        assert hierarchies._mounts_seen[0] == (mount, dev)
    finally:
        hierarchies._mounts_seen[0] = (mount, dev)


def test_the_hierarchies_are_found_anew_once_the_process_is_in_other_cgroups(make_cgroup) -> None:
    cgroup = make_cgroup()
    before = {h.key: h.own_path for h in discover_hierarchies()}  # the answer kept
    report_r, report_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(report_r)
            cgroup.join(0)
            os.write(report_w, json.dumps({h.key: h.own_path for h in discover_hierarchies()}).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(report_w)
    try:
        with os.fdopen(report_r, "rb") as f:
            after = json.loads(f.read() or b"{}")
    finally:
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert set(after) == set(before)
    for key, path in cgroup.paths.items():
        assert after[key] != before[key] and path.endswith(after[key])


def test_a_missing_directory_counts_as_v1_even_below_the_v2_mount() -> None:
    v2 = next((h for h in discover_hierarchies() if h.key == V2), None)
    if v2 is None:
        pytest.skip("no cgroup v2 hierarchy on this machine")
    missing = os.path.join(v2.mountpoint, _unique("missing"))
    assert cgroups.entry_files([os.path.join(missing, "cgroup.procs")]) == ([os.path.join(missing, "tasks")], [])


def test_a_sandbox_below_a_held_parent_leaves_the_parents_to_whoever_removes_the_hold(monkeypatch) -> None:
    parent = f"{cgroup_sandbox.DEFAULT_PARENT}/{_unique('ns')}"
    hold = cgroups.hold_parent(parent)
    try:
        cgroup = SandboxCgroup.create(_unique("sb"), parent)
        removed: list[str] = []
        real_rmdir = os.rmdir

        def rmdir(path, *args, **kwargs):
            removed.append(path)
            return real_rmdir(path, *args, **kwargs)

        with monkeypatch.context() as patched:
            patched.setattr(os, "rmdir", rmdir)
            cgroup.remove()
        assert sorted(removed) == sorted(cgroup.paths.values())  # no parent tried: the hold keeps them
        assert all(os.path.isdir(os.path.dirname(path)) for path in cgroup.paths.values())
    finally:
        hold.remove()
    assert not any(os.path.exists(os.path.dirname(path)) for path in hold.paths.values())


def test_the_last_sandbox_below_a_parent_whose_hold_is_gone_prunes_it() -> None:
    parent = f"{cgroup_sandbox.DEFAULT_PARENT}/{_unique('ns')}"
    hold = cgroups.hold_parent(parent)
    cgroup = SandboxCgroup.create(_unique("sb"), parent)
    try:
        hold.remove()  # the parents stay: the sandbox is in them
        assert all(os.path.isdir(os.path.dirname(path)) for path in cgroup.paths.values())
    finally:
        cgroup.remove()
    assert not any(os.path.exists(os.path.dirname(path)) for path in cgroup.paths.values())


@pytest.mark.parametrize("pool,refused", [(0, False), (4, True)])
def test_a_zero_hugepage_limit_without_a_hugetlb_hierarchy_holds_only_when_no_such_page_can_be_had(
        make_cgroup, monkeypatch, tmp_path, pool, refused) -> None:
    # kubelet sends a limit, 0 unless asked, for every page size the node has, with every container.
    sizes = tmp_path / "hugepages-2048kB"
    sizes.mkdir()
    (sizes / "nr_hugepages").write_text(f"{pool}\n")
    (sizes / "nr_overcommit_hugepages").write_text("0\n")
    monkeypatch.setattr(resources_module, "HUGEPAGES_DIR", str(tmp_path))
    cgroup = make_cgroup().child("task")
    if any("hugetlb" in key.split(",") for key in cgroup.paths):
        cgroup.update({"hugepage_limits": {"2MB": 0}})  # a hierarchy to write it to: always applied
        assert _read(_v1_file(cgroup, "hugetlb", "hugetlb.2MB.limit_in_bytes")) == "0"
    elif refused:
        with pytest.raises(InvalidArgument, match=r"resources.hugepage_limits\[2MB\] cannot be applied: this host's hugetlb "
                                                  "controller is neither mounted on cgroup v1"):
            cgroup.check({"hugepage_limits": {"2MB": 0}})
    else:
        cgroup.check({"hugepage_limits": {"2MB": 0}})
        cgroup.update({"hugepage_limits": {"2MB": 0}})


def test_the_oom_killer_s_kills_are_counted_from_the_cgroup(make_cgroup) -> None:
    cgroup = make_cgroup().child("task")
    cgroup.update({"memory_limit_bytes": 16 << 20, "memory_swap_limit_bytes": 16 << 20})
    assert cgroup.oom_kills() == 0
    # It waits for a line on stdin, so that it is in the cgroup before it allocates 64 MiB.
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline(); b = b'x' * (64 << 20)"],
                             stdin=subprocess.PIPE)
    try:
        cgroup.join(child.pid)
        child.communicate(b"go\n", timeout=30)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    assert cgroup.oom_kills() == 1


# -- cgroup v2 (a fake v2 directory: this host's controllers are all on v1) ----------------------


@pytest.fixture
def v2_task(tmp_path):
    """A task cgroup whose only directory is a v2 one with the files a pure v2 host gives it."""
    files = {"cgroup.controllers": "cpuset cpu io memory hugetlb pids", "cpu.weight": "100", "cpu.max": "max 100000",
             "memory.max": "max", "memory.swap.max": "max", "pids.max": "max", "cpuset.cpus": "",
             "cpuset.mems": "", "hugetlb.2MB.max": "max", "memory.high": "max"}
    for name, text in files.items():
        (tmp_path / name).write_text(text + "\n")
    return SandboxCgroup("task", {V2: str(tmp_path)})


def _write_v2(cgroup: SandboxCgroup, name: str, text: str) -> None:
    with open(os.path.join(cgroup.paths[V2], name), "w") as f:
        f.write(text)


def _plan(cgroup: SandboxCgroup, resources: dict) -> dict[str, tuple[str, str]]:
    return {key: (os.path.basename(path), value.decode()) for key, path, value in
            resources_module.planned_writes(resources, cgroup.v1_paths(), cgroup.paths.get(V2), lambda: ())}


def test_on_cgroup_v2_each_cri_resource_goes_to_its_v2_file_converted(v2_task, monkeypatch) -> None:
    monkeypatch.setattr(resources_module, "huge_page_pool", lambda size: 4)
    assert _plan(v2_task, {"cpu_shares": 1024, "cpu_period_us": 50000, "cpu_quota_us": 25000,
                           "memory_limit_bytes": 64 << 20, "memory_swap_limit_bytes": 96 << 20,
                           "cpuset_cpus": "0", "cpuset_mems": "0", "pids_limit": 42,
                           "hugepage_limits": {"2MB": 4 << 20}, "unified": {"memory.high": "32M"}}) == {
        "cpu_shares": ("cpu.weight", "39"),
        "cpu_period_us": ("cpu.max", "25000 50000"),
        "memory_limit_bytes": ("memory.max", str(64 << 20)),
        "memory_swap_limit_bytes": ("memory.swap.max", str(32 << 20)),
        "cpuset_cpus": ("cpuset.cpus", "0"),
        "cpuset_mems": ("cpuset.mems", "0"),
        "pids_limit": ("pids.max", "42"),
        "hugepage_limits[2MB]": ("hugetlb.2MB.max", str(4 << 20)),
        "unified[memory.high]": ("memory.high", "32M"),
    }


@pytest.mark.parametrize("shares,weight", [(2, 1), (1024, 39), (262144, 10000)])
def test_cpu_shares_become_the_weight_runc_and_crun_write(shares, weight) -> None:
    assert cgroups.cpu_weight(shares) == weight


def test_on_cgroup_v2_minus_one_is_max_and_a_lone_quota_keeps_the_period(v2_task) -> None:
    _write_v2(v2_task, "cpu.max", "max 20000\n")
    assert _plan(v2_task, {"cpu_quota_us": 10000, "memory_limit_bytes": -1, "memory_swap_limit_bytes": -1,
                           "pids_limit": -1}) == {
        "cpu_quota_us": ("cpu.max", "10000 20000"), "memory_limit_bytes": ("memory.max", "max"),
        "memory_swap_limit_bytes": ("memory.swap.max", "max"), "pids_limit": ("pids.max", "max")}
    assert _plan(v2_task, {"cpu_quota_us": -1}) == {"cpu_quota_us": ("cpu.max", "max 20000")}


def test_on_cgroup_v2_a_swap_limit_needs_a_memory_limit_to_subtract(v2_task) -> None:
    with pytest.raises(InvalidArgument, match=r"memory_swap_limit_bytes 1048576 cannot be applied without a memory"):
        _plan(v2_task, {"memory_swap_limit_bytes": 1 << 20})
    _write_v2(v2_task, "memory.max", f"{2 << 20}\n")
    with pytest.raises(InvalidArgument, match="is below the memory limit 2097152"):
        _plan(v2_task, {"memory_swap_limit_bytes": 1 << 20})
    assert _plan(v2_task, {"memory_swap_limit_bytes": 2 << 20}) == {
        "memory_swap_limit_bytes": ("memory.swap.max", "0")}


def test_on_cgroup_v2_a_controller_not_enabled_is_refused_by_name(v2_task) -> None:
    _write_v2(v2_task, "cgroup.controllers", "cpu\n")
    with pytest.raises(InvalidArgument, match="resources.pids_limit cannot be applied: this host's pids controller is "
                                              "neither mounted on cgroup v1 nor enabled"):
        _plan(v2_task, {"cpu_shares": 512, "pids_limit": 3})


def test_on_pure_v2_controllers_are_handed_down_from_the_parents_top_to_the_sandbox(tmp_path, monkeypatch) -> None:
    sandbox = tmp_path / "kubepods" / "sb"
    sandbox.mkdir(parents=True)
    for directory in (tmp_path, tmp_path / "kubepods", sandbox):
        (directory / "cgroup.controllers").write_text("memory pids cpu rdma\n")
        (directory / "cgroup.subtree_control").write_text("memory\n" if directory == tmp_path else "\n")
    written = []
    monkeypatch.setattr(linux, "write_file", lambda path, data: written.append((os.path.relpath(path, tmp_path), data)))
    assert cgroup_sandbox._enable_controllers(str(tmp_path), str(sandbox)) == ["cpu", "memory", "pids"]
    assert written == [("cgroup.subtree_control", b"+cpu"), ("cgroup.subtree_control", b"+pids"),
                       *[(f"{level}/cgroup.subtree_control", b"+" + c) for level in ("kubepods", "kubepods/sb")
                         for c in (b"cpu", b"memory", b"pids")]]


def test_a_sandbox_that_hands_controllers_to_its_tasks_keeps_its_own_processes_in_a_leaf(tmp_path, monkeypatch) -> None:
    hierarchy = cgroups.Hierarchy(V2, frozenset(), str(tmp_path), "/", "/")
    monkeypatch.setattr(cgroup_sandbox, "discover_hierarchies", lambda: [hierarchy])
    monkeypatch.setattr(cgroup_sandbox, "_enable_controllers", lambda top, target: ["cpu", "memory"])
    cgroup = SandboxCgroup.create("sb", "/pods")
    try:
        assert cgroup.paths == {V2: str(tmp_path / "pods" / "sb")}
        assert cgroup.procs_files() == [str(tmp_path / "pods" / "sb" / cgroups.PAUSE_LEAF / "cgroup.procs")]
        assert SandboxCgroup.from_dict(json.loads(json.dumps(cgroup.to_dict()))).process_paths() == {
            V2: str(tmp_path / "pods" / "sb" / cgroups.PAUSE_LEAF)}
        assert cgroup.child("task").procs_files() == [str(tmp_path / "pods" / "sb" / "task" / "cgroup.procs")]
    finally:
        cgroup.remove()
    assert not (tmp_path / "pods").exists()


def test_on_cgroup_v2_the_figures_come_from_the_v2_files(v2_task) -> None:
    for name, text in {"cpu.stat": "usage_usec 5\nuser_usec 3\n", "memory.current": "4096\n",
                       "memory.stat": "anon 1024\ninactive_file 1000\npgfault 3\npgmajfault 1\n",
                       "pids.current": "4\n", "memory.events": "low 0\noom 1\noom_kill 2\n",
                       "memory.swap.current": "0\n", "memory.max": "8192\n",
                       "memory.pressure": "some avg10=0.00 avg60=0.00 avg300=0.00 total=7\n"}.items():
        _write_v2(v2_task, name, text)
    metrics = v2_task.metrics()
    assert {key: metrics[key] for key in ("cpu_usage_ns", "memory_usage_bytes", "memory_working_set_bytes",
                                          "memory_rss_bytes", "memory_page_faults", "memory_major_page_faults",
                                          "memory_limit_bytes", "pids_current", "memory_swap_bytes",
                                          "memory_swap_limit_bytes")} == {
        "cpu_usage_ns": 5000, "memory_usage_bytes": 4096, "memory_working_set_bytes": 3096, "memory_rss_bytes": 1024,
        "memory_page_faults": 3, "memory_major_page_faults": 1, "memory_limit_bytes": 8192, "pids_current": 4,
        "memory_swap_bytes": 0, "memory_swap_limit_bytes": None}
    assert metrics["memory_pressure"]["some"]["total_us"] == 7
    assert v2_task.oom_kills() == 2


def test_on_pure_v2_the_default_parent_is_at_the_root_as_our_own_cgroup_has_processes(tmp_path, monkeypatch) -> None:
    hierarchy = cgroups.Hierarchy(V2, frozenset(), str(tmp_path), "/", "/system.slice/podshimd.service")
    monkeypatch.setattr(cgroup_sandbox, "discover_hierarchies", lambda: [hierarchy])
    default = SandboxCgroup.create("sb", f"{cgroup_sandbox.DEFAULT_PARENT}/k8s.io")
    given = SandboxCgroup.create("sb", "mine")
    try:
        assert default.paths == {V2: str(tmp_path / cgroup_sandbox.DEFAULT_PARENT / "k8s.io" / "sb")}
        assert given.paths == {V2: str(tmp_path / "system.slice" / "podshimd.service" / "mine" / "sb")}
    finally:
        default.remove()
        given.remove()


def test_details_on_cgroup_v2_alone_come_from_its_files(tmp_path) -> None:
    files = {"cgroup.controllers": "cpu io memory pids", "cgroup.procs": "",
             "io.stat": "8:0 rbytes=4096 wbytes=512 rios=2 wios=1 dbytes=0 dios=0\n",
             "cpu.stat": "usage_usec 5000\nuser_usec 3000\nsystem_usec 2000\nnr_periods 7\nnr_throttled 2\n"
                         "throttled_usec 40\n",
             "cpu.max": "20000 100000", "cpu.weight": "100", "memory.current": "1000",
             "memory.stat": "anon 600\nfile 300\nfile_mapped 50\nkernel 70\nactive_file 200\ninactive_file 100\n"
                            "pgfault 9\npgmajfault 1\n",
             "memory.peak": "1500", "memory.low": "0", "memory.events": "low 0\nhigh 0\nmax 0\noom 1\noom_kill 1\n",
             "pids.max": "max"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    details = SandboxCgroup.from_dict({"name": "v2", "paths": {V2: str(tmp_path)}}).details()
    assert details == {
        "cpu_user_ns": 3_000_000, "cpu_system_ns": 2_000_000, "cpu_periods": 7, "cpu_throttled_periods": 2,
        "cpu_throttled_ns": 40_000, "cpu_period_us": 100000, "cpu_quota_us": 20000, "cpu_shares": 2597,
        "memory_cache_bytes": 300, "memory_mapped_file_bytes": 50, "memory_rss_bytes": 600, "memory_page_faults": 9,
        "memory_major_page_faults": 1, "memory_active_file_bytes": 200, "memory_inactive_file_bytes": 100,
        "memory_kernel_bytes": 70, "memory_failcnt": None, "memory_max_usage_bytes": 1500,
        "memory_reservation_bytes": None, "oom_kills": 1, "pids_max": 0,
        "block_io": {"8:0": {"read_bytes": 4096, "write_bytes": 512, "reads": 2, "writes": 1}}}


def test_details_of_a_member_match_the_v1_files(make_cgroup, sleeper) -> None:
    cgroup = make_cgroup()
    cgroup.update({"cpu_quota_us": 20000, "cpu_period_us": 100000, "memory_limit_bytes": 64 << 20})
    cgroup.join(sleeper())
    details = cgroup.details()
    v1 = {c: path for key, path in cgroup.paths.items() if key != V2 for c in key.split(",")}
    if "cpu" in v1:
        assert (details["cpu_period_us"], details["cpu_quota_us"]) == (100000, 20000)
        with open(os.path.join(v1["cpu"], "cpu.shares")) as f:
            assert details["cpu_shares"] == int(f.read())
    if "memory" in v1:
        with open(os.path.join(v1["memory"], "memory.failcnt")) as f:
            assert details["memory_failcnt"] == int(f.read())
        assert details["memory_max_usage_bytes"] >= 0 and details["oom_kills"] == 0
    assert details["cpu_user_ns"] is None or details["cpu_user_ns"] >= 0


def test_details_never_raise() -> None:
    gone = SandboxCgroup.from_dict({"name": "gone", "paths": {"memory": "/nonexistent/a", V2: "/nonexistent/b",
                                                              "cpu,cpuacct": "/nonexistent/c", "pids": "/nonexistent/d"}})
    assert set(gone.details().values()) == {None}
    assert set(gone.process_counts().values()) == {0}  # no directory, no process


def test_process_counts_are_the_members_threads_descriptors_and_sockets(make_cgroup, sleeper) -> None:
    cgroup = make_cgroup()
    pid = sleeper()
    cgroup.join(pid)
    counts = cgroup.process_counts()
    fds = os.listdir(f"/proc/{pid}/fd")
    sockets = sum(os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:") for fd in fds)
    assert counts == {"processes": 1, "threads": 1, "file_descriptors": len(fds), "sockets": sockets}


@pytest.mark.cgroupv2
def test_on_pure_v2_a_sandbox_hands_its_tasks_controllers_keeps_its_pause_in_a_leaf_and_limits_land(
        make_cgroup, sleeper) -> None:
    cgroup = make_cgroup(parent="/" + _unique("parent"))
    task = cgroup.child("task")
    assert {"cpu", "memory", "pids"} <= set(_read(os.path.join(cgroup.paths[V2], "cgroup.subtree_control")).split())
    assert _read(os.path.join(task.paths[V2], "cgroup.subtree_control")) == ""  # a leaf hands nothing down
    pid = sleeper()
    cgroup.join(pid)
    assert _read(os.path.join(cgroup.paths[V2], cgroups.PAUSE_LEAF, "cgroup.procs")) == str(pid)
    task.update({"cpu_shares": 512, "cpu_quota_us": 25000, "cpu_period_us": 50000, "memory_limit_bytes": 64 << 20,
                 "memory_swap_limit_bytes": 96 << 20, "pids_limit": 42, "unified": {"memory.high": str(48 << 20)}})
    files = {name: _read(os.path.join(task.paths[V2], name))
             for name in ("cpu.weight", "cpu.max", "memory.max", "memory.swap.max", "pids.max", "memory.high")}
    assert files == {"cpu.weight": "20", "cpu.max": "25000 50000", "memory.max": str(64 << 20),
                     "memory.swap.max": str(32 << 20), "pids.max": "42", "memory.high": str(48 << 20)}
    task.update({"memory_limit_bytes": -1, "cpu_quota_us": -1})
    assert (_read(os.path.join(task.paths[V2], "memory.max")), _read(os.path.join(task.paths[V2], "cpu.max"))) == (
        "max", "max 50000")


def _unit_property(unit: str, name: str) -> str:
    out = subprocess.run(["systemctl", "show", "-p", name, "--value", unit], capture_output=True, text=True,
                         timeout=60)
    return out.stdout.strip()


def _unit_state(unit: str) -> str:
    return _unit_property(unit, "ActiveState")


@pytest.fixture
def test_slice():
    """A slice name for the test's scopes, as kubelet names a pod's, stopped (with what is left in
    it) at the end."""
    top = _unique("podshimtest").replace("-", "")
    yield f"{top}-burstable-pod{secrets.token_hex(4)}.slice"
    subprocess.run(["systemctl", "stop", f"{top}.slice"], capture_output=True, timeout=60)


@pytest.mark.cgroupv2
async def test_under_the_systemd_driver_a_sandbox_is_a_slice_its_pause_and_tasks_scopes_stopped_on_removal(
        test_slice, sleeper) -> None:
    pod_slice = cgroups.systemd.pod_slice_name(test_slice, "it", _unique("sb"))
    pause_unit = cgroups.systemd.scope_name("it", "sb")
    cgroup = SandboxCgroup.pod_slice("sb", test_slice, pod_slice, pause_unit)
    directory = cgroup.paths[V2]
    assert directory == "/sys/fs/cgroup" + expand_slice(pod_slice)
    assert SandboxCgroup.from_dict(json.loads(json.dumps(cgroup.to_dict()))).to_dict() == cgroup.to_dict()
    task = cgroup.task_scope("task", cgroups.systemd.scope_name("it", "sb", "task"))
    try:
        await cgroup.start_units({"cpu_shares": 512, "memory_limit_bytes": 128 << 20})
        # The pod's resources: the slice's properties from its start (systemd writes its files).
        assert (_unit_property(pod_slice, "CPUWeight"), _read(os.path.join(directory, "cpu.weight"))) == ("20", "20")
        assert _read(os.path.join(directory, "memory.max")) == str(128 << 20)
        # A unified file systemd owns is said as its property; one it has no property for is refused.
        await cgroup.aupdate({"unified": {"memory.high": "100007936"}})
        assert (_unit_property(pod_slice, "MemoryHigh"), _read(os.path.join(directory, "memory.high"))) == (
            "100007936", "100007936")
        with pytest.raises(InvalidArgument, match=r"unified\[memory.oom.group\] cannot be applied to a pod under "
                                                  "the systemd cgroup driver"):
            await cgroup.aupdate({"unified": {"memory.oom.group": "1"}})
        assert _read(os.path.join(directory, "memory.oom.group")) == "0"
        await cgroup.aupdate({"pids_limit": 99})
        assert _unit_property(pod_slice, "TasksMax") == "99"
        pid = sleeper()
        cgroup.join(pid)  # into the pause's scope
        cgroup.release_placeholder()
        assert _read(os.path.join(directory, pause_unit, "cgroup.procs")) == str(pid)
        assert _unit_property(pause_unit, "ActiveState") == "active"
        await task.start_units()
        assert _unit_property(task.unit, "ActiveState") == "active" and os.path.dirname(task.paths[V2]) == directory
        # A task's scope: its files written, and what systemd owns set on the unit too.
        with pytest.raises(RuntimeError, match="is updated with aupdate"):
            task.update({"pids_limit": 42})
        await task.aupdate({"memory_limit_bytes": 64 << 20, "pids_limit": 42})
        assert (_read(os.path.join(task.paths[V2], "memory.max")), _read(os.path.join(task.paths[V2], "pids.max"))) == (
            str(64 << 20), "42")
        assert (_unit_property(task.unit, "MemoryMax"), _unit_property(task.unit, "TasksMax")) == (str(64 << 20), "42")
        await task.aremove(timeout=10)  # its placeholder the only process: released, the scope stopped
        assert _unit_state(task.unit) == "inactive" and not os.path.exists(task.paths[V2])
    finally:
        cgroup.kill_all()
        await cgroup.aremove(timeout=10)
        await cgroups.systemd.close_manager()
    assert not os.path.exists(directory)
    assert [_unit_state(unit) for unit in (pod_slice, pause_unit)] == ["inactive"] * 2


@pytest.mark.cgroupv2
def test_a_pod_slice_whose_placeholder_goes_before_any_process_came_leaves_nothing(test_slice) -> None:
    pod_slice = cgroups.systemd.pod_slice_name(test_slice, "it", _unique("sb"))
    cgroup = SandboxCgroup.pod_slice("sb", test_slice, pod_slice, cgroups.systemd.scope_name("it", "sb"))

    async def start() -> None:
        try:
            await cgroup.start_units()
        finally:
            await cgroups.systemd.close_manager()

    asyncio.run(start())
    cgroup.remove(timeout=10)  # without an event loop: podshim delete's way
    assert not os.path.exists(cgroup.paths[V2]) and _unit_state(pod_slice) == "inactive"
