"""Tests against a harness cluster (bench/cluster.py): manifests applied with the real kubectl,
bounded waits on what the API server shows, crictl on a node, kubectl left running (logs -f,
attach, port-forward)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from collections.abc import Callable
from typing import Any, TypeVar

from bench import cluster as harness

#: Bound on waiting for the cluster to show what a test expects (scheduling, pulls, restarts).
WAIT = 120.0
T = TypeVar("T")

#: One pod per restartPolicy and exit: ``never-fails`` (exit 3, Never), ``onfailure-once`` (fails
#: once, then exits 0), ``always-exits-0`` (exits 0 after a second, Always); their image IMAGE.
RESTART_POLICIES = """
apiVersion: v1
kind: Pod
metadata: {name: never-fails}
spec:
  restartPolicy: Never
  containers: [{name: c, image: IMAGE, command: ["sh", "-c", "exit 3"]}]
---
apiVersion: v1
kind: Pod
metadata: {name: onfailure-once}
spec:
  restartPolicy: OnFailure
  volumes: [{name: state, emptyDir: {}}]
  containers:
  - name: c
    image: IMAGE
    volumeMounts: [{name: state, mountPath: /state}]
    command: ["sh", "-c", "[ -e /state/ran ] && exit 0; touch /state/ran; exit 1"]
---
apiVersion: v1
kind: Pod
metadata: {name: always-exits-0}
spec:
  terminationGracePeriodSeconds: 1
  restartPolicy: Always
  containers: [{name: c, image: IMAGE, command: ["sh", "-c", "sleep 1"]}]
"""


def apply(c: harness.Cluster, text: str, **placeholders: str) -> None:
    """``kubectl apply`` the manifest ``text``, each PLACEHOLDER in it replaced by its value."""
    for name, value in placeholders.items():
        text = text.replace(name, value)
    c.kubectl("apply", "-f", "-", input=text)


def get(c: harness.Cluster, *what: str) -> Any:
    """``kubectl get WHAT -o json``, parsed."""
    return json.loads(c.kubectl("get", *what, "-o", "json").stdout)


def wait_until(what: str, probe: Callable[[], T], accept: Callable[[T], bool] = bool,
               timeout: float = WAIT, interval: float = 0.5) -> T:
    """Call ``probe`` until ``accept`` takes what it returns (that value); an AssertionError
    naming ``what`` and the last value after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        seen = probe()
        if accept(seen):
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s; last seen: {seen!r}"[:3000])
        time.sleep(interval)


def pod(c: harness.Cluster, name: str) -> dict[str, Any]:
    return get(c, "pod", name)  # type: ignore[no-any-return]


def container(p: dict[str, Any], name: str, init: bool = False) -> dict[str, Any]:
    """The status of the container ``name`` in the pod ``p`` (an empty dict before it has one)."""
    statuses = p["status"].get("initContainerStatuses" if init else "containerStatuses", [])
    return next((s for s in statuses if s["name"] == name), {})


def wait_pod(c: harness.Cluster, name: str, what: str, accept: Callable[[dict[str, Any]], bool],
             timeout: float = WAIT) -> dict[str, Any]:
    """Wait until the pod ``name`` is as ``accept`` wants (``what`` says how); the pod."""
    def probe() -> dict[str, Any]:
        done = c.kubectl("get", "pod", name, "-o", "json", check=False)
        return json.loads(done.stdout) if done.returncode == 0 else {"status": {}, "error": done.stderr}

    def accepted(p: dict[str, Any]) -> bool:
        return "error" not in p and accept(p)

    return wait_until(f"pod {name} {what}", probe, accepted, timeout)


def running(p: dict[str, Any]) -> bool:
    return p["status"].get("phase") == "Running" and all(
        "running" in s["state"] for s in p["status"].get("containerStatuses", [{"state": {}}]))


def ready(p: dict[str, Any]) -> bool:
    return any(cond["type"] == "Ready" and cond["status"] == "True" for cond in p["status"].get("conditions", []))


def events(c: harness.Cluster, name: str) -> list[dict[str, Any]]:
    """The events of the object ``name`` (oldest first)."""
    items = get(c, "events", f"--field-selector=involvedObject.name={name}")["items"]
    return sorted(items, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")


def wait_events(c: harness.Cluster, name: str, what: str, accept: Callable[[list[str]], bool],
                reason: str | None = None) -> list[str]:
    """Wait until the messages of the events of ``name`` (of ``reason``, if given) are as ``accept``
    wants (kubelet sends its events after the fact they tell: they may come after the status)."""
    return wait_until(f"the events of {name} {what}", lambda: [e["message"] for e in events(c, name)
                                                                if reason is None or e["reason"] == reason], accept)


def node_number(c: harness.Cluster, node_name: str) -> int:
    number: int = next(n["number"] for n in c.nodes() if n["name"] == node_name)
    return number


def crictl(c: harness.Cluster, number: int, *args: str) -> Any:
    """crictl ARGS on node ``number`` against its runtime, its JSON output parsed (``-o json``)."""
    from support.critools import cri_tool

    socket = c.nodes()[number - 1]["socket"]
    done = c.in_node(number, [cri_tool("crictl"), f"--runtime-endpoint=unix://{socket}",
                              f"--image-endpoint=unix://{socket}", *args, "-o", "json"])
    return json.loads(done.stdout)


def node_containers(c: harness.Cluster, number: int, pod_uid: str) -> list[dict[str, Any]]:
    """Every container node ``number``'s runtime holds for the pod of UID ``pod_uid``."""
    return [x for x in crictl(c, number, "ps", "-a")["containers"]
            if x["labels"].get("io.kubernetes.pod.uid") == pod_uid]


def node_sandboxes(c: harness.Cluster, number: int, pod_uid: str) -> list[dict[str, Any]]:
    """Every sandbox node ``number``'s runtime holds for the pod of UID ``pod_uid``."""
    return [x for x in crictl(c, number, "pods")["items"] if x["metadata"]["uid"] == pod_uid]


def delete(c: harness.Cluster, *what: str, timeout: float = WAIT) -> float:
    """``kubectl delete WHAT`` and wait until it is gone; the seconds that took."""
    started = time.monotonic()
    c.kubectl("delete", *what, f"--timeout={timeout:.0f}s", timeout=timeout + 10)
    return time.monotonic() - started


class Kubectl:
    """kubectl ARGS against the cluster, left running (logs -f, attach, port-forward): what it
    prints (stdout and stderr) is read with :meth:`read_until`; :meth:`stop` ends it (by its pid)."""

    def __init__(self, c: harness.Cluster, *args: str, stdin: bool = False):
        self.process = subprocess.Popen(c.kubectl_argv(*args), stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.output = b""

    def write(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text.encode())
        self.process.stdin.flush()

    def read_until(self, pattern: str, timeout: float = 30.0) -> str:
        """Read until a line holding ``pattern`` is complete; that line (what came after it is
        kept for the next call). AssertionError with what came, after ``timeout`` seconds or at
        kubectl's end."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout
        while True:
            lines = self.output.split(b"\n")
            for number, line in enumerate(lines[:-1]):
                if pattern.encode() in line:
                    self.output = b"\n".join(lines[number + 1:])
                    return line.decode(errors="replace")
            left = deadline - time.monotonic()
            chunk = os.read(fd, 65536) if left > 0 and select.select([fd], [], [], left)[0] else None
            if not chunk:
                raise AssertionError(f"no line with {pattern!r} from kubectl within {timeout:.0f} s (or it "
                                     f"ended: {self.process.poll()}): {self.output[-2000:]!r}")
            self.output += chunk

    def stop(self) -> int:
        """End kubectl (SIGKILL if it still runs); its exit status."""
        if self.process.poll() is None:
            self.process.kill()
        status = self.process.wait(timeout=30)
        for stream in (self.process.stdin, self.process.stdout):
            if stream:
                stream.close()
        return status
