"""How fast skopeo copies an image out of a local registry into each kind of local destination the
puller could use, beside a plain parallel HTTP fetch of the same blobs: why client/images/pull.py
copies into an OCI layout.

    python3 bench/skopeo_copy.py [--runs 5] [--big-mb 100] [--big-layers 20]

As root, in a throwaway network namespace (bench/cri_images.py) with the tests' local registry
(docker-registry on 127.0.0.1, plain HTTP) and image_pull.py's big image (busybox plus
--big-layers layers of random bytes). Per run, interleaved, each from exec to exit:

- ``skopeo copy docker://REF dir:D`` (containers/image writes a dir: one blob at a time);
- ``skopeo copy docker://REF oci:D:image`` (an OCI layout: blobs side by side);
- the layers and config fetched with Python's http.client, 6 threads, each hashed and written:
  the floor of the download itself, without skopeo's process, TLS/auth machinery or fsyncs.

Prints medians and the arrival time of the first and last blob in each destination.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.cri_images import bench_parser, log, netns_main
from bench.image_pull import big_image_options, big_layers

POLL = 0.002  # seconds between looks at a destination for new blobs


def watch(directory: str, stop: threading.Event, seen: dict[str, float]) -> None:
    """Record when each blob (a file named by 64 hex digits) appears under ``directory``."""
    while not stop.is_set():
        for _dirpath, _, names in os.walk(directory):
            for name in names:
                if len(name) == 64 and name not in seen:
                    seen[name] = time.perf_counter()
        time.sleep(POLL)


def skopeo_copy(argv: list[str], dest: str, watched: str) -> tuple[float, float, float]:
    """(seconds, first blob at, last blob at) of one skopeo copy."""
    seen: dict[str, float] = {}
    stop = threading.Event()
    thread = threading.Thread(target=watch, args=(watched, stop, seen))
    thread.start()
    t0 = time.perf_counter()
    try:
        subprocess.run(argv + [dest], check=True, capture_output=True, timeout=600)
    finally:
        took = time.perf_counter() - t0
        stop.set()
        thread.join()
    times = sorted(t - t0 for t in seen.values())
    return took, times[0] if times else 0.0, times[-1] if times else 0.0


def http_fetch(host: str, repo: str, manifest: dict[str, Any], directory: str) -> tuple[float, float, float]:
    """(seconds, first blob done, last blob done) of fetching every blob with 6 threads."""
    address, port = host.split(":")

    def get(desc: dict[str, Any]) -> float:
        connection = http.client.HTTPConnection(address, int(port), timeout=60)
        try:
            connection.request("GET", f"/v2/{repo}/blobs/{desc['digest']}")
            response = connection.getresponse()
            if response.status != 200:
                raise RuntimeError(f"GET blob {desc['digest']}: {response.status}")
            hasher = hashlib.sha256()
            with open(os.path.join(directory, desc["digest"][7:]), "wb") as f:
                while chunk := response.read(1 << 20):
                    hasher.update(chunk)
                    f.write(chunk)
            if "sha256:" + hasher.hexdigest() != desc["digest"]:
                raise RuntimeError(f"blob {desc['digest']} has another digest")
        finally:
            connection.close()
        return time.perf_counter()

    os.makedirs(directory)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(6) as pool:
        done = sorted(t - t0 for t in pool.map(get, [*manifest["layers"], manifest["config"]]))
    return time.perf_counter() - t0, done[0], done[-1]


def inside(args: argparse.Namespace) -> int:
    from support.imagebuild import TestImages
    from support.registry import running_registry

    workdir = tempfile.mkdtemp(prefix="skcopy-")
    results: dict[str, list[tuple[float, float, float]]] = {}
    try:
        with running_registry() as registry:
            images = TestImages(registry, os.path.join(workdir, "images"))
            log(f"building the big image ({args.big_mb} MB in {args.big_layers} random layers)")
            big = images.build("bench-big", big_layers(args.big_mb, args.big_layers), tag="1.0")
            status, _, body = registry.get(f"/v2/{big.repo}/manifests/{big.tag}",
                                           {"Accept": "application/vnd.oci.image.manifest.v1+json"})
            if status != 200:
                raise RuntimeError(f"the registry has no manifest for {big.ref} ({status})")
            manifest = json.loads(body)
            conf = os.path.join(workdir, "registries.conf")
            with open(conf, "w") as f:
                f.write(f'[[registry]]\nlocation = "{registry.host}"\ninsecure = true\n')
            policy = os.path.join(workdir, "policy.json")
            with open(policy, "w") as f:
                json.dump({"default": [{"type": "insecureAcceptAnything"}]}, f)
            skopeo = ["skopeo", "--registries-conf", conf, "--policy", policy, "copy", "--quiet",
                      f"docker://{big.ref}"]
            contenders = {
                "skopeo copy to dir:": lambda d: skopeo_copy(skopeo, f"dir:{d}", d),
                "skopeo copy to oci: (layout)": lambda d: skopeo_copy(skopeo, f"oci:{d}:image", d),
                "Python http.client, 6 threads, sha256": lambda d: http_fetch(registry.host, big.repo, manifest, d),
            }
            for run in range(args.runs + 1):  # the first is a warm-up
                names = list(contenders)
                names = names[run % len(names):] + names[:run % len(names)]
                for name in names:
                    target = os.path.join(workdir, "dest")
                    took = contenders[name](target)
                    shutil.rmtree(target)
                    if run:
                        results.setdefault(name, []).append(took)
                log(f"run {run}: " + "; ".join(f"{n} {results[n][-1][0] * 1000:.0f} ms" for n in results) if run
                    else "warm-up done")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    size = sum(layer["size"] for layer in manifest["layers"])
    print(f"Copying a {size / 1e6:.0f} MB image of {len(manifest['layers'])} layers from a local registry, {date}, "
          f"load average {os.getloadavg()[0]:.2f}; medians of {args.runs} interleaved runs\n")
    print("| destination | total | first blob | last blob |\n|---|---:|---:|---:|")
    for name, runs in results.items():
        medians = [statistics.median(r[i] for r in runs) * 1000 for i in range(3)]
        print(f"| {name} | {medians[0]:.0f} ms | {medians[1]:.0f} ms | {medians[2]:.0f} ms |")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__)
    return netns_main(p, "skcopy", inside, argv, big_image_options(p, 5))


if __name__ == "__main__":
    sys.exit(main())
