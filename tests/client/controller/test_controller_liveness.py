"""A shim is dead only when its process is gone: one that is stopped, slow or full of
connections is left alone, reported UNAVAILABLE or DEADLINE_EXCEEDED, and used again once it
answers (issue 13).

Every test that stops a shim with SIGSTOP continues it in a ``finally``, whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Iterator

import anyio
import pytest

from shim.api.names import SANDBOX_SERVICE
from shim.lib.processes import proc_start_time
from shim.rpc import blocking
from shim.rpc.channel import parse_address
from shim.rpc.connection import ClientConnection, ResponseReceived
from shim.rpc.messages import Request
from shim.rpc.server import MAX_CONNECTIONS
from shim.rpc.status import DeadlineExceeded, ResourceExhausted, Unavailable

import client.controller.controller as controller_module
import client.controller.liveness as liveness_module
import client.controller.loading as loading_module
from client.controller import Controller
from client.controller.handle import Phase

from support.proctools import alive, wait_gone, wait_gone_async

pytestmark = pytest.mark.usefixtures("spawn_mode")

NS = "default"
KILLED = 128 + signal.SIGKILL
#: A bound for the test's own waits on events (a process exit...), never a readiness sleep.
SETTLE = 10.0
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """SIGSTOP ``pid`` for the block; SIGCONT on the way out, whatever happened."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


async def running_sandbox(env, sid: str) -> tuple[int, int, int]:
    """Create and start ``sid`` with a Controller that is then closed: (shim pid, pause pid,
    pause start time)."""
    async with Controller(env.state_root, env.runtime_root) as c:
        await c.create(NS, sid)
        instance = await c.start(NS, sid)
        shim_pid = int((await c.status(NS, sid, verbose=True)).info["shim_pid"])
    started = proc_start_time(instance.pid)
    assert started is not None, "the pause is gone"
    return shim_pid, instance.pid, started


@pytest.fixture
def short_timeouts(monkeypatch):
    """The Controller's load and reconnect bounds cut to half a second: a stopped shim costs
    the test that, not 5 s each."""
    monkeypatch.setattr(loading_module, "LOAD_TIMEOUT", 0.5)
    monkeypatch.setattr(liveness_module, "CONNECT_TIMEOUT", 0.5)
    monkeypatch.setattr(controller_module, "CONNECT_TIMEOUT", 0.5)


async def test_a_controller_that_starts_while_a_shim_is_stopped_leaves_it_running(env, short_timeouts) -> None:
    sid = env.sid("frozen")
    shim_pid, pause_pid, pause_started = await running_sandbox(env, sid)
    c = Controller(env.state_root, env.runtime_root)
    try:
        with stopped(shim_pid):
            await c.load()  # the shim answers nothing for longer than LOAD_TIMEOUT
            with pytest.raises((DeadlineExceeded, Unavailable), match="left running"):
                await c.status(NS, sid)
            with pytest.raises(Unavailable, match="left running"):
                c.client_for(NS, sid)
            assert [(s.sandbox_id, s.info) for s in await c.list()] == [
                (sid, {"unreachable": "runs but did not answer within 0.5s"})]
            assert alive(shim_pid) and proc_start_time(pause_pid) == pause_started
            assert os.path.isdir(env.bundle(NS, sid))
        # Continued: the next call reconnects and finds the sandbox as it was.
        status = await c.status(NS, sid)
        assert (status.state, status.pid) == ("running", pause_pid)
        assert proc_start_time(pause_pid) == pause_started
        await c.shutdown(NS, sid)
    finally:
        await c.aclose()
    assert not await wait_gone_async(shim_pid)


def test_podshimctl_status_of_a_stopped_shim_fails_and_destroys_nothing(env) -> None:
    sid = env.sid("ctl")
    shim_pid, pause_pid, pause_started = anyio.run(running_sandbox, env, sid)
    with stopped(shim_pid):
        # A fresh Controller, with the real 5 s load timeout and 5 s reconnect timeout.
        done = env.ctl("sandbox", "status", sid, timeout=60)
        error = done.stderr.splitlines()[-1]
        assert done.returncode == 1
        assert error.startswith(("DEADLINE_EXCEEDED: ", "UNAVAILABLE: ")), done.stderr
        assert f"(pid {shim_pid})" in error and "left running" in error
        assert alive(shim_pid) and proc_start_time(pause_pid) == pause_started
    done = env.ctl("sandbox", "status", sid, "--json")
    assert done.returncode == 0, done.stderr
    assert '"state": "running"' in done.stdout and f'"pid": {pause_pid}' in done.stdout
    assert env.ctl("sandbox", "shutdown", sid).returncode == 0
    assert not wait_gone(shim_pid, pause_pid)


async def test_a_shim_killed_while_unreachable_is_cleaned_up_without_anyone_asking(env, short_timeouts) -> None:
    sid = env.sid("gone")
    shim_pid, pause_pid, _ = await running_sandbox(env, sid)
    with stopped(shim_pid):
        async with Controller(env.state_root, env.runtime_root) as c:
            handle = c.sandboxes.get(NS, sid)
            assert handle.phase is Phase.UNREACHABLE
            os.kill(shim_pid, signal.SIGKILL)
            with anyio.fail_after(SETTLE):
                await handle.dead.wait()
            assert handle.exit.exit_status == KILLED  # `podshim delete` found the pause and killed it
            assert not alive(pause_pid) and not os.path.exists(env.bundle(NS, sid))
            assert (await c.status(NS, sid)).state == "stopped"
            await c.shutdown(NS, sid)


async def test_shutdown_of_an_unreachable_shim_deletes_it(env, short_timeouts) -> None:
    sid = env.sid("asked")
    shim_pid, pause_pid, _ = await running_sandbox(env, sid)
    with stopped(shim_pid):
        async with Controller(env.state_root, env.runtime_root) as c:
            assert c.sandboxes.get(NS, sid).phase is Phase.UNREACHABLE
            await c.shutdown(NS, sid)  # asked for: `podshim delete` ends what does not answer
            assert not await wait_gone_async(shim_pid) and not alive(pause_pid)
            assert c.sandboxes.is_empty() and not os.path.exists(env.bundle(NS, sid))


# -- the shim's connection limit ----------------------------------------------------------------
@contextlib.contextmanager
def connections(address: str, count: int, busy: bool, sandbox_id: str) -> Iterator[list[socket.socket]]:
    """``count`` connections to a shim, closed on the way out. ``busy``: each has a WaitSandbox
    in flight (sent with a PingSandbox whose answer shows the shim read both); else idle."""
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            held.append(sock)
            sock.connect(parse_address(address))  # blocking: waits while the listen backlog is full
            sock.settimeout(SETTLE)
            if busy:
                conn = ClientConnection()
                payload = {"sandbox_id": sandbox_id}
                _, wait = conn.request(Request(SANDBOX_SERVICE, "WaitSandbox", payload))
                ping_id, ping = conn.request(Request(SANDBOX_SERVICE, "PingSandbox", payload))
                sock.sendall(wait + ping)
                while not any(isinstance(ev, ResponseReceived) and ev.stream_id == ping_id
                              for ev in conn.receive_data(sock.recv(65536))):
                    pass
        yield held
    finally:
        for sock in held:
            sock.close()


async def started(c: Controller, sid: str) -> tuple[int, str]:
    """Create and start ``sid``: (pause pid, shim address)."""
    await c.create(NS, sid)
    instance = await c.start(NS, sid)
    return instance.pid, instance.address


@pytest.fixture
def descriptors():
    """Room in this process for a shim's worth of connections (restored afterwards)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 2 * MAX_CONNECTIONS + 256
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_a_shim_whose_connections_are_all_held_idle_still_serves_a_controller(env, descriptors) -> None:
    sid = env.sid("idle")
    async with Controller(env.state_root, env.runtime_root) as c:
        pause_pid, address = await started(c, sid)
        with connections(address, MAX_CONNECTIONS, False, sid):
            # Our own connection was idle longest and may have made room for the others: the
            # call reconnects, and the shim closes an idle one of theirs for us.
            assert (await c.status(NS, sid)).pid == pause_pid
            # So does a fresh one (podshimctl): its connection gets in too.
            done = await anyio.to_thread.run_sync(lambda: env.ctl("sandbox", "status", sid, "--json"))
            assert done.returncode == 0, done.stderr
            assert '"state": "running"' in done.stdout and f'"pid": {pause_pid}' in done.stdout
        assert alive(pause_pid)
        await c.shutdown(NS, sid)


async def test_a_shim_whose_connections_all_have_calls_in_flight_refuses_a_new_one_and_says_why(env, descriptors) -> None:
    sid = env.sid("busy")
    async with Controller(env.state_root, env.runtime_root) as c:
        pause_pid, address = await started(c, sid)
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.wait, NS, sid)  # the Controller's connection has a call in flight too
            await anyio.wait_all_tasks_blocked()
            await c.status(NS, sid)         # answered after the WaitSandbox was read
            with connections(address, MAX_CONNECTIONS - 1, True, sid):
                with pytest.raises(ResourceExhausted) as refused:
                    await anyio.to_thread.run_sync(lambda: blocking.call(
                        address, SANDBOX_SERVICE, "PingSandbox", {"sandbox_id": sid}))
                with open(os.path.join(ROOT, "protocol.md")) as f:
                    spec = " ".join(f.read().split())
                assert f"the message `{refused.value.message}`" in spec
                # The Controller's own connection keeps serving it.
                assert (await c.status(NS, sid)).pid == pause_pid
                await c.stop(NS, sid, timeout=0)  # ends every WaitSandbox
        await c.shutdown(NS, sid)
