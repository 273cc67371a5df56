"""What the attack tests share: the installed runtime handlers, a small CRI client (pods and
containers as kubelet asks for them, commands run in them as ``kubectl exec`` does), and a canary
on the host that no container may read, change or add to."""

from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass

from google.protobuf import json_format

from shim.cri.api import api_pb2
from shim.runtime import process

from support.podtools import container_config, pod_config

#: Seconds a CRI call may take here (a pod's start on a loaded machine included).
CALL_TIMEOUT = 60.0
#: What a canary file holds; a container that could write it would change it.
CANARY = b"podshim canary: untouched\n"


def handlers() -> list[str]:
    """native, and runc and crun where installed."""
    path = os.pathsep.join([os.environ.get("PATH", ""), process.DEFAULT_PATH])
    return ["native"] + [name for name in ("runc", "crun") if shutil.which(name, path=path)]


@dataclass(frozen=True)
class Exec:
    """What a command run in a container did."""

    exit_code: int
    stdout: str
    stderr: str


class Cri:
    """A CRI client of ``daemon`` (tests/support/critools.py's Podshimd): it remembers the pods it ran."""

    def __init__(self, daemon, image: str = "") -> None:
        self.daemon = daemon
        self.image = image
        self.pods: list[str] = []

    def run_pod(self, handler: str, **namespace_options) -> tuple[str, api_pb2.PodSandboxConfig]:
        """A ready pod of ``handler`` (``namespace_options`` as crictl's pod config spells them)."""
        config = json_format.ParseDict(pod_config(**namespace_options), api_pb2.PodSandboxConfig())
        pod_id = self.daemon.runtime().RunPodSandbox(api_pb2.RunPodSandboxRequest(
            config=config, runtime_handler=handler), timeout=CALL_TIMEOUT).pod_sandbox_id
        self.pods.append(pod_id)
        return pod_id, config

    def create(self, pod: tuple[str, api_pb2.PodSandboxConfig], command: list[str], *, pid: int = 1,
               image: str | None = None, **fields) -> str:
        """A container of the pod running ``command`` from ``image`` (the client's by default; ""
        for none), in pid namespace mode ``pid`` (0 POD, 1 CONTAINER), with more of crictl's
        ContainerConfig ``fields``."""
        cfg = {**container_config(command, name=f"c-{secrets.token_hex(3)}", pid=pid), **fields}
        cfg["image"] = {"image": self.image if image is None else image}
        config = json_format.ParseDict(cfg, api_pb2.ContainerConfig())
        return self.daemon.runtime().CreateContainer(api_pb2.CreateContainerRequest(
            pod_sandbox_id=pod[0], config=config, sandbox_config=pod[1]), timeout=CALL_TIMEOUT).container_id

    def start(self, container_id: str) -> None:
        self.daemon.runtime().StartContainer(api_pb2.StartContainerRequest(container_id=container_id),
                                             timeout=CALL_TIMEOUT)

    def run(self, pod: tuple[str, api_pb2.PodSandboxConfig], *, pid: int = 1, **fields) -> str:
        """A started container of the pod that sleeps (commands are then run in it with :meth:`exec`)."""
        container_id = self.create(pod, ["sleep", "600"], pid=pid, **fields)
        self.start(container_id)
        return container_id

    def exec(self, container_id: str, script: str) -> Exec:
        """``sh -c script`` in the container, to its end (ExecSync)."""
        reply = self.daemon.runtime().ExecSync(api_pb2.ExecSyncRequest(
            container_id=container_id, cmd=["sh", "-c", script], timeout=30), timeout=CALL_TIMEOUT)
        return Exec(reply.exit_code, reply.stdout.decode(errors="replace"), reply.stderr.decode(errors="replace"))

    def remove_pods(self) -> None:
        for pod_id in self.pods:
            self.daemon.runtime().RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=pod_id),
                                                   timeout=CALL_TIMEOUT)
        self.pods.clear()


def plant_canary(directory: str) -> str:
    """A canary file in ``directory`` on the host (its path)."""
    path = os.path.join(directory, "canary")
    with open(path, "wb") as f:
        f.write(CANARY)
    return path


def canary_untouched(directory: str) -> bool:
    """The canary holds what it was given and nothing was added beside it."""
    with open(os.path.join(directory, "canary"), "rb") as f:
        return f.read() == CANARY and os.listdir(directory) == ["canary"]
