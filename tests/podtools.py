"""Helpers shared by the pod-level tests: example configs with unique names, process checks."""

from __future__ import annotations

import json
import os
import secrets
import time

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


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def wait_gone(*pids: int, timeout: float = 5.0) -> list[int]:
    """Wait until every pid is gone (PID 1 here reaps orphans slowly: the one bounded poll);
    return those still alive after ``timeout``."""
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left
