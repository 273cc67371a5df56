"""shim.kernel.netns on the real kernel: only namespaces these tests create are touched."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from shim.kernel import linux, netns
from shim.lib import namespaces
from shim.rpc.status import AlreadyExists, InvalidArgument, NotFound, PermissionDenied


@pytest.fixture
def netns_path():
    """A fresh path under /var/run/netns; whatever is made there is removed afterwards."""
    path = netns.new_netns_path(f"podshim-test-{os.getpid()}")
    yield path
    netns.remove_netns(path)


def _mount_points(mountinfo: str = "/proc/self/mountinfo") -> set[str]:
    with open(mountinfo) as f:
        return {line.split()[4] for line in f}


def test_new_netns_path_is_unique_and_under_the_default_dir() -> None:
    first, second = netns.new_netns_path("p"), netns.new_netns_path("p")
    assert first != second
    assert os.path.dirname(first) == netns.default_netns_dir() == "/var/run/netns"
    assert len(os.path.basename(first)) == len("p-") + 16


@pytest.mark.parametrize("prefix", ["", "a/b", "a\0b"])
def test_bad_name_prefix_is_refused(prefix) -> None:
    with pytest.raises(InvalidArgument):
        netns.new_netns_path(prefix)


def test_create_pins_a_new_netns_on_the_path(netns_path) -> None:
    assert netns.create_netns(netns_path) == netns_path
    assert linux.ns_inode(netns_path) != linux.ns_inode("/proc/self/ns/net")
    assert os.path.realpath(netns_path) in _mount_points()


def test_create_makes_the_missing_directories_of_the_path(tmp_path) -> None:
    path = str(tmp_path / "made" / "here" / "ns")
    try:
        assert netns.create_netns(path) == path
        assert linux.ns_inode(path) != linux.ns_inode("/proc/self/ns/net")
    finally:
        netns.remove_netns(path)
    assert os.listdir(tmp_path / "made" / "here") == []


def test_calling_thread_returns_to_its_own_netns(netns_path) -> None:
    before = linux.ns_inode("/proc/thread-self/ns/net")
    netns.create_netns(netns_path)
    assert linux.ns_inode("/proc/thread-self/ns/net") == before


def test_loopback_is_up_in_the_new_netns(netns_path) -> None:
    netns.create_netns(netns_path)
    out = subprocess.run(
        ["nsenter", f"--net={netns_path}", "ip", "-o", "link", "show", "lo"],
        check=True, capture_output=True, text=True,
    ).stdout
    assert ",UP," in out


def test_netns_dir_is_a_shared_mount(netns_path) -> None:
    netns.create_netns(netns_path)
    with open("/proc/self/mountinfo") as f:
        lines = [line.split() for line in f if line.split()[4] == os.path.realpath(netns.default_netns_dir())]
    assert lines and any(field.startswith("shared:") for field in lines[-1][6:])


def test_existing_path_is_refused_and_left_intact(netns_path) -> None:
    netns.create_netns(netns_path)
    inode = linux.ns_inode(netns_path)
    with pytest.raises(AlreadyExists):
        netns.create_netns(netns_path)
    assert linux.ns_inode(netns_path) == inode


def test_relative_path_is_refused() -> None:
    with pytest.raises(InvalidArgument):
        netns.create_netns("podshim-relative")


def test_failure_after_mount_leaves_no_file_and_no_mount(netns_path, monkeypatch) -> None:
    def fail() -> None:
        raise OSError(1, "Operation not permitted")

    before = linux.ns_inode("/proc/thread-self/ns/net")
    monkeypatch.setattr(netns, "_set_loopback_up", fail)
    with pytest.raises(PermissionDenied, match=f"cannot create netns {netns_path}: Operation not permitted"):
        netns.create_netns(netns_path)
    assert not os.path.exists(netns_path)
    assert os.path.realpath(netns_path) not in _mount_points()
    assert linux.ns_inode("/proc/thread-self/ns/net") == before


def test_netns_removed_leaves_no_mount(netns_path) -> None:
    netns.create_netns(netns_path)
    netns.remove_netns(netns_path)
    assert not os.path.exists(netns_path)
    assert os.path.realpath(netns_path) not in _mount_points()


def test_remove_is_idempotent(netns_path) -> None:
    netns.create_netns(netns_path)
    netns.remove_netns(netns_path)
    netns.remove_netns(netns_path)
    netns.remove_netns(netns.new_netns_path("podshim-never-made"))


def test_remove_refuses_a_file_that_is_not_a_netns(tmp_path) -> None:
    other = tmp_path / "data"
    other.write_text("keep me")
    with pytest.raises(InvalidArgument):
        netns.remove_netns(str(other))
    assert other.read_text() == "keep me"


def test_open_netns_gives_a_setns_able_fd(netns_path) -> None:
    netns.create_netns(netns_path)
    fd = netns.open_netns(netns_path)
    try:
        assert linux.ns_type(fd) == linux.CLONE_NEWNET
        assert os.fstat(fd).st_ino == linux.ns_inode(netns_path)
    finally:
        os.close(fd)


def test_open_netns_of_a_missing_or_unmounted_file_is_not_found(netns_path, tmp_path) -> None:
    with pytest.raises(netns.NamespaceNotFound) as missing:
        netns.open_netns(netns_path)
    assert missing.value.path == netns_path and isinstance(missing.value, NotFound)
    plain = tmp_path / "empty"
    plain.touch()
    with pytest.raises(NotFound):
        netns.open_netns(str(plain))


def test_describe_lists_loopback_with_its_addresses(netns_path) -> None:
    netns.create_netns(netns_path)
    (lo,) = netns.describe_netns(netns_path)
    assert lo["name"] == "lo"
    assert lo["state"] == "UNKNOWN"  # loopback's operstate when up
    assert "127.0.0.1/8" in lo["addresses"]


def test_describe_of_a_missing_netns_is_not_found(netns_path) -> None:
    with pytest.raises(NotFound):
        netns.describe_netns(netns_path)


def test_create_does_not_import_pyroute2() -> None:
    script = textwrap.dedent(
        """
        import os, sys
        from shim.kernel import netns
        path = netns.new_netns_path(f"podshim-test-{os.getpid()}")
        try:
            netns.create_netns(path)
        finally:
            netns.remove_netns(path)
        print(any(name.startswith("pyroute2") for name in sys.modules))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    ).stdout
    assert out.strip() == "False"


# -- which net.* sysctls a netns can set: the kernel says, from inside it ------------------------


def test_per_netns_sysctls_pass_and_others_are_not_looked_at(netns_path) -> None:
    netns.create_netns(netns_path)
    before = linux.ns_inode("/proc/thread-self/ns/net")
    netns.check_net_sysctls(netns_path, ["net.core.somaxconn", "net.ipv4.ip_forward", "net.ipv4.conf.lo.rp_filter",
                                         "kernel.shmmax", "vm.anything"])
    assert linux.ns_inode("/proc/thread-self/ns/net") == before  # the thread is back where it was


@pytest.mark.parametrize("key, says", [
    # Which of the two a kernel says depends on its version (6.x shows these read-only).
    ("net.core.rmem_max", "(is not per network namespace|does not exist in the sandbox's network namespace)"),
    ("net.core.netdev_max_backlog", "(is not per network namespace|does not exist in the sandbox's network namespace)"),
    ("net.ipv4.conf.eth0.rp_filter", "does not exist in the sandbox's network namespace"),  # no eth0 there
    ("net.ipv4.no_such_knob", "does not exist in the sandbox's network namespace"),
])
def test_net_sysctls_the_netns_cannot_set_are_refused(netns_path, key, says) -> None:
    netns.create_netns(netns_path)
    before = linux.ns_inode("/proc/thread-self/ns/net")
    with pytest.raises(InvalidArgument, match=f"^INVALID_ARGUMENT: sysctl {key} {says}"):
        netns.check_net_sysctls(netns_path, [key])
    assert linux.ns_inode("/proc/thread-self/ns/net") == before


def test_checking_sysctls_of_a_path_that_is_not_a_netns_is_not_found(tmp_path) -> None:
    (tmp_path / "plain").write_bytes(b"")
    with pytest.raises(NotFound):
        netns.check_net_sysctls(str(tmp_path / "plain"), ["net.core.somaxconn"])


def test_interface_counters_are_the_pod_namespaces_but_loopback(netns_path):
    netns.create_netns(netns_path)
    name = os.path.basename(netns_path)
    subprocess.run(["ip", "-n", name, "link", "add", "d0", "type", "veth", "peer", "name", "d1"], check=True,
                   timeout=30)
    for link in ("d0", "d1"):
        subprocess.run(["ip", "-n", name, "link", "set", link, "up"], check=True, timeout=30)
    member = subprocess.Popen(["nsenter", f"--net={netns_path}", "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{member.pid}/ns/net") == os.readlink("/proc/self/ns/net"):
            assert time.monotonic() < deadline, "nsenter did not enter the namespace"
            time.sleep(0.01)
        counters = netns.interface_counters(member.pid)
        with open(f"/proc/{member.pid}/net/dev") as f:
            lines = {line.split(":")[0].strip(): [int(x) for x in line.split(":", 1)[1].split()]
                     for line in f.readlines()[2:]}
        assert set(counters) == {"d0", "d1"} and "lo" in lines
        for link, fields in counters.items():
            # The counters move (the links came up); each is read at most a moment before the file.
            expected = dict(zip(("rx_bytes", "rx_packets", "rx_errors", "rx_dropped"), lines[link][:4], strict=False))
            expected.update(zip(("tx_bytes", "tx_packets", "tx_errors", "tx_dropped"), lines[link][8:12], strict=False))
            assert all(0 <= fields[key] <= expected[key] for key in expected), (link, fields, expected)
    finally:
        member.kill()
        member.wait(timeout=10)


def test_interface_counters_of_the_hosts_namespace_or_of_no_process_are_none() -> None:
    assert netns.interface_counters(os.getpid()) is None
    assert netns.interface_counters(2**22 + 1) is None


def test_a_descriptor_made_ahead_that_is_no_network_namespace_is_never_pinned(netns_path, tmp_path, caplog) -> None:
    # A descriptor number whose namespace was closed and taken by a file: crun, told to join the
    # path, failed with "cannot setns ...: Invalid argument".
    with open(tmp_path / "not-a-netns", "w") as f:
        netns.create_netns(netns_path, f.fileno())
    fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        assert namespaces.ns_type(fd) == linux.CLONE_NEWNET
    finally:
        os.close(fd)
    assert "not a network namespace: making a new one" in caplog.text
