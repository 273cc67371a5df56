"""Helpers shared by the pod-level tests: example configs with unique names, pod services."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from contextlib import asynccontextmanager

import pytest

from client.cri.pod import open_pod_service
from sandbox_env import stop_template

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")


def pod_config(name: str | None = None, **namespace_options) -> dict:
    """examples/pod-config.json with a unique name and uid, under the default cgroup parent."""
    with open(os.path.join(EXAMPLES, "pod-config.json")) as f:
        cfg = json.load(f)
    cfg["metadata"]["name"] = name or f"pod-{secrets.token_hex(4)}"
    cfg["metadata"]["uid"] = secrets.token_hex(8)
    cfg["linux"]["cgroup_parent"] = ""
    if namespace_options:
        cfg["linux"]["security_context"]["namespace_options"].update(namespace_options)
    return cfg


def container_config(command: list[str], name: str = "c", pid: int = 1) -> dict:
    """A crictl ContainerConfig running ``command`` (pid 1 = CONTAINER mode, 0 = POD)."""
    return {"metadata": {"name": name}, "command": command,
            "linux": {"security_context": {"namespace_options": {"pid": pid}}}}


def cgroup_file(pid: int, controller: str, name: str) -> str:
    """The file ``name`` of process ``pid``'s cgroup in the v1 hierarchy of ``controller``."""
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controller in controllers.split(","):
                mount = "/sys/fs/cgroup/" + (controllers if os.path.isdir(f"/sys/fs/cgroup/{controllers}")
                                             else controller)
                return os.path.join(mount, path.lstrip("/"), name)
    raise AssertionError(f"process {pid} has no {controller} cgroup")


def ns_inode(pid: int, kind: str) -> int:
    return os.stat(f"/proc/{pid}/ns/{kind}").st_ino






@pytest.fixture
def roots(tmp_path):
    runtime_root = f"/tmp/podshim-pods-{secrets.token_hex(4)}"
    yield str(tmp_path / "root"), runtime_root
    stop_template(runtime_root)  # the one a Controller started there by default, if any
    subprocess.run(["rm", "-rf", runtime_root])


@asynccontextmanager
async def pod_service(roots, **kwargs):
    root, runtime_root = roots
    async with open_pod_service(root, runtime_root, cni_conf_dir=os.path.join(root, "no-cni"), **kwargs) as pods:
        try:
            yield pods
        finally:
            for pod in pods.store.list():
                try:
                    await pods.remove_pod_sandbox(pod.pod_id)
                except Exception as exc:  # keep cleaning the rest; the leak guard reports leftovers
                    print(f"cleanup of pod {pod.pod_id} failed: {exc}")
