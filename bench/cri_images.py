"""What the image benches share: a throwaway network namespace the whole bench runs in, the tests'
local registry and images there, and containerd 1.6's CRI plugin pulling from it.

``netns_main(parser, prefix, inside)``: each of these benches' main. It parses the command line,
then as root makes a network namespace (``ip netns add``), runs this same script again inside it (``nsenter --net``, plus ``unshare --ipc`` so that critest's host-IPC specs
make their shared memory in a namespace that goes away) and deletes the namespace afterwards, also
when the inner run fails or is interrupted. The registry on 127.0.0.1, the CRI daemons, their CNI
bridge and portmap rules, crictl and critest all live in that namespace: nothing touches the
machine's network. The inner run calls ``inside(args)``.

``ImageContainerd``: bench/cri_cycle.py's private containerd with the CRI plugin on, its
sandbox_image the pause image built and imported here, a bridge + portmap CNI config, and registry
mirrors (docker.io, gcr.io, k8s.gcr.io and the local registry itself → the local registry over
plain HTTP).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.common import not_root
from bench.compare.run import IMAGE, Janitor, build_pause_image, log, run
from bench.cri_cycle import CNI_BIN, CriContainerd, remove_runc_root_later

INSIDE_FLAG = "--inside-netns"


def netns_main(parser: argparse.ArgumentParser, prefix: str, inside: Callable[[argparse.Namespace], int],
               argv: list[str] | None = None,
               check: Callable[[argparse.Namespace], None] | None = None) -> int:
    """A netns bench's main: parse ``argv`` (sys.argv[1:] by default) with ``parser``, then
    ``check(args)`` (which calls ``parser.error`` on bad values, before anything is made); then
    run this script again in a new network namespace named ``prefix-XXXXXX``
    (:func:`run_inside_netns`), where it calls ``inside(args)``. Its exit status."""
    argv = sys.argv[1:] if argv is None else argv
    parser.add_argument(INSIDE_FLAG, action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if check is not None:
        check(args)
    if not args.inside_netns:
        return run_inside_netns([a for a in argv if a != INSIDE_FLAG], prefix)
    return inside(args)


def bench_parser(doc: str) -> argparse.ArgumentParser:
    """An argument parser described by the first paragraph of a bench's docstring."""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0])


def runs_option(parser: argparse.ArgumentParser, runs: int, *others: str) -> Callable[[argparse.Namespace], None]:
    """Add --runs (default ``runs``) to ``parser``; the check (for :func:`netns_main`) that it and
    the options ``others`` (their dests) are positive."""
    parser.add_argument("--runs", type=int, default=runs, help=f"interleaved runs ({runs})")
    names = ["--" + name.replace("_", "-") for name in ("runs", *others)]

    def check(args: argparse.Namespace) -> None:
        if any(getattr(args, name) < 1 for name in ("runs", *others)):
            parser.error(" and ".join(filter(None, (", ".join(names[:-1]), names[-1]))) + " must be positive")
    return check


def run_inside_netns(argv: list[str], prefix: str) -> int:
    """Run ``sys.argv[0] ARGV --inside-netns`` in a new network namespace (and IPC namespace) and
    remove the namespace afterwards; the inner run's exit status."""
    if not_root("it makes a network namespace and starts CRI runtimes in it"):
        return 2
    janitor = Janitor()
    janitor.install()
    name = f"{prefix}-{secrets.token_hex(3)}"
    try:
        run(["ip", "netns", "add", name])
        janitor.add("delete the network namespace", run, ["ip", "netns", "delete", name])
        run(["ip", "-n", name, "link", "set", "lo", "up"])
        inner = subprocess.Popen(["nsenter", f"--net=/run/netns/{name}", "--", "unshare", "--ipc", "--",
                                  sys.executable, os.path.abspath(sys.argv[0]), *argv, INSIDE_FLAG])

        def stop_inner() -> None:
            if inner.poll() is None:
                inner.terminate()
                inner.wait()

        janitor.add("stop the inner run", stop_inner)
        return inner.wait()
    finally:
        janitor.run()


def cni_conflist(directory: str, bridge: str, subnet: str) -> None:
    """A bridge + portmap network (critest's host-port specs) under ``directory``/net.d, its IPAM
    leases under ``directory``/cni-leases."""
    os.makedirs(os.path.join(directory, "net.d"), exist_ok=True)
    with open(os.path.join(directory, "net.d", "10-bench.conflist"), "w") as f:
        json.dump({"cniVersion": "1.0.0", "name": bridge, "plugins": [
            {"type": "bridge", "bridge": bridge, "isGateway": True, "ipMasq": False,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]], "routes": [{"dst": "0.0.0.0/0"}],
                      "dataDir": os.path.join(directory, "cni-leases")}},
            {"type": "portmap", "capabilities": {"portMappings": True}}]}, f)


def podshimd_directory(janitor: Janitor) -> str:
    """A directory for a bench's podshimd (under /tmp: its socket path must fit), removed by
    ``janitor``, with the bench's CNI network (:func:`cni_conflist`) in it."""
    directory = tempfile.mkdtemp(prefix="psd-", dir="/tmp")
    janitor.add("remove podshimd's directory", shutil.rmtree, directory, True)
    cni_conflist(directory, "bench-ps0", "10.234.0.0/16")
    return directory


class TimedCrictl:
    """One CRI endpoint driven through crictl (the runtime and image service both), each step's
    commands timed together from the first's exec to the last's exit: ``times[step]`` in seconds.
    ``timeout`` is crictl's for each call, ``command_timeout`` the bound on each crictl command."""

    def __init__(self, crictl: str, endpoint: str, steps: Iterable[str], *, timeout: int, command_timeout: float):
        self.base = [crictl, "--runtime-endpoint", endpoint, "--image-endpoint", endpoint, "--timeout", f"{timeout}s"]
        self.command_timeout = command_timeout
        self.times: dict[str, list[float]] = {step: [] for step in steps}

    def crictl(self, *argv: str) -> str:
        """What ``crictl ARGV`` printed, stripped (RuntimeError when it failed)."""
        said: str = run([*self.base, *argv], timeout=self.command_timeout).stdout
        return said.strip()

    def timed(self, step: str, *commands: list[str]) -> str:
        """Run ``commands`` in turn as one timed ``step``; what the last printed."""
        start = time.perf_counter()
        out = ""
        for argv in commands:
            out = self.crictl(*argv)
        self.times[step].append(time.perf_counter() - start)
        return out


class ImageContainerd(CriContainerd):
    """containerd 1.6 with its CRI plugin, pulling through ``mirrors`` (host -> endpoint)."""

    def __init__(self, directory: str, janitor: Janitor, mirrors: Mapping[str, str]):
        super().__init__(directory, janitor)
        self.mirrors = dict(mirrors)

    def config(self) -> str:
        return super().config() + "".join(
            f'[plugins."io.containerd.grpc.v1.cri".registry.mirrors."{host}"]\n  endpoint = ["{endpoint}"]\n'
            for host, endpoint in self.mirrors.items())


def start_containerd(workdir: str, janitor: Janitor, mirrors: Mapping[str, str]) -> tuple[ImageContainerd, str]:
    """Start an ImageContainerd under ``workdir``/cd with the pause image imported; (it, its version).
    Everything it makes is undone by ``janitor``."""
    directory = os.path.join(workdir, "cd")
    os.makedirs(directory)
    cni_conflist(directory, "bench-cd0", "10.233.0.0/16")
    remove_runc_root_later(janitor)
    containerd = ImageContainerd(directory, janitor, mirrors)
    version = containerd.start()
    image = os.path.join(workdir, "pause.tar")
    build_pause_image(image)
    run(["ctr", "-a", containerd.sock, "-n", "k8s.io", "image", "import", "--index-name", IMAGE, image], timeout=120)
    return containerd, version


__all__ = ["CNI_BIN", "INSIDE_FLAG", "IMAGE", "ImageContainerd", "Janitor", "bench_parser", "cni_conflist", "log",
           "netns_main", "run", "run_inside_netns", "runs_option", "start_containerd", "TimedCrictl"]
