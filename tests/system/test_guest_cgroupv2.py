"""The cgroup v2 smoke: in the Debian 12 guest of tests/support/guest.py (pure cgroup v2 under systemd), a
pod and a container with CPU and memory limits under each cgroup driver (cgroupfs; systemd: the pod
a slice systemd made in a kubelet-named slice, its pause and its container scopes in it), the values read back from the guest's cgroup
files, and nothing of either left in the guest after (no process in podshim's cgroups, no scope). It never skips: on a machine without qemu or
debootstrap it fails, saying so (.ci/install --test installs both)."""

from __future__ import annotations

import shutil

import pytest

from support import guest

#: The guest's own tests: a pod per handler, a container with limits, the v2 files read back; under
#: the cgroupfs driver, then the systemd driver.
SMOKE = ("tests/shim/test_shim_task_ops.py::test_on_pure_cgroup_v2_a_task_created_with_resources_has_them_in_its_v2_files",
         "tests/shim/test_shim_task_ops.py::"
         "test_under_the_systemd_driver_a_pod_is_a_slice_with_its_pause_and_each_task_a_scope_and_nothing_is_left")


@pytest.mark.timeout(guest.BUILD_TIMEOUT + 1800)  # a cold cache builds the image first
def test_in_the_cgroup_v2_guest_a_pods_container_gets_its_cpu_and_memory_limits_and_nothing_is_left() -> None:
    missing = [tool for tool in ("qemu-system-x86_64", "debootstrap", "mkfs.ext4") if shutil.which(tool) is None]
    assert not missing, f"the guest needs {', '.join(missing)}: run .ci/install --test"
    with guest.booted() as vm:
        assert vm.run(["stat", "-fc", "%T", "/sys/fs/cgroup"]).stdout.decode().strip() == "cgroup2fs"
        result = vm.pytest(["-q", *SMOKE], timeout=1800)
        output = (result.stdout + result.stderr).decode(errors="replace")
        summary = output.strip().splitlines()[-1] if output.strip() else ""
        assert result.returncode == 0 and "passed" in summary and "skipped" not in summary, output
        # No process in any of podshim's cgroups, and no pause, once the tests are done.
        left = vm.run(["sh", "-c", "cat $(find /sys/fs/cgroup/podshim -name cgroup.procs 2>/dev/null) /dev/null;"
                       " pgrep -x catatonit || true; systemctl list-units --all --plain --no-legend 'podshim-*.scope' '*podshim_*.slice'"])
        assert left.stdout.decode().split() == [], left.stdout.decode()
