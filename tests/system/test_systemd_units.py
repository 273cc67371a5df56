"""The systemd units and what they rely on, without booting a systemd (tests/system/test_systemd_nspawn.py
does that): ``systemd-analyze verify``, instance names as systemd-escape writes them, and the
unit's command line under ``systemd-socket-activate`` with a notify socket of our own standing
in for systemd's (Type=notify, NotifyAccess=main, KillMode=mixed's SIGTERM, ExecStopPost)."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import socket
import struct
import subprocess

import pytest

from shim.api.names import SANDBOX_SERVICE
from shim.api.paths import BOOTSTRAP_FILE, STATE_FILE
from shim.lib.files import read_json
from shim.lib.processes import proc_start_time
from shim.rpc import Client
from shim.rpc.status import InvalidArgument

from client.controller.spawners.systemd import SystemdSpawner, activation_socket_path, instance_name, unit_names

from support.rpctools import call_as_nobody
from support.shimtools import (
    PODSHIM,
    WAIT,
    ProcessRef,
    host_untouched,  # noqa: F401  (autouse: what this module's shims made is checked at the end)
    mounts_naming,
    new_id,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNITS = os.path.join(REPO, "systemd")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="shims make namespaces and cgroups: root only")


# -- the unit files -------------------------------------------------------------------------


def _unit_files() -> list[str]:
    return sorted(n for n in os.listdir(UNITS) if n.endswith((".service", ".socket")))


def test_the_units_are_the_six_we_ship() -> None:
    assert _unit_files() == ["podshim-sandboxer.service", "podshim-template.service", "podshim@.service",
                             "podshim@.socket", "podshimd.service", "podshimd.socket"]


#: Where .ci/install puts the docs, in the checkout's layout (PODSHIM_DOC_DIR's default).
DOC_DIR = "/usr/local/share/doc/podshim"


@pytest.mark.parametrize("unit", _unit_files())
def test_every_unit_names_documentation_that_the_install_puts_where_it_says(unit) -> None:
    with open(os.path.join(UNITS, unit)) as f:
        urls = [url for line in f if line.startswith("Documentation=") for url in line.split("=", 1)[1].split()]
    assert urls, f"{unit} has no Documentation="
    with open(os.path.join(REPO, ".ci", "install-units")) as f:
        install = f.read()
    assert ". .ci/install-paths" in install and " docs/*.md; do" in install
    # The install's paths, as a machine-wide install (no PODSHIM_* named) reads them.
    env = {key: value for key, value in os.environ.items() if not key.startswith("PODSHIM_")}
    docs = subprocess.run(["sh", "-c", ". .ci/install-paths && echo \"$DOCS\""], cwd=REPO, env=env,
                          capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    assert docs == DOC_DIR
    for url in urls:
        assert url.startswith(f"file://{DOC_DIR}/docs/"), url
        page = url.removeprefix(f"file://{DOC_DIR}/")
        assert os.path.isfile(os.path.join(REPO, page)), f"{unit} names {url}, but the checkout has no {page}"


# A ':' in a name given to verify would be read as FILE:ALIAS, so the instances spell it \x3a.
@pytest.mark.parametrize("unit", _unit_files() + ["podshim@ns1\\x3asb1.service", "podshim@ns1\\x3asb1.socket",
                                                  "podshim@k8s.io\\x3aweb\\x2d1.service"])
def test_systemd_analyze_verify_passes_with_empty_stderr(unit) -> None:
    # Warnings (an unknown key, a bad value) keep exit status 0: only an empty stderr is a pass.
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", unit], cwd=UNITS, capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, "")


def _directives(unit: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    with open(os.path.join(UNITS, unit)) as f:
        for line in f:
            if "=" in line and not line.startswith("#"):
                key, value = line.rstrip("\n").split("=", 1)
                found.setdefault(key, []).append(value)
    return found


def test_the_service_is_notify_never_restarted_and_shuts_the_sandbox_down_on_stop() -> None:
    d = _directives("podshim@.service")
    assert d["Type"] == ["notify"] and d["NotifyAccess"] == ["main"]
    assert d["KillMode"] == ["mixed"] and d["Restart"] == ["no"] and d["Delegate"] == ["yes"]
    # The command .ci/install links (systemd-analyze verify needs it to exist).
    assert d["ExecStart"] == ["/usr/local/bin/podshim serve --instance %I --shutdown-on-term"]
    assert d["ExecStopPost"] == ["-/usr/local/bin/podshim delete --instance %I"]
    assert _directives("podshim-template.service")["ExecStart"] == ["/usr/local/bin/podshim template"]
    # Starts stay rate-limited: a socket cannot restart a shim that keeps failing forever.
    assert "StartLimitIntervalSec" not in d and "StartLimitBurst" not in d


def test_the_service_makes_no_namespace_of_its_own() -> None:
    # A mount namespace would hide the netns bind mounts under /run/netns from the host, a UTS
    # namespace would give host-UTS pods a copy of the hostname (see the unit's comment).
    namespacing = {"ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices", "PrivateMounts", "PrivateNetwork",
                   "PrivateUsers", "PrivateIPC", "ProtectKernelModules", "ProtectKernelTunables", "ProtectKernelLogs",
                   "ProtectControlGroups", "ProtectHostname", "ProtectProc", "ProcSubset", "ReadOnlyPaths",
                   "ReadWritePaths", "InaccessiblePaths", "TemporaryFileSystem", "BindPaths", "BindReadOnlyPaths",
                   "RootDirectory", "RootImage", "MountFlags", "NetworkNamespacePath", "RestrictNamespaces"}
    assert not namespacing & set(_directives("podshim@.service"))


def test_the_socket_is_0600_in_a_0700_directory_and_goes_with_its_service() -> None:
    d = _directives("podshim@.socket")
    assert d["ListenStream"] == ["/run/podshim/u/%I.sock"]
    assert (d["SocketMode"], d["DirectoryMode"], d["Accept"]) == (["0600"], ["0700"], ["no"])
    assert d["PartOf"] == ["podshim@%i.service"] and d["RemoveOnStop"] == ["yes"]


def test_the_daemon_is_notify_restarted_always_and_a_restart_never_kills_the_pods() -> None:
    d = _directives("podshimd.service")
    assert d["Type"] == ["notify"] and d["NotifyAccess"] == ["main"]
    assert d["KillMode"] == ["process"] and d["Restart"] == ["always"] and d["Delegate"] == ["yes"]
    assert d["ExecStart"] == ["/usr/local/bin/podshimd"]
    assert d["Requires"] == ["podshimd.socket"] and "podshimd.socket" in d["After"][0].split()


def test_the_socket_is_the_default_listen_address_0600_in_0700_and_outlives_the_daemon() -> None:
    from client.podshimd.config import DEFAULT_LISTEN
    d = _directives("podshimd.socket")
    assert ["unix://" + path for path in d["ListenStream"]] == [DEFAULT_LISTEN]
    assert (d["SocketMode"], d["DirectoryMode"], d["Accept"], d["RemoveOnStop"]) == (["0600"], ["0700"], ["no"],
                                                                                      ["yes"])
    assert "PartOf" not in d  # a stopped daemon is started again by the next client


# -- instance names --------------------------------------------------------------------------


@pytest.mark.parametrize("namespace,sandbox_id", [("ns1", "sb1"), ("k8s.io", "web-1"), ("a_b", "c.d-e_f"),
                                                  ("n" * 76, "-".join("s" * 21))])
def test_unit_names_are_what_systemd_escape_makes(namespace, sandbox_id) -> None:
    escaped = subprocess.run(["systemd-escape", "--template", "podshim@.service", f"{namespace}:{sandbox_id}"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert unit_names(namespace, sandbox_id)[0] == escaped
    # %I undoes it: the shim gets NAMESPACE:SANDBOX_ID back.
    unescaped = subprocess.run(["systemd-escape", "--unescape", instance_name(namespace, sandbox_id)],
                               capture_output=True, text=True, check=True).stdout.strip()
    assert unescaped == f"{namespace}:{sandbox_id}"


def test_a_unit_name_systemd_cannot_hold_is_refused() -> None:
    namespace, sandbox_id = "n-" * 37 + "n", "s-" * 37 + "s"
    with pytest.raises(InvalidArgument, match="systemd allows 255"):
        unit_names(namespace, sandbox_id)
    assert subprocess.run(["systemd-escape", "--template", "podshim@.service", f"{namespace}:{sandbox_id}"],
                          capture_output=True).returncode != 0


def test_the_activation_socket_is_used_only_when_its_path_fits_sun_path():
    assert activation_socket_path("ns1", "sb1") == "/run/podshim/u/ns1:sb1.sock"
    assert len(activation_socket_path("n" * 43, "s" * 43)) == 107
    assert activation_socket_path("n" * 43, "s" * 44) is None


def test_serve_refuses_an_instance_whose_dash_systemd_turned_into_a_slash(tmp_path) -> None:
    done = subprocess.run([*PODSHIM, "serve", "--instance", "k8s.io:web/1", "--state-root", str(tmp_path)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "\\x2d" in done.stderr and "systemd-escape --template podshim@.service" in done.stderr
    assert os.listdir(tmp_path) == []


async def test_the_spawner_refuses_a_bundle_the_unit_would_not_find(tmp_path) -> None:
    spawner = SystemdSpawner(str(tmp_path / "state"), systemctl=["false"], env_file=str(tmp_path / "env"))
    with pytest.raises(InvalidArgument, match="where podshim@.service looks for it"):
        await spawner.spawn("ns1", "sb1", str(tmp_path / "elsewhere" / "ns1" / "sb1"))
    assert not os.path.exists(tmp_path / "env")


def test_the_spawner_refuses_an_environment_systemd_would_misread(tmp_path) -> None:
    with pytest.raises(ValueError, match="newline"):
        SystemdSpawner(env={"PODSHIM_PAUSE_BINARY": "/bin/x\nPATH=/evil"})
    with pytest.raises(ValueError, match="not valid"):
        SystemdSpawner(env={"1X": "y"})


# -- the unit's command line under systemd-socket-activate ---------------------------------------


class NotifySocket:
    """systemd's NOTIFY_SOCKET, played by us: a datagram socket with SO_PASSCRED, so each
    message comes with its sender's pid (what NotifyAccess=main checks)."""

    def __init__(self, path: str):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind(path)
        self.sock.settimeout(WAIT)

    def _receive(self) -> tuple[int, dict[str, str]]:
        data, ancillary, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(struct.calcsize("3i")))
        pid = next(struct.unpack("3i", cdata)[0] for level, kind, cdata in ancillary
                   if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS)
        return pid, dict(line.split("=", 1) for line in data.decode().splitlines())

    async def next(self) -> tuple[int, dict[str, str]]:
        """The next message: (sender pid, its KEY=VALUE fields)."""
        return await asyncio.to_thread(self._receive)

    def pending(self) -> bool:
        """Whether a message is waiting (it stays there)."""
        self.sock.setblocking(False)
        try:
            self.sock.recv(4096, socket.MSG_PEEK)
            return True
        except BlockingIOError:
            return False
        finally:
            self.sock.settimeout(WAIT)

    def close(self) -> None:
        self.sock.close()


class ActivatedShim:
    """``podshim serve --instance NS:ID --shutdown-on-term`` (the unit's ExecStart) behind
    ``systemd-socket-activate``, which execs it on the first connection."""

    def __init__(self, base: str, namespace: str, sandbox_id: str):
        self.namespace, self.sandbox_id = namespace, sandbox_id
        self.state_root, self.runtime_root = os.path.join(base, "state"), os.path.join(base, "run")
        self.bundle = os.path.join(self.state_root, namespace, sandbox_id)
        self.socket_path = os.path.join(base, "u", f"{namespace}:{sandbox_id}.sock")
        os.makedirs(os.path.dirname(self.socket_path), 0o700)
        self.notify = NotifySocket(os.path.join(base, "notify"))
        # The child's environment is scrubbed but for what -E names: as systemd, we pass
        # NOTIFY_SOCKET and the roots the unit's EnvironmentFile= would.
        argv = ["systemd-socket-activate", "--listen", self.socket_path, "-E", f"NOTIFY_SOCKET={self.notify.path}",
                "-E", f"PODSHIM_STATE_ROOT={self.state_root}", "-E", f"PODSHIM_RUNTIME_ROOT={self.runtime_root}",
                "-E", f"PYTHONPATH={REPO}", *PODSHIM, "serve", "--instance", f"{namespace}:{sandbox_id}",
                "--shutdown-on-term"]
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)
        self.address = "unix://" + self.socket_path

    async def listening(self) -> None:
        assert self.process.stderr is not None  # (PIPE)
        line = await asyncio.to_thread(self.process.stderr.readline)
        assert line.startswith(f"Listening on {self.socket_path}"), line

    async def call(self, client: Client, method: str, **fields):
        return await client.call(SANDBOX_SERVICE, method, {"sandbox_id": self.sandbox_id, **fields}, timeout=WAIT)

    async def run_sandbox(self, client: Client) -> tuple[ProcessRef, dict[str, str]]:
        """After READY=1: CreateSandbox, StartSandbox; the pause and the verbose status info."""
        assert (await self.notify.next())[1]["READY"] == "1"
        await self.call(client, "CreateSandbox")
        pause = ProcessRef((await self.call(client, "StartSandbox"))["pid"])
        return pause, (await self.call(client, "SandboxStatus", verbose=True))["info"]

    def delete(self) -> subprocess.CompletedProcess:
        """The unit's ExecStopPost, as systemd would run it."""
        return subprocess.run([*PODSHIM, "delete", "--instance", f"{self.namespace}:{self.sandbox_id}"],
                              capture_output=True, text=True, timeout=30,
                              env={**os.environ, "PODSHIM_STATE_ROOT": self.state_root,
                                   "PODSHIM_RUNTIME_ROOT": self.runtime_root})

    async def aclose(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(self.process.wait, WAIT * 3)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stderr is not None:
            self.process.stderr.close()
        self.notify.close()
        # systemd's socket, not the shim's: the shim never removes it, so we do (as systemd's
        # RemoveOnStop= would).
        if os.path.lexists(self.socket_path):
            os.unlink(self.socket_path)


@pytest.fixture
async def activated(shims):
    made: list[ActivatedShim] = []

    async def start() -> ActivatedShim:
        shim = ActivatedShim(os.path.dirname(shims.directories()[0]), "ns1", new_id())
        made.append(shim)
        await shim.listening()
        # The launcher ends it if we could not, and records what it made for host_untouched.
        shims.adopt(shim.namespace, shim.sandbox_id, shim.bundle, shim.runtime_root,
                    {"address": shim.address, "pid": shim.process.pid})
        return shim

    yield start
    for shim in made:
        await shim.aclose()


def _netns_gone(path: str) -> bool:
    return not os.path.lexists(path) and not mounts_naming(os.path.basename(path))


async def test_the_shim_runs_on_the_first_connection_and_is_ready_only_once_it_serves(activated) -> None:
    shim = await activated()
    # Nothing runs before someone connects: no bundle, no notification.
    assert not os.path.exists(shim.bundle) and not shim.notify.pending()
    async with await Client.connect(shim.address, namespace=shim.namespace) as client:
        pid, ready = await shim.notify.next()
        # The first message is READY=1, from the main process (NotifyAccess=main), once the
        # server accepts: the bootstrap is written and our queued connection is answered.
        assert ready["READY"] == "1" and pid == int(ready["MAINPID"]) == shim.process.pid
        assert read_json(os.path.join(shim.bundle, BOOTSTRAP_FILE)) == {
            "version": 3, "address": shim.address, "protocol": "ttrpc+msgpack", "pid": shim.process.pid,
            "start_time": proc_start_time(shim.process.pid)}
        assert await shim.call(client, "PingSandbox") == {}
        # It serves systemd's socket and made none of its own.
        assert not os.path.exists(os.path.join(shim.runtime_root, "s"))


async def test_state_changes_are_reported_and_sigterm_shuts_the_sandbox_down(activated) -> None:
    shim = await activated()
    async with await Client.connect(shim.address, namespace=shim.namespace) as client:
        pause, info = await shim.run_sandbox(client)
        for state in ("created", "running"):
            assert (await shim.notify.next())[1] == {"STATUS": f"sandbox {shim.sandbox_id} {state}"}
        # systemctl stop, KillMode=mixed: SIGTERM to the main process only.
        shim.process.send_signal(signal.SIGTERM)
        pid, stopping = await shim.notify.next()
        assert pid == shim.process.pid and stopping == {"STOPPING": "1", "STATUS": "stopping (SIGTERM)"}
        statuses = [(await shim.notify.next())[1]["STATUS"] for _ in range(2)]
        assert statuses == [f"sandbox {shim.sandbox_id} stopped", f"sandbox {shim.sandbox_id} shutdown"]
        assert await asyncio.to_thread(shim.process.wait, WAIT * 3) == 0
    try:
        await pause.exited()
    finally:
        pause.close()
    assert _netns_gone(info["netns_path"])
    assert not any(os.path.isdir(info[k]) for k in info if k.startswith("cgroup."))
    assert read_json(os.path.join(shim.bundle, STATE_FILE))["state"] == "shutdown"
    # The socket is systemd's: the shim leaves it for systemd to remove (RemoveOnStop=).
    assert os.path.exists(shim.socket_path)


async def test_the_inherited_socket_refuses_another_uid(activated, tmp_path) -> None:
    shim = await activated()
    async with await Client.connect(shim.address, namespace=shim.namespace) as client:
        assert await shim.call(client, "PingSandbox") == {}
    # A second name for systemd's socket that any uid may connect to: only the shim's own
    # SO_PEERCRED check stands between uid nobody and the sandbox now.
    world = f"/tmp/psh-world-{secrets.token_hex(4)}"
    os.mkdir(world, 0o755)
    try:
        os.link(shim.socket_path, os.path.join(world, "s"))
        os.chmod(os.path.join(world, "s"), 0o777)
        pid = os.fork()
        if pid == 0:  # the child never returns into pytest
            code = 3
            try:
                code = call_as_nobody(os.path.join(world, "s"))
            finally:
                os._exit(code)
        _, status = await asyncio.to_thread(os.waitpid, pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0  # closed without an answer
    finally:
        for name in os.listdir(world):
            os.unlink(os.path.join(world, name))
        os.rmdir(world)


async def test_the_units_exec_stop_post_cleans_up_after_a_shim_that_was_killed(activated) -> None:
    shim = await activated()
    async with await Client.connect(shim.address, namespace=shim.namespace) as client:
        pause, info = await shim.run_sandbox(client)
        shim.process.kill()
        await asyncio.to_thread(shim.process.wait)
    try:
        assert not pause.has_exited() and os.path.exists(info["netns_path"])
        done = await asyncio.to_thread(shim.delete)
        assert done.returncode == 0, done.stderr
        assert pause.has_exited()
    finally:
        pause.kill()
        pause.close()
    assert _netns_gone(info["netns_path"])
    assert read_json(os.path.join(shim.bundle, STATE_FILE))["state"] == "deleted"
