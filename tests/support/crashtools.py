"""Kill -9 of the pod service at a step, and the check that a restarted one leaves the pod whole
or gone: the helpers of tests/cri/test_crash_recovery.py (the host's hierarchies) and
tests/cri/test_crash_recovery_cgroupv2.py (pure cgroup v2, both cgroup drivers, in the guest).

A flow (run, stop or remove a pod, create a container in it) runs in a controller process of its own, which dies at the
failpoint ``PODSHIM_FAILPOINT`` names (client/cri/failpoints.py); the test's own pod service, over
the same roots, then recovers, uses and removes every pod it finds, and checks what is left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

from client.cri.failpoints import ENV, POD_FAILPOINTS
from client.cri.pod import open_pod_service

from support.podtools import BUSYBOX_MOUNT
from support.proctools import alive, wait_gone_async
from support.rpctools import SLOWDOWN

__all__ = ["CREATE_POINTS", "FLOW_TIMEOUT", "PROBE", "REMOVE_POINTS", "RUN_POINTS", "STOP_POINTS", "assert_whole_or_gone",
           "recorded_netns", "run_flow"]

#: The failpoints of each flow, in their order.
RUN_POINTS = [p for p in POD_FAILPOINTS if p.startswith("run:")]
CREATE_POINTS = [p for p in POD_FAILPOINTS if p.startswith("create:")]
STOP_POINTS = [p for p in POD_FAILPOINTS if p.startswith("stop:")]
REMOVE_POINTS = [p for p in POD_FAILPOINTS if p.startswith("remove:")]

#: A container that runs the node's busybox (``command`` set by the caller).
PROBE: dict[str, Any] = {"metadata": {"name": "probe"}, "mounts": [BUSYBOX_MOUNT]}

#: A bound on one flow's controller process (its start included: Python under emulation is slow).
FLOW_TIMEOUT = 60.0 * SLOWDOWN

_SCRIPT = """
import anyio, json, sys
from client.cri.pod import open_pod_service
async def main(root, runtime_root, flow, cfg_json, pod_id, options_json):
    async with open_pod_service(root, runtime_root, cni_conf_dir=root + "/no-cni", **json.loads(options_json)) as pods:
        if flow == "run":
            pod_id = await pods.run_pod_sandbox(json.loads(cfg_json))
        elif flow == "create":
            await pods.create_container(pod_id, json.loads(cfg_json))
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


def run_flow(roots: tuple[str, str], flow: str, failpoint: str | None, cfg: dict[str, Any] | None = None,
             pod_id: str = "", **options: Any) -> str | None:
    """Run one flow (``run`` a pod of config ``cfg``, ``create`` a container of config ``cfg`` in
    pod ``pod_id``, ``stop`` or ``remove`` that pod) in a separate controller process over
    ``roots`` (root, runtime root), its pod service opened with ``options`` (the cgroup driver...);
    the pod's id, or None when the process died at ``failpoint``."""
    env = dict(os.environ)
    if failpoint:
        env[ENV] = failpoint
    done = subprocess.run([sys.executable, "-c", _SCRIPT, *roots, flow, json.dumps(cfg or {}), pod_id,
                           json.dumps(options)], capture_output=True, text=True, timeout=FLOW_TIMEOUT, env=env)
    if done.returncode == -signal.SIGKILL:
        return None
    assert done.returncode == 0, done.stderr
    result: str = json.loads(done.stdout)
    return result


async def assert_whole_or_gone(roots: tuple[str, str], **options: Any) -> list[str]:
    """After a restart: every pod is usable (READY: a container runs in it) or consistently
    stopped, and removing it leaves nothing; then no shim or pause of it remains. ``options`` are
    the pod service's, as the crashed one had them. The ids of the pods found."""
    root, runtime_root = roots
    netns = recorded_netns(root)
    found: list[str] = []
    async with open_pod_service(root, runtime_root, cni_conf_dir=root + "/no-cni", **options) as pods:
        leftovers: list[int] = []
        for record in pods.store.list():
            found.append(record.pod_id)
            assert record.state in ("READY", "NOTREADY"), f"a half-made pod: {record.state}"
            status = await pods.pod_sandbox_status(record.pod_id, verbose=True)
            if status["state"] == "SANDBOX_READY":
                assert alive(status["info"]["pid"])
                cid = await pods.create_container(record.pod_id, {**PROBE, "command": ["/bin/busybox", "true"]})
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
    sandboxes = os.path.join(root, "sandboxes", "k8s.io")
    assert not os.path.isdir(sandboxes) or os.listdir(sandboxes) == [], "a sandbox's bundle was left behind"
    return found
