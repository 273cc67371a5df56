"""Helpers shared by the pod-level tests: example configs with unique names, pod services."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import secrets
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from shim.launch.template import stop_template

from client.cri.pod import PodService, open_pod_service
from client.cri.rootfs import ContainerImage, image_not_found
from client.images.snapshots import Mount

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def pod_config(name: str | None = None, **namespace_options: Any) -> dict[str, Any]:
    """examples/pod-config.json with a unique name and uid, under the default cgroup parent."""
    with open(os.path.join(EXAMPLES, "pod-config.json")) as f:
        cfg: dict[str, Any] = json.load(f)
    cfg["metadata"]["name"] = name or f"pod-{secrets.token_hex(4)}"
    cfg["metadata"]["uid"] = secrets.token_hex(8)
    cfg["linux"]["cgroup_parent"] = ""
    if namespace_options:
        cfg["linux"]["security_context"]["namespace_options"].update(namespace_options)
    return cfg


def container_config(command: list[str], name: str = "c", pid: int = 1) -> dict[str, Any]:
    """A crictl ContainerConfig running ``command`` (pid 1 = CONTAINER mode, 0 = POD), naming no
    image (podshimd's tests give it one: tests/support/critools.py)."""
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


#: A CRI mount of the node's static busybox, read-only, at its own path: what a container without
#: an image (an empty root of its own) needs to run anything.
BUSYBOX_MOUNT = {"container_path": "/bin/busybox", "host_path": "/bin/busybox", "readonly": True}
#: The image of :func:`node_container`: the node's own ``/`` (NodeRootImages), for the pod layer's
#: tests whose containers run the node's programs.
NODE_ROOT_IMAGE = "podshim.test/node-root:1"


def node_container(command: list[str], name: str = "c", pid: int = 1) -> dict[str, Any]:
    """:func:`container_config` on the node's own root, read-only (:data:`NODE_ROOT_IMAGE`, which
    :func:`pod_service` has): a container of the pod layer's tests that runs the node's programs
    asks for that root explicitly (one without an image runs on an empty root of its own)."""
    config = container_config(command, name, pid)
    config["image"] = {"image": NODE_ROOT_IMAGE}
    config["linux"]["security_context"]["readonly_rootfs"] = True  # a runtime's bind of it is writable
    return config


class NodeRootImages:
    """The pod layer's image store and snapshotter for :func:`pod_service`: one image,
    :data:`NODE_ROOT_IMAGE`, whose container root is a bind of the node's ``/`` (without the mounts
    below it), its user names the node's."""

    image = ContainerImage(image_id="sha256:" + "0" * 64, name=NODE_ROOT_IMAGE,
                           image_ref="podshim.test/node-root@sha256:" + "1" * 64, chain_id="sha256:" + "2" * 64)

    def container_image(self, reference: str) -> ContainerImage:
        if reference not in (self.image.name, self.image.image_id):
            raise image_not_found(reference)
        return self.image

    def prepare(self, key: str, chain_id: str) -> list[Mount]:
        return [Mount("bind", "/", ("bind", "ro"))]

    def remove(self, key: str) -> None:
        pass

    def read_file(self, chain_id: str, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()


def ns_inode(pid: int, kind: str) -> int:
    return os.stat(f"/proc/{pid}/ns/{kind}").st_ino






@pytest.fixture
def roots(tmp_path: pathlib.Path) -> Iterator[tuple[str, str]]:
    runtime_root = f"/tmp/podshim-pods-{secrets.token_hex(4)}"
    yield str(tmp_path / "root"), runtime_root
    stop_template(runtime_root)  # the one a Controller started there by default, if any
    subprocess.run(["rm", "-rf", runtime_root])


@asynccontextmanager
async def pod_service(roots: tuple[str, str], **kwargs: Any) -> AsyncIterator[PodService]:
    """A pod service on ``roots``; its images (unless given) are :class:`NodeRootImages`."""
    root, runtime_root = roots
    if "images" not in kwargs:
        kwargs.update(images=NodeRootImages(), snapshots=NodeRootImages())
    async with open_pod_service(root, runtime_root, cni_conf_dir=os.path.join(root, "no-cni"), **kwargs) as pods:
        try:
            yield pods
        finally:
            for pod in pods.store.list():
                try:
                    await pods.remove_pod_sandbox(pod.pod_id)
                except Exception as exc:  # keep cleaning the rest; the leak guard reports leftovers
                    print(f"cleanup of pod {pod.pod_id} failed: {exc}")


async def shows_notready(pods: PodService, pod_id: str, timeout: float) -> None:
    """Wait until the pod shows SANDBOX_NOTREADY, as it does once its shim or its Controller
    noticed a death on its own; fails the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (await pods.pod_sandbox_status(pod_id))["state"] != "SANDBOX_NOTREADY":
        assert time.monotonic() < deadline, "the pod never showed NOTREADY"
        await asyncio.sleep(0.02)
