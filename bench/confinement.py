"""What a container's confinement costs at start: tasks with and without it, per runtime handler.

    python3 bench/confinement.py [--tasks 20] [--handlers native,runc,crun]

One shim (``podshim start``) with a running sandbox per handler; then, interleaved so that the
machine's drift hits every variant alike, one task at a time: Create, Start (until Start
answered: the program has exec'd), Kill 9, Wait, Delete. The variants (Task.Create fields,
protocol.md 7.3):

- ``unconfined``: every capability the shim holds, no filter (what tasks got before issue 18);
- ``default caps``: a Create without the fields (containerd's default capabilities);
- ``default + RuntimeDefault``: what podshimd gives a container whose CRI config asks for
  RuntimeDefault (the default capabilities and containerd's default seccomp profile);
- ``non-root, nnp, RuntimeDefault``: uid/gid 1000 with a supplementary group, no_new_privs, the
  filter.

Prints a markdown table (Create and Start medians, p90) per handler and variant, and what
compiling the default profile with libseccomp costs once (Create compiles it; the shim caches
the BPF per profile, so the table's Create shows the cached case). Run as root.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from typing import Any

from shim.api.defaults import DEFAULT_CAPABILITIES
from shim.cri.seccomp_default import default_profile
from shim.cri.security import held_capabilities
from shim.kernel import seccomp

from bench.common import NODE_ROOT, running_sandbox, task_cycle

NAMESPACE = "bench"
TIMEOUT = 10.0
BUSYBOX = "/bin/busybox"


def variants() -> dict[str, dict[str, Any]]:
    profile = default_profile(DEFAULT_CAPABILITIES)
    return {
        "unconfined": {"capabilities": list(held_capabilities())},
        "default caps": {},
        "default + RuntimeDefault": {"capabilities": list(DEFAULT_CAPABILITIES), "seccomp": profile},
        "non-root, nnp, RuntimeDefault": {"user": {"uid": 1000, "gid": 1000, "additional_gids": [1000, 3000]},
                                          "no_new_privileges": True, "seccomp": profile},
    }


def p90(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.9) - 1)]


async def bench_handler(handler: str, tasks: int) -> list[tuple[str, list[float], list[float]]]:
    base = tempfile.mkdtemp(prefix="confine-bench-")
    cases = variants()
    create_ms: dict[str, list[float]] = {name: [] for name in cases}
    start_ms: dict[str, list[float]] = {name: [] for name in cases}
    async with running_sandbox(base, f"confine-bench-{handler}-{os.getpid()}", namespace=NAMESPACE, timeout=TIMEOUT,
                               options={"runtime_handler": handler}) as call:
        for n in range(tasks + 1):  # the first round warms up (imports, the BPF cache), unrecorded
            for i, (name, fields) in enumerate(cases.items()):
                task_id = f"t{n}-{i}"
                create, start = await task_cycle(call, task_id, args=[BUSYBOX, "sleep", "60"],
                                                 log_path=f"{base}/logs/{task_id}.log", **NODE_ROOT, **fields)
                if n:
                    create_ms[name].append(create * 1000)
                    start_ms[name].append(start * 1000)
    return [(name, create_ms[name], start_ms[name]) for name in cases]


def compile_cost_ms(rounds: int = 20) -> tuple[float, int]:
    profile = default_profile(DEFAULT_CAPABILITIES)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        bpf = seccomp._compile.__wrapped__(json.dumps(profile, sort_keys=True))  # uncached
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), len(bpf) // 8


async def main_async(tasks: int, handlers: list[str]) -> None:
    print("| handler | variant | Create median (p90), ms | Start median (p90), ms | n |")
    print("|---|---|---|---|---|")
    for handler in handlers:
        for name, create_ms, start_ms in await bench_handler(handler, tasks):
            print(f"| {handler} | {name} | {statistics.median(create_ms):.1f} ({p90(create_ms):.1f}) "
                  f"| {statistics.median(start_ms):.1f} ({p90(start_ms):.1f}) | {len(start_ms)} |")
    ms, instructions = compile_cost_ms()
    print(f"\nCompiling the RuntimeDefault profile with libseccomp (uncached): {ms:.2f} ms median, "
          f"{instructions} BPF instructions.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20, help="tasks per handler and variant (default 20)")
    parser.add_argument("--handlers", default="native,runc,crun", help="comma-separated (default native,runc,crun)")
    args = parser.parse_args()
    asyncio.run(main_async(args.tasks, args.handlers.split(",")))


if __name__ == "__main__":
    main()
