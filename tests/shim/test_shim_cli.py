"""``podshim start | serve | delete`` as a caller sees them: real processes, sockets and kernel objects."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import stat
import subprocess
import time

import pytest

from shim.api.paths import BOOTSTRAP_FILE, LOG_FILE, SUN_PATH_MAX, socket_path
from shim.kernel import linux
from shim.lib.files import read_json
from shim.rpc import Client

from support.shimtools import (
    PODSHIM,
    WAIT,
    ProcessRef,
    host_untouched,  # noqa: F401  (autouse: what this module's shims made is checked at the end)
    new_id,
    run_podshim,
)

# Each test runs twice: shims exec'd by `podshim start`, and forked by the session's template.
pytestmark = pytest.mark.usefixtures("spawn_mode")

TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ")


def _stat_field(pid: int, number: int) -> int:
    fields = linux.proc_stat(pid)
    assert fields is not None, f"process {pid} is gone"
    return int(fields[number - 1])


def _shims_of(bundle: str) -> set[int]:
    """Live processes writing to ``bundle``'s log on stdout: its shims, however they were
    started (a shim forked by the template has the template's command line)."""
    log_path = os.path.join(bundle, LOG_FILE)
    found = set()
    for entry in os.listdir("/proc"):
        try:
            if os.readlink(f"/proc/{entry}/fd/1") == log_path and _state(int(entry)) not in ("Z", "X"):
                found.add(int(entry))
        except (OSError, ValueError):
            pass
    return found


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _listening_inodes(path: str) -> set[str]:
    """``socket:[INODE]`` of each Unix socket listening on ``path`` (/proc/net/unix)."""
    with open("/proc/net/unix") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return {f"socket:[{row[6]}]" for row in rows if len(row) == 8 and row[7] == path and row[3] == "00010000"}


# -- start ------------------------------------------------------------------------------------


async def test_start_prints_bootstrap_json_and_writes_the_same_to_the_bundle(shim) -> None:
    assert shim.bootstrap == {
        "version": 3,
        "address": "unix://" + socket_path(shim.namespace, shim.sandbox_id, shim.runtime_root),
        "protocol": "ttrpc+msgpack",
        "pid": shim.pid,
        "start_time": linux.proc_start_time(shim.pid),  # with the pid, names the shim across pid reuse
    }
    assert read_json(os.path.join(shim.bundle, BOOTSTRAP_FILE)) == shim.bootstrap
    assert _shims_of(shim.bundle) == {shim.pid}


async def test_start_returns_only_once_the_socket_accepts(shims) -> None:
    shim = await shims.start(connect=False)
    # state.json names the shim before `start` returns: a caller killed now still finds it.
    assert shim.record()["shim_pid"] == shim.pid
    # No retry: the first connect and the first call must succeed. A spare shim may still be
    # setting up when `start` returns (protocol.md, "Spawn"): the call waits in the backlog.
    async with await Client.connect(shim.address, namespace=shim.namespace) as client:
        assert await shim.call("PingSandbox", client=client) == {}
    # The shim logs "serving" before it answers its first call, in whichever way it was started.
    with open(os.path.join(shim.bundle, LOG_FILE)) as f:
        assert f"serving sandbox {shim.namespace}/{shim.sandbox_id}" in f.read()


async def test_socket_is_0600_in_a_0700_directory(shim) -> None:
    sock = os.stat(shim.socket_path)
    assert stat.S_ISSOCK(sock.st_mode) and stat.S_IMODE(sock.st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(shim.socket_path)).st_mode) == 0o700


async def test_socket_path_fits_sun_path_with_76_character_namespace_and_id(shims) -> None:
    shim = await shims.start(namespace="n" * 76, sandbox_id=new_id().ljust(76, "x"))
    assert len(shim.socket_path.encode()) < SUN_PATH_MAX
    assert await shim.call("PingSandbox") == {}


async def test_start_twice_returns_the_same_address_and_starts_no_second_shim(shim) -> None:
    again = await asyncio.to_thread(run_podshim, "start", shim.namespace, shim.sandbox_id, shim.bundle,
                                    shim.runtime_root)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == shim.bootstrap
    assert _shims_of(shim.bundle) == {shim.pid}


async def test_shim_survives_the_death_of_its_callers_process_group(shims):
    bundle, root = shims.directories()
    sandbox_id = new_id()
    argv = [*PODSHIM, "start", "--namespace", "it", "--id", sandbox_id, "--bundle", bundle, "--runtime-root", root]
    # The caller lives on after `start` returns, in a session of its own that we then kill whole.
    caller = subprocess.Popen(["sh", "-c", '"$@" && exec sleep 60', "sh", *argv], stdout=subprocess.PIPE,
                              start_new_session=True)
    try:
        line = await asyncio.to_thread(caller.stdout.readline)
    finally:
        os.killpg(caller.pid, signal.SIGKILL)
        caller.wait()
        caller.stdout.close()
    shim = shims.adopt("it", sandbox_id, bundle, root, json.loads(line))
    async with await Client.connect(shim.address, namespace="it") as client:
        assert await shim.call("PingSandbox", client=client) == {}


async def test_shim_lives_through_sighup(shim) -> None:
    os.kill(shim.pid, signal.SIGHUP)
    # A pending fatal signal is acted on before the shim runs any more of its own code, so an
    # answer proves the hangup was delivered and survived.
    assert await shim.call("PingSandbox") == {}
    assert not shim.process.has_exited()


async def test_shim_leads_its_own_session_and_process_group(shim) -> None:
    assert _stat_field(shim.pid, 5) == shim.pid  # pgrp
    assert _stat_field(shim.pid, 6) == shim.pid  # session
    assert os.getsid(0) != shim.pid


async def test_shim_stdio_goes_to_the_bundle_log_with_timestamps(shim) -> None:
    log = os.path.join(shim.bundle, LOG_FILE)
    assert await shim.call("PingSandbox") == {}  # a spare shim moves its stdio before it serves
    assert [os.readlink(f"/proc/{shim.pid}/fd/{fd}") for fd in (0, 1, 2)] == [os.devnull, log, log]
    with open(log) as f:
        lines = f.read().splitlines()
    assert lines and all(TIMESTAMP.match(line) for line in lines), lines
    assert any(f"serving sandbox {shim.namespace}/{shim.sandbox_id}" in line for line in lines)


def test_start_refuses_a_symlink_planted_at_the_socket_directory_and_leaves_its_target_alone(shims, tmp_path) -> None:
    bundle, root = shims.directories()
    target = tmp_path / "elsewhere"
    target.mkdir()
    os.chmod(target, 0o755)
    os.makedirs(root)
    os.symlink(target, os.path.join(root, "s"))
    sandbox_id = new_id()
    result = run_podshim("start", "it", sandbox_id, bundle, root)
    if result.returncode == 0:  # a shim that followed the link: ended with the test's others
        shims.adopt("it", sandbox_id, bundle, root, json.loads(result.stdout))
    assert result.returncode == 1
    # Through a template the sentence comes back as the Spawn call's status.
    assert re.fullmatch(rf"podshim start: (INTERNAL: \S+: )?{re.escape(root)}/s is a symbolic link.*\n",
                        result.stderr), result.stderr
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o755 and os.listdir(target) == []


@pytest.mark.parametrize("action", ["start", "serve", "delete"])
@pytest.mark.parametrize("flag", ["namespace", "id"])
@pytest.mark.parametrize("value", ["../x", "a..b", "a" * 77, ""],
                         ids=["dotdot-slash", "double-dot", "77-chars", "empty"])
def test_bad_identifier_exits_2_with_a_sentence_and_creates_nothing(shims, action, flag, value) -> None:
    bundle, root = shims.directories()
    names = {"namespace": "it", "id": new_id(), flag: value}
    result = run_podshim(action, names["namespace"], names["id"], bundle, root)
    assert result.returncode == 2
    assert re.fullmatch(rf"podshim {action}: .*(not valid|non-empty|at most \d+).*\n", result.stderr), result.stderr
    assert result.stdout == ""
    assert not os.path.lexists(bundle) and not os.path.lexists(root)


@pytest.mark.parametrize("content", [b"[" * 100_000 + b"]" * 100_000, b'{"netns_path": "\xff"}'],
                         ids=["100000-deep", "latin-1"])
def test_delete_with_a_state_json_that_is_not_json_says_so_and_carries_on(shims, content) -> None:
    bundle, root = shims.directories()
    os.makedirs(bundle)
    with open(os.path.join(bundle, "state.json"), "wb") as f:
        f.write(content)
    result = run_podshim("delete", "it", new_id(), bundle, root)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "state.json is not" in result.stderr and json.loads(result.stdout)["exit_status"] == 255


# -- delete -----------------------------------------------------------------------------------


@pytest.fixture
async def killed_shim(shims):
    """A shim killed with SIGKILL while its sandbox ran, and what it left: (shim, pause, footprint)."""
    shim = await shims.start()
    pause = ProcessRef(await shim.run_sandbox())
    made = await shim.footprint()
    shim.process.kill()
    await shim.process.exited()
    yield shim, pause, made
    pause.close()


async def test_delete_after_kill_9_kills_the_pause_and_removes_everything(killed_shim) -> None:
    shim, pause, made = killed_shim
    assert not pause.has_exited()
    before = time.time_ns()
    result = await asyncio.to_thread(shim.delete)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["exit_status"] == 137 and doc["pid"] == pause.pid
    assert before <= doc["exited_at"] <= time.time_ns()
    assert pause.has_exited()
    assert made.netns_path and made.cgroup_dirs
    assert made.remains() == []


async def test_delete_twice_is_safe(killed_shim) -> None:
    shim, _, _ = killed_shim
    first = await asyncio.to_thread(shim.delete)
    second = await asyncio.to_thread(shim.delete)
    assert first.returncode == second.returncode == 0, second.stderr
    assert json.loads(second.stdout) == json.loads(first.stdout)


# -- serve ------------------------------------------------------------------------------------


class Notifications:
    """An AF_UNIX datagram socket standing in for systemd's NOTIFY_SOCKET."""

    def __init__(self, path: str):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.sock.bind(path)
        self.sock.settimeout(WAIT)

    async def next(self) -> dict[str, str]:
        """The next message, as its KEY=VALUE lines."""
        data = await asyncio.to_thread(self.sock.recv, 4096)
        return dict(line.split("=", 1) for line in data.decode().splitlines())

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
async def serve(shims):
    """Run ``podshim serve`` in the foreground with a NOTIFY_SOCKET, optionally socket-activated by
    systemd-socket-activate; yields a function returning (process, shim, notifications)."""
    procs: list[tuple[subprocess.Popen, str | None]] = []  # with the socket we (as systemd) own
    notes: list[Notifications] = []

    async def run(activate: bool):
        bundle, root = shims.directories()
        os.makedirs(bundle, 0o700)
        namespace, sandbox_id = "it", new_id()
        notify = Notifications(os.path.join(bundle, "notify"))
        notes.append(notify)
        path = socket_path(namespace, sandbox_id, root)
        argv = [*PODSHIM, "serve", "--namespace", namespace, "--id", sandbox_id, "--bundle", bundle,
                "--runtime-root", root]
        if activate:
            os.makedirs(os.path.dirname(path), 0o700)
            argv = ["systemd-socket-activate", "--listen", path, "--setenv", f"NOTIFY_SOCKET={notify.path}", *argv]
        env = {**os.environ, "NOTIFY_SOCKET": notify.path}
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE if activate else subprocess.DEVNULL, text=True)
        procs.append((proc, path if activate else None))
        if activate:
            # systemd-socket-activate says when it listens; the shim runs once someone connects.
            assert proc.stderr is not None  # (PIPE)
            line = await asyncio.to_thread(proc.stderr.readline)
            assert line.startswith(f"Listening on {path}"), line
        shim = shims.adopt(namespace, sandbox_id, bundle, root, {"address": "unix://" + path, "pid": proc.pid})
        return proc, shim, notify

    yield run
    for proc, activated_socket in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if activated_socket is not None:
            proc.stderr.close()
            os.unlink(activated_socket)
    for notify in notes:
        notify.close()


async def test_serve_sends_ready_only_once_its_socket_serves(serve) -> None:
    proc, shim, notify = await serve(activate=False)
    ready = await notify.next()
    assert ready["READY"] == "1" and ready["MAINPID"] == str(proc.pid)
    # No retry: at READY=1 the socket must already exist and answer.
    shim.client = await Client.connect(shim.address, namespace=shim.namespace)
    assert await shim.call("PingSandbox") == {}
    assert read_json(os.path.join(shim.bundle, BOOTSTRAP_FILE))["pid"] == proc.pid


async def test_serve_uses_a_socket_passed_with_listen_fds(serve) -> None:
    proc, shim, notify = await serve(activate=True)
    shim.client = await Client.connect(shim.address, namespace=shim.namespace)
    assert await shim.call("PingSandbox") == {}
    assert (await notify.next())["READY"] == "1"
    # The socket is systemd's: the one listening on the path is the shim's inherited fd 3.
    assert _listening_inodes(shim.socket_path) == {os.readlink(f"/proc/{proc.pid}/fd/3")}
    assert read_json(os.path.join(shim.bundle, BOOTSTRAP_FILE)) == {
        "version": 3, "address": shim.address, "protocol": "ttrpc+msgpack", "pid": proc.pid,
        "start_time": linux.proc_start_time(proc.pid)}


async def test_serve_reports_each_state_and_stopping_to_the_notify_socket(serve) -> None:
    proc, shim, notify = await serve(activate=True)
    shim.client = await Client.connect(shim.address, namespace=shim.namespace)
    assert (await notify.next())["READY"] == "1"
    await shim.run_sandbox()
    await shim.call("StopSandbox", timeout_secs=0)
    await shim.call("ShutdownSandbox")
    statuses = [(await notify.next())["STATUS"] for _ in range(4)]
    assert statuses == [f"sandbox {shim.sandbox_id} {state}" for state in ("created", "running", "stopped", "shutdown")]
    assert (await notify.next()) == {"STOPPING": "1", "STATUS": "stopping (ShutdownSandbox)"}
    assert await asyncio.to_thread(proc.wait, WAIT) == 0
