"""The shim template: shims forked from a preloaded process behave exactly like exec'd ones."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from shim.api.names import SANDBOX_SERVICE, TEMPLATE_SERVICE
from shim.api.paths import control_socket_path, socket_path
from shim.launch import template as template_module
from shim.launch.template import SPARES
from shim.rpc import Client, blocking
from shim.rpc.status import InvalidArgument, RpcError, Unavailable

from support.proctools import WAIT, alive, fd_targets, fifo_writer, wait_gone, wait_gone_async
from support.shimtools import NODE_ROOT, Template

PODSHIM = [sys.executable, "-m", "shim"]


@pytest.fixture
def roots(tmp_path):
    runtime_root = f"/tmp/podshim-tpl-{secrets.token_hex(4)}"
    started: list[tuple[str, str, str]] = []  # (sandbox id, bundle, namespace)
    yield runtime_root, tmp_path, started
    for sandbox_id, bundle, namespace in started:
        subprocess.run([*PODSHIM, "delete", "--namespace", namespace, "--id", sandbox_id, "--bundle", bundle,
                        "--runtime-root", runtime_root], capture_output=True, timeout=30)
    subprocess.run(["rm", "-rf", runtime_root])


@pytest.fixture
def template(roots):
    t = Template(roots[0])
    t.start()
    yield t
    t.stop()


def start_shim(roots, sandbox_id: str, *extra: str, namespace: str = "tpl") -> dict:
    runtime_root, tmp_path, started = roots
    bundle = str(tmp_path / sandbox_id)
    started.append((sandbox_id, bundle, namespace))
    out = subprocess.run([*PODSHIM, "start", "--namespace", namespace, "--id", sandbox_id, "--bundle", bundle,
                          "--runtime-root", runtime_root, *extra], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_template_spawned_shim_has_the_same_bootstrap_as_exec(roots, template) -> None:
    via_template = start_shim(roots, "a1")
    via_exec = start_shim(roots, "a2", "--no-template")
    assert set(via_template) == set(via_exec) == {"version", "address", "protocol", "pid", "start_time"}
    assert via_template["version"] == via_exec["version"]
    assert via_template["protocol"] == via_exec["protocol"]
    with open(os.path.join(roots[1], "a1", "bootstrap.json")) as f:
        assert json.load(f) == via_template


def test_template_is_not_the_parent_of_its_shims(roots, template) -> None:
    result = start_shim(roots, "b1")
    with open(f"/proc/{result['pid']}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ppid, pgrp, session = int(fields[1]), int(fields[2]), int(fields[3])
    assert ppid != template.proc.pid
    assert session == result["pid"] == pgrp  # its own session and process group


async def test_shim_survives_the_template_and_serves_a_sandbox(roots, template) -> None:
    result = start_shim(roots, "c1")
    template.stop()
    assert alive(result["pid"])
    client = await Client.connect(result["address"], namespace="tpl")
    try:
        await client.call(SANDBOX_SERVICE, "CreateSandbox", {"sandbox_id": "c1"})
        started = await client.call(SANDBOX_SERVICE, "StartSandbox", {"sandbox_id": "c1"})
        assert started["pid"] > 0
        await client.call(SANDBOX_SERVICE, "ShutdownSandbox", {"sandbox_id": "c1"})
        await client.wait_closed()
    finally:
        await client.aclose()
    assert not await wait_gone_async(result["pid"])


def _wait_served(result: dict, sandbox_id: str) -> None:
    """One call answered: a spare shim has moved its stdio into the bundle by then (it may
    still be setting up when `podshim start` returns)."""

    async def ping() -> None:
        async with await Client.connect(result["address"], namespace="tpl") as client:
            assert await client.call(SANDBOX_SERVICE, "PingSandbox", {"sandbox_id": sandbox_id}) == {}

    asyncio.run(ping())


def test_template_forked_shim_keeps_only_its_own_fds(roots, template) -> None:
    result = start_shim(roots, "d1")
    _wait_served(result, "d1")

    def open_objects(pid: int) -> set[str]:
        """The sockets, pipes and files a process holds (anon inodes all read alike: left out)."""
        return {t for t in fd_targets(pid) if not t.startswith("anon_inode:") and t != "/dev/null"}

    held_by_template = open_objects(template.proc.pid)
    assert any(t.startswith("socket:") for t in held_by_template)  # its control socket, at least
    inherited = held_by_template & open_objects(result["pid"])
    # never the template's control socket, nor any other socket, pipe or file the template holds
    assert not inherited
    control_inode = os.stat(control_socket_path(roots[0])).st_ino
    assert not any(str(control_inode) in t for t in open_objects(result["pid"]))
    # a leak of the template's whole table would be far past what one shim uses (stdio, its log,
    # the event loop, the listener, the netns it holds, a pipe or two in flight)
    assert len(os.listdir(f"/proc/{result['pid']}/fd")) < 32


def test_shims_forked_from_one_template_have_different_random_state(roots, template) -> None:
    a = start_shim(roots, "e1")
    b = start_shim(roots, "e2")
    # Each shim makes a netns with a random name: the names must differ, and they come from the
    # random state each child reseeded after the fork.
    names = []
    import asyncio

    async def create(address, sid):
        client = await Client.connect(address, namespace="tpl")
        try:
            await client.call(SANDBOX_SERVICE, "CreateSandbox", {"sandbox_id": sid})
            status = await client.call(SANDBOX_SERVICE, "SandboxStatus", {"sandbox_id": sid, "verbose": True})
            names.append(status["info"]["netns_path"])
            await client.call(SANDBOX_SERVICE, "ShutdownSandbox", {"sandbox_id": sid})
        finally:
            await client.aclose()

    async def both():
        await create(a["address"], "e1")
        await create(b["address"], "e2")

    asyncio.run(both())
    assert len(set(names)) == 2


def test_start_falls_back_to_exec_when_no_template_answers(roots) -> None:
    runtime_root = roots[0]
    os.makedirs(runtime_root, mode=0o700, exist_ok=True)
    # A stale control socket file (a template that died) must not stall start.
    import socket as socketlib
    s = socketlib.socket(socketlib.AF_UNIX)
    s.bind(control_socket_path(runtime_root))
    s.close()
    began = time.monotonic()
    result = start_shim(roots, "f1")
    assert time.monotonic() - began < 10
    assert alive(result["pid"])


def test_template_refuses_a_bad_identifier(roots, template) -> None:
    with pytest.raises(InvalidArgument):
        blocking.call("unix://" + control_socket_path(roots[0]), TEMPLATE_SERVICE, "Spawn",
                      {"namespace": "tpl", "sandbox_id": "../etc", "bundle": str(roots[1] / "x")})
    assert not os.path.exists(roots[1] / "x")


def test_template_restarts_on_the_same_control_socket(roots, template) -> None:
    template.stop()
    template.start()
    result = start_shim(roots, "g1")
    assert alive(result["pid"])


def test_shims_are_named_podshim_shim_however_they_started(roots, template) -> None:
    forked = start_shim(roots, "h1")
    execd = start_shim(roots, "h2", "--no-template")
    for result in (forked, execd):
        with open(f"/proc/{result['pid']}/comm") as f:
            assert f.read().strip() == "podshim-shim"
    with open(f"/proc/{template.proc.pid}/comm") as f:
        assert f.read().strip() == "podshim-tmpl"


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_template_reaps_the_intermediate_children_of_its_double_forks(roots, template) -> None:
    for n in range(3):
        start_shim(roots, f"r{n}")
    # Each intermediate child exits once it has forked (and, for a shim forked on the spot,
    # recorded) its shim; the template reaps it on SIGCHLD. What stays is the next spare's, alive and waiting.
    # An intermediate child that has exited is a zombie until the template's SIGCHLD handler runs:
    # wait for it to be reaped, not only for the count.
    deadline = time.monotonic() + 5
    while True:
        children = _children(template.proc.pid)
        if (len(children) <= 1 and all(_state(c) != "Z" for c in children)) or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert len(children) <= 1
    assert all(_state(c) != "Z" for c in children)
    assert alive(template.proc.pid)


def _ping(template) -> dict:
    return blocking.call("unix://" + control_socket_path(template.runtime_root), TEMPLATE_SERVICE, "Ping")


def _comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as f:
        return f.read().strip()


def test_template_hands_its_spare_to_the_next_spawn_and_forks_another(roots, template) -> None:
    ping = _ping(template)
    assert set(ping) == {"pid", "spawned", "runtime_root", "spare_pid", "spare_pids"}  # protocol.md 7.5
    spare = ping["spare_pid"]
    # The spares Ping reports are ready: they have named themselves already. The oldest is
    # spare_pid, the one the next Spawn takes.
    assert len(ping["spare_pids"]) == SPARES and ping["spare_pids"][0] == spare
    assert all(pid > 0 and _comm(pid) == "podshim-spare" for pid in ping["spare_pids"])
    result = start_shim(roots, "s1")
    assert result["pid"] == spare
    with open(os.path.join(roots[1], "s1", "state.json")) as f:  # `podshim delete` can find it
        assert json.load(f)["shim_pid"] == spare
    # Answered before the spare serves (protocol.md 7.5): a call made now waits in the backlog.
    assert blocking.call(result["address"], SANDBOX_SERVICE, "PingSandbox", {"sandbox_id": "s1"}, timeout=5) == {}
    assert _comm(spare) == "podshim-shim"
    # The template forks the next spare after answering the Spawn and before it serves the
    # next call, so this Ping already names it, ready.
    after = _ping(template)
    assert spare not in after["spare_pids"] and len(after["spare_pids"]) == SPARES
    assert after["spare_pid"] == ping["spare_pids"][1]  # the oldest left goes next
    assert all(_comm(pid) == "podshim-spare" for pid in after["spare_pids"])


def _net_namespaces_held(pid: int) -> set[str]:
    """The network namespaces process ``pid`` holds open by a descriptor ("net:[inode]")."""
    return {target for target in fd_targets(pid) if target.startswith("net:[")}


async def _create(address: str, sandbox_id: str, **fields) -> dict:
    client = await Client.connect(address, namespace="tpl")
    try:
        await client.call(SANDBOX_SERVICE, "CreateSandbox", {"sandbox_id": sandbox_id, **fields})
        return await client.call(SANDBOX_SERVICE, "SandboxStatus", {"sandbox_id": sandbox_id, "verbose": True})
    finally:
        await client.aclose()


async def _netns_made_ahead(template) -> set[str]:
    """The network namespaces the template's spare holds, once it holds one of its own (while
    it makes it, it also holds the host's, to return to)."""
    spare = _ping(template)["spare_pid"]
    host = os.readlink("/proc/self/ns/net")
    deadline = time.monotonic() + 5  # made right after it stands by: a bound, not a wait for readiness
    while (not (made := _net_namespaces_held(spare)) or host in made) and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    return made


async def test_the_spare_makes_its_sandbox_netns_ahead_and_create_pins_it(roots, template) -> None:
    made = await _netns_made_ahead(template)
    assert len(made) == 1 and os.readlink("/proc/self/ns/net") not in made
    result = start_shim(roots, "n1")
    status = await _create(result["address"], "n1")
    assert {f"net:[{status['info']['netns_inode']}]"} == made
    assert _net_namespaces_held(result["pid"]) == set()  # pinned by its file, not by the shim


async def test_a_host_network_sandbox_closes_the_netns_made_ahead(roots, template) -> None:
    await _netns_made_ahead(template)
    result = start_shim(roots, "n2")
    status = await _create(result["address"], "n2", options={"linux": {"security_context": {
        "namespace_options": {"network": "NODE"}}}})
    assert not status["info"].get("netns_path")
    assert _net_namespaces_held(result["pid"]) == set()


def test_a_spawn_of_a_sandbox_that_is_served_already_answers_its_shim_and_ends_the_spare_it_told(roots, template) -> None:
    # The spare is told its sandbox before the socket is bound (it makes its pieces meanwhile):
    # when a live shim serves the socket already, that spare can be no one's and must go.
    first = start_shim(roots, "r1")
    told = _ping(template)["spare_pid"]
    runtime_root, tmp_path, _ = roots
    again = blocking.call("unix://" + control_socket_path(runtime_root), TEMPLATE_SERVICE, "Spawn",
                          {"namespace": "tpl", "sandbox_id": "r1", "bundle": str(tmp_path / "r1"),
                           "runtime_root": runtime_root}, timeout=10)
    assert again["address"] == first["address"] and again["pid"] == first["pid"]
    assert not wait_gone(told)
    nxt = _ping(template)["spare_pid"]
    assert nxt not in (0, told) and _comm(nxt) == "podshim-spare"
    assert blocking.call(first["address"], SANDBOX_SERVICE, "PingSandbox", {"sandbox_id": "r1"}, timeout=5) == {}


_TELL_A_SPARE_ITS_SANDBOX = """
import sys
from shim.launch.spawn import _give_config, fork_spare
from shim.sandbox.sandbox import ShimConfig
spare = fork_spare()
assert _give_config(spare, ShimConfig(*sys.argv[1:6]), False)
print(spare.pid, flush=True)
sys.stdin.read()  # its socket never comes, and the channel stays open until the test is done
"""


@contextlib.contextmanager
def _spare_held_by(script: str, *args: str, stderr: int | None = None):
    """Run ``script`` (it forks a spare, prints the spare's pid, and keeps the spare's channel
    open until its stdin closes); yield (that process, the spare's pid); end both."""
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=stderr)
    assert proc.stdin is not None and proc.stdout is not None  # (PIPE)
    spare = 0
    try:
        spare = int(proc.stdout.readline())
        yield proc, spare
    finally:
        proc.stdin.close()
        proc.wait(10)
        proc.stdout.close()
        if spare:
            wait_gone(spare, timeout=5, kill=True)


def _catches(pid: int, sig: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        caught = next(line.split()[1] for line in f if line.startswith("SigCgt:"))
    return bool(int(caught, 16) & (1 << (sig - 1)))


def test_a_spare_told_its_sandbox_ends_on_sigterm_before_its_socket_comes(roots) -> None:
    # The spare installs its signal handlers once it is told its sandbox, before the template has
    # bound the socket: a SIGTERM meanwhile must end it then, not once (if ever) the socket comes.
    runtime_root, tmp_path, _ = roots
    bundle = str(tmp_path / "w1")
    with _spare_held_by(_TELL_A_SPARE_ITS_SANDBOX, "tpl", "w1", bundle, socket_path("tpl", "w1", runtime_root),
                        runtime_root) as (_, spare):
        deadline = time.monotonic() + 5  # a bound, not a wait for readiness
        while not _catches(spare, signal.SIGTERM) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert _catches(spare, signal.SIGTERM)
        os.kill(spare, signal.SIGTERM)
        assert not wait_gone(spare)
        assert not os.path.exists(bundle)  # it never had its socket: it touched nothing of the sandbox's


_GIVE_A_SPARE_A_BAD_ASSIGNMENT = """
import sys
from shim.launch.spawn import fork_spare
spare = fork_spare()
spare.channel.send(b'{"config": {"no such field": 1}}')
print(spare.pid, flush=True)
sys.stdin.read()
"""


def test_a_spare_that_fails_before_it_serves_says_why_where_the_template_logs() -> None:
    # Until it serves, a spare's output is its template's (ROOT/template.log when detached).
    with _spare_held_by(_GIVE_A_SPARE_A_BAD_ASSIGNMENT, stderr=subprocess.PIPE) as (proc, spare):
        assert not wait_gone(spare)
    assert "no such field" in proc.stderr.read().decode()
    proc.stderr.close()


def test_a_template_started_without_stdout_and_stderr_gives_its_spare_dev_null_for_them(roots) -> None:
    # Closed stdio numbers would otherwise be taken by the template's own descriptors (its lock,
    # its socket), which its spare keeps as its output until it serves.
    runtime_root = roots[0]
    proc = subprocess.Popen(["sh", "-c", 'exec "$@" 1>&- 2>&-', "sh", *PODSHIM, "template",
                             "--runtime-root", runtime_root])
    try:
        path = control_socket_path(runtime_root)
        deadline = time.monotonic() + 15
        spare = 0
        while not spare and time.monotonic() < deadline:  # a bound, not a wait for readiness
            try:
                spare = blocking.call("unix://" + path, TEMPLATE_SERVICE, "Ping", timeout=1)["spare_pid"]
            except RpcError:
                assert proc.poll() is None, "the template exited"
            time.sleep(0.02)
        assert spare
        assert [os.readlink(f"/proc/{spare}/fd/{fd}") for fd in (1, 2)] == [os.devnull, os.devnull]
        assert [os.readlink(f"/proc/{proc.pid}/fd/{fd}") for fd in (1, 2)] == [os.devnull, os.devnull]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


def test_a_spawn_whose_state_json_cannot_be_written_leaves_no_socket_behind(roots, template) -> None:
    runtime_root, tmp_path, _ = roots
    bundle = tmp_path / "v1"
    os.makedirs(bundle / "state.json", mode=0o700)  # the shim's first state.json cannot be written
    os.chmod(bundle, 0o700)
    told = _ping(template)["spare_pid"]
    with pytest.raises(RpcError, match="Is a directory"):
        blocking.call("unix://" + control_socket_path(runtime_root), TEMPLATE_SERVICE, "Spawn",
                      {"namespace": "tpl", "sandbox_id": "v1", "bundle": str(bundle), "runtime_root": runtime_root},
                      timeout=10)
    assert not os.path.exists(socket_path("tpl", "v1", runtime_root))
    assert not wait_gone(told)
    assert _ping(template)["spare_pid"] not in (0, told)


def test_a_dead_spare_is_passed_over_for_the_next(roots, template) -> None:
    dead, nxt = _ping(template)["spare_pids"]
    os.kill(dead, signal.SIGKILL)
    assert not wait_gone(dead)
    result = start_shim(roots, "d1")
    assert result["pid"] == nxt and alive(nxt)
    with open(os.path.join(roots[1], "d1", "state.json")) as f:
        assert json.load(f)["shim_pid"] == nxt
    assert dead not in _ping(template)["spare_pids"]


def test_with_every_spare_dead_a_spawn_forks_its_shim(roots, template) -> None:
    spares = _ping(template)["spare_pids"]
    for pid in spares:
        os.kill(pid, signal.SIGKILL)
    assert not wait_gone(*spares)
    result = start_shim(roots, "d2")
    assert result["pid"] not in spares and alive(result["pid"])
    with open(os.path.join(roots[1], "d2", "state.json")) as f:
        assert json.load(f)["shim_pid"] == result["pid"]
    assert len(_ping(template)["spare_pids"]) == SPARES  # and it forks new spares after


def test_a_double_forked_shim_is_reported_by_its_own_pid_even_when_it_is_ready_first() -> None:
    # The intermediate child of the double fork reports the shim's pid after recording it in
    # state.json; a shim that comes up fast has said "R" by then.
    from shim.launch.spawn import _wait_ready

    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, b"R")
        reporter = threading.Thread(target=os.write, args=(write_fd, b"P4242\n"))
        reporter.start()
        assert _wait_ready(read_fd, 5.0, want_pid=True) == (4242, True)
        reporter.join()
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_a_caller_that_connects_and_sends_nothing_holds_up_no_other(roots, template) -> None:
    # A busy daemon may connect and only later send its Spawn: every other caller is served meanwhile.
    import socket

    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.connect(control_socket_path(template.runtime_root))
    try:
        started = time.monotonic()
        spares = _ping(template)["spare_pids"]
        result = start_shim(roots, "q1")
        assert result["pid"] == spares[0] and alive(result["pid"])  # forked by the template, not exec'd
        assert time.monotonic() - started < template_module.CONTROL_IO_TIMEOUT
    finally:
        silent.close()


_RUNTIME_DEFAULT_AFTER_PRELOAD = """
from shim.launch import template
template._preload()
from shim.cri import security
from shim.kernel import seccomp
from shim.rpc.messages import pack, unpack
before = seccomp._compile.cache_info()
# A RuntimeDefault pod's pause as the CRI layer asks for it, as a shim receives it (msgpack).
sec = security.ContainerSecurity.from_doc({"seccomp": {"profile_type": "RuntimeDefault"}})
profile = unpack(pack(security.pause_fields(sec)))["seccomp"]
seccomp.compile_profile(profile)
after = seccomp._compile.cache_info()
print(before.currsize, after.hits - before.hits, after.misses - before.misses)
"""


def test_a_shim_forked_from_the_template_finds_the_runtime_default_seccomp_profile_compiled() -> None:
    # libseccomp's load and the compile were tens of ms of CPU in each shim's CreateSandbox.
    out = subprocess.run([sys.executable, "-c", _RUNTIME_DEFAULT_AFTER_PRELOAD], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    cached, hits, misses = map(int, out.stdout.split())
    assert (cached, hits, misses) == (1, 1, 0)


def test_the_spares_go_with_the_template(roots, template) -> None:
    spares = _ping(template)["spare_pids"]
    template.stop()
    assert not wait_gone(*spares)


_SERVE_AFTER_PRELOAD = """
import json, sys
from shim.launch import template
template._preload()
from shim.daemon import serve_forever
from shim.sandbox.sandbox import ShimConfig
from shim.launch.spawn import bind_listener
namespace, sandbox_id, bundle, socket_path, runtime_root = sys.argv[1:6]
listener = bind_listener(socket_path)
print("listening", flush=True)  # connections wait in the backlog from now on
before = set(sys.modules)
serve_forever(ShimConfig(namespace, sandbox_id, bundle, socket_path, runtime_root), listener)
print(json.dumps(sorted(set(sys.modules) - before)))
"""


async def test_a_shim_forked_from_the_template_imports_nothing_in_a_sandbox_life(roots):
    # What the template preloads is all a shim needs: serving a sandbox's whole life (with a
    # task) after the preload imports no module (an import there would cost every sandbox).
    from shim.api.names import TASK_SERVICE
    from shim.api.paths import socket_path

    runtime_root, tmp_path, started = roots
    sid = f"imp-{secrets.token_hex(4)}"
    bundle = str(tmp_path / sid)
    os.makedirs(bundle, mode=0o700)
    started.append((sid, bundle, "tpl"))
    path = socket_path("tpl", sid, runtime_root)
    proc = subprocess.Popen([sys.executable, "-c", _SERVE_AFTER_PRELOAD, "tpl", sid, bundle, path, runtime_root],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        said = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 15)
        assert said == b"listening\n", "the shim did not come up"
        client = await Client.connect("unix://" + path, namespace="tpl")
        try:
            call = client.call
            await call(SANDBOX_SERVICE, "CreateSandbox", {"sandbox_id": sid})
            await call(SANDBOX_SERVICE, "StartSandbox", {"sandbox_id": sid})
            await call(SANDBOX_SERVICE, "SandboxStatus", {"sandbox_id": sid, "verbose": True})
            await call(SANDBOX_SERVICE, "SandboxMetrics", {"sandbox_id": sid})
            await call(SANDBOX_SERVICE, "Platform", {"sandbox_id": sid})
            task = {"sandbox_id": sid, "task_id": "app"}
            await call(TASK_SERVICE, "Create", {**task, "args": ["sleep", "30"], "rootfs": NODE_ROOT, "readonly_rootfs": True,
                                                "log_path": str(tmp_path / "app.log")})
            await call(TASK_SERVICE, "Start", task)
            await call(TASK_SERVICE, "Kill", {**task, "signal": signal.SIGKILL})
            await call(TASK_SERVICE, "Wait", task)
            await call(TASK_SERVICE, "Delete", task)
            await call(SANDBOX_SERVICE, "StopSandbox", {"sandbox_id": sid})
            await call(SANDBOX_SERVICE, "WaitSandbox", {"sandbox_id": sid})
            await call(SANDBOX_SERVICE, "ShutdownSandbox", {"sandbox_id": sid})
        finally:
            await client.aclose()
        out, _ = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert json.loads(out) == []


# -- one template per runtime root, and never one running code older than what is installed -------
def _detach(runtime_root: str, *command: str) -> dict:
    out = subprocess.run([*(command or PODSHIM), "template", "--detach", "--runtime-root", runtime_root],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _stop(pid: int) -> None:
    os.kill(pid, signal.SIGTERM)
    assert not wait_gone(pid)


def test_template_detach_starts_one_in_its_own_session_and_later_callers_find_it(roots) -> None:
    first = _detach(roots[0])
    try:
        assert first["started"] and _comm(first["pid"]) == "podshim-tmpl"
        with open(f"/proc/{first['pid']}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        assert int(fields[1]) != os.getpid() and int(fields[3]) == first["pid"]  # not ours; its own session
        again = _detach(roots[0])
        assert (again["pid"], again["started"]) == (first["pid"], False)
        assert _ping(Template(roots[0]))["pid"] == first["pid"]
    finally:
        _stop(first["pid"])


def test_a_second_template_on_a_runtime_root_refuses_to_start(roots, template) -> None:
    from shim.launch.template import TemplateRunning, run_template

    with pytest.raises(TemplateRunning, match=f"another template \\(pid {template.proc.pid}\\) runs on"):
        run_template(roots[0], lock_timeout=0.2)
    assert _ping(template)["pid"] == template.proc.pid


def _append(install) -> None:
    with open(install / "shim" / "rpc" / "frames.py", "a") as f:
        f.write("\n# upgraded\n")


def _rename_over(install) -> None:  # as pip installs a file
    shutil.copy(install / "shim" / "rpc" / "frames.py", install / "frames.py.new")
    os.replace(install / "frames.py.new", install / "shim" / "rpc" / "frames.py")


def _remake_directory(install) -> None:
    shutil.copytree(install / "shim" / "rpc", install / "rpc.new")
    shutil.rmtree(install / "shim" / "rpc")
    os.rename(install / "rpc.new", install / "shim" / "rpc")


@pytest.mark.parametrize("upgrade", [_append, _rename_over, _remake_directory])
def test_a_template_whose_code_changed_on_disk_forks_nothing_and_leaves(roots, tmp_path, upgrade) -> None:
    from shim.lib.program import BOOT, search_path
    from shim.rpc.status import FailedPrecondition

    install = tmp_path / "install"
    shutil.copytree(os.path.join(search_path()[0], "shim"), install / "shim", ignore=shutil.ignore_patterns("__pycache__"))
    command = [sys.executable, "-I", "-S", "-c", BOOT, ":".join([str(install), *search_path()[1:]])]
    pid = _detach(roots[0], *command)["pid"]
    try:
        first = start_shim(roots, "u1")
        assert first["pid"] != pid and alive(first["pid"])

        upgrade(install)
        runtime_root, tmp, started = roots
        started.append(("u2", str(tmp / "u2"), "tpl"))
        with pytest.raises(FailedPrecondition, match="the installed podshim changed"):
            blocking.call("unix://" + control_socket_path(runtime_root), TEMPLATE_SERVICE, "Spawn",
                          {"namespace": "tpl", "sandbox_id": "u2", "bundle": str(tmp / "u2")})
        assert not wait_gone(pid) and not os.path.exists(control_socket_path(runtime_root))
        assert not os.path.exists(tmp / "u2")  # nothing was forked for it
        assert alive(first["pid"])  # its shims live on
        assert start_shim(roots, "u2")["pid"] > 0  # `podshim start` execs meanwhile
    finally:
        if alive(pid):
            _stop(pid)


def test_template_stop_ends_the_runtime_roots_template_and_leaves_its_shims(roots) -> None:
    pid = _detach(roots[0])["pid"]
    shim = start_shim(roots, "st1")

    def stop() -> dict:
        out = subprocess.run([*PODSHIM, "template", "--stop", "--runtime-root", roots[0]], capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    assert stop() == {"pid": pid}
    assert not alive(pid) and alive(shim["pid"])
    assert stop() == {"pid": 0}  # none runs: nothing to do


def _holds(namespace: str, pid: int) -> list[str]:
    from shim.kernel.cgroups import discover_hierarchies

    return [os.path.join(d, f".held-by-{pid}") for d in (h.directory(os.path.join(h.own_path, "podshim", namespace))
                                                         for h in discover_hierarchies()) if d is not None]


def test_template_holds_the_cgroup_parent_of_its_namespaces_until_it_stops(roots, template) -> None:
    namespace = f"hold{secrets.token_hex(3)}"
    start_shim(roots, "h1", namespace=namespace)
    holds = _holds(namespace, template.proc.pid)
    assert holds
    deadline = time.monotonic() + 5  # made after the answer
    while not all(os.path.isdir(hold) for hold in holds) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(os.path.isdir(hold) for hold in holds)
    template.stop()
    # Its holds are gone, and with them the parents nothing else uses (h1 never started: no cgroup).
    assert not any(os.path.exists(os.path.dirname(hold)) for hold in holds)


async def test_a_spare_killed_before_it_serves_fails_the_first_call_and_podshim_delete_ends_it(roots, template) -> None:
    # The Spawn is answered once the spare has its socket and sandbox (protocol.md 7.5); a spare
    # stopped, and killed, before it serves: the call waiting in its socket fails UNAVAILABLE,
    # and its state.json, written by the template, lets `podshim delete` clean up.
    spare = _ping(template)["spare_pid"]
    assert spare > 0
    os.kill(spare, signal.SIGSTOP)
    try:
        result = start_shim(roots, "k1")
        assert result["pid"] == spare
        with open(os.path.join(roots[1], "k1", "state.json")) as f:
            assert json.load(f)["shim_pid"] == spare
        client = await Client.connect(result["address"], namespace="tpl")  # the backlog takes it
    finally:
        os.kill(spare, signal.SIGKILL)
    try:
        with pytest.raises(Unavailable):
            await client.call(SANDBOX_SERVICE, "PingSandbox", {"sandbox_id": "k1"}, timeout=10)
    finally:
        await client.aclose()
    assert not await wait_gone_async(spare)
    done = subprocess.run([*PODSHIM, "delete", "--namespace", "tpl", "--id", "k1", "--bundle",
                           str(roots[1] / "k1"), "--runtime-root", roots[0]], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert not os.path.exists(socket_path("tpl", "k1", roots[0]))


# -- a template being started is stopped too --------------------------------------------------------
GATED_DETACH = """
import os, sys
from shim import cli
from shim.launch import template

root, gate, pid_file = sys.argv[1:]
take_lock = template._lock

def gated(*args, **kwargs):  # in the detached template, before it takes its lock
    with open(pid_file, "w") as f:
        f.write(str(os.getpid()))
    fd = os.open(gate, os.O_RDONLY)
    os.read(fd, 1)
    os.close(fd)
    return take_lock(*args, **kwargs)

template._lock = gated
sys.exit(cli.main(["template", "--detach", "--runtime-root", root]))
"""


def _blocked_on(path: str, pid: int) -> bool:
    """Whether ``pid`` waits for a flock on ``path`` (a "->" line of /proc/locks)."""
    st = os.stat(path)
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with open("/proc/locks") as f:
        return any(line.split()[1:3] == ["->", "FLOCK"] and line.split()[5:7] == [str(pid), where] for line in f)


@pytest.mark.parametrize("starter", ["lives", "is killed"])
def test_template_stop_while_a_template_starts_waits_for_it_and_stops_it(roots, tmp_path, starter):
    from shim.api.names import TEMPLATE_START_LOCK
    from shim.launch.template import stop_template, template_pid

    from support.sandbox_env import settle

    runtime_root = roots[0]
    gate, pid_file = str(tmp_path / "gate"), str(tmp_path / "template.pid")
    os.mkfifo(gate)
    detach = subprocess.Popen([sys.executable, "-c", GATED_DETACH, runtime_root, gate, pid_file],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stop = None
    try:
        held = fifo_writer(gate, 30)  # the template is forked and waits here, its lock not taken yet
        with open(pid_file) as f:
            starting = int(f.read())
        if starter == "is killed":
            detach.kill()
            detach.wait(timeout=WAIT)
        stop = subprocess.Popen([*PODSHIM, "template", "--stop", "--runtime-root", runtime_root],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        start_lock = os.path.join(runtime_root, TEMPLATE_START_LOCK)
        assert not settle(lambda: stop.poll() is None and not _blocked_on(start_lock, stop.pid), WAIT)
        os.write(held, b"G")
        os.close(held)
        out, err = stop.communicate(timeout=30)
        assert stop.returncode == 0, err
        assert json.loads(out) == {"pid": starting}
        assert not wait_gone(starting) and template_pid(runtime_root) == 0
        if starter == "lives":
            out, err = detach.communicate(timeout=30)
            assert detach.returncode == 0, err
            assert json.loads(out)["pid"] == starting
    finally:
        for proc in (detach, stop):
            if proc is not None:
                if proc.poll() is None:
                    proc.kill()
                proc.communicate()
        if os.path.exists(pid_file):
            with open(pid_file) as f:
                wait_gone(int(f.read()), timeout=0.1, kill=True)
        stop_template(runtime_root)
