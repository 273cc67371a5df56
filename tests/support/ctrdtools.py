"""The real containerd (the version .ci/pins.toml pins, built by .ci/gotool), run privately for tests.

``running_containerd(directory, netns, registry_host, sandbox_image)`` starts containerd with
everything under ``directory``: its root, state, sockets, config (a ``podshim`` runtime handler with
``sandboxer = "shim"`` whose binary runs this checkout's ``containerd-shim-podshim-v1``, a ``runc``
one, the default, with its runc root there too, NRI off, CNI's bridge under ``directory`` (with
portmap when asked), the tests' local registry over plain HTTP and each of ``mirrors``' hosts
pulled from its endpoint), podshim's runtime root, inside the network namespace ``netns`` (CNI acts
there, never on the machine's network). It returns once containerd's CRI answers, and on leaving
stops containerd by pid (SIGTERM, then SIGKILL), unmounts whatever is left under ``directory`` and
ends every shim of its environment's runtime root by pid. The containerd tests and
bench/critest_compare.py use it. ``Containerd.kill_and_restart()`` kills it with SIGKILL and starts it again.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from shim.lib.program import search_path

from support.critools import REPO, cni_config, gotool

__all__ = ["Containerd", "running_containerd", "SandboxerProcess", "running_sandboxer", "PROXY_HANDLER",
           "NULL_HANDLER", "NULL_SOCKET", "pod_config", "sleeping_pod", "containerd_binary", "containerd_version",
           "write_config"]

#: Seconds containerd may take to answer its CRI, and to stop.
START_TIMEOUT = 60.0
STOP_TIMEOUT = 20.0
#: containerd's CRI plugin namespace.
K8S_NAMESPACE = "k8s.io"
#: The runtime handler, and proxy plugin, of podshim's proxy-plugin route (podshim-sandboxer).
PROXY_HANDLER = "podshim-proxy"
#: A runtime handler and proxy plugin whose sandbox controller makes nothing (bench/containerd_shim.py
#: serves one on NULL_SOCKET in containerd's directory): what a pod costs containerd itself.
NULL_HANDLER, NULL_SOCKET = "null-proxy", "null.sock"


def sandboxer_socket(directory: str) -> str:
    """Where containerd's config (write_config) has the proxy plugin dial podshim-sandboxer."""
    return os.path.join(directory, "sb.sock")


def containerd_binary(name: str = "containerd") -> str:
    """The pinned containerd, ctr or containerd-shim-runc-v2, built first when the cache lacks it."""
    path: str = gotool.tool_path(name)
    return path


def containerd_version() -> str:
    """The pinned containerd's version ("v2.3.7")."""
    return str(gotool.tool_pin("containerd")["version"])


@dataclass
class Containerd:
    directory: str
    process: subprocess.Popen[bytes]
    runtime_root: str  #: podshim's runtime root for the shims containerd starts
    argv: list[str]
    env: dict[str, str]

    def kill_and_restart(self) -> None:
        """SIGKILL containerd (its shims live on), then start it again on the same roots and config."""
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.process = _spawn(self.directory, self.argv, self.env)
        _wait_serving(self)

    @property
    def socket(self) -> str:
        return os.path.join(self.directory, "c.sock")

    @property
    def endpoint(self) -> str:
        return "unix://" + self.socket

    @property
    def state(self) -> str:
        return os.path.join(self.directory, "state")

    def log(self) -> str:
        with open(os.path.join(self.directory, "containerd.log"), errors="replace") as f:
            return f.read()

    def sandbox_bundles(self) -> list[str]:
        """The pod bundles of the shim sandboxer that containerd keeps."""
        root = os.path.join(self.state, "io.containerd.sandbox.controller.v1.shim", K8S_NAMESPACE)
        return sorted(os.listdir(root)) if os.path.isdir(root) else []

    def task_bundles(self) -> list[str]:
        root = os.path.join(self.state, "io.containerd.runtime.v2.task", K8S_NAMESPACE)
        return sorted(os.listdir(root)) if os.path.isdir(root) else []

    def netns_files(self) -> list[str]:
        root = os.path.join(self.state, "io.containerd.grpc.v1.cri", "netns")
        return sorted(os.listdir(root)) if os.path.isdir(root) else []

    def shim_sockets(self) -> list[str]:
        root = os.path.join(self.runtime_root, "s")
        return sorted(os.listdir(root)) if os.path.isdir(root) else []

    def shims(self) -> list[int]:
        """Processes other than containerd that have its environment's runtime root: the shims it
        started (a pause drops its environment: it shows through its shim and its netns)."""
        needle = f"PODSHIM_RUNTIME_ROOT={self.runtime_root}".encode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in (self.process.pid, os.getpid()):
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                continue
        return found

    def wait_cri(self, crictl: str, timeout: float = START_TIMEOUT) -> None:
        """Return once containerd's CRI answers (it recovers its pods first after a restart)."""
        deadline = time.monotonic() + timeout
        while (done := self.crictl(crictl, "pods", "-q")).returncode != 0:
            if time.monotonic() > deadline:
                raise AssertionError(f"containerd's CRI did not answer within {timeout} s: {done.stderr}\n"
                                     f"{self.log()[-4000:]}")
            time.sleep(0.2)

    def crictl(self, crictl: str, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run([crictl, "--runtime-endpoint", self.endpoint, "--image-endpoint", self.endpoint,
                               "--timeout", "30s", *args], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)


def _shim_wrapper(directory: str) -> str:
    """containerd-shim-podshim-v1 as this checkout's code, started as the installed command starts
    (bin/podshim: ``python -S``, its libraries after the standard library, the collector off):
    containerd runs it by this absolute path."""
    path = os.path.join(directory, "bin", "containerd-shim-podshim-v1")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    libraries = json.dumps(search_path())  # (double quotes: the program is in single quotes)
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -S -P -c 'import gc; gc.disable(); import sys; "
                f"sys.path += {libraries}; from shim.containerd.cli import run; run()' \"$@\"\n")
    os.chmod(path, 0o755)
    return path


def write_config(directory: str, registry_host: str, sandbox_image: str, *, shim: str | None = None,
                 cni_conf_dir: str | None = None, mirrors: Mapping[str, str] | None = None,
                 portmap: bool = False, log_level: str = "debug") -> str:
    """containerd's config under ``directory`` (config.toml, its registry hosts in certs.d), its
    path: root, state, sockets and runc's root under ``directory``; the ``podshim`` runtime handler
    when ``shim`` (the shim's binary) is given; its log at ``log_level``; CNI's config from
    ``cni_conf_dir``, or a bridge written under ``directory`` (critools.cni_config) when it is None."""
    for host, endpoint in {registry_host: f"http://{registry_host}", **(mirrors or {})}.items():
        certs = os.path.join(directory, "certs.d", host)
        os.makedirs(certs)
        with open(os.path.join(certs, "hosts.toml"), "w") as f:
            f.write(f'server = "{endpoint}"\n\n[host."{endpoint}"]\n  capabilities = ["pull", "resolve"]\n')
    if cni_conf_dir is None:
        cni_config(directory, portmap=portmap)
        cni_conf_dir = os.path.join(directory, "net.d")
    podshim = "" if shim is None else f"""    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.podshim]
      runtime_type = "{shim}"
      sandboxer = "shim"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.{PROXY_HANDLER}]
      runtime_type = "{shim}"
      sandboxer = "{PROXY_HANDLER}"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.{NULL_HANDLER}]
      runtime_type = "io.containerd.runc.v2"
      sandboxer = "{NULL_HANDLER}"
"""
    # podshim's proxy-plugin route: containerd dials the sandboxer (running_sandboxer) at its first pod.
    proxy = "" if shim is None else f"""
[proxy_plugins.{PROXY_HANDLER}]
  type = "sandbox"
  address = "{sandboxer_socket(directory)}"

[proxy_plugins.{NULL_HANDLER}]
  type = "sandbox"
  address = "{os.path.join(directory, NULL_SOCKET)}"
"""
    path = os.path.join(directory, "config.toml")
    with open(path, "w") as f:
        f.write(f"""version = 3
root = "{directory}/root"
state = "{directory}/state"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.snapshotter.v1.blockfile", "io.containerd.tracing.processor.v1.otlp",
                    "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{directory}/c.sock"

[ttrpc]
  address = "{directory}/c.sock.ttrpc"

[debug]
  level = "{log_level}"
{proxy}
[plugins.'io.containerd.internal.v1.opt']
  path = "{directory}/opt"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins.'io.containerd.cri.v1.images']
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{sandbox_image}"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "{directory}/certs.d"

[plugins.'io.containerd.cri.v1.runtime']
  netns_mounts_under_state_dir = true
  # runc cannot lower oom_score_adj here (no CAP_SYS_RESOURCE: "failed to update
  # /proc/self/oom_score_adj: Permission denied" for the sandbox's -998); clamp it to containerd's own.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni", "/opt/cni/bin"]
    conf_dir = "{cni_conf_dir}"
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        Root = "{directory}/runc"
{podshim}""")
    return path


@contextlib.contextmanager
def running_containerd(directory: str, netns: str, registry_host: str, sandbox_image: str, *,
                       mirrors: Mapping[str, str] | None = None, portmap: bool = False,
                       log_level: str = "debug") -> Iterator[Containerd]:
    containerd = containerd_binary()
    runc_shim_dir = os.path.dirname(containerd_binary("containerd-shim-runc-v2"))
    config = write_config(directory, registry_host, sandbox_image, shim=_shim_wrapper(directory), mirrors=mirrors,
                          portmap=portmap, log_level=log_level)
    runtime_root = os.path.join(directory, "podshim")
    env = {**os.environ, "PODSHIM_RUNTIME_ROOT": runtime_root, "PODSHIM_TEMPLATE": "0",
           "PATH": f"{runc_shim_dir}:{os.environ['PATH']}"}
    argv = ["nsenter", f"--net={netns}", "--", containerd, "--config", config]
    daemon = Containerd(directory, _spawn(directory, argv, env), runtime_root, argv, env)
    try:
        _wait_serving(daemon)
        yield daemon
    finally:
        _stop(daemon)


def _spawn(directory: str, argv: list[str], env: dict[str, str], log_name: str = "containerd.log"
           ) -> subprocess.Popen[bytes]:
    with open(os.path.join(directory, log_name), "ab") as log:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def _end(process: subprocess.Popen[bytes]) -> None:
    """Stop ``process`` by pid: SIGTERM, then SIGKILL after STOP_TIMEOUT."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()


def _wait_serving(daemon: Containerd) -> None:
    ctr = containerd_binary("ctr")
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if daemon.process.poll() is not None:
            raise AssertionError(f"containerd exited with {daemon.process.returncode}:\n{daemon.log()[-4000:]}")
        if os.path.exists(daemon.socket):
            done = subprocess.run([ctr, "--address", daemon.socket, "plugins", "ls"], capture_output=True, text=True,
                                  timeout=30, stdin=subprocess.DEVNULL)
            if done.returncode == 0 and any(line.split()[:2] == ["io.containerd.grpc.v1", "cri"] and
                                            line.split()[-1] == "ok" for line in done.stdout.splitlines()):
                return
        time.sleep(0.2)
    raise AssertionError(f"containerd did not serve within {START_TIMEOUT} s:\n{daemon.log()[-4000:]}")


def _stop(daemon: Containerd) -> None:
    _end(daemon.process)
    # Shims still running (a pod a failed test did not remove) are ours, started under our private
    # runtime root: each is killed and then deleted as containerd deletes a dead shim, so its pause,
    # cgroups and netns go with it.
    dead = []
    for pid in daemon.shims():
        started = _shim_identity(pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if started is not None:
            dead.append(started)
    for namespace, shim_id, bundle in dead:
        # containerd runs delete in the bundle; one it removed already (the shim outlived it) is gone.
        subprocess.run([_shim_wrapper(daemon.directory), "-namespace", namespace, "-id", shim_id, "-bundle", bundle,
                        "delete"], cwd=bundle if os.path.isdir(bundle) else daemon.directory, env=daemon.env,
                       capture_output=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    _unmount_below(daemon.directory)


def _shim_identity(pid: int) -> tuple[str, str, str] | None:
    """A containerd shim's namespace, id and bundle (its -namespace and -id flags, its working
    directory), or None for a process that is not one, or gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [arg.decode() for arg in f.read().split(b"\0")]
        bundle = os.readlink(f"/proc/{pid}/cwd").removesuffix(" (deleted)")
    except OSError:
        return None
    flags = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i] in ("-namespace", "-id")}
    if "-namespace" not in flags or "-id" not in flags:
        return None
    return flags["-namespace"], flags["-id"], bundle


def _unmount_below(directory: str) -> None:
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    for point in sorted((p for p in points if p.startswith(directory.rstrip("/") + "/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def pod_config(directory: str, name: str, **extra: object) -> str:
    """The path of a crictl pod config ``name`` (with ``extra``'s keys) written in ``directory``."""
    path = os.path.join(directory, f"{name}.json")
    with open(path, "w") as f:
        json.dump({"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
                   "hostname": name, "log_directory": os.path.join(directory, "logs", name), **extra}, f)
    return path


def sleeping_pod(containerd: Containerd, crictl: str, directory: str, image: str, name: str,
                 command: tuple[str, ...] = ("sleep", "1000"), **pod: object) -> tuple[str, str]:
    """A podshim pod ``name`` (with ``pod``'s config keys) with a container c1 that runs ``command``
    (by default, sleeps), started: their ids."""
    assert containerd.crictl(crictl, "pull", image, timeout=120).returncode == 0
    pod_json = pod_config(directory, name, **pod)
    ran = containerd.crictl(crictl, "runp", "--runtime", "podshim", pod_json)
    assert ran.returncode == 0, ran.stderr
    pod_id = ran.stdout.strip()
    container_json = os.path.join(directory, "c1.json")
    with open(container_json, "w") as f:
        json.dump({"metadata": {"name": "c1"}, "image": {"image": image}, "command": list(command),
                   "log_path": "c1.log"}, f)
    cid = containerd.crictl(crictl, "create", pod_id, container_json, pod_json).stdout.strip()
    assert containerd.crictl(crictl, "start", cid).returncode == 0
    return pod_id, cid


@dataclass
class SandboxerProcess:
    """podshim-sandboxer (shim.containerd.proxy) serving containerd's proxy plugin ``PROXY_HANDLER``."""

    containerd: Containerd
    process: subprocess.Popen[bytes]
    argv: list[str]
    env: dict[str, str]

    @property
    def socket(self) -> str:
        return sandboxer_socket(self.containerd.directory)

    @property
    def state_root(self) -> str:
        return os.path.join(self.containerd.directory, "sandboxer")

    def bundles(self) -> list[str]:
        root = os.path.join(self.state_root, K8S_NAMESPACE)
        return sorted(os.listdir(root)) if os.path.isdir(root) else []

    def log(self) -> str:
        with open(os.path.join(self.containerd.directory, "sandboxer.log"), errors="replace") as f:
            return f.read()

    def shims(self) -> list[int]:
        """The shims of the runtime root (containerd.shims()), not the sandboxer, its template nor
        the template's spare shims (forked ahead for the next pods: Ping says which)."""
        from shim.api.names import TEMPLATE_SERVICE, TEMPLATE_SOCKET
        from shim.rpc import blocking

        others = {self.process.pid}
        template = os.path.join(self.containerd.runtime_root, TEMPLATE_SOCKET)
        if os.path.exists(template):
            ping = blocking.call("unix://" + template, TEMPLATE_SERVICE, "Ping", timeout=10.0)
            others.update((ping["pid"], *ping["spare_pids"]))
        return [pid for pid in self.containerd.shims() if pid not in others]

    def kill_and_restart(self) -> None:
        """SIGKILL the sandboxer (the shims live on), then start it again on the same roots."""
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.process = _spawn(self.containerd.directory, self.argv, self.env, "sandboxer.log")
        _wait_sandboxer(self)


def _wait_sandboxer(sandboxer: SandboxerProcess) -> None:
    from shim.rpc.blocking import can_connect

    deadline = time.monotonic() + START_TIMEOUT
    while not (os.path.exists(sandboxer.socket) and can_connect(sandboxer.socket)):
        if sandboxer.process.poll() is not None:
            raise AssertionError(f"podshim-sandboxer exited with {sandboxer.process.returncode}:\n"
                                 f"{sandboxer.log()[-4000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"podshim-sandboxer did not serve within {START_TIMEOUT} s:\n{sandboxer.log()[-4000:]}")
        time.sleep(0.05)


@contextlib.contextmanager
def running_sandboxer(containerd: Containerd, *, use_template: bool = True, debug: bool = True
                      ) -> Iterator[SandboxerProcess]:
    """podshim-sandboxer of this checkout for ``containerd`` (its proxy plugin's socket, its
    runtime root, its ttrpc socket), its pods' bundles under containerd's directory. On leaving:
    stopped by pid (SIGTERM, then SIGKILL), its shim template stopped, and any pod it left
    deleted as ``delete`` does."""
    directory = containerd.directory
    argv = [sys.executable, "-m", "shim.containerd.proxy", "--listen", sandboxer_socket(directory),
            "--state-root", os.path.join(directory, "sandboxer"), "--runtime-root", containerd.runtime_root,
            "--containerd-address", os.path.join(directory, "c.sock.ttrpc")] + (["--debug"] if debug else [])
    if not use_template:
        argv.append("--no-template")
    env = {**containerd.env, "PYTHONPATH": REPO}
    env.pop("PODSHIM_TEMPLATE", None)
    sandboxer = SandboxerProcess(containerd, _spawn(directory, argv, env, "sandboxer.log"), argv, env)
    try:
        _wait_sandboxer(sandboxer)
        yield sandboxer
    finally:
        _stop_sandboxer(sandboxer)


def _stop_sandboxer(sandboxer: SandboxerProcess) -> None:
    _end(sandboxer.process)
    from shim.lib.program import podshim_argv

    subprocess.run([*podshim_argv(), "template", "--stop", "--runtime-root", sandboxer.containerd.runtime_root],
                   capture_output=True, timeout=60, stdin=subprocess.DEVNULL, env=sandboxer.env)
    for sandbox_id in sandboxer.bundles():  # pods a failed test left: what delete does, then the bundle
        bundle = os.path.join(sandboxer.state_root, K8S_NAMESPACE, sandbox_id)
        subprocess.run([sys.executable, "-c", "import sys; from shim.cleanup import delete_sandbox; "
                        "delete_sandbox(*sys.argv[1:])", bundle, K8S_NAMESPACE, sandbox_id,
                        sandboxer.containerd.runtime_root], capture_output=True, timeout=60,
                       stdin=subprocess.DEVNULL, env=sandboxer.env)
