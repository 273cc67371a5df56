"""The default Controller cycle and the floor + a sandbox cgroup, interleaved: a quick check of a
change to the cycle, without containerd.

    python bench/compare/batches.py [--cycles 20] [--warmup 3]

As root, with the interpreter podshim is installed in; it measures the code of the checkout it
is in. To compare two versions side by side on a busy machine, run it from both checkouts in
turn, a few times each, and compare each run's cycle with its own floor + cgroup (README,
Benchmarks). Prints the medians (ms) of the cycle, its phases and the floor + cgroup cycle.
Everything it makes (a runtime root and its template, the bundles, the floor's cgroups) is
removed at the end, also when it fails.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from shim.launch.template import stop_template

from bench.common import compile_bytecode, not_root
from bench.compare.run import FloorCgroup, Janitor, Podshim, delete_leftover_sandboxes, timed_spawner


async def measure(cycles: int, warmup: int) -> str:
    from client.controller import Controller

    work = tempfile.mkdtemp(prefix="podshim-batches-")
    state_root, runtime_root = os.path.join(work, "state"), os.path.join(work, "run")
    floor = FloorCgroup()
    # Every step runs, last in first out, whatever an earlier one raised, at the end or on a signal.
    janitor = Janitor()
    janitor.add("remove the floor's parent cgroup", floor.release)
    janitor.add("remove the work directory", shutil.rmtree, work, True)
    janitor.add("podshim delete leftovers", delete_leftover_sandboxes, state_root, runtime_root)
    janitor.add("stop the shim template", stop_template, runtime_root)
    janitor.install()
    try:
        async with Controller(state_root, runtime_root, spawner=timed_spawner(runtime_root, True)) as c:
            pod = Podshim("default", "default Controller", c, True)
            for _ in range(warmup):
                await pod.cycle()
                await floor.cycle()
            pod.samples.clear()
            floor.samples.clear()
            load = os.getloadavg()[0]
            for _ in range(cycles):
                pod.samples.append(await pod.cycle())
                floor.samples.append(await floor.cycle())
    finally:
        janitor.run()

    def med(values: list[float]) -> str:
        return f"{statistics.median(values) * 1000:.1f}"

    phases = ", ".join(f"{name} {med([s.parts[name] for s in pod.samples])}" for name in pod.samples[0].parts)
    total = statistics.median(s.total for s in pod.samples)
    floor_total = statistics.median(s.total for s in floor.samples)
    return (f"{REPO}: load {load:.1f}, {cycles} cycles: default Controller {med([s.total for s in pod.samples])} "
            f"({phases}, stop {med([s.stop for s in pod.samples])}, shutdown {med([s.remove for s in pod.samples])}); "
            f"floor + cgroup {med([s.total for s in floor.samples])}; ratio {total / floor_total:.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cycles", type=int, default=20, help="cycles of each (20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed cycles of each first (3)")
    args = p.parse_args(argv)
    if args.cycles < 1 or args.warmup < 1:
        p.error("--cycles and --warmup must be positive (the first cycle starts the template)")
    if not_root("the shims make namespaces and cgroups"):
        return 2
    compile_bytecode(REPO)
    from shim.rpc.channel import install_uvloop

    install_uvloop()
    print(asyncio.run(measure(args.cycles, args.warmup)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
