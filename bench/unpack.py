"""Unpacking a layered image: podshim's snapshotter beside containerd 1.6's overlayfs unpack.

    python3 bench/unpack.py [--mb 100] [--layers 8] [--compression gzip|zstd] [--rounds 3] [--no-containerd]

Builds an image of about ``--mb`` MB (uncompressed) in ``--layers`` layers from this machine's
own files (shared libraries, Python modules, documentation: a realistic mix of large and small
files), compressed as registries serve them (gzip -6 or zstd -3). Each round unpacks it from
scratch, with its blobs already on disk (the content store's part of a pull is not measured):

- podshim: ``Snapshotter(root).unpack(layers)`` (client/images/snapshots.py), layers side by side,
  and once more with one layer at a time;
- GNU tar: ``tar -x`` of each layer one after another, no whiteout conversion, no digest: the floor
  of decompressing and writing these files on this machine;
- containerd 1.6 (a private one, bench/compare's): ``ctr images import --no-unpack`` of the OCI
  layout first, then the timed ``ctr images import`` of the same image, which finds every blob
  present and unpacks it into overlayfs snapshots (diff_ids checked, as ours). A fresh namespace
  per round, so nothing is reused.

Prints the median seconds and MB/s (uncompressed bytes per second) of each, as a markdown table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from client.images import snapshots
from client.images.snapshots import Snapshotter

from bench.common import not_root
from bench.compare.run import Janitor, PrivateContainerd, log, run

SOURCES = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/python3.11", "/usr/share/doc", "/usr/share/locale")
MEDIA = {"gzip": "application/vnd.oci.image.layer.v1.tar+gzip", "zstd": "application/vnd.oci.image.layer.v1.tar+zstd"}
COMPRESS = {"gzip": ["gzip", "-6", "-n", "-c"], "zstd": ["zstd", "-3", "-q", "-c"]}


def digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def source_files(limit: int) -> list[str]:
    """Regular files and symlinks under SOURCES, in walk order, until ``limit`` bytes."""
    out, total = [], 0
    for top in SOURCES:
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                out.append(path)
                total += st.st_size if os.path.isfile(path) and not os.path.islink(path) else 0
                if total >= limit:
                    return out
    return out


def build_image(workdir: str, mb: int, layers: int, compression: str) -> tuple[list[tuple[str, str, str]], int, str]:
    """Layer blobs under workdir/blobs and an OCI layout tar; returns the layers for unpack, the
    uncompressed bytes and the layout tar's path."""
    files = source_files(mb << 20)
    blobs = os.path.join(workdir, "blobs")
    os.makedirs(blobs)
    out, raw_total = [], 0
    per = -(-len(files) // layers)
    for n in range(layers):
        raw = os.path.join(workdir, f"layer{n}.tar")
        with tarfile.open(raw, "w", format=tarfile.PAX_FORMAT) as tar:
            for path in files[n * per:(n + 1) * per]:
                tar.add(path, arcname=path.lstrip("/"), recursive=False)
        raw_total += os.path.getsize(raw)
        diff_id = digest(raw)
        packed = raw + "." + compression
        with open(raw, "rb") as src, open(packed, "wb") as dst:
            subprocess.run(COMPRESS[compression], stdin=src, stdout=dst, check=True)
        os.unlink(raw)
        blob = os.path.join(blobs, digest(packed).partition(":")[2])
        os.rename(packed, blob)
        out.append((diff_id, blob, MEDIA[compression]))
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": [d for d, _, _ in out]}}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": "sha256:" + hashlib.sha256(config).hexdigest(), "size": len(config)},
        "layers": [{"mediaType": media, "digest": "sha256:" + os.path.basename(blob), "size": os.path.getsize(blob)}
                   for _, blob, media in out]}).encode()
    index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "size": len(manifest),
         "digest": "sha256:" + hashlib.sha256(manifest).hexdigest(),
         "annotations": {"io.containerd.image.name": "bench/unpack:latest",
                         "org.opencontainers.image.ref.name": "latest"}}]}).encode()
    for doc in (config, manifest):
        with open(os.path.join(blobs, hashlib.sha256(doc).hexdigest()), "wb") as f:
            f.write(doc)
    layout = os.path.join(workdir, "image.tar")
    with tarfile.open(layout, "w") as tar:
        for name, data in (("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", index)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, __import__("io").BytesIO(data))
        for name in sorted(os.listdir(blobs)):
            tar.add(os.path.join(blobs, name), arcname="blobs/sha256/" + name)
    return out, raw_total, layout


def time_podshim(workdir: str, layers: list[tuple[str, str, str]], workers: int) -> float:
    root = tempfile.mkdtemp(prefix="snap-", dir=workdir)
    saved = snapshots.UNPACK_WORKERS
    snapshots.UNPACK_WORKERS = workers
    try:
        start = time.perf_counter()
        Snapshotter(root).unpack(layers)
        return time.perf_counter() - start
    finally:
        snapshots.UNPACK_WORKERS = saved
        shutil.rmtree(root)


def time_tar(workdir: str, layers: list[tuple[str, str, str]], compression: str) -> float:
    root = tempfile.mkdtemp(prefix="tar-", dir=workdir)
    try:
        start = time.perf_counter()
        for n, (_, blob, _) in enumerate(layers):
            dest = os.path.join(root, str(n))
            os.mkdir(dest)
            run(["tar", "-x", "--zstd" if compression == "zstd" else "-z", "-f", blob, "-C", dest], timeout=600)
        return time.perf_counter() - start
    finally:
        shutil.rmtree(root)


def time_containerd(cd: PrivateContainerd, layout: str, round_no: int) -> float:
    ns = f"unpack-bench-{round_no}"
    start = time.perf_counter()
    run(["ctr", "-a", cd.sock, "-n", ns, "images", "import", "--no-unpack", layout], timeout=600)
    log(f"round {round_no + 1}: containerd: the import without unpacking (not counted) took "
        f"{time.perf_counter() - start:.2f} s")
    start = time.perf_counter()
    run(["ctr", "-a", cd.sock, "-n", ns, "images", "import", layout], timeout=600)
    took = time.perf_counter() - start
    run(["ctr", "-a", cd.sock, "-n", ns, "images", "rm", "--sync", "bench/unpack:latest"], timeout=600)
    return took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=int, default=100, help="uncompressed image size in MB (100)")
    p.add_argument("--layers", type=int, default=8, help="layers (8)")
    p.add_argument("--compression", choices=sorted(COMPRESS), default="gzip")
    p.add_argument("--rounds", type=int, default=3, help="rounds; the median is printed (3)")
    p.add_argument("--no-containerd", action="store_true", help="measure podshim and GNU tar only")
    args = p.parse_args(argv)
    if not_root("layers hold files of every owner, devices and trusted xattrs"):
        return 2
    janitor = Janitor()
    janitor.install()
    try:
        workdir = janitor.workdir("unpackb-", "/var/tmp")
        log(f"building a {args.mb} MB image in {args.layers} {args.compression} layers")
        layers, raw_bytes, layout = build_image(workdir, args.mb, args.layers, args.compression)
        packed = sum(os.path.getsize(blob) for _, blob, _ in layers)
        contenders: dict[str, Callable[[int], float]] = {
            f"podshim ({snapshots.UNPACK_WORKERS} layers at once)":
                lambda r: time_podshim(workdir, layers, snapshots.UNPACK_WORKERS),
            "podshim (one layer at a time)": lambda r: time_podshim(workdir, layers, 1),
            "GNU tar -x, one layer after another": lambda r: time_tar(workdir, layers, args.compression),
        }
        if not args.no_containerd:
            cd_dir = os.path.join(workdir, "containerd")
            os.makedirs(cd_dir)
            cd = PrivateContainerd(cd_dir, janitor)
            version = cd.start()
            contenders[f"containerd {version} (ctr import, blobs present)"] = lambda r: time_containerd(cd, layout, r)
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for r in range(args.rounds):
            for name, fn in contenders.items():  # interleaved: load on the machine hits all alike
                times[name].append(fn(r))
                log(f"round {r + 1}: {name}: {times[name][-1]:.2f} s")
        print(f"\n{args.mb} MB image, {len(layers)} {args.compression} layers: {raw_bytes / 1e6:.1f} MB "
              f"uncompressed, {packed / 1e6:.1f} MB compressed; median of {args.rounds} rounds\n")
        print("| unpack | seconds | MB/s (uncompressed) |\n|---|---|---|")
        for name, values in times.items():
            median = statistics.median(values)
            print(f"| {name} | {median:.2f} | {raw_bytes / 1e6 / median:.0f} |")
    finally:
        janitor.run()
    return 1 if janitor.failures else 0


if __name__ == "__main__":
    sys.exit(main())
