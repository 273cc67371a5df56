"""critest 1.26's whole suite against containerd 1.6's CRI plugin and against podshimd, with the
same local registry and images: the figures for the images issue's closing note.

    python bench/critest_compare.py [--no-podshimd] [--focus REGEX] [--skip REGEX] [--output DIR]

As root. Everything runs in a throwaway network namespace (bench/cri_images.py): the tests' local
registry (docker-registry on 127.0.0.1) with every image critest pulls (tests/imagebuild.py's
critest_images: built offline from busybox-static), containerd with its CRI plugin and podshimd, each
mirroring docker.io, gcr.io and k8s.gcr.io to that registry (one after the other), and critest itself (its host-port and host-network
specs reach the pods from there). critest gets ``--test-images-file`` for the default and web-server
images. Prints passed / failed / skipped per runtime and the names of the failed specs; with
--output, critest's whole output per runtime is written there.

podshimd's config.toml is CritestImages.podshim_registry_config() plus the text of --podshimd-config.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.common import bench_podshimd  # noqa: E402
from bench.cri_images import Janitor, bench_parser, log, netns_main, podshimd_directory, start_containerd  # noqa: E402

CRITOOLS_BIN = "/var/cache/cri-tools-1.26.0/bin"


def inside(args: argparse.Namespace) -> int:
    from critools import CritestResult, cri_tool, run_critest
    from imagebuild import TestImages, critest_images
    from registry import running_registry

    crictl, critest = cri_tool("crictl"), cri_tool("critest")
    janitor = Janitor()
    janitor.install()
    results: list[tuple[str, CritestResult]] = []
    notes: list[str] = []
    try:
        workdir = tempfile.mkdtemp(prefix="critcmp-")
        janitor.add("remove the work directory", shutil.rmtree, workdir, True)
        with running_registry() as registry:
            images = critest_images(TestImages(registry, os.path.join(workdir, "images")))
            log(f"registry {registry.host}: {len(images.pulls)} critest images pushed")
            containerd, version = start_containerd(workdir, janitor, images.mirrors)
            notes.append(f"containerd {version} (Debian), CRI plugin, runc; critest from {critest}")
            cwd = os.path.join(workdir, "critest-cd")
            os.makedirs(cwd)
            log("critest against containerd's CRI ...")
            results.append(("containerd 1.6", run_critest(critest,
                                                          "unix://" + containerd.sock, images, focus=args.focus,
                                                          skip=args.skip, cwd=cwd)))
            containerd.stop()
            if not args.no_podshimd:
                directory = podshimd_directory(janitor)
                config = images.podshim_registry_config() + args.podshimd_config
                with bench_podshimd(directory, crictl, janitor.failures,
                                    config=config) as daemon:
                    log("critest against podshimd ...")
                    results.append(("podshimd", run_critest(critest, daemon.endpoint,
                                                            images, focus=args.focus, skip=args.skip,
                                                            cwd=directory)))
    finally:
        janitor.run()

    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [f"critest 1.26, {date}, {os.cpu_count()} CPUs; `python3 bench/critest_compare.py"
           + (" --no-podshimd" if args.no_podshimd else "") + (f" --focus '{args.focus}'" if args.focus else "")
           + (f" --skip '{args.skip}'" if args.skip else "") + "`", "",
           "| runtime | ran | passed | failed | skipped | pending |", "|---|---|---|---|---|---|"]
    for name, result in results:
        out.append(f"| {name} | {result.ran} of {result.total} | {result.passed} | {result.failed} | "
                   f"{result.skipped} | {result.pending} |")
    for name, result in results:
        if result.ran == 0:
            out += ["", f"{name}: critest reported no summary (exit status {result.returncode}):",
                    result.output[-3000:]]
        if result.failures:
            out += ["", f"{name}: failed specs:"] + [f"- {failure}" for failure in result.failures]
        if args.output:
            os.makedirs(args.output, exist_ok=True)
            with open(os.path.join(args.output, f"critest-{name.split()[0]}.log"), "w") as f:
                f.write(result.output)
    out += ["", *notes]
    if janitor.failures:
        out.append("Cleanup problems: " + "; ".join(janitor.failures))
    print("\n".join(out))
    return 0 if results and all(r.ran for _, r in results) else 1


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__)
    p.add_argument("--no-podshimd", action="store_true", help="run the suite against containerd only")
    p.add_argument("--podshimd-config", default="", help="more of podshimd's config.toml")
    p.add_argument("--focus", help="only the specs matching this regular expression")
    p.add_argument("--skip", help="not the specs matching this regular expression")
    p.add_argument("--output", help="write each runtime's critest output to this directory")

    def check(args: argparse.Namespace) -> None:
        if args.output:
            args.output = os.path.abspath(args.output)
    return netns_main(p, "critcmp", inside, argv, check)


if __name__ == "__main__":
    sys.exit(main())
