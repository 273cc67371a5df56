"""containerd's CRI on podshim's shim by its two routes, the ``podshim`` runtime handler
(``sandboxer = "shim"``: containerd runs ``containerd-shim-podshim-v1 start`` and ``delete`` per pod) and
the ``podshim-proxy`` one (``sandboxer = "podshim-proxy"``, a proxy plugin served by podshim-sandboxer: no
command per pod), beside the same containerd with runc (the ``podsandbox`` sandboxer) and beside podshimd,
through the real crictl, interleaved in one run; a Markdown table of medians, and each podshim route's
speed-up over runc's past crictl's floor.

    python bench/containerd_shim.py [--cycles 20] [--pods 20] [--no-template]

As root, in a throwaway network namespace (bench/cri_images.py's netns_main): the tests' local
registry with busybox and the catatonit pause image (tests/support/imagebuild.py); containerd (the version
.ci/pins.toml pins, started as the containerd tests start it, tests/support/ctrdtools.py, but at its default
log level, info: its sandbox image that pause, runc's and podshim's handlers, podshim's command started as
the installed one starts, the checkout's bytecode written first as an install writes it) with a shim
template serving podshim's runtime root, so containerd's ``start`` and podshim-sandboxer
(ctrdtools.running_sandboxer, at log level info) ask it for each shim (the fast path; --no-template:
each ``start``, and the sandboxer, fork the shim themselves); podshimd (bench.common.bench_podshimd, its own template).

Figures, each runtime in turn in every round: (1) ``crictl runp → stopp → rmp``; (2) ``crictl runp``
then ``create`` and ``start`` of one busybox container (the pod then stopped and removed, not timed);
the floor: three ``crictl version`` calls. Beside them, (1) alone through a fifth handler whose
sandbox controller (a proxy plugin served by :class:`NullSandboxer`) makes nothing: containerd's own
cost of a pod, CNI's included. (3) Idle memory: --pods pods up on one runtime at a time
(``crictl runp``), 1 s settle, then the PSS (/proc/PID/smaps_rollup) of each pod's shim (the parent
of the pod's pid, its pause) and of its pause, mean per pod; the shim template's and podshim-sandboxer's own PSS (fixed, not per pod) beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.common import bench_podshimd, compile_bytecode, memory, parent_of, percentile, template_memory
from bench.cri_images import Janitor, bench_parser, log, netns_main, podshimd_directory

#: Seconds the pods settle before their memory is read.
SETTLE = 1.0


class NullSandboxer:
    """containerd's sandbox Controller (gRPC, a proxy plugin) that makes nothing: a pod is a name
    and an event its Stop sets. Its handler's runp → stopp → rmp is what a pod costs containerd's CRI
    and CNI themselves, which no sandbox controller can take away."""

    def __init__(self) -> None:
        self.stopped: dict[str, threading.Event] = {}

    def _event(self, sandbox_id: str) -> threading.Event:
        return self.stopped.setdefault(sandbox_id, threading.Event())

    def handlers(self) -> Any:
        import grpc

        from shim.containerd.api import load
        from shim.containerd.proxy import CONTROLLER_SERVICE

        pb2, platform = load("services.sandbox.v1.sandbox_pb2"), load("types.platform_pb2")
        pid = os.getpid()  # (no container joins a null pod)

        def stop(r: Any) -> Any:
            self._event(r.sandbox_id).set()
            return pb2.ControllerStopResponse()

        def wait(r: Any) -> Any:
            self._event(r.sandbox_id).wait()
            return pb2.ControllerWaitResponse(exit_status=0)

        def status(r: Any) -> Any:
            ready = not self._event(r.sandbox_id).is_set()
            return pb2.ControllerStatusResponse(sandbox_id=r.sandbox_id, pid=pid,
                                                state="SANDBOX_READY" if ready else "SANDBOX_NOTREADY")

        def shutdown(r: Any) -> Any:
            self.stopped.pop(r.sandbox_id, None)
            return pb2.ControllerShutdownResponse()

        answers: dict[str, Callable[[Any], Any]] = {
            "Create": lambda r: pb2.ControllerCreateResponse(sandbox_id=r.sandbox_id),
            "Start": lambda r: pb2.ControllerStartResponse(sandbox_id=r.sandbox_id, pid=pid),
            "Platform": lambda r: pb2.ControllerPlatformResponse(
                platform=platform.Platform(os="linux", architecture="amd64")),
            "Stop": stop, "Wait": wait, "Status": status, "Shutdown": shutdown,
            "Metrics": lambda r: pb2.ControllerMetricsResponse(),
            "Update": lambda r: pb2.ControllerUpdateResponse(),
        }

        def method(name: str, answer: Callable[[Any], Any]) -> Any:
            return grpc.unary_unary_rpc_method_handler(
                lambda request, context: answer(request), response_serializer=lambda m: m.SerializeToString(),
                request_deserializer=getattr(pb2, f"Controller{name}Request").FromString)

        return grpc.method_handlers_generic_handler(
            CONTROLLER_SERVICE, {name: method(name, answer) for name, answer in answers.items()})


@contextlib.contextmanager
def null_sandboxer(path: str) -> Iterator[NullSandboxer]:
    """A :class:`NullSandboxer` serving on the Unix socket ``path`` (threads of this process)."""
    import grpc

    null = NullSandboxer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
    server.add_generic_rpc_handlers((null.handlers(),))
    server.add_insecure_port("unix://" + path)
    server.start()
    try:
        yield null
    finally:
        for event in list(null.stopped.values()):
            event.set()  # (Waits still held by containerd end)
        server.stop(0)


@dataclass
class Runtime:
    name: str
    endpoint: str
    runp: tuple[str, ...]  # crictl runp's flags
    crictl: str
    directory: str
    cycles: list[float] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)
    floors: list[float] = field(default_factory=list)
    bundles: str = ""  # the pods' bundles (containerd's shim sandboxer, or podshim-sandboxer's): their state.json
    record: str = "podshim"  # podshim's own bundle in each, where its state.json is
    pods_only: bool = False  # no container can run in its pods: runp → stopp → rmp alone
    shim_pss: float = 0.0  # KiB, mean per pod
    pause_pss: float = 0.0
    shims: int = 0

    def call(self, *args: str) -> str:
        done = subprocess.run([self.crictl, "--runtime-endpoint", self.endpoint, "--image-endpoint", self.endpoint,
                               "--timeout", "60s", *args], capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"crictl {' '.join(args)} against {self.name}: {done.stderr.strip()}")
        return done.stdout

    def pod_json(self) -> str:
        name = f"b-{secrets.token_hex(4)}"
        path = os.path.join(self.directory, f"{name}.json")
        with open(path, "w") as f:
            json.dump({"metadata": {"name": name, "uid": secrets.token_hex(8), "namespace": "bench"},
                       "log_directory": os.path.join(self.directory, "logs", name)}, f)
        return path

    def remove(self, pod: str) -> None:
        self.call("stopp", pod)
        self.call("rmp", pod)

    def cycle(self) -> None:
        path = self.pod_json()
        t0 = time.perf_counter()
        self.remove(self.call("runp", *self.runp, path).strip())
        self.cycles.append(time.perf_counter() - t0)

    def start(self, container_json: str) -> None:
        if self.pods_only:
            return
        path = self.pod_json()
        t0 = time.perf_counter()
        pod = self.call("runp", *self.runp, path).strip()
        container = self.call("create", pod, container_json, path).strip()
        self.call("start", container)
        self.starts.append(time.perf_counter() - t0)
        self.remove(pod)

    def floor(self) -> None:
        t0 = time.perf_counter()
        for _ in range(3):
            self.call("version")
        self.floors.append(time.perf_counter() - t0)

    def pause_pid(self, pod: str) -> int:
        """The pod's pid (its pause): containerd's CRI reports 0 for a pod of another sandboxer than
        its own, whose record (podshim's state.json in the pod's bundle) has it."""
        if self.bundles:
            with open(os.path.join(self.bundles, pod, self.record, "state.json")) as f:
                return int(json.load(f)["pause"]["pid"])
        return int(json.loads(self.call("inspectp", "-o", "json", pod))["info"]["pid"])

    def idle_memory(self, count: int) -> None:
        if self.pods_only:
            return
        pods = [self.call("runp", *self.runp, self.pod_json()).strip() for _ in range(count)]
        try:
            time.sleep(SETTLE)
            pauses = [self.pause_pid(pod) for pod in pods]
            shims = {parent_of(pause) for pause in pauses}
            self.shims = len(shims)
            self.shim_pss = sum(memory(pid).pss for pid in shims) / count
            self.pause_pss = sum(memory(pid).pss for pid in pauses) / count
        finally:
            for pod in pods:
                self.remove(pod)


def inside(args: argparse.Namespace) -> int:
    from support.critools import cri_tool
    from support.ctrdtools import (
        NULL_HANDLER,
        NULL_SOCKET,
        PROXY_HANDLER,
        containerd_version,
        running_containerd,
        running_sandboxer,
    )
    from support.imagebuild import TestImages, catatonit_pause_image
    from support.registry import running_registry

    crictl = cri_tool("crictl")
    # containerd runs `start` and `delete` of the checkout with this environment: with
    # PYTHONDONTWRITEBYTECODE (a harness sets it) each would compile its modules again.
    compile_bytecode(REPO)
    janitor = Janitor()
    janitor.install()
    runtimes: list[Runtime] = []
    template_pss = sandboxer_pss = 0.0
    try:
        workdir = tempfile.mkdtemp(prefix="ctrdb-", dir="/tmp")  # short: containerd's socket path must fit
        janitor.add("remove the work directory", shutil.rmtree, workdir, True)
        with running_registry() as registry:
            images = TestImages(registry, os.path.join(workdir, "images"))
            busybox, pause = images.busybox, catatonit_pause_image(images)
            directory = os.path.join(workdir, "cd")
            os.makedirs(directory)
            # At containerd's own default log level, as a node runs it (the tests' debug level also makes
            # containerd pass -debug to the podshim handler's shims, which then log each call).
            with running_containerd(directory, f"/proc/{os.getpid()}/ns/net", registry.host, pause.ref,
                                    log_level="info") as containerd:
                template = 0
                if not args.no_template:
                    template = start_template(containerd.runtime_root)
                    janitor.add("stop containerd's shim template", stop_template, containerd.runtime_root)
                psd_directory = podshimd_directory(janitor)
                with running_sandboxer(containerd, use_template=not args.no_template, debug=False) as sandboxer, \
                        null_sandboxer(os.path.join(directory, NULL_SOCKET)), \
                        bench_podshimd(psd_directory, crictl, janitor.failures, image=busybox) as daemon:
                    version = containerd_version()
                    bundles = os.path.join(containerd.state, "io.containerd.sandbox.controller.v1.shim", "k8s.io")
                    runtimes = [Runtime(f"containerd {version}, podshim handler", containerd.endpoint,
                                        ("--runtime", "podshim"), crictl, directory, bundles=bundles),
                                Runtime(f"containerd {version}, podshim-proxy handler (podshim-sandboxer)",
                                        containerd.endpoint, ("--runtime", PROXY_HANDLER), crictl, directory,
                                        bundles=os.path.join(sandboxer.state_root, "k8s.io"), record=""),
                                Runtime(f"containerd {version}, runc", containerd.endpoint, (), crictl, directory),
                                Runtime("podshimd", daemon.endpoint, (), crictl, psd_directory),
                                Runtime(f"containerd {version}, a sandbox controller that makes nothing",
                                        containerd.endpoint, ("--runtime", NULL_HANDLER), crictl, directory,
                                        pods_only=True)]
                    runtimes[0].call("pull", busybox.ref)
                    container_json = os.path.join(workdir, "c.json")
                    with open(container_json, "w") as f:
                        json.dump({"metadata": {"name": "c"}, "image": {"image": busybox.ref},
                                   "command": ["sleep", "1000"]}, f)
                    for rt in runtimes:  # warm: first calls, the template's spare, page cache
                        rt.cycle()
                        rt.start(container_json)
                        rt.cycles.clear()
                        rt.starts.clear()
                    for i in range(args.cycles):
                        for rt in runtimes:
                            rt.floor()
                            rt.cycle()
                            rt.start(container_json)
                        if (i + 1) % 5 == 0:
                            log(f"{i + 1} of {args.cycles} rounds")
                    for rt in runtimes:
                        log(f"{args.pods} idle pods on {rt.name}")
                        rt.idle_memory(args.pods)
                    if template:
                        template_pss = template_memory(template, containerd.runtime_root).pss
                    sandboxer_pss = memory(sandboxer.process.pid).pss
    finally:
        janitor.run()
    print("\n".join(report(args, runtimes, template_pss, sandboxer_pss)))
    if janitor.failures:
        print("Cleanup problems: " + "; ".join(janitor.failures))
    return 0 if runtimes and not janitor.failures else 1


def start_template(runtime_root: str) -> int:
    """A shim template serving ``runtime_root`` (``podshim template --detach``); its pid."""
    done = subprocess.run([sys.executable, "-c", "from shim.cli import run; run()", "template", "--detach",
                           "--runtime-root", runtime_root, "--idle-grace", "0"], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": REPO})
    if done.returncode != 0:
        raise RuntimeError(f"podshim template --detach: {done.stderr.strip()}")
    return int(json.loads(done.stdout)["pid"])


def stop_template(runtime_root: str) -> None:
    subprocess.run([sys.executable, "-c", "from shim.cli import run; run()", "template", "--stop", "--runtime-root",
                    runtime_root], cwd=REPO, capture_output=True, timeout=60, env={**os.environ, "PYTHONPATH": REPO})


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}"


def report(args: argparse.Namespace, runtimes: list[Runtime], template_pss: float, sandboxer_pss: float
           ) -> list[str]:
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    out = [f"{date}, commit {commit}, {os.cpu_count()} CPUs, load {load} (at the end); "
           f"`python3 bench/containerd_shim.py --cycles {args.cycles} --pods {args.pods}"
           + (" --no-template" if args.no_template else "") + "`", "",
           "| runtime | runp→stopp→rmp median (p90) | past the floor | runp + container start median (p90) "
           "| past the floor | floor (3 × crictl version) | idle shim PSS per pod | idle pause PSS per pod |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for rt in runtimes:
        if not rt.cycles:
            continue
        floor = statistics.median(rt.floors)
        cycle = statistics.median(rt.cycles)
        if rt.pods_only:
            out.append(f"| {rt.name} | {ms(cycle)} ms ({ms(percentile(rt.cycles, 90))}) | {ms(cycle - floor)} ms "
                       f"| | | {ms(floor)} ms | | |")
            continue
        start = statistics.median(rt.starts)
        out.append(f"| {rt.name} | {ms(cycle)} ms ({ms(percentile(rt.cycles, 90))}) | {ms(cycle - floor)} ms "
                   f"| {ms(start)} ms ({ms(percentile(rt.starts, 90))}) | {ms(start - floor)} ms | {ms(floor)} ms "
                   f"| {rt.shim_pss / 1024:.2f} MiB ({rt.shims} shims) | {rt.pause_pss / 1024:.2f} MiB |")
    runc = next((rt for rt in runtimes if rt.name.endswith(", runc") and rt.cycles), None)
    if runc is not None:
        out += ["", "runc's time past the floor ÷ each podshim route's (medians; the goal is 2x or more):", ""]
        for rt in runtimes:
            if "podshim" in rt.name and "handler" in rt.name and rt.cycles:
                out.append(f"- {rt.name}: runp→stopp→rmp {_past(runc.cycles, runc.floors) / _past(rt.cycles, rt.floors):.2f}x,"
                           f" runp + container start {_past(runc.starts, runc.floors) / _past(rt.starts, rt.floors):.2f}x")
        null = next((rt for rt in runtimes if rt.pods_only and rt.cycles), None)
        if null is not None:
            out.append(f"- containerd's own share of runp→stopp→rmp past the floor (the controller that makes "
                       f"nothing): {ms(_past(null.cycles, null.floors))} ms; half of runc's: "
                       f"{ms(_past(runc.cycles, runc.floors) / 2)} ms")
    if template_pss:
        out += ["", f"containerd's podshim shims forked by a shim template of its runtime root, whose own PSS "
                    f"(template and spare shim, fixed) is {template_pss / 1024:.1f} MiB."]
    if sandboxer_pss:
        out += ["", f"podshim-sandboxer's own PSS (fixed, not per pod), after the idle pods: "
                    f"{sandboxer_pss / 1024:.1f} MiB."]
    return out


def _past(times: list[float], floors: list[float]) -> float:
    """Median time past the median floor; never below a millisecond (a ratio's denominator)."""
    return max(0.001, statistics.median(times) - statistics.median(floors))


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__)
    p.add_argument("--cycles", type=int, default=20, help="rounds: each runtime's cycle and start once a round")
    p.add_argument("--pods", type=int, default=20, help="idle pods per runtime for the memory figures")
    p.add_argument("--no-template", action="store_true",
                   help="no shim template for containerd's podshim handler: each `start` forks its shim")
    return netns_main(p, "ctrdb", inside, argv)


if __name__ == "__main__":
    sys.exit(main())
