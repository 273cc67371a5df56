"""The pod store alone: what each operation costs with N other pods on disk.

    python3 bench/pod_store.py [--pods 0,100,1000] [--rounds 200]

Other processes may change the files at any time, so a name check (create), a container lookup
by prefix and a listing read every record file (decoding again only those whose bytes changed),
while get, update and the container changes read one. Each round is one pod's store traffic as RunPodSandbox, a
container's life and RemovePodSandbox make it, in a private temporary directory (fsync
included: the directory is on the same filesystem as /tmp). Prints a markdown table of p50 and
p99 (nearest rank) per operation, in ms.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from client.cri.store import ContainerRecord, ContainerState, PodRecord, PodState, PodStore

from bench.common import percentile

OPERATIONS = ("create", "update", "add_container", "find_container", "update_container", "list", "delete")


def pod_config(name: str) -> dict[str, Any]:
    with open(os.path.join(REPO, "examples", "pod-config.json")) as f:
        cfg: dict[str, Any] = json.load(f)
    cfg["metadata"].update(name=name, uid=secrets.token_hex(8))
    return cfg


def make_pod(store: PodStore, name: str, timings: dict[str, list[float]] | None = None) -> str:
    """A READY pod with one container, as a pod cycle leaves it; times each step into ``timings``."""
    pod_id = secrets.token_hex(32)
    container_id = secrets.token_hex(32)

    def timed(operation: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        result = call(*args, **kwargs)
        if timings is not None:
            timings[operation].append(time.perf_counter() - t0)
        return result

    lock = store.lock_pod(pod_id)
    assert lock.try_acquire()
    try:
        timed("create", store.create, PodRecord(pod_id, pod_config(name), "native", sandbox_namespace="k8s.io"))
        timed("update", store.update, pod_id, state=PodState.READY, ip="10.88.0.2", pid=4242,
              netns_path="/run/netns/podshim-0123456789abcdef")
        timed("add_container", store.add_container,
              ContainerRecord(container_id, pod_id, {"metadata": {"name": "c"}, "command": ["sleep", "1"]}))
        timed("find_container", store.find_container, container_id[:12])
        timed("update_container", store.update_container, pod_id, container_id, state=ContainerState.RUNNING,
              pid=4243, started_at=time.time_ns())
        timed("list", store.list)
    finally:
        lock.release()
    return pod_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", default="0,100,1000", help="how many other pods are on disk, comma-separated")
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    print(f"| other pods | {' | '.join(OPERATIONS)} |")
    print(f"|---|{'---|' * len(OPERATIONS)}")
    for others in (int(n) for n in args.pods.split(",")):
        root = tempfile.mkdtemp(prefix="podshim-store-bench-")
        try:
            store = PodStore(root)
            for i in range(others):
                make_pod(store, f"other-{i}")
            timings: dict[str, list[float]] = {op: [] for op in OPERATIONS}
            for i in range(args.rounds):
                pod_id = make_pod(store, f"bench-{i}", timings)
                t0 = time.perf_counter()
                store.delete(pod_id)
                timings["delete"].append(time.perf_counter() - t0)
            cells = [f"{percentile(timings[op], 50) * 1e3:.2f} / {percentile(timings[op], 99) * 1e3:.2f}"
                     for op in OPERATIONS]
            print(f"| {others} | {' | '.join(cells)} |")
        finally:
            shutil.rmtree(root)
    print("\n(ms, p50 / p99)")


if __name__ == "__main__":
    main()
