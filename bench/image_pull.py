"""Image pull + unpack from one local registry: podshimd beside containerd 1.6 (``ctr image pull``
and crictl pull against its CRI plugin), interleaved, medians.

    python bench/image_pull.py [--runs 7] [--big-mb 100] [--big-layers 20] [--podshimd-config TEXT]

As root. Everything runs in a throwaway network namespace (bench/cri_images.py): the tests' local
registry (docker-registry on 127.0.0.1, plain HTTP), a private containerd with its CRI plugin, and
podshimd. Two images, built here (tests/support/imagebuild.py) and pushed once:

- small: the tests' busybox image (three layers, about 1 MB gzipped);
- big: busybox plus --big-layers layers of random bytes (incompressible: gzip keeps them at their
  size), --big-mb MB in all.

A run pulls each image once with each contender, the contenders' order rotated every run; after
every pull the image is removed again (``ctr image rm --sync``, ``crictl rmi``: containerd then
collects its content and snapshots at once; for podshimd, which collects after answering, the
bench waits until its blob store is empty), so every pull downloads, verifies and unpacks
everything. Timed: the pull command from exec to exit (crictl pull returns once the image is
unpacked: containerd's CRI pulls with unpack; so does podshimd's). podshimd's config.toml marks the
registry insecure (plain HTTP), plus the text of --podshimd-config; if its PullImage fails, its row
reads "TODO" with what it said.
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.common import bench_podshimd, percentile
from bench.cri_images import (
    Janitor,
    bench_parser,
    log,
    netns_main,
    podshimd_directory,
    run,
    runs_option,
    start_containerd,
)

if TYPE_CHECKING:
    from support.registry import Registry

PULL_TIMEOUT = 600.0


def big_layers(total_mb: int, count: int, seed: int = 1) -> list[dict[str, bytes]]:
    """``count`` layers of random bytes, ``total_mb`` MB in all: each a few files of one layer's share."""
    rng = random.Random(seed)
    per_layer = total_mb * 1024 * 1024 // count
    layers = []
    for number in range(count):
        files = {f"bench/layer-{number:02d}/part-{part}": rng.randbytes(per_layer // 4) for part in range(4)}
        layers.append(files)
    return layers


class Contender:
    def __init__(self, key: str, crictl: str, endpoint: str = "", containerd_sock: str = ""):
        self.key = key
        self.crictl_path = crictl
        self.endpoint = endpoint
        self.containerd_sock = containerd_sock
        self.times: dict[str, list[float]] = {}
        self.todo = ""
        self.blobs_dir = ""  # podshimd's: its garbage collection runs after RemoveImage returns

    def pull(self, ref: str) -> float:
        argv = self.pull_argv(ref)
        t0 = time.perf_counter()
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=PULL_TIMEOUT)
        took = time.perf_counter() - t0
        if done.returncode != 0:
            raise RuntimeError(f"{self.key}: {' '.join(argv[-3:])} exited {done.returncode}: {done.stderr.strip()[-800:]}")
        return took

    def pull_argv(self, ref: str) -> list[str]:
        if self.containerd_sock:
            return ["ctr", "-a", self.containerd_sock, "-n", "bench-pull", "image", "pull", "--plain-http", ref]
        return [self.crictl_path, "--image-endpoint", self.endpoint, "--timeout", f"{PULL_TIMEOUT:.0f}s", "pull", ref]

    def remove(self, ref: str) -> None:
        if self.containerd_sock:
            run(["ctr", "-a", self.containerd_sock, "-n", "bench-pull", "image", "rm", "--sync", ref], timeout=120)
        else:
            run([self.crictl_path, "--image-endpoint", self.endpoint, "--timeout", "120s", "rmi", ref], timeout=180)
        if self.blobs_dir:  # so that the next pull's time has none of this collection in it
            deadline = time.monotonic() + 60
            while os.path.isdir(self.blobs_dir) and os.listdir(self.blobs_dir):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.key}: blobs left in {self.blobs_dir} a minute after rmi")
                time.sleep(0.01)


def podshimd_pulls(crictl: str, endpoint: str, ref: str) -> str:
    """"" if podshimd pulls ``ref``, else why not (what crictl said)."""
    done = subprocess.run([crictl, "--image-endpoint", endpoint, "--timeout", "120s", "pull", ref],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)
    if done.returncode == 0:
        run([crictl, "--image-endpoint", endpoint, "--timeout", "120s", "rmi", ref], timeout=180)
        return ""
    return done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit status {done.returncode}"


def inside(args: argparse.Namespace) -> int:
    from support.critools import cri_tool, gotool
    from support.imagebuild import TestImages
    from support.registry import running_registry

    crictl = cri_tool("crictl")
    janitor = Janitor()
    janitor.install()
    notes: list[str] = []
    try:
        workdir = janitor.workdir("imgpull-")
        with running_registry() as registry:
            images = TestImages(registry, os.path.join(workdir, "images"))
            log(f"building the big image ({args.big_mb} MB in {args.big_layers} random layers)")
            big = images.build("bench-big", big_layers(args.big_mb, args.big_layers), tag="1.0")
            refs = {"small": images.busybox.ref, "big": big.ref}
            sizes = {name: sum(int(layer["size"]) for layer in _manifest(registry, ref)["layers"])
                     for name, ref in refs.items()}
            endpoint = f"http://{registry.host}"
            containerd, version = start_containerd(workdir, janitor, {registry.host: endpoint})
            notes.append(f"containerd {version} (Debian), overlayfs snapshotter; "
                         f"crictl {gotool.tool_pin('crictl')['version']}")
            contenders = [Contender("containerd: ctr image pull --plain-http", crictl,
                                    containerd_sock=containerd.sock),
                          Contender("containerd: crictl pull (CRI)", crictl, endpoint="unix://" + containerd.sock)]
            directory = podshimd_directory(janitor)
            config = f'[registries."{registry.host}"]\ninsecure = true\n' + args.podshimd_config
            with bench_podshimd(directory, crictl, janitor.failures, config=config) as daemon:
                podshimd = Contender("podshimd: crictl pull (CRI)", crictl, endpoint=daemon.endpoint)
                podshimd.blobs_dir = os.path.join(daemon.state_root, "images", "content", "blobs", "sha256")
                podshimd.todo = podshimd_pulls(crictl, daemon.endpoint, refs["small"])
                if not podshimd.todo:
                    contenders.insert(0, podshimd)
                for contender in contenders:  # warm-up: page caches, the daemons' first pull
                    for ref in refs.values():
                        contender.pull(ref)
                        contender.remove(ref)
                load_before = os.getloadavg()
                for i in range(args.runs):
                    order = contenders[i % len(contenders):] + contenders[:i % len(contenders)]
                    for name, ref in refs.items():
                        for contender in order:
                            contender.times.setdefault(name, []).append(contender.pull(ref))
                            contender.remove(ref)
                    log(f"run {i + 1}/{args.runs}: " + "; ".join(
                        f"{c.key} " + ", ".join(f"{n} {c.times[n][-1] * 1000:.0f} ms" for n in refs)
                        for c in contenders))
                load_after = os.getloadavg()
            containerd.stop()
    finally:
        janitor.run()

    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    out = [f"Image pull + unpack, {date}, {os.cpu_count()} CPUs, load average {load_before[0]:.2f} before / "
           f"{load_after[0]:.2f} after; `python3 bench/image_pull.py --runs {args.runs} --big-mb {args.big_mb} "
           f"--big-layers {args.big_layers}`", "",
           f"| contender | small ({sizes['small'] / 1e6:.1f} MB, 3 layers) median | p90 | "
           f"big ({sizes['big'] / 1e6:.0f} MB, {args.big_layers + 3} layers) median | p90 |",
           "|---|---|---|---|---|"]
    if podshimd.todo:
        out.append("| podshimd: crictl pull (CRI) | TODO | | TODO | |")
        notes.append(f"podshimd: not measured, its PullImage said: {podshimd.todo}")
    for contender in contenders:
        cells = []
        for name in ("small", "big"):
            times = contender.times[name]
            cells += [f"{statistics.median(times) * 1000:.0f} ms", f"{percentile(times, 90) * 1000:.0f} ms"]
        out.append(f"| {contender.key} | " + " | ".join(cells) + " |")
    out += ["", f"Medians of {args.runs} interleaved runs; every pull downloads, verifies and unpacks the "
            "whole image (removed after each pull)."] + notes
    print("\n".join(out + janitor.problems()))
    return 0


def _manifest(registry: Registry, ref: str) -> dict[str, Any]:
    import json
    repo, tag = ref.split("/", 1)[1].rsplit(":", 1)
    status, _, body = registry.get(f"/v2/{repo}/manifests/{tag}", {
        "Accept": "application/vnd.oci.image.manifest.v1+json"})
    if status != 200:
        raise RuntimeError(f"the registry has no manifest for {ref} ({status})")
    manifest: dict[str, Any] = json.loads(body)
    return manifest


def big_image_options(p: argparse.ArgumentParser, runs: int) -> Callable[[argparse.Namespace], None]:
    """Add --runs (default ``runs``), --big-mb and --big-layers to ``p``; the check that they are
    positive (for netns_main)."""
    p.add_argument("--big-mb", type=int, default=100, help="size of the big image's random layers in MB (100)")
    p.add_argument("--big-layers", type=int, default=20, help="how many random layers (20)")
    return runs_option(p, runs, "big_mb", "big_layers")


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__)
    check = big_image_options(p, 7)
    p.add_argument("--podshimd-config", default="", help="more of podshimd's config.toml")
    return netns_main(p, "imgpull", inside, argv, check)


if __name__ == "__main__":
    sys.exit(main())
