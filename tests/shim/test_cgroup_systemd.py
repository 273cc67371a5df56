"""The systemd cgroup driver's rules that need no systemd: slice names expanded as systemd expands
them, unit names escaped, parents checked against the driver, resources as unit properties, and
the sandbox options that ask for it; the bus, against a stand-in for systemd's manager on a private
bus (the loop keeps serving while a unit's job runs). The driver itself, with systemd, runs in the cgroup v2 guest
(tests/shim/test_kernel_cgroups.py and test_shim_task_ops.py, marker ``cgroupv2``)."""

from __future__ import annotations

import re
import time

import pytest

from shim.api import cgroups as drivers
from shim.kernel.cgroups import SandboxCgroup, systemd
from shim.rpc.status import FailedPrecondition, InvalidArgument
from shim.runtime.oci.host import systemd_cgroups_path
from shim.sandbox.options import SandboxOptions

from support.bustools import fake_systemd
from support.looptools import loop_stalls

__all__ = ["fake_systemd"]  # a fixture


@pytest.mark.parametrize("name,path", [
    ("kubepods.slice", "/kubepods.slice"),
    ("kubepods-burstable.slice", "/kubepods.slice/kubepods-burstable.slice"),
    ("kubepods-burstable-pod1234_5678.slice",
     "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_5678.slice"),
    ("-.slice", "/"),
])
def test_a_slice_name_expands_to_the_path_systemd_gives_it(name, path) -> None:
    assert drivers.expand_slice(name) == path


@pytest.mark.parametrize("name", ["kubepods--x.slice", "-kubepods.slice", "kubepods-.slice", "a/b.slice",
                                  "kubepods.scope", ".slice"])
def test_a_name_systemd_refuses_as_a_slice_is_refused_by_name(name) -> None:
    with pytest.raises(InvalidArgument, match="is not a slice name systemd accepts"):
        drivers.expand_slice(name)


def test_a_scope_name_escapes_what_would_read_as_nesting() -> None:
    assert systemd.scope_name("k8s.io", "ab12") == "podshim-k8s.io-ab12.scope"
    assert systemd.scope_name("my-ns", "pod-1") == "podshim-my\\x2dns-pod\\x2d1.scope"
    assert systemd.escape(".hidden") == "\\x2ehidden"


def test_a_pod_has_a_slice_of_its_own_in_its_parent_and_its_pause_and_tasks_scopes_in_it_named_apart() -> None:
    assert systemd.pod_slice_name("kubepods-burstable-pod12.slice", "k8s.io", "ab12") == \
        "kubepods-burstable-pod12-podshim_k8s.io_ab12.slice"
    assert systemd.pod_slice_name("-.slice", "a_b", "c") == "podshim_a\\x5fb_c.slice"  # "_" only between parts
    assert drivers.expand_slice(systemd.pod_slice_name("podshim.slice", "default", "ab12")) == \
        "/podshim.slice/podshim-podshim_default_ab12.slice"
    assert systemd.scope_name("k8s.io", "ab12", "ctr-1") == "podshim-k8s.io-ab12-ctr\\x2d1.scope"


def test_an_oci_runtime_is_given_its_scope_as_slice_prefix_and_name_as_containerd_gives_it() -> None:
    pod_slice = "kubepods-pod12-podshim_k8s.io_ab12.slice"
    for scope in (systemd.scope_name("k8s.io", "ab12"), systemd.scope_name("my-ns", "ab12", "ctr")):
        path = systemd.runtime_cgroups_path(pod_slice, scope)
        slice_name, prefix, name = path.split(":")
        assert (slice_name, f"{prefix}-{name}.scope") == (pod_slice, scope)  # the unit runc and crun make
    assert systemd.runtime_cgroups_path(pod_slice, "podshim-k8s.io-ab12-c1.scope") == \
        f"{pod_slice}:podshim-k8s.io:ab12-c1"


def test_a_pod_slices_resources_are_properties_and_one_systemd_has_none_for_is_refused_by_name() -> None:
    assert dict(systemd.slice_properties({"cpu_shares": 512, "memory_limit_bytes": 1 << 30, "pids_limit": None})) == {
        "CPUWeight": ("t", 20), "MemoryMax": ("t", 1 << 30)}
    for resources, message in (
            ({"hugepage_limits": {"2MB": 0}}, "resources.hugepage_limits cannot be applied to a pod under the systemd"),
            ({"unified": {"memory.high": "1", "memory.oom.group": "1"}},
             "resources.unified\\[memory.oom.group\\] cannot be applied to a pod under the systemd"),
            ({"unified": "pids.max=5"}, "resources.unified cannot be applied to a pod under the systemd"),
            ({"memory_swap_limit_bytes": 1 << 30}, "memory \\+ swap needs a memory limit"),
            ({"cpu_shares": "512"}, "resources.cpu_shares must be an integer >= -1"),
            ({"cpuset_cpus": "0-x"}, "not CPU lists")):
        with pytest.raises(InvalidArgument, match=message):
            systemd.slice_properties(resources)


def test_a_pod_slices_cgroup_record_names_its_units_and_a_malformed_one_is_refused() -> None:
    record = {"name": "ab12", "paths": {"unified": "/sys/fs/cgroup/podshim.slice/podshim-podshim_default_ab12.slice"},
              "leaf": "podshim-default-ab12.scope", "unit": "podshim-podshim_default_ab12.slice"}
    cgroup = SandboxCgroup.from_dict(record)
    assert cgroup.is_slice and cgroup.process_paths() == {
        "unified": "/sys/fs/cgroup/podshim.slice/podshim-podshim_default_ab12.slice/podshim-default-ab12.scope"}
    assert systemd_cgroups_path(cgroup) == "podshim-podshim_default_ab12.slice:podshim-default:ab12"
    task = cgroup.task_scope("c1", systemd.scope_name("default", "ab12", "c1"))
    assert systemd_cgroups_path(task) == "podshim-podshim_default_ab12.slice:podshim-default:ab12-c1"
    with pytest.raises(InvalidArgument, match="malformed cgroup record: leaf"):
        SandboxCgroup.from_dict({**record, "leaf": "../x.scope"})
    with pytest.raises(InvalidArgument, match="malformed cgroup record: unit"):
        SandboxCgroup.from_dict({**record, "unit": "x.service", "leaf": ""})


def test_under_cgroupfs_a_slice_parent_is_refused_not_made_into_a_directory() -> None:
    with pytest.raises(InvalidArgument, match="is a systemd slice, and the cgroup driver is cgroupfs"):
        drivers.check_parent("kubepods-burstable-pod12.slice", drivers.CGROUPFS)
    drivers.check_parent("/kubepods/burstable/pod12", drivers.CGROUPFS)
    drivers.check_parent("/system.slice/x", drivers.CGROUPFS)  # a path through a slice's directory is a path


def test_under_systemd_a_path_parent_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="is a path, and the cgroup driver is systemd"):
        drivers.check_parent("/kubepods/burstable", drivers.SYSTEMD)
    drivers.check_parent("kubepods-burstable.slice", drivers.SYSTEMD)
    drivers.check_parent(None, drivers.SYSTEMD)


def test_under_systemd_a_slices_path_as_kubelet_and_critest_send_it_names_that_slice() -> None:
    kubelet = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12.slice"
    assert drivers.slice_of_parent(kubelet) == "kubepods-burstable-pod12.slice"
    assert drivers.slice_of_parent("/test.slice") == "test.slice"  # critest's
    assert drivers.slice_of_parent("kubepods.slice") == "kubepods.slice"
    drivers.check_parent(kubelet, drivers.SYSTEMD)
    for elsewhere in ("/other.slice/kubepods-burstable-pod12.slice", "/kubepods.slice/", "/kubepods.slice/x"):
        with pytest.raises(InvalidArgument, match="is a path, and the cgroup driver is systemd"):
            drivers.slice_of_parent(elsewhere)
    options = SandboxOptions.from_payload({"linux": {"cgroup_parent": kubelet, "cgroup_driver": "systemd"}})
    assert options.cgroup_parent == "kubepods-burstable-pod12.slice"


def test_an_unknown_driver_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="cgroup driver 'slices' is not known"):
        drivers.check_parent(None, "slices")


def test_sandbox_options_refuse_a_slice_parent_under_cgroupfs_with_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match=r"linux.cgroup_parent: cgroup parent 'kubepods.slice' is a systemd slice"):
        SandboxOptions.from_payload({"linux": {"cgroup_parent": "kubepods.slice"}})
    options = SandboxOptions.from_payload({"linux": {"cgroup_parent": "kubepods.slice", "cgroup_driver": "systemd"}})
    assert (options.cgroup_driver, options.cgroup_parent) == ("systemd", "kubepods.slice")
    assert SandboxOptions.from_payload({}).cgroup_driver == "cgroupfs"


def test_the_resources_systemd_owns_become_unit_properties_converted_as_runc_does() -> None:
    assert dict(systemd.unit_properties({
        "cpu_shares": 512, "cpu_quota_us": 25000, "cpu_period_us": 50000, "memory_limit_bytes": 96 << 20,
        "memory_swap_limit_bytes": 128 << 20, "pids_limit": 30, "cpuset_cpus": "0-2,9", "cpuset_mems": "0",
        "oom_score_adj": 5})) == {
        "CPUWeight": ("t", 20), "CPUQuotaPeriodUSec": ("t", 50000), "CPUQuotaPerSecUSec": ("t", 500000),
        "MemoryMax": ("t", 96 << 20), "MemorySwapMax": ("t", 32 << 20), "TasksMax": ("t", 30),
        "AllowedCPUs": ("ay", bytes([0b111, 0b10])), "AllowedMemoryNodes": ("ay", b"\x01")}


def test_a_quota_is_rounded_up_to_ten_milliseconds_a_second_and_minus_one_is_infinity() -> None:
    assert dict(systemd.unit_properties({"cpu_quota_us": 1001, "cpu_period_us": 100000}))["CPUQuotaPerSecUSec"] == \
        ("t", 20000)
    infinity = (1 << 64) - 1
    assert dict(systemd.unit_properties({"cpu_quota_us": -1, "memory_limit_bytes": -1, "pids_limit": -1})) == {
        "CPUQuotaPerSecUSec": ("t", infinity), "MemoryMax": ("t", infinity), "TasksMax": ("t", infinity)}


def test_a_unified_file_systemd_owns_is_said_as_its_property_and_wins_over_the_field() -> None:
    infinity = (1 << 64) - 1
    assert dict(systemd.unit_properties({"pids_limit": 30, "unified": {
        "pids.max": "12", "memory.high": "max", "memory.min": "4096", "cpu.weight": "300", "cpu.max": "max 50000",
        "cpuset.cpus": "1", "io.weight": "default 200", "memory.oom.group": "1"}})) == {
        "TasksMax": ("t", 12), "MemoryHigh": ("t", infinity), "MemoryMin": ("t", 4096), "CPUWeight": ("t", 300),
        "CPUQuotaPeriodUSec": ("t", 50000), "CPUQuotaPerSecUSec": ("t", infinity),
        "AllowedCPUs": ("ay", b"\x02"), "IOWeight": ("t", 200)}  # memory.oom.group stays a file write
    assert dict(systemd.unit_properties({"unified": {"cpu.max": "25000"}}))["CPUQuotaPerSecUSec"] == ("t", 250000)
    assert dict(systemd.slice_properties({"unified": {"pids.max": "max"}})) == {"TasksMax": ("t", infinity)}


@pytest.mark.parametrize("name, value", [("pids.max", "many"), ("cpu.weight", "max"), ("cpu.max", "1 2 3"),
                                         ("cpu.max", "max 0"), ("memory.max", "-5"), ("cpuset.cpus", "0-x")])
def test_a_unified_value_a_property_cannot_hold_is_refused_by_name(name: str, value: str) -> None:
    with pytest.raises(InvalidArgument, match=f"resources.unified\\[{name}\\]: '{re.escape(value)}' is not a value"):
        systemd.unit_properties({"unified": {name: value}})


# -- the bus, against a stand-in for systemd on a private bus (tests/support/bustools.py) ---------------

@pytest.fixture
async def manager(fake_systemd):
    """This loop's connection to the stand-in, closed after the test."""
    yield await systemd.manager()
    await systemd.close_manager()


async def test_while_systemd_runs_a_units_job_the_event_loop_keeps_serving(fake_systemd, manager) -> None:
    started = time.monotonic()
    async with loop_stalls() as stalls:
        await manager.start_scope("podshim-it-a.scope", "podshim.slice", 4242, [])  # its job ends 0.5 s on
        await manager.stop_unit("podshim-it-a.scope")
    waited = time.monotonic() - started
    assert waited >= 2 * fake_systemd.job_delay
    # The loop went on while the jobs ran: it never stood still for one (a blocking call would
    # have held it for each job's whole 0.5 s).
    assert stalls and max(stalls) < fake_systemd.job_delay / 2, stalls

async def test_a_scope_is_started_delegated_with_its_process_and_the_pods_resources_as_properties(
        fake_systemd, manager) -> None:
    await manager.start_scope("podshim-it-b.scope", "kubepods-pod1.slice", 4242,
                              systemd.unit_properties({"memory_limit_bytes": 96 << 20, "cpu_shares": 512}))
    (method, (unit, mode, properties, aux)), = [c for c in fake_systemd.calls if c[0] == "StartTransientUnit"]
    assert (unit, mode, aux) == ("podshim-it-b.scope", "replace", [])
    assert {name: value for name, (_, value) in properties} == {
        "Description": "podshim podshim-it-b.scope", "Slice": "kubepods-pod1.slice", "Delegate": True,
        "PIDs": [4242], "DefaultDependencies": False, "CollectMode": "inactive-or-failed",
        "MemoryMax": 96 << 20, "CPUWeight": 20}


async def test_stopping_a_unit_systemd_no_longer_has_is_done(fake_systemd, manager) -> None:
    fake_systemd.missing.add("podshim-it-gone.scope")
    await manager.stop_unit("podshim-it-gone.scope")
    assert ("StopUnit", ("podshim-it-gone.scope", "replace")) in fake_systemd.calls


def test_without_an_event_loop_a_unit_is_stopped_on_a_loop_of_its_own(fake_systemd) -> None:
    systemd.stop_unit_blocking("podshim-it-c.scope")
    assert [c for c in fake_systemd.calls if c[0] != "Subscribe"] == [("StopUnit", ("podshim-it-c.scope", "replace"))]


async def test_a_system_bus_nobody_answers_on_is_failed_precondition(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", f"unix:path={tmp_path}/none")
    with pytest.raises(FailedPrecondition, match="cannot reach the system bus"):
        await systemd.manager()


async def test_a_pod_slice_starts_with_its_resources_as_properties(fake_systemd, manager) -> None:
    await manager.start_slice("kubepods-pod1-podshim_k8s.io_ab.slice", "kubepods-pod1.slice",
                              systemd.slice_properties({"memory_limit_bytes": 1 << 30}))
    (unit, _mode, properties, _aux), = [body for method, body in fake_systemd.calls if method == "StartTransientUnit"]
    assert unit == "kubepods-pod1-podshim_k8s.io_ab.slice"
    assert {name: value for name, (_, value) in properties} == {
        "Description": "podshim kubepods-pod1-podshim_k8s.io_ab.slice",  # its parent is in its name
        "DefaultDependencies": False, "CollectMode": "inactive-or-failed", "MemoryMax": 1 << 30}
