"""A pod's whole life per runtime handler: runp → stopp → rmp, native against runc and crun.

    python3 bench/pod_cycle.py [--cycles 30] [--handlers native,runc,crun] [--network bridge|loopback]

Each cycle is what ``podshimctl runp``, ``stopp`` and ``rmp`` do, called in this process on one
pod service (so Python's start-up is not in the figures): RunPodSandbox (a shim, a netns, the
pause started by the handler, and with ``--network bridge`` — the default — CNI ADD through the
real bridge + host-local + loopback plugins, run inside a throwaway outer network namespace
this script makes and removes, never on the machine's own network),
StopPodSandbox, RemovePodSandbox (until the shim has exited and the netns, cgroups and, for
runc/crun, the runtime's container are gone). The handlers take turns cycle by cycle, so a
noisy moment hits them all; one unmeasured cycle each first (it builds the pause rootfs, and
the first one starts the runtime root's shim template, which forks every shim after it: the pod
service's default).
Prints a markdown table of p50 and p99 (nearest rank) per phase, in ms. A handler whose binary
is not installed is left out, with the reason. Run as root; everything is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from shim.api.handlers import NATIVE, RUNTIME_HANDLERS
from shim.launch.template import stop_template
from shim.runtime import process

from client.cri.pod import PodService, open_pod_service

from bench.common import percentile

PHASES = ("runp", "stopp", "rmp")


def pod_config() -> dict[str, Any]:
    with open(os.path.join(REPO, "examples", "pod-config.json")) as f:
        cfg: dict[str, Any] = json.load(f)
    cfg["metadata"]["name"] = f"bench-{secrets.token_hex(4)}"
    cfg["metadata"]["uid"] = secrets.token_hex(8)
    return cfg


async def cycle(pods: PodService, handler: str) -> dict[str, float]:
    """One pod up and down; seconds per phase."""
    t0 = time.perf_counter()
    pod_id = await pods.run_pod_sandbox(pod_config(), runtime_handler=handler)
    t1 = time.perf_counter()
    await pods.stop_pod_sandbox(pod_id)
    t2 = time.perf_counter()
    await pods.remove_pod_sandbox(pod_id)
    t3 = time.perf_counter()
    return {"runp": t1 - t0, "stopp": t2 - t1, "rmp": t3 - t2}


def bridge_network(base: str) -> tuple[str, str]:
    """A bridge + host-local conflist (leases in ``base``) and a throwaway outer netns; returns
    (conf dir, outer netns path)."""
    conf_dir = os.path.join(base, "net.d")
    os.makedirs(conf_dir)
    with open(os.path.join(conf_dir, "10-bench.conflist"), "w") as f:
        json.dump({"cniVersion": "1.0.0", "name": "podshim-bench", "plugins": [
            {"type": "bridge", "bridge": "psbench0", "isGateway": True, "ipMasq": False,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.214.0.0/16"}]],
                      "dataDir": os.path.join(base, "ipam")}}]}, f)
    outer = f"podshim-bench-{secrets.token_hex(4)}"
    subprocess.run(["ip", "netns", "add", outer], check=True)
    subprocess.run(["ip", "-n", outer, "link", "set", "lo", "up"], check=True)
    return conf_dir, f"/var/run/netns/{outer}"


async def bench(cycles: int, handlers: list[str], network: str) -> dict[str, list[dict[str, float]]]:
    base = tempfile.mkdtemp(prefix="pod-bench-")
    runtime_root = f"/tmp/pod-bench-{secrets.token_hex(3)}"  # short: shim sockets must fit sun_path
    results: dict[str, list[dict[str, float]]] = {h: [] for h in handlers}
    outer = None
    try:
        if network == "bridge":
            conf_dir, outer = bridge_network(base)
        else:
            conf_dir = os.path.join(base, "no-cni")
        async with open_pod_service(os.path.join(base, "root"), runtime_root, cni_conf_dir=conf_dir,
                                    cni_plugin_netns=outer) as pods:
            try:
                for handler in handlers:
                    await cycle(pods, handler)  # warm-up
                for _ in range(cycles):
                    for handler in handlers:
                        results[handler].append(await cycle(pods, handler))
            finally:
                for pod in pods.store.list():
                    await pods.remove_pod_sandbox(pod.pod_id)
    finally:
        if outer is not None:
            subprocess.run(["ip", "netns", "del", os.path.basename(outer)], capture_output=True)
        stop_template(runtime_root)  # the one the pod service's Controller started there (its default)
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(runtime_root, ignore_errors=True)
    return results


def print_table(results: dict[str, list[dict[str, float]]], network: str) -> None:
    handlers = list(results)
    n = len(results[handlers[0]])
    what = "CNI bridge + host-local" if network == "bridge" else "loopback only"
    print(f"\n### Pod cycle per runtime handler: {n} cycles each, {what} (ms)\n")
    print("| phase | " + " | ".join(f"{h} p50 | {h} p99" for h in handlers) + " |")
    print("|---|" + "---|---|" * len(handlers))

    def cells(seconds: list[float]) -> str:
        return f"{percentile(seconds, 50) * 1000:.1f} | {percentile(seconds, 99) * 1000:.1f}"

    for phase in PHASES:
        print(f"| {phase} | " + " | ".join(cells([c[phase] for c in results[h]]) for h in handlers) + " |")
    print("| **cycle** | " + " | ".join(cells([sum(c.values()) for c in results[h]]) for h in handlers) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=30, help="measured cycles per handler (default 30)")
    parser.add_argument("--handlers", default=",".join(RUNTIME_HANDLERS),
                        help=f"comma-separated runtime handlers (default {','.join(RUNTIME_HANDLERS)})")
    parser.add_argument("--network", choices=("bridge", "loopback"), default="bridge",
                        help="CNI bridge networking in a throwaway outer netns (default), or loopback only")
    args = parser.parse_args()
    handlers = []
    search = os.pathsep.join([os.environ.get("PATH", ""), process.DEFAULT_PATH])
    for handler in args.handlers.split(","):
        if handler != NATIVE and shutil.which(handler, path=search) is None:
            print(f"{handler}: left out, no {handler} binary is installed", file=sys.stderr)
            continue
        handlers.append(handler)
    print_table(asyncio.run(bench(args.cycles, handlers, args.network)), args.network)


if __name__ == "__main__":
    main()
