"""Several processes over one pod root at once: podshimd, a new podshimd starting while the old
one finishes its changes, a program of one's own over open_pod_service.

Each process here is a real one that opens the pod service (and so runs its recovery) and does
one thing. A process frozen at a failpoint (``PODSHIM_FAILPOINT_ACTION=stop``) is one whose
RunPodSandbox is in flight for as long as the test needs; the test sees it freeze through
waitpid, not through a sleep.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import anyio
import pytest

from client.cri.failpoints import ACTION_ENV, ENV, POD_FAILPOINTS

from support.podtools import node_container, pod_config, pod_service
from support.proctools import wait_gone_async

#: Rounds of two racing RunPodSandbox: before the store took locks, 4 rounds in 6 made two pods.
RACE_ROUNDS = 8
RUN_POINTS = [p for p in POD_FAILPOINTS if p.startswith("run:")]

#: One pod service process: ``run CONFIG_JSON`` prints the pod id, ``list`` the pods listed
#: ({id: state}), ``status POD_ID`` its CRI state; an error is printed as its status name.
SCRIPT = """
import anyio, json, sys
from client.cri.pod import open_pod_service
from shim.rpc.status import RpcError
async def main(root, runtime_root, action, arg=""):
    async with open_pod_service(root, runtime_root, cni_conf_dir=root + "/no-cni") as pods:
        try:
            if action == "run":
                out = await pods.run_pod_sandbox(json.loads(arg))
            elif action == "list":
                out = {p["id"]: p["state"] for p in await pods.list_pod_sandbox()}
            else:
                out = (await pods.pod_sandbox_status(arg))["state"]
        except RpcError as exc:
            out = exc.code.name
    print(json.dumps(out))
anyio.run(main, *sys.argv[1:])
"""


def start(roots, *argv: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SCRIPT, *roots, *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


def finish(proc: subprocess.Popen):
    """What the process printed, once it has exited (successfully)."""
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return json.loads(out)


def call(roots, *argv: str):
    return finish(start(roots, *argv))


def wait_stopped(proc: subprocess.Popen) -> None:
    """Wait until ``proc`` freezes at its failpoint (it must not exit instead)."""
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), f"the process exited ({status:#x}) instead of stopping at its failpoint"


@pytest.fixture
def removes_every_pod(roots):
    """Whatever the test leaves in the pod root is removed (through the pod service) afterwards."""
    yield

    async def remove_all() -> None:
        async with pod_service(roots):
            pass

    anyio.run(remove_all)


@pytest.mark.usefixtures("removes_every_pod")
def test_two_processes_running_one_pod_at_once_make_one_pod_and_one_already_exists(roots) -> None:
    for round in range(RACE_ROUNDS):
        config = json.dumps(pod_config(f"race-{round}"))
        outcomes = [finish(p) for p in [start(roots, "run", config) for _ in range(2)]]
        winners = [o for o in outcomes if o != "ALREADY_EXISTS"]
        assert len(winners) == 1 and outcomes.count("ALREADY_EXISTS") == 1, f"round {round}: {outcomes}"
        assert call(roots, "status", winners[0]) == "SANDBOX_READY"
    assert list(call(roots, "list").values()) == ["SANDBOX_READY"] * RACE_ROUNDS


@pytest.mark.parametrize("failpoint", RUN_POINTS)
@pytest.mark.usefixtures("removes_every_pod")
def test_run_in_flight_in_another_process_is_left_alone_and_completes(roots, failpoint) -> None:
    config = json.dumps(pod_config())
    runner = start(roots, "run", config, env={ENV: failpoint, ACTION_ENV: "stop"})
    try:
        wait_stopped(runner)
        listed = call(roots, "list")  # opens the pod service, so recovers, as every process does
        assert list(listed.values()) == (["SANDBOX_READY"] if failpoint == "run:after-ready" else [])
        assert call(roots, "run", config) == "ALREADY_EXISTS"
    finally:
        os.kill(runner.pid, signal.SIGCONT)
    pod_id = finish(runner)
    assert call(roots, "status", pod_id) == "SANDBOX_READY"


@pytest.mark.usefixtures("removes_every_pod")
def test_run_killed_in_flight_is_rolled_back_by_the_next_process(roots) -> None:
    config = json.dumps(pod_config())
    runner = start(roots, "run", config, env={ENV: "run:after-start", ACTION_ENV: "stop"})
    wait_stopped(runner)
    runner.kill()
    runner.communicate(timeout=60)
    assert runner.returncode == -signal.SIGKILL
    pod_id = call(roots, "run", config)  # its recovery rolls the dead one back first: the name is free
    assert call(roots, "list") == {pod_id: "SANDBOX_READY"}


async def test_a_pod_another_process_ran_after_this_one_opened_is_ready_and_removable_here(roots) -> None:
    async with pod_service(roots) as pods:
        pod_id = await anyio.to_thread.run_sync(call, roots, "run", json.dumps(pod_config()))
        status = await pods.pod_sandbox_status(pod_id, verbose=True)
        assert status["state"] == "SANDBOX_READY"  # this process's Controller loads it on demand
        pause, shim = status["info"]["pid"], int(status["info"]["shim"]["shim_pid"])
        cid = await pods.create_container(pod_id, node_container(["sleep", "30"]))
        await pods.start_container(cid)
        await pods.remove_pod_sandbox(pod_id)
    assert await wait_gone_async(pause, shim) == []
