"""The units under a real systemd, booted in systemd-nspawn from the host's own OS (tests/support/nspawn.py).

The project is pip-installed into a venv of /usr/bin/python3 that is bound read-only into the
container; the units are copied into its /run/systemd/system. The tests drive systemd with
``nsenter ... systemctl`` and reach the shims from here through the container's root
(``/proc/LEADER/root/run/...``). The Controller with the SystemdSpawner runs *inside* the
container (the venv's python through nsenter), as it would on a node: there its paths,
its pids and systemctl are the container's own, and nothing needs translating.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import re
import shlex
import shutil
import stat
import textwrap
import time
from collections.abc import Iterator

import pytest

import shim
from shim.api.names import SANDBOX_SERVICE
from shim.api.paths import BOOTSTRAP_FILE, STATE_FILE
from shim.lib.files import read_json
from shim.rpc import Client

from client.controller.spawners.systemd import unit_names

from support.netrelay import loopback_relay
from support.nspawn import CONTAINER_PATH, Machine, command_links, nspawn_unavailable, project_venv

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STATE_ROOT = "/var/lib/podshim/sandboxes"
#: Where the checkout is in the machine (read-only): its .ci scripts run there.
CHECKOUT = "/opt/podshim-checkout"
CALL_TIMEOUT = 10.0


@pytest.fixture(scope="module")
def machine():
    """A booted container with the units installed and the venv's podshim commands linked in its
    /usr/local/bin, where .ci/install links them on a host (the units run /usr/local/bin/podshim);
    PATH set to find the venv's commands first."""
    reason = nspawn_unavailable()
    if reason is not None:
        pytest.skip(reason)
    with project_venv(REPO) as venv, command_links(venv) as links, \
            Machine.booted(binds_ro=[venv, f"{links}:/usr/local/bin", f"{REPO}:{CHECKOUT}"]) as m:
        m.venv, m.links = venv, links
        m.install_units(os.path.join(REPO, "systemd"))
        m.write_file("/run/podshim/systemd.env", f'PATH="{venv}/bin:{CONTAINER_PATH}"\n')
        yield m


def wait_for_state(machine: Machine, unit: str, state: str, timeout: float = CALL_TIMEOUT) -> None:
    """Poll until ``unit``'s ActiveState is ``state``: a unit stopped through another's PartOf=
    may get there after the ``systemctl stop`` of that other unit returned."""
    deadline = time.monotonic() + timeout
    while (current := unit_state(machine, unit)) != state:
        assert time.monotonic() < deadline, f"{unit} is still {current}, not {state}, after {timeout} s"
        time.sleep(0.05)


class Sandbox:
    """One sandbox as the tests see it: its units, its files in the container, a client."""

    def __init__(self, machine: Machine, namespace: str, sandbox_id: str):
        self.m = machine
        self.namespace, self.sandbox_id = namespace, sandbox_id
        self.service, self.socket = f"podshim@{namespace}:{sandbox_id}.service", f"podshim@{namespace}:{sandbox_id}.socket"
        self.bundle = f"{STATE_ROOT}/{namespace}/{sandbox_id}"

    def bootstrap(self) -> dict:
        return read_json(self.m.host_path(f"{self.bundle}/{BOOTSTRAP_FILE}"))

    def state(self) -> dict:
        return read_json(self.m.host_path(f"{self.bundle}/{STATE_FILE}"))

    def show(self, *properties: str, unit: str | None = None) -> dict[str, str]:
        return self.m.show(unit or self.service, *properties)

    async def connect(self, address: str | None = None) -> Client:
        """A client on the shim's socket, reached through the container's root."""
        path = (address or self.bootstrap()["address"]).removeprefix("unix://")
        return await Client.connect("unix://" + self.m.host_path(path), namespace=self.namespace)

    async def call(self, client: Client, method: str, **fields):
        return await client.call(SANDBOX_SERVICE, method, {"sandbox_id": self.sandbox_id, **fields},
                                 timeout=CALL_TIMEOUT)

    async def run(self, client: Client) -> tuple[int, dict[str, str]]:
        """CreateSandbox, StartSandbox; the pause's pid (in the container) and the verbose info."""
        await self.call(client, "CreateSandbox")
        pid = (await self.call(client, "StartSandbox"))["pid"]
        return pid, (await self.call(client, "SandboxStatus", verbose=True))["info"]

    def netns_visible(self, netns_path: str) -> bool:
        """The netns pin is a mount in the container's own mount namespace (where CNI plugins
        and ``ip netns`` look), not only in the shim's."""
        name = os.path.basename(netns_path)
        return f"/run/netns/{name} " in self.m.mounts() and name in self.m.run("ip", "netns", "list").stdout

    def assert_gone(self, pause_pid: int, info: dict[str, str]) -> None:
        assert not self.m.pid_alive(pause_pid)
        assert not os.path.lexists(self.m.host_path(info["netns_path"]))
        assert os.path.basename(info["netns_path"]) not in self.m.mounts()
        assert not any(os.path.isdir(self.m.host_path(info[k])) for k in info if k.startswith("cgroup."))


async def test_a_sandbox_unit_is_active_once_its_shim_serves_and_stopping_it_shuts_the_sandbox_down(machine) -> None:
    sb = Sandbox(machine, "ns1", "sb1")
    machine.systemctl("start", sb.service)  # returns at READY=1 (Type=notify)
    show = sb.show("ActiveState", "SubState", "MainPID", "StatusText")
    assert (show["ActiveState"], show["SubState"], show["StatusText"]) == ("active", "running", "serving sb1")
    assert sb.bootstrap()["pid"] == int(show["MainPID"])
    async with await sb.connect() as client:
        pause, info = await sb.run(client)
        assert sb.show("StatusText")["StatusText"] == "sandbox sb1 running"
        assert sb.netns_visible(info["netns_path"])
        # The pause lives in the unit's cgroup (Delegate=yes), below the shim.
        assert "/system-podshim.slice/podshim@ns1:sb1.service/" in info["cgroup.unified"]
        machine.systemctl("stop", sb.service)  # SIGTERM: the shim ends the sandbox itself
    show = sb.show("ActiveState", "Result", "ExecMainStatus")
    assert (show["ActiveState"], show["Result"], show["ExecMainStatus"]) == ("inactive", "success", "0")
    sb.assert_gone(pause, info)
    assert sb.state()["state"] == "deleted"  # ExecStopPost's `podshim delete` found nothing left


async def test_the_socket_starts_the_shim_on_the_first_connection(machine) -> None:
    sb = Sandbox(machine, "ns1", "sb2")
    machine.systemctl("start", sb.socket)
    path = "/run/podshim/u/ns1:sb2.sock"
    assert stat.S_IMODE(os.stat(machine.host_path(path)).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(machine.host_path(os.path.dirname(path))).st_mode) == 0o700
    assert sb.show("ActiveState")["ActiveState"] == "inactive"
    async with await sb.connect("unix://" + path) as client:
        assert await sb.call(client, "PingSandbox") == {}
        show = sb.show("ActiveState", "MainPID", "TriggeredBy")
        assert show["ActiveState"] == "active" and show["TriggeredBy"] == sb.socket
        boot = sb.bootstrap()
        assert boot.pop("start_time") > 0  # of the container's pid MainPID, read in there
        assert boot == {"version": 3, "address": "unix://" + path, "protocol": "ttrpc+msgpack",
                        "pid": int(show["MainPID"])}
        pause, info = await sb.run(client)
        assert sb.netns_visible(info["netns_path"])
        machine.systemctl("stop", sb.service)
    # PartOf=: the socket goes with its service, so no connection can start a second shim. Its
    # stop job may finish after `systemctl stop` of the service returned: wait for it.
    wait_for_state(machine, sb.socket, "inactive")
    assert not os.path.lexists(machine.host_path(path))
    sb.assert_gone(pause, info)


async def test_a_shim_that_is_killed_leaves_nothing_behind(machine) -> None:
    sb = Sandbox(machine, "ns1", "sb3")
    machine.systemctl("start", sb.service)
    async with await sb.connect() as client:
        pause, info = await sb.run(client)
        machine.systemctl("kill", "--kill-whom=main", "--signal=SIGKILL", sb.service)
        # A stop waits for the unit's stop sequence, ExecStopPost included, to finish.
        machine.systemctl("stop", sb.service)
    show = sb.show("ActiveState", "Result")
    assert (show["ActiveState"], show["Result"]) == ("failed", "signal")
    sb.assert_gone(pause, info)
    assert sb.state()["state"] == "deleted"
    machine.systemctl("reset-failed", sb.service)


# -- the Controller with the SystemdSpawner, inside the container -------------------------------

PRELUDE = """
import json, logging, subprocess, sys
import anyio
from client.controller import Controller
from client.controller.spawners.systemd import SystemdSpawner, unit_names
logging.basicConfig(level=logging.WARNING)
def out(doc):
    print(json.dumps(doc, default=lambda o: o.__dict__ if hasattr(o, "__dict__") else repr(o)))
"""


def in_container(machine: Machine, script: str, *args: str):
    """Run ``script`` with the venv's python in the container; the JSON of its last output line."""
    done = machine.run(f"{machine.venv}/bin/python", "-c", PRELUDE + textwrap.dedent(script), *args, timeout=120)
    return json.loads(done.stdout.splitlines()[-1])


def unit_state(machine: Machine, unit: str) -> str:
    return machine.show(unit, "ActiveState")["ActiveState"]


async def test_the_controller_spawns_through_systemd_and_reconnects_after_a_restart(machine) -> None:
    short, long_ns, long_id = "sb-a", "n" * 20, "l" * 70  # 20 + 70 characters: too long for the socket path
    created = in_container(machine, """
        async def main():
            async with Controller(spawner="systemd") as c:
                out_ = {}
                for ns, sid in (("ns4", sys.argv[1]), (sys.argv[2], sys.argv[3])):
                    await c.create(ns, sid, options={"hostname": "h"})
                    out_[sid] = (await c.start(ns, sid)).pid
                out(out_)
            # Leaving the block closes connections only: the shims keep running.
        anyio.run(main)
    """, short, long_ns, long_id)
    (short_service, short_socket), (long_service, long_socket) = unit_names("ns4", short), unit_names(long_ns, long_id)
    assert short_service == "podshim@ns4:sb\\x2da.service"
    # The short name was socket-activated (the Controller's connection started it); the long one
    # was started as a service with its hashed socket.
    assert [unit_state(machine, u) for u in (short_service, short_socket, long_service, long_socket)] == \
        ["active", "active", "active", "inactive"]
    # systemctl show quotes a unit name with a backslash, as a shell word.
    assert shlex.split(machine.show(short_service, "TriggeredBy")["TriggeredBy"]) == [short_socket]
    assert read_json(machine.host_path(f"{STATE_ROOT}/{long_ns}/{long_id}/{BOOTSTRAP_FILE}"))["address"].startswith(
        "unix:///run/podshim/s/")
    assert all(machine.pid_alive(pid) for pid in created.values())

    # A new controller finds both through their bundles, as after a restart.
    listed = in_container(machine, """
        async def main():
            async with Controller(spawner="systemd") as c:
                out({s.sandbox_id: [s.state, s.pid] for s in await c.list()})
        anyio.run(main)
    """)
    assert listed == {short: ["running", created[short]], long_id: ["running", created[long_id]]}

    # The shim dies: the controller reports the sandbox stopped and cleans up through systemd.
    ended = in_container(machine, """
        async def main():
            async with Controller(spawner="systemd") as c:
                subprocess.run(["systemctl", "kill", "--kill-whom=main", "--signal=SIGKILL", sys.argv[1]], check=True)
                gone = await c.wait("ns4", sys.argv[2])
                status = await c.status("ns4", sys.argv[2])
                for s in await c.list():
                    await c.shutdown(s.namespace, s.sandbox_id)
                out({"exit": [gone.exit_status, status.state], "left": [s.sandbox_id for s in await c.list()]})
        anyio.run(main)
    """, short_service, short)
    assert ended["exit"][1] == "stopped" and ended["exit"][0] in (137, 255) and ended["left"] == []
    for unit in (short_service, short_socket, long_service, long_socket):
        assert unit_state(machine, unit) == "inactive", unit
    assert not any(machine.pid_alive(pid) for pid in created.values())
    assert machine.run("ip", "netns", "list").stdout == ""
    assert not os.path.exists(machine.host_path(f"{STATE_ROOT}/ns4/{short}"))
    assert not os.path.exists(machine.host_path(f"{STATE_ROOT}/{long_ns}/{long_id}"))


def test_podshimctl_runs_a_sandbox_as_a_unit_with_spawner_systemd(machine) -> None:
    def ctl(*args: str) -> str:
        return machine.run(f"{machine.venv}/bin/podshimctl", "--spawner", "systemd", "--json", "sandbox", *args).stdout

    service, socket = unit_names("default", "sb-cli")
    ctl("create", "sb-cli")
    pid = json.loads(ctl("start", "sb-cli"))["pid"]
    assert [unit_state(machine, u) for u in (service, socket)] == ["active", "active"]
    assert json.loads(ctl("status", "sb-cli"))["state"] == "running" and machine.pid_alive(pid)
    ctl("shutdown", "sb-cli")
    assert [unit_state(machine, u) for u in (service, socket)] == ["inactive", "inactive"]
    assert not machine.pid_alive(pid)


async def test_shims_forked_by_the_template_unit_pin_their_netns_where_the_host_sees_it(machine) -> None:
    sb = Sandbox(machine, "ns5", "sb5")
    machine.systemctl("start", "podshim-template.service")
    try:
        # Type=simple: systemd cannot say when the control socket accepts; its file appears
        # just before it does, and `podshim start` would fork the shim itself without it.
        control = machine.host_path("/run/podshim/template.sock")
        deadline = time.monotonic() + CALL_TIMEOUT
        while not os.path.exists(control):
            assert time.monotonic() < deadline, "the template did not make its control socket"
            await asyncio.sleep(0.02)
        machine.run("mkdir", "-p", sb.bundle)
        boot = json.loads(machine.run(f"{machine.venv}/bin/podshim", "start", "--namespace", sb.namespace, "--id",
                                      sb.sandbox_id, "--bundle", sb.bundle).stdout)
        with open(machine.host_path(f"/proc/{boot['pid']}/cgroup")) as f:
            assert "/podshim-template.service" in f.read()  # forked by the template, not by start
        async with await sb.connect(boot["address"]) as client:
            pause, info = await sb.run(client)
            assert sb.netns_visible(info["netns_path"])
            await sb.call(client, "ShutdownSandbox")
        sb.assert_gone(pause, info)
    finally:
        machine.systemctl("stop", "podshim-template.service")


# -- podshimd, the CRI runtime, as a unit ------------------------------------------------------

def podshimctl(machine: Machine, *args: str) -> str:
    """podshimctl's pod verbs in the container: they talk to podshimd on its default socket."""
    return machine.run(f"{machine.venv}/bin/podshimctl", *args, timeout=120).stdout


def main_pid(machine: Machine, unit: str) -> int:
    return int(machine.show(unit, "MainPID")["MainPID"])


def wait_for_new_main_pid(machine: Machine, unit: str, old: int, timeout: float = 60.0) -> int:
    """Poll until ``unit`` is active again under a main process other than ``old`` (Restart=)."""
    deadline = time.monotonic() + timeout
    while True:
        show = machine.show(unit, "ActiveState", "MainPID")
        if show["ActiveState"] == "active" and int(show["MainPID"]) not in (0, old):
            return int(show["MainPID"])
        assert time.monotonic() < deadline, f"{unit} did not come back: {show}"
        time.sleep(0.05)


def test_install_units_installs_reloads_and_restarts_podshimd_only_on_an_upgrade(machine) -> None:
    # .ci/install runs it (with --restart when it reinstalled podshim). Here into /run/systemd/system,
    # where the machine has the units already: one is made stale first, as an older install left it.
    env = {"PODSHIM_UNIT_DIR": "/run/systemd/system", "PODSHIM_DOC_DIR": "/run/podshim-doc"}
    unit = "/run/systemd/system/podshimd.service"
    with open(machine.host_path(unit)) as f:
        fresh = f.read()
    machine.write_file(unit, fresh.replace("Restart=always", "Restart=no"))
    machine.systemctl("daemon-reload")
    machine.write_file(unit, fresh.replace("Restart=always", "Restart=on-failure"))  # systemd not told yet
    try:
        out = machine.run(f"{CHECKOUT}/.ci/install-units", env=env).stdout
        assert f"install: {unit}\n" in out and "install: /run/podshim-doc/docs/operator-guide.md\n" in out
        assert out.endswith("install: to run podshimd as a service: systemctl enable --now podshimd.socket "
                            "podshimd.service\n")
        # systemd was reloaded: it runs the file as installed now.
        assert machine.show("podshimd.service", "Restart", "NeedDaemonReload") == {"Restart": "always",
                                                                                  "NeedDaemonReload": "no"}
        assert os.path.isfile(machine.host_path("/run/podshim-doc/docs/systemd.md"))
        assert machine.run(f"{CHECKOUT}/.ci/install-units", env=env).stdout.startswith("install: to run")  # nothing

        machine.systemctl("start", "podshimd.socket", "podshimd.service")
        before = main_pid(machine, "podshimd.service")
        machine.run(f"{CHECKOUT}/.ci/install-units", env=env)
        assert main_pid(machine, "podshimd.service") == before  # nothing upgraded: left running
        out = machine.run(f"{CHECKOUT}/.ci/install-units", "--restart", env=env).stdout
        assert "install: restarted podshimd.service (an upgrade: its pods keep running)\n" in out
        assert main_pid(machine, "podshimd.service") not in (before, 0)
    finally:
        machine.systemctl("stop", "podshimd.socket", "podshimd.service")
        with open(machine.host_path(unit), "w") as f:
            f.write(fresh)
        machine.systemctl("daemon-reload")


def test_podshimd_starts_on_its_socket_its_pods_outlive_restarts_kill_9_and_an_upgrade_and_it_logs_to_the_journal(
        machine, test_images) -> None:
    busybox = test_images.busybox
    machine.write_file("/run/quick/pod.json", json.dumps({
        "metadata": {"name": "web", "namespace": "default", "uid": "u-nspawn"}, "hostname": "web"}))
    machine.write_file("/run/quick/ctr.json", json.dumps({
        "metadata": {"name": "sleeper"}, "image": {"image": busybox.ref}, "command": ["sleep", "300"]}))
    # The tests' registry, reached from the machine's private network through a relay at the same
    # address, marked plain HTTP in a config of the test's (the machine's /etc is the host's).
    machine.write_file("/run/quick/config.toml", f'[registries."{busybox.ref.split("/", 1)[0]}"]\ninsecure = true\n')
    drop_in = "/run/systemd/system/podshimd.service.d/quick.conf"
    machine.write_file(drop_in, "[Service]\nExecStart=\nExecStart=/usr/local/bin/podshimd --config /run/quick/config.toml\n")
    machine.systemctl("daemon-reload")
    port = int(busybox.ref.split("/", 1)[0].rpartition(":")[2])
    try:
        with loopback_relay(f"/proc/{machine.leader}/ns/net", port):
            _podshimd_in(machine, busybox.ref)
    finally:
        os.unlink(machine.host_path(drop_in))
        machine.systemctl("daemon-reload")


def test_systemctl_reload_applies_the_configs_log_level_without_a_restart(machine) -> None:
    machine.write_file("/run/reload/config.toml", 'log_level = "info"\n')
    drop_in = "/run/systemd/system/podshimd.service.d/reload.conf"
    machine.write_file(drop_in, "[Service]\nExecStart=\nExecStart=/usr/local/bin/podshimd --config /run/reload/config.toml\n")
    machine.systemctl("daemon-reload")
    try:
        machine.systemctl("start", "podshimd.socket", "podshimd.service")
        before = main_pid(machine, "podshimd.service")
        machine.write_file("/run/reload/config.toml", 'log_level = "debug"\n')
        machine.systemctl("reload", "podshimd.service")
        deadline = time.monotonic() + CALL_TIMEOUT
        while "log level is now debug (was info)" not in machine.run(
                "journalctl", "-u", "podshimd.service", "-o", "cat", "--no-pager").stdout:
            assert time.monotonic() < deadline, "podshimd did not apply the new log level"
            time.sleep(0.1)
        assert main_pid(machine, "podshimd.service") == before  # no restart
    finally:
        machine.systemctl("stop", "podshimd.socket", "podshimd.service")
        os.unlink(machine.host_path(drop_in))
        machine.systemctl("daemon-reload")


@contextlib.contextmanager
def upgraded(machine: Machine) -> Iterator[str]:
    """A new version of podshim installed in the machine (a copy of its venv whose podshim says
    it is another version) and the commands' links moved to it, as .ci/install upgrades a node;
    the version. The old links are back afterwards."""
    venv = "/opt/podshim-new"
    shutil.copytree(machine.venv, machine.host_path(venv), symlinks=True)
    version = f"{shim.__version__}+upgraded"
    for init in glob.glob(machine.host_path(f"{venv}/lib/python3*/site-packages/shim/__init__.py")):
        with open(init) as f:
            text = f.read().replace(f'__version__ = "{shim.__version__}"', f'__version__ = "{version}"')
        with open(init, "w") as f:
            f.write(text)
    links = {name: os.readlink(os.path.join(machine.links, name)) for name in os.listdir(machine.links)}
    try:
        for name in links:
            os.unlink(os.path.join(machine.links, name))
            os.symlink(f"{venv}/bin/{name}", os.path.join(machine.links, name))
        yield version
    finally:
        for name, target in links.items():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(machine.links, name))
            os.symlink(target, os.path.join(machine.links, name))


def _podshimd_in(machine, image: str) -> None:
    machine.systemctl("start", "podshimd.socket")
    try:
        assert unit_state(machine, "podshimd.service") == "inactive"
        # The first client starts the daemon through the socket and is answered once it serves.
        assert podshimctl(machine, "pods", "-q") == ""
        assert unit_state(machine, "podshimd.service") == "active"
        pod = podshimctl(machine, "runp", "/run/quick/pod.json").strip()
        podshimctl(machine, "pull", image)
        ctr = podshimctl(machine, "create", pod, "/run/quick/ctr.json", "/run/quick/pod.json").strip()
        podshimctl(machine, "start", ctr)
        info = json.loads(podshimctl(machine, "inspectp", "--json", pod))["info"]
        pause, shim = info["pid"], int(info["shim"]["shim_pid"])
        task = json.loads(podshimctl(machine, "inspect", "--json", ctr))["info"]["pid"]
        # The pod lives below the daemon's unit (Delegate=yes).
        assert "/podshimd.service/" in info["shim"]["cgroup.unified"]

        before = main_pid(machine, "podshimd.service")
        machine.systemctl("restart", "podshimd.service")  # KillMode=process: the daemon only
        after = main_pid(machine, "podshimd.service")
        assert after != before and all(machine.pid_alive(p) for p in (pause, shim, task))
        again = json.loads(podshimctl(machine, "inspectp", "--json", pod))
        assert again["state"] == "SANDBOX_READY" and again["info"]["pid"] == pause

        machine.systemctl("kill", "--kill-whom=main", "--signal=SIGKILL", "podshimd.service")
        wait_for_new_main_pid(machine, "podshimd.service", after)  # Restart=always
        assert all(machine.pid_alive(p) for p in (pause, shim, task))
        assert podshimctl(machine, "ps", "-q").split() == [ctr]

        with upgraded(machine) as version:
            # What .ci/install does on an upgrade: the new version installed, podshimd restarted.
            before = main_pid(machine, "podshimd.service")
            machine.systemctl("try-restart", "podshimd.service")
            assert main_pid(machine, "podshimd.service") != before
            assert json.loads(podshimctl(machine, "version", "--json"))["runtime_version"] == version
            assert all(machine.pid_alive(p) for p in (pause, shim, task))
            assert podshimctl(machine, "pods", "-q").split() == [pod] and podshimctl(machine, "ps", "-q").split() == [ctr]
            again = json.loads(podshimctl(machine, "inspect", "--json", ctr))
            assert again["state"] == "CONTAINER_RUNNING" and again["info"]["pid"] == task

        podshimctl(machine, "rmp", pod)
        # The shim answers the removal, then exits: a moment later under load.
        deadline = time.monotonic() + CALL_TIMEOUT
        while (alive := {name: p for name, p in (("pause", pause), ("shim", shim), ("task", task))
                         if machine.pid_alive(p)}) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive, (alive, machine.run("ps", "-eo", "pid,ppid,stat,args").stdout)
        assert podshimctl(machine, "pods", "-q") == ""
        assert machine.run("ip", "netns", "list").stdout == ""

        # The daemon's lines are journal entries with their level and the pod's fields, and a
        # pod's whole life, from runp to rmp across restarts, a kill -9 and an upgrade, is INFO:
        # nothing at WARNING or above (nothing for an operator to act on).
        entries = [json.loads(line) for line in machine.run(
            "journalctl", "-u", "podshimd.service", "-o", "json", "--no-pager").stdout.splitlines()]
        ready = [e for e in entries if e.get("MESSAGE", "").startswith("pod sandbox ready")]
        assert [(e["PRIORITY"], e["POD_ID"], e["POD_NAME"], e["POD_NAMESPACE"], e["SYSLOG_IDENTIFIER"])
                for e in ready] == [("6", pod, "web", "default", "podshimd")]
        started = [e for e in entries if e.get("MESSAGE", "").startswith("container started")]
        assert [(e["POD_ID"], e["CONTAINER_ID"]) for e in started] == [(pod, ctr)]
        # (Other tests' Controllers share the bundle root in other namespaces: a shim of theirs
        # that they killed is rightly a warning of podshimd's first start, not this pod's.)
        others = re.compile(r"(?:the shim of )?sandbox (?!k8s\.io/)[^/ ]+/")
        assert [e["MESSAGE"] for e in entries if e.get("LOGGER") and int(e["PRIORITY"]) <= 4
                and not others.match(e["MESSAGE"])] == []

    finally:
        machine.systemctl("stop", "podshimd.socket", "podshimd.service")
    assert not os.path.lexists(machine.host_path("/run/podshim/podshimd.sock"))


def test_uninstall_under_systemd_removes_the_pods_the_units_and_every_installed_file_and_state_only_with_purge(
        machine, tmp_path) -> None:
    # A node of its own, installed as .ci/install leaves one: the venv at /opt/podshim (a copy of
    # the module's), its commands linked in /usr/local/bin, the units and docs by .ci/install-units.
    venv, links = "/opt/podshim", tmp_path / "bin"
    links.mkdir()
    os.chmod(links, 0o755)
    for name in os.listdir(os.path.join(machine.venv, "bin")):
        if name.startswith("podshim"):
            os.symlink(f"{venv}/bin/{name}", links / name)
    env = {"PODSHIM_VENV": venv, "PODSHIM_UNIT_DIR": "/run/systemd/system", "PODSHIM_DOC_DIR": "/run/podshim-doc",
           "PODSHIM_MAN_DIR": "/run/podshim-man", "PODSHIM_COMPLETION_DIR": "/run/podshim-completions"}
    with Machine.booted(binds_ro=[f"{REPO}:{CHECKOUT}"], binds=[f"{links}:/usr/local/bin"]) as node:
        shutil.copytree(machine.venv, node.host_path(venv), symlinks=True)
        node.write_file(f"{venv}/.podshim-install", "copy - -\n")  # .ci/install's mark of its venv
        node.run(f"{CHECKOUT}/.ci/install-units", env=env)
        assert os.path.isfile(node.host_path("/run/podshim-man/man1/podshimctl.1"))
        assert os.path.isfile(node.host_path("/run/podshim-completions/podshimctl"))
        node.systemctl("start", "podshimd.socket")  # (enable would write /etc, the host's, read-only here)
        pod = node.run("podshimctl", "runp", f"{CHECKOUT}/examples/pod-config.json").stdout.strip()
        pause = json.loads(node.run("podshimctl", "inspectp", "--json", pod).stdout)["info"]["pid"]

        out = node.run(f"{CHECKOUT}/.ci/uninstall", env=env, timeout=120).stdout
        assert f"uninstall: podshimctl rmp {pod}\n" in out
        deadline = time.monotonic() + CALL_TIMEOUT
        while node.pid_alive(pause) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not node.pid_alive(pause) and node.run("ip", "netns", "list").stdout == ""
        for unit in ("podshimd.service", "podshimd.socket"):
            assert node.show(unit, "LoadState", "ActiveState") == {"LoadState": "not-found", "ActiveState": "inactive"}
        assert os.listdir(links) == [] and not os.path.lexists(node.host_path(venv))
        assert not os.path.exists(node.host_path("/run/podshim-doc"))
        for directory in ("/run/podshim-man/man1", "/run/podshim-completions"):  # /usr/local/share's own stay
            assert os.listdir(node.host_path(directory)) == []
        assert not os.path.exists(node.host_path("/run/podshim"))  # sockets, the template's files
        assert not [name for name in os.listdir(node.host_path("/run/systemd/system")) if "podshim" in name]
        assert node.run("pgrep", "-f", "podshim", check=False).stdout == ""
        assert os.path.isdir(node.host_path("/var/lib/podshim"))  # the state stays unless asked
        assert "--purge removes them" in out

        out = node.run(f"{CHECKOUT}/.ci/uninstall", "--purge", env=env, timeout=120).stdout
        assert "uninstall: removed /var/lib/podshim\n" in out
        assert not os.path.exists(node.host_path("/var/lib/podshim"))
