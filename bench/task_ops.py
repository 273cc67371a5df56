"""How long the Task service's operations on a running task take, per runtime handler, through a
real shim: Exec of ``true`` (fork or ``<runtime> exec`` into the task's namespaces and cgroup, wait,
collect), Stats (the task cgroup's figures), Update (one cgroup write) and ReopenLog.

    python3 bench/task_ops.py [--calls 30] [--handlers native,runc,crun]

One shim per handler (``podshim start``, no template) with a running sandbox and one task running
``sleep``; each operation is called ``--calls`` times in a row. Prints a markdown table of medians
and 90th percentiles in ms, with the load average. Run as root; each sandbox is shut down at the end.
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
from typing import Any

from shim.api.names import SANDBOX_SERVICE, TASK_SERVICE
from shim.rpc import Client

from bench.common import NODE_ROOT

NAMESPACE = "bench"
TIMEOUT = 30.0
OPERATIONS = ("Exec", "Stats", "Update", "ReopenLog")


def p90(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.9) - 1)]


async def bench_handler(handler: str, calls: int) -> dict[str, list[float]]:
    base = tempfile.mkdtemp(prefix="task-ops-bench-")
    sandbox_id = f"ops-bench-{handler}-{os.getpid()}"
    argv = [sys.executable, "-m", "shim", "start", "--no-template", "--namespace", NAMESPACE, "--id", sandbox_id,
            "--bundle", f"{base}/bundle", "--runtime-root", f"{base}/run"]
    started = subprocess.run(argv, capture_output=True, text=True, check=True)
    client = await Client.connect(json.loads(started.stdout)["address"], namespace=NAMESPACE)

    async def call(service: str, method: str, **fields: Any) -> Any:
        return await client.call(service, method, {"sandbox_id": sandbox_id, **fields}, timeout=TIMEOUT)

    payloads: dict[str, dict[str, Any]] = {"Exec": {"args": ["true"]}, "Stats": {}, "Update": {"resources": {"cpu_shares": 1024}},
                "ReopenLog": {}}
    figures: dict[str, list[float]] = {op: [] for op in OPERATIONS}
    try:
        await call(SANDBOX_SERVICE, "CreateSandbox", options={"runtime_handler": handler})
        await call(SANDBOX_SERVICE, "StartSandbox")
        await call(TASK_SERVICE, "Create", task_id="app", args=["sleep", "600"], log_path=f"{base}/logs/app.log",
                   **NODE_ROOT)
        await call(TASK_SERVICE, "Start", task_id="app")
        for op in OPERATIONS:
            for _ in range(calls):
                t0 = time.perf_counter()
                await call(TASK_SERVICE, op, task_id="app", **payloads[op])
                figures[op].append((time.perf_counter() - t0) * 1000)
    finally:
        try:
            await call(SANDBOX_SERVICE, "ShutdownSandbox")
        except Exception as exc:  # the shim may be gone: podshim delete cleans up after it
            print(f"shutdown of {sandbox_id} failed ({exc}); running podshim delete", file=sys.stderr)
            subprocess.run([sys.executable, "-m", "shim", "delete", "--namespace", NAMESPACE, "--id", sandbox_id,
                            "--bundle", f"{base}/bundle", "--runtime-root", f"{base}/run"], capture_output=True)
        await client.aclose()
        shutil.rmtree(base, ignore_errors=True)
    return figures


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--handlers", default="native,runc,crun")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"{args.calls} calls each, load {load[0]:.1f} at the start\n")
    print("| handler | " + " | ".join(f"{op} p50 (p90) ms" for op in OPERATIONS) + " |")
    print("|---|" + "---:|" * len(OPERATIONS))
    for handler in args.handlers.split(","):
        figures = await bench_handler(handler, args.calls)
        cells = [f"{statistics.median(figures[op]):.2f} ({p90(figures[op]):.2f})" for op in OPERATIONS]
        print(f"| {handler} | " + " | ".join(cells) + " |")
    print(f"\nload {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    asyncio.run(main())
