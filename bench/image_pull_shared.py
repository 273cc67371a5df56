"""Pulling an image that shares most of its layers with one the node has (issue #17): this tree
against an earlier revision of podshim, interleaved, medians.

    python3 bench/image_pull_shared.py [--runs 7] [--base-mb 100] [--base-layers 20] [--top-mb 1] [--before REV]

As root (layers are unpacked with their owners). A local registry (the tests' docker-registry on
127.0.0.1, plain HTTP) gets two images built here (tests/support/imagebuild.py): ``base``, busybox plus
--base-layers layers of random bytes (--base-mb MB in all, incompressible), and ``top``, ``base``
plus one layer of --top-mb MB. Each contender (this tree, and with --before the code of that
revision, ``git archive REV``: 182ee9a is the one before issue #17's change) has its own image store
(client.images.service.Images) with ``base`` pulled once, untimed. A run, for each contender in
rotated order, starts a worker process with that contender's code first on PYTHONPATH, which pulls
``top`` (timed: Images.pull, download + verify + unpack + record) and removes it again (its
collection awaited, untimed), so every timed pull starts from a node that has ``base`` only.
Also counted: the blob GETs in the registry's access log per timed pull.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(state: str, base: str, top: str, host: str) -> None:
    """In a contender's process: pull ``base`` if its store lacks it, then time a pull of ``top``
    and remove it again; prints {"ms": ...}."""
    from client.images.service import Images
    from client.images.skopeo import RegistryHost

    async def main() -> float:
        images = Images(state, hosts=[RegistryHost(host, insecure=True)]).open()
        try:
            if images.status(base) is None:
                await images.pull(base)
            t0 = time.perf_counter()
            await images.pull(top)
            took = time.perf_counter() - t0
            await images.remove(top)
            return took
        finally:
            await images.aclose()
    print(json.dumps({"ms": asyncio.run(main()) * 1000}))


def random_layers(total_mb: int, count: int, seed: int) -> list[dict[str, bytes]]:
    rng = random.Random(seed)
    per_layer = max(1, total_mb * 1024 * 1024 // count)
    return [{f"bench/shared-{seed}-{n:02d}/data": rng.randbytes(per_layer)} for n in range(count)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--base-mb", type=int, default=100)
    p.add_argument("--base-layers", type=int, default=20)
    p.add_argument("--top-mb", type=int, default=1)
    p.add_argument("--before", default="", help="the revision to compare with (none: this tree only)")
    p.add_argument("--worker", nargs=4, metavar=("STATE", "BASE", "TOP", "HOST"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(*args.worker)
        return 0
    if os.geteuid() != 0:
        p.error("run as root: layers are unpacked with their owners")
    if min(args.runs, args.base_mb, args.base_layers, args.top_mb) < 1:
        p.error("--runs, --base-mb, --base-layers and --top-mb must be positive")
    sys.path.insert(0, REPO)
    from support.imagebuild import TestImages
    from support.registry import running_registry

    workdir = tempfile.mkdtemp(prefix="pullshared-")
    try:
        trees = {"this tree": REPO}
        if args.before:
            before = os.path.join(workdir, "before")
            os.mkdir(before)
            archive = subprocess.run(["git", "-C", REPO, "archive", args.before], check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", before], input=archive, check=True)
            trees = {f"before ({args.before})": before, **trees}
        with running_registry() as registry:
            images = TestImages(registry, os.path.join(workdir, "images"))
            base = images.build("shared-base", random_layers(args.base_mb, args.base_layers, 1))
            top = images.build("shared-top", random_layers(args.top_mb, 1, 2), base="shared-base")
            times: dict[str, list[float]] = {key: [] for key in trees}
            gets: dict[str, list[int]] = {key: [] for key in trees}

            def pull(key: str) -> float:
                env = {**os.environ, "PYTHONPATH": trees[key]}
                state = os.path.join(workdir, "state-" + str(list(trees).index(key)))
                done = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", state, base.ref, top.ref,
                                       registry.host], env=env, capture_output=True, text=True, timeout=600)
                if done.returncode != 0:
                    raise RuntimeError(f"{key}: the worker failed: {done.stderr[-2000:]}")
                return float(json.loads(done.stdout.strip().splitlines()[-1])["ms"])

            for key in trees:  # warm-up: base pulled, page caches
                pull(key)
            load_before = os.getloadavg()[0]
            keys = list(trees)
            for i in range(args.runs):
                for key in keys[i % len(keys):] + keys[:i % len(keys)]:
                    served = len(registry.blob_gets())
                    times[key].append(pull(key))
                    gets[key].append(len(registry.blob_gets()) - served)
                print(f"run {i + 1}/{args.runs}: " + "; ".join(f"{k} {times[k][-1]:.0f} ms ({gets[k][-1]} blob GETs)"
                                                            for k in keys), file=sys.stderr, flush=True)
            load_after = os.getloadavg()[0]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"Pulling `top` ({args.base_layers + 4} layers: busybox's 3, {args.base_layers} random ones of "
          f"{args.base_mb} MB in all, one of {args.top_mb} MB) onto a node that has `base` (all but the last), "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, load average "
          f"{load_before:.2f} before / {load_after:.2f} after, {args.runs} interleaved runs\n")
    print("| code | median | min | max | blob GETs per pull |\n|---|---|---|---|---|")
    for key in keys:
        print(f"| {key} | {statistics.median(times[key]):.0f} ms | {min(times[key]):.0f} ms | "
              f"{max(times[key]):.0f} ms | {statistics.median(gets[key]):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
