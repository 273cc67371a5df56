"""Churn: 1,000 pod cycles (runp, a container, stopp, rmp), up to 20 in flight, then nothing may
be left: no process, mount, netns, socket, cgroup, bundle or record, and the controller's open
file descriptors are back where they started."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time

import anyio
import pytest

from shim.launch.template import stop_template
from shim.lib.processes import proc_start_time

from client.cri.pod import open_pod_service

from support.podtools import BUSYBOX_MOUNT
from support.proctools import pidfds, wait_pidfds_async

CYCLES = int(os.environ.get("PODSHIM_CHURN_CYCLES", "1000"))
IN_FLIGHT = 20
EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def see(processes: set[tuple[int, int]], *pids: int) -> None:
    """Note each of ``pids`` as ``(pid, start time)``, read while it runs: that names this one
    process, so the check at the end never mistakes a newcomer that got its pid for a leftover."""
    for pid in pids:
        start_time = proc_start_time(pid)
        if start_time is not None:  # gone already: nothing to look for later
            processes.add((pid, start_time))


def mounts_with(text: str) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line for line in f if text in line]


@pytest.fixture
def roots(tmp_path):
    runtime_root = f"/tmp/podshim-churn-{secrets.token_hex(4)}"
    # The Controller starts the runtime root's template on its first spawn (the default): each
    # spawn is a fork, not a Python start-up, and the churn tests the runtime, not the interpreter.
    try:
        yield str(tmp_path / "root"), runtime_root
    finally:
        stop_template(runtime_root)
        subprocess.run(["rm", "-rf", runtime_root])


@pytest.mark.slow
async def test_1000_pod_cycles_leave_nothing_behind(roots) -> None:
    root, runtime_root = roots
    with open(os.path.join(EXAMPLES, "pod-config.json")) as f:
        base = json.load(f)
    base["linux"]["cgroup_parent"] = ""
    container = {"metadata": {"name": "c"}, "command": ["/bin/busybox", "sh", "-c", "echo churn"],
                 "mounts": [BUSYBOX_MOUNT]}  # no image: an empty root of its own, and busybox in it
    netns_made: set[str] = set()
    cgroups_made: set[str] = set()
    processes_seen: set[tuple[int, int]] = set()  # (pid, start time): pid reuse is no leftover
    failures: list[str] = []

    async with open_pod_service(root, runtime_root, cni_conf_dir=root + "/no-cni") as pods:
        async def cycle(i: int) -> None:
            cfg = json.loads(json.dumps(base))
            cfg["metadata"].update(name=f"churn-{i}", uid=secrets.token_hex(8))
            pod_id = await pods.run_pod_sandbox(cfg)
            info = (await pods.pod_sandbox_status(pod_id, verbose=True))["info"]
            netns_made.add(info["netns_path"])
            cgroups_made.update(v for k, v in info["shim"].items() if k.startswith("cgroup."))
            see(processes_seen, info["pid"], int(info["shim"]["shim_pid"]))  # while the pod runs
            cid = await pods.create_container(pod_id, container)
            await pods.start_container(cid)
            await pods.stop_pod_sandbox(pod_id)
            await pods.remove_pod_sandbox(pod_id)

        await cycle(-1)  # warm up: lazy imports, the store's directories, the template's first fork
        fds_before = open_fds()
        limiter = anyio.Semaphore(IN_FLIGHT)
        began = time.monotonic()

        async def guarded(i: int) -> None:
            async with limiter:
                try:
                    await cycle(i)
                except Exception as exc:  # record and go on: the assertion below reports them all
                    failures.append(f"cycle {i}: {type(exc).__name__}: {exc}")

        async with anyio.create_task_group() as tg:
            for i in range(CYCLES):
                tg.start_soon(guarded, i)
        elapsed = time.monotonic() - began
        print(f"\n{CYCLES} pod cycles, {IN_FLIGHT} in flight: {elapsed:.1f} s ({elapsed / CYCLES * 1e3:.1f} ms each)")
        assert failures == []
        assert pods.store.list() == []
        assert await pods.controller.list(None) == []
        fds_after = open_fds()

    assert fds_after == fds_before, f"the controller holds {fds_after - fds_before} more fds"
    # Each waited for through a pidfd of that very process (pid, start time); any still running is killed.
    with pidfds(processes_seen) as fds:
        left = await wait_pidfds_async(fds, 10, kill=True)
    assert left == [], f"processes left: {left[:10]}"
    assert [n for n in netns_made if os.path.exists(n)] == []
    assert [m for n in netns_made for m in mounts_with(os.path.basename(n))] == []
    assert [c for c in cgroups_made if os.path.exists(c)] == []
    assert os.listdir(os.path.join(runtime_root, "s")) == []
    assert os.listdir(os.path.join(root, "sandboxes", "k8s.io")) == []
    assert os.listdir(os.path.join(root, "logs")) == []
