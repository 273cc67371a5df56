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
import os
import statistics
import tempfile
import time
from typing import Any

from bench.common import NODE_ROOT, busybox_tree, running_sandbox, task_cycle

NAMESPACE = "bench"
TIMEOUT = 10.0


def overlay(base: str, lower: str, task_id: str) -> list[dict[str, Any]]:
    upper, work = f"{base}/snapshots/{task_id}/upper", f"{base}/snapshots/{task_id}/work"
    os.makedirs(upper)
    os.makedirs(work)
    return [{"type": "overlay", "source": "overlay",
             "options": [f"lowerdir={lower}", f"upperdir={upper}", f"workdir={work}"]}]


async def bench(tasks: int, rootfs: str) -> None:
    base = tempfile.mkdtemp(prefix="task-bench-")
    lower = busybox_tree(f"{base}/lower", "sleep") if rootfs == "overlay" else ""
    rows = []
    async with running_sandbox(base, f"task-bench-{os.getpid()}", namespace=NAMESPACE, timeout=TIMEOUT) as call:
        for pid_mode in ("POD", "CONTAINER"):
            start_ms, cycle_ms = [], []
            for n in range(tasks):
                task_id = f"{pid_mode.lower()}-{n}"
                fields = {"rootfs": overlay(base, lower, task_id), "env": ["PATH=/bin"]} if lower else NODE_ROOT
                t0 = time.perf_counter()
                _, start = await task_cycle(call, task_id, args=["sleep", "60"], pid_mode=pid_mode,
                                            log_path=f"{base}/logs/{task_id}.log", **fields)
                start_ms.append(start * 1000)
                cycle_ms.append((time.perf_counter() - t0) * 1000)
            rows.append((pid_mode, start_ms, cycle_ms))

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
