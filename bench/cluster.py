"""A Kubernetes cluster on this one machine with podshimd (or containerd, the reference) as the nodes' runtime.

    python bench/cluster.py up [--nodes N] [--name NAME] [--runtime R[,R...]]
                                                            bring a cluster up and leave it running
    python bench/cluster.py kubectl [--name NAME] ARGS...   kubectl against it (its admin kubeconfig)
    python bench/cluster.py smoke [--nodes 2]               up, the smoke checks, down; one line of result
    python bench/cluster.py down [--name NAME]              remove everything the cluster's `up` made

`--runtime` is podshimd (the default) or containerd, for every node, or one per node
(``--runtime podshimd,containerd``: node1 podshimd, node2 containerd). As root. The Kubernetes
binaries, etcd and containerd are the ones .ci/pins.toml pins, built by .ci/gotool
into its cache (the first use builds them: tens of minutes). Tests import :func:`cluster`, a
context manager that brings a cluster up and always takes it down.

What `up` makes, all of it recorded in the cluster's directory (``/var/tmp/podshim-cluster/NAME``)
before it is made, so that `down` removes it after a failed `up` or a kill -9 of the harness too:

- one cgroup, ``podshim-cluster/NAME`` below the harness's own cgroup in every hierarchy; every
  process of the cluster runs in it (the control plane in ``control``, node N in ``nodeN``), so
  `down` kills them all by cgroup, whatever they forked, and then removes the cgroups;
- an outer network namespace, the cluster's network: a bridge with 10.99.0.1/24, where etcd,
  kube-apiserver (TLS with a CA made for the run, service-account keys, RBAC),
  kube-controller-manager (node CIDRs from 10.244.0.0/16, short node-lifecycle timeouts),
  kube-scheduler and a registry serving the cluster's images (10.99.0.1:5000) run; the machine's
  own network is never touched;
- per node, a "machine": its own network namespace (eth0 = 10.99.0.(10+N) on the bridge), mount
  namespace (its own /var/lib, so /var/lib/kubelet and /var/lib/podshim, /var/log, /run and
  sysfs, and the cgroup hierarchies mounted from its cgroup namespace, so that the node's cgroup
  is the root it sees), UTS namespace (hostname nodeN) and cgroup namespace; in it podshimd (or
  containerd with runc, its root, state and sockets under the node's directory),
  kubelet (cgroupfs driver; the pod CIDR the controller-manager gives the node) and kube-proxy
  (iptables); CNI bridge + host-local on the node's pod CIDR, with a route to every other
  node's pod CIDR through that node.

Every iptables rule, interface and mount the cluster makes is inside those namespaces, which go
when their last process does. Files are under the cluster's directory.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from shim.kernel.cgroups import SandboxCgroup, discover_hierarchies

from bench.compare.run import sweep, unmount_under

BASE = os.environ.get("PODSHIM_CLUSTER_DIR", "/var/tmp/podshim-cluster")
CGROUP_PARENT = "podshim-cluster"
KUBERNETES_TOOLS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy",
                    "kubectl", "coredns")
NETWORK = ipaddress.ip_network("10.99.0.0/24")
CONTROL_IP = "10.99.0.1"
BRIDGE = "cluster0"
CLUSTER_CIDR = "10.244.0.0/16"
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
#: The cluster's DNS: the Service kube-dns (as kubeadm makes it) in front of CoreDNS on the control plane.
DNS_SERVICE_IP = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
REGISTRY = f"{CONTROL_IP}:5000"
#: Where the tests run a registry behind basic auth (their own docker-registry): podshimd's
#: nodes speak plain HTTP to it, as to REGISTRY.
PRIVATE_REGISTRY = f"{CONTROL_IP}:5001"
#: The image every smoke pod runs: busybox, built here and pushed to the cluster's registry.
BUSYBOX = f"{REGISTRY}/podshim/busybox:1.0"
#: The sandbox image of containerd's nodes (podshimd needs none): catatonit alone, as
#: registry.k8s.io/pause is a lone binary.
PAUSE = f"{REGISTRY}/podshim/pause:1.0"
CATATONIT = "/usr/bin/catatonit"
#: The node runtimes: this checkout's podshimd, or the pinned containerd (runc) as the reference.
RUNTIMES = ("podshimd", "containerd")
CONTAINERD_TOOLS = ("containerd", "containerd-shim-runc-v2")
#: Bound on one command of the set-up and the tear-down.
TIMEOUT = 60.0
#: Bound on the wait for the API server, a node's registration and Ready.
READY_TIMEOUT = 300.0


def log(text: str) -> None:
    print(f"cluster: {text}", file=sys.stderr, flush=True)


def node_ip(number: int) -> str:
    return str(NETWORK.network_address + 10 + number)


def run(argv: Sequence[str], *, timeout: float = TIMEOUT, check: bool = True, input: str | None = None,
        **kwargs: Any) -> subprocess.CompletedProcess[str]:
    options: dict[str, Any] = {**kwargs, **({} if input is not None else {"stdin": subprocess.DEVNULL})}
    done = subprocess.run(list(argv), input=input, capture_output=True, text=True, timeout=timeout, **options)
    if check and done.returncode != 0:
        said = (done.stderr or done.stdout).strip()
        raise RuntimeError(f"{' '.join(argv[:8])} exited with status {done.returncode}: {said[-1500:]}")
    return done


# -- the record of what up made ---------------------------------------------------------------------

class State:
    """The cluster's directory and its record (state.json): written before each thing is made."""

    def __init__(self, name: str):
        self.name = name
        self.dir = os.path.join(BASE, name)
        self.path = os.path.join(self.dir, "state.json")
        self.data: dict[str, Any] = {}
        self.children: list[subprocess.Popen[bytes]] = []  # the processes this harness started, reaped by down
        with contextlib.suppress(FileNotFoundError):
            with open(self.path) as f:
                self.data = json.load(f)

    def save(self) -> None:
        with open(self.path + ".tmp", "w") as f:
            json.dump(self.data, f, indent=1)
        os.replace(self.path + ".tmp", self.path)

    def file(self, *parts: str) -> str:
        return os.path.join(self.dir, *parts)


# -- certificates -------------------------------------------------------------------------------------

class PKI:
    """A CA made for the run, and the certificates and keys signed by it (openssl)."""

    def __init__(self, directory: str):
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        self.ca = self.path("ca.crt")
        self.ca_key = self.path("ca.key")
        if not os.path.exists(self.ca):
            run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", self.ca_key])
            run(["openssl", "req", "-x509", "-new", "-key", self.ca_key, "-subj", "/CN=podshim-cluster-ca",
                 "-days", "7", "-out", self.ca, "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"])

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def issue(self, name: str, common_name: str, *, organization: str = "", ips: Sequence[str] = (),
              dns: Sequence[str] = (), server: bool = False) -> tuple[str, str]:
        """A key and a certificate for ``common_name`` (client, or server with the given names)."""
        key, cert = self.path(f"{name}.key"), self.path(f"{name}.crt")
        run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", key])
        subject = (f"/O={organization}" if organization else "") + f"/CN={common_name}"
        extensions = ["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
                      f"extendedKeyUsage={'serverAuth,clientAuth' if server else 'clientAuth'}"]
        names = [f"IP:{ip}" for ip in ips] + [f"DNS:{d}" for d in dns]
        if names:
            extensions.append("subjectAltName=" + ",".join(names))
        ext_file = self.path(f"{name}.ext")
        with open(ext_file, "w") as f:
            f.write("\n".join(extensions) + "\n")
        csr = run(["openssl", "req", "-new", "-key", key, "-subj", subject]).stdout
        run(["openssl", "x509", "-req", "-CA", self.ca, "-CAkey", self.ca_key, "-CAcreateserial", "-days", "7",
             "-extfile", ext_file, "-out", cert], input=csr)
        os.unlink(ext_file)
        return key, cert

    def service_account_keys(self) -> tuple[str, str]:
        key, public = self.path("sa.key"), self.path("sa.pub")
        run(["openssl", "genrsa", "-out", key, "2048"])
        run(["openssl", "rsa", "-in", key, "-pubout", "-out", public])
        return key, public


def kubeconfig(path: str, server: str, ca: str, cert: str, key: str, user: str) -> str:
    """A kubeconfig (JSON, which is YAML) for ``user`` with a client certificate."""
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "podshim",
              "clusters": [{"name": "podshim", "cluster": {"server": server, "certificate-authority": ca}}],
              "users": [{"name": user, "user": {"client-certificate": cert, "client-key": key}}],
              "contexts": [{"name": "podshim", "context": {"cluster": "podshim", "user": user}}]}
    with open(path, "w") as f:
        json.dump(config, f, indent=1)
    return path


# -- processes in namespaces and cgroups ------------------------------------------------------------

def _cgroup(record: dict[str, Any]) -> SandboxCgroup:
    return SandboxCgroup.from_dict(record)


def spawn(state: State, label: str, argv: Sequence[str], *, cgroup: dict[str, Any], nsenter: Sequence[str] = (),
          env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` in the cgroup ``cgroup`` (moved there before it execs, so everything it forks
    is there too), in the namespaces ``nsenter`` names, its output in logs/LABEL.log; recorded."""
    group = _cgroup(cgroup)
    logs = state.file("logs")
    os.makedirs(logs, exist_ok=True)
    full = ["nsenter", *nsenter, "--", *argv] if nsenter else list(argv)
    # How to start it again (Cluster.start): the environment as what it adds to ours.
    state.data.setdefault("commands", {})[label] = {
        "argv": full, "cgroup": cgroup,
        "env": {k: v for k, v in (env or {}).items() if os.environ.get(k) != v} if env is not None else None}
    with open(os.path.join(logs, f"{label}.log"), "ab") as out:
        process = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True, env=env, preexec_fn=lambda: group.join(0))
    state.children.append(process)
    state.data.setdefault("processes", {})[label] = process.pid
    state.save()
    return process


def nsenter_args(holder: int, node: bool) -> list[str]:
    if node:
        return [f"--target={holder}", "--net", "--mount", "--uts", "--cgroup"]
    return [f"--net=/proc/{holder}/ns/net"]


def in_ns(holder: int, argv: Sequence[str], *, node: bool, cgroup: dict[str, Any] | None = None,
          check: bool = True, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to its end in a holder's namespaces (and, for a node, in its cgroup first, so
    that the node's cgroup namespace is where it stands)."""
    group = _cgroup(cgroup) if cgroup else None
    return run(["nsenter", *nsenter_args(holder, node), "--", *argv], check=check, timeout=timeout,
               preexec_fn=(lambda: group.join(0)) if group else None)


def start_holder(state: State, label: str, cgroup: dict[str, Any], namespaces: Sequence[str]) -> int:
    """A process that holds new namespaces open (``unshare ... sleep``), started in ``cgroup``;
    its pid once its network namespace is not ours."""
    process = spawn(state, label, ["unshare", *namespaces, "--", "sleep", "infinity"], cgroup=cgroup)
    ours = os.readlink("/proc/self/ns/net")
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{process.pid}/ns/net") != ours and \
                    os.readlink(f"/proc/{process.pid}/exe").endswith("sleep"):
                return process.pid
        if process.poll() is not None:
            raise RuntimeError(f"{label} exited with status {process.returncode}: see {state.file('logs')}")
        time.sleep(0.05)
    raise RuntimeError(f"{label} did not make its namespaces within {TIMEOUT:.0f} s")


def _mounted_on(holder: int, roots: Sequence[str]) -> list[str]:
    """The mount points of the mounts made on the mounts visible at ``roots`` in the mount
    namespace of ``holder`` (its mounts copied from the machine's, hidden below them, are not)."""
    with open(f"/proc/{holder}/mountinfo") as f:
        mounts = [(int(fields[0]), int(fields[1]), fields[4]) for fields in (line.split() for line in f)]
    children: dict[int, list[tuple[int, str]]] = {}
    for mount_id, parent, point in mounts:
        children.setdefault(parent, []).append((mount_id, point))
    found = []
    for root in roots:
        # The visible mount at ``root``: the one on which nothing is mounted at ``root`` again.
        on_root = [mount_id for mount_id, _, point in mounts if point == root]
        top = [m for m in on_root if not any(point == root for _, point in children.get(m, []))]
        found += [point for top_id in top for _, point in children.get(top_id, [])]
    return found


def _wait_exited(pid: int, children: Sequence[subprocess.Popen[bytes]], label: str) -> None:
    """Wait (bounded) until ``pid`` has exited, reaping it when it is one of ``children``."""
    for child in children:
        if child.pid == pid:
            child.wait(TIMEOUT)
            return
    deadline = time.monotonic() + TIMEOUT
    while os.path.exists(f"/proc/{pid}"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{label} (pid {pid}) did not exit within {TIMEOUT:.0f} s")
        time.sleep(0.05)


# -- tools --------------------------------------------------------------------------------------------

def tool_paths(names: Sequence[str] = KUBERNETES_TOOLS) -> dict[str, str]:
    """The pinned binaries (built by .ci/gotool into its cache first when missing)."""
    from support.critools import gotool

    return {name: gotool.tool_path(name) for name in names}


# -- up -----------------------------------------------------------------------------------------------

class Cluster:
    """A cluster brought up by :meth:`up`; :meth:`down` removes it (also one that `up` left half made)."""

    def __init__(self, name: str = "podshim"):
        self.state = State(name)
        self.name = name

    # ---- access
    @property
    def admin_kubeconfig(self) -> str:
        return self.state.file("pki", "admin.kubeconfig")

    def kubectl(self, *args: str, check: bool = True, timeout: float = TIMEOUT,
                input: str | None = None) -> subprocess.CompletedProcess[str]:
        """kubectl ARGS against the cluster (run in its network), to its end."""
        return run(self.kubectl_argv(*args), check=check, timeout=timeout, input=input)

    def kubectl_argv(self, *args: str) -> list[str]:
        """The command line of kubectl ARGS against the cluster, in its network."""
        data = self.state.data
        return ["nsenter", f"--net=/proc/{data['outer']}/ns/net", "--", data["tools"]["kubectl"],
                f"--kubeconfig={self.admin_kubeconfig}", *args]

    def nodes(self) -> list[dict[str, Any]]:
        nodes: list[dict[str, Any]] = self.state.data.get("nodes", [])
        return nodes

    def in_node(self, number: int, argv: Sequence[str], *, check: bool = True,
                timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
        node = self.nodes()[number - 1]
        return in_ns(node["holder"], argv, node=True, cgroup=node["cgroup"], check=check, timeout=timeout)

    def node_processes(self, number: int) -> dict[int, str]:
        """Every process of node ``number`` (in its cgroup or below): pid -> command name."""
        found = {}
        for pid in _cgroup(self.nodes()[number - 1]["cgroup"]).pids():
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/comm") as f:
                    found[pid] = f.read().strip()
        return found

    # ---- faults: a process of the cluster stopped and started again, a node rebooted
    def kill(self, label: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the cluster's process ``label`` (as `up` named it: ``node2-kubelet``) and
        wait until it has exited."""
        pid = self.state.data["processes"][label]
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        _wait_exited(pid, self.state.children, label)
        self._forget([pid])

    def _forget(self, pids: Sequence[int]) -> None:
        """Drop exited processes from the record of those that must be alive (:meth:`start`
        records them again)."""
        processes = self.state.data["processes"]
        for label in [label for label, pid in processes.items() if pid in pids]:
            del processes[label]
        self.state.save()

    def start(self, label: str) -> None:
        """Start the cluster's process ``label`` again, as `up` started it (after :meth:`kill`)."""
        record = self.state.data["commands"][label]
        env = None if record["env"] is None else {**os.environ, **record["env"]}
        spawn(self.state, label, record["argv"], cgroup=record["cgroup"], env=env)

    def reboot(self, number: int) -> None:
        """Node ``number`` loses power and boots again: every process of it is killed (its
        runtime, kubelet, kube-proxy, shims and containers), its mounts below /run, /var/lib/kubelet
        and /var/lib/podshim go and /run is emptied, as a reboot does; then its runtime, kubelet
        and kube-proxy start again (its disk, /var/lib and /var/log, is what it was)."""
        node = self.nodes()[number - 1]
        name, group = node["name"], _cgroup(node["cgroup"])
        victims = [pid for pid in group.pids() if pid != node["holder"]]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in victims:
            _wait_exited(pid, self.state.children, f"{name} pid {pid}")
        self._forget(victims)
        # What was mounted on the node's /run and /var/lib (its own bind mounts of them stay:
        # they are its disks); a lazy unmount takes what is below with it.
        mounted = _mounted_on(node["holder"], ("/run", "/var/lib"))
        for path in mounted:
            self.in_node(number, ["umount", "-l", path])
        if left := _mounted_on(node["holder"], ("/run", "/var/lib")):
            raise RuntimeError(f"{name} still has {', '.join(left)} mounted after unmounting them")
        self.in_node(number, ["sh", "-c", "find /run -mindepth 1 -delete && mkdir -p /run/podshim"])
        runtime = node.get("runtime", "podshimd")
        self.start(f"{name}-{runtime}")
        self._wait_socket(number, node["socket"], f"{name}-{runtime}")
        self.start(f"{name}-kubelet")
        self.start(f"{name}-kube-proxy")

    # ---- up
    def up(self, nodes: int = 2, runtime: str | Sequence[str] = "podshimd",
           kubelet: dict[str, Any] | None = None) -> Cluster:
        """Bring the cluster up: control plane, then ``nodes`` nodes, all Ready, whose runtime is
        ``runtime`` (one for all, or one per node), their kubelets' configuration with the fields
        of ``kubelet`` put over the harness's. On failure everything made is removed and the
        error raised (with the logs' directory named)."""
        runtimes = node_runtimes(nodes, runtime)
        if os.path.exists(self.state.path):
            raise RuntimeError(f"a cluster {self.name!r} exists ({self.state.dir}): `down --name {self.name}` first")
        started = time.monotonic()
        try:
            self._up(runtimes, kubelet or {})
        except BaseException:
            logs = self.save_logs()
            log(f"up failed after {time.monotonic() - started:.0f} s; the logs are in {logs}")
            self.down()
            raise
        log(f"up: {nodes} node(s) ({', '.join(runtimes)}) Ready in {time.monotonic() - started:.0f} s")
        return self

    def _up(self, runtimes: Sequence[str], kubelet: dict[str, Any]) -> None:
        state = self.state
        os.makedirs(state.dir, exist_ok=True)
        state.data = {"name": self.name, "created": time.time(), "nodes": [], "kubelet": kubelet}
        state.save()
        state.data["tools"] = tool_paths(KUBERNETES_TOOLS + (CONTAINERD_TOOLS if "containerd" in runtimes else ()))
        # The cluster's cgroup first: everything below runs in it.
        state.data["cgroup_parent"] = [h.mountpoint + os.path.join(h.own_path, CGROUP_PARENT)
                                       for h in discover_hierarchies()]
        state.save()
        root = SandboxCgroup.create(self.name, parent=CGROUP_PARENT)
        state.data["cgroup"] = root.to_dict()
        state.save()
        control = root.child("control")
        state.data["control_cgroup"] = control.to_dict()
        state.save()
        outer = start_holder(state, "outer-net", control.to_dict(), ["--net"])
        state.data["outer"] = outer
        state.save()
        for command in (["ip", "link", "set", "lo", "up"],
                        ["ip", "link", "add", BRIDGE, "type", "bridge"],
                        ["ip", "addr", "add", f"{CONTROL_IP}/{NETWORK.prefixlen}", "dev", BRIDGE],
                        ["ip", "link", "set", BRIDGE, "up"],
                        ["sysctl", "-qw", "net.ipv4.ip_forward=1"]):
            in_ns(outer, command, node=False)
        self._control_plane()
        self._dns()
        self._registry()
        for number, runtime in enumerate(runtimes, 1):
            self._node(number, runtime)
        self._network_and_ready(len(runtimes))

    def _control_plane(self) -> None:
        state, tools, outer = self.state, self.state.data["tools"], self.state.data["outer"]
        control = state.data["control_cgroup"]
        ns = nsenter_args(outer, False)
        pki = PKI(state.file("pki"))
        server = f"https://{CONTROL_IP}:6443"
        api_key, api_cert = pki.issue("apiserver", "kube-apiserver", server=True,
                                      ips=[CONTROL_IP, KUBERNETES_SERVICE_IP, "127.0.0.1"],
                                      dns=["kubernetes", "kubernetes.default", "kubernetes.default.svc",
                                           "kubernetes.default.svc.cluster.local", "localhost"])
        kubelet_client = pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                                   organization="system:masters")
        sa_key, sa_pub = pki.service_account_keys()
        for name, user, org in (("admin", "admin", "system:masters"),
                                ("controller-manager", "system:kube-controller-manager", ""),
                                ("scheduler", "system:kube-scheduler", ""),
                                ("kube-proxy", "system:kube-proxy", "")):
            key, cert = pki.issue(name, user, organization=org)
            kubeconfig(pki.path(f"{name}.kubeconfig"), server, pki.ca, cert, key, user)
        etcd_dir = state.file("etcd")
        spawn(state, "etcd", [tools["etcd"], "--name=etcd", f"--data-dir={etcd_dir}",
                              "--listen-client-urls=http://127.0.0.1:2379",
                              "--advertise-client-urls=http://127.0.0.1:2379",
                              "--listen-peer-urls=http://127.0.0.1:2380",
                              "--initial-advertise-peer-urls=http://127.0.0.1:2380",
                              "--initial-cluster=etcd=http://127.0.0.1:2380",
                              # A throwaway cluster's store: no fsync (as Kubernetes' own test etcd).
                              "--unsafe-no-fsync", "--log-level=warn"], cgroup=control, nsenter=ns)
        spawn(state, "kube-apiserver", [
            tools["kube-apiserver"], "--etcd-servers=http://127.0.0.1:2379", f"--advertise-address={CONTROL_IP}",
            "--bind-address=0.0.0.0", "--secure-port=6443", f"--tls-cert-file={api_cert}",
            f"--tls-private-key-file={api_key}", f"--client-ca-file={pki.ca}",
            f"--service-account-key-file={sa_pub}", f"--service-account-signing-key-file={sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction", "--allow-privileged=true",
            f"--kubelet-client-certificate={kubelet_client[1]}", f"--kubelet-client-key={kubelet_client[0]}",
            f"--cert-dir={state.file('apiserver')}", "--profiling=false",
            # The nodes' names resolve nowhere: exec, logs and port-forward dial a kubelet by its IP.
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            # Pods of a node that stops answering are moved after 30 s, not 5 minutes.
            "--default-not-ready-toleration-seconds=30", "--default-unreachable-toleration-seconds=30",
        ], cgroup=control, nsenter=ns)
        self._wait_api()
        spawn(state, "kube-controller-manager", [
            tools["kube-controller-manager"], f"--kubeconfig={pki.path('controller-manager.kubeconfig')}",
            f"--authentication-kubeconfig={pki.path('controller-manager.kubeconfig')}",
            f"--authorization-kubeconfig={pki.path('controller-manager.kubeconfig')}",
            "--use-service-account-credentials=true", f"--service-account-private-key-file={sa_key}",
            f"--root-ca-file={pki.ca}", f"--cluster-signing-cert-file={pki.ca}",
            f"--cluster-signing-key-file={pki.ca_key}", "--allocate-node-cidrs=true",
            f"--cluster-cidr={CLUSTER_CIDR}", "--node-cidr-mask-size=24", f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--node-monitor-period=2s", "--node-monitor-grace-period=20s", "--leader-elect=false",
            "--bind-address=127.0.0.1", f"--cert-dir={state.file('controller-manager')}", "--profiling=false",
        ], cgroup=control, nsenter=ns)
        spawn(state, "kube-scheduler", [
            tools["kube-scheduler"], f"--kubeconfig={pki.path('scheduler.kubeconfig')}",
            f"--authentication-kubeconfig={pki.path('scheduler.kubeconfig')}",
            f"--authorization-kubeconfig={pki.path('scheduler.kubeconfig')}", "--leader-elect=false",
            "--bind-address=127.0.0.1", "--profiling=false",
        ], cgroup=control, nsenter=ns)

    def _dns(self) -> None:
        """CoreDNS in the cluster's network (10.99.0.1:53) with its kubernetes plugin, as user
        system:coredns with kubeadm's role; the Service kube-dns (10.96.0.10, no selector) and an
        EndpointSlice leading to it, so that kube-proxy takes pods' queries there."""
        state = self.state
        pki = PKI(state.file("pki"))
        key, cert = pki.issue("coredns", "system:coredns")
        config = kubeconfig(pki.path("coredns.kubeconfig"), f"https://{CONTROL_IP}:6443", pki.ca, cert, key,
                            "system:coredns")
        self.kubectl("apply", "-f", "-", input=DNS_OBJECTS.replace("DNS_SERVICE_IP", DNS_SERVICE_IP)
                     .replace("CONTROL_IP", CONTROL_IP))
        corefile = state.file("Corefile")
        with open(corefile, "w") as f:
            f.write(f"{CLUSTER_DOMAIN}:53 in-addr.arpa:53 ip6.arpa:53 {{\n    bind {CONTROL_IP}\n    errors\n"
                    f"    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{\n        kubeconfig {config} podshim\n"
                    f"        pods insecure\n    }}\n    cache 30\n}}\n"
                    # No internet to forward to: every other name does not exist (a resolver then
                    # goes on with its search list; REFUSED would stop it).
                    f".:53 {{\n    bind {CONTROL_IP}\n    errors\n    template ANY ANY {{\n        rcode NXDOMAIN\n"
                    f"    }}\n}}\n")
        spawn(state, "coredns", [state.data["tools"]["coredns"], "-conf", corefile], cgroup=state.data["control_cgroup"],
              nsenter=nsenter_args(state.data["outer"], False))

    def _wait_api(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        said = ""
        while time.monotonic() < deadline:
            self._check_alive()
            done = self.kubectl("get", "--raw=/readyz", check=False, timeout=20)
            if done.returncode == 0:
                return
            said = (done.stderr or done.stdout).strip()
            time.sleep(1)
        raise RuntimeError(f"kube-apiserver was not ready within {READY_TIMEOUT:.0f} s: {said[-400:]}")

    def _check_alive(self) -> None:
        """Raise when a process the cluster started has died (its log's last lines)."""
        for label, pid in self.state.data.get("processes", {}).items():
            stat = ""
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read().rsplit(")", 1)[1].split()[0]
            if stat in ("", "Z", "X"):
                if stat == "Z":
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, os.WNOHANG)
                raise RuntimeError(f"{label} (pid {pid}) exited:\n{self.log_tail(label)}")

    def log_tail(self, label: str, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            with open(self.state.file("logs", f"{label}.log"), errors="replace") as f:
                return "\n".join(f.read().splitlines()[-lines:])
        return "(no log)"

    def _registry(self) -> None:
        """docker-registry at 10.99.0.1:5000 with busybox (built as the tests build it) and
        containerd's pause pushed to it."""
        from support.imagebuild import DEFAULT_PATH, Entry, ImageConfig
        from support.registry import registry_config

        state = self.state
        config = state.file("registry.yml")
        with open(config, "w") as f:
            f.write(registry_config(state.file("registry"), REGISTRY))
        self.serve("registry", config)
        self.push_busybox(BUSYBOX)
        with open(CATATONIT, "rb") as f:
            catatonit = f.read()
        self.push_image(PAUSE, [{"catatonit": Entry("", data=catatonit, mode=0o755)}],
                        ImageConfig(entrypoint=("/catatonit", "-P"), env=(DEFAULT_PATH,)))

    def serve(self, label: str, config: str) -> None:
        """Start a docker-registry of config file ``config`` in the cluster's network, as ``label``."""
        spawn(self.state, label, ["docker-registry", "serve", config], cgroup=self.state.data["control_cgroup"],
              nsenter=nsenter_args(self.state.data["outer"], False))

    def push_busybox(self, reference: str, config: Any = None, creds: str | None = None) -> None:
        """Push busybox (the tests' image; its config ``config`` over ``sh``) as ``reference``."""
        from support.imagebuild import ImageConfig, busybox_layer

        self.push_image(reference, [busybox_layer()], config or ImageConfig(cmd=("sh",)), creds)

    def push_image(self, reference: str, layers: Sequence[Any], config: Any, creds: str | None = None) -> None:
        """Build an image of ``layers`` and ``config`` (tests/support/imagebuild.py's) and push it as
        ``reference`` from the cluster's network (``creds``: USER:PASSWORD), retried while the
        registry is starting."""
        from support.imagebuild import ImageBuilder

        build = tempfile.mkdtemp(prefix="image-", dir=self.state.dir)
        try:
            builder = ImageBuilder(build)
            builder.assemble("image", layers, config)
            self.push(builder.layout, "image", reference, creds)
        finally:
            shutil.rmtree(build)

    def push(self, layout: str, tag: str, reference: str, creds: str | None = None) -> None:
        """Copy the OCI layout's image ``tag`` to the cluster's registry as ``reference`` (retried
        while the registry is starting; ``creds``: USER:PASSWORD for a registry behind auth)."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            done = in_ns(self.state.data["outer"], ["skopeo", "copy", "--quiet", "--dest-tls-verify=false",
                                                    *(["--dest-creds", creds] if creds else []),
                                                    f"oci:{layout}:{tag}", f"docker://{reference}"],
                         node=False, check=False)
            if done.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"pushing {tag} to the cluster's registry as {reference} failed: "
                                   f"{done.stderr.strip()}")
            time.sleep(0.5)

    def _node(self, number: int, runtime: str) -> None:
        state, tools = self.state, self.state.data["tools"]
        name = f"node{number}"
        root = _cgroup(state.data["cgroup"])
        cgroup = root.child(name).to_dict()
        node: dict[str, Any] = {"name": name, "number": number, "ip": node_ip(number), "cgroup": cgroup,
                                "runtime": runtime}
        state.data["nodes"].append(node)
        state.save()
        home = state.file(name)
        for sub in ("var-lib/kubelet", "var-lib/podshim", "var-log", "run/podshim", "cni/net.d", "config"):
            os.makedirs(os.path.join(home, sub), exist_ok=True)
        holder = start_holder(state, f"{name}-holder", cgroup,
                              ["--net", "--mount", "--uts", "--cgroup", "--propagation", "private"])
        node["holder"] = holder
        state.save()
        # The machine: hostname, sysfs of its own network, the cgroup hierarchies as its cgroup
        # namespace shows them (its cgroup is their root), its own /var/lib, /var/log and /run.
        mounts = ["set -e", f"hostname {name}", "mount -t sysfs sysfs /sys",
                  "mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup"]
        for h in discover_hierarchies():
            where = os.path.join("/sys/fs/cgroup", os.path.relpath(h.mountpoint, "/sys/fs/cgroup"))
            kind = "-t cgroup2 cgroup2" if h.key == "unified" else \
                f"-t cgroup -o {'none,' if h.key.startswith('name=') else ''}{h.key} cgroup"
            mounts.append(f"mkdir -p {where} && mount {kind} {where}")
        mounts += [f"mount --bind {home}/var-lib /var/lib", f"mount --bind {home}/var-log /var/log",
                   f"mount --bind {home}/run /run", "ip link set lo up", "sysctl -qw net.ipv4.ip_forward=1"]
        in_ns(holder, ["sh", "-c", "\n".join(mounts)], node=True, cgroup=cgroup)
        outer = state.data["outer"]
        veth = f"veth-{name}"
        in_ns(outer, ["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", str(holder)],
              node=False)
        in_ns(outer, ["ip", "link", "set", veth, "master", BRIDGE, "up"], node=False)
        for command in (["ip", "addr", "add", f"{node['ip']}/{NETWORK.prefixlen}", "dev", "eth0"],
                        ["ip", "link", "set", "eth0", "up"],
                        ["ip", "route", "add", "default", "via", CONTROL_IP]):
            in_ns(holder, command, node=True, cgroup=cgroup)
        pki = PKI(state.file("pki"))
        key, cert = pki.issue(name, f"system:node:{name}", organization="system:nodes")
        server = f"https://{CONTROL_IP}:6443"
        config = os.path.join(home, "config")
        node_kubeconfig = kubeconfig(os.path.join(config, "kubelet.kubeconfig"), server, pki.ca, cert, key,
                                     f"system:node:{name}")
        ns = nsenter_args(holder, True)
        if runtime == "podshimd":
            socket = "/run/podshim/podshimd.sock"
            podshimd_config = os.path.join(config, "podshimd.toml")
            with open(podshimd_config, "w") as f:
                f.write(f'state_root = "/var/lib/podshim"\nruntime_root = "/run/podshim"\n'
                        f'cni_conf_dir = "{home}/cni/net.d"\n\n[registries."{REGISTRY}"]\ninsecure = true\n'
                        f'\n[registries."{PRIVATE_REGISTRY}"]\ninsecure = true\n')
            spawn(state, f"{name}-podshimd", [sys.executable, "-m", "client.podshimd", f"--config={podshimd_config}"],
                  cgroup=cgroup, nsenter=ns, env={**os.environ, "PYTHONPATH": REPO})
        else:
            from support.ctrdtools import write_config

            # Its root, state and sockets under the node's directory, runc's root there too; its
            # shims' sockets under the node's own /run (containerd's default); CNI from the node's config.
            directory = os.path.join(home, "containerd")
            os.makedirs(directory, exist_ok=True)
            ctrd_config = write_config(directory, REGISTRY, PAUSE, cni_conf_dir=os.path.join(home, "cni", "net.d"),
                                       log_level="info")
            socket = os.path.join(directory, "c.sock")
            shims = os.path.dirname(tools["containerd-shim-runc-v2"])
            spawn(state, f"{name}-{runtime}", [tools["containerd"], "--config", ctrd_config], cgroup=cgroup,
                  nsenter=ns, env={**os.environ, "PATH": f"{shims}:{os.environ['PATH']}"})
        node["socket"] = socket
        state.save()
        endpoint = f"unix://{socket}"
        kubelet_config = os.path.join(config, "kubelet.yaml")
        with open(kubelet_config, "w") as f:
            json.dump({**kubelet_configuration(pki.ca, endpoint, node["ip"]), **state.data.get("kubelet", {})}, f,
                      indent=1)
        self._wait_socket(number, socket, f"{name}-{runtime}")
        spawn(state, f"{name}-kubelet", [
            tools["kubelet"], f"--config={kubelet_config}", f"--kubeconfig={node_kubeconfig}",
            f"--hostname-override={name}", f"--node-ip={node['ip']}", "--root-dir=/var/lib/kubelet", "--v=2",
        ], cgroup=cgroup, nsenter=ns)
        proxy_config = os.path.join(config, "kube-proxy.yaml")
        with open(proxy_config, "w") as f:
            json.dump(kube_proxy_configuration(pki.path("kube-proxy.kubeconfig"), name), f, indent=1)
        spawn(state, f"{name}-kube-proxy", [tools["kube-proxy"], f"--config={proxy_config}", "--v=2"],
              cgroup=cgroup, nsenter=ns)

    def _wait_socket(self, number: int, path: str, label: str) -> None:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            self._check_alive()
            if self.in_node(number, ["test", "-S", path], check=False).returncode == 0:
                return
            time.sleep(0.2)
        raise RuntimeError(f"{label} made no socket {path} within {TIMEOUT:.0f} s:\n{self.log_tail(label)}")

    def _network_and_ready(self, count: int) -> None:
        """Each node's pod CIDR (from the controller-manager) into its CNI config, a route to it
        on every other node and in the cluster's network; then wait for every node Ready."""
        deadline = time.monotonic() + READY_TIMEOUT
        cidrs: dict[str, str] = {}
        while len(cidrs) < count:
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"nodes registered with a pod CIDR: {sorted(cidrs)} of {count} within "
                                   f"{READY_TIMEOUT:.0f} s")
            done = self.kubectl("get", "nodes", "-o", "json", check=False, timeout=20)
            if done.returncode == 0:
                for item in json.loads(done.stdout)["items"]:
                    if item["spec"].get("podCIDR"):
                        cidrs[item["metadata"]["name"]] = item["spec"]["podCIDR"]
            time.sleep(1)
        for node in self.nodes():
            node["pod_cidr"] = cidrs[node["name"]]
            with open(os.path.join(self.state.file(node["name"]), "cni", "net.d", "10-bridge.conflist"), "w") as f:
                json.dump(cni_config(node["pod_cidr"]), f, indent=1)
        self.state.save()
        for node in self.nodes():
            in_ns(self.state.data["outer"], ["ip", "route", "replace", node["pod_cidr"], "via", node["ip"]], node=False)
            for other in self.nodes():
                if other is not node:
                    self.in_node(node["number"], ["ip", "route", "replace", other["pod_cidr"], "via", other["ip"]])
        while True:
            self._check_alive()
            done = self.kubectl("get", "nodes", "-o", "json", check=False, timeout=20)
            ready = set()
            if done.returncode == 0:
                for item in json.loads(done.stdout)["items"]:
                    if any(c["type"] == "Ready" and c["status"] == "True" for c in item["status"]["conditions"]):
                        ready.add(item["metadata"]["name"])
            if len(ready) == count:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"nodes Ready: {sorted(ready)} of {count} within {READY_TIMEOUT:.0f} s")
            time.sleep(1)

    # ---- logs
    def save_logs(self) -> str:
        """Copy the cluster's logs out of its directory (down removes it); the copy's path."""
        target = tempfile.mkdtemp(prefix=f"podshim-cluster-{self.name}-logs-")
        with contextlib.suppress(FileNotFoundError):
            shutil.copytree(self.state.file("logs"), target, dirs_exist_ok=True)
        return target

    # ---- down
    def down(self) -> list[str]:
        """Remove everything the cluster's `up` made, from its record: processes (by cgroup, then
        anything still naming the cluster's directory), the namespaces with them (and every
        interface, route and iptables rule in them), mounts, cgroups, files. What could not be
        removed, as sentences."""
        state = self.state
        problems: list[str] = []
        records = [state.data.get("cgroup")]
        if not records[0] and state.data.get("cgroup_parent"):  # killed before the record was written
            paths = {str(i): os.path.join(p, self.name) for i, p in enumerate(state.data["cgroup_parent"])
                     if os.path.isdir(os.path.join(p, self.name))}
            records = [{"name": self.name, "paths": paths}] if paths else []
        for record in records:
            if not record:
                continue
            group = _cgroup(record)
            try:
                group.kill_all()
                deadline = time.monotonic() + TIMEOUT
                while group.pids() and time.monotonic() < deadline:  # SIGKILLed, still exiting
                    time.sleep(0.1)
            except Exception as exc:  # noqa: BLE001 - keep going: the rest must still be removed
                problems.append(f"killing the cluster's cgroup: {exc}")
        for child in state.children:
            try:
                child.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                argv = child.args if isinstance(child.args, list) else [child.args]  # (a list: ours)
                problems.append(f"{' '.join(map(str, argv[:4]))} (pid {child.pid}) outlived SIGKILL")
        state.children.clear()
        if os.path.isdir(state.dir):
            for killed in sweep(state.dir):
                problems.append(f"killed leftover {killed}")
        for record in records:
            if record:
                try:
                    _cgroup(record).remove(timeout=30)
                except Exception as exc:  # noqa: BLE001  (any failure of one node is reported, the rest go on)
                    problems.append(f"removing the cluster's cgroups: {exc}")
        for parent in state.data.get("cgroup_parent", []):
            with contextlib.suppress(OSError):
                os.rmdir(parent)  # podshim-cluster, when no other cluster is in it
        if os.path.isdir(state.dir):
            unmount_under(state.dir)
            shutil.rmtree(state.dir, ignore_errors=True)
            if os.path.exists(state.dir):
                problems.append(f"{state.dir} could not be removed")
        with contextlib.suppress(OSError):
            os.rmdir(BASE)
        state.data = {}
        return problems


#: kubeadm's role of CoreDNS and the Service kube-dns; the EndpointSlice leads it to CoreDNS on
#: the control plane (a Service without a selector: no controller touches its endpoints).
DNS_OBJECTS = """
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:coredns"}]
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: DNS_SERVICE_IP
  ports:
  - {name: dns, port: 53, protocol: UDP, targetPort: 53}
  - {name: dns-tcp, port: 53, protocol: TCP, targetPort: 53}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-control-plane
  namespace: kube-system
  labels: {kubernetes.io/service-name: kube-dns, endpointslice.kubernetes.io/managed-by: podshim-cluster}
addressType: IPv4
endpoints: [{addresses: [CONTROL_IP], conditions: {ready: true}}]
ports:
- {name: dns, port: 53, protocol: UDP}
- {name: dns-tcp, port: 53, protocol: TCP}
"""


def node_runtimes(nodes: int, runtime: str | Sequence[str]) -> list[str]:
    """The runtime of each of ``nodes`` nodes: ``runtime`` for all, or one per node."""
    runtimes = [runtime] * nodes if isinstance(runtime, str) else list(runtime)
    if len(runtimes) != nodes:
        raise ValueError(f"{len(runtimes)} runtime(s) {', '.join(runtimes)} for {nodes} node(s): give one, or one "
                         f"per node")
    for name in runtimes:
        if name not in RUNTIMES:
            raise ValueError(f"no node runtime {name!r}: the runtimes are {', '.join(RUNTIMES)}")
    return runtimes


def kubelet_configuration(ca: str, endpoint: str, ip: str) -> dict[str, Any]:
    """The kubelet's config on a node of this machine (see docs/cluster.md for what is off and why)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": ca}},
        "authorization": {"mode": "Webhook"},
        "address": ip, "readOnlyPort": 0, "healthzBindAddress": "127.0.0.1",
        "containerRuntimeEndpoint": endpoint, "imageServiceEndpoint": endpoint,
        "cgroupDriver": "cgroupfs", "cgroupRoot": "/", "cgroupsPerQOS": True, "enforceNodeAllocatable": ["pods"],
        # This machine has cgroup v1 (kubelet 1.35+ refuses it unless told).
        "failCgroupV1": False, "failSwapOn": False,
        # Thresholds of a shared machine whose disk and memory are not the cluster's: a busy disk
        # must not evict the tests' pods or collect their images.
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        # Under the node's own /var/lib: the default (/usr/libexec/kubernetes) is the machine's /usr.
        "volumePluginDir": "/var/lib/kubelet/volume-plugins",
        "clusterDomain": CLUSTER_DOMAIN, "clusterDNS": [DNS_SERVICE_IP],
        "nodeStatusUpdateFrequency": "4s", "nodeStatusReportFrequency": "10s",
        "serializeImagePulls": False, "rotateCertificates": False, "serverTLSBootstrap": False,
    }


def kube_proxy_configuration(kubeconfig_path: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig_path}, "mode": "iptables", "hostnameOverride": name,
        "clusterCIDR": CLUSTER_CIDR, "bindAddress": "0.0.0.0",
        "metricsBindAddress": "127.0.0.1:10249", "healthzBindAddress": "127.0.0.1:10256",
        # Conntrack's table size is the machine's (not per network namespace): left alone.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        # Service traffic is SNATed, so that a pod reaching a Service backed by a pod on its own
        # bridge gets the answer back through the node (no br_netfilter needed on the machine).
        "iptables": {"masqueradeAll": True},
    }


def cni_config(pod_cidr: str) -> dict[str, Any]:
    gateway = str(ipaddress.ip_network(pod_cidr).network_address + 1)
    return {"cniVersion": "1.0.0", "name": "podshim-cluster", "plugins": [{
        "type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
        "ipam": {"type": "host-local", "ranges": [[{"subnet": pod_cidr, "gateway": gateway}]],
                 "routes": [{"dst": "0.0.0.0/0"}]}}]}


# -- the fixture ----------------------------------------------------------------------------------------

@contextlib.contextmanager
def cluster(nodes: int = 2, name: str | None = None, runtime: str | Sequence[str] = "podshimd",
            kubelet: dict[str, Any] | None = None) -> Iterator[Cluster]:
    """A cluster of ``nodes`` nodes of ``runtime`` (one for all, or one per node), its kubelets'
    configuration with ``kubelet``'s fields over the harness's, taken down at the end of the
    block whatever happened."""
    made = Cluster(name or f"t{os.getpid()}")
    made.up(nodes, runtime, kubelet)
    try:
        yield made
    finally:
        problems = made.down()
        if problems:
            raise RuntimeError("taking the cluster down: " + "; ".join(problems))


# -- the smoke ----------------------------------------------------------------------------------------

SMOKE_DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: smoke}
spec:
  replicas: 6
  selector: {matchLabels: {app: smoke}}
  template:
    metadata: {labels: {app: smoke}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
      - name: web
        image: IMAGE
        imagePullPolicy: IfNotPresent
        command: ["sh", "-c", "echo started on $(hostname); mkdir -p /www; hostname > /www/index.html; exec httpd -f -p 8080 -h /www"]
        ports: [{containerPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: smoke}
spec:
  selector: {app: smoke}
  ports: [{port: 80, targetPort: 8080}]
"""


def http_get(c: Cluster, pod: str, ip: str, port: int) -> str:
    """The body of ``GET /`` on IP:PORT, asked from inside ``pod`` (busybox nc: its static wget
    crashes on this machine)."""
    said: str = c.kubectl("exec", pod, "--", "sh", "-c", f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {ip} {port}",
                          timeout=30).stdout
    head, _, body = said.replace("\r\n", "\n").partition("\n\n")
    if not head.startswith("HTTP/1.") or " 200 " not in head.splitlines()[0]:
        raise RuntimeError(f"GET http://{ip}:{port}/ from {pod} answered {said[:200]!r}")
    return body.strip()


def smoke(c: Cluster, nodes: int) -> str:
    """The CI smoke on a running cluster: a Deployment spread over the nodes, exec, logs, pod to
    pod across nodes by IP, a Service through kube-proxy. Its one line of result; raises on a failure."""
    c.kubectl("apply", "-f", "-", input=SMOKE_DEPLOYMENT.replace("IMAGE", BUSYBOX))
    c.kubectl("rollout", "status", "deployment/smoke", "--timeout=240s", timeout=260)
    pods = json.loads(c.kubectl("get", "pods", "-l", "app=smoke", "-o", "json").stdout)["items"]
    by_node: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        by_node.setdefault(pod["spec"]["nodeName"], []).append(pod)
    if len(by_node) < min(nodes, 2):
        raise RuntimeError(f"the Deployment's pods are on {sorted(by_node)} only")
    first = pods[0]["metadata"]["name"]
    said = c.kubectl("exec", first, "--", "cat", "/www/index.html").stdout.strip()
    if said != first:
        raise RuntimeError(f"exec in {first} read {said!r}")
    logs = c.kubectl("logs", first).stdout
    if f"started on {first}" not in logs:
        raise RuntimeError(f"the log of {first} is {logs!r}")
    nodes_seen = sorted(by_node)
    a, b = by_node[nodes_seen[0]][0], by_node[nodes_seen[-1]][0]
    c.kubectl("exec", a["metadata"]["name"], "--", "ping", "-c", "1", "-W", "5", b["status"]["podIP"], timeout=30)
    got = http_get(c, a["metadata"]["name"], b["status"]["podIP"], 8080)
    if got != b["metadata"]["name"]:
        raise RuntimeError(f"HTTP across nodes answered {got!r}")
    service_ip = json.loads(c.kubectl("get", "service", "smoke", "-o", "json").stdout)["spec"]["clusterIP"]
    answers = set()
    for _ in range(12):
        answers.add(http_get(c, a["metadata"]["name"], service_ip, 80))
    if not answers <= {p["metadata"]["name"] for p in pods} or len(answers) < 2:
        raise RuntimeError(f"the Service answered {sorted(answers)}")
    return (f"smoke: {len(pods)} pods on {len(by_node)} nodes ({', '.join(nodes_seen)}); exec, logs, ping and HTTP "
            f"across nodes by pod IP, the Service {service_ip} answered from {len(answers)} pods")


# -- the command --------------------------------------------------------------------------------------

def runtime_argument(text: str) -> str | list[str]:
    """``--runtime``: one runtime for every node, or a comma-separated list of one per node."""
    return text.split(",") if "," in text else text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/cluster.py", description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    up = verbs.add_parser("up", help="bring a cluster up and leave it running")
    up.add_argument("--nodes", type=int, default=1)
    smoke_verb = verbs.add_parser("smoke", help="up, the smoke, down: one line of result")
    smoke_verb.add_argument("--nodes", type=int, default=2)
    verbs.add_parser("down", help="remove everything the cluster's up made")
    kubectl = verbs.add_parser("kubectl", help="kubectl against the cluster")
    for verb in (up, smoke_verb, verbs.choices["down"], kubectl):
        verb.add_argument("--name", default="podshim", help="the cluster's name (default podshim)")
    for verb in (up, smoke_verb):
        verb.add_argument("--runtime", default="podshimd",
                          help=f"the nodes' runtime ({' or '.join(RUNTIMES)}), or one per node, comma-separated")
    kubectl.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench/cluster.py: run it as root (it makes namespaces, cgroups and mounts)", file=sys.stderr)
        return 2
    c = Cluster(args.name)
    try:
        if args.verb == "up":
            c.up(args.nodes, runtime_argument(args.runtime))
            print(f"cluster {args.name!r} is up: bench/cluster.py kubectl --name {args.name} get nodes -o wide")
        elif args.verb == "down":
            for problem in c.down():
                print(problem, file=sys.stderr)
        elif args.verb == "kubectl":
            if not c.state.data.get("outer"):
                print(f"no cluster {args.name!r} is up", file=sys.stderr)
                return 1
            sys.stdout.flush()
            os.execvp("nsenter", c.kubectl_argv(*args.args))  # its signals, its status
        else:
            started = time.monotonic()
            c.up(args.nodes, runtime_argument(args.runtime))
            try:
                line = smoke(c, args.nodes)
            except BaseException:
                log(f"the smoke failed; the logs are in {c.save_logs()}")
                raise
            finally:
                problems = c.down()
            if problems:
                raise RuntimeError("down: " + "; ".join(problems))
            print(f"{line}; clean down; {time.monotonic() - started:.0f} s in all")
    except (RuntimeError, ValueError, subprocess.TimeoutExpired, OSError) as exc:
        print(f"bench/cluster.py {args.verb}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main())
