"""A container's CRI mounts as the shim's Task.Create mounts, as containerd makes them: recursive
binds with their propagation, missing host paths made as directories, symbolic links resolved,
propagation checked against the host's mount, SELinux relabelling refused, the pod's files first
unless the config mounts something there."""

from __future__ import annotations

import os

import pytest

from shim.cri.configs import ContainerConfig, Mount
from shim.lib.mountinfo import parse as parse_mountinfo
from shim.rpc.status import FailedPrecondition, InvalidArgument

from client.cri.mounts import container_mounts, host_mount

POD_FILES = {"/etc/hosts": "/pod/hosts", "/etc/resolv.conf": "/pod/resolv.conf", "/etc/hostname": "/pod/hostname"}
#: A host where / is shared, /private is private and /slave a slave.
MOUNTINFO = (
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    "30 22 0:5 / /private rw - tmpfs tmpfs rw\n"
    "31 22 0:6 / /slave rw master:7 - tmpfs tmpfs rw\n"
    "32 30 0:7 / /private/with\\040space rw shared:9 - tmpfs tmpfs rw\n"
)


def mounts_of(*entries: dict) -> tuple[Mount, ...]:
    return ContainerConfig.from_json({"metadata": {"name": "c"}, "mounts": list(entries)}).mounts


def test_pod_files_come_first_as_private_binds(tmp_path) -> None:
    assert container_mounts((), POD_FILES, readonly_rootfs=False) == [
        {"destination": d, "source": s, "type": "bind", "options": ["rbind", "rprivate"]} for d, s in POD_FILES.items()]


def test_pod_files_are_read_only_with_a_read_only_rootfs() -> None:
    assert all("ro" in m["options"] for m in container_mounts((), POD_FILES, readonly_rootfs=True))


def test_a_cri_mount_at_etc_hosts_replaces_the_pods(tmp_path) -> None:
    own = tmp_path / "hosts"
    own.write_text("kubelet's\n")
    out = container_mounts(mounts_of({"container_path": "/etc/hosts", "host_path": str(own)}), POD_FILES,
                           readonly_rootfs=False)
    assert [(m["destination"], m["source"]) for m in out] == [
        ("/etc/resolv.conf", "/pod/resolv.conf"), ("/etc/hostname", "/pod/hostname"), ("/etc/hosts", str(own))]


@pytest.mark.parametrize("propagation, option", [(0, "rprivate"), ("PROPAGATION_PRIVATE", "rprivate"),
                                                 (1, "rslave"), (2, "rshared")])
def test_propagation_is_rprivate_rslave_or_rshared(tmp_path, propagation, option) -> None:
    (out,) = container_mounts(mounts_of({"container_path": "/data", "host_path": str(tmp_path),
                                         "propagation": propagation, "readonly": True}), {},
                              readonly_rootfs=False, mountinfo=MOUNTINFO)
    assert out == {"destination": "/data", "source": str(tmp_path), "type": "bind", "options": ["rbind", option, "ro"]}


def test_a_missing_host_path_is_made_as_a_directory(tmp_path) -> None:
    missing = tmp_path / "a" / "b"
    (out,) = container_mounts(mounts_of({"container_path": "/data", "host_path": str(missing)}), {},
                              readonly_rootfs=False)
    assert missing.is_dir() and out["source"] == str(missing)


def test_a_symbolic_link_host_path_is_resolved(tmp_path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (out,) = container_mounts(mounts_of({"container_path": "/data", "host_path": str(tmp_path / "link")}), {},
                              readonly_rootfs=False)
    assert out["source"] == str(tmp_path / "real")


def test_a_dangling_link_is_refused(tmp_path) -> None:
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    with pytest.raises(FailedPrecondition, match="which does not exist"):
        container_mounts(mounts_of({"container_path": "/data", "host_path": str(tmp_path / "link")}), {},
                         readonly_rootfs=False)


@pytest.mark.parametrize("host_path, propagation, message", [
    ("/private/x", 2, "'/private/x' is mounted on '/private' but it is not a shared mount"),
    ("/private/x", 1, "'/private/x' is mounted on '/private' but it is not a shared or slave mount"),
    ("/slave/x", 2, "'/slave/x' is mounted on '/slave' but it is not a shared mount"),
])
def test_propagation_the_host_mount_cannot_give_is_refused(host_path, propagation, message, monkeypatch) -> None:
    monkeypatch.setattr("client.cri.mounts._host_source", lambda mount: mount.host_path)
    with pytest.raises(FailedPrecondition, match=message):
        container_mounts(mounts_of({"container_path": "/d", "host_path": host_path, "propagation": propagation}), {},
                         readonly_rootfs=False, mountinfo=MOUNTINFO)


def test_host_mount_is_the_deepest_mount_point_holding_the_path() -> None:
    table = parse_mountinfo(MOUNTINFO)
    assert host_mount("/slave/x", table).slave
    assert host_mount("/slaveish", table).mount_point == "/"
    assert host_mount("/private/with space/y", table).shared


@pytest.mark.parametrize("mount, message", [
    ({"container_path": "d", "host_path": "/tmp"}, "mounts\\[0\\].container_path 'd' must be an absolute path"),
    ({"container_path": "/d", "host_path": "tmp"}, "mounts\\[0\\].host_path 'tmp' must be an absolute path"),
    ({"container_path": "/d"}, "mounts\\[0\\].host_path is required"),
    ({"container_path": "/d", "host_path": "/tmp", "propagation": 7}, "mounts\\[0\\].propagation is 7"),
])
def test_bad_mounts_are_refused_with_a_sentence(mount, message) -> None:
    with pytest.raises(InvalidArgument, match=message):
        mounts_of(mount)


def test_selinux_relabel_is_nothing_to_do_without_selinux_and_refused_with_it(tmp_path, monkeypatch) -> None:
    relabelled = mounts_of({"container_path": "/d", "host_path": str(tmp_path), "selinux_relabel": True})
    assert relabelled[0].selinux_relabel
    monkeypatch.setattr("client.cri.mounts.SELINUX_ENFORCE", str(tmp_path / "no-selinuxfs"))
    assert container_mounts(relabelled, {}, readonly_rootfs=False)[0]["source"] == str(tmp_path)
    (tmp_path / "enforce").write_text("1")
    monkeypatch.setattr("client.cri.mounts.SELINUX_ENFORCE", str(tmp_path / "enforce"))
    with pytest.raises(FailedPrecondition, match="SELinux is enabled on this node, but podshim cannot relabel"):
        container_mounts(relabelled, {}, readonly_rootfs=False)


def test_two_mounts_at_one_path_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="mounts\\[1\\] and mounts\\[0\\] are both mounted at /d"):
        mounts_of({"container_path": "/d", "host_path": "/a"}, {"container_path": "/d/", "host_path": "/b"})


def test_the_real_mountinfo_is_read_when_propagation_needs_it(tmp_path) -> None:
    out = container_mounts(mounts_of({"container_path": "/d", "host_path": "/", "propagation": 0}), {},
                           readonly_rootfs=False)
    assert out[0]["options"] == ["rbind", "rprivate"]
    with open("/proc/self/mountinfo") as f:
        root_shared = host_mount("/", parse_mountinfo(f.read())).shared
    if root_shared:
        container_mounts(mounts_of({"container_path": "/d", "host_path": "/", "propagation": 2}), {},
                         readonly_rootfs=False)
    else:
        with pytest.raises(FailedPrecondition):
            container_mounts(mounts_of({"container_path": "/d", "host_path": "/", "propagation": 2}), {},
                             readonly_rootfs=False)
    assert os.path.isdir(tmp_path)
