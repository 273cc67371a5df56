"""The shim template ends by itself once nothing needs it (protocol.md 7.5, "Life"): no process
that called it runs and no sandbox is left, for its idle grace. While a user runs (an open
Controller, podshimd), or a sandbox is left, it stays.

The test process itself never calls the template (a caller is a user for as long as it runs):
it reads the template's pid from its lock and the spare's from a Ping made by a child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from shim.api.names import TEMPLATE_LOCK, TEMPLATE_SOCKET
from shim.launch.template import template_pid

from support.proctools import alive, wait_gone
from support.sandbox_env import PODSHIM, Env

GRACE = 1.0  # the template's idle grace in these tests, seconds
#: A bound on the template's end: it checks twice, GRACE apart, after the last user or sandbox.
GONE_WITHIN = 2 * GRACE + 10.0

PING = r"""
import json, sys
from shim.rpc import blocking
print(json.dumps(blocking.call("unix://" + sys.argv[1], "podshim.template.v1.Template", "Ping", timeout=5)))
"""

# A Controller that opens (a user of the running template), makes and removes one sandbox, says so,
# and stays open until its stdin closes. argv: state root, runtime root, sandbox id.
USER = r"""
import sys, anyio
from client.controller import Controller

async def main():
    async with Controller(sys.argv[1], sys.argv[2]) as c:
        await c.create("default", sys.argv[3])
        await c.start("default", sys.argv[3])
        await c.shutdown("default", sys.argv[3])
        print("done", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)

anyio.run(main)
"""


def start_template(env: Env) -> int:
    started = subprocess.run([*PODSHIM, "template", "--detach", "--runtime-root", env.runtime_root,
                              "--idle-grace", str(GRACE)], capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL)
    assert started.returncode == 0, started.stderr
    return json.loads(started.stdout)["pid"]


def spare_pids(env: Env) -> list[int]:
    """The template's spare shims, asked by a child (which is then a user that has ended)."""
    ping = subprocess.run([sys.executable, "-c", PING, os.path.join(env.runtime_root, TEMPLATE_SOCKET)],
                          capture_output=True, text=True, timeout=30)
    assert ping.returncode == 0, ping.stderr
    return json.loads(ping.stdout)["spare_pids"]


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, result.stderr
    return result


def test_the_template_and_its_spares_end_after_the_last_sandbox_of_a_controller_user_is_gone(env) -> None:
    pid = start_template(env)
    sid = env.sid("last")
    ok(env.ctl("sandbox", "create", sid))
    ok(env.ctl("sandbox", "start", sid))
    spares = spare_pids(env)
    assert spares and all(spares)
    # podshimctl has ended, but its sandbox is left: the template stays past its grace.
    assert wait_gone(pid, timeout=3 * GRACE) == [pid]
    ok(env.ctl("sandbox", "shutdown", sid))
    assert not wait_gone(pid, *spares, timeout=GONE_WITHIN)
    assert not os.path.exists(os.path.join(env.runtime_root, TEMPLATE_SOCKET))
    assert not os.path.exists(os.path.join(env.runtime_root, TEMPLATE_LOCK))
    assert template_pid(env.runtime_root) == 0


def test_the_template_stays_while_a_controller_that_used_it_is_open(env):
    pid = start_template(env)
    user = subprocess.Popen([sys.executable, "-c", USER, env.state_root, env.runtime_root, env.sid("open")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert user.stdout.readline() == "done\n"
        # No sandbox is left; the Controller that asked for one is open.
        assert wait_gone(pid, timeout=3 * GRACE) == [pid]
        assert alive(pid)
    finally:
        user.stdin.close()
        user.wait(timeout=30)
        user.stdout.close()
    assert not wait_gone(pid, timeout=GONE_WITHIN)
