"""Pod networking through the real bridge + host-local plugins (lo is the shim's: no loopback plugin).

The plugins run inside a throwaway "outer" network namespace this test makes (the runner's
``plugin_netns``), so the bridge, its veths and ip_forward live there and never on the
machine's own network. Only addresses inside those namespaces are contacted.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess

import pytest

from shim.launch.template import stop_template

from client.cri.pod import open_pod_service

from support.podtools import pod_config

PLUGINS = "/usr/lib/cni"

pytestmark = pytest.mark.skipif(not os.path.exists(f"{PLUGINS}/bridge"),
                                reason="containernetworking-plugins is not installed (.ci/install installs it)")


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def network(tmp_path):
    """A CNI config (bridge + host-local with a private dataDir) and the outer netns it runs in."""
    outer = f"podshim-t-{secrets.token_hex(4)}"
    data_dir = tmp_path / "ipam"
    conf_dir = tmp_path / "net.d"
    conf_dir.mkdir()
    bridge = f"psbr{secrets.token_hex(2)}"
    (conf_dir / "10-test.conflist").write_text(json.dumps({
        "cniVersion": "1.0.0", "name": "podshim-test",
        "plugins": [{"type": "bridge", "bridge": bridge, "isGateway": True, "ipMasq": False,
                     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.213.0.0/24"}]],
                              "dataDir": str(data_dir)}}]}))
    ip("netns", "add", outer)
    try:
        ip("-n", outer, "link", "set", "lo", "up")
        yield {"conf_dir": str(conf_dir), "outer": outer, "outer_path": f"/var/run/netns/{outer}",
               "data_dir": data_dir, "bridge": bridge}
    finally:
        subprocess.run(["ip", "netns", "del", outer], capture_output=True)


@pytest.fixture
def roots(tmp_path):
    runtime_root = f"/tmp/podshim-net-{secrets.token_hex(4)}"
    yield str(tmp_path / "root"), runtime_root
    stop_template(runtime_root)  # the Controller's default template, if one started
    shutil.rmtree(runtime_root, ignore_errors=True)


async def test_two_pods_get_distinct_ips_reach_each_other_and_leave_nothing(roots, network) -> None:
    root, runtime_root = roots
    async with open_pod_service(root, runtime_root, cni_conf_dir=network["conf_dir"], cni_bin_dirs=(PLUGINS,),
                                cni_plugin_netns=network["outer_path"]) as pods:
        a = await pods.run_pod_sandbox(pod_config())
        b = await pods.run_pod_sandbox(pod_config())
        try:
            sa = await pods.pod_sandbox_status(a, verbose=True)
            sb = await pods.pod_sandbox_status(b, verbose=True)
            ip_a, ip_b = sa["network"]["ip"], sb["network"]["ip"]
            assert ip_a and ip_b and ip_a != ip_b
            assert ip_a.startswith("10.213.0.") and ip_b.startswith("10.213.0.")
            assert sa["info"]["cni_check"] == "ok"
            # Traffic only between the two pods' own namespaces.
            ping = subprocess.run(["nsenter", f"--net={sa['info']['netns_path']}", "ping", "-c", "1", "-W", "2", ip_b],
                                  capture_output=True, text=True)
            assert ping.returncode == 0, ping.stdout + ping.stderr
            veths = [line for line in ip("-n", network["outer"], "-o", "link").splitlines() if "veth" in line]
            assert len(veths) == 2
            leases = {p.name for p in (network["data_dir"] / "podshim-test").iterdir()}
            assert {ip_a, ip_b} <= leases
            netns_paths = [sa["info"]["netns_path"], sb["info"]["netns_path"]]
        finally:
            await pods.stop_pod_sandbox(a)
            await pods.remove_pod_sandbox(a)
            await pods.stop_pod_sandbox(b)
            await pods.remove_pod_sandbox(b)
    assert [line for line in ip("-n", network["outer"], "-o", "link").splitlines() if "veth" in line] == []
    leases = {p.name for p in (network["data_dir"] / "podshim-test").iterdir()}
    assert not leases & {ip_a, ip_b}, f"IPAM still holds {leases}"
    assert [p for p in netns_paths if os.path.exists(p)] == []


def net_dev(netns_path: str, interface: str) -> tuple[int, int]:
    """The received and sent bytes of ``interface`` in the namespace at ``netns_path``."""
    line = next(line for line in subprocess.run(["nsenter", f"--net={netns_path}", "cat", "/proc/net/dev"],
                                                check=True, capture_output=True, text=True).stdout.splitlines()
                if line.strip().startswith(f"{interface}:"))
    fields = line.split(":", 1)[1].split()
    return int(fields[0]), int(fields[8])


async def test_a_pods_stats_carry_its_interfaces_counters_eth0_the_default(roots, network) -> None:
    root, runtime_root = roots
    async with open_pod_service(root, runtime_root, cni_conf_dir=network["conf_dir"], cni_bin_dirs=(PLUGINS,),
                                cni_plugin_netns=network["outer_path"]) as pods:
        pod = await pods.run_pod_sandbox(pod_config())
        try:
            netns_path = (await pods.pod_sandbox_status(pod, verbose=True))["info"]["netns_path"]
            gateway = "10.213.0.1"  # the bridge's address (host-local's default gateway)
            ping = subprocess.run(["nsenter", f"--net={netns_path}", "ping", "-c", "3", "-i", "0.2", "-W", "2",
                                   gateway], capture_output=True, text=True)
            assert ping.returncode == 0, ping.stdout + ping.stderr
            before = net_dev(netns_path, "eth0")
            network_usage = (await pods.pod_stats(pod))["linux"]["network"]
            after = net_dev(netns_path, "eth0")
        finally:
            await pods.stop_pod_sandbox(pod)
            await pods.remove_pod_sandbox(pod)
    default = network_usage["default_interface"]
    assert default["name"] == "eth0" and [i["name"] for i in network_usage["interfaces"]] == ["eth0"]
    assert before[0] <= default["rx_bytes"]["value"] <= after[0] and default["rx_bytes"]["value"] > 0
    assert before[1] <= default["tx_bytes"]["value"] <= after[1] and default["tx_bytes"]["value"] >= 3 * 84
    assert default["rx_errors"] == {"value": 0} and network_usage["timestamp"] > 0


async def test_a_pods_lo_is_up_without_the_loopback_plugin(roots, network, tmp_path) -> None:
    root, runtime_root = roots
    bin_dir = tmp_path / "bin"  # bridge and host-local only: a loopback plugin run would fail the pod
    bin_dir.mkdir()
    for plugin in ("bridge", "host-local"):
        (bin_dir / plugin).symlink_to(f"{PLUGINS}/{plugin}")
    async with open_pod_service(root, runtime_root, cni_conf_dir=network["conf_dir"], cni_bin_dirs=(str(bin_dir),),
                                cni_plugin_netns=network["outer_path"]) as pods:
        pod = await pods.run_pod_sandbox(pod_config())
        try:
            status = await pods.pod_sandbox_status(pod, verbose=True)
            assert status["info"]["cni_check"] == "ok"
            netns = ["nsenter", f"--net={status['info']['netns_path']}"]
            lo = subprocess.run([*netns, "ip", "-o", "link", "show", "lo"], check=True, capture_output=True,
                                text=True).stdout
            assert "LOOPBACK,UP" in lo, lo
            ping = subprocess.run([*netns, "ping", "-c", "1", "-W", "2", "127.0.0.1"], capture_output=True, text=True)
            assert ping.returncode == 0, ping.stdout + ping.stderr
        finally:
            await pods.stop_pod_sandbox(pod)
            await pods.remove_pod_sandbox(pod)
        assert pods.store.list() == []


async def test_a_failed_add_rolls_the_pod_back(roots, network, tmp_path) -> None:
    root, runtime_root = roots
    broken = tmp_path / "broken.d"
    broken.mkdir()
    (broken / "10-bad.conflist").write_text(json.dumps({
        "cniVersion": "1.0.0", "name": "bad", "plugins": [{"type": "no-such-plugin"}]}))
    async with open_pod_service(root, runtime_root, cni_conf_dir=str(broken), cni_bin_dirs=(PLUGINS,),
                                cni_plugin_netns=network["outer_path"]) as pods:
        with pytest.raises(Exception, match="no-such-plugin"):
            await pods.run_pod_sandbox(pod_config())
        assert pods.store.list() == []
        assert await pods.controller.list(None) == []


async def test_a_plugin_that_cannot_check_a_working_pod_is_a_warning_not_an_error(roots, network, caplog) -> None:
    # Debian's portmap 1.1.1 fails CHECK on a pod with an IPv6 address and a host port, though ADD
    # set it up right.
    root, runtime_root = roots
    conflist = network["conf_dir"] + "/10-test.conflist"
    with open(conflist) as f:
        doc = json.load(f)
    doc["plugins"][0]["ipam"]["ranges"].append([{"subnet": "fd00:213::/64"}])
    doc["plugins"].append({"type": "portmap", "capabilities": {"portMappings": True}})
    with open(conflist, "w") as f:
        json.dump(doc, f)
    async with open_pod_service(root, runtime_root, cni_conf_dir=network["conf_dir"], cni_bin_dirs=(PLUGINS,),
                                cni_plugin_netns=network["outer_path"]) as pods:
        config = pod_config()
        config["port_mappings"] = [{"protocol": "TCP", "container_port": 80, "host_port": 18080}]
        pod = await pods.run_pod_sandbox(config)
        try:
            with caplog.at_level("WARNING", logger="client.cri.pod"):
                status = await pods.pod_sandbox_status(pod, verbose=True)
            check = status["info"]["cni_check"]
            # portmap checks IPv6 rules it wrote for IPv4 only ("could not check ipv6 dnat").
            assert check.startswith("warning: CNI plugin 'portmap' CHECK failed with code 999: could not check ipv6")
            assert check.endswith("; the pod's network works (its interface has the addresses CNI ADD gave it)")
            assert [r.levelname for r in caplog.records if pod in r.getMessage()] == ["WARNING"]
            # A pod whose interface lost its address: CHECK's failure is the error it is.
            subprocess.run(["nsenter", f"--net={status['info']['netns_path']}", "ip", "addr", "flush", "dev", "eth0"],
                           check=True)
            broken = (await pods.pod_sandbox_status(pod, verbose=True))["info"]["cni_check"]
            assert not broken.startswith("warning") and broken != "ok", broken
        finally:
            await pods.stop_pod_sandbox(pod)
            await pods.remove_pod_sandbox(pod)
