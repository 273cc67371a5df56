"""Containers from a pulled image, through crictl: podshimd beside containerd 1.6's CRI plugin,
interleaved, medians. What a container costs once its image is on the node:

- ``crictl create`` (the image's snapshot, the task) and ``crictl start``, each timed, with each
  runtime's default confinement (capabilities, masked paths, seccomp RuntimeDefault);
- ``crictl exec -s CID true`` (ExecSync) and ``crictl exec CID true`` (the streaming server);
- stop + remove: ``crictl stop -t 0`` then ``crictl rm``.

    python bench/image_containers.py [--runs 15]

As root. Everything runs in a throwaway network namespace (bench/cri_images.py): the tests' local
registry with their busybox image, a private containerd with its CRI plugin, and podshimd; one pod
in each (bridge CNI), the image pulled once into each before the runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.common import bench_podshimd
from bench.cri_images import (
    Janitor,
    TimedCrictl,
    bench_parser,
    log,
    netns_main,
    podshimd_directory,
    runs_option,
    start_containerd,
)

STEPS = ("create", "start", "exec -s true", "exec true", "stop + rm")


class Runtime(TimedCrictl):
    """One CRI endpoint with a pod, timed through crictl."""

    def __init__(self, key: str, crictl: str, endpoint: str, workdir: str):
        super().__init__(crictl, endpoint, STEPS, timeout=60, command_timeout=120)
        self.key = key
        self.workdir = workdir
        self.pod = ""
        self.pod_path = os.path.join(workdir, "pod.json")

    def setup(self, ref: str) -> None:
        os.makedirs(os.path.join(self.workdir, "logs"), exist_ok=True)
        with open(self.pod_path, "w") as f:
            json.dump({"metadata": {"name": f"bench-{self.key.split(':')[0]}", "namespace": "default",
                                    "uid": f"u-{os.urandom(4).hex()}"},
                       "log_directory": os.path.join(self.workdir, "logs"), "linux": {}}, f)
        self.crictl("pull", ref)
        self.pod = self.crictl("runp", self.pod_path)

    def one(self, ref: str, i: int) -> None:
        ctr_path = os.path.join(self.workdir, f"ctr-{i}.json")
        with open(ctr_path, "w") as f:
            json.dump({"metadata": {"name": f"c{i}"}, "image": {"image": ref}, "command": ["sleep", "3600"],
                       "log_path": f"c{i}.log"}, f)
        cid = self.timed("create", ["create", self.pod, ctr_path, self.pod_path])
        self.timed("start", ["start", cid])
        self.timed("exec -s true", ["exec", "-s", cid, "true"])
        self.timed("exec true", ["exec", cid, "true"])
        self.timed("stop + rm", ["stop", "-t", "0", cid], ["rm", cid])


def inside(args: argparse.Namespace) -> int:
    from support.critools import cri_tool, gotool
    from support.imagebuild import TestImages
    from support.registry import running_registry

    crictl = cri_tool("crictl")
    janitor = Janitor()
    janitor.install()
    notes: list[str] = []
    runtimes: list[Runtime] = []
    try:
        workdir = janitor.workdir("imgctr-")
        with running_registry() as registry:
            ref = TestImages(registry, os.path.join(workdir, "images")).busybox.ref
            containerd, version = start_containerd(workdir, janitor, {registry.host: f"http://{registry.host}"})
            notes.append(f"containerd {version} (Debian) with runc; podshimd with its default (native) handler; "
                         f"crictl {gotool.tool_pin('crictl')['version']}")
            directory = podshimd_directory(janitor)
            with bench_podshimd(directory, crictl, janitor.failures,
                                config=f'[registries."{registry.host}"]\ninsecure = true\n') as daemon:
                for key, endpoint in (("podshimd", daemon.endpoint), ("containerd", "unix://" + containerd.sock)):
                    runtime = Runtime(key, crictl, endpoint, os.path.join(workdir, key))
                    runtimes.append(runtime)
                    runtime.setup(ref)
                for runtime in runtimes:  # warm-up
                    runtime.one(ref, 0)
                    runtime.times = {step: [] for step in STEPS}
                load_before = os.getloadavg()
                for i in range(1, args.runs + 1):
                    order = runtimes if i % 2 else runtimes[::-1]
                    for runtime in order:
                        runtime.one(ref, i)
                    log(f"run {i}/{args.runs}: " + "; ".join(
                        f"{r.key} " + ", ".join(f"{s} {r.times[s][-1] * 1000:.0f}" for s in STEPS) for r in runtimes))
                load_after = os.getloadavg()
            containerd.stop()  # its pods first (CriContainerd.stop), as bench_podshimd removed podshimd's
    finally:
        janitor.run()

    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    out = [f"Containers from a pulled image through crictl, {date}, {os.cpu_count()} CPUs, load average "
           f"{load_before[0]:.2f} before / {load_after[0]:.2f} after; `python3 bench/image_containers.py "
           f"--runs {args.runs}`", "", "| step | " + " | ".join(f"{r.key} median" for r in runtimes) + " | ratio |",
           "|---|" + "---|" * (len(runtimes) + 1)]
    for step in STEPS:
        medians = [statistics.median(r.times[step]) * 1000 for r in runtimes]
        out.append(f"| {step} | " + " | ".join(f"{m:.1f} ms" for m in medians) +
                   f" | {medians[1] / medians[0]:.2f}x |")
    out += ["", f"Medians of {args.runs} interleaved runs (ratio: containerd / podshimd); each step is its "
            "crictl commands from exec to exit."] + notes
    print("\n".join(out + janitor.problems()))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__)
    return netns_main(p, "imgctr", inside, argv, runs_option(p, 15))


if __name__ == "__main__":
    sys.exit(main())
