"""How long a restarted Controller takes to get every live sandbox back.

    python3 bench/restart_bench.py [-n 200] [--rounds 3] [--loop uvloop|asyncio] [--json]

Creates and starts N sandboxes through a Controller (each shim makes a new netns and launches a
pause), closes that Controller (the shims keep running), then times a fresh Controller's
``load()`` until every sandbox is reconnected and has answered SandboxStatus, ``--rounds``
times. Prints N, the total load time and the time per shim; then shuts everything down.
Needs root (netns, cgroups). Target: under 1 s for 200 sandboxes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import anyio

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shim.launch.template import stop_template

from client.controller import Controller
from client.controller.handle import Phase

NS = "bench"


async def create_all(state_root: str, runtime_root: str, n: int) -> float:
    began = time.monotonic()
    async with Controller(state_root, runtime_root) as c:
        async def one(i: int) -> None:
            await c.create(NS, f"sb{i:04d}")
            await c.start(NS, f"sb{i:04d}")

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
    return time.monotonic() - began


async def time_load(state_root: str, runtime_root: str, n: int) -> float:
    c = Controller(state_root, runtime_root)
    try:
        began = time.monotonic()
        await c.load()
        took = time.monotonic() - began
        live = [h for h in c.sandboxes.list(NS) if h.phase is Phase.LIVE and h.state == "running"]
        if len(live) != n:
            raise SystemExit(f"only {len(live)} of {n} sandboxes came back running")
        return took
    finally:
        await c.aclose()


async def shutdown_all(state_root: str, runtime_root: str) -> float:
    began = time.monotonic()
    async with Controller(state_root, runtime_root) as c:
        async with anyio.create_task_group() as tg:
            for handle in c.sandboxes.list():
                tg.start_soon(c.shutdown, handle.namespace, handle.sandbox_id)
    return time.monotonic() - began


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    state_root = tempfile.mkdtemp(prefix="podshim-bench-state-")
    runtime_root = tempfile.mkdtemp(prefix="psb-")
    try:
        setup = await create_all(state_root, runtime_root, args.n)
        print(f"created and started {args.n} sandboxes in {setup:.1f}s", file=sys.stderr)
        loads = [await time_load(state_root, runtime_root, args.n) for _ in range(args.rounds)]
    finally:
        teardown = await shutdown_all(state_root, runtime_root)
        stop_template(runtime_root)  # the one the first Controller started there (its default)
        print(f"shut them down in {teardown:.1f}s", file=sys.stderr)
        shutil.rmtree(state_root, ignore_errors=True)
        shutil.rmtree(runtime_root, ignore_errors=True)
    best, median = min(loads), statistics.median(loads)
    return {"n": args.n, "loop": args.loop, "rounds": args.rounds, "load_s": [round(x, 4) for x in loads],
            "best_s": round(best, 4), "median_s": round(median, 4),
            "per_shim_ms_median": round(median / args.n * 1000, 3), "setup_s": round(setup, 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=200, help="number of live sandboxes (default 200)")
    p.add_argument("--rounds", type=int, default=3, help="how many fresh controllers to time (default 3)")
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    # Each sandbox costs the controller one socket; keep clear of the default soft limit of 1024.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    result = anyio.run(bench, args, backend_options={"use_uvloop": args.loop == "uvloop"})
    if args.json:
        print(json.dumps(result))
    else:
        print(f"N={result['n']} ({result['loop']}): load {result['median_s'] * 1000:.0f} ms median of "
              f"{result['rounds']} (best {result['best_s'] * 1000:.0f} ms), "
              f"{result['per_shim_ms_median']:.2f} ms per shim")
    return 0


if __name__ == "__main__":
    sys.exit(main())
