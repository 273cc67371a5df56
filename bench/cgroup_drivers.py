"""The cgroupfs and the systemd cgroup driver side by side, through crictl, in one interleaved run.

    python bench/cgroup_drivers.py [--runs 10]
    python -m tests.support.guest run -- python3 bench/cgroup_drivers.py   (on a host that is not pure v2)

As root, on pure cgroup v2 under systemd (the guest of tests/support/guest.py). Two podshimds in one
throwaway network namespace (bench/cri_images.py), each its own bridge: one with
``cgroup_driver = "cgroupfs"``, one with ``cgroup_driver = "systemd"``, the tests' busybox pulled
into each from the tests' registry there. Per run, for each daemon in turn (the order alternating):
the crictl pod cycle (``runp`` → ``stopp`` → ``rmp``), then in a pod of its own a container with CPU
and memory limits (``create`` + ``start``), then its removal. Prints a Markdown table of medians.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time

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
    from support.critools import cri_tool
    from support.imagebuild import TestImages
    from support.registry import running_registry

    crictl = cri_tool("crictl")
    janitor = Janitor()
    janitor.install()
    drivers: list[Driver] = []
    try:
        workdir = janitor.workdir("cgdrv-")
        with running_registry() as registry:
            ref = TestImages(registry, os.path.join(workdir, "images")).busybox.ref
            registries = f'[registries."{registry.host}"]\ninsecure = true\n'
            directories = []
            for n in range(len(DRIVERS)):
                directory = tempfile.mkdtemp(prefix=f"psd{n}-", dir="/tmp")
                janitor.add("remove podshimd's directory", subprocess.run, ["rm", "-rf", directory])
                cni_conflist(directory, f"bench-cg{n}", f"10.23{5 + n}.0.0/16")
                directories.append(directory)
            with bench_podshimd(directories[0], crictl, janitor.failures,
                                config=f'cgroup_driver = "cgroupfs"\n{registries}') as cgroupfs, \
                    bench_podshimd(directories[1], crictl, janitor.failures,
                                   config=f'cgroup_driver = "systemd"\n{registries}') as systemd:
                for driver, daemon in zip(DRIVERS, (cgroupfs, systemd), strict=True):
                    drivers.append(Driver(driver, crictl, daemon.endpoint, os.path.join(workdir, driver)))
                    drivers[-1].crictl("pull", ref)
                for driver in drivers:  # warm-up: the first pod starts the shim template, slow when emulated
                    for attempt in range(WARM_UP_ATTEMPTS):
                        try:
                            driver.one(ref, -attempt)
                            break
                        except RuntimeError as exc:
                            log(f"{driver.driver} warm-up {attempt + 1}: {exc}")
                            driver.crictl("rmp", "-fa")
                    driver.times = {step: [] for step in STEPS}
                load_before = os.getloadavg()
                for i in range(1, args.runs + 1):
                    for driver in (drivers if i % 2 else drivers[::-1]):
                        driver.one(ref, i)
                    log(f"run {i}/{args.runs}: " + "; ".join(
                        f"{d.driver} " + ", ".join(f"{d.times[s][-1] * 1000:.0f}" for s in STEPS) for d in drivers))
                load_after = os.getloadavg()
    finally:
        janitor.run()

    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    out = [f"cgroupfs vs systemd cgroup driver through crictl, {date}, {os.cpu_count()} CPUs, load average "
           f"{load_before[0]:.2f} before / {load_after[0]:.2f} after; `python3 bench/cgroup_drivers.py "
           f"--runs {args.runs}`", "", "| step | cgroupfs median | systemd median | systemd / cgroupfs |",
           "|---|---|---|---|"]
    for step in STEPS:
        medians = [statistics.median(d.times[step]) * 1000 for d in drivers]
        out.append(f"| {step} | {medians[0]:.0f} ms | {medians[1]:.0f} ms | {medians[1] / medians[0]:.2f}x |")
    out += ["", f"Medians of {args.runs} interleaved runs; each step is its crictl commands from exec to exit."]
    print("\n".join(out + janitor.problems()))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__)
    return netns_main(p, "cgdrv", inside, argv, runs_option(p, 10))


if __name__ == "__main__":
    sys.exit(main())
