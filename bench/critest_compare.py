"""critest's whole suite (cri-tools at the version .ci/pins.toml pins) against containerd's CRI
(the containerd .ci/pins.toml pins, with runc) and against podshimd with each of its runtime
handlers, with the same local registry and images: the figures for the CRI issue's closing note.

    python bench/critest_compare.py [--no-containerd] [--handlers native,runc,crun] [--focus REGEX]
                                    [--skip REGEX] [--output DIR]

As root. Everything runs in a throwaway network namespace (bench/cri_images.py): the tests' local
registry (docker-registry on 127.0.0.1) with every image critest pulls (tests/support/imagebuild.py's
critest_images, built offline), containerd (started as the containerd tests start it,
tests/support/ctrdtools.py, its sandbox image critest's pause) and podshimd, each mirroring
registry.k8s.io, gcr.io and k8s.gcr.io to that registry (one after the other), and critest itself
(its host-port and host-network specs reach the pods from there). Prints ran / passed / failed /
skipped per runtime, containerd's failed specs, and each spec that a podshimd handler fails or
skips where containerd passes, with the first line of its message, and a table of every spec some
runtime did not pass, with why; with --output, critest's whole output per runtime is written there.

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

from bench.common import bench_podshimd
from bench.cri_images import Janitor, bench_parser, log, netns_main, podshimd_directory
from support.critools import CritestResult  # noqa: E402  (tests/ is on the path once bench.cri_images is imported)


def inside(args: argparse.Namespace) -> int:
    from support.critools import cri_tool, gotool, run_critest
    from support.ctrdtools import containerd_version, running_containerd
    from support.imagebuild import CRITEST_PAUSE_IMAGES, TestImages, critest_images
    from support.registry import running_registry

    critest, crictl = cri_tool("critest"), cri_tool("crictl")
    version = gotool.tool_pin("critest")["version"]
    janitor = Janitor()
    janitor.install()
    results: list[tuple[str, CritestResult]] = []
    try:
        workdir = tempfile.mkdtemp(prefix="critcmp-", dir="/tmp")  # short: containerd's socket path must fit
        janitor.add("remove the work directory", shutil.rmtree, workdir, True)
        with running_registry() as registry:
            images = critest_images(TestImages(registry, os.path.join(workdir, "images")))
            log(f"registry {registry.host}: {len(images.pulls)} critest images pushed")
            if not args.no_containerd:
                directory = os.path.join(workdir, "cd")
                os.makedirs(directory)
                with running_containerd(directory, f"/proc/{os.getpid()}/ns/net", registry.host,
                                        CRITEST_PAUSE_IMAGES[0], mirrors=images.mirrors, portmap=True) as containerd:
                    log(f"critest against containerd {containerd_version()}'s CRI, runc ...")
                    results.append((f"containerd {containerd_version()} runc",
                                    run_critest(critest, containerd.endpoint, focus=args.focus, skip=args.skip,
                                                cwd=directory)))
            for handler in args.handlers:
                directory = podshimd_directory(janitor)
                config = images.podshim_registry_config() + args.podshimd_config
                with bench_podshimd(directory, crictl, janitor.failures, config=config) as daemon:
                    log(f"critest against podshimd, {handler} ...")
                    results.append((f"podshimd {handler}",
                                    run_critest(critest, daemon.endpoint, focus=args.focus, skip=args.skip,
                                                extra=["--runtime-handler", handler], cwd=directory)))
    finally:
        janitor.run()

    print("\n".join(report(args, version, results)))
    if janitor.failures:
        print("Cleanup problems: " + "; ".join(janitor.failures))
    return 0 if results and all(r.ran for _, r in results) else 1


def first_line(message: str) -> str:
    """A failure's first line, and the first line that carries a gRPC status when that is another."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    status = next((line for line in lines if "rpc error" in line), "")
    return " / ".join(dict.fromkeys(line for line in lines[:1] + [status] if line)) or "(no message)"


def report(args: argparse.Namespace, version: str, results: list[tuple[str, CritestResult]]) -> list[str]:
    """The table, containerd's failures, and what each podshimd handler does not pass that containerd
    does (a runtime whose name starts with "containerd" is the reference)."""
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    out = [f"critest {version}, {date}, {os.cpu_count()} CPUs, load {load}; `python3 bench/critest_compare.py"
           + (" --no-containerd" if args.no_containerd else "") + f" --handlers {','.join(args.handlers)}"
           + (f" --focus '{args.focus}'" if args.focus else "") + (f" --skip '{args.skip}'" if args.skip else "")
           + "`", "", "| runtime | ran | passed | failed | skipped |", "|---|---|---|---|---|"]
    for name, result in results:
        out.append(f"| {name} | {result.ran} of {result.total} | {result.passed} | {result.failed} | "
                   f"{result.skipped} |")
    reference = next((result for name, result in results if name.startswith("containerd")), None)
    for name, result in results:
        if args.output:
            os.makedirs(args.output, exist_ok=True)
            with open(os.path.join(args.output, f"critest-{name.replace(' ', '-')}.log"), "w") as f:
                f.write(result.output)
        if result.ran == 0:
            out += ["", f"{name}: critest reported no summary (exit status {result.returncode}):",
                    result.output[-3000:]]
        elif reference is None or result is reference:
            out += ["", f"{name}: failed specs:" if result.failures else f"{name}: no failed spec"]
            out += [f"- {spec}: {first_line(result.messages.get(spec, ''))}" for spec in result.failures]
        else:
            behind = sorted(spec for spec, state in result.specs.items()
                            if state != "passed" and reference.specs.get(spec) == "passed")
            out += ["", f"{name}: {len(behind)} specs containerd passes and this does not" + (":" if behind else "")]
            out += [f"- {spec} ({result.specs[spec]}): {first_line(result.messages.get(spec, ''))}"
                    for spec in behind]
    out += ["", *unpassed(results)]
    return out


def unpassed(results: list[tuple[str, CritestResult]]) -> list[str]:
    """A table of every spec some runtime did not pass: its state with each runtime, and the first
    line of why (critest's skip message, or the failure's). The specs that critest's filters left
    out everywhere (--focus, --skip, its own of the benchmarks: skipped with no message) are counted."""
    names = sorted({spec for _, result in results for spec, state in result.specs.items() if state != "passed"})
    filtered = [spec for spec in names if all(result.specs.get(spec) == "skipped" and spec not in result.messages
                                              for _, result in results)]
    names = [spec for spec in names if spec not in filtered]
    out = [f"{len(names)} specs some runtime did not pass (and {len(filtered)} that critest's filters left out "
           "everywhere: --focus, --skip, its benchmarks):", "",
           "| spec | " + " | ".join(name for name, _ in results) + " | why |",
           "|---|" + "---|" * len(results) + "---|"]
    for spec in names:
        states = [result.specs.get(spec, "-") for _, result in results]
        why = next((first_line(message) for _, result in results if (message := result.messages.get(spec))), "")
        out.append(f"| {spec} | " + " | ".join(states) + f" | {why.replace('|', '/')} |")
    return out


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__)
    p.add_argument("--no-containerd", action="store_true", help="run the suite against podshimd only")
    p.add_argument("--handlers", default="native,runc,crun", type=lambda text: [h for h in text.split(",") if h],
                   help="podshimd's runtime handlers to run the suite with, comma-separated (none: '')")
    p.add_argument("--podshimd-config", default="", help="more of podshimd's config.toml")
    p.add_argument("--focus", help="only the specs matching this regular expression")
    p.add_argument("--skip", help="not the specs matching this regular expression")
    p.add_argument("--output", help="write each runtime's critest output to this directory")

    def check(args: argparse.Namespace) -> None:
        if args.output:
            args.output = os.path.abspath(args.output)
        if not args.inside_netns:
            # critest's default image is made of Debian's dynamic busybox, which apt fetches on first
            # use: the bench's network namespace reaches no mirror, so it is fetched before.
            from support.imagebuild import dynamic_busybox
            try:
                dynamic_busybox()
            except RuntimeError as e:
                p.error(str(e))
    return netns_main(p, "critcmp", inside, argv, check)


if __name__ == "__main__":
    sys.exit(main())
