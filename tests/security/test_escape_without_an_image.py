"""A container without an image (issue 32, item 4): it used to run on a read-only view of the
node's own ``/``, from which its root user read /etc/shadow and reached podshimd's socket (and
through it, a privileged pod). podshimd refuses it now, on every handler, as containerd does:
INVALID_ARGUMENT with a sentence, and nothing is made; podshimctl says the same. Below podshimd
(the pod layer, the shim's Task.Create) such a container runs on an empty read-only root of its
own: it sees nothing of the node but what its mounts bind."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import grpc
import pytest

from shim.cri.api import api_pb2

from support.critools import REPO
from support.podtools import container_config, pod_config, pod_service

REFUSAL = ("config.image.image is empty: a container needs an image, which is its root filesystem "
           "(podshimd runs no container without one)")


def test_a_container_without_an_image_is_refused_and_nothing_is_made(cri, handler) -> None:
    pod = cri.run_pod(handler)
    with pytest.raises(grpc.RpcError) as refused:
        cri.create(pod, ["cat", "/etc/shadow"], image="")
    assert (refused.value.code(), refused.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, REFUSAL)
    listed = cri.daemon.runtime().ListContainers(api_pb2.ListContainersRequest(), timeout=30).containers
    assert [c.id for c in listed if c.pod_sandbox_id == pod[0]] == []


def test_podshimctl_create_of_a_config_without_an_image_says_why(cri, tmp_path) -> None:
    pod_id, _ = cri.run_pod("native")
    pod_file, container_file = tmp_path / "pod.json", tmp_path / "container.json"
    pod_file.write_text(json.dumps(pod_config()))
    container_file.write_text(json.dumps(container_config(["cat", "/etc/shadow"])))
    done = subprocess.run([sys.executable, "-m", "client.cli", "--runtime-root", cri.daemon.runtime_root, "create", pod_id,
                           str(container_file), str(pod_file)], cwd=REPO, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.strip() == f"INVALID_ARGUMENT: {REFUSAL}"


async def test_below_podshimd_a_container_without_an_image_sees_nothing_of_the_node(handler, roots) -> None:
    # The node's secrets, podshimd's socket (the run directory) and state: none is in its root.
    script = ("/bin/busybox ls -a / /run /var /etc; /bin/busybox cat /etc/shadow; "
              "/bin/busybox touch /written; echo end")
    config = {**container_config(["/bin/busybox", "sh", "-c", script]),
              "mounts": [{"container_path": "/bin/busybox", "host_path": "/bin/busybox", "readonly": True}]}
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config(), runtime_handler=handler)
        container_id = await pods.create_container(pod_id, config)
        await pods.start_container(container_id)
        deadline = time.monotonic() + 30
        while (await pods.container_status(container_id))["state"] != "CONTAINER_EXITED":
            assert time.monotonic() < deadline, "the container did not exit"
            await asyncio.sleep(0.05)
        with open(pods.container_log_path(container_id)) as f:
            lines = [line.rstrip("\n").split(" ", 3)[3] for line in f]
    assert "end" in lines  # it ran to its end (its stdout and stderr lines may come in either order)
    assert {"shadow", "passwd", "podshimd.sock"}.isdisjoint(lines) and not any("root:" in line for line in lines)
    assert not os.path.exists("/written")
