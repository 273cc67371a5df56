"""Kill -9 at every step of RunPodSandbox, StopPodSandbox and RemovePodSandbox.

The controller process dies at a failpoint (PODSHIM_FAILPOINT names the step); a new pod
service over the same roots must find the pod either fully there and usable, or fully gone —
never half. The same holds when the shim or the pause is killed instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import time

import pytest

from shim.launch.template import stop_template

from client.cri.failpoints import ENV, POD_FAILPOINTS
from client.cri.pod import open_pod_service

from support.podtools import BUSYBOX_MOUNT, pod_config
from support.proctools import alive, wait_gone_async

SCRIPT = """
import anyio, json, sys
from client.cri.pod import open_pod_service
async def main(root, runtime_root, flow, cfg_json, pod_id):
    async with open_pod_service(root, runtime_root, cni_conf_dir=root + "/no-cni") as pods:
        if flow == "run":
            pod_id = await pods.run_pod_sandbox(json.loads(cfg_json))
        elif flow == "stop":
            await pods.stop_pod_sandbox(pod_id)
        else:
            await pods.remove_pod_sandbox(pod_id)
    print(json.dumps(pod_id))
anyio.run(main, *sys.argv[1:])
"""




def recorded_netns(root: str) -> set[str]:
    """Every network namespace the shims of ``root`` recorded (their state.json files)."""
    found = set()
    base = os.path.join(root, "sandboxes", "k8s.io")
    for sandbox in os.listdir(base) if os.path.isdir(base) else []:
        try:
            with open(os.path.join(base, sandbox, "state.json")) as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue
        if record.get("netns_owned") and record.get("netns_path"):
            found.add(record["netns_path"])
    return found






@pytest.fixture
def roots(tmp_path):
    runtime_root = f"/tmp/podshim-crash-{secrets.token_hex(4)}"
    yield str(tmp_path / "root"), runtime_root
    stop_template(runtime_root)  # the controllers' default template, if one started
    subprocess.run(["rm", "-rf", runtime_root])


def run_flow(roots, flow: str, failpoint: str | None, cfg: dict | None = None, pod_id: str = "") -> str | None:
    """Run one flow in a separate controller process; None when it died at the failpoint."""
    env = dict(os.environ)
    if failpoint:
        env[ENV] = failpoint
    done = subprocess.run([sys.executable, "-c", SCRIPT, *roots, flow, json.dumps(cfg or {}), pod_id],
                          capture_output=True, text=True, timeout=60, env=env)
    if done.returncode == -signal.SIGKILL:
        return None
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def assert_whole_or_gone(roots) -> None:
    """After a restart: every pod is usable (READY: a container runs in it) or consistently
    stopped, and removing it leaves nothing; then no shim or pause of it remains."""
    root, runtime_root = roots
    netns = recorded_netns(root)
    async with open_pod_service(root, runtime_root, cni_conf_dir=root + "/no-cni") as pods:
        leftovers: list[int] = []
        for record in pods.store.list():
            assert record.state in ("READY", "NOTREADY"), f"a half-made pod: {record.state}"
            status = await pods.pod_sandbox_status(record.pod_id, verbose=True)
            if status["state"] == "SANDBOX_READY":
                assert alive(status["info"]["pid"])
                cid = await pods.create_container(record.pod_id, {"metadata": {"name": "probe"}, "command": ["/bin/busybox", "true"],
                                                                    "mounts": [BUSYBOX_MOUNT]})
                await pods.start_container(cid)
            shim = status["info"].get("shim") or {}
            leftovers += [int(shim["shim_pid"])] if shim.get("shim_pid") else []
            leftovers += [status["info"]["pid"]] if status["info"]["pid"] else []
            await pods.remove_pod_sandbox(record.pod_id)
        assert pods.store.list() == []
        assert await pods.controller.list(None) == []
    assert await wait_gone_async(*leftovers) == []
    assert [path for path in netns if os.path.exists(path)] == [], "a network namespace was left behind"
    pod_files = os.path.join(root, "pod-files")
    assert not os.path.isdir(pod_files) or os.listdir(pod_files) == [], "a pod's hosts/resolv.conf were left behind"
    assert not os.listdir(os.path.join(root, "sandboxes", "k8s.io")) if os.path.isdir(
        os.path.join(root, "sandboxes", "k8s.io")) else True


RUN_POINTS = [p for p in POD_FAILPOINTS if p.startswith("run:")]
STOP_POINTS = [p for p in POD_FAILPOINTS if p.startswith("stop:")]
REMOVE_POINTS = [p for p in POD_FAILPOINTS if p.startswith("remove:")]


@pytest.mark.parametrize("failpoint", RUN_POINTS)
async def test_controller_killed_during_run_pod_sandbox(roots, failpoint) -> None:
    assert run_flow(roots, "run", failpoint, pod_config()) is None
    await assert_whole_or_gone(roots)


@pytest.mark.parametrize("failpoint", STOP_POINTS)
async def test_controller_killed_during_stop_pod_sandbox(roots, failpoint):
    pod_id = run_flow(roots, "run", None, pod_config())
    assert run_flow(roots, "stop", failpoint, pod_id=pod_id) is None
    await assert_whole_or_gone(roots)


@pytest.mark.parametrize("failpoint", REMOVE_POINTS)
async def test_controller_killed_during_remove_pod_sandbox(roots, failpoint):
    pod_id = run_flow(roots, "run", None, pod_config())
    assert run_flow(roots, "remove", failpoint, pod_id=pod_id) is None
    await assert_whole_or_gone(roots)


@pytest.mark.parametrize("victim", ["shim", "pause"])
async def test_shim_or_pause_killed_under_a_ready_pod(roots, victim):
    root, runtime_root = roots
    pod_id = run_flow(roots, "run", None, pod_config())
    async with open_pod_service(root, runtime_root, cni_conf_dir=root + "/no-cni") as pods:
        info = (await pods.pod_sandbox_status(pod_id, verbose=True))["info"]
        killed = int(info["shim"]["shim_pid"]) if victim == "shim" else info["pid"]
        os.kill(killed, signal.SIGKILL)
        assert not await wait_gone_async(killed)
        deadline = time.monotonic() + 10
        while (await pods.pod_sandbox_status(pod_id))["state"] != "SANDBOX_NOTREADY":
            assert time.monotonic() < deadline, "the pod never showed NOTREADY"
            await asyncio.sleep(0.02)  # the shim or the controller notices the death on its own
    await assert_whole_or_gone(roots)
