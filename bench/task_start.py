"""How long a task takes to start in a running sandbox, per pid mode, through a real shim.

    python3 bench/task_start.py [--tasks 20] [--rootfs overlay]

One shim (``podshim start``) with a running sandbox; then, one task at a time: Create, Start
(the figure: until Start answered, i.e. the program has exec'd in its namespaces and cgroup),
Kill 9, Wait, Delete. Prints a markdown table of Start's median, min and max, and of the whole
cycle. Run as root; the sandbox is shut down at the end (``podshim delete`` if that fails).
``--rootfs overlay`` gives every task a rootfs (an overlay of a busybox tree with an upper
directory of its own, as a snapshotter would), mounted at Create; the default is none (the host's
``/``, read-only).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench.common import busybox_tree
from shim.rpc import Client
from shim.rpc.api import SANDBOX_SERVICE, TASK_SERVICE

NAMESPACE = "bench"
TIMEOUT = 10.0


def overlay(base: str, lower: str, task_id: str) -> list[dict]:
    upper, work = f"{base}/snapshots/{task_id}/upper", f"{base}/snapshots/{task_id}/work"
    os.makedirs(upper)
    os.makedirs(work)
    return [{"type": "overlay", "source": "overlay",
             "options": [f"lowerdir={lower}", f"upperdir={upper}", f"workdir={work}"]}]


async def bench(tasks: int, rootfs: str) -> None:
    base = tempfile.mkdtemp(prefix="task-bench-")
    lower = busybox_tree(f"{base}/lower", "sleep") if rootfs == "overlay" else ""
    sandbox_id = f"task-bench-{os.getpid()}"
    argv = [sys.executable, "-m", "shim", "--namespace", NAMESPACE, "--id", sandbox_id,
            "--bundle", f"{base}/bundle", "--runtime-root", f"{base}/run"]
    started = subprocess.run(argv[:3] + ["start"] + argv[3:], capture_output=True, text=True, check=True)
    client = await Client.connect(json.loads(started.stdout)["address"], namespace=NAMESPACE)

    async def call(service: str, method: str, **fields):
        return await client.call(service, method, {"sandbox_id": sandbox_id, **fields}, timeout=TIMEOUT)

    rows = []
    try:
        await call(SANDBOX_SERVICE, "CreateSandbox")
        await call(SANDBOX_SERVICE, "StartSandbox")
        for pid_mode in ("POD", "CONTAINER"):
            start_ms, cycle_ms = [], []
            for n in range(tasks):
                task_id = f"{pid_mode.lower()}-{n}"
                fields = {"rootfs": overlay(base, lower, task_id), "env": ["PATH=/bin"]} if lower else {}
                t0 = time.perf_counter()
                await call(TASK_SERVICE, "Create", task_id=task_id, args=["sleep", "60"], pid_mode=pid_mode,
                           log_path=f"{base}/logs/{task_id}.log", **fields)
                t1 = time.perf_counter()
                await call(TASK_SERVICE, "Start", task_id=task_id)
                t2 = time.perf_counter()
                await call(TASK_SERVICE, "Kill", task_id=task_id, signal=9)
                await call(TASK_SERVICE, "Wait", task_id=task_id)
                await call(TASK_SERVICE, "Delete", task_id=task_id)
                start_ms.append((t2 - t1) * 1000)
                cycle_ms.append((time.perf_counter() - t0) * 1000)
            rows.append((pid_mode, start_ms, cycle_ms))
    finally:
        try:
            await call(SANDBOX_SERVICE, "ShutdownSandbox")
        except Exception:
            subprocess.run(argv[:3] + ["delete"] + argv[3:], capture_output=True)
        await client.aclose()
        shutil.rmtree(base, ignore_errors=True)

    print("| pid mode | Start median (min–max), ms | Create→Delete median, ms | n |")
    print("|---|---|---|---|")
    for pid_mode, start_ms, cycle_ms in rows:
        print(f"| {pid_mode} | {statistics.median(start_ms):.1f} ({min(start_ms):.1f}–{max(start_ms):.1f}) "
              f"| {statistics.median(cycle_ms):.1f} | {len(start_ms)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20, help="tasks per pid mode (default 20)")
    parser.add_argument("--rootfs", choices=("host", "overlay"), default="host",
                        help="each task's root: none given (the host's /, read-only) or an overlay (default host)")
    args = parser.parse_args()
    asyncio.run(bench(args.tasks, args.rootfs))


if __name__ == "__main__":
    main()
