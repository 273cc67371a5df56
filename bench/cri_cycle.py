"""podshimd beside containerd 1.6's CRI plugin, through the real crictl, in one interleaved run.

    python bench/cri_cycle.py [--cycles 30] [--pods 100] [--no-containerd] [--sandbox-image] [--trace]

As root. Sets up, and removes at the end (also on failure or a signal):

- one throwaway network namespace (``ip netns add``); both daemons run in it (``nsenter --net``), so
  CNI only ever touches that namespace;
- podshimd (``python -m client.podshimd``) with its state root, runtime root, socket and config
  under a temporary directory, started as tests/support/critools.py's ``running_podshimd`` does;
- a private containerd (bench/compare/run.py's ``PrivateContainerd``: own root, state and socket)
  with its CRI plugin on, sandbox_image = the pause image built and imported here with ``ctr``;
- each daemon its own copy of examples/cni/10-podshim-bridge.conflist (own bridge, subnet, dataDir);
- with --sandbox-image, a second podshimd whose ``sandbox_image`` is tests/support/imagebuild.py's catatonit
  pause image (``/catatonit -P``, the same program as the built-in pause), pulled into its image
  store before the run from the tests' registry on the host's loopback (which is stopped then), so
  the cycles measure the snapshot, its mount and the pause from it, not a pull.

Figures: (1) ``crictl runp → stopp → rmp``, interleaved, and three ``crictl version`` calls (what three crictl
processes cost with no pod work: the floor of a cycle through crictl); with --trace, podshimd's own
time per operation and phase (PODSHIM_TRACE, :mod:`client.phases`); (2) ListPodSandbox with --pods pods
present, by direct gRPC calls (shim.cri.api stubs) and by ``crictl pods -q``, and a Version call by
gRPC after each listing (what any call costs: the floor under the listing); (3) podshimd killed
with SIGKILL with --pods live pods and restarted: time until every pod answers PodSandboxStatus.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import secrets
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from shim.launch.template import stop_template

from bench.common import not_root, percentile, podshimd_netns, remove_cri_pods, remove_netns
from bench.compare.run import (
    CGROUP_ROOT,
    IMAGE,
    Janitor,
    PrivateContainerd,
    build_pause_image,
    kill_leftovers,
    log,
    remove_if_ours,
    run,
    stop_process,
    unmount_under,
)

CNI_BIN = "/usr/lib/cni"
START_TIMEOUT = 60.0


def crictl() -> str:
    """The pinned crictl (built once, by tests/support/critools.py's cri_tool)."""
    from support.critools import cri_tool
    return cri_tool("crictl")


class CriContainerd(PrivateContainerd):
    """The private containerd of bench/compare with its CRI plugin on.

    Its pods' network namespaces are mounted under its own state directory
    (``netns_mounts_under_state_dir``), not among everyone's in /run/netns: what it made is known by
    where it is. :meth:`stop` removes every pod first (a containerd stopped with pods leaves their
    ``cni-*`` namespaces behind), then removes and reports any namespace still there.
    """

    @property
    def netns_dir(self) -> str:
        return os.path.join(self.dir, "state", "io.containerd.grpc.v1.cri", "netns")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.janitor.failures.extend(remove_cri_pods(crictl(), "unix://" + self.sock))
        super().stop()
        left = [os.path.join(self.netns_dir, name) for name in sorted(os.listdir(self.netns_dir))] \
            if os.path.isdir(self.netns_dir) else []
        for path in remove_netns(left):
            self.problem(f"containerd left the netns {path} behind (removed now)")
        self._remove_leftover_containers()

    def problem(self, sentence: str) -> None:
        self.janitor.failures.append(sentence)
        log(sentence)

    def _remove_leftover_containers(self) -> None:
        """What containers (pauses included) that were not removed before containerd stopped left:
        their mounts below our directory, their cgroups and runc's state, by the ids of the task
        bundles it recorded (its processes are gone: PrivateContainerd.stop killed them)."""
        tasks = os.path.join(self.dir, "state", "io.containerd.runtime.v2.task", "k8s.io")
        ids = sorted(os.listdir(tasks)) if os.path.isdir(tasks) else []
        if not ids:
            return
        self.problem(f"containerd stopped with {len(ids)} containers not removed; removing what they left")
        unmount_under(self.dir)
        hierarchies = [CGROUP_ROOT] + [os.path.join(CGROUP_ROOT, h) for h in os.listdir(CGROUP_ROOT)]
        for cid in ids:
            for path in (os.path.join(h, "k8s.io", cid) for h in hierarchies):
                if os.path.isdir(path):
                    try:
                        os.rmdir(path)
                    except OSError as exc:
                        self.problem(f"left the cgroup {path}: {exc.strerror}")
            shutil.rmtree(os.path.join("/run/containerd/runc/k8s.io", cid), ignore_errors=True)
            shutil.rmtree(os.path.join(tasks, cid), ignore_errors=True)  # done: a second stop finds nothing

    def config(self) -> str:
        lines = [line for line in super().config().splitlines() if not line.startswith("disabled_plugins")]
        return "\n".join(lines[:5] + ["disabled_plugins = []"] + lines[5:] + [
            '[plugins."io.containerd.grpc.v1.cri"]',
            f'  sandbox_image = "{IMAGE}"',
            '  enable_cdi = false',
            # runc cannot lower oom_score_adj here (no CAP_SYS_RESOURCE where this runs: "failed to update
            # /proc/self/oom_score_adj: Permission denied"); clamp it to containerd's own, as rootless setups do.
            '  restrict_oom_score_adj = true',
            '  netns_mounts_under_state_dir = true',
            '[plugins."io.containerd.grpc.v1.cri".cni]',
            f'  bin_dir = "{CNI_BIN}"',
            f'  conf_dir = "{self.dir}/net.d"',
            "",
        ])


def remove_runc_root_later(janitor: Janitor) -> None:
    """The CRI plugin's runc root is /run/containerd/runc/k8s.io whatever the state directory is:
    ``janitor`` removes it (rmdir) after containerd stopped, if this run made it."""
    runc_dirs = ["/run/containerd/runc/k8s.io", "/run/containerd/runc", "/run/containerd"]
    janitor.add("remove the CRI plugin's runc root", remove_if_ours, runc_dirs,
                {d for d in runc_dirs if os.path.exists(d)})


def cni_conf(directory: str, bridge: str, subnet: str) -> None:
    with open(os.path.join(REPO, "examples", "cni", "10-podshim-bridge.conflist")) as f:
        conf = json.load(f)
    conf["name"] = bridge
    plugin = conf["plugins"][0]
    plugin["bridge"] = bridge
    plugin["ipam"]["ranges"] = [[{"subnet": subnet}]]
    plugin["ipam"]["dataDir"] = os.path.join(directory, "cni-leases")
    os.makedirs(os.path.join(directory, "net.d"), exist_ok=True)
    with open(os.path.join(directory, "net.d", "10-bridge.conflist"), "w") as f:
        json.dump(conf, f)


class Runtime:
    def __init__(self, key: str, endpoint: str):
        self.key = key
        self.endpoint = endpoint
        self.channel: Any = None
        self.cycles: list[float] = []
        self.floors: list[float] = []

    def crictl(self, *args: str) -> str:
        return run([crictl(), "--runtime-endpoint", self.endpoint, "--image-endpoint", self.endpoint,
                    "--timeout", "30s", *args], timeout=60).stdout

    def stub(self) -> Any:
        import grpc

        from shim.cri.api import api_pb2_grpc
        if self.channel is None:
            self.channel = grpc.insecure_channel(self.endpoint)
        return api_pb2_grpc.RuntimeServiceStub(self.channel)

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None


def pod_config(name: str) -> Any:
    from shim.cri.api import api_pb2
    return api_pb2.PodSandboxConfig(metadata=api_pb2.PodSandboxMetadata(
        name=name, uid=secrets.token_hex(8), namespace="bench", attempt=0))


def write_pod_json(directory: str, name: str) -> str:
    path = os.path.join(directory, f"{name}.json")
    with open(path, "w") as f:
        json.dump({"metadata": {"name": name, "uid": secrets.token_hex(8), "namespace": "bench", "attempt": 0}}, f)
    return path


def floor(rt: Runtime) -> float:
    """Three crictl calls that make nothing (``crictl version``): what a cycle's three crictl
    processes cost by themselves (exec, Go start-up, gRPC connection) before any pod work."""
    t0 = time.perf_counter()
    for _ in range(3):
        rt.crictl("version")
    return time.perf_counter() - t0


def cycle(rt: Runtime, directory: str) -> float:
    path = write_pod_json(directory, f"cyc-{secrets.token_hex(4)}")
    t0 = time.perf_counter()
    pod = rt.crictl("runp", path).strip()
    rt.crictl("stopp", pod)
    rt.crictl("rmp", pod)
    took = time.perf_counter() - t0
    os.unlink(path)
    return took


# -- podshimd ---------------------------------------------------------------------------------------

class PodshimdProc:
    def __init__(self, directory: str, netns: str, trace: bool = False, config: str = ""):
        self.dir = directory
        self.netns = netns
        self.trace = trace
        self.sock = os.path.join(directory, "run", "podshimd.sock")
        self.proc: subprocess.Popen[bytes] | None = None
        with open(os.path.join(directory, "config.toml"), "w") as f:
            f.write(f'cni_bin_dirs = ["{CNI_BIN}"]\n{config}')

    def argv(self) -> list[str]:
        d = self.dir
        return ["nsenter", f"--net={self.netns}", "--", sys.executable, "-m", "client.podshimd",
                "--config", os.path.join(d, "config.toml"), "--listen", "unix://" + self.sock,
                "--runtime-root", os.path.join(d, "run"), "--state-root", os.path.join(d, "state"),
                "--cni-conf-dir", os.path.join(d, "net.d")]

    def start(self) -> None:
        notify_path = os.path.join(self.dir, "notify")
        if os.path.exists(notify_path):
            os.unlink(notify_path)
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        notify.bind(notify_path)
        try:
            with open(os.path.join(self.dir, "podshimd.log"), "ab") as logf:
                self.proc = subprocess.Popen(self.argv(), cwd=REPO, stdin=subprocess.DEVNULL, stdout=logf,
                                             stderr=subprocess.STDOUT,
                                             env={**os.environ, "NOTIFY_SOCKET": notify_path,
                                                  **({"PODSHIM_TRACE": "1"} if self.trace else {})})
            deadline = time.monotonic() + START_TIMEOUT
            while time.monotonic() < deadline:
                ready, _, _ = select.select([notify], [], [], 0.2)
                if ready and "READY=1" in notify.recv(4096).decode().splitlines():
                    return
                if self.proc.poll() is not None:
                    raise RuntimeError(f"podshimd exited with {self.proc.returncode}: {self.log_tail()}")
            raise RuntimeError(f"podshimd sent no READY=1 in {START_TIMEOUT:.0f} s: {self.log_tail()}")
        finally:
            notify.close()
            os.unlink(notify_path)

    def log_tail(self) -> str:
        with open(os.path.join(self.dir, "podshimd.log"), errors="replace") as f:
            return f.read()[-1500:]

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, "podshimd", grace=15.0)

    def log_size(self) -> int:
        return os.path.getsize(os.path.join(self.dir, "podshimd.log"))

    def phases(self, start: int, end: int) -> dict[str, dict[str, float]]:
        """Median ms of each operation and of each of its phases (client.phases lines, PODSHIM_TRACE)
        in the log between byte offsets ``start`` and ``end``; a phase met twice in one operation
        counts their sum."""
        with open(os.path.join(self.dir, "podshimd.log"), "rb") as f:
            f.seek(start)
            text = f.read(end - start).decode(errors="replace")
        samples: dict[str, dict[str, list[float]]] = {}
        for line in text.splitlines():
            match = re.search(r"client\.phases\[\d+\][^:]*: (\w+) ([\d.]+) ms: (.*)$", line)
            if match is None:
                continue
            op, total, rest = match.group(1), float(match.group(2)), match.group(3)
            one: dict[str, float] = {}
            for part in rest.split(", "):
                name, _, value = part.rpartition(" ")
                one[name] = one.get(name, 0.0) + float(value)
            got = samples.setdefault(op, {})
            got.setdefault("total", []).append(total)
            for name, value in one.items():
                got.setdefault(name, []).append(value)
        return {op: {name: statistics.median(values) for name, values in got.items()} for op, got in samples.items()}


# -- the run ----------------------------------------------------------------------------------------

def ms(seconds: float) -> str:
    """Milliseconds, with two decimals below 10 ms (a gRPC call is a fraction of one)."""
    return f"{seconds * 1000:.2f}" if seconds < 0.01 else f"{seconds * 1000:.1f}"


def pull_pause_image(state_root: str, workdir: str) -> str:
    """Build tests/support/imagebuild.py's catatonit pause image, push it to a registry on the host's
    loopback and pull it into the image store under ``state_root`` (as podshimd would); its reference."""
    import asyncio

    from client.images.service import Images
    from client.images.skopeo import RegistryHost

    from support.imagebuild import TestImages, catatonit_pause_image
    from support.registry import running_registry

    async def pull(ref: str, host: str) -> None:
        store = Images(state_root, hosts=(RegistryHost(host, (), True),))
        await asyncio.to_thread(store.open)
        try:
            await store.pull(ref)
        finally:
            await store.aclose()

    with running_registry() as registry:
        image = catatonit_pause_image(TestImages(registry, tempfile.mkdtemp(prefix="images-", dir=workdir)))
        asyncio.run(pull(image.ref, registry.host))
    return image.ref


def fill(rt: Runtime, count: int) -> list[str]:
    stub = rt.stub()
    from shim.cri.api import api_pb2
    return [stub.RunPodSandbox(api_pb2.RunPodSandboxRequest(config=pod_config(f"fill-{i}")), timeout=60).pod_sandbox_id
            for i in range(count)]


def drain(rt: Runtime) -> None:
    from shim.cri.api import api_pb2
    stub = rt.stub()
    for pod in stub.ListPodSandbox(api_pb2.ListPodSandboxRequest(), timeout=60).items:
        stub.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=pod.id), timeout=60)
        stub.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=pod.id), timeout=60)


def list_p50(runtimes: list[Runtime], calls: int, crictl_calls: int) -> dict[str, tuple[float, float, int, float]]:
    """Per runtime: (p50 of ListPodSandbox by gRPC, p50 of ``crictl pods -q``, pods listed, p50
    of Version by gRPC: what any call costs there, the floor under the listing)."""
    from shim.cri.api import api_pb2
    grpc_t: dict[str, list[float]] = {rt.key: [] for rt in runtimes}
    cli_t: dict[str, list[float]] = {rt.key: [] for rt in runtimes}
    version_t: dict[str, list[float]] = {rt.key: [] for rt in runtimes}
    count: dict[str, int] = {}
    for i in range(calls):
        for rt in (runtimes if i % 2 == 0 else runtimes[::-1]):
            t0 = time.perf_counter()
            items = rt.stub().ListPodSandbox(api_pb2.ListPodSandboxRequest(), timeout=60).items
            grpc_t[rt.key].append(time.perf_counter() - t0)
            count[rt.key] = len(items)
            t0 = time.perf_counter()
            rt.stub().Version(api_pb2.VersionRequest(), timeout=60)
            version_t[rt.key].append(time.perf_counter() - t0)
    for i in range(crictl_calls):
        for rt in (runtimes if i % 2 == 0 else runtimes[::-1]):
            t0 = time.perf_counter()
            rt.crictl("pods", "-q")
            cli_t[rt.key].append(time.perf_counter() - t0)
    return {k: (statistics.median(grpc_t[k]), statistics.median(cli_t[k]), count[k], statistics.median(version_t[k]))
            for k in grpc_t}


def restart(psd: PodshimdProc, rt: Runtime, pods: list[str]) -> tuple[float, float]:
    """SIGKILL podshimd, start it again; (seconds to READY=1, seconds until every pod answered)."""
    from shim.cri.api import api_pb2
    rt.close()
    t0 = time.perf_counter()
    assert psd.proc is not None
    psd.proc.kill()
    psd.proc.wait()
    psd.start()
    ready = time.perf_counter() - t0
    stub = rt.stub()
    for pod in pods:
        status = stub.PodSandboxStatus(api_pb2.PodSandboxStatusRequest(pod_sandbox_id=pod), timeout=60)
        if status.status.state != api_pb2.SANDBOX_READY:
            raise RuntimeError(f"pod {pod} is {status.status.state} after the restart")
    return ready, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cycles", type=int, default=30, help="interleaved runp/stopp/rmp cycles of each runtime (30)")
    p.add_argument("--pods", type=int, default=100, help="pods present for ListPodSandbox and the restart (100)")
    p.add_argument("--no-containerd", action="store_true", help="measure podshimd alone")
    p.add_argument("--sandbox-image", action="store_true",
                   help="also a podshimd whose sandbox_image is a catatonit pause image, beside the built-in pause")
    p.add_argument("--trace", action="store_true",
                   help="run podshimd with PODSHIM_TRACE=1 and print the median of each phase of its cycles")
    args = p.parse_args(argv)
    if args.cycles < 1 or args.pods < 1:
        p.error("--cycles and --pods must be positive")
    if not_root("it makes a network namespace and starts two CRI runtimes"):
        return 2
    janitor = Janitor()
    janitor.install()
    notes: list[str] = []
    try:
        workdir = janitor.workdir("crib-")
        janitor.add("unmount what is left under the work directory", unmount_under, workdir)
        janitor.add("kill leftover processes", kill_leftovers, workdir)
        ns_name = f"crib-{secrets.token_hex(3)}"
        run(["ip", "netns", "add", ns_name])
        janitor.add("delete the network namespace", run, ["ip", "netns", "delete", ns_name])
        netns = f"/run/netns/{ns_name}"
        run(["ip", "-n", ns_name, "link", "set", "lo", "up"])

        traced: dict[str, PodshimdProc] = {}  # whose phases --trace reports
        runtimes: list[Runtime] = []

        def start_podshimd(key: str, directory: str, config: str = "") -> PodshimdProc:
            """Start a podshimd in ``directory`` (its CNI config there already), as runtime ``key``; the
            janitor removes its pods, stops it and its shim template, then removes any netns its pods'
            records named."""
            psd = PodshimdProc(directory, netns, trace=args.trace, config=config)
            traced[key] = psd
            left: set[str] = set()  # what its pod records name, read before the pods are removed
            janitor.add(f"remove the netns {key}'s pods left", lambda: janitor.failures.extend(
                f"{key} left the netns {path} of a removed pod (removed now)" for path in remove_netns(left)))
            janitor.add(f"stop {key}'s shim template", stop_template, os.path.join(directory, "run"))
            janitor.add(f"stop {key}", psd.stop)
            psd.start()
            rt = Runtime(key, "unix://" + psd.sock)
            runtimes.append(rt)

            def remove_pods() -> None:
                left.update(podshimd_netns(os.path.join(directory, "state")))
                drain(rt)
            janitor.add(f"remove {key}'s pods", remove_pods)
            return psd

        psd_dir = os.path.join(workdir, "psd")
        os.makedirs(psd_dir)
        cni_conf(psd_dir, "crib-ps0", "10.231.0.0/16")
        psd = start_podshimd("podshimd", psd_dir)

        if args.sandbox_image:
            img_dir = os.path.join(workdir, "psd-image")
            os.makedirs(img_dir)
            cni_conf(img_dir, "crib-ps1", "10.233.0.0/16")
            ref = pull_pause_image(os.path.join(img_dir, "state"), workdir)
            start_podshimd("podshimd+image", img_dir, config=f'sandbox_image = "{ref}"\n')
            notes.append(f"podshimd+image: sandbox_image {ref} (catatonit -P from a snapshot), pulled before the run")

        if not args.no_containerd:
            cd_dir = os.path.join(workdir, "cd")
            os.makedirs(cd_dir)
            cni_conf(cd_dir, "crib-cd0", "10.232.0.0/16")
            remove_runc_root_later(janitor)
            cd = CriContainerd(cd_dir, janitor)
            if os.environ.get("CRIB_KEEP_LOG"):
                janitor.add("keep containerd's log", lambda d, o: run(["sh", "-c", f"cat {d}/containerd.log {d}/state/io.containerd.runtime.v2.task/k8s.io/*/log.json > {o}"], check=False), cd_dir,
                            os.environ["CRIB_KEEP_LOG"])
            real_popen = subprocess.Popen

            def in_netns(argv: list[str], *a: Any, **kw: Any) -> subprocess.Popen[bytes]:
                return real_popen(["nsenter", f"--net={netns}", "--", *argv], *a, **kw)
            # PrivateContainerd.start's one Popen, run in the netns: a function where the class was.
            subprocess.Popen = in_netns  # type: ignore[misc, assignment]  # (see the line above)
            try:
                version = cd.start()
            finally:
                subprocess.Popen = real_popen  # type: ignore[misc]  # (the class back: mypy sees a class assigned)
            image = os.path.join(workdir, "pause.tar")
            build_pause_image(image)
            run(["ctr", "-a", cd.sock, "-n", "k8s.io", "image", "import", "--index-name", IMAGE, image], timeout=120)
            cd_rt = Runtime("containerd", "unix://" + cd.sock)
            runtimes.append(cd_rt)
            notes.append(f"containerd {version} (Debian), CRI plugin, runc {run(['runc', '--version']).stdout.split()[2]}")

        scratch = os.path.join(workdir, "pods")
        os.makedirs(scratch)
        for rt in runtimes:  # warm-up: podshimd's first pod starts its shim template
            cycle(rt, scratch)
        load_before = os.getloadavg()
        log_starts = {key: proc.log_size() for key, proc in traced.items()}
        for i in range(args.cycles):
            for rt in (runtimes if i % 2 == 0 else runtimes[::-1]):
                rt.cycles.append(cycle(rt, scratch))
            for rt in (runtimes[::-1] if i % 2 == 0 else runtimes):
                rt.floors.append(floor(rt))
            log(f"cycle {i + 1}/{args.cycles}: " + ", ".join(f"{rt.key} {ms(rt.cycles[-1])} ms" for rt in runtimes))
        phases = {key: proc.phases(log_starts[key], proc.log_size()) for key, proc in traced.items()}
        for rt in runtimes:
            log(f"starting {args.pods} pods on {rt.key}")
            rt.pods = fill(rt, args.pods)  # type: ignore[attr-defined]
        lists = list_p50(runtimes, 50, 10)
        ready, answered = restart(psd, runtimes[0], runtimes[0].pods)  # type: ignore[attr-defined]
        load_after = os.getloadavg()
    finally:
        janitor.run()

    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    out = [f"CRI bench, {date}, {os.cpu_count()} CPUs, load average {load_before[0]:.2f} before / "
           f"{load_after[0]:.2f} after; `python3 bench/cri_cycle.py --cycles {args.cycles} --pods {args.pods}`", ""]
    others = runtimes[1:]
    out += ["| figure | " + " | ".join(rt.key for rt in runtimes)
            + "".join(f" | {rt.key} ÷ podshimd" for rt in others) + " |",
            "|---" * (len(runtimes) + 1 + len(others)) + "|"]

    def row(name: str, values: list[float]) -> str:
        ratios = "".join(f" {v / values[0]:.2g}x |" for v in values[1:])
        return f"| {name} | " + " | ".join(f"{ms(v)} ms" for v in values) + " |" + ratios
    out.append(row(f"crictl runp→stopp→rmp, median of {args.cycles}", [statistics.median(rt.cycles) for rt in runtimes]))
    out.append(row(f"crictl runp→stopp→rmp, p90 of {args.cycles}", [percentile(rt.cycles, 90) for rt in runtimes]))
    out.append(row(f"floor: 3 × `crictl version`, median of {args.cycles}", [statistics.median(rt.floors) for rt in runtimes]))
    out.append(row("cycle minus floor (medians)", [statistics.median(rt.cycles) - statistics.median(rt.floors)
                                                   for rt in runtimes]))
    out.append(row(f"ListPodSandbox, {args.pods} pods, gRPC from Python, p50 of 50",
                   [lists[rt.key][0] for rt in runtimes]))
    out.append(row("Version, gRPC from Python (the floor of a call), p50 of 50", [lists[rt.key][3] for rt in runtimes]))
    out.append(row(f"`crictl pods -q`, {args.pods} pods, p50 of 10", [lists[rt.key][1] for rt in runtimes]))
    out.append(f"| podshimd kill -9 + restart, {args.pods} live pods: to READY=1 / every pod READY in "
               f"PodSandboxStatus | {ms(ready)} / {ms(answered)} ms |" + " — |" * (2 * len(others)))
    for key, got_phases in phases.items():
        if not got_phases:
            continue
        out += ["", f"{key}'s side of a cycle (PODSHIM_TRACE), medians in ms:", ""]
        for op, got in got_phases.items():
            out.append(f"- {op} {got['total']:.1f}: " + ", ".join(f"{name} {value:.1f}" for name, value in got.items()
                                                                 if name != "total"))
    out += ["", *notes]
    print("\n".join(out + janitor.problems()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
