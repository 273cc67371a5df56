"""The real CRI clients, crictl and critest (sigs.k8s.io/cri-tools at the version .ci/pins.toml pins),
built once and cached, and podshimd run as a subprocess for them to talk to.

``cri_tool(name)`` returns the path of ``crictl`` or ``critest``, building it first with .ci/gotool
from the Go module proxy when its cache (outside the repository) lacks it: minutes cold, then
reused. The session fixtures ``crictl`` and ``critest`` give the binaries' paths; a test module
imports the ones it uses (``from critools import crictl``). Tests never skip for want of them: the
first run builds them.

``run_critest(critest, endpoint)`` runs critest against a CRI endpoint (which mirrors the registries
of tests/support/imagebuild.py's ``critest_images``) and returns its parsed summary (``CritestResult``).

``running_podshimd(directory)`` runs ``python3 -m client.podshimd`` with its roots, socket and
config under ``directory`` (inside the network namespace ``netns`` when given, so that CNI plugins
act there), returns once it sent READY=1 on its NOTIFY_SOCKET, and stops it by pid with SIGTERM
afterwards. ``Podshimd.runtime()`` and ``.images()`` are gRPC stubs on its socket, for what crictl
does not show (the status of a call, idempotence); ``.create_container()`` sends what crictl
refuses to (a container that names no image).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import re
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from shim.launch.template import stop_template

if TYPE_CHECKING:
    from support.imagebuild import TestImages

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load_gotool() -> Any:
    """.ci/gotool, the builder of the tools pinned in .ci/pins.toml, as a module."""
    loader = importlib.machinery.SourceFileLoader("podshim_gotool", os.path.join(REPO, ".ci", "gotool"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


gotool = _load_gotool()


def cri_tool(name: str) -> str:
    """The path of the pinned cri-tools binary ``name`` ("crictl" or "critest"), built first by
    .ci/gotool when its cache lacks it. Raises gotool.GoToolError, naming the step, when the build fails."""
    path: str = gotool.tool_path(name)
    return path


@pytest.fixture(scope="session")
def crictl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The path of the real crictl. Every crictl the session runs reads an empty config file
    ($CRI_CONFIG_FILE): nothing of the machine's /etc/crictl.yaml, and no warning on stderr that
    it is missing."""
    config = tmp_path_factory.mktemp("crictl") / "crictl.yaml"
    config.write_text("")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CRI_CONFIG_FILE", str(config))
        yield cri_tool("crictl")


@pytest.fixture(scope="session")
def critest() -> str:
    """The path of the pinned critest, the CRI conformance suite (.ci/pins.toml)."""
    return cri_tool("critest")


# -- podshimd as a subprocess ------------------------------------------------------------------------

#: CRI mounts that give a container of the tests' busybox image the node's python3, read-only: what
#: a test whose program is Python asks for (podshimd runs no container on the node's own root).
HOST_PYTHON_MOUNTS = [{"container_path": path, "host_path": os.path.realpath(path), "readonly": True}
                      for path in ("/usr", "/lib", "/lib64")]

#: How long podshimd may take to serve (imports and grpc start-up: well under a second when idle;
#: stretched where everything runs emulated: the cgroup v2 guest's PODSHIM_TEST_SLOWDOWN).
START_TIMEOUT = 30.0 * float(os.environ.get("PODSHIM_TEST_SLOWDOWN") or 1)
#: The deadline of one crictl call (stretched as START_TIMEOUT is).
CRICTL_TIMEOUT = 10.0 * float(os.environ.get("PODSHIM_TEST_SLOWDOWN") or 1)
#: How long it may take to stop after SIGTERM (its own grace for calls in flight is 5 s).
STOP_TIMEOUT = 15.0


class Podshimd:
    """A running podshimd: its process, its directories, and crictl pointed at its socket."""

    def __init__(self, directory: str, process: subprocess.Popen[bytes]):
        self.directory = directory
        self.process = process
        self.runtime_root = os.path.join(directory, "run")
        self.state_root = os.path.join(directory, "state")
        self.cni_conf_dir = os.path.join(directory, "net.d")
        self.config_path = os.path.join(directory, "config.toml")
        self.socket_path = os.path.join(self.runtime_root, "podshimd.sock")
        self.log_path = os.path.join(directory, "podshimd.log")
        self.channel: Any = None
        self.image = ""  # what create_container gives a config that names no image

    @property
    def endpoint(self) -> str:
        return "unix://" + self.socket_path

    def crictl(self, crictl: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``crictl ARGS`` against this daemon (runtime and image endpoint both)."""
        result = subprocess.run([crictl, "--runtime-endpoint", self.endpoint, "--image-endpoint", self.endpoint,
                                 "--timeout", f"{CRICTL_TIMEOUT:g}s", *args], stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, timeout=CRICTL_TIMEOUT + 50)
        if check and result.returncode != 0:
            raise AssertionError(f"crictl {' '.join(args)} exited {result.returncode}: {result.stderr}")
        return result

    def create_container(self, pod_id: str, config: dict[str, Any], pod_config_path: str) -> str:
        """CreateContainer as ``crictl create POD CONFIG POD_CONFIG`` sends it, over gRPC. A config
        that names no image gets the daemon's ``image`` (running_podshimd's: the tests' busybox),
        when it has one: podshimd refuses a container without an image. The new container's id; a
        grpc.RpcError when podshimd refuses."""
        from google.protobuf import json_format

        from shim.cri.api import api_pb2
        if self.image and not (config.get("image") or {}).get("image"):
            config = {**config, "image": {"image": self.image}}
        with open(pod_config_path) as f:
            sandbox_config = json.load(f)
        request = api_pb2.CreateContainerRequest(pod_sandbox_id=pod_id)
        json_format.ParseDict(config, request.config)
        json_format.ParseDict(sandbox_config, request.sandbox_config)
        container_id: str = self.runtime().CreateContainer(request, timeout=60).container_id
        return container_id

    def sandbox_bundles(self) -> list[str]:
        """The sandbox bundles under the daemon's state root (the pods' shims' directories)."""
        path = os.path.join(self.state_root, "sandboxes", "k8s.io")
        return sorted(os.listdir(path)) if os.path.isdir(path) else []

    def pod_records(self) -> list[str]:
        """The pod records under the daemon's state root."""
        path = os.path.join(self.state_root, "pods")
        return sorted(n for n in os.listdir(path) if n.endswith(".json")) if os.path.isdir(path) else []

    def remove_every_pod(self, crictl: str) -> None:
        """``crictl rmp -f`` every pod this daemon lists (a test's leftovers must be removable)."""
        for pod_id in self.crictl(crictl, "pods", "-q").stdout.split():
            self.crictl(crictl, "rmp", "-f", pod_id)

    def runtime(self) -> Any:
        """A runtime.v1.RuntimeService stub on this daemon's socket (the channel closes with the daemon)."""
        from shim.cri.api import api_pb2_grpc
        return api_pb2_grpc.RuntimeServiceStub(self._channel())

    def images(self) -> Any:
        """A runtime.v1.ImageService stub on this daemon's socket."""
        from shim.cri.api import api_pb2_grpc
        return api_pb2_grpc.ImageServiceStub(self._channel())

    def _channel(self) -> Any:
        import grpc
        if self.channel is None:
            self.channel = grpc.insecure_channel(self.endpoint)
        return self.channel

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def stop(self) -> int:
        """SIGTERM by pid and wait; the exit status (SIGKILL and an AssertionError if it hangs)."""
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"podshimd ignored SIGTERM for {STOP_TIMEOUT} s:\n{self.log()}") from None


def scrape_metrics(daemon: Podshimd, timeout: float = 60) -> dict[str, float]:
    """Every sample of the Prometheus endpoint a daemon with ``metrics_address`` serves (on
    loopback, as its log names it): ``{'name{labels}': value}``."""
    found = re.search(r"Prometheus metrics on (http://\S+/metrics)", daemon.log())
    assert found, "podshimd's log names no metrics address"
    assert found.group(1).startswith("http://127.0.0.1:")
    with urllib.request.urlopen(found.group(1), timeout=timeout) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    return {name: float(value) for name, value in re.findall(r"^(\S+) (\S+)$", text, re.M)}


@pytest.fixture
def outer_netns() -> Iterator[str]:
    """A network namespace of the test's own (loopback up) for a podshimd whose CNI plugins must act
    there, never on the machine's network; its path. Removed after the test."""
    name = f"podshim-crit-{secrets.token_hex(4)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield f"/var/run/netns/{name}"
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


@contextmanager
def private_podshimd(prefix: str, image: Any, config: str = "") -> Iterator[Podshimd]:
    """:func:`running_podshimd` under a private directory named ``prefix...`` (short: the socket
    path must fit sun_path), removed afterwards, with ``config`` and ``image`` pulled."""
    directory = tempfile.mkdtemp(prefix=prefix)
    try:
        with running_podshimd(directory, config=config, image=image) as daemon:
            yield daemon
    finally:
        shutil.rmtree(directory)


@pytest.fixture(scope="module")
def module_daemon(test_images: TestImages) -> Iterator[Podshimd]:
    """One podshimd for a test module, under a private directory that is removed afterwards, with
    the tests' busybox pulled (its ``image``)."""
    with private_podshimd("psd-", test_images.busybox) as daemon:
        yield daemon


@pytest.fixture
def daemon(module_daemon: Podshimd, crictl: str) -> Iterator[Podshimd]:
    """The module's podshimd; every pod a test leaves is removed after it (and must be removable)."""
    yield module_daemon
    module_daemon.remove_every_pod(crictl)


def podshimd_argv(directory: str, *extra: str) -> list[str]:
    """The command line of a podshimd with everything under ``directory``."""
    return [sys.executable, "-m", "client.podshimd", "--config", os.path.join(directory, "config.toml"),
            "--listen", "unix://" + os.path.join(directory, "run", "podshimd.sock"),
            "--runtime-root", os.path.join(directory, "run"), "--state-root", os.path.join(directory, "state"),
            "--cni-conf-dir", os.path.join(directory, "net.d"), *extra]


@contextmanager
def running_podshimd(directory: str, *extra: str, config: str = "", netns: str | None = None,
                     env: dict[str, str] | None = None, image: Any = None) -> Iterator[Podshimd]:
    """Run podshimd under ``directory`` (its config.toml holds ``config``; in the network namespace
    pinned at ``netns`` if given; with ``env`` added to its environment) until the block ends.
    ``image`` (an imagebuild.Image of the tests' registry), when given, is pulled once the daemon
    is ready (its registry marked plain HTTP in the config) and is the daemon's ``image``."""
    if image is not None:
        config += f'[registries."{image.ref.split("/", 1)[0]}"]\ninsecure = true\n'
    # Searchable, as /var/lib is: runc and crun look a pod's root up from inside its user namespace.
    os.chmod(directory, 0o711)
    with open(os.path.join(directory, "config.toml"), "w") as f:
        f.write(config)
    notify_path = os.path.join(directory, "notify")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)  # systemd's, played by us
    notify.bind(notify_path)
    try:
        with open(os.path.join(directory, "podshimd.log"), "wb") as log:
            argv = podshimd_argv(directory, *extra)
            if netns is not None:
                argv = ["nsenter", f"--net={netns}", "--", *argv]  # nsenter execs: the pid is podshimd's
            process = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL,
                                       stdout=log, stderr=subprocess.STDOUT,
                                       env={**os.environ, **(env or {}), "NOTIFY_SOCKET": notify_path})
        daemon = Podshimd(directory, process)
        try:
            _wait_ready(daemon, notify)
            if image is not None:
                from shim.cri.api import api_pb2
                daemon.images().PullImage(api_pb2.PullImageRequest(image=api_pb2.ImageSpec(image=image.ref)),
                                          timeout=START_TIMEOUT)
                daemon.image = image.ref
            yield daemon
        finally:
            daemon.stop()
            stop_template(daemon.runtime_root)  # the shim template its first pod started (config template)
    finally:
        notify.close()
        os.unlink(notify_path)


def _wait_ready(daemon: Podshimd, notify: socket.socket) -> None:
    # Wait for READY=1 or the process's exit, whichever comes first: a pidfd is readable at exit.
    pidfd = os.pidfd_open(daemon.process.pid)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([notify.fileno(), pidfd], [], [], left)
            if notify.fileno() in readable:
                lines = notify.recv(4096).decode().splitlines()
                if "READY=1" in lines:
                    return
            elif pidfd in readable:
                daemon.process.wait()
                raise AssertionError(f"podshimd exited with {daemon.process.returncode} before it was ready:\n"
                                     f"{daemon.log()}")
        raise AssertionError(f"podshimd sent no READY=1 within {START_TIMEOUT} s:\n{daemon.log()}")
    finally:
        os.close(pidfd)


# -- critest runs ------------------------------------------------------------------------------------

def cni_config(directory: str, *, portmap: bool = True) -> None:
    """podshimd's CNI network under ``directory``/net.d for critest: a bridge (its IPAM leases under
    ``directory``/ipam), then portmap (critest's host-port specs) unless ``portmap`` is False."""
    plugins: list[dict[str, Any]] = [
        {"type": "bridge", "bridge": "crit0", "isGateway": True, "ipMasq": False,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.214.0.0/24"}]],
                  "dataDir": os.path.join(directory, "ipam")}}]
    if portmap:
        plugins.append({"type": "portmap", "capabilities": {"portMappings": True}})
    os.makedirs(os.path.join(directory, "net.d"))
    with open(os.path.join(directory, "net.d", "10-critest.conflist"), "w") as f:
        json.dump({"cniVersion": "1.0.0", "name": "critest", "plugins": plugins}, f)


def critest_in(netns: str, critest: str, directory: str) -> str:
    """A script under ``directory`` that runs critest inside ``netns`` (run_critest runs the binary it
    is given)."""
    path = os.path.join(directory, "critest-in-netns")
    with open(path, "w") as f:
        f.write(f'#!/bin/sh\nexec nsenter --net={netns} -- {critest} "$@"\n')
    os.chmod(path, 0o755)
    return path


#: Seconds a whole critest run may take (its specs run one after another; several have minute-long waits).
CRITEST_TIMEOUT = 3600.0


@dataclass(frozen=True)
class CritestResult:
    """What a critest run reported: ginkgo's summary, and each spec's state by its whole text
    ("[k8s.io] Image Manager public image ... pulled and removed [Conformance] [Serial]" ->
    "passed", "failed", "skipped", "pending", "panicked", "timedout", ...) with the failures' messages."""

    returncode: int
    output: str
    ran: int = 0
    total: int = 0
    passed: int = 0
    failed: int = 0
    pending: int = 0
    skipped: int = 0
    specs: Mapping[str, str] = field(default_factory=dict)
    messages: Mapping[str, str] = field(default_factory=dict)  #: spec -> its failure's message

    @property
    def failures(self) -> tuple[str, ...]:
        """The specs that ran and did not pass."""
        return tuple(name for name, state in self.specs.items() if state not in ("passed", "skipped", "pending"))

    def summary(self) -> str:
        return (f"ran {self.ran} of {self.total}: {self.passed} passed, {self.failed} failed, "
                f"{self.skipped} skipped, {self.pending} pending")


@dataclass(frozen=True)
class ExpectedSpecs:
    """Specs (``pattern``, a regular expression searched in the spec's whole text) that end in
    ``state`` rather than as expected otherwise, with the ``handlers`` it holds for (all when empty),
    and why. ``or_fails_with``: a regular expression of a failure that is not the runtime's under test
    (a race of the CRI plugin in front of it, seen with its reference runtime too): the spec may also
    fail with exactly that message, and with no other."""

    pattern: str
    state: str
    reason: str
    handlers: tuple[str, ...] = ()
    or_fails_with: str | None = None


def critest_surprises(result: CritestResult, expected: Sequence[ExpectedSpecs], handler: str,
                      reference: Mapping[str, str] | None = None) -> list[str]:
    """Each spec of ``result`` (critest run with ``handler``) that did not end as the entry of
    ``expected`` that matches it says, or, matched by none, passed (or, given ``reference``, another
    run's states: as it ended there); then each entry of the handler's that no spec matched."""
    entries = [e for e in expected if not e.handlers or handler in e.handlers]
    used: set[int] = set()
    out = []
    for name, state in sorted(result.specs.items()):
        matching = [i for i, e in enumerate(entries) if re.search(e.pattern, name)]
        assert len(matching) <= 1, f"{name!r} matches several expected entries"
        used.update(matching)
        want = entries[matching[0]].state if matching else (reference or {}).get(name, "passed")
        tolerated = entries[matching[0]].or_fails_with if matching else None
        if tolerated and state == "failed" and re.search(tolerated, result.messages.get(name, "")):
            continue
        if state != want and (matching or state != "passed"):
            message = result.messages.get(name, "").strip().splitlines()[:3]
            out.append(f"{name}: {state}, expected {want}" + (f" ({' / '.join(message)})" if message else ""))
    out += [f"EXPECTED entry {e.pattern!r} matched no spec" for i, e in enumerate(entries) if i not in used]
    return out


def parse_critest(returncode: int, output: str, report: list[dict[str, Any]] | None = None) -> CritestResult:
    """Read ginkgo v2's summary ("Ran 80 of 85 Specs", "FAIL! -- 70 Passed | 10 Failed | 0 Pending |
    5 Skipped") from critest's output, and each spec's state from its JSON ``report``
    (--ginkgo.json-report)."""
    fields: dict[str, Any] = {}
    ran = re.search(r"^Ran (\d+) of (\d+) Specs", output, re.M)
    if ran:
        fields["ran"], fields["total"] = int(ran.group(1)), int(ran.group(2))
    counts = re.search(r"(\d+) Passed \| (\d+) Failed \| (\d+) Pending \| (\d+) Skipped", output)
    if counts:
        fields.update(zip(("passed", "failed", "pending", "skipped"), map(int, counts.groups()), strict=False))
    specs, messages = {}, {}
    for suite in report or ():
        for spec in suite.get("SpecReports") or ():
            if spec.get("LeafNodeType") != "It":
                continue
            name = " ".join([*spec.get("ContainerHierarchyTexts", ()), spec.get("LeafNodeText", "")])
            specs[name] = spec.get("State", "")
            if (spec.get("Failure") or {}).get("Message"):
                messages[name] = spec["Failure"]["Message"]
    return CritestResult(returncode, output, **fields, specs=specs, messages=messages)


def run_critest(critest: str, endpoint: str, *, focus: str | None = None, skip: str | None = None,
                extra: Sequence[str] = (), cwd: str | None = None, timeout: float = CRITEST_TIMEOUT) -> CritestResult:
    """Run critest against the CRI ``endpoint`` (runtime and image service; with critest's images,
    tests/support/imagebuild.py's ``critest_images``, the runtime must mirror the registries of their
    ``mirrors``), only the specs matching ``focus`` and not ``skip`` (regular expressions), in
    ``cwd``; its summary parsed (no exception when specs fail)."""
    with tempfile.TemporaryDirectory(prefix="critest-report-") as scratch:
        report_path = os.path.join(scratch, "report.json")
        argv = [critest, "--runtime-endpoint", endpoint, "--image-endpoint", endpoint, "--ginkgo.no-color",
                f"--ginkgo.json-report={report_path}"]
        if focus:
            argv += ["--ginkgo.focus", focus]
        if skip:
            argv += ["--ginkgo.skip", skip]
        done = subprocess.run([*argv, *extra], cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout)
        try:
            with open(report_path) as f:
                report = json.load(f)
        except (OSError, ValueError):
            report = None  # critest ended before writing it: the output says why
    return parse_critest(done.returncode, done.stdout + done.stderr, report)
