"""The Controller with real shims: lifecycle, errors, concurrency, and shims that die under it.

Every test runs in private roots (``env``) and leaves nothing behind: the fixture fails a test
that leaves a shim, a pause, a socket, a bundle, a cgroup or a netns.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time

import anyio
import pytest

from shim.rpc.status import AlreadyExists, FailedPrecondition, Internal, InvalidArgument, NotFound, Unavailable

from client.controller import Controller, results
from client.controller.handle import Phase
from client.controller.results import ExitStatus
from client.controller.spawners import ExecSpawner

from support.proctools import alive, wait_gone_async

# Every test here runs twice: shims exec'd by `podshim start`, and shims forked by a template.
pytestmark = pytest.mark.usefixtures("spawn_mode")

NS = "default"
KILLED = 128 + signal.SIGKILL
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def controller(env, **kwargs) -> Controller:
    return Controller(env.state_root, env.runtime_root, **kwargs)


def failing_spawner(env, script: str) -> ExecSpawner:
    """A spawner whose 'podshim' is a Python one-liner (it gets podshim's arguments)."""
    return ExecSpawner([sys.executable, "-c", script], runtime_root=env.runtime_root, use_template=False)


def kernel_objects(info: dict[str, str]) -> list[str]:
    """The netns file and cgroup directories a verbose status names."""
    return [info["netns_path"], *(v for k, v in info.items() if k.startswith("cgroup."))]


# -- what the client shares with the shim and protocol.md ----------------------------------------
def test_constants_match_the_shim_and_protocol_md() -> None:
    from shim import cleanup, cli
    from shim.api import paths
    from shim.sandbox import sandbox

    from client.controller import defaults

    assert results.BOOTSTRAP_FILE == paths.BOOTSTRAP_FILE
    assert results.BOOTSTRAP_VERSION == paths.BOOTSTRAP_VERSION == 3
    assert results.PROTOCOL == paths.PROTOCOL
    assert results.UNKNOWN_EXIT_STATUS == cleanup.UNKNOWN_EXIT_STATUS
    assert defaults.DEFAULT_RUNTIME_ROOT == paths.DEFAULT_RUNTIME_ROOT
    assert cli._parser().parse_args(["delete", "--instance", "ns:sb"]).state_root == defaults.DEFAULT_BUNDLE_ROOT
    assert defaults.DEFAULT_STOP_GRACE == sandbox.DEFAULT_STOP_TIMEOUT
    assert {s.value for s in results.SandboxState} - {"unknown"} <= {s.value for s in sandbox.State}
    with open(os.path.join(ROOT, "protocol.md")) as f:
        spec = f.read()
    assert f'"version": {results.BOOTSTRAP_VERSION}' in spec and f'"protocol": "{results.PROTOCOL}"' in spec
    assert f"nil: {defaults.DEFAULT_STOP_GRACE:.0f} s" in spec


def test_importing_the_client_never_imports_pyroute2_or_the_shims_internals() -> None:
    # What a client may use of the shim: its contract, its wire and the helpers both share.
    code = ("import sys, client, client.controller, client.cli.main; "
            "bad = [m for m in sys.modules if m == 'pyroute2' or m.startswith('pyroute2.') "
            "or (m.startswith('shim.') and not m.startswith(('shim.rpc', 'shim.api', 'shim.lib')))]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


# -- the lifecycle ---------------------------------------------------------------------------------
async def test_full_lifecycle_create_start_stop_wait_shutdown(env) -> None:
    sid = env.sid("life")
    async with controller(env) as c:
        await c.create(NS, sid, options={"hostname": "life"})
        created = await c.status(NS, sid, verbose=True)
        assert (created.state, created.pid, created.namespace, created.version) == ("created", 0, NS, 3)
        assert created.address.startswith("unix://" + env.runtime_root + "/s/")
        bundle = env.bundle(NS, sid)
        assert stat.S_IMODE(os.stat(bundle).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(os.path.dirname(bundle)).st_mode) == 0o711

        instance = await c.start(NS, sid)
        assert instance.sandbox_id == sid and alive(instance.pid) and instance.created_at > 0
        assert (instance.address, instance.version) == (created.address, 3)
        running = await c.status(NS, sid, verbose=True)
        assert (running.state, running.pid) == ("running", instance.pid)
        netns = running.info["netns_path"]
        assert os.stat(f"/proc/{instance.pid}/ns/net").st_ino == os.stat(netns).st_ino
        assert (await c.platform(NS, sid)).os == "linux"
        metrics = await c.metrics(NS, sid)
        assert metrics["sandbox_id"] == sid and metrics["data"]["pids_current"] == 1

        await c.stop(NS, sid, timeout=2)
        exited = await c.wait(NS, sid)
        assert exited.exited_at >= instance.created_at and not alive(instance.pid)
        stopped = await c.status(NS, sid)
        assert (stopped.state, stopped.exit_status, stopped.exited_at) == ("stopped", exited.exit_status,
                                                                           exited.exited_at)

        shim_pid, made = int(running.info["shim_pid"]), kernel_objects(running.info)
        await c.shutdown(NS, sid)
        with pytest.raises(NotFound):
            await c.status(NS, sid)
        assert not await wait_gone_async(shim_pid)
        assert not os.path.exists(bundle)
        assert [p for p in made if os.path.exists(p)] == []


async def test_start_returns_the_pause_and_status_agrees(env) -> None:
    sid = env.sid("agree")
    async with controller(env) as c:
        await c.create(NS, sid)
        instance = await c.start(NS, sid)
        assert [s.pid for s in await c.list(NS)] == [instance.pid]
        with pytest.raises(FailedPrecondition):
            await c.start(NS, sid)  # already running
        await c.shutdown(NS, sid)


async def test_create_joins_a_given_netns_and_shutdown_leaves_it(env) -> None:
    from shim.kernel import netns

    given = netns.create_netns(netns.new_netns_path(f"podshim-test-{os.getpid()}"))
    sid = env.sid("joins")
    try:
        async with controller(env) as c:
            await c.create(NS, sid, netns_path=given)
            instance = await c.start(NS, sid)
            assert os.stat(f"/proc/{instance.pid}/ns/net").st_ino == os.stat(given).st_ino
            assert (await c.status(NS, sid, verbose=True)).info["netns_owned"] == "false"
            await c.shutdown(NS, sid)
        assert os.path.exists(given)
    finally:
        netns.remove_netns(given)


async def test_aclose_leaves_shims_running_and_a_new_controller_finds_them(env) -> None:
    sid = env.sid("survives")
    async with controller(env) as c:
        await c.create(NS, sid)
        instance = await c.start(NS, sid)
        shim_pid = int((await c.status(NS, sid, verbose=True)).info["shim_pid"])
    assert alive(shim_pid) and alive(instance.pid)
    async with controller(env) as c:
        again = await c.status(NS, sid)
        assert (again.state, again.pid, again.created_at) == ("running", instance.pid, instance.created_at)
        await c.shutdown(NS, sid)


async def test_client_for_gives_the_connection_to_the_shim(env) -> None:
    sid = env.sid("client")
    async with controller(env) as c:
        await c.create(NS, sid)
        client = c.client_for(NS, sid)
        assert await client.call("podshim.sandbox.v1.Sandbox", "PingSandbox", {"sandbox_id": sid}) == {}
        with pytest.raises(NotFound):
            c.client_for(NS, env.sid("nobody"))
        await c.shutdown(NS, sid)
        with pytest.raises(NotFound):
            c.client_for(NS, sid)


async def test_list_is_per_namespace_or_across_all(env) -> None:
    a, b = env.sid("a"), env.sid("b")
    async with controller(env) as c:
        await c.create(NS, a)
        await c.create("k8s.io", b)
        await c.start("k8s.io", b)
        assert [(s.namespace, s.sandbox_id, s.state) for s in await c.list(NS)] == [(NS, a, "created")]
        assert [(s.namespace, s.sandbox_id, s.state) for s in await c.list()] == [
            (NS, a, "created"), ("k8s.io", b, "running")]
        assert await c.list("empty") == []
        await c.shutdown(NS, a)
        await c.shutdown("k8s.io", b)
        assert await c.list() == []


# -- refusals --------------------------------------------------------------------------------------
@pytest.mark.parametrize("namespace, sandbox_id", [
    ("default", ""), ("default", "../etc"), ("default", "a/b"), ("default", "x" * 77), ("default", "-a"),
    ("..", "sb"), ("bad ns", "sb"),
])
async def test_bad_identifiers_are_refused_before_touching_the_filesystem(env, namespace, sandbox_id) -> None:
    async with controller(env) as c:
        for call in (c.create(namespace, sandbox_id), c.status(namespace, sandbox_id), c.stop(namespace, sandbox_id),
                     c.shutdown(namespace, sandbox_id), c.wait(namespace, sandbox_id)):
            with pytest.raises(InvalidArgument):
                await call
        with pytest.raises(InvalidArgument):
            await c.load(namespace, sandbox_id)
    assert os.listdir(env.state_root) == []


async def test_create_of_a_taken_id_is_already_exists(env) -> None:
    sid = env.sid("taken")
    async with controller(env) as c:
        await c.create(NS, sid)
        with pytest.raises(AlreadyExists):
            await c.create(NS, sid)
        assert (await c.status(NS, sid)).state == "created"  # the first is untouched
        await c.shutdown(NS, sid)


async def test_of_concurrent_creates_of_one_id_exactly_one_wins(env) -> None:
    sid = env.sid("race")
    outcomes: list[str] = []

    async def create(c: Controller) -> None:
        try:
            await c.create(NS, sid)
            outcomes.append("created")
        except AlreadyExists:
            outcomes.append("exists")

    async with controller(env) as c:
        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(create, c)
        assert sorted(outcomes) == ["created"] + ["exists"] * 4
        await c.shutdown(NS, sid)


async def test_stop_of_an_unknown_sandbox_succeeds_and_a_negative_timeout_is_refused(env) -> None:
    async with controller(env) as c:
        await c.stop(NS, env.sid("nobody"))
        with pytest.raises(InvalidArgument):
            await c.stop(NS, env.sid("nobody"), timeout=-1)


async def test_shutdown_of_an_unknown_id_is_not_found_and_so_is_a_second_one(env) -> None:
    sid = env.sid("twice")
    async with controller(env) as c:
        with pytest.raises(NotFound):
            await c.shutdown(NS, sid)
        await c.create(NS, sid)
        await c.shutdown(NS, sid)
        with pytest.raises(NotFound):
            await c.shutdown(NS, sid)


async def test_a_closed_or_unopened_controller_refuses_calls(env) -> None:
    c = controller(env)
    with pytest.raises(FailedPrecondition):
        await c.create(NS, env.sid("early"))
    async with c:
        pass
    with pytest.raises(Unavailable):
        await c.status(NS, env.sid("late"))
    with pytest.raises(Unavailable):
        await c.load()


# -- creates that fail leave nothing ---------------------------------------------------------------
async def test_a_create_the_shim_refuses_leaves_nothing_and_frees_the_id(env) -> None:
    sid = env.sid("refused")
    async with controller(env) as c:
        with pytest.raises(InvalidArgument, match="not a network namespace"):
            await c.create(NS, sid, netns_path="/etc/hostname")
        assert c.sandboxes.is_empty() and not os.path.exists(env.bundle(NS, sid))
        await c.create(NS, sid)  # the id is free again
        await c.shutdown(NS, sid)


async def test_a_spawn_that_fails_is_unavailable_and_carries_the_shims_words(env) -> None:
    script = "import sys; sys.stderr.write('no cgroup for you\\n'); sys.exit(1)"
    sid = env.sid("nospawn")
    async with controller(env, spawner=failing_spawner(env, script)) as c:
        with pytest.raises(Unavailable, match="no cgroup for you"):
            await c.create(NS, sid)
        assert c.sandboxes.is_empty() and not os.path.exists(env.bundle(NS, sid))


async def test_a_spawn_that_prints_garbage_is_internal(env) -> None:
    async with controller(env, spawner=failing_spawner(env, "print('hello there')")) as c:
        with pytest.raises(Internal, match="not valid JSON"):
            await c.create(NS, env.sid("garbage"))
        assert c.sandboxes.is_empty()


async def test_a_spawn_that_prints_json_nested_too_deeply_is_internal(env) -> None:
    async with controller(env, spawner=failing_spawner(env, "print('[' * 100000)")) as c:
        with pytest.raises(Internal, match="is not valid JSON: it is nested more than"):
            await c.create(NS, env.sid("deep"))
        assert c.sandboxes.is_empty()


async def test_a_cancelled_create_leaves_nothing(env, monkeypatch) -> None:
    sid = env.sid("cancelled")
    async with controller(env) as c:
        spawning, spawn = anyio.Event(), c.spawner.spawn

        async def noticed_spawn(*args):
            spawning.set()
            return await spawn(*args)

        monkeypatch.setattr(c.spawner, "spawn", noticed_spawn)
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.create, NS, sid)
            await spawning.wait()
            tg.cancel_scope.cancel()  # while `podshim start` runs, or while the template forks
        assert c.sandboxes.is_empty() and not os.path.exists(env.bundle(NS, sid))


async def test_fifty_concurrent_creates(env) -> None:
    ids = [env.sid(f"many{i}") for i in range(50)]
    async with controller(env) as c:
        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            for sid in ids:
                tg.start_soon(c.create, NS, sid)
        took = time.monotonic() - started
        listed = await c.list(NS)
        assert sorted(s.sandbox_id for s in listed) == sorted(ids)
        assert {s.state for s in listed} == {"created"}
        async with anyio.create_task_group() as tg:
            for sid in ids:
                tg.start_soon(c.shutdown, NS, sid)
        assert c.sandboxes.is_empty()
    print(f"50 concurrent creates: {took:.2f}s")


# -- a shim that dies while the controller runs ----------------------------------------------------
async def test_a_shim_killed_while_running_is_cleaned_up_once_and_waiters_get_its_exit(env) -> None:
    sid = env.sid("killed")
    async with controller(env) as c:
        await c.create(NS, sid)
        instance = await c.start(NS, sid)
        info = (await c.status(NS, sid, verbose=True)).info
        shim_pid, made = int(info["shim_pid"]), kernel_objects(info)
        exits: list[ExitStatus] = []

        async def waiter() -> None:
            exits.append(await c.wait(NS, sid))

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            os.kill(shim_pid, signal.SIGKILL)
        # `podshim delete` found the pause alive and killed it: 128 + SIGKILL, for every waiter.
        assert {e.exit_status for e in exits} == {KILLED} and len({e.exited_at for e in exits}) == 1
        after = await c.status(NS, sid)
        assert (after.state, after.exit_status, after.pid) == ("stopped", KILLED, instance.pid)
        assert not alive(instance.pid) and not alive(shim_pid)
        assert [p for p in made if os.path.exists(p)] == []
        assert not os.path.exists(env.bundle(NS, sid))
        assert await c.wait(NS, sid) == exits[0]
        await c.stop(NS, sid)  # a dead shim stops fine (containerd#9611)
        with pytest.raises(FailedPrecondition):
            await c.start(NS, sid)
        with pytest.raises(FailedPrecondition):
            await c.metrics(NS, sid)
        with pytest.raises(Unavailable):
            c.client_for(NS, sid)
        assert [s.state for s in await c.list()] == ["stopped"]
        await c.shutdown(NS, sid)  # forgets the tombstone
        with pytest.raises(NotFound):
            await c.status(NS, sid)


async def test_a_dead_shim_is_noticed_without_anyone_asking(env) -> None:
    sid = env.sid("unasked")
    async with controller(env) as c:
        await c.create(NS, sid)
        await c.start(NS, sid)
        info = (await c.status(NS, sid, verbose=True)).info
        handle = c.sandboxes.get(NS, sid)
        os.kill(int(info["shim_pid"]), signal.SIGKILL)
        with anyio.fail_after(10):
            await handle.dead.wait()
        assert handle.phase is Phase.DEAD and handle.exit.exit_status == KILLED
        assert not os.path.exists(info["netns_path"])
        await c.shutdown(NS, sid)


async def test_a_failing_delete_reports_exit_status_255_and_is_run_again_by_shutdown(env) -> None:
    sid = env.sid("nodelete")

    class FlakyDelete(ExecSpawner):
        failing = True

        async def delete(self, namespace, sandbox_id, bundle):
            if self.failing:  # a podshim delete that fails (or is killed at its deadline)
                return await failing_spawner(env, "raise SystemExit(3)").delete(namespace, sandbox_id, bundle)
            return await super().delete(namespace, sandbox_id, bundle)

    spawner = FlakyDelete(runtime_root=env.runtime_root)
    async with controller(env, spawner=spawner) as c:
        await c.create(NS, sid)
        await c.start(NS, sid)
        info = (await c.status(NS, sid, verbose=True)).info
        os.kill(int(info["shim_pid"]), signal.SIGKILL)
        exited = await c.wait(NS, sid)
        assert exited.exit_status == results.UNKNOWN_EXIT_STATUS and exited.exited_at > 0
        # Nothing was cleaned: the bundle, whose record names what is left, stays, and so does the sandbox.
        assert os.path.isdir(info["bundle"]) and [p for p in kernel_objects(info) if os.path.exists(p)] != []
        with pytest.raises(Unavailable, match="did not finish"):
            await c.shutdown(NS, sid)
        assert (await c.status(NS, sid)).state == results.SandboxState.STOPPED
        spawner.failing = False
        await c.shutdown(NS, sid)
        assert not os.path.exists(info["bundle"]) and [p for p in kernel_objects(info) if os.path.exists(p)] == []
        with pytest.raises(NotFound):
            await c.status(NS, sid)


async def test_shutdown_of_a_hung_shim_falls_back_to_podshim_delete(env, monkeypatch) -> None:
    import client.controller.controller as module

    sid = env.sid("hung")
    async with controller(env) as c:
        await c.create(NS, sid)
        instance = await c.start(NS, sid)
        info = (await c.status(NS, sid, verbose=True)).info
        monkeypatch.setattr(module, "SHUTDOWN_TIMEOUT", 0.3)
        os.kill(int(info["shim_pid"]), signal.SIGSTOP)  # alive, but answers nothing
        await c.shutdown(NS, sid)
        assert not await wait_gone_async(int(info["shim_pid"])) and not alive(instance.pid)
        assert [p for p in kernel_objects(info) if os.path.exists(p)] == []

