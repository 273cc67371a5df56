"""Density: N live sandboxes (default 500) forked from a shim template, each with its own netns
and a running pause. Prints the time to start them all, the memory they take (PSS of shims,
pauses and the template, from /proc/PID/smaps_rollup), per-shim PSS at 1, 20, 100 and N live
sandboxes, and how long a fresh Controller takes to reconnect to all of them. Tears everything
down at the end.

    python3 bench/density.py [--sandboxes 500] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import anyio

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from shim.api.names import TEMPLATE_SERVICE
from shim.api.paths import control_socket_path
from shim.rpc import blocking

from client.controller import Controller

from bench.common import template_memory

NAMESPACE = "density"


def pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def start_template(runtime_root: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "shim", "template", "--runtime-root", runtime_root],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path = control_socket_path(runtime_root)
    deadline = time.monotonic() + 20
    while True:
        try:
            blocking.call("unix://" + path, TEMPLATE_SERVICE, "Ping", timeout=1)
            return proc
        except Exception:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the template did not start") from None
            time.sleep(0.02)


async def main(n: int, concurrency: int) -> None:
    state_root = tempfile.mkdtemp(prefix="podshim-density-")
    runtime_root = f"/tmp/podshim-density-rt-{secrets.token_hex(3)}"
    os.makedirs(runtime_root, mode=0o700)
    template = start_template(runtime_root)
    ids = [f"d{i:04d}-{secrets.token_hex(3)}" for i in range(n)]
    shims: dict[str, tuple[int, int]] = {}  # sandbox id -> (shim pid, pause pid)
    per_shim: dict[int, float] = {}
    try:
        async with Controller(state_root, runtime_root) as c:
            limiter = anyio.Semaphore(concurrency)

            async def up(sid: str) -> None:
                async with limiter:
                    await c.create(NAMESPACE, sid)
                    instance = await c.start(NAMESPACE, sid)
                    status = await c.status(NAMESPACE, sid, verbose=True)
                    shims[sid] = (int(status.info["shim_pid"]), instance.pid)

            elapsed = 0.0  # creating and starting only: not the settling and measuring between
            checkpoints = sorted({k for k in (1, 20, 100, n) if k <= n})
            done = 0
            for k in checkpoints:
                began = time.monotonic()
                async with anyio.create_task_group() as tg:
                    for sid in ids[done:k]:
                        tg.start_soon(up, sid)
                elapsed += time.monotonic() - began
                done = k
                await anyio.sleep(0.5)  # let the new shims settle to idle
                per_shim[k] = statistics.mean(pss_kib(p) for p, _ in shims.values()) / 1024
            shim_pss = sum(pss_kib(p) for p, _ in shims.values()) / 1024
            pause_pss = sum(pss_kib(p) for _, p in shims.values()) / 1024
            template_pss = template_memory(template.pid, runtime_root).pss / 1024

        t = time.monotonic()
        async with Controller(state_root, runtime_root) as c:
            reconnect = time.monotonic() - t
            live = len(await c.list(NAMESPACE))
            print(f"### Density: {n} live sandboxes forked from a template (2 CPUs, load {os.getloadavg()[0]:.1f})\n")
            print("| figure | value |\n|---|---:|")
            print(f"| time to create and start all {n} (concurrency {concurrency}) | {elapsed:.1f} s "
                  f"({elapsed / n * 1e3:.0f} ms each) |")
            print(f"| PSS of all shims | {shim_pss:.0f} MiB |")
            print(f"| PSS of all pauses | {pause_pss:.1f} MiB |")
            print(f"| PSS of the template (with its spare shim) | {template_pss:.1f} MiB |")
            print(f"| total PSS | {shim_pss + pause_pss + template_pss:.0f} MiB |")
            for k, v in per_shim.items():
                print(f"| shim PSS per sandbox with {k} live | {v:.2f} MiB |")
            print(f"| a fresh Controller reconnects to all {live} | {reconnect * 1e3:.0f} ms |")
            async with anyio.create_task_group() as tg:
                limiter = anyio.Semaphore(concurrency)

                async def down(sid: str) -> None:
                    async with limiter:
                        await c.shutdown(NAMESPACE, sid)

                for sid in shims:
                    tg.start_soon(down, sid)
    finally:
        template.send_signal(signal.SIGTERM)
        template.wait(10)
        for sid in ids:  # whatever a failure left: podshim delete by the book
            bundle = os.path.join(state_root, NAMESPACE, sid)
            if os.path.isdir(bundle):
                subprocess.run([sys.executable, "-m", "shim", "delete", "--namespace", NAMESPACE, "--id", sid,
                                "--bundle", bundle, "--runtime-root", runtime_root], capture_output=True)
        shutil.rmtree(state_root, ignore_errors=True)
        shutil.rmtree(runtime_root, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sandboxes", type=int, default=500)
    ap.add_argument("--concurrency", type=int, default=8)
    a = ap.parse_args()
    anyio.run(main, a.sandboxes, a.concurrency, backend_options={"use_uvloop": True})
