"""A pod's user namespace on the real kernel (shim.kernel.userns, the pause and the native launcher):
the pause makes none of the host's root, its namespaces are the user namespace's, mappings kubelet
would not send are refused, and mounts are id-mapped with it.

Every pause is killed and reaped, every netns removed; no user namespace outlives its pause.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess

import pytest

from shim.kernel import linux, netns, userns
from shim.lib.idmaps import IdMap, UserNamespace
from shim.lib.processes import signal_process
from shim.lib.rootfs import is_mount_point, mount_rootfs, parse_rootfs, unmount_rootfs
from shim.rpc.status import FailedPrecondition, InvalidArgument
from shim.runtime.pause import BUILTIN, PauseSpec, launch  # start: tests/shim/conftest.py

WAIT = 5.0
HOST_ID = 1_000_000 + (os.getpid() % 1000) * 65536  # a range no other test's pod is given
POD_USERNS = UserNamespace.from_payload({"uids": [{"container_id": 0, "host_id": HOST_ID, "length": 65536}],
                                         "gids": [{"container_id": 0, "host_id": HOST_ID, "length": 65536}]})


@pytest.fixture
def netns_path():
    path = netns.new_netns_path(f"podshim-test-userns-{os.getpid()}")
    netns.create_netns(path)
    yield path
    netns.remove_netns(path)


def _ids(pid: int, field: str) -> list[int]:
    return [int(n) for n in linux.read_status(f"/proc/{pid}/status")[field].split()]


@pytest.mark.parametrize("binary", ["/usr/bin/catatonit", BUILTIN])
async def test_the_pause_runs_in_a_user_namespace_of_the_pods_mappings(start, netns_path, binary) -> None:
    pause = await start(netns_path=netns_path, userns=POD_USERNS, pause_binary=binary, hostname="pod")
    with open(f"/proc/{pause.pid}/uid_map") as f:
        assert f.read().split() == ["0", str(HOST_ID), "65536"]
    with open(f"/proc/{pause.pid}/gid_map") as f:
        assert f.read().split() == ["0", str(HOST_ID), "65536"]
    # Seen from the host, none of its ids is root: all are the mapped root's.
    assert set(_ids(pause.pid, "Uid")) == {HOST_ID} and set(_ids(pause.pid, "Gid")) == {HOST_ID}
    user = os.stat(f"/proc/{pause.pid}/ns/user").st_ino
    assert user != os.stat("/proc/self/ns/user").st_ino
    # Its pid, ipc, uts and mount namespaces are the user namespace's (NS_GET_USERNS), the network
    # namespace (CNI's) the host's.
    for kind in ("pid", "ipc", "uts", "mnt"):
        assert _owner(f"/proc/{pause.pid}/ns/{kind}") == user, kind
    assert _owner(f"/proc/{pause.pid}/ns/net") == os.stat("/proc/self/ns/user").st_ino


def _owner(path: str) -> int:
    import fcntl
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        owner = fcntl.ioctl(fd, 0xB701)  # NS_GET_USERNS
    finally:
        os.close(fd)
    try:
        return os.fstat(owner).st_ino
    finally:
        os.close(owner)


async def test_the_user_namespace_goes_with_its_pause(start, reaper, netns_path) -> None:
    pause = await start(netns_path=netns_path, userns=POD_USERNS, pause_binary=BUILTIN)
    fd = os.open(f"/proc/{pause.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    try:
        signal_process(pause.pid, pause.start_time, signal.SIGKILL)
        await asyncio.wait_for(pause.exit, WAIT)
        # Nothing but our fd holds it: no child of the shim is left in it.
        ino = os.fstat(fd).st_ino
        holders = [pid for pid in os.listdir("/proc") if pid.isdigit() and _user_ino(pid) == ino]
        assert holders == []
    finally:
        os.close(fd)


def _user_ino(pid: str) -> int:
    try:
        return os.stat(f"/proc/{pid}/ns/user").st_ino
    except OSError:
        return 0


async def test_a_sandbox_images_pause_is_refused_a_user_namespace(reaper, netns_path, tmp_path) -> None:
    with pytest.raises(InvalidArgument, match="a sandbox image's pause cannot run in a pod's user namespace"):
        await launch(PauseSpec(netns_path=netns_path, userns=POD_USERNS, rootfs=str(tmp_path), args=("/pause",)),
                     reaper)


async def test_a_user_namespace_with_host_network_is_refused(reaper) -> None:
    with pytest.raises(InvalidArgument, match="own network, pid and IPC namespaces"):
        await launch(PauseSpec(userns=POD_USERNS, pause_binary=BUILTIN), reaper)


@pytest.mark.parametrize("uids, match", [
    ([], "must be one mapping"),
    ([{"container_id": 0, "host_id": 100000, "length": 65536}] * 2, "must be one mapping"),
    ([{"container_id": 1, "host_id": 100000, "length": 65536}], "must map from id 0 inside"),
    ([{"container_id": 0, "host_id": 100000, "length": 0}], "must not be 0"),
    ([{"container_id": 0, "host_id": 0, "length": 65536}], "leave out the host's root"),
])
def test_mappings_kubelet_would_not_send_are_refused(uids, match) -> None:
    gids = [{"container_id": 0, "host_id": 100000, "length": 65536}]
    with pytest.raises(InvalidArgument, match=match):
        UserNamespace.from_payload({"uids": uids, "gids": gids})


async def test_the_pods_sysctls_are_written_in_a_user_namespace_too(start, netns_path) -> None:
    # net.* in CNI's network namespace (the host's user namespace's: written before the join),
    # IPC ones in the pod's IPC namespace (the user namespace's).
    pause = await start(netns_path=netns_path, userns=POD_USERNS, pause_binary=BUILTIN,
                        sysctls={"net.ipv4.ip_unprivileged_port_start": "80", "kernel.shm_rmid_forced": "1"})
    read = subprocess.run(["nsenter", "-t", str(pause.pid), "--net", "--ipc", "cat",
                           "/proc/sys/net/ipv4/ip_unprivileged_port_start", "/proc/sys/kernel/shm_rmid_forced"],
                          capture_output=True, text=True, check=True, timeout=WAIT)
    assert read.stdout.split() == ["80", "1"]


def test_a_host_id_is_seen_inside_through_the_mapping_and_unmapped_as_the_overflow_id() -> None:
    from shim.lib.idmaps import OVERFLOW_ID, inside_id
    assert [inside_id(POD_USERNS.uids, host) for host in (HOST_ID, HOST_ID + 33, HOST_ID + 65535)] == [0, 33, 65535]
    assert inside_id(POD_USERNS.uids, HOST_ID + 65536) == inside_id(POD_USERNS.uids, 0) == OVERFLOW_ID


async def test_an_overlays_layers_are_id_mapped_and_a_layer_that_cannot_be_is_refused_with_a_sentence(reaper,
                                                                                                    tmp_path) -> None:
    idmap = IdMap(await userns.create(POD_USERNS, reaper), HOST_ID, HOST_ID)
    layers = [tmp_path / "lower1", tmp_path / "lower2"]
    for layer in layers:
        layer.mkdir()
    (layers[0] / "roots").write_text("root's\n")
    target, shown = str(tmp_path / "view"), tmp_path / "shown"
    view = parse_rootfs({"rootfs": [{"type": "overlay", "source": "overlay",
                                     "options": [f"lowerdir={layers[0]}:{layers[1]}"]}]})
    try:
        mount_rootfs(view, target, idmap)
        assert os.stat(os.path.join(target, "roots")).st_uid == HOST_ID  # root inside the pod's namespace
        unmount_rootfs(target, remove=False)
        # A layer on an overlay (which cannot be id-mapped): refused, nothing left mounted.
        shown.mkdir()
        linux.mount("overlay", str(shown), "overlay", 0, f"lowerdir={layers[0]}:{layers[1]}")
        on_overlay = parse_rootfs({"rootfs": [{"type": "overlay", "source": "overlay",
                                               "options": [f"lowerdir={shown}:{layers[1]}"]}]})
        with pytest.raises(FailedPrecondition) as refused:
            mount_rootfs(on_overlay, target, idmap)
        assert refused.value.message == (f"cannot id-map layer {shown} for the pod's user namespace: its filesystem "
                                         "cannot be id-mapped")
        assert not is_mount_point(target)
    finally:
        for path in (target, str(shown)):
            if is_mount_point(path):
                linux.umount2(path, linux.MNT_DETACH)
        idmap.close()
