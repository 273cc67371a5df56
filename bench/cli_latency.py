"""How fast podshim's commands answer: ``podshim start`` (the exec path), podshimctl's read-only
verbs, and (``--systemd``) a shim started by systemd until it is ready.

    python bench/cli_latency.py [--rounds 20] [--pods 3] [--before DIR] [--systemd]

As root, with the interpreter podshim is installed in. Every figure is the wall clock from the
command's exec to its exit, as a shell would see it; rows are interleaved round robin (the order
rotated every round), so the machine's other load weighs on all alike; medians and p90. Beside
it, the CPU time the command used (user + system, of the command and, for ``podshim start``, of
the shim it forked until it served): what the command costs whatever else runs on the machine.

- ``podshim start --no-template``: until it printed the address of a shim that serves (the shim
  is stopped afterwards, untimed). Run three ways: the installed command (the ``podshim`` beside
  this interpreter: the launcher that starts Python without site), the command line the Controller
  runs (``python -I -S`` with an explicit path), and ``python -m shim`` (Python with site, as a
  console script starts; with ``--before DIR``, the code of DIR that way: an older checkout).
  With ``--before DIR`` the first two rows are also run with the code of DIR, interleaved with
  this checkout's: a before/after comparison in one run, on the same machine load.
- podshimctl's pod verbs (a CRI client of podshimd): ``pods`` and ``ps -a`` against a podshimd with
  no pods, ``pods`` and ``inspectp`` against one with ``--pods`` live pods (made with runp before the
  rounds, removed after them); both daemons run for the whole bench (tests/support/critools.py starts
  them, so this needs the test extras); the real ``crictl pods`` against the same daemons when
  tests/support/critools.py has built cri-tools. ``sandbox list`` (the Controller, no daemon) over an empty
  state root. With ``--before DIR`` each verb's installed command also runs the code of DIR.
- Floors: ``python -I -S -c pass`` and ``python -c pass`` (site's start-up hooks included).
- ``--systemd``: a systemd booted in systemd-nspawn (tests/support/nspawn.py) with the project installed in
  a venv there and the units of systemd/: ``systemctl start podshim@NS:ID.service`` (Type=notify:
  it returns once the shim sent READY=1), beside ``systemctl start`` of a Type=exec unit running
  ``sleep`` (systemd's own cost of starting a unit). Each shim is stopped again, untimed.

Prints markdown tables with the load average before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from shim.launch.template import stop_template
from shim.lib.program import podshim_argv

if TYPE_CHECKING:
    from support.critools import Podshimd

from bench.common import code_of, compile_bytecode, not_root, percentile, wait_pidfd

TIMEOUT = 30.0
NAMESPACE = "bench"


def timed(argv: list[str], env: dict[str, str] | None = None, cwd: str = "/") -> tuple[float, float, str]:
    """Seconds from exec to exit, CPU seconds it used, and stdout; RuntimeError (with stderr)
    unless it exits 0."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=TIMEOUT)
    took = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)[:160]} exited {done.returncode}: {done.stderr.strip()[-800:]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return took, cpu, done.stdout


class Row:
    """One command measured once per round; ``after`` cleans up after each run (untimed)."""

    def __init__(self, section: str, label: str, argv: list[str], env: dict[str, str] | None = None,
                 after: Callable[[str], float] | None = None, fresh: Callable[[], list[str]] | None = None):
        self.section, self.label, self.argv, self.env = section, label, argv, env
        self.after = after  # called with the command's stdout; the CPU seconds it adds (a shim's)
        self.fresh = fresh  # called before each run: extra arguments for this run
        self.samples: list[float] = []
        self.cpu: list[float] = []

    def run(self) -> None:
        extra = self.fresh() if self.fresh else []
        took, cpu, out = timed([*self.argv, *extra], self.env)
        self.samples.append(took)
        self.cpu.append(cpu + (self.after(out) if self.after else 0.0))


def stop_shim(out: str) -> float:
    """After `podshim start`: the CPU seconds the shim it printed used so far (it only waits from
    when it serves), then SIGTERM it and wait for its exit (a shim with no sandbox owns nothing
    else; it removes its socket)."""
    pid = json.loads(out.strip().splitlines()[-1])["pid"]
    fd = os.pidfd_open(pid)
    with open(f"/proc/{pid}/schedstat") as f:
        cpu = int(f.read().split()[0]) / 1e9  # ns on a CPU since it was forked
    try:
        signal.pidfd_send_signal(fd, signal.SIGTERM)
        if not wait_pidfd(fd, TIMEOUT):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
            raise RuntimeError(f"shim {pid} outlived SIGTERM by {TIMEOUT} s")
    finally:
        os.close(fd)
    return cpu


def start_rows(workdir: str, before: str | None) -> list[Row]:
    runtime_root = os.path.join(workdir, "run")
    counter = iter(range(1_000_000))

    def fresh() -> list[str]:
        n = next(counter)
        bundle = os.path.join(workdir, "bundles", str(n))
        return ["--namespace", NAMESPACE, "--id", f"b{n}", "--bundle", bundle, "--runtime-root", runtime_root,
                "--no-template"]

    site_env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [before or REPO,
                                                                         os.environ.get("PYTHONPATH")]))}
    installed = os.path.join(os.path.dirname(sys.executable), "podshim")
    rows = [Row("start", f"`podshim start`, the installed command ({describe(installed)})", [installed, "start"],
                env=code_env(REPO), after=stop_shim, fresh=fresh),
            Row("start", "`podshim start` as the Controller runs it: `python -I -S -c …` with an explicit path",
                [*podshim_argv(), "start"], after=stop_shim, fresh=fresh),
            Row("start", "`python -m shim start` (site's start-up hooks, as a console script runs)"
                + (f", code of {before}" if before else ""),
                [sys.executable, "-m", "shim", "start"], env=site_env, after=stop_shim, fresh=fresh)]
    if before:  # the same two ways with the older code, side by side
        rows[2:2] = [Row("start", f"`podshim start`, the installed command, code of {before}", [installed, "start"],
                         env=code_env(before), after=stop_shim, fresh=fresh),
                     Row("start", f"`podshim start` as the Controller runs it, code of {before}",
                         [*code_of(podshim_argv(), before, REPO), "start"], after=stop_shim, fresh=fresh)]
    return rows


def code_env(tree: str) -> dict[str, str]:
    """The environment that makes an installed command (the launcher: no -I, no site) run the
    code of checkout ``tree``: it is first on PYTHONPATH, before the installed package."""
    return {**os.environ, "PYTHONPATH": tree}


def describe(command: str) -> str:
    try:
        with open(command, "rb") as f:
            first = f.readline()
    except OSError:
        return "missing"
    return "the launcher, no site" if first.startswith(b"#!/bin/sh") else "a console script, with site"


def ctl_rows(empty: Podshimd, busy: Podshimd, sandboxes: str, before: str | None, pods: int) -> list[Row]:
    """The podshimctl rows: pod verbs against the podshimd daemons ``empty`` (no pods) and ``busy``
    (``pods`` pods, made here), ``sandbox list`` over the empty state root ``sandboxes``; and the
    real crictl beside them when the pinned one is built (tests/support/critools.py builds it)."""
    from support.critools import gotool

    installed = os.path.join(os.path.dirname(sys.executable), "podshimctl")
    site_env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [before or REPO,
                                                                         os.environ.get("PYTHONPATH")]))}
    config = os.path.join(busy.directory, "pod.json")
    with open(os.path.join(REPO, "examples", "pod-config.json")) as f:
        cfg = json.load(f)
    cfg["linux"]["cgroup_parent"] = ""
    made = []
    for n in range(pods):
        cfg["metadata"]["name"], cfg["metadata"]["uid"] = f"bench-{n}", f"uid-{n}"
        with open(config, "w") as f:
            json.dump(cfg, f)
        made.append(timed([installed, "--runtime-root", busy.runtime_root, "runp", config])[2].strip())
    verbs = [("pods, no pods", ["--runtime-root", empty.runtime_root, "pods"]),
             ("ps -a, no pods", ["--runtime-root", empty.runtime_root, "ps", "-a"]),
             ("sandbox list, no sandboxes", ["--root", sandboxes, "--runtime-root", sandboxes, "sandbox", "list"])]
    if made:
        verbs += [(f"pods, {pods} pods", ["--runtime-root", busy.runtime_root, "pods"]),
                  (f"inspectp, one of {pods} pods", ["--runtime-root", busy.runtime_root, "inspectp", made[0]])]
    rows = []
    for label, argv in verbs:
        rows.append(Row("ctl", f"`podshimctl {label}`: installed command ({describe(installed)})", [installed, *argv],
                        env=code_env(REPO)))
        if before:
            rows.append(Row("ctl", f"`podshimctl {label}`: installed command, code of {before}", [installed, *argv],
                            env=code_env(before)))
        rows.append(Row("ctl", f"`podshimctl {label}`: `python -m client.cli` (site"
                        + (f", code of {before})" if before else ")"),
                        [sys.executable, "-m", "client.cli", *argv], env=site_env))
    pin = gotool.tool_pin("crictl")
    crictl = gotool.tool_file("crictl", pin)
    if os.access(crictl, os.X_OK):
        for label, daemon in [("no pods", empty)] + ([(f"{pods} pods", busy)] if made else []):
            rows.append(Row("ctl", f"`crictl pods`, {label} (cri-tools {pin['version']}, Go; same podshimd)",
                            [crictl, "--runtime-endpoint", daemon.endpoint, "--image-endpoint", daemon.endpoint,
                             "pods"]))
    return rows


def floor_rows() -> list[Row]:
    return [Row("floor", "`python -I -S -c pass`", [sys.executable, "-I", "-S", "-c", "pass"]),
            Row("floor", "`python -c pass` (site's start-up hooks)", [sys.executable, "-c", "pass"])]


def measure(rows: list[Row], rounds: int) -> None:
    for row in rows:  # warm-up: bytecode caches, the page cache
        row.run()
        row.samples.clear()
        row.cpu.clear()
    for n in range(rounds):
        shift = n % len(rows)
        for row in rows[shift:] + rows[:shift]:
            row.run()


def table(rows: list[Row], title: str) -> list[str]:
    out = [f"#### {title}", "", "| command | median ms | p90 ms | min ms | CPU ms (median) |", "|---|---:|---:|---:|---:|"]
    for row in rows:
        cpu = f"{statistics.median(row.cpu) * 1e3:.1f}" if row.cpu else "—"
        out.append(f"| {row.label} | {statistics.median(row.samples) * 1e3:.1f} | "
                   f"{percentile(row.samples, 90) * 1e3:.1f} | {min(row.samples) * 1e3:.1f} | {cpu} |")
    return out + [""]


# -- systemd ---------------------------------------------------------------------------------------
SYSTEMD_SCRIPT = """
import json, statistics, subprocess, sys, time
rounds = int(sys.argv[1])
def systemctl(*args):
    done = subprocess.run(["systemctl", "--no-ask-password", *args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"systemctl {' '.join(args)}: {done.stderr}")
samples = {"shim": [], "floor": []}
for n in range(rounds + 1):
    for kind in (("shim", "floor") if n % 2 else ("floor", "shim")):
        unit = f"podshim@bench:s{n}.service" if kind == "shim" else "podshim-bench-floor.service"
        t0 = time.perf_counter()
        systemctl("start", unit)
        took = time.perf_counter() - t0
        systemctl("stop", unit)
        if n:  # the first round warms caches up
            samples[kind].append(took)
print(json.dumps(samples))
"""

FLOOR_UNIT = """[Unit]
Description=podshim bench: systemd's own cost of starting a unit
[Service]
Type=exec
ExecStart=/bin/sleep 600
"""


def systemd_rows(rounds: int) -> tuple[list[Row], str]:
    from support.nspawn import CONTAINER_PATH, Machine, command_links, nspawn_unavailable, project_venv

    reason = nspawn_unavailable()
    if reason is not None:
        return [], f"systemd rows skipped: {reason}"
    with project_venv(REPO) as venv, command_links(venv) as links, \
            Machine.booted(binds_ro=[venv, f"{links}:/usr/local/bin"]) as m:
        m.install_units(os.path.join(REPO, "systemd"))
        m.write_file("/run/systemd/system/podshim-bench-floor.service", FLOOR_UNIT)
        m.write_file("/run/podshim/systemd.env", f'PATH="{venv}/bin:{CONTAINER_PATH}"\n')
        m.systemctl("daemon-reload")
        out = m.run(f"{venv}/bin/python", "-I", "-c", textwrap.dedent(SYSTEMD_SCRIPT), str(rounds),
                    timeout=60 + rounds * 10).stdout
    samples = json.loads(out)
    rows = [Row("systemd", "`systemctl start podshim@NS:ID.service` until READY=1 (the installed launcher)", []),
            Row("systemd", "`systemctl start` of a Type=exec unit running sleep (systemd's own cost)", [])]
    rows[0].samples, rows[1].samples = samples["shim"], samples["floor"]
    return rows, "systemd 252 in systemd-nspawn (tests/support/nspawn.py), the project pip-installed in a venv of /usr/bin/python3"


def remove_pods(daemon: Podshimd) -> None:
    """``podshimctl rmp`` every pod of ``daemon`` (untimed cleanup)."""
    installed = os.path.join(os.path.dirname(sys.executable), "podshimctl")
    ids = timed([installed, "--runtime-root", daemon.runtime_root, "pods", "-q"])[2].split()
    if ids:
        timed([installed, "--runtime-root", daemon.runtime_root, "rmp", *ids])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=20, help="interleaved rounds (20)")
    p.add_argument("--pods", type=int, default=3, help="live pods for the pods/inspectp rows (3; 0: none)")
    p.add_argument("--before", metavar="DIR", help="a checkout whose code the `python -m` rows run (site)")
    p.add_argument("--systemd", action="store_true", help="also time systemctl start in systemd-nspawn")
    args = p.parse_args(argv)
    if not_root("shims make namespaces and cgroups"):
        return 2
    for tree in filter(None, (REPO, args.before)):
        compile_bytecode(tree)
    workdir = tempfile.mkdtemp(prefix="podshim-cli-")
    load = [os.getloadavg()[0]]
    notes = []
    try:
        with contextlib.ExitStack() as stack:
            from support.critools import running_podshimd

            daemons = []
            for name in ("empty", "busy"):
                os.makedirs(os.path.join(workdir, name))
                daemons.append(stack.enter_context(running_podshimd(os.path.join(workdir, name))))
            # Pods go before their daemon stops (the stack unwinds the other way).
            stack.callback(remove_pods, daemons[1])
            rows = start_rows(workdir, args.before)
            empty, busy = daemons
            rows += ctl_rows(empty, busy, os.path.join(workdir, "sandboxes"), args.before, args.pods)
            rows += floor_rows()
            t0 = time.perf_counter()
            measure(rows, args.rounds)
            took = time.perf_counter() - t0
            load.append(os.getloadavg()[0])
        if args.systemd:
            load_systemd = os.getloadavg()[0]
            extra, note = systemd_rows(args.rounds)
            rows += extra
            notes.append(note + f" (load average {load_systemd:.2f} before, {os.getloadavg()[0]:.2f} after)")
    finally:
        for root in (os.path.join(workdir, "run"), os.path.join(workdir, "sandboxes")):
            stop_template(root)
        shutil.rmtree(workdir, ignore_errors=True)
    out = [f"### podshim's commands ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
           f"{args.rounds} interleaved rounds ({took:.0f} s), {os.cpu_count()} CPUs, load average {load[0]:.2f} "
           f"before, {load[1]:.2f} after; Python {sys.version.split()[0]} ({sys.executable}).", ""]
    for section, title in (("start", "`podshim start` (exec path): until it printed a serving shim's address"),
                           ("ctl", "podshimctl"), ("floor", "Python's own start"), ("systemd", "systemd")):
        chosen = [r for r in rows if r.section == section]
        if chosen:
            out += table(chosen, title)
    out += [f"Notes: {n}" for n in notes]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
