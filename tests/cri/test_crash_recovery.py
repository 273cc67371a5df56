"""Kill -9 at every step of RunPodSandbox, CreateContainer, StopPodSandbox and RemovePodSandbox.

The controller process dies at a failpoint (PODSHIM_FAILPOINT names the step); a new pod
service over the same roots must find the pod either fully there and usable, or fully gone —
never half. The same holds when the shim or the pause is killed instead.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess

import pytest

from shim.launch.template import stop_template

from client.cri.pod import open_pod_service

from support.crashtools import (
    CREATE_POINTS,
    PROBE,
    REMOVE_POINTS,
    RUN_POINTS,
    STOP_POINTS,
    assert_whole_or_gone,
    run_flow,
)
from support.podtools import pod_config, shows_notready
from support.proctools import wait_gone_async


@pytest.fixture
def roots(tmp_path):
    runtime_root = f"/tmp/podshim-crash-{secrets.token_hex(4)}"
    yield str(tmp_path / "root"), runtime_root
    stop_template(runtime_root)  # the controllers' default template, if one started
    subprocess.run(["rm", "-rf", runtime_root])


@pytest.mark.parametrize("failpoint", RUN_POINTS)
async def test_controller_killed_during_run_pod_sandbox(roots, failpoint) -> None:
    assert run_flow(roots, "run", failpoint, pod_config()) is None
    await assert_whole_or_gone(roots)


@pytest.mark.parametrize("failpoint", CREATE_POINTS)
async def test_controller_killed_during_create_container(roots, failpoint):
    pod_id = run_flow(roots, "run", None, pod_config())
    assert run_flow(roots, "create", failpoint, {**PROBE, "command": ["/bin/busybox", "sleep", "600"]},
                    pod_id=pod_id) is None
    assert await assert_whole_or_gone(roots) == [pod_id]


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
        await shows_notready(pods, pod_id, 10)  # the shim or the controller notices the death on its own
    await assert_whole_or_gone(roots)
