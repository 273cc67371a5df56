"""Pod start-up through kubelet, and the runtime's memory for idle pods: podshimd beside containerd.

    python bench/k8s_startup.py [--pods 100] [--runtimes podshimd,containerd]

One run brings up a cluster (bench/cluster.py) with one node per runtime, node N running the N-th,
pulls the busybox image on every node first, then, one node at a time: a Deployment of PODS idle
busybox pods (``sleep``) pinned to that node, each pod's time from creation to Running, then the
memory of the runtime for those PODS idle pods, then the Deployment deleted and its pods gone. The
cluster is taken down at the end, whatever happened. Prints Markdown tables and the machine's load.

Start-up: a watch (kubectl get pods --watch, in the cluster's network) stamps each pod when it is
first seen (its creation, by the ReplicaSet controller) and when it is first seen Running (every
container started, as kubelet reports it); p50 and p99 by nearest rank, and the time from the
Deployment's creation to the last pod Running. Both stamps are the same watch's, on this machine's
monotonic clock (the API's timestamps have whole seconds only).

Memory: the PSS (/proc/PID/smaps_rollup) of the node's processes, by what they are: the runtime's
daemon (podshimd, containerd), its shims (podshim's per-pod shims with their template and its
spare; containerd-shim-runc-v2), and the pods' pause processes (each runtime's sandbox process,
in the pods' cgroups); kubelet, kube-proxy and the containers themselves are not counted.

CPU: the node's CPU time from the Deployment's creation to its last pod Running (its cgroup's
cpuacct), and of that the part of kubelet, the runtime's daemon, its shims and the pods (pause
and containers), each from the /proc stat of the processes alive at the end (a shim's time from
its birth); "rest" is what the processes that ended meanwhile used (CNI plugins, runc, ...) and
kube-proxy's.

Kubelet's view of the runtime: from kubelet's own metrics (read through the API server before
and after the start), the CRI calls it made meanwhile by method, how many and their mean
latency as kubelet saw it (``kubelet_runtime_operations_duration_seconds``), and its PLEG
relists, which every pod's next step waits for (``kubelet_pleg_relist_duration_seconds``).
``--keep-logs DIR`` copies the cluster's logs there before it is taken down. ``--feature-gates``
sets kubelet's feature gates on every node (``EventedPLEG=true``: kubelet follows the runtime's
GetContainerEvents stream and relists only now and then).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import cluster as harness
from bench.common import memory, percentile, run_stamp

#: Bound on every wait for the pods of one node (start, delete).
WAIT = 900.0
#: Seconds the idle pods are left before their memory is read (the runtime settles).
SETTLE = 10.0

DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: NAME}
spec:
  replicas: PODS
  selector: {matchLabels: {app: NAME}}
  template:
    metadata: {labels: {app: NAME}}
    spec:
      nodeSelector: {kubernetes.io/hostname: NODE}
      terminationGracePeriodSeconds: 1
      enableServiceLinks: false
      automountServiceAccountToken: false
      containers:
      - name: idle
        image: IMAGE
        imagePullPolicy: IfNotPresent
        command: ["sleep", "1000000"]
"""


def log(text: str) -> None:
    print(f"k8s_startup: {text}", file=sys.stderr, flush=True)


@dataclass
class Watch:
    """``kubectl get pods --watch`` for a label: when each pod was first seen, and first seen Running."""

    c: harness.Cluster
    selector: str
    seen: dict[str, float] = field(default_factory=dict)
    running: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.errors = tempfile.TemporaryFile("w+")
        self.process = subprocess.Popen(
            self.c.kubectl_argv("get", "pods", "-l", self.selector, "--watch", "--request-timeout=0",
                                "-o", "jsonpath={.metadata.name} {.status.phase}{\"\\n\"}"),
            stdout=subprocess.PIPE, stderr=self.errors, stdin=subprocess.DEVNULL, text=True)
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            now = time.monotonic()
            name, _, phase = line.strip().partition(" ")
            if not name:
                continue
            with self.lock:
                self.seen.setdefault(name, now)
                if phase == "Running":
                    self.running.setdefault(name, now)

    def wait_running(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                done = len(self.running)
            if done >= count:
                return
            if self.process.poll() is not None:
                self.errors.seek(0)
                raise RuntimeError(f"the pod watch ended (status {self.process.returncode}) at {done} of {count}: "
                                   f"{self.errors.read()[-500:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{done} of {count} pods Running within {timeout:.0f} s")
            time.sleep(0.2)

    def close(self) -> None:
        self.process.kill()
        self.process.wait()
        self.reader.join(10)
        self.errors.close()


@dataclass
class Result:
    runtime: str
    node: str
    pods: int
    latencies: list[float]     #: per pod, seconds from first seen to Running
    all_running: float         #: seconds from the Deployment's creation to the last pod Running
    memory: dict[str, tuple[int, int]]  #: part -> (processes, PSS KiB)
    cpu: dict[str, float]      #: part -> CPU seconds from the Deployment's creation to all Running
    calls: dict[str, tuple[int, float]]  #: kubelet's runtime operation (or "PLEG relist") -> (calls, mean s)


def pull_everywhere(c: harness.Cluster) -> None:
    """The image on every node before anything is timed: one pod per node, run and removed."""
    for node in c.nodes():
        name = f"pull-{node['name']}"
        c.kubectl("run", name, f"--image={harness.BUSYBOX}", "--restart=Never",
                  f"--overrides={json.dumps({'spec': {'nodeName': node['name']}})}", "--", "true")
    for node in c.nodes():
        c.kubectl("wait", f"pod/pull-{node['name']}", "--for=jsonpath={.status.phase}=Succeeded", "--timeout=300s",
                  timeout=320)
    c.kubectl("delete", "pods", *[f"pull-{n['name']}" for n in c.nodes()], "--wait=true", timeout=120)


def start_pods(c: harness.Cluster, node: dict[str, Any], pods: int
               ) -> tuple[list[float], float, dict[str, float], dict[str, tuple[int, float]]]:
    """Start the Deployment of ``pods`` on ``node``: each pod's start-up, the time until all are
    Running, the node's CPU meanwhile (:meth:`CpuSample.since`) and kubelet's runtime calls and
    relists (:func:`histogram_since`)."""
    name = f"startup-{node['name']}"
    watch = Watch(c, f"app={name}")
    try:
        time.sleep(2)  # the watch is established before the first pod is made
        cpu = CpuSample.take(c, node)
        calls = kubelet_histograms(c, node)
        started = time.monotonic()
        c.kubectl("apply", "-f", "-", input=DEPLOYMENT.replace("NAME", name).replace("PODS", str(pods))
                  .replace("NODE", node["name"]).replace("IMAGE", harness.BUSYBOX))
        watch.wait_running(pods, WAIT)
        used = CpuSample.take(c, node).since(cpu)
        calls_made = histogram_since(kubelet_histograms(c, node), calls)
        with watch.lock:
            latencies = [watch.running[p] - watch.seen[p] for p in watch.running]
            last = max(watch.running.values())
    finally:
        watch.close()
    return latencies, last - started, used, calls_made


def remove_pods(c: harness.Cluster, node: dict[str, Any]) -> None:
    name = f"startup-{node['name']}"
    c.kubectl("delete", "deployment", name, "--wait=true", timeout=120)
    deadline = time.monotonic() + WAIT
    while json.loads(c.kubectl("get", "pods", "-l", f"app={name}", "-o", "json", timeout=60).stdout)["items"]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the pods of {name} were not gone within {WAIT:.0f} s")
        time.sleep(2)


#: The parts of a node's processes the bench reports, in its tables' order.
PARTS = ("kubelet", "daemon", "shims", "pods")


def node_parts(c: harness.Cluster, node: dict[str, Any]) -> dict[int, tuple[str, str]]:
    """Each process of node's, by pid: (its part, its command name). The parts are kubelet, the
    runtime's daemon, its shims (the node's other processes) and the pods' (pause and containers,
    in the pods' cgroups); kube-proxy and the node's namespace holder are "other"."""
    labels = c.state.data["processes"]
    daemon = labels[f"{node['name']}-{node['runtime']}"]
    kubelet = labels[f"{node['name']}-kubelet"]
    others = {labels[f"{node['name']}-{what}"] for what in ("kube-proxy", "holder")}
    found = {}
    for pid, comm in c.node_processes(node["number"]).items():
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                in_pod = "/kubepods" in f.read()
        except OSError:
            continue  # gone meanwhile
        if pid == daemon:
            part = "daemon"
        elif pid == kubelet:
            part = "kubelet"
        elif in_pod:
            part = "pods"
        elif pid in others:
            part = "other"
        else:
            part = "shims"
        found[pid] = (part, comm)
    return found


def node_memory(c: harness.Cluster, node: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """The PSS of node's runtime by part: (processes, KiB) for daemon, shims and pause."""
    parts: dict[str, tuple[int, int]] = {"daemon": (0, 0), "shims": (0, 0), "pause": (0, 0)}
    for pid, (part, comm) in node_parts(c, node).items():
        if part == "pods":
            if comm != "catatonit":
                continue  # a container's own process
            part = "pause"
        elif part not in parts:
            continue
        try:
            pss = memory(pid).pss
        except OSError:
            continue  # gone meanwhile
        count, total = parts[part]
        parts[part] = (count + 1, total + pss)
    return parts


def process_cpu(pid: int) -> float:
    """The CPU seconds (user + system) ``pid`` has used, its reaped children not counted."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rfind(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cgroup_cpu(node: dict[str, Any]) -> float:
    """The CPU seconds every process of the node has used (its cgroup's cpuacct, or v2's cpu.stat)."""
    for path in node["cgroup"]["paths"].values():
        with contextlib.suppress(FileNotFoundError):
            with open(os.path.join(path, "cpuacct.usage")) as f:
                return int(f.read()) / 1e9
        with contextlib.suppress(FileNotFoundError):
            with open(os.path.join(path, "cpu.stat")) as f:
                return next(int(line.split()[1]) for line in f if line.startswith("usage_usec ")) / 1e6
    raise RuntimeError(f"the node {node['name']}'s cgroup has no CPU accounting")


#: kubelet's histograms the bench reads: (metric, the label that tells its series apart).
KUBELET_HISTOGRAMS = (("kubelet_runtime_operations_duration_seconds", "operation_type"),
                      ("kubelet_pleg_relist_duration_seconds", ""))


def kubelet_histograms(c: harness.Cluster, node: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """kubelet's :data:`KUBELET_HISTOGRAMS` on ``node``: series -> (count, sum of seconds); a
    runtime operation's series is its operation type, the relists' "PLEG relist"."""
    text = c.kubectl("get", "--raw", f"/api/v1/nodes/{node['name']}/proxy/metrics", timeout=60).stdout
    found: dict[str, list[float]] = {}
    for line in text.splitlines():
        for metric, label in KUBELET_HISTOGRAMS:
            for suffix, index in (("_count", 0), ("_sum", 1)):
                if not line.startswith(metric + suffix):
                    continue
                head, _, value = line.rpartition(" ")
                series = "PLEG relist"
                if label:
                    marker = f'{label}="'
                    start = head.find(marker)
                    if start < 0:
                        continue
                    series = head[start + len(marker):head.index('"', start + len(marker))]
                found.setdefault(series, [0.0, 0.0])[index] = float(value)
    return {series: (count, total) for series, (count, total) in found.items()}


def histogram_since(after: dict[str, tuple[float, float]],
                    before: dict[str, tuple[float, float]]) -> dict[str, tuple[int, float]]:
    """Each series' calls and their mean seconds between two readings of :func:`kubelet_histograms`
    (series without a call meanwhile left out)."""
    out = {}
    for series, (count, total) in after.items():
        count0, total0 = before.get(series, (0.0, 0.0))
        if count > count0:
            out[series] = (int(count - count0), (total - total0) / (count - count0))
    return out


@dataclass
class CpuSample:
    """The node's CPU seconds at one moment: its cgroup's total, and each live process's."""

    total: float
    processes: dict[int, tuple[str, float]]  #: pid -> (part, CPU seconds)

    @classmethod
    def take(cls, c: harness.Cluster, node: dict[str, Any]) -> CpuSample:
        processes = {}
        for pid, (part, _) in node_parts(c, node).items():
            with contextlib.suppress(OSError):
                processes[pid] = (part, process_cpu(pid))
        return cls(cgroup_cpu(node), processes)

    def since(self, start: CpuSample) -> dict[str, float]:
        """CPU seconds from ``start`` to this sample: "node" in all, and each of :data:`PARTS`;
        "rest" is the node's time not in those parts (processes that ended meanwhile, kube-proxy)."""
        used = {"node": self.total - start.total, **{part: 0.0 for part in PARTS}}
        for pid, (part, seconds) in self.processes.items():
            if part in PARTS:
                used[part] += seconds - start.processes.get(pid, (part, 0.0))[1]
        used["rest"] = used["node"] - sum(used[part] for part in PARTS)
        return used


def measure(c: harness.Cluster, pods: int) -> list[Result]:
    results = []
    for node in c.nodes():
        log(f"{pods} pods on {node['name']} ({node['runtime']})")
        latencies, all_running, cpu, calls = start_pods(c, node, pods)
        time.sleep(SETTLE)
        parts = node_memory(c, node)
        results.append(Result(node["runtime"], node["name"], pods, latencies, all_running, parts, cpu, calls))
        remove_pods(c, node)
    return results


def mib(kib: int) -> str:
    return f"{kib / 1024:.1f}"


def tables(results: list[Result]) -> str:
    out = ["#### Pod start-up through kubelet (create to Running, s)", "",
           "| runtime | node | pods | p50 | p99 | max | all Running after |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in results:
        out.append(f"| {r.runtime} | {r.node} | {len(r.latencies)} | {percentile(r.latencies, 50):.2f} | "
                   f"{percentile(r.latencies, 99):.2f} | {max(r.latencies):.2f} | {r.all_running:.1f} |")
    out += ["", f"#### Node memory for {results[0].pods} idle pods (PSS, MiB; processes in brackets)", "",
            "| runtime | daemon | shims | daemon + shims | per pod | pauses | all |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        (dn, dk), (sn, sk), (pn, pk) = r.memory["daemon"], r.memory["shims"], r.memory["pause"]
        out.append(f"| {r.runtime} | {mib(dk)} ({dn}) | {mib(sk)} ({sn}) | {mib(dk + sk)} | "
                   f"{mib((dk + sk) // r.pods)} | {mib(pk)} ({pn}) | {mib(dk + sk + pk)} |")
    out += ["", "#### The node's CPU from the Deployment's creation to all Running (s)", "",
            "| runtime | node | " + " | ".join(PARTS) + " | rest |", "|---|---:|" + "---:|" * (len(PARTS) + 1)]
    for r in results:
        out.append(f"| {r.runtime} | {r.cpu['node']:.1f} | " + " | ".join(f"{r.cpu[p]:.1f}" for p in (*PARTS, "rest"))
                   + " |")
    series = sorted({s for r in results for s in r.calls}, key=lambda s: -max(r.calls.get(s, (0, 0.0))[0] for r in results))
    out += ["", "#### kubelet's runtime calls and PLEG relists meanwhile (calls, mean ms)", "",
            "| call | " + " | ".join(r.runtime for r in results) + " |", "|---|" + "---:|" * len(results)]
    for name in series:
        out.append(f"| {name} | " + " | ".join(f"{r.calls[name][0]}, {r.calls[name][1] * 1000:.1f}" if name in r.calls
                                             else "" for r in results) + " |")
    return "\n".join(out)


def feature_gates(text: str) -> dict[str, bool]:
    """``NAME=true,NAME=false`` as kubelet's ``featureGates`` field. Raises ValueError, saying what is wrong."""
    gates: dict[str, bool] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier() or value.lower() not in ("true", "false"):
            raise ValueError(f"{item!r} is not NAME=true or NAME=false")
        gates[name] = value.lower() == "true"
    return gates


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench/k8s_startup.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--runtimes", default="podshimd,containerd",
                        help="one node per runtime, comma-separated (default podshimd,containerd)")
    parser.add_argument("--name", default="k8s-startup", help="the cluster's name")
    parser.add_argument("--keep-logs", metavar="DIR", help="copy the cluster's logs (one per process) into DIR "
                        "before it is taken down")
    parser.add_argument("--feature-gates", default="", metavar="NAME=BOOL,...",
                        help="kubelet's feature gates on every node, e.g. EventedPLEG=true")
    args = parser.parse_args()
    try:
        gates = feature_gates(args.feature_gates)
    except ValueError as exc:
        print(f"bench/k8s_startup.py: --feature-gates: {exc}", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("bench/k8s_startup.py: run it as root (bench/cluster.py makes namespaces and cgroups)", file=sys.stderr)
        return 2
    runtimes = args.runtimes.split(",")
    try:
        harness.node_runtimes(len(runtimes), runtimes)
    except ValueError as exc:
        print(f"bench/k8s_startup.py: --runtimes: {exc}", file=sys.stderr)
        return 2
    if args.pods < 1:
        print("bench/k8s_startup.py: --pods must be at least 1", file=sys.stderr)
        return 2
    load_before = os.getloadavg()
    with harness.cluster(len(runtimes), args.name, runtimes, {"featureGates": gates} if gates else None) as c:
        try:
            pull_everywhere(c)
            results = measure(c, args.pods)
        finally:
            if args.keep_logs:
                shutil.copytree(c.state.file("logs"), args.keep_logs, dirs_exist_ok=True)
                log(f"the cluster's logs are in {args.keep_logs}")
    print(tables(results))
    if gates:
        print("\nkubelet's feature gates: " + ", ".join(f"{name}={str(on).lower()}" for name, on in gates.items()))
    print(f"\n{run_stamp(load_before)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
