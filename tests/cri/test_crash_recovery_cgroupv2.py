"""Kill -9 at every step of RunPodSandbox, CreateContainer, StopPodSandbox and RemovePodSandbox on
pure cgroup v2, under each cgroup driver (marker ``cgroupv2``: they run in the guest of tests/support/guest.py).

The same walk as test_crash_recovery.py (tests/support/crashtools.py), each pod under a cgroup
parent of its own (a directory under cgroupfs, a kubelet-named slice under systemd); once the
restarted pod service has recovered and removed the pod, nothing of it is left on v2: no cgroup
directory below the parent, no systemd unit of it loaded (its slice, its pause's and its tasks'
scopes), no process in its cgroups, no mount of its roots. The pod's shim killed under a running
container leaves nothing either (its container's scope, its pause's, its slice) once the pod is
stopped and removed.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from shim.api.cgroups import expand_slice
from shim.api.handlers import NATIVE
from shim.launch.template import stop_template

from client.cri.pod import open_pod_service

from support import crashtools
from support.crashtools import PROBE, assert_whole_or_gone, run_flow
from support.podtools import pod_config, shows_notready
from support.proctools import wait_gone_async
from support.rpctools import WAIT

pytestmark = pytest.mark.cgroupv2

V2_ROOT = "/sys/fs/cgroup"
#: The runtime handlers whose shim is killed under a running container: the OCI runtimes' systemd
#: drivers make their containers' scopes themselves.
HANDLERS = [NATIVE] + [h for h in ("runc", "crun") if shutil.which(h, path="/usr/sbin:/usr/bin:/sbin:/bin")]
#: The unit names every pod's units have, whatever its parent: its pause's and tasks' scopes.
SCOPE_GLOB = "podshim-*"


def loaded_units(*patterns: str) -> set[str]:
    """The systemd units loaded (in any state) whose names match ``patterns``."""
    listed = subprocess.run(["systemctl", "list-units", "--all", "--plain", "--no-legend", "--full", *patterns],
                            capture_output=True, text=True, timeout=WAIT, check=True).stdout
    return {line.split()[0] for line in listed.splitlines() if line.strip()}


@dataclass
class Node:
    """The crashed and restarted pod services' roots, cgroup driver and a cgroup parent of the
    test's own (its v2 directory ``parent_dir``), and the units loaded before the test."""

    roots: tuple[str, str]
    driver: str
    parent: str
    parent_dir: str
    top: str
    units_before: set[str] = field(default_factory=set)

    @property
    def options(self) -> dict[str, Any]:
        return {"cgroup_driver": self.driver}

    def config(self) -> dict[str, Any]:
        cfg = pod_config()
        cfg["linux"]["cgroup_parent"] = self.parent
        return cfg

    def units(self) -> set[str]:
        return loaded_units(SCOPE_GLOB, f"{self.top}*")

    def assert_nothing_left(self) -> None:
        """No cgroup below the parent, no unit of a pod loaded, no mount of the roots."""
        below = [os.path.join(top, name) for top, names, _ in os.walk(self.parent_dir) for name in names]
        assert below == [], f"cgroups left behind on v2: {below}"
        # The parent's own slices (kubelet's, which systemd loaded as the pod slice's parents) stay.
        parents = set(self.parent_dir[len(V2_ROOT):].strip("/").split("/"))
        assert self.units() - self.units_before - parents == set(), "systemd units left loaded"
        with open("/proc/self/mountinfo") as f:
            mounts = [line.split()[4] for line in f]
        assert [m for m in mounts if m.startswith(self.roots)] == [], "mounts left behind"


@pytest.fixture(scope="module", params=["cgroupfs", "systemd"])
def crash_roots(request) -> Iterator[tuple[str, tuple[str, str]]]:
    """One pair of roots per driver, kept across its tests (their template reused)."""
    directory = tempfile.mkdtemp(prefix="podshim-crash-v2-")
    runtime_root = f"/tmp/podshim-crash-v2-{secrets.token_hex(4)}"
    try:
        yield request.param, (os.path.join(directory, "root"), runtime_root)
    finally:
        stop_template(runtime_root)
        shutil.rmtree(runtime_root, ignore_errors=True)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def node(crash_roots) -> Iterator[Node]:
    driver, roots = crash_roots
    top = f"podshimcrash{secrets.token_hex(4)}"
    if driver == "systemd":
        parent = f"{top}-burstable-pod{secrets.token_hex(8)}.slice"
        parent_dir = V2_ROOT + expand_slice(parent)
    else:
        parent = f"/{top}/pod{secrets.token_hex(8)}"
        parent_dir = V2_ROOT + parent
    made = Node(roots, driver, parent, parent_dir, top)
    made.units_before = made.units()
    try:
        yield made
    finally:
        if driver == "systemd":
            subprocess.run(["systemctl", "stop", f"{top}.slice"], capture_output=True, timeout=WAIT)
        else:
            remove_cgroups(os.path.dirname(parent_dir))


def remove_cgroups(top: str) -> None:
    """Kill what is in the cgroup ``top`` and below, and remove them (a failed test's leftovers)."""
    if not os.path.isdir(top):
        return
    with open(os.path.join(top, "cgroup.kill"), "w") as f:
        f.write("1")
    deadline = time.monotonic() + WAIT
    for directory in [path for path, _, _ in os.walk(top)][::-1]:
        while True:
            try:
                os.rmdir(directory)
                break
            except OSError:
                assert time.monotonic() < deadline, f"cannot remove {directory}"
                time.sleep(0.05)  # killed processes leaving the group: nothing to wait on


async def run_pod(node: Node, handler: str = NATIVE) -> str:
    """A pod of ``handler`` made by the test's own pod service (only the flow that dies runs apart)."""
    root, runtime_root = node.roots
    async with open_pod_service(root, runtime_root, cni_conf_dir=root + "/no-cni", **node.options) as pods:
        pod_id: str = await pods.run_pod_sandbox(node.config(), runtime_handler=handler)
    return pod_id


@pytest.mark.parametrize("failpoint", crashtools.RUN_POINTS)
async def test_controller_killed_during_run_pod_sandbox_leaves_nothing_on_v2(node, failpoint) -> None:
    assert run_flow(node.roots, "run", failpoint, node.config(), **node.options) is None
    await assert_whole_or_gone(node.roots, **node.options)
    node.assert_nothing_left()


@pytest.mark.parametrize("failpoint", crashtools.CREATE_POINTS)
async def test_controller_killed_during_create_container_leaves_nothing_on_v2(node, failpoint) -> None:
    pod_id = await run_pod(node)
    assert run_flow(node.roots, "create", failpoint, {**PROBE, "command": ["/bin/busybox", "sleep", "600"]},
                    pod_id=pod_id, **node.options) is None
    assert await assert_whole_or_gone(node.roots, **node.options) == [pod_id]
    node.assert_nothing_left()


@pytest.mark.parametrize("failpoint", crashtools.STOP_POINTS + crashtools.REMOVE_POINTS)
async def test_controller_killed_during_stop_or_remove_pod_sandbox_leaves_nothing_on_v2(node, failpoint) -> None:
    pod_id = await run_pod(node)
    flow = failpoint.partition(":")[0]
    assert run_flow(node.roots, flow, failpoint, pod_id=pod_id, **node.options) is None
    found = await assert_whole_or_gone(node.roots, **node.options)
    assert found == [pod_id] or flow == "remove"  # a stop never forgets the pod
    node.assert_nothing_left()


@pytest.mark.parametrize("handler", HANDLERS)
async def test_shim_killed_under_a_running_container_leaves_nothing_on_v2(node, handler) -> None:
    root, runtime_root = node.roots
    pod_id = await run_pod(node, handler)
    async with open_pod_service(root, runtime_root, cni_conf_dir=root + "/no-cni", **node.options) as pods:
        container_id = await pods.create_container(pod_id, {**PROBE, "command": ["/bin/busybox", "sleep", "600"]})
        await pods.start_container(container_id)
        info = (await pods.pod_sandbox_status(pod_id, verbose=True))["info"]
        shim_pid = int(info["shim"]["shim_pid"])
        os.kill(shim_pid, signal.SIGKILL)
        assert not await wait_gone_async(shim_pid)
        await shows_notready(pods, pod_id, WAIT)  # the controller notices the shim's death on its own
        await pods.stop_pod_sandbox(pod_id)
        await pods.remove_pod_sandbox(pod_id)
        assert pods.store.list() == []
    node.assert_nothing_left()
