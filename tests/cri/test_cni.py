"""client.cri.cni: the CNI plugin chain, with fake plugins and with the real ones from /usr/lib/cni.

Real plugins run only under ``plugin_netns``: each test makes a throw-away "outer" netns for the
bridge and pod netns for the pods, so the host's interfaces, routes and firewall are never
touched and traffic goes only between namespaces the test made. Every netns, file and process
a test makes is removed in a fixture's ``finally``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator

import anyio
import pytest

from shim.rpc.status import DeadlineExceeded, FailedPrecondition, Internal, InvalidArgument, Unavailable

from client.cri.cni import PLUGIN_PATH, PLUGIN_TIMEOUT, CniConfig, CniInterface, CniIp, CniResult, CniRunner, primary_ip

from support.proctools import wait_gone_async

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "cni", "10-podshim-bridge.conflist")
REAL_BIN = "/usr/lib/cni"
PROCESS_GONE_WAIT = 5.0

needs_real_plugins = pytest.mark.skipif(
    os.geteuid() != 0 or not all(os.access(os.path.join(REAL_BIN, p), os.X_OK) for p in ("bridge", "host-local", "loopback"))
    or shutil.which("ping") is None,
    reason="needs root, containernetworking-plugins and iputils-ping",
)


# -- helpers ---------------------------------------------------------------------------------

def write_conf(conf_dir, doc, name: str = "10-test.conflist") -> None:
    conf_dir.mkdir(exist_ok=True)
    (conf_dir / name).write_text(json.dumps(doc))


def conflist(*types: str, version: str = "1.0.0", **extra) -> dict:
    return {"cniVersion": version, "name": "testnet", "plugins": [{"type": t} for t in types], **extra}


FAKE_PLUGIN = """#!/bin/sh
# A fake CNI plugin: records the call and its stdin, then behaves as its body says.
name=$(basename "$0")
cat > "{log}/$CNI_COMMAND.$name.stdin"
echo "$CNI_COMMAND $name $CNI_IFNAME" >> "{log}/calls"
env > "{log}/$CNI_COMMAND.$name.env"
{body}
"""

OK = """[ "$CNI_COMMAND" = ADD ] && printf '{"cniVersion": "1.0.0", "ips": [{"address": "10.1.0.5/24"}], "by": "%s"}' "$name"
exit 0"""


def fail_with(code: int, msg: str) -> str:
    return f"""if [ "$CNI_COMMAND" = ADD ]; then printf '{{"code": {code}, "msg": "{msg}", "details": "more"}}'; exit 1; fi"""


class FakePlugins:
    """A bin dir of fake plugins (a loopback included) and the log of their calls."""

    def __init__(self, root):
        self.bin = root / "bin"
        self.log = root / "log"
        self.bin.mkdir()
        self.log.mkdir()
        self.add("loopback")

    def add(self, name: str, body: str = OK) -> None:
        path = self.bin / name
        path.write_text(FAKE_PLUGIN.format(log=self.log, body=body))
        path.chmod(0o755)

    def calls(self) -> list[str]:
        path = self.log / "calls"
        return path.read_text().splitlines() if path.exists() else []

    def stdin(self, command: str, name: str) -> dict:
        return json.loads((self.log / f"{command}.{name}.stdin").read_text())

    def env(self, command: str, name: str) -> dict[str, str]:
        lines = (self.log / f"{command}.{name}.env").read_text().splitlines()
        return dict(line.split("=", 1) for line in lines if "=" in line)


@pytest.fixture
def fake(tmp_path) -> FakePlugins:
    return FakePlugins(tmp_path)


def the_chain(calls: list[str]) -> list[str]:
    """The calls of the configured chain, in their order (loopback's run beside them)."""
    return [call for call in calls if not call.endswith(" loopback lo")]


def fake_runner(tmp_path, fake: FakePlugins, *types: str, timeout: float = 10.0, **extra) -> CniRunner:
    write_conf(tmp_path / "conf", conflist(*types, **extra))
    return CniRunner(str(tmp_path / "conf"), [str(fake.bin)], timeout=timeout)


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=10)


@pytest.fixture
def netns_factory() -> Iterator:
    """``make()`` -> (name, path) of a new netns ``podshim-t-<hex>``; all are deleted afterwards."""
    made: list[str] = []

    def make() -> tuple[str, str]:
        name = f"podshim-t-{secrets.token_hex(6)}"
        run("ip", "netns", "add", name)
        made.append(name)
        return name, f"/run/netns/{name}"

    try:
        yield make
    finally:
        for name in made:
            run("ip", "netns", "del", name, check=False)


class Network:
    """A bridge network in a throw-away outer netns, with its IPAM state in a tmp dir."""

    def __init__(self, tmp_path, netns_factory):
        self.outer, outer_path = netns_factory()
        self.bridge = f"psbr{secrets.token_hex(4)}"
        self.ipam_dir = tmp_path / "ipam"
        with open(EXAMPLE) as f:
            doc = json.load(f)
        doc["plugins"][0]["bridge"] = self.bridge
        doc["plugins"][0]["ipam"]["dataDir"] = str(self.ipam_dir)
        self.name = doc["name"]
        write_conf(tmp_path / "conf", doc)
        self.runner = CniRunner(str(tmp_path / "conf"), [REAL_BIN], timeout=PLUGIN_TIMEOUT, plugin_netns=outer_path)
        self._netns_factory = netns_factory

    def pod(self) -> tuple[str, str]:
        return self._netns_factory()

    def leases(self) -> list[str]:
        directory = self.ipam_dir / self.name
        return sorted(n for n in os.listdir(directory) if n[0].isdigit()) if directory.exists() else []

    def veths(self) -> list[str]:
        out = run("ip", "-n", self.outer, "-o", "link", "show", "type", "veth").stdout
        return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]


@pytest.fixture
def network(tmp_path, netns_factory) -> Network:
    return Network(tmp_path, netns_factory)


# -- configuration ---------------------------------------------------------------------------

def test_no_config_dir_is_none(tmp_path) -> None:
    assert CniConfig.load(str(tmp_path / "absent")) is None
    assert CniConfig.load(str(tmp_path)) is None


def test_first_file_by_name_wins(tmp_path) -> None:
    write_conf(tmp_path, conflist("b"), "20-b.conflist")
    write_conf(tmp_path, conflist("a") | {"name": "first"}, "10-a.json")
    write_conf(tmp_path, conflist("c"), "05-c.txt")
    config = CniConfig.load(str(tmp_path))
    assert config is not None and config.name == "first" and config.source == str(tmp_path / "10-a.json")


def test_single_plugin_conf_is_wrapped_into_a_list(tmp_path) -> None:
    write_conf(tmp_path, {"cniVersion": "0.4.0", "name": "single", "type": "bridge", "bridge": "x"}, "10-one.conf")
    config = CniConfig.load(str(tmp_path))
    assert config is not None
    assert (config.name, config.cni_version, len(config.plugins)) == ("single", "0.4.0", 1)
    assert config.plugins[0]["bridge"] == "x"


@pytest.mark.parametrize("text, message", [
    ("{broken", "is not valid JSON"),
    ("[" * 100_000, "is not valid JSON: it is nested more than"),
    (b'{"name": "\xff"}', "is not UTF-8 text"),
    ('{"cniVersion": "1.0.0", "plugins": [{"type": "bridge"}]}', "name must be a non-empty string"),
    ('{"cniVersion": "1.0.0", "name": "n", "plugins": []}', "plugins must be a non-empty array"),
    ('{"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "../bin/sh"}]}', "plugins[0].type must be a plugin name"),
    ('{"cniVersion": "one", "name": "n", "plugins": [{"type": "bridge"}]}', "is not a version"),
])
def test_bad_config_is_invalid_argument_naming_the_file(tmp_path, text, message) -> None:
    (tmp_path / "10-bad.conflist").write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(InvalidArgument) as info:
        CniConfig.load(str(tmp_path))
    assert "10-bad.conflist" in info.value.message and message in info.value.message


def test_example_conflist_is_bridge_and_host_local_without_portmap() -> None:
    with open(EXAMPLE) as f:
        config = CniConfig.from_json(json.load(f), source=EXAMPLE)
    assert [p["type"] for p in config.plugins] == ["bridge"]
    bridge = config.plugins[0]
    assert bridge["isGateway"] is True and bridge["ipMasq"] is False
    assert bridge["ipam"]["type"] == "host-local" and bridge["ipam"]["ranges"] == [[{"subnet": "10.88.0.0/16"}]]


# -- results ---------------------------------------------------------------------------------

def result(*ips: tuple[str, int | None], interfaces: tuple[str, ...] = ("br0", "veth0", "eth0")) -> CniResult:
    return CniResult(ips=tuple(CniIp(address=a, interface=i) for a, i in ips),
                     interfaces=tuple(CniInterface(name=n) for n in interfaces))


def test_primary_ip_is_the_first_ipv4_of_the_pod_interface() -> None:
    assert primary_ip(result(("fd00::2/64", 2), ("10.88.0.2/16", 2), ("10.99.0.1/16", 1))) == (
        "10.88.0.2", ("fd00::2",))


def test_primary_ip_falls_back_to_all_ips_then_the_first_one() -> None:
    assert primary_ip(result(("fd00::2/64", None), ("fd00::3/64", None))) == ("fd00::2", ("fd00::3",))
    assert primary_ip(result(("10.1.0.2/24", 0))) == ("10.1.0.2", ())  # on br0, not eth0
    assert primary_ip(CniResult()) == ("", ())


def test_primary_ip_uses_the_given_ifname() -> None:
    assert primary_ip(result(("10.1.0.2/24", 2), ("10.2.0.2/24", 1), interfaces=("a", "net1", "eth0")),
                      "net1") == ("10.2.0.2", ())


def test_result_parses_plugin_json() -> None:
    parsed = CniResult.from_json({"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": "/p"}],
                                  "ips": [{"address": "10.0.0.2/8", "gateway": "10.0.0.1", "interface": 0}],
                                  "routes": [{"dst": "0.0.0.0/0"}]})
    assert parsed.ips[0].ip == "10.0.0.2" and parsed.interfaces[0].sandbox == "/p" and parsed.routes[0].dst == "0.0.0.0/0"
    with pytest.raises(InvalidArgument):
        CniResult.from_json({"ips": [{"address": "not-an-ip"}]})


# -- the runner, with fake plugins ------------------------------------------------------------

async def test_plugins_get_a_clean_env_and_their_config_chained(tmp_path, fake) -> None:
    fake.add("first")
    fake.add("second")
    runner = fake_runner(tmp_path, fake, "first", "second")
    got = await runner.add("pod1", "/run/netns/fake", args={"K8S_POD_NAME": "web"})
    assert got.raw is not None and got.raw["by"] == "second"
    env = fake.env("ADD", "first")
    assert set(env) - {"PWD", "SHLVL", "_"} == {"PATH", "CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME",
                                                "CNI_PATH", "CNI_ARGS"}
    assert env["PATH"] == PLUGIN_PATH and env["CNI_PATH"] == str(fake.bin) and env["CNI_NETNS"] == "/run/netns/fake"
    assert env["CNI_ARGS"] == "IgnoreUnknown=1;K8S_POD_NAME=web"
    first, second = fake.stdin("ADD", "first"), fake.stdin("ADD", "second")
    assert (first["name"], first["cniVersion"], first["type"]) == ("testnet", "1.0.0", "first")
    assert "prevResult" not in first and second["prevResult"]["by"] == "first"
    # Loopback runs beside the chain; the chain runs in order.
    assert sorted(fake.calls()) == ["ADD first eth0", "ADD loopback lo", "ADD second eth0"]
    assert the_chain(fake.calls()) == ["ADD first eth0", "ADD second eth0"]


async def test_port_mappings_go_only_to_plugins_that_declare_the_capability(tmp_path, fake) -> None:
    fake.add("first")
    fake.add("portmap")
    write_conf(tmp_path / "conf", {"cniVersion": "1.0.0", "name": "testnet", "plugins": [
        {"type": "first"}, {"type": "portmap", "capabilities": {"portMappings": True}}]})
    runner = CniRunner(str(tmp_path / "conf"), (str(fake.bin),))
    mappings = {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": ""}]}
    added = await runner.add("pod1", "/run/netns/fake", runtime_config=mappings)
    assert fake.stdin("ADD", "portmap")["runtimeConfig"] == mappings
    assert "runtimeConfig" not in fake.stdin("ADD", "first")
    await runner.delete("pod1", "/run/netns/fake", "eth0", added, runtime_config=mappings)
    assert fake.stdin("DEL", "portmap")["runtimeConfig"] == mappings


def test_a_pods_port_mappings_with_a_host_port_are_cnis_port_mappings() -> None:
    from shim.cri.configs import PodSandboxConfig
    cfg = PodSandboxConfig.from_json({"metadata": {"name": "p", "namespace": "n", "uid": "u"}, "port_mappings": [
        {"container_port": 80, "host_port": 8080}, {"container_port": 53, "protocol": "UDP", "host_port": 53,
                                                    "host_ip": "127.0.0.1"}, {"container_port": 9090}]})
    assert cfg.cni_runtime_config() == {"portMappings": [
        {"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": ""},
        {"hostPort": 53, "containerPort": 53, "protocol": "udp", "hostIP": "127.0.0.1"}]}
    assert PodSandboxConfig.from_json({"metadata": {"name": "p", "namespace": "n", "uid": "u"}}).cni_runtime_config() == {}


async def test_delete_runs_plugins_in_reverse_with_the_add_result(tmp_path, fake) -> None:
    fake.add("first")
    fake.add("second")
    runner = fake_runner(tmp_path, fake, "first", "second")
    added = await runner.add("pod1", "/run/netns/fake")
    await runner.delete("pod1", "/run/netns/fake", "eth0", added)
    assert sorted(fake.calls()[3:]) == ["DEL first eth0", "DEL loopback lo", "DEL second eth0"]
    assert the_chain(fake.calls()[3:]) == ["DEL second eth0", "DEL first eth0"]
    assert fake.stdin("DEL", "first")["prevResult"] == added.raw
    assert "prevResult" not in fake.stdin("DEL", "loopback")


async def test_failed_add_deletes_what_it_added_and_raises_the_plugins_error(tmp_path, fake) -> None:
    fake.add("first")
    fake.add("broken", fail_with(7, "bad config"))
    fake.add("never")
    runner = fake_runner(tmp_path, fake, "first", "broken", "never")
    with pytest.raises(Internal) as info:
        await runner.add("pod1", "/run/netns/fake")
    assert "'broken' ADD failed with code 7: bad config" in info.value.message
    assert info.value.details == [{"plugin": "broken", "command": "ADD", "code": 7, "msg": "bad config",
                                   "details": "more"}]
    assert the_chain(fake.calls()) == ["ADD first eth0", "ADD broken eth0", "DEL broken eth0", "DEL first eth0"]
    assert fake.calls().count("DEL loopback lo") == 1 and fake.calls().index("DEL loopback lo") > 2


async def test_try_again_later_code_is_unavailable(tmp_path, fake) -> None:
    fake.add("busy", fail_with(11, "try later"))
    with pytest.raises(Unavailable, match="code 11: try later"):
        await fake_runner(tmp_path, fake, "busy").add("pod1", "/run/netns/fake")


async def test_plugin_failing_without_an_error_document_reports_its_stderr(tmp_path, fake) -> None:
    fake.add("crashy", 'echo "panic: runtime error" >&2; exit 2')
    with pytest.raises(Internal, match="'crashy' ADD failed with exit status 2: panic: runtime error"):
        await fake_runner(tmp_path, fake, "crashy").add("pod1", "/run/netns/fake")


async def test_add_result_that_is_not_json_is_internal(tmp_path, fake) -> None:
    fake.add("chatty", "echo hello; exit 0")
    with pytest.raises(Internal, match="not a CNI result"):
        await fake_runner(tmp_path, fake, "chatty").add("pod1", "/run/netns/fake")


async def test_missing_plugin_is_failed_precondition_naming_it_and_the_dirs(tmp_path, fake) -> None:
    runner = fake_runner(tmp_path, fake, "no-such-plugin")
    with pytest.raises(FailedPrecondition, match=f"CNI plugin 'no-such-plugin' not found in {fake.bin}"):
        await runner.add("pod1", "/run/netns/fake")
    # Loopback, which ran beside it (or was stopped by the failure), is undone.
    assert fake.calls()[-1:] == ["DEL loopback lo"] and set(fake.calls()) <= {"ADD loopback lo", "DEL loopback lo"}


# The shell and its child: killing only the shell would leave the sleep behind.
SLEEP_ON_ADD = """[ "$CNI_COMMAND" = ADD ] || exit 0; sleep 60 & echo "$$ $!" > "{log}/pids"; wait"""


async def test_timeout_is_deadline_exceeded_and_kills_the_plugin_and_its_children(tmp_path, fake) -> None:
    fake.add("sleepy", SLEEP_ON_ADD.format(log=fake.log))
    runner = fake_runner(tmp_path, fake, "sleepy", timeout=0.5)
    try:
        with pytest.raises(DeadlineExceeded, match="'sleepy' ADD for pod1 did not finish within 0.5 s"):
            await runner.add("pod1", "/run/netns/fake")
    finally:
        pids = [int(p) for p in (fake.log / "pids").read_text().split()]
        assert await wait_gone_async(*pids, timeout=PROCESS_GONE_WAIT, kill=True) == []


async def test_timeout_kills_what_the_plugin_left_holding_its_output(tmp_path, fake) -> None:
    # The plugin itself exits; its child keeps stdout open, so the call cannot finish.
    fake.add("leaky", f"""[ "$CNI_COMMAND" = ADD ] || exit 0; sleep 60 & echo "$!" > "{fake.log}/pids"; exit 0""")
    with pytest.raises(DeadlineExceeded):
        await fake_runner(tmp_path, fake, "leaky", timeout=0.5).add("pod1", "/run/netns/fake")
    assert await wait_gone_async(int((fake.log / "pids").read_text()), timeout=PROCESS_GONE_WAIT, kill=True) == []


async def test_cancelled_add_kills_the_plugin_and_still_rolls_back(tmp_path, fake) -> None:
    fake.add("sleepy", SLEEP_ON_ADD.format(log=fake.log))
    runner = fake_runner(tmp_path, fake, "sleepy")
    with anyio.move_on_after(0.5) as scope:
        await runner.add("pod1", "/run/netns/fake")
    assert scope.cancelled_caught
    pids = [int(p) for p in (fake.log / "pids").read_text().split()]
    assert await wait_gone_async(*pids, timeout=PROCESS_GONE_WAIT, kill=True) == []
    assert fake.calls()[-2:] == ["DEL sleepy eth0", "DEL loopback lo"]


async def test_without_config_only_loopback_runs(tmp_path, fake) -> None:
    runner = CniRunner(str(tmp_path / "absent"), [str(fake.bin)])
    assert await runner.add("pod1", "/run/netns/fake") == CniResult()
    await runner.delete("pod1", "/run/netns/fake")
    assert fake.calls() == ["ADD loopback lo", "DEL loopback lo"]


async def test_a_runner_without_loopback_runs_the_chain_alone(tmp_path, fake) -> None:
    fake.add("first")
    write_conf(tmp_path / "conf", conflist("first"))
    runner = CniRunner(str(tmp_path / "conf"), [str(fake.bin)], loopback=False)
    added = await runner.add("pod1", "/run/netns/fake")
    await runner.check("pod1", "/run/netns/fake", "eth0", added)
    await runner.delete("pod1", "/run/netns/fake", "eth0", added)
    assert fake.calls() == ["ADD first eth0", "CHECK first eth0", "DEL first eth0"]
    bare = CniRunner(str(tmp_path / "absent"), [str(fake.bin)], loopback=False)
    assert await bare.add("pod1", "/run/netns/fake") == CniResult()
    await bare.delete("pod1", "/run/netns/fake")
    assert fake.calls() == ["ADD first eth0", "CHECK first eth0", "DEL first eth0"]


async def test_delete_calls_every_plugin_even_if_one_fails(tmp_path, fake) -> None:
    fake.add("first")
    fake.add("grumpy", """[ "$CNI_COMMAND" = DEL ] && { printf '{"code": 5, "msg": "io"}'; exit 1; }; exit 0""")
    runner = fake_runner(tmp_path, fake, "first", "grumpy")
    with pytest.raises(Internal, match="'grumpy' DEL failed with code 5: io"):
        await runner.delete("pod1", "/run/netns/fake")
    assert sorted(fake.calls()) == ["DEL first eth0", "DEL grumpy eth0", "DEL loopback lo"]
    assert the_chain(fake.calls()) == ["DEL grumpy eth0", "DEL first eth0"]


async def test_check_is_skipped_when_disabled_and_refused_before_0_4_0(tmp_path, fake) -> None:
    fake.add("first")
    await fake_runner(tmp_path, fake, "first", disableCheck=True).check("pod1", "/run/netns/fake", "eth0", {})
    assert fake.calls() == ["CHECK loopback lo"]
    with pytest.raises(FailedPrecondition, match="has no CHECK"):
        await fake_runner(tmp_path, fake, "first", version="0.3.1").check("pod1", "/run/netns/fake", "eth0", {})


@pytest.mark.parametrize("container_id, ifname, netns_path", [
    ("", "eth0", "/run/netns/x"),
    ("a/b", "eth0", "/run/netns/x"),
    ("pod1", "this-name-is-too-long", "/run/netns/x"),
    ("pod1", "et/h0", "/run/netns/x"),
    ("pod1", "eth0", "relative/netns"),
])
async def test_bad_arguments_are_refused_before_any_plugin_runs(tmp_path, fake, container_id, ifname, netns_path) -> None:
    with pytest.raises(InvalidArgument):
        await fake_runner(tmp_path, fake, "first").add(container_id, netns_path, ifname)
    assert fake.calls() == []


# -- the runner, with the real plugins in throw-away namespaces --------------------------------

@needs_real_plugins
async def test_two_pods_get_distinct_ips_and_reach_each_other(network) -> None:
    (pod1, path1), (_, path2) = network.pod(), network.pod()
    ip1, _ = primary_ip(await network.runner.add("pod1", path1))
    ip2, _ = primary_ip(await network.runner.add("pod2", path2))
    assert ip1 != ip2 and ip1.startswith("10.88.") and ip2.startswith("10.88.")
    assert network.leases() == sorted([ip1, ip2])
    ping = run("ip", "netns", "exec", pod1, "ping", "-c1", "-W2", ip2, check=False)
    assert ping.returncode == 0, ping.stdout + ping.stderr


@needs_real_plugins
async def test_pod_gets_lo_and_eth0_and_the_bridge_stays_off_the_host(network) -> None:
    pod, path = network.pod()
    ip, _ = primary_ip(await network.runner.add("pod1", path))
    addrs = run("ip", "-n", pod, "-o", "addr").stdout
    assert " lo " in addrs and "127.0.0.1/8" in addrs and f"eth0    inet {ip}/16" in addrs
    assert run("ip", "-n", network.outer, "link", "show", network.bridge, check=False).returncode == 0
    assert run("ip", "link", "show", network.bridge, check=False).returncode != 0  # not in the host netns


@needs_real_plugins
async def test_check_passes_after_add(network) -> None:
    _, path = network.pod()
    added = await network.runner.add("pod1", path)
    await network.runner.check("pod1", path, "eth0", added)


@needs_real_plugins
async def test_delete_removes_the_veth_and_the_ipam_lease_and_is_idempotent(network) -> None:
    _, path = network.pod()
    added = await network.runner.add("pod1", path)
    assert len(network.veths()) == 1 and len(network.leases()) == 1
    await network.runner.delete("pod1", path, "eth0", added)
    assert network.veths() == [] and network.leases() == []
    await network.runner.delete("pod1", path, "eth0", added)


@needs_real_plugins
async def test_delete_after_the_pod_netns_is_gone_frees_the_lease(network) -> None:
    pod, path = network.pod()
    added = await network.runner.add("pod1", path)
    run("ip", "netns", "del", pod)
    await network.runner.delete("pod1", path, "eth0", added)
    # The veth goes with the netns, when the kernel's netns cleanup work runs (asynchronously).
    assert network.leases() == []


@needs_real_plugins
async def test_delete_with_a_netns_path_that_is_no_longer_a_namespace_frees_the_lease(network, tmp_path) -> None:
    _, path = network.pod()
    added = await network.runner.add("pod1", path)
    unmounted = tmp_path / "unmounted-netns"
    unmounted.touch()  # what an unmount without unlink leaves behind
    await network.runner.delete("pod1", str(unmounted), "eth0", added)
    assert network.leases() == []


@needs_real_plugins
async def test_real_plugin_error_is_typed_with_the_plugins_message(network) -> None:
    missing = f"/run/netns/podshim-t-missing-{secrets.token_hex(4)}"
    with pytest.raises(Internal) as info:
        await network.runner.add("pod1", missing)
    detail = info.value.details[0]
    # Both fail on the missing netns, at the same time: the first to fail is the one raised.
    assert detail["plugin"] in ("loopback", "bridge") and detail["code"] == 999 and missing in detail["msg"]
    assert network.leases() == []


@needs_real_plugins
async def test_without_config_the_pod_gets_loopback_up(tmp_path, netns_factory) -> None:
    (_, outer), (pod, path) = netns_factory(), netns_factory()
    runner = CniRunner(str(tmp_path / "absent"), [REAL_BIN], plugin_netns=outer)
    assert await runner.add("pod1", path) == CniResult()
    assert ",UP," in run("ip", "-n", pod, "-o", "link", "show", "lo").stdout


def test_importing_the_pod_layer_never_imports_pyroute2() -> None:
    code = ("import sys, client.cri.cni, client.cri.store, shim.cri.configs; "
            "sys.exit('pyroute2' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=30).returncode == 0
