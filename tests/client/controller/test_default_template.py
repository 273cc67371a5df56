"""The Controller's default shim template: started when none answers, shared, replaced when stale.

What a new user gets from ``Controller(state_root=...)`` with nothing started by hand: the first
spawn starts the runtime root's template (detached: it outlives the Controller), every later
Controller on that root forks its shims from the same one, a template running code older than
what is installed is replaced, and exec is only the fallback when no template can start.
Every test runs in private roots (``env``), whose teardown stops the template a test started.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import threading

import anyio
import pytest

from shim.api.names import TEMPLATE_ENV, TEMPLATE_LOCK, TEMPLATE_SERVICE, TEMPLATE_SOCKET_ENV
from shim.api.paths import control_socket_path
from shim.launch.template import template_pid
from shim.lib.program import BOOT, search_path
from shim.rpc import blocking
from shim.rpc.status import InvalidArgument

from client.controller import Controller
from client.controller.spawners import ExecSpawner

from support.proctools import alive, wait_gone_async
from support.sandbox_env import shim_processes

NS = "default"


@pytest.fixture(autouse=True)
def default_environment(monkeypatch):
    """The defaults, whatever the environment of the test run says."""
    monkeypatch.delenv(TEMPLATE_ENV, raising=False)
    monkeypatch.delenv(TEMPLATE_SOCKET_ENV, raising=False)


def ping(runtime_root: str) -> dict:
    return blocking.call("unix://" + control_socket_path(runtime_root), TEMPLATE_SERVICE, "Ping")


def forked_by_template(shim_pid: int) -> bool:
    """A forked shim keeps the template's command line; an exec'd one has `podshim start`'s."""
    with open(f"/proc/{shim_pid}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    return b"template" in argv and b"start" not in argv


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def templates_of(runtime_root: str) -> list[int]:
    """Live template processes of ``runtime_root``: named podshim-tmpl, and not the spare's
    intermediate child (a child of the template, with the same name)."""
    return [p for p in shim_processes(runtime_root)
            if _comm(p) == "podshim-tmpl" and _comm(_parent(p)) != "podshim-tmpl"]


async def shim_pid(c: Controller, sandbox_id: str) -> int:
    return int((await c.status(NS, sandbox_id, verbose=True)).info["shim_pid"])


async def test_a_controller_starts_the_template_and_forks_its_shims_from_it(env) -> None:
    sid = env.sid("first")
    async with Controller(env.state_root, env.runtime_root) as c:
        await c.create(NS, sid)
        pid = await shim_pid(c, sid)
        assert forked_by_template(pid)
        template = ping(env.runtime_root)
        assert template["spawned"] == 1 and templates_of(env.runtime_root) == [template["pid"]]
        await c.shutdown(NS, sid)
    assert alive(template["pid"])  # it outlives the Controller


async def test_concurrent_controllers_start_one_template_and_all_use_it(env) -> None:
    sids = [[env.sid(f"c{n}s{k}") for k in range(2)] for n in range(3)]
    async with contextlib.AsyncExitStack() as stack:
        controllers = [await stack.enter_async_context(Controller(env.state_root, env.runtime_root)) for _ in sids]
        async with anyio.create_task_group() as tg:
            for c, ids in zip(controllers, sids, strict=False):
                for sid in ids:
                    tg.start_soon(c.create, NS, sid)
        pids = [await shim_pid(c, sid) for c, ids in zip(controllers, sids, strict=False) for sid in ids]
        assert all(forked_by_template(p) for p in pids)
        template = ping(env.runtime_root)
        assert templates_of(env.runtime_root) == [template["pid"]] and template["spawned"] == len(pids)
        for c, ids in zip(controllers, sids, strict=False):
            for sid in ids:
                await c.shutdown(NS, sid)


async def test_a_second_controller_reuses_the_template_the_first_started(env) -> None:
    async with Controller(env.state_root, env.runtime_root) as c:
        await c.create(NS, env.sid("one"))
        first = ping(env.runtime_root)["pid"]
    async with Controller(env.state_root, env.runtime_root) as c:
        await c.create(NS, env.sid("two"))
        assert forked_by_template(await shim_pid(c, env.sid("two")))
        again = ping(env.runtime_root)
        assert (again["pid"], again["spawned"]) == (first, 2)
        await c.shutdown(NS, env.sid("one"))
        await c.shutdown(NS, env.sid("two"))


async def test_template_false_execs_every_shim_and_starts_no_template(env, session_template, monkeypatch) -> None:
    # Even with a template named in the environment: the Controller does not ask it, and the
    # `podshim start` it runs does not either (--no-template).
    monkeypatch.setenv(TEMPLATE_SOCKET_ENV, session_template.socket())
    spawned = ping(session_template.root)["spawned"]
    sid = env.sid("exec")
    async with Controller(env.state_root, env.runtime_root, template=False) as c:
        await c.create(NS, sid)
        assert not forked_by_template(await shim_pid(c, sid))
        await c.shutdown(NS, sid)
    assert ping(session_template.root)["spawned"] == spawned
    assert not os.path.exists(control_socket_path(env.runtime_root)) and templates_of(env.runtime_root) == []


async def test_podshim_template_0_in_the_environment_turns_the_template_off(env, monkeypatch) -> None:
    monkeypatch.setenv(TEMPLATE_ENV, "0")
    sid = env.sid("env0")
    async with Controller(env.state_root, env.runtime_root) as c:
        await c.create(NS, sid)
        assert not forked_by_template(await shim_pid(c, sid))
        await c.shutdown(NS, sid)
    assert templates_of(env.runtime_root) == []


def test_a_template_option_the_controller_cannot_honour_is_refused(env, monkeypatch) -> None:
    with pytest.raises(InvalidArgument, match="exec spawner only"):
        Controller(env.state_root, env.runtime_root, spawner="systemd", template=True)
    monkeypatch.setenv(TEMPLATE_ENV, "maybe")
    with pytest.raises(InvalidArgument, match="PODSHIM_TEMPLATE"):
        Controller(env.state_root, env.runtime_root)


async def test_when_no_template_can_start_shims_are_execd_and_the_log_says_so_once(env, caplog) -> None:
    # A directory where the template's lock file belongs: no template can start on this root.
    os.makedirs(os.path.join(env.runtime_root, TEMPLATE_LOCK))
    sids = [env.sid(f"fb{n}") for n in range(2)]
    with caplog.at_level(logging.WARNING, logger="client.controller.spawners"):
        async with Controller(env.state_root, env.runtime_root) as c:
            for sid in sids:
                await c.create(NS, sid)
                assert not forked_by_template(await shim_pid(c, sid))
            for sid in sids:
                await c.shutdown(NS, sid)
    said = [r.getMessage() for r in caplog.records if "cannot start a shim template" in r.getMessage()]
    assert len(said) == 1 and env.runtime_root in said[0] and "exec'd" in said[0]


async def test_a_template_running_code_older_than_what_is_installed_is_replaced(env, tmp_path) -> None:
    # An installation of our own (a copy of the shim package) that can be "upgraded" under a
    # running template by changing one of its files.
    install = tmp_path / "install"
    shutil.copytree(os.path.join(search_path()[0], "shim"), install / "shim",
                    ignore=shutil.ignore_patterns("__pycache__"))
    command = [sys.executable, "-I", "-S", "-c", BOOT, ":".join([str(install), *search_path()[1:]])]
    spawner = ExecSpawner(command, runtime_root=env.runtime_root)
    async with Controller(env.state_root, env.runtime_root, spawner=spawner) as c:
        await c.create(NS, env.sid("old"))
        old_shim, old_template = await shim_pid(c, env.sid("old")), ping(env.runtime_root)["pid"]

        with open(install / "shim" / "launch" / "spawn.py", "a") as f:
            f.write("\n# upgraded\n")
        await c.create(NS, env.sid("new"))
        new_shim, new_template = await shim_pid(c, env.sid("new")), ping(env.runtime_root)["pid"]

        assert new_template != old_template and not await wait_gone_async(old_template)
        assert templates_of(env.runtime_root) == [new_template] and forked_by_template(new_shim)
        assert alive(old_shim)  # shims of the old template keep running: it was not their parent
        await c.shutdown(NS, env.sid("old"))
        await c.shutdown(NS, env.sid("new"))
    assert template_pid(env.runtime_root) == new_template


async def test_spawns_beyond_those_a_template_takes_at_once_wait_in_the_spawner_not_in_the_template(
        tmp_path, monkeypatch) -> None:
    # A hundred pods started together: each Spawn's SPAWN_TIMEOUT must bound the template's work on
    # it, so the spawner hands the template TEMPLATE_SPAWNS_AT_ONCE at a time and the rest wait here.
    import socket

    from shim.rpc import CallContext, Server
    from shim.rpc.status import Unavailable

    from client.controller.defaults import TEMPLATE_SPAWNS_AT_ONCE

    in_template, most, asked = 0, 0, []

    async def spawn(ctx: CallContext, payload: dict) -> dict:
        nonlocal in_template, most
        in_template += 1
        most = max(most, in_template)
        asked.append(payload["sandbox_id"])
        try:
            await anyio.sleep(0.05)
        finally:
            in_template -= 1
        raise Unavailable("this template spawns nothing")  # the spawner would exec the shim instead

    server = Server(allowed_uids={os.getuid()})
    server.register(TEMPLATE_SERVICE, {"Spawn": spawn})
    path = str(tmp_path / "template.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    await server.start(listener)
    monkeypatch.setenv(TEMPLATE_SOCKET_ENV, path)  # not the runtime root's own: never started or replaced
    spawner = ExecSpawner(runtime_root=str(tmp_path / "run"), use_template=True)
    results: list[object] = []

    async def one(n: int) -> None:
        results.append(await spawner._spawn_from_template("ns", f"pod{n}", str(tmp_path / f"pod{n}")))

    try:
        async with anyio.create_task_group() as tasks:
            for n in range(3 * TEMPLATE_SPAWNS_AT_ONCE):
                tasks.start_soon(one, n)
    finally:
        await server.aclose()
    assert sorted(asked) == sorted(f"pod{n}" for n in range(3 * TEMPLATE_SPAWNS_AT_ONCE))
    assert results == [None] * (3 * TEMPLATE_SPAWNS_AT_ONCE)
    assert most == TEMPLATE_SPAWNS_AT_ONCE


def _serve_in_a_thread(path: str, handler, served: list[float]) -> threading.Thread:
    """A template stand-in on ``path``: one connection, served without an event loop; the time its
    peer closed it is appended to ``served``."""
    import socket
    import time as clock

    from shim.rpc.blocking import serve_connection

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)

    def serve() -> None:
        try:
            conn, _ = listener.accept()
            serve_connection(conn, {(TEMPLATE_SERVICE, "Spawn"): handler}, allowed_uids={os.getuid()}, timeout=10)
            served.append(clock.monotonic())
        finally:
            listener.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


async def test_a_spawns_exchange_with_the_template_does_not_wait_for_the_event_loop(tmp_path, monkeypatch) -> None:
    # The template serves one connection at a time: on a daemon whose loop is busy (a hundred pods
    # at once), a Spawn that waited for the loop to send its request and close the connection kept
    # every other Spawn waiting too.
    import time as clock

    from shim.rpc.status import Unavailable

    def spawn(request) -> dict:
        clock.sleep(0.2)  # answered while the loop is busy
        raise Unavailable("this template spawns nothing")

    served: list[float] = []
    path = str(tmp_path / "template.sock")
    thread = _serve_in_a_thread(path, spawn, served)
    monkeypatch.setenv(TEMPLATE_SOCKET_ENV, path)
    spawner = ExecSpawner(runtime_root=str(tmp_path / "run"), use_template=True)
    results: list[object] = []

    async def one() -> None:
        results.append(await spawner._spawn_from_template("ns", "pod", str(tmp_path / "pod")))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(one)
        await anyio.sleep(0.05)  # the Spawn is on its way
        clock.sleep(1.0)  # the loop is busy: nothing of it runs meanwhile
        loop_free = clock.monotonic()
    thread.join(timeout=10)
    assert served and served[0] < loop_free - 0.5  # the exchange was over long before the loop was free
    assert results == [None]  # the template's refusal: the spawner execs the shim instead


async def test_a_template_that_never_answers_a_spawn_is_a_deadline_not_a_missing_template(tmp_path, monkeypatch) -> None:
    # The request went out: the template may be forking that shim. Taking it for "no template" would
    # start the shim a second way; the caller gets DeadlineExceeded and the shim is found later.
    import socket

    from shim.rpc.status import DeadlineExceeded

    from client.controller.spawners import exec as exec_spawner

    monkeypatch.setattr(exec_spawner, "SPAWN_TIMEOUT", 0.3)
    path = str(tmp_path / "template.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)  # accepts (the kernel does) and never answers
    monkeypatch.setenv(TEMPLATE_SOCKET_ENV, path)
    spawner = ExecSpawner(runtime_root=str(tmp_path / "run"), use_template=True)
    try:
        with pytest.raises(DeadlineExceeded, match="did not spawn ns/pod within"):
            await spawner._spawn_from_template("ns", "pod", str(tmp_path / "pod"))
    finally:
        listener.close()


async def test_a_template_socket_nobody_serves_is_passed_over(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(TEMPLATE_SOCKET_ENV, str(tmp_path / "gone.sock"))  # not the root's own: never started
    spawner = ExecSpawner(runtime_root=str(tmp_path / "run"), use_template=True)
    assert await spawner._spawn_from_template("ns", "pod", str(tmp_path / "pod")) is None
