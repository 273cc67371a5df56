"""A sandbox's whole life through ``podshim``, the idle cost of shims, and the kernel's floor.

    python3 bench/shim_cycle.py [--cycles 50] [--idle 1,20] [--floor 50] [--before DIR]

Cycle: ``podshim start --no-template`` (plain exec spawning, a subprocess; until it printed the
address and a client connected), CreateSandbox, StartSandbox (a new netns), StopSandbox
(SIGTERM), ShutdownSandbox (until the shim process has exited); p50/p99 of each phase and of the
whole, one cycle at a time. Two commands run it: "bare", the command line the Controller execs
(``python -I -S`` with an explicit search path: no site-packages start-up hooks), and "site",
``python -m shim`` with site, as a console script would start it (every .pth hook included).
With ``--before DIR``, "before" is the Controller's command line with the code of checkout DIR,
its cycles interleaved with the others' (a before/after comparison on the same machine load).
Idle memory: N shims of each command with running sandboxes, all alive at once; RSS and PSS from
/proc/PID/smaps_rollup, per shim and per pause.
Floor: ``unshare --fork --pid --net --ipc --uts --mount --mount-proc catatonit -P`` until
catatonit handles SIGTERM, then SIGTERM, then wait: the kernel's work without a shim.
Cycles of both commands and floor runs are interleaved, so other load weighs on all alike.
Prints markdown tables. Run as root; everything it starts is ended (``podshim delete`` for any
shim that did not end cleanly).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from shim.api.names import SANDBOX_SERVICE
from shim.rpc import Client

from bench.common import Memory, code_of, floor_cycle, memory, percentile, wait_pidfd
from bench.compare.run import PythonCommand, podshim_commands

PHASES = ("spawn", "create", "start", "stop", "shutdown")
NAMESPACE = "bench"
TIMEOUT = 10.0


class ShimRun:
    """One shim of this benchmark, in its own bundle and runtime root under ``workdir``."""

    def __init__(self, command: PythonCommand, workdir: str, number: int):
        self.command = command
        self.sandbox_id = f"bench-{os.getpid()}-{number}"
        self.bundle = os.path.join(workdir, str(number), "bundle")
        self.runtime_root = os.path.join(workdir, str(number), "run")
        self.client: Client | None = None
        self.pid = 0
        self.pidfd = -1

    def _run(self, action: str, *extra: str) -> subprocess.CompletedProcess[str]:
        argv = [*self.command.argv, action, "--namespace", NAMESPACE, "--id", self.sandbox_id, "--bundle",
                self.bundle, "--runtime-root", self.runtime_root, *extra]
        return subprocess.run(argv, env=self.command.env, capture_output=True, text=True, check=True,
                              timeout=TIMEOUT)

    async def spawn(self) -> None:
        # --no-template: plain exec spawning, whatever runs on this machine.
        bootstrap = json.loads((await asyncio.to_thread(self._run, "start", "--no-template")).stdout)
        self.pid = bootstrap["pid"]
        self.pidfd = os.pidfd_open(self.pid)
        self.client = await Client.connect(bootstrap["address"], namespace=NAMESPACE)

    async def call(self, method: str, **fields: Any) -> Any:
        assert self.client is not None  # (spawned)
        return await self.client.call(SANDBOX_SERVICE, method, {"sandbox_id": self.sandbox_id, **fields},
                                      timeout=TIMEOUT)

    async def shutdown(self) -> None:
        await self.call("ShutdownSandbox")
        if not wait_pidfd(self.pidfd, TIMEOUT):  # nothing else runs meanwhile: a blocking wait is fine
            raise TimeoutError(f"shim {self.pid} did not exit within {TIMEOUT} s of ShutdownSandbox")

    async def aclose(self) -> None:
        """Release the connection and pidfd; `podshim delete` if the shim did not end cleanly."""
        if self.client is not None:
            await self.client.aclose()
        if self.pidfd >= 0:
            ended = wait_pidfd(self.pidfd, 0)
            os.close(self.pidfd)
            self.pidfd = -1
            if not ended:
                await asyncio.to_thread(self._run, "delete")


async def cycle(command: PythonCommand, workdir: str, number: int) -> dict[str, float]:
    """One sandbox's life; the seconds each phase took."""
    run = ShimRun(command, workdir, number)
    took: dict[str, float] = {}
    try:
        steps = (("spawn", run.spawn), ("create", lambda: run.call("CreateSandbox")),
                 ("start", lambda: run.call("StartSandbox")), ("stop", lambda: run.call("StopSandbox")),
                 ("shutdown", run.shutdown))
        for phase, step in steps:
            t0 = time.perf_counter()
            await step()
            took[phase] = time.perf_counter() - t0
    finally:
        await run.aclose()
    return took


async def idle_memory(command: PythonCommand, workdir: str, count: int, first_number: int
                      ) -> list[tuple[Memory, Memory]]:
    """(shim, pause) memory of each of ``count`` idle shims, all alive at once."""
    runs = [ShimRun(command, workdir, first_number + i) for i in range(count)]
    try:
        pauses = []
        for run in runs:
            await run.spawn()
            await run.call("CreateSandbox")
            pauses.append((await run.call("StartSandbox"))["pid"])
        # Idle: every shim has served its calls and sits in its event loop.
        return [(memory(run.pid), memory(pause)) for run, pause in zip(runs, pauses, strict=False)]
    finally:
        for run in runs:
            with contextlib.suppress(Exception):
                await run.shutdown()
            await run.aclose()


def print_cycle_table(cycles: dict[str, list[dict[str, float]]], floor: list[tuple[float, float]]) -> None:
    def cells(seconds: list[float]) -> str:
        return f"{percentile(seconds, 50) * 1000:.1f} | {percentile(seconds, 99) * 1000:.1f}"

    kinds = list(cycles)
    print(f"\n### Sandbox cycle: {len(cycles[kinds[0]])} cycles of each command, one at a time (ms)\n")
    print("| phase | " + " | ".join(f"{kind} p50 | {kind} p99" for kind in kinds) + " |")
    print("|---|" + "---|---|" * len(kinds))
    for phase in PHASES:
        print(f"| {phase} | " + " | ".join(cells([c[phase] for c in cycles[kind]]) for kind in kinds) + " |")
    print("| **cycle** | " + " | ".join(cells([sum(c.values()) for c in cycles[kind]]) for kind in kinds) + " |")
    print(f"\n### Floor: unshare + catatonit, {len(floor)} runs (ms)\n")
    print("| step | p50 | p99 |")
    print("|---|---|---|")
    for name, seconds in (("start until catatonit handles SIGTERM", [start for start, _ in floor]),
                          ("SIGTERM until unshare exited", [stop for _, stop in floor]),
                          ("**floor**", [start + stop for start, stop in floor])):
        print(f"| {name} | {cells(seconds)} |")


def print_memory_table(samples: dict[tuple[str, int], list[tuple[Memory, Memory]]]) -> None:
    def mib(values: list[int]) -> str:
        return f"{statistics.fmean(values) / 1024:.2f} [{max(values) / 1024:.2f}]"

    print("\n### Idle memory per shim, sandbox running (MiB; mean over the shims alive, max in brackets)\n")
    print("| command | shims alive | shim RSS | shim PSS | pause RSS | pause PSS | shim + pause PSS |")
    print("|---|---|---|---|---|---|---|")
    for (kind, count), rows in samples.items():
        shims, pauses = [shim for shim, _ in rows], [pause for _, pause in rows]
        print(f"| {kind} | {count} | {mib([m.rss for m in shims])} | {mib([m.pss for m in shims])} | "
              f"{mib([m.rss for m in pauses])} | {mib([m.pss for m in pauses])} | "
              f"{mib([s.pss + p.pss for s, p in rows])} |")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=50, help="cycles of each command")
    parser.add_argument("--idle", default="1,20", help="comma-separated numbers of idle shims to measure")
    parser.add_argument("--floor", type=int, default=50, help="runs of the unshare + catatonit floor")
    parser.add_argument("--before", metavar="DIR", help="also run the Controller's command line with DIR's code")
    args = parser.parse_args()
    commands = podshim_commands()
    if args.before:
        commands["before"] = PythonCommand(code_of(commands["bare"].argv, os.path.abspath(args.before), REPO))
    workdir = tempfile.mkdtemp(prefix="psh-bench-")
    numbers = iter(range(1_000_000))
    try:
        for command in commands.values():
            await cycle(command, workdir, next(numbers))  # warm the page cache
        cycles: dict[str, list[dict[str, float]]] = {kind: [] for kind in commands}
        floor = []
        for n in range(max(args.cycles, args.floor)):
            if n < args.cycles:
                for kind, command in commands.items():
                    cycles[kind].append(await cycle(command, workdir, next(numbers)))
            if n < args.floor:
                floor.append(floor_cycle())
        samples = {}
        for count in (int(c) for c in args.idle.split(",")):
            for kind, command in commands.items():
                samples[kind, count] = await idle_memory(command, workdir, count, next(numbers))
                for _ in range(count - 1):
                    next(numbers)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"site: {' '.join(commands['site'].argv)} (PYTHONPATH: the repo); bare: the Controller's command line, "
          f"{' '.join(commands['bare'].argv[:4])} … (an explicit search path, no site)")
    print(f"Python {sys.version.split()[0]}; {os.cpu_count()} CPUs; kernel {os.uname().release}; "
          f"load average at the end {os.getloadavg()[0]:.1f}")
    print_cycle_table(cycles, floor)
    print_memory_table(samples)


if __name__ == "__main__":
    asyncio.run(main())
