"""Restarts: a Controller killed -9 at any point, and what the next one finds on load.

The first Controller runs in a separate Python process (so it can really be killed -9); the
test then loads a fresh Controller over the same state root in-process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from shim.rpc.status import NotFound

import client.controller.controller as controller_module
import client.controller.loading as loading_module
from client import layouts
from client.controller import Controller
from client.controller.bundles import make_bundle
from client.controller.results import UNKNOWN_EXIT_STATUS
from client.controller.spawners import ExecSpawner

from support.proctools import alive, wait_gone_async

NS = "default"
KILLED = 128 + signal.SIGKILL
BOUND = 10.0  # seconds; a bound for the test, not a readiness sleep
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# The first controller. argv: state root, runtime root, plan (JSON list of [namespace, id,
# [actions]]), crash point. It prints one JSON line {namespace/id: verbose status} and then
# blocks until it is killed -- unless the crash point kills it first.
CHILD = r"""
import dataclasses, json, os, signal, sys
import anyio
from client.controller import Controller
from client.controller.spawners import ExecSpawner

state_root, runtime_root, plan, crash = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]

class Crashing(ExecSpawner):
    async def spawn(self, namespace, sandbox_id, bundle):
        boot = await super().spawn(namespace, sandbox_id, bundle)
        if crash == "after-spawn":  # the shim runs; CreateSandbox was never sent
            os.kill(os.getpid(), signal.SIGKILL)
        return boot

    async def release(self, namespace, sandbox_id):
        if crash == "in-shutdown":  # ShutdownSandbox done; bundle and map entry still there
            os.kill(os.getpid(), signal.SIGKILL)

async def main():
    c = Controller(state_root, runtime_root, spawner=Crashing(runtime_root=runtime_root))
    await c.load()
    report = {}
    for namespace, sandbox_id, actions in plan:
        for action in actions:
            if action == "stop":
                await c.stop(namespace, sandbox_id, timeout=1)
            else:
                await getattr(c, action)(namespace, sandbox_id)
        if "shutdown" not in actions:
            report[f"{namespace}/{sandbox_id}"] = dataclasses.asdict(await c.status(namespace, sandbox_id, verbose=True))
    print(json.dumps(report), flush=True)
    sys.stdin.read()

anyio.run(main)
"""


def run_first_controller(env, plan: list, crash: str = "none") -> dict:
    """Run the first controller through ``plan``, kill it -9, return what it reported."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, env.state_root, env.runtime_root, json.dumps(plan), crash],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert child.stdin is not None and child.stdout is not None  # (PIPE)
    try:
        line = child.stdout.readline()
    finally:
        child.kill()
        child.wait(timeout=30)
        child.stdin.close()
        child.stdout.close()
    assert crash != "none" or line, "the first controller died before reporting"
    return json.loads(line) if line else {}


def controller(env) -> Controller:
    return Controller(env.state_root, env.runtime_root)


def shim_pid(report: dict, namespace: str, sandbox_id: str) -> int:
    return int(report[f"{namespace}/{sandbox_id}"]["info"]["shim_pid"])


async def shutdown_all(c: Controller) -> None:
    for status in await c.list():
        await c.shutdown(status.namespace, status.sandbox_id)


async def test_after_a_kill_9_every_sandbox_is_back_with_its_pid_and_state(env) -> None:
    running, created, stopped = env.sid("running"), env.sid("created"), env.sid("stopped")
    report = run_first_controller(env, [[NS, running, ["create", "start"]], [NS, created, ["create"]],
                                        ["k8s.io", stopped, ["create", "start", "stop"]]])
    async with controller(env) as c:
        found = {f"{s.namespace}/{s.sandbox_id}": s for s in await c.list()}
        assert sorted(found) == sorted(report)
        for key, before in report.items():
            after = found[key]
            assert (after.pid, after.state, after.created_at, after.exit_status, after.address) == (
                before["pid"], before["state"], before["created_at"], before["exit_status"], before["address"])
        assert {s.state for s in found.values()} == {"running", "created", "stopped"}
        assert alive(found[f"{NS}/{running}"].pid)
        await shutdown_all(c)


async def test_a_shim_killed_while_the_controller_is_down_is_cleaned_up_on_load(env) -> None:
    sid = env.sid("dies")
    report = run_first_controller(env, [[NS, sid, ["create", "start"]]])
    info = report[f"{NS}/{sid}"]["info"]
    os.kill(shim_pid(report, NS, sid), signal.SIGKILL)
    assert not await wait_gone_async(shim_pid(report, NS, sid))
    async with controller(env) as c:
        after = await c.status(NS, sid)
        # The pause outlived its shim; `podshim delete` killed it: 128 + SIGKILL.
        assert (after.state, after.exit_status) == ("stopped", KILLED) and after.exited_at > 0
        assert (await c.wait(NS, sid)).exit_status == KILLED
        assert not alive(report[f"{NS}/{sid}"]["pid"])
        assert not os.path.exists(info["netns_path"]) and not os.path.exists(env.bundle(NS, sid))
        await c.shutdown(NS, sid)
        with pytest.raises(NotFound):
            await c.status(NS, sid)


async def test_a_shim_killed_after_its_pause_exited_reports_the_recorded_exit(env) -> None:
    sid = env.sid("recorded")
    report = run_first_controller(env, [[NS, sid, ["create", "start", "stop"]]])
    os.kill(shim_pid(report, NS, sid), signal.SIGKILL)
    async with controller(env) as c:
        after = await c.status(NS, sid)
        before = report[f"{NS}/{sid}"]
        assert (after.state, after.exit_status, after.exited_at) == ("stopped", before["exit_status"],
                                                                     before["exited_at"])
        await c.shutdown(NS, sid)


async def test_a_corrupt_bootstrap_json_is_treated_as_a_dead_shim(env) -> None:
    sid = env.sid("corrupt")
    report = run_first_controller(env, [[NS, sid, ["create", "start"]]])
    with open(os.path.join(env.bundle(NS, sid), "bootstrap.json"), "w") as f:
        f.write("{not json")
    async with controller(env) as c:
        after = await c.status(NS, sid)
        assert after.state == "stopped" and after.exit_status == KILLED
        # state.json still named the shim and the pause: delete ended both.
        assert not await wait_gone_async(shim_pid(report, NS, sid)) and not alive(report[f"{NS}/{sid}"]["pid"])
        await c.shutdown(NS, sid)


async def test_an_empty_bundle_is_a_dead_sandbox_with_an_unknown_exit(env) -> None:
    sid = env.sid("empty")
    make_bundle(env.state_root, NS, sid)  # a controller killed before it spawned the shim
    async with controller(env) as c:
        after = await c.status(NS, sid)
        assert (after.state, after.exit_status) == ("stopped", UNKNOWN_EXIT_STATUS)
        assert not os.path.exists(env.bundle(NS, sid))
        await c.shutdown(NS, sid)


async def test_a_shim_spawned_but_never_created_is_shut_down_on_load(env) -> None:
    sid = env.sid("orphan")
    started = env.podshim("start", NS, sid)
    assert started.returncode == 0, started.stderr
    pid = json.loads(started.stdout)["pid"]
    assert alive(pid)
    async with controller(env) as c:
        assert c.sandboxes.is_empty()
        with pytest.raises(NotFound):
            await c.status(NS, sid)
    assert not await wait_gone_async(pid)
    assert not os.path.exists(env.bundle(NS, sid))


@pytest.mark.parametrize("crash", ["after-spawn", "in-shutdown"])
async def test_a_controller_killed_in_the_middle_leaves_nothing_after_the_next_load(env, crash) -> None:
    sid = env.sid("middle")
    actions = ["create"] if crash == "after-spawn" else ["create", "start", "shutdown"]
    run_first_controller(env, [[NS, sid, actions]], crash)
    if crash == "in-shutdown":
        # ShutdownSandbox was answered: the shim is on its way out. Until it is gone it counts as
        # alive (unreachable), never as dead.
        with open(os.path.join(env.bundle(NS, sid), "bootstrap.json")) as f:
            assert not await wait_gone_async(json.load(f)["pid"])
    async with controller(env) as c:
        if crash == "after-spawn":
            assert c.sandboxes.is_empty()  # never created: shut down and forgotten
        else:
            assert (await c.status(NS, sid)).state == "stopped"  # half shut down: a tombstone
            await c.shutdown(NS, sid)
        assert c.sandboxes.is_empty()
    assert not os.path.exists(env.bundle(NS, sid))


async def test_load_removes_hidden_leftovers_and_skips_names_that_are_not_identifiers(env, caplog) -> None:
    layouts.claim(env.state_root, layouts.BUNDLE_ROOT)
    leftover = os.path.join(env.state_root, NS, f".{env.sid('gone')}.0a1b2c3d")
    strange = os.path.join(env.state_root, NS, "not an id")
    os.makedirs(leftover)
    open(os.path.join(leftover, "state.json"), "w").close()
    os.makedirs(strange)
    try:
        with caplog.at_level(logging.WARNING):
            async with controller(env) as c:
                assert c.sandboxes.is_empty()
        assert not os.path.exists(leftover) and os.path.isdir(strange)
        assert any("not an id" in r.getMessage() for r in caplog.records)
    finally:
        os.rmdir(strange)


async def test_a_missing_socket_fails_fast_and_a_silent_one_within_the_load_timeout(env, monkeypatch) -> None:
    class Timed(ExecSpawner):
        """Notes when the controller gave up on a shim and called delete."""
        gave_up: dict[str, float] = {}

        async def delete(self, namespace, sandbox_id, bundle):
            self.gave_up[sandbox_id] = time.monotonic()
            return await super().delete(namespace, sandbox_id, bundle)

    missing, silent = env.sid("missing"), env.sid("silent")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.path.join(env.runtime_root, "silent.sock"))
    listener.listen(8)  # connects succeed (backlog); nobody ever answers
    for sid, name in ((missing, "nothing.sock"), (silent, "silent.sock")):
        os.makedirs(env.bundle(NS, sid))
        with open(os.path.join(env.bundle(NS, sid), "bootstrap.json"), "w") as f:
            json.dump({"version": 3, "address": f"unix://{env.runtime_root}/{name}", "protocol": "ttrpc+msgpack",
                       "pid": 0}, f)
    spawner = Timed(runtime_root=env.runtime_root)
    c = Controller(env.state_root, env.runtime_root, spawner=spawner)
    try:
        # No retrying up to LOAD_TIMEOUT (containerd#5597): with an endless one, it still gives up.
        monkeypatch.setattr(loading_module, "LOAD_TIMEOUT", 3600.0)
        async with asyncio.timeout(BOUND):
            await c.load(NS, missing)
        assert missing in spawner.gave_up
        monkeypatch.setattr(loading_module, "LOAD_TIMEOUT", 0.5)
        began = time.monotonic()
        async with asyncio.timeout(BOUND):
            await c.load(NS, silent)
        assert spawner.gave_up[silent] - began >= 0.5  # only once its LOAD_TIMEOUT passed
        for sid in (missing, silent):
            after = await c.status(NS, sid)
            assert (after.state, after.exit_status) == ("stopped", UNKNOWN_EXIT_STATUS)
            await c.shutdown(NS, sid)
    finally:
        await c.aclose()
        listener.close()
        os.unlink(os.path.join(env.runtime_root, "silent.sock"))


async def test_loading_one_sandbox_loads_only_that_one(env) -> None:
    one, other = env.sid("one"), env.sid("other")
    async with controller(env) as c:
        await c.create(NS, one)
        await c.create(NS, other)
    c = controller(env)
    try:
        await c.load(NS, one)
        assert [h.sandbox_id for h in c.sandboxes.list()] == [one]
        await c.load(NS, env.sid("absent"))  # no bundle: nothing to load, no error
        await c.load()
        assert sorted(h.sandbox_id for h in c.sandboxes.list()) == sorted([one, other])
        await shutdown_all(c)
    finally:
        await c.aclose()


# -- two Controllers over one state root ---------------------------------------------------------
# Another Controller (podshimctl), in its own process: load the one sandbox and print its status
# or the error, as `podshimctl sandbox status` would.
OTHER = r"""
import sys, anyio
from client.controller import Controller
from shim.rpc.status import RpcError

async def main():
    async with Controller(sys.argv[1], sys.argv[2]) as c:
        await c.load(sys.argv[3], sys.argv[4])
        try:
            print((await c.status(sys.argv[3], sys.argv[4])).state)
        except RpcError as exc:
            print(exc.code.name)

anyio.run(main)
"""


async def test_a_bundle_being_made_is_never_taken_for_a_dead_one_by_another_controller(env, monkeypatch):
    """The moment a create's bundle appears, another Controller loading it must find it being
    changed and leave it be; it used to find it empty and unlocked, 'clean it up' and remove it,
    so the create failed with UNAVAILABLE (issue 13)."""
    sid = env.sid("seen")
    seen: list[str] = []

    real_make_bundle = controller_module.make_bundle

    def make_bundle(*args, **kwargs):
        path = real_make_bundle(*args, **kwargs)
        # The bundle is there under its name: another Controller looks at it right now.
        done = subprocess.run([sys.executable, "-c", OTHER, env.state_root, env.runtime_root, NS, sid],
                              capture_output=True, text=True, timeout=60, cwd=ROOT)
        seen.append(done.stdout.strip() or done.stderr)
        return path

    monkeypatch.setattr(controller_module, "make_bundle", make_bundle)
    async with controller(env) as c:
        await c.create(NS, sid)  # neither UNAVAILABLE nor undone
        assert seen == ["NOT_FOUND"]  # it skipped a bundle another process is making
        assert (await c.status(NS, sid)).state == "created"
        await c.shutdown(NS, sid)
