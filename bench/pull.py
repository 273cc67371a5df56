"""Pull + unpack from a local registry: podshim beside containerd 1.6.

    python3 bench/pull.py [--mb 100] [--layers 8] [--rounds 3] [--no-containerd] [--no-podshimd]

Starts Debian's docker-registry on 127.0.0.1 (tests/registry.py) and pushes two images to it: the
tests' busybox (3 layers, about 1 MB compressed) and one of about ``--mb`` MB uncompressed in
``--layers`` gzip layers built from this machine's files (bench/unpack.py's image). Each round
pulls each image from scratch (nothing of it stored before) and unpacks it into overlay snapshots:

- podshim, in process: ``Images(state).pull(ref)`` (client/images: skopeo inspect + copy, every
  blob verified into the content store, layers unpacked by the snapshotter), a fresh state root;
- podshimd: ``crictl pull`` through a running podshimd (the same, plus gRPC and crictl's start),
  the image removed (``crictl rmi``: blobs and snapshots collected) after each round;
- containerd 1.6 (a private one, bench/compare's): ``ctr image pull --plain-http`` (fetch, verify,
  unpack into its overlayfs snapshotter), then ``ctr images rm --sync`` (its GC removes blobs and
  snapshots), a fresh namespace each round.

Rounds interleave the contenders. Prints the median seconds of each as a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(1, os.path.join(REPO, "tests"))

from bench.compare.run import Janitor, PrivateContainerd, log, run  # noqa: E402
from bench.unpack import build_image  # noqa: E402
from client.images.pull import RegistryHost  # noqa: E402
from client.images.service import Images  # noqa: E402
from critools import BIN_DIR, running_podshimd  # noqa: E402
from imagebuild import TestImages  # noqa: E402
from registry import running_registry  # noqa: E402


def push_big(workdir: str, registry_host: str, mb: int, layers: int) -> tuple[str, int, int]:
    """Build bench/unpack's image and push it; its reference, uncompressed and compressed size."""
    blobs, raw_bytes, layout = build_image(workdir, mb, layers, "gzip")
    ref = f"{registry_host}/bench/big:1"
    run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci-archive:{layout}:latest", f"docker://{ref}"],
        timeout=600)
    return ref, raw_bytes, sum(os.path.getsize(blob) for _, blob, _ in blobs)


def time_podshim(workdir: str, host: str, ref: str) -> float:
    state = tempfile.mkdtemp(prefix="pull-", dir=workdir)
    try:
        images = Images(state, hosts=[RegistryHost(host, insecure=True)]).open()
        start = time.perf_counter()
        asyncio.run(images.pull(ref))
        return time.perf_counter() - start
    finally:
        shutil.rmtree(state)


def time_podshimd(crictl: list[str], ref: str) -> float:
    start = time.perf_counter()
    run([*crictl, "pull", ref], timeout=600)
    took = time.perf_counter() - start
    run([*crictl, "rmi", ref], timeout=600)
    return took


def time_containerd(cd: PrivateContainerd, ref: str, round_no: int) -> float:
    ns = f"pull-bench-{round_no}"
    start = time.perf_counter()
    run(["ctr", "-a", cd.sock, "-n", ns, "images", "pull", "--plain-http", ref], timeout=600)
    took = time.perf_counter() - start
    run(["ctr", "-a", cd.sock, "-n", ns, "images", "rm", "--sync", ref], timeout=600)
    return took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=int, default=100, help="uncompressed size of the big image in MB (100)")
    p.add_argument("--layers", type=int, default=8, help="layers of the big image (8)")
    p.add_argument("--rounds", type=int, default=3, help="rounds; the median is printed (3)")
    p.add_argument("--no-containerd", action="store_true")
    p.add_argument("--no-podshimd", action="store_true", help="no crictl pull through podshimd")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("run as root: layers hold files of every owner and trusted xattrs", file=sys.stderr)
        return 2
    janitor = Janitor()
    janitor.install()
    try:
        workdir = tempfile.mkdtemp(prefix="pullb-", dir="/var/tmp")
        janitor.add("remove the work directory", shutil.rmtree, workdir, True)
        with running_registry() as registry:
            log("building and pushing the images")
            small = TestImages(registry, os.path.join(workdir, "small")).busybox.ref
            os.makedirs(os.path.join(workdir, "big"))
            big, raw_bytes, big_bytes = push_big(os.path.join(workdir, "big"), registry.host, args.mb, args.layers)
            refs = {"busybox (3 layers, ~1 MB)": small, f"{raw_bytes / 1e6:.0f} MB in {args.layers} layers "
                    f"({big_bytes / 1e6:.0f} MB gzip)": big}
            contenders = {"podshim (client/images, in process)": lambda ref, r: time_podshim(workdir, registry.host, ref)}
            with_daemon = None
            if not args.no_podshimd:
                directory = tempfile.mkdtemp(prefix="psd-pb-")
                janitor.add("remove podshimd's directory", shutil.rmtree, directory, True)
                with_daemon = running_podshimd(directory, config=f'[registries."{registry.host}"]\ninsecure = true\n')
                daemon = with_daemon.__enter__()
                janitor.add("stop podshimd", with_daemon.__exit__, None, None, None)
                crictl = [os.path.join(BIN_DIR, "crictl"), "--image-endpoint", daemon.endpoint, "--timeout", "600s"]
                contenders["podshimd (crictl pull, then rmi)"] = lambda ref, r: time_podshimd(crictl, ref)
            if not args.no_containerd:
                cd_dir = os.path.join(workdir, "containerd")
                os.makedirs(cd_dir)
                cd = PrivateContainerd(cd_dir, janitor)
                version = cd.start()
                contenders[f"containerd {version} (ctr image pull --plain-http)"] = \
                    lambda ref, r: time_containerd(cd, ref, r)
            times = {(image, name): [] for image in refs for name in contenders}
            for r in range(args.rounds):
                for image, ref in refs.items():
                    for name, fn in contenders.items():
                        times[(image, name)].append(fn(ref, r))
                        log(f"round {r + 1}: {image}: {name}: {times[(image, name)][-1]:.3f} s")
        print(f"\npull + unpack from a local registry (127.0.0.1, plain HTTP); median of {args.rounds} rounds\n")
        print("| image | puller | seconds |\n|---|---|---|")
        for (image, name), values in times.items():
            print(f"| {image} | {name} | {statistics.median(values):.3f} |")
    except subprocess.SubprocessError as exc:
        log(f"failed: {exc}")
        return 1
    finally:
        janitor.run()
    return 1 if janitor.failures else 0


if __name__ == "__main__":
    sys.exit(main())
