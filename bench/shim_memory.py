"""An idle shim's memory: N sandboxes created and started through a Controller, their shims forked
from a template of a private runtime root, then the memory of each idle shim from
/proc/PID/smaps_rollup and /proc/PID/smaps: PSS, and the pages it holds alone (Private_Dirty: what
it wrote of what it shares with the template, and what it allocated), with where those are (the
interpreter's heap arenas, the malloc heap, libpython's data). ``--before DIR`` measures another
checkout the same way, in turn with this one in every round; medians over the rounds.

    python3 bench/shim_memory.py [--sandboxes 10] [--rounds 3] [--before DIR]

PSS also splits the pages of shared libraries between every process of the machine that maps them,
so it moves with what else runs; Private_Dirty does not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Run in the checkout measured (its own shim and client), with the checkout and the sandbox count.
_MEASURE = r'''
import json, os, secrets, shutil, signal, subprocess, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
import anyio
from client.controller import Controller
from shim.api.names import TEMPLATE_SERVICE
from shim.api.paths import control_socket_path
from shim.rpc import blocking

def rollup(pid):
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Pss", "Private_Dirty"):
                out[key] = int(rest.split()[0])
    return out

def private_by_mapping(pid):
    out, name = {}, None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):
                name = os.path.basename(fields[5]) if len(fields) > 5 else "[anon]"
                name = "libpython" if name.startswith("libpython") else name
            elif fields[0] == "Private_Dirty:":
                out[name] = out.get(name, 0) + int(fields[1])
    return out

async def main(n):
    state_root = tempfile.mkdtemp(prefix="podshim-shimmem-")
    runtime_root = f"/tmp/podshim-shimmem-rt-{secrets.token_hex(3)}"
    os.makedirs(runtime_root, mode=0o700)
    template = subprocess.Popen([sys.executable, "-m", "shim", "template", "--runtime-root", runtime_root],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ids = [f"m{i:03d}-{secrets.token_hex(2)}" for i in range(n)]
    made = []
    try:
        address = "unix://" + control_socket_path(runtime_root)
        deadline = time.monotonic() + 20
        while True:
            try:
                blocking.call(address, TEMPLATE_SERVICE, "Ping", timeout=1)
                break
            except Exception:
                if template.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the template did not start")
                time.sleep(0.05)
        async with Controller(state_root, runtime_root) as c:
            pids = []
            for sid in ids:
                made.append(sid)
                await c.create("mem", sid)
                await c.start("mem", sid)
                pids.append(int((await c.status("mem", sid, verbose=True)).info["shim_pid"]))
            await anyio.sleep(1.0)
            shims = [rollup(p) for p in pids]
            where = [private_by_mapping(p) for p in pids]
            spares = blocking.call(address, TEMPLATE_SERVICE, "Ping", timeout=2)["spare_pids"]
            fixed = sum(rollup(p)["Pss"] for p in {template.pid, *spares} if p)
            kinds = ("[anon]", "[heap]", "libpython")
            print(json.dumps({"pss": sum(s["Pss"] for s in shims) / n,
                              "private": sum(s["Private_Dirty"] for s in shims) / n,
                              **{k: sum(w.get(k, 0) for w in where) / n for k in kinds},
                              "template": fixed}))
    finally:
        try:
            async with Controller(state_root, runtime_root) as c:
                for sid in made:
                    try:
                        await c.shutdown("mem", sid)
                    except Exception as exc:
                        print("cannot shut down", sid, exc, file=sys.stderr)
        finally:
            template.send_signal(signal.SIGTERM)
            template.wait(10)
            shutil.rmtree(state_root, ignore_errors=True)
            shutil.rmtree(runtime_root, ignore_errors=True)

anyio.run(main, int(sys.argv[2]), backend_options={"use_uvloop": True})
'''


def measure(checkout: str, sandboxes: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", _MEASURE, checkout, str(sandboxes)], cwd=checkout,
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"measuring {checkout} failed:\n{out.stderr[-2000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sandboxes", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", help="another checkout, measured in turn with this one")
    a = ap.parse_args()
    checkouts = {"this checkout": REPO, **({"--before": os.path.abspath(a.before)} if a.before else {})}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in checkouts}
    for _ in range(a.rounds):
        for name, path in checkouts.items():
            runs[name].append(measure(path, a.sandboxes))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{a.sandboxes} idle sandboxes, medians of {a.rounds} rounds, load {load} (at the end)\n")
    print("| checkout | shim PSS | shim Private_Dirty | of it: heap arenas | malloc heap | libpython | "
          "template + spare PSS |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, results in runs.items():
        def med(key: str, results: list[dict[str, float]] = results) -> str:
            return f"{statistics.median(r[key] for r in results) / 1024:.2f} MiB"
        print(f"| {name} | {med('pss')} | {med('private')} | {med('[anon]')} | {med('[heap]')} | {med('libpython')} | "
              f"{med('template')} |")


if __name__ == "__main__":
    main()
