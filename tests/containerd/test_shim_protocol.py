"""``containerd-shim-podshim-v1`` spoken to as containerd speaks to it, without containerd: ``start``
with a protobuf BootstrapParams on stdin prints only a protobuf BootstrapResult (version 3, ttrpc),
the shim forked by it or by the runtime root's template;
the shim serves containerd's Sandbox service (a pod from CRI's PodSandboxConfig, its lifecycle) and
Task v3 (the sandbox's reconnect calls, a container from an OCI bundle, whose events reach containerd's
Events/Forward) over protobuf, beside its own msgpack services on the same
socket; it exits after ShutdownSandbox, and ``delete`` prints the pause's exit as a DeleteResponse.
Whatever a test ends in, ``delete`` and a SIGKILL through a pidfd leave nothing running.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys

import msgpack
import pytest
from google.protobuf import any_pb2, empty_pb2

from shim.api.names import SANDBOX_SERVICE as PODSHIM_SANDBOX
from shim.api.names import TEMPLATE_SERVICE
from shim.api.paths import control_socket_path
from shim.containerd.api import load
from shim.containerd.events import task_events
from shim.containerd.services import SANDBOX_SERVICE as SANDBOX
from shim.containerd.services import TASK_SERVICE as TASK
from shim.containerd.services import sandbox_pb2, task_pb2
from shim.cri.api import api_pb2
from shim.daemon import SHUTDOWN_TIMEOUT
from shim.rpc import Client, FailedPrecondition, InvalidArgument, blocking
from shim.rpc.codecs import PROTOBUF

from support.eventsink import events_arrived, fake_containerd_events
from support.shimtools import WAIT, ProcessRef, Template, new_id

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
bootstrap_pb2 = load("runtime.bootstrap.v1.bootstrap_pb2")
task_v2_pb2 = load("runtime.task.v2.shim_pb2")
mount_pb2 = load("types.mount_pb2")
NAMESPACE = "k8s.io"
METADATA = {"containerd-namespace": [NAMESPACE]}
#: Seconds in which a shim that closed containerd's connection first after ShutdownSandbox would have.
PEER_CLOSES_FIRST = 0.5


def run_shim_binary(bundle: str, root: str, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """The command as containerd runs it (flags, working directory the bundle), on this checkout."""
    env = {**os.environ, "PYTHONPATH": REPO, "PODSHIM_RUNTIME_ROOT": root}
    return subprocess.run([sys.executable, "-P", "-c", "from shim.containerd.cli import run; run()",
                           "-namespace", NAMESPACE, "-address", "/run/containerd/containerd.sock",
                           "-publish-binary", "/usr/bin/containerd", *args],
                          input=stdin, capture_output=True, cwd=bundle, env=env, timeout=30)


class Started:
    def __init__(self, bundle: str, root: str, sandbox_id: str, address: str, shim: ProcessRef):
        self.bundle, self.root, self.sandbox_id, self.address, self.shim = bundle, root, sandbox_id, address, shim

    def delete(self) -> subprocess.CompletedProcess[bytes]:
        return run_shim_binary(self.bundle, self.root, "-id", self.sandbox_id, "-bundle", self.bundle, "delete")


@pytest.fixture(params=["forked", "template"])
def started(request, tmp_path):
    """A shim started by ``start``, forked by it or by the runtime root's template (then running);
    deleted (and killed if still alive) whatever the test did."""
    bundle, root = tmp_path / "bundle", tmp_path / "root"
    bundle.mkdir()
    sandbox_id = new_id()
    template = Template(str(root)) if request.param == "template" else None
    if template is not None:
        template.start()
        request.addfinalizer(template.stop)
    params = bootstrap_pb2.BootstrapParams(instance_id=sandbox_id, namespace=NAMESPACE,
                                           containerd_ttrpc_address=str(tmp_path / "ttrpc.sock"))
    done = run_shim_binary(str(bundle), str(root), "-id", sandbox_id, "start", stdin=params.SerializeToString())
    assert (done.returncode, done.stderr) == (0, b"")
    result = bootstrap_pb2.BootstrapResult.FromString(done.stdout)
    assert (result.version, result.protocol) == (3, "ttrpc")
    assert result.SerializeToString() == done.stdout  # nothing else on stdout
    if template is not None:
        assert blocking.call(f"unix://{control_socket_path(str(root))}", TEMPLATE_SERVICE, "Ping")["spawned"] == 1
    with open(bundle / "podshim" / "state.json") as f:
        shim = ProcessRef(json.load(f)["shim_pid"])
    it = Started(str(bundle), str(root), sandbox_id, result.address, shim)
    try:
        yield it
    finally:
        it.delete()
        shim.kill(signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitid(os.P_PIDFD, shim.fd, os.WEXITED | os.WNOHANG)
        shim.close()


async def call(client: Client, service: str, method: str, request, response_type):
    return response_type.FromString(await client.call(service, method, request.SerializeToString(),
                                                      metadata=METADATA, timeout=WAIT * 2))


def pod_options(hostname: str) -> any_pb2.Any:
    config = api_pb2.PodSandboxConfig(metadata=api_pb2.PodSandboxMetadata(name="web", namespace="default", uid="u1"),
                                      hostname=hostname)
    return any_pb2.Any(type_url="runtime.v1.PodSandboxConfig", value=config.SerializeToString())


async def test_a_pod_runs_stops_and_goes_through_containerds_sandbox_service_and_nothing_is_left(started) -> None:
    sid = started.sandbox_id
    async with await Client.connect(started.address, codec=PROTOBUF) as pb:
        await call(pb, SANDBOX, "CreateSandbox", sandbox_pb2.CreateSandboxRequest(
            sandbox_id=sid, bundle_path=started.bundle, options=pod_options("web-1")), sandbox_pb2.CreateSandboxResponse)
        begun = await call(pb, SANDBOX, "StartSandbox", sandbox_pb2.StartSandboxRequest(sandbox_id=sid),
                           sandbox_pb2.StartSandboxResponse)
        pause = ProcessRef(begun.pid)
        try:
            assert begun.created_at.seconds > 0
            status = await call(pb, SANDBOX, "SandboxStatus", sandbox_pb2.SandboxStatusRequest(sandbox_id=sid, verbose=True),
                                sandbox_pb2.SandboxStatusResponse)
            assert (status.sandbox_id, status.pid, status.state) == (sid, begun.pid, "SANDBOX_READY")
            netns = status.info["netns_path"]
            assert os.path.exists(netns)
            platform = await call(pb, SANDBOX, "Platform", sandbox_pb2.PlatformRequest(sandbox_id=sid),
                                  sandbox_pb2.PlatformResponse)
            assert platform.platform.os == "linux"
            connected = await call(pb, TASK, "Connect", task_pb2.ConnectRequest(id=sid), task_pb2.ConnectResponse)
            assert (connected.shim_pid, connected.task_pid) == (started.shim.pid, begun.pid)
            pids = await call(pb, TASK, "Pids", task_pb2.PidsRequest(id=sid), task_pb2.PidsResponse)
            assert [p.pid for p in pids.processes] == [begun.pid]
            # The pod's cgroup figures, as containerd's cgroups Metrics (v1 or v2, as this host keeps them).
            metric = (await call(pb, SANDBOX, "SandboxMetrics", sandbox_pb2.SandboxMetricsRequest(sandbox_id=sid),
                                 sandbox_pb2.SandboxMetricsResponse)).metrics
            assert metric.id == sid and metric.timestamp.seconds > 0
            if metric.data.type_url == "io.containerd.cgroups.v1.Metrics":
                figures = load("cgroups.cgroup1.stats.metrics_pb2").Metrics.FromString(metric.data.value)
                memory = figures.memory.usage.usage
            else:
                assert metric.data.type_url == "io.containerd.cgroups.v2.Metrics"
                figures = load("cgroups.cgroup2.stats.metrics_pb2").Metrics.FromString(metric.data.value)
                memory = figures.memory.usage
            assert figures.pids.current == 1 and memory > 0  # the pause
            with pytest.raises(FailedPrecondition, match=f"task {sid} is the sandbox"):
                await call(pb, TASK, "Create", task_pb2.CreateTaskRequest(id=sid), task_pb2.CreateTaskResponse)
            with pytest.raises(InvalidArgument, match="bundle '' must be an absolute path"):
                await call(pb, TASK, "Create", task_pb2.CreateTaskRequest(id="c1"), task_pb2.CreateTaskResponse)
            async with await Client.connect(started.address) as mp:  # our own services, same socket
                assert (await mp.call(PODSHIM_SANDBOX, "SandboxStatus", {"sandbox_id": sid}))["state"] == "running"

            await call(pb, SANDBOX, "StopSandbox", sandbox_pb2.StopSandboxRequest(sandbox_id=sid),
                       sandbox_pb2.StopSandboxResponse)
            waited = await call(pb, SANDBOX, "WaitSandbox", sandbox_pb2.WaitSandboxRequest(sandbox_id=sid),
                                sandbox_pb2.WaitSandboxResponse)
            assert waited.exit_status == 128 + signal.SIGKILL
            await pause.exited()
            status = await call(pb, SANDBOX, "SandboxStatus", sandbox_pb2.SandboxStatusRequest(sandbox_id=sid),
                                sandbox_pb2.SandboxStatusResponse)
            assert status.state == "SANDBOX_NOTREADY"
            await call(pb, SANDBOX, "ShutdownSandbox", sandbox_pb2.ShutdownSandboxRequest(sandbox_id=sid),
                       sandbox_pb2.ShutdownSandboxResponse)
            # containerd closes the connection once it has the answer, and the shim leaves that to
            # it: were the shim to close first, containerd's ttrpc client could report the answered
            # call as 'ttrpc: closed'.
            await asyncio.sleep(PEER_CLOSES_FIRST)
            assert not pb.closed and not started.shim.has_exited()
        finally:
            pause.kill()
            pause.close()
    await started.shim.exited(WAIT * 2)  # the shim ends by itself once containerd closed the connection
    deleted = started.delete()
    assert deleted.returncode == 0, deleted.stderr
    response = task_v2_pb2.DeleteResponse.FromString(deleted.stdout)
    assert (response.pid, response.exit_status) == (begun.pid, 128 + signal.SIGKILL)
    assert not os.path.exists(netns)
    assert not os.path.exists(started.address.removeprefix("unix://"))


async def test_after_shutdownsandbox_the_shim_ends_even_if_containerd_never_closes_its_connection(started) -> None:
    sid = started.sandbox_id
    async with await Client.connect(started.address, codec=PROTOBUF) as pb:
        await call(pb, SANDBOX, "CreateSandbox", sandbox_pb2.CreateSandboxRequest(
            sandbox_id=sid, bundle_path=started.bundle, options=pod_options("web-1")), sandbox_pb2.CreateSandboxResponse)
        await call(pb, SANDBOX, "ShutdownSandbox", sandbox_pb2.ShutdownSandboxRequest(sandbox_id=sid),
                   sandbox_pb2.ShutdownSandboxResponse)
        await started.shim.exited(SHUTDOWN_TIMEOUT + WAIT)  # the connection still open
        await asyncio.wait_for(pb.wait_closed(), WAIT)


def test_delete_after_a_start_that_made_nothing_reports_an_unknown_exit(tmp_path) -> None:
    done = run_shim_binary(str(tmp_path), str(tmp_path / "root"), "-id", "sb1", "-bundle", str(tmp_path), "delete")
    assert done.returncode == 0, done.stderr
    response = task_v2_pb2.DeleteResponse.FromString(done.stdout)
    assert (response.pid, response.exit_status) == (0, 255)


@pytest.mark.parametrize("args, said", [
    (("-id", "sb1", "-frobnicate", "start"), b"flag provided but not defined: -frobnicate"),
    (("-id", "sb1", "restart"), b"expected one action, start or delete, after the flags; got ['restart']"),
    (("-namespace", "k8s.io", "-id", "sb1", "start"), b"containerd's ttrpc address is unknown"),
])
def test_a_command_line_containerd_would_not_write_is_refused_with_a_sentence(tmp_path, args, said) -> None:
    env_less = {k: v for k, v in os.environ.items() if k != "TTRPC_ADDRESS"}
    done = subprocess.run([sys.executable, "-P", "-c", "from shim.containerd.cli import run; run()", *args],
                          capture_output=True, cwd=tmp_path, env={**env_less, "PYTHONPATH": REPO,
                                                                  "PODSHIM_RUNTIME_ROOT": str(tmp_path / "root")},
                          timeout=30)
    assert done.returncode == 2
    assert said in done.stderr and done.stdout == b""


async def run_a_container_to_its_end(pb: Client, sid: str, tmp_path) -> int:
    """A sandbox's container from an OCI bundle: created, started, waited for (exit 3) and
    deleted; returns its pid."""
    await call(pb, SANDBOX, "CreateSandbox", sandbox_pb2.CreateSandboxRequest(
        sandbox_id=sid, options=pod_options("app")), sandbox_pb2.CreateSandboxResponse)
    pause = (await call(pb, SANDBOX, "StartSandbox", sandbox_pb2.StartSandboxRequest(sandbox_id=sid),
                        sandbox_pb2.StartSandboxResponse)).pid
    bundle = tmp_path / "c1"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({
        "ociVersion": "1.2.0", "root": {"path": "rootfs"},
        "process": {"args": ["/bin/sh", "-c", "echo hi; exit 3"], "cwd": "/", "env": ["PATH=/usr/bin:/bin"],
                    "user": {"uid": 0, "gid": 0}},
        "linux": {"namespaces": [{"type": "pid"}, {"type": "mount"},
                                 *({"type": kind, "path": f"/proc/{pause}/ns/{ns}"}
                                   for kind, ns in (("network", "net"), ("ipc", "ipc"), ("uts", "uts")))]}}))
    node_root = mount_pb2.Mount(type="bind", source="/", options=["rbind", "ro"])  # the node's programs
    await call(pb, TASK, "Create", task_pb2.CreateTaskRequest(id="c1", bundle=str(bundle), rootfs=[node_root]),
               task_pb2.CreateTaskResponse)
    begun = await call(pb, TASK, "Start", task_pb2.StartRequest(id="c1"), task_pb2.StartResponse)
    waited = await call(pb, TASK, "Wait", task_pb2.WaitRequest(id="c1"), task_pb2.WaitResponse)
    assert waited.exit_status == 3
    deleted = await call(pb, TASK, "Delete", task_pb2.DeleteRequest(id="c1"), task_pb2.DeleteResponse)
    assert (deleted.pid, deleted.exit_status) == (begun.pid, 3)
    pid: int = begun.pid
    return pid


TASK_EVENTS = [("/tasks/create", NAMESPACE, "containerd.events.TaskCreate"),
               ("/tasks/start", NAMESPACE, "containerd.events.TaskStart"),
               ("/tasks/exit", NAMESPACE, "containerd.events.TaskExit"),
               ("/tasks/delete", NAMESPACE, "containerd.events.TaskDelete")]


async def test_a_container_from_an_oci_bundle_runs_and_its_events_reach_containerd(started, tmp_path) -> None:
    sid = started.sandbox_id
    async with fake_containerd_events(str(tmp_path / "ttrpc.sock")) as (received, arrived), \
            await Client.connect(started.address, codec=PROTOBUF) as pb:
        pid = await run_a_container_to_its_end(pb, sid, tmp_path)
        await events_arrived(received, arrived, 4, WAIT * 4)
        assert [(e.topic, e.namespace, e.event.type_url) for e in received] == TASK_EVENTS
        exit = task_events.TaskExit.FromString(received[2].event.value)
        assert (exit.container_id, exit.pid, exit.exit_status) == ("c1", pid, 3)
        await call(pb, SANDBOX, "ShutdownSandbox", sandbox_pb2.ShutdownSandboxRequest(sandbox_id=sid),
                   sandbox_pb2.ShutdownSandboxResponse)
    await started.shim.exited(WAIT * 2)


async def test_events_containerd_has_not_taken_are_sent_before_the_shim_exits(started, tmp_path) -> None:
    # containerd is away while the container runs (a restart): its events wait in the shim, and
    # the shim that was shut down meanwhile sends them to the containerd that is back before it exits.
    sid = started.sandbox_id
    async with await Client.connect(started.address, codec=PROTOBUF) as pb:
        await run_a_container_to_its_end(pb, sid, tmp_path)
        await call(pb, SANDBOX, "ShutdownSandbox", sandbox_pb2.ShutdownSandboxRequest(sandbox_id=sid),
                   sandbox_pb2.ShutdownSandboxResponse)
    async with fake_containerd_events(str(tmp_path / "ttrpc.sock")) as (received, arrived):
        await events_arrived(received, arrived, 4, WAIT * 2)
        assert [(e.topic, e.namespace, e.event.type_url) for e in received] == TASK_EVENTS
        await started.shim.exited(WAIT * 2)


def test_the_commands_one_error_mapping_loads_neither_the_fork_path_nor_protobuf() -> None:
    # shim.lib.program.exit_status is what podshim, containerd-shim-podshim-v1 and podshimd map errors with;
    # importing it (and the containerd command) costs none of what only forking a shim needs.
    done = subprocess.run([sys.executable, "-P", "-c", "import sys, shim.cli, shim.containerd.cli; "
                           "print(sorted(m for m in sys.modules if m.split('.')[0] in "
                           "('ctypes', 'google', 'msgpack', 'uvloop') or m == 'shim.launch.spawn'))"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO}, timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (0, "[]\n", "")


async def test_a_plain_container_of_the_shims_own_id_runs_in_a_pod_of_its_own_and_the_shim_ends_with_it(started,
                                                                                                       tmp_path) -> None:
    # containerd without a sandbox (ctr run): Task Create of the shim's own id; Shutdown after Delete.
    sid = started.sandbox_id
    bundle = tmp_path / "plain"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({
        "ociVersion": "1.2.0", "root": {"path": "rootfs"}, "hostname": "plain",
        "process": {"args": ["/bin/sh", "-c", "hostname; readlink /proc/self/ns/net; exit 3"], "cwd": "/",
                    "env": ["PATH=/usr/bin:/bin"], "user": {"uid": 0, "gid": 0}},
        "linux": {"namespaces": [{"type": kind} for kind in ("pid", "mount", "network", "ipc", "uts")]}}))
    output = tmp_path / "out"
    os.mkfifo(output)
    reader = os.open(output, os.O_RDONLY | os.O_NONBLOCK)
    try:
        async with await Client.connect(started.address, codec=PROTOBUF) as pb:
            node_root = mount_pb2.Mount(type="bind", source="/", options=["rbind", "ro"])
            await call(pb, TASK, "Create", task_pb2.CreateTaskRequest(id=sid, bundle=str(bundle), rootfs=[node_root],
                                                                      stdout=str(output)), task_pb2.CreateTaskResponse)
            begun = await call(pb, TASK, "Start", task_pb2.StartRequest(id=sid), task_pb2.StartResponse)
            connected = await call(pb, TASK, "Connect", task_pb2.ConnectRequest(id=sid), task_pb2.ConnectResponse)
            assert connected.task_pid == begun.pid  # the container, not its pause
            waited = await call(pb, TASK, "Wait", task_pb2.WaitRequest(id=sid), task_pb2.WaitResponse)
            assert waited.exit_status == 3
            deleted = await call(pb, TASK, "Delete", task_pb2.DeleteRequest(id=sid), task_pb2.DeleteResponse)
            assert (deleted.pid, deleted.exit_status) == (begun.pid, 3)
            hostname, netns = os.read(reader, 4096).decode().split()
            assert hostname == "plain" and netns != os.readlink("/proc/self/ns/net")  # its pod's own
            await call(pb, TASK, "Shutdown", task_pb2.ShutdownRequest(id=sid), empty_pb2.Empty)
    finally:
        os.close(reader)
    await started.shim.exited(WAIT * 2)  # the shim ends with its container's pod


def test_a_privileged_containers_devices_make_a_privileged_task_and_other_devices_are_refused() -> None:
    from shim.containerd.tasks import task_fields
    from shim.runtime.mounts import host_devices

    def spec(devices: list[dict]) -> dict:
        return {"process": {"args": ["true"]}, "linux": {"namespaces": [{"type": "pid"}], "devices": devices}}

    every = [{"path": d.path, "type": d.kind, "major": d.major, "minor": d.minor} for d in host_devices()]
    standard = [{"path": "/dev/null", "type": "c", "major": 1, "minor": 3},
                {"path": "/dev/ptmx", "type": "c", "major": 5, "minor": 2}]  # as containerd lists the host's
    assert task_fields(spec(every + standard), [], 1)["privileged"] is True
    assert task_fields(spec([]), [], 1)["privileged"] is False
    with pytest.raises(InvalidArgument, match=r"devices other than all of the host's .* differ"):
        task_fields(spec(every[1:]), [], 1)


def test_config_json_hooks_are_the_tasks_hooks() -> None:
    from shim.containerd.tasks import task_fields

    hook = {"path": "/usr/bin/cdi-hook", "args": ["cdi-hook", "x"], "env": ["A=1"], "timeout": 5}
    spec = {"process": {"args": ["true"]}, "linux": {"namespaces": [{"type": "pid"}]},
            "hooks": {"poststop": [{"path": "/bin/true"}], "createContainer": [hook]}}
    assert task_fields(spec, [], 1)["hooks"] == [{"hook_name": "createContainer", **hook},
                                                 {"hook_name": "poststop", "path": "/bin/true"}]
    with pytest.raises(InvalidArgument, match="config.json hooks: the points are prestart, .*, not atLunch"):
        task_fields({**spec, "hooks": {"atLunch": [hook]}}, [], 1)


def test_info_answers_a_runtime_info_whose_features_are_what_the_shim_applies(tmp_path) -> None:
    # containerd runs `-info` with the runtime options (an Any) on stdin; its CRI reads the handler's
    # features (recursive read-only mounts, user namespaces) from the runtime-spec features document.
    from shim.containerd.features import BIND_OPTIONS
    from shim.runtime.mounts import TMPFS_FLAGS

    introspection = load("types.introspection_pb2")
    options = any_pb2.Any(type_url="runtimeoptions.v1.Options", value=b"\n\x01x")
    done = run_shim_binary(str(tmp_path), str(tmp_path / "root"), "-info", stdin=options.SerializeToString())
    assert (done.returncode, done.stderr) == (0, b"")
    info = introspection.RuntimeInfo.FromString(done.stdout)
    assert (info.name, info.options) == ("io.containerd.podshim.v1", options)
    assert info.features.type_url == "types.containerd.io/opencontainers/runtime-spec/1/features/Features"
    features = json.loads(info.features.value)
    assert "rro" in features["mountOptions"] and set(features["mountOptions"]) == BIND_OPTIONS | TMPFS_FLAGS
    assert "user" not in features["linux"]["namespaces"]  # no user namespaces through containerd yet
    assert features["linux"]["mountExtensions"]["idmap"]["enabled"] is False
    assert "CAP_SYS_ADMIN" in features["linux"]["capabilities"]


#: What the command must not load where it has no need to: an event loop, protobuf's runtime, the
#: sandbox's machinery and the kernel's modules (each costs more than the command's own work); and on
#: its fast path (shim.containerd.fastpath) not even the wire's modules, msgpack, or the standard
#: library's modules that are not built into the interpreter (json, socket, signal and what they import).
HEAVY_MODULES = ("asyncio", "google", "shim.sandbox.sandbox", "shim.kernel.cgroups", "shim.kernel.netns",
                 "shim.runtime.mounts", "shim.launch.spawn")
FAST_PATH_MODULES = (*HEAVY_MODULES, "shim.rpc", "shim.lib", "shim.cli", "shim.cleanup", "msgpack", "json", "socket",
                     "signal", "enum", "typing", "re", "logging", "collections", "hashlib")


def run_counting_modules(bundle: str, root: str, *args: str, stdin: bytes = b"") -> tuple[bytes, list[str]]:
    """The command run as the installed one runs (``python -S``, site-packages after the standard
    library, the program's run()); its stdout, and the modules of FAST_PATH_MODULES it loaded."""
    env = {**os.environ, "PYTHONPATH": REPO, "PODSHIM_RUNTIME_ROOT": root}
    site_packages = os.path.dirname(os.path.dirname(msgpack.__file__))
    program = (f"import os, sys; sys.path.append({site_packages!r}); exit = os._exit\n"
               "def counted(status):\n"
               f"    sys.stderr.write(repr(sorted(m for m in sys.modules if m.startswith({FAST_PATH_MODULES!r}))))\n"
               "    sys.stderr.flush(); exit(status)\n"
               "os._exit = counted\n"
               "from shim.containerd.cli import run; run()")
    done = subprocess.run([sys.executable, "-S", "-P", "-c", program, "-namespace", NAMESPACE, "-address",
                           "/run/containerd/containerd.sock", "-publish-binary", "/usr/bin/containerd", *args],
                          input=stdin, capture_output=True, cwd=bundle, env=env, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout, eval(done.stderr)  # (the list's repr)


async def test_start_through_a_template_and_delete_after_a_shutdown_load_nothing_heavy(tmp_path) -> None:
    # containerd runs start and delete once each per pod: with a template the shim is forked there,
    # and after a clean ShutdownSandbox nothing is left for delete to remove.
    bundle, root, sid = tmp_path / "bundle", tmp_path / "root", new_id()
    bundle.mkdir()
    template = Template(str(root))
    template.start()
    try:
        params = bootstrap_pb2.BootstrapParams(instance_id=sid, namespace=NAMESPACE,
                                               containerd_ttrpc_address=str(tmp_path / "ttrpc.sock"))
        out, loaded = run_counting_modules(str(bundle), str(root), "-id", sid, "start",
                                           stdin=params.SerializeToString())
        assert loaded == []
        result = bootstrap_pb2.BootstrapResult.FromString(out)
        assert (result.version, result.protocol, result.SerializeToString()) == (3, "ttrpc", out)
        with open(bundle / "podshim" / "state.json") as f:
            shim = ProcessRef(json.load(f)["shim_pid"])
        try:
            async with await Client.connect(result.address, codec=PROTOBUF) as pb:
                await call(pb, SANDBOX, "CreateSandbox", sandbox_pb2.CreateSandboxRequest(sandbox_id=sid),
                           sandbox_pb2.CreateSandboxResponse)
                begun = await call(pb, SANDBOX, "StartSandbox", sandbox_pb2.StartSandboxRequest(sandbox_id=sid),
                                   sandbox_pb2.StartSandboxResponse)
                await call(pb, SANDBOX, "StopSandbox", sandbox_pb2.StopSandboxRequest(sandbox_id=sid),
                           sandbox_pb2.StopSandboxResponse)
                await call(pb, SANDBOX, "ShutdownSandbox", sandbox_pb2.ShutdownSandboxRequest(sandbox_id=sid),
                           sandbox_pb2.ShutdownSandboxResponse)
            await shim.exited(WAIT * 2)
        finally:
            shim.kill(signal.SIGKILL)
            shim.close()
        out, loaded = run_counting_modules(str(bundle), str(root), "-id", sid, "-bundle", str(bundle), "delete")
        assert loaded == []
        response = task_v2_pb2.DeleteResponse.FromString(out)
        assert (response.pid, response.exit_status, response.SerializeToString()) == (begun.pid, 128 + signal.SIGKILL,
                                                                                      out)
        assert response.exited_at.seconds > 0
        with open(bundle / "podshim" / "state.json") as f:
            assert json.load(f)["state"] == "deleted"  # as podshim delete leaves it
        assert not os.path.exists(result.address.removeprefix("unix://"))
        again = run_shim_binary(str(bundle), str(root), "-id", sid, "-bundle", str(bundle), "delete")
        assert (again.returncode, again.stdout) == (0, out)  # a second delete reports the same exit
    finally:
        run_shim_binary(str(bundle), str(root), "-id", sid, "-bundle", str(bundle), "delete")
        template.stop()
