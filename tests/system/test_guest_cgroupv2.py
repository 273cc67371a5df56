"""The cgroup v2 guest in CI: in the Debian 12 guest of tests/support/guest.py (pure cgroup v2 under
systemd), first the smoke: a pod and a container with CPU and memory limits under each cgroup driver
(cgroupfs; systemd: the pod a slice systemd made in a kubelet-named slice, its pause and its container
scopes in it), the values read back from the guest's cgroup files, and nothing of either left in the
guest after (no process in podshim's cgroups, no scope). Then (marker ``slow``) every ``cgroupv2`` test
but critest's runs, in the same guest, all passing, none skipped. Neither skips: on a machine without
qemu or debootstrap they fail, saying so (.ci/install --test installs both)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator

import pytest

from support import guest

#: The guest's own tests: a pod per handler, a container with limits, the v2 files read back; under
#: the cgroupfs driver, then the systemd driver.
SMOKE = ("tests/shim/test_shim_task_ops.py::test_on_pure_cgroup_v2_a_task_created_with_resources_has_them_in_its_v2_files",
         "tests/shim/test_shim_task_ops.py::"
         "test_under_the_systemd_driver_a_pod_is_a_slice_with_its_pause_and_each_task_a_scope_and_nothing_is_left")


#: The rest of the ``cgroupv2`` tests CI runs in the guest (marker ``slow``): every one but critest's
#: runs, which run when ``pytest -m cgroupv2 tests`` is asked for (why: docs/testing.md).
REST = ("-m", "cgroupv2", "tests", "--ignore=tests/cri/test_podshimd_critest_cgroupv2.py")
#: Seconds the rest may take in the guest.
REST_TIMEOUT = 3600


@pytest.fixture(scope="module")
def vm() -> Iterator[guest.Guest]:
    """One guest for the module's tests: booted (the image built first on a cold cache), the checkout
    synced, powered off after."""
    missing = [tool for tool in ("qemu-system-x86_64", "debootstrap", "mkfs.ext4") if shutil.which(tool) is None]
    assert not missing, f"the guest needs {', '.join(missing)}: run .ci/install --test"
    with guest.booted() as booted:
        yield booted


def podshims_leftovers(vm: guest.Guest) -> list[str]:
    """Processes in podshim's cgroups, pauses (catatonit) and podshim's systemd units in the guest."""
    left = vm.run(["sh", "-c", "cat $(find /sys/fs/cgroup/podshim -name cgroup.procs 2>/dev/null) /dev/null;"
                   " pgrep -x catatonit || true; systemctl list-units --all --plain --no-legend 'podshim-*.scope'"
                   " '*podshim_*.slice'"])
    return left.stdout.decode().split()


def passed_whole(result: subprocess.CompletedProcess[bytes]) -> tuple[bool, str]:
    """Whether a pytest run in the guest passed every test it selected (none failed or skipped), and
    its output."""
    output = (result.stdout + result.stderr).decode(errors="replace")
    summary = output.strip().splitlines()[-1] if output.strip() else ""
    whole = (result.returncode == 0 and "passed" in summary
             and not any(word in summary for word in ("skipped", "failed", "error")))
    return whole, output


@pytest.mark.timeout(guest.BUILD_TIMEOUT + 1800)  # a cold cache builds the image first
def test_in_the_cgroup_v2_guest_a_pods_container_gets_its_cpu_and_memory_limits_and_nothing_is_left(vm: guest.Guest) -> None:
    assert vm.run(["stat", "-fc", "%T", "/sys/fs/cgroup"]).stdout.decode().strip() == "cgroup2fs"
    whole, output = passed_whole(vm.pytest(["-q", *SMOKE], timeout=1800))
    assert whole, output
    # No process in any of podshim's cgroups, and no pause, once the tests are done.
    assert podshims_leftovers(vm) == []


@pytest.mark.slow
@pytest.mark.timeout(guest.BUILD_TIMEOUT + REST_TIMEOUT)  # when it runs alone on a cold cache
def test_in_the_cgroup_v2_guest_every_cgroupv2_test_but_critests_passes_and_leaves_nothing(vm: guest.Guest) -> None:
    whole, output = passed_whole(vm.pytest(["-q", "-rfEs", "--durations=10", *REST], timeout=REST_TIMEOUT))
    assert whole, output[-20000:]
    assert podshims_leftovers(vm) == []
