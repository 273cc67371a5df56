"""The cgroupfs and the systemd cgroup driver side by side, through crictl, in one interleaved run; the
host's row beside the guest's.

    python bench/cgroup_drivers.py [--runs 10]

As root. On pure cgroup v2 under systemd (the guest of tests/support/guest.py): two podshimds in one
throwaway network namespace (bench/cri_images.py), each its own bridge: one with
``cgroup_driver = "cgroupfs"``, one with ``cgroup_driver = "systemd"``, the tests' busybox pulled
into each from the tests' registry there. Per run, for each daemon in turn (the order alternating):
the crictl pod cycle (``runp`` → ``stopp`` → ``rmp``), then in a pod of its own a container with CPU
and memory limits (``create`` + ``start``), then its removal. On a host that is not pure v2 (ours:
hybrid), the same run of its one driver there (cgroupfs), then the whole run in the guest, booted
for it: one Markdown table of medians, the host's column beside the guest's two.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.common import bench_podshimd
from bench.cri_images import Janitor, TimedCrictl, bench_parser, cni_conflist, log, netns_main, runs_option

STEPS = ("pod cycle (runp, stopp, rmp)", "container create + start, with limits", "container stop + rm, pod removed")
DRIVERS = ("cgroupfs", "systemd")
WARM_UP_ATTEMPTS = 3
#: What kubelet sends for a container with cpu 250m and 96 MiB as limits.
RESOURCES = {"cpu_period": 100000, "cpu_quota": 25000, "cpu_shares": 256, "memory_limit_in_bytes": 96 << 20}


class Driver(TimedCrictl):
    """One podshimd (one cgroup driver), timed through crictl."""

    def __init__(self, driver: str, crictl: str, endpoint: str, workdir: str):
        super().__init__(crictl, endpoint, STEPS, timeout=120, command_timeout=300)
        self.driver = driver
        self.workdir = workdir
        os.makedirs(os.path.join(workdir, "logs"), exist_ok=True)

    def pod_file(self, i: int) -> str:
        """A pod config; under systemd in a slice named as kubelet names a burstable pod's."""
        uid = secrets.token_hex(8)
        linux = {"cgroup_parent": f"kubepods-burstable-pod{uid}.slice"} if self.driver == "systemd" else {}
        path = os.path.join(self.workdir, f"pod-{i}.json")
        with open(path, "w") as f:
            json.dump({"metadata": {"name": f"bench-{i}", "namespace": "default", "uid": uid},
                       "log_directory": os.path.join(self.workdir, "logs"), "linux": linux}, f)
        return path

    def one(self, ref: str, i: int) -> None:
        pod_path = self.pod_file(i)
        start = time.perf_counter()
        pod = self.crictl("runp", pod_path)
        self.crictl("stopp", pod)
        self.crictl("rmp", pod)
        self.times[STEPS[0]].append(time.perf_counter() - start)
        pod_path = self.pod_file(i)
        pod = self.crictl("runp", pod_path)
        ctr_path = os.path.join(self.workdir, f"ctr-{i}.json")
        with open(ctr_path, "w") as f:
            json.dump({"metadata": {"name": f"c{i}"}, "image": {"image": ref}, "command": ["sleep", "3600"],
                       "log_path": f"c{i}.log", "linux": {"resources": RESOURCES}}, f)
        start = time.perf_counter()
        cid = self.crictl("create", pod, ctr_path, pod_path)
        self.crictl("start", cid)
        self.times[STEPS[1]].append(time.perf_counter() - start)
        self.timed(STEPS[2], ["stop", "-t", "0", cid], ["rm", cid], ["stopp", pod], ["rmp", pod])


def inside(args: argparse.Namespace) -> int:
    from shim.kernel.cgroups.hierarchies import discover_hierarchies, pure_v2

    from support.critools import cri_tool
    from support.imagebuild import TestImages
    from support.registry import running_registry

    names = DRIVERS if pure_v2(discover_hierarchies()) else DRIVERS[:1]  # systemd's needs pure v2
    crictl = cri_tool("crictl")
    janitor = Janitor()
    janitor.install()
    drivers: list[Driver] = []
    try:
        workdir = janitor.workdir("cgdrv-")
        with running_registry() as registry, contextlib.ExitStack() as daemons:
            ref = TestImages(registry, os.path.join(workdir, "images")).busybox.ref
            registries = f'[registries."{registry.host}"]\ninsecure = true\n'
            for n, driver in enumerate(names):
                directory = tempfile.mkdtemp(prefix=f"psd{n}-", dir="/tmp")
                janitor.add("remove podshimd's directory", subprocess.run, ["rm", "-rf", directory])
                cni_conflist(directory, f"bench-cg{n}", f"10.23{5 + n}.0.0/16")
                daemon = daemons.enter_context(bench_podshimd(directory, crictl, janitor.failures,
                                                              config=f'cgroup_driver = "{driver}"\n{registries}'))
                drivers.append(Driver(driver, crictl, daemon.endpoint, os.path.join(workdir, driver)))
                drivers[-1].crictl("pull", ref)
            for each in drivers:  # warm-up: the first pod starts the shim template, slow when emulated
                for attempt in range(WARM_UP_ATTEMPTS):
                    try:
                        each.one(ref, -attempt)
                        break
                    except RuntimeError as exc:
                        log(f"{each.driver} warm-up {attempt + 1}: {exc}")
                        each.crictl("rmp", "-fa")
                each.times = {step: [] for step in STEPS}
            load_before = os.getloadavg()
            for i in range(1, args.runs + 1):
                for each in (drivers if i % 2 else drivers[::-1]):
                    each.one(ref, i)
                log(f"run {i}/{args.runs}: " + "; ".join(
                    f"{d.driver} " + ", ".join(f"{d.times[s][-1] * 1000:.0f}" for s in STEPS) for d in drivers))
            load_after = os.getloadavg()
    finally:
        janitor.run()
    figures = {"cpus": os.cpu_count(), "load": [round(load_before[0], 2), round(load_after[0], 2)],
               "medians": {d.driver: {step: statistics.median(d.times[step]) * 1000 for step in STEPS}
                           for d in drivers},
               "problems": janitor.problems()}
    with open(args.figures, "w") as f:
        json.dump(figures, f)
    return 0


def in_guest(runs: int) -> dict[str, Any]:
    """The figures of this bench run in the guest (booted for it, powered off after)."""
    from support import guest

    with guest.booted() as vm:
        out = "/tmp/cgroup-drivers.json"
        done = vm.run([f"{guest.GUEST_VENV}/bin/python", "bench/cgroup_drivers.py", "--runs", str(runs),
                       "--figures", out], cwd=guest.GUEST_SRC, env={"PODSHIM_TEST_SLOWDOWN": guest.SLOWDOWN},
                      timeout=7200)
        if done.returncode != 0:
            raise RuntimeError(f"the guest's run failed ({done.returncode}): {done.stderr.decode(errors='replace')[-3000:]}")
        figures: dict[str, Any] = json.loads(vm.run(["cat", out]).stdout)
        return figures


def table(columns: list[tuple[str, dict[str, Any]]], runs: int) -> str:
    """The Markdown table of the medians: one column per (heading, figures, driver)."""
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    out = [f"cgroup drivers through crictl, {date}, medians of {runs} interleaved runs; "
           f"`python3 bench/cgroup_drivers.py --runs {runs}`", ""]
    for heading, figures in columns:
        out.append(f"- {heading}: {figures['cpus']} CPUs, load average {figures['load'][0]:.2f} before / "
                   f"{figures['load'][1]:.2f} after" + "".join(f"; {line}" for line in figures["problems"]))
    cells = [(heading, driver, figures["medians"][driver]) for heading, figures in columns
             for driver in figures["medians"]]
    out += ["", "| step | " + " | ".join(f"{heading}, {driver}" for heading, driver, _ in cells) + " |",
            "|---|" + "---|" * len(cells)]
    for step in STEPS:
        out.append(f"| {step} | " + " | ".join(f"{medians[step]:.0f} ms" for _, _, medians in cells) + " |")
    out += ["", "Each step is its crictl commands from exec to exit; the guest is emulated (TCG): compare its "
            "columns with each other, not with the host's."]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    from shim.kernel.cgroups.hierarchies import discover_hierarchies, pure_v2

    p = bench_parser(__doc__)
    check = runs_option(p, 10)
    p.add_argument("--figures", help="write the figures of this host's run as JSON there, and print no table")
    argv = sys.argv[1:] if argv is None else argv
    args, _ = p.parse_known_args(argv)
    if args.figures:
        return netns_main(p, "cgdrv", inside, argv, check)
    with tempfile.TemporaryDirectory(prefix="cgdrv-figures-") as scratch:
        figures = os.path.join(scratch, "host.json")
        status = netns_main(p, "cgdrv", inside, [*argv, "--figures", figures], check)
        if status != 0:
            return status
        with open(figures) as f:
            host = json.load(f)
    if pure_v2(discover_hierarchies()):
        print(table([("this host (pure cgroup v2)", host)], args.runs))
    else:
        print(table([("host (hybrid)", host), ("guest (pure cgroup v2, emulated)", in_guest(args.runs))], args.runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
