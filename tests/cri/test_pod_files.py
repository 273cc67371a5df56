"""A pod's /etc/hosts, /etc/resolv.conf and /etc/hostname, as kubelet and containerd write them."""

from __future__ import annotations

import os
import socket

import pytest

from shim.cri.configs import DnsConfig, PodSandboxConfig
from shim.lib.podfiles import (
    HOSTS_HEADER,
    hostname_content,
    hosts_content,
    remove_pod_files,
    resolv_conf_content,
    write_pod_files,
)
from shim.rpc.status import InvalidArgument


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def pod(**fields) -> PodSandboxConfig:
    return PodSandboxConfig.from_json({"metadata": {"name": "p", "namespace": "n", "uid": "u"}, **fields})


def test_hosts_has_the_localhost_lines_and_the_pod_ips_with_its_hostname() -> None:
    assert hosts_content("web", ["10.1.0.5", "fd00::5"]).splitlines() == [
        HOSTS_HEADER,
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        "fe00::0\tip6-localnet",
        "fe00::0\tip6-mcastprefix",
        "fe00::1\tip6-allnodes",
        "fe00::2\tip6-allrouters",
        "10.1.0.5\tweb",
        "fd00::5\tweb",
    ]


def test_hosts_of_a_pod_without_an_ip_has_only_localhost_lines() -> None:
    assert hosts_content("web", []).splitlines()[-1] == "fe00::2\tip6-allrouters"


def test_resolv_conf_is_search_nameservers_options_in_containerds_order() -> None:
    dns = DnsConfig(servers=("10.0.0.10", "10.0.0.11"), searches=("a.local", "b.local"), options=("ndots:5", "timeout:1"))
    assert resolv_conf_content(dns) == ("search a.local b.local\nnameserver 10.0.0.10\nnameserver 10.0.0.11\n"
                                        "options ndots:5 timeout:1\n")


def test_an_empty_dns_config_means_the_nodes_resolv_conf(tmp_path) -> None:
    assert resolv_conf_content(DnsConfig()) == ""
    host = tmp_path / "host-resolv.conf"
    host.write_text("nameserver 192.0.2.1\n")
    files = write_pod_files(str(tmp_path / "pod"), pod(), host_resolv_conf=str(host))
    assert read(files.resolv_conf) == "nameserver 192.0.2.1\n"


def test_hostname_is_the_pods_or_else_the_nodes() -> None:
    assert hostname_content("web") == "web\n"
    assert hostname_content("") == socket.gethostname() + "\n"


@pytest.mark.parametrize("dns, message", [
    ({"servers": ["not-an-ip"]}, r"dns_config.servers\[0\] 'not-an-ip' is not an IP address"),
    ({"searches": ["a.local\nnameserver 6.6.6.6"]}, r"dns_config.searches\[0\] .* must be one word"),
    ({"options": ["ndots:5 x"]}, r"dns_config.options\[0\] .* must be one word"),
])
def test_dns_config_that_would_write_other_lines_is_refused(dns, message) -> None:
    with pytest.raises(InvalidArgument, match=message):
        pod(dns_config=dns)


def test_files_are_written_world_readable_and_removed_with_the_directory(tmp_path) -> None:
    directory = str(tmp_path / "pod")
    files = write_pod_files(directory, pod(hostname="web", dns_config={"servers": ["10.0.0.10"]}), ["10.1.0.5"])
    assert read(files.hostname) == "web\n"
    assert read(files.hosts).endswith("10.1.0.5\tweb\n")
    assert read(files.resolv_conf) == "nameserver 10.0.0.10\n"
    for path in (files.hosts, files.resolv_conf, files.hostname):
        assert os.stat(path).st_mode & 0o777 == 0o644
    assert set(files.mounts()) == {"/etc/hosts", "/etc/resolv.conf", "/etc/hostname"}
    remove_pod_files(directory)
    assert not os.path.exists(directory)
    remove_pod_files(directory)  # twice is fine


def test_a_host_network_pod_gets_a_copy_of_the_nodes_hosts(tmp_path) -> None:
    host = tmp_path / "host-hosts"
    host.write_text("127.0.0.1 localhost node\n")
    cfg = pod(linux={"security_context": {"namespace_options": {"network": 2}}})
    files = write_pod_files(str(tmp_path / "pod"), cfg, ["10.1.0.5"], host_hosts=str(host))
    assert read(files.hosts) == "127.0.0.1 localhost node\n"
