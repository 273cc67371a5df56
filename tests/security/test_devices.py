"""Device rules (issue 32, item 2): from inside real tasks of every handler, a block device of the
test's own (a loop device over a file it made) cannot be read or written, whether the task makes
its node (mknod, with the default capabilities) or its image ships one (mode 0666, for a user that
is not root); the standard devices still work, and a privileged task of a privileged pod still
gets every device. Then the kernel's side alone: the cgroup v1 rules and the cgroup v2 program
each deny by themselves."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import stat
import struct
import subprocess
from collections.abc import Iterator

import pytest

from shim.api.defaults import DEFAULT_CAPABILITIES
from shim.kernel import capabilities as caps
from shim.kernel import devices, linux
from shim.kernel.cgroups import V2, SandboxCgroup

from support.podtools import node_container, pod_config, pod_service
from support.proctools import run_in_child
from support.shimtools import (
    Shim,
    ShimLauncher,
    host_untouched,  # noqa: F401  (autouse: what this module's shims made is checked at the end)
)

BUSYBOX = "/bin/busybox"
HOST_DATA = b"the host's own data\n" * 3277  # 64 KiB: what the loop device shows


@pytest.fixture(params=["native", "runc", "crun"])
def handler(request) -> str:
    if request.param != "native" and shutil.which(request.param, path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
        pytest.skip(f"{request.param} is not installed")
    return request.param


class Loop:
    """A loop device over a file of the test's own: ``path``, its numbers, and the file."""

    def __init__(self, path: str, backing: str):
        self.path = path
        self.backing = backing
        st = os.stat(path)
        self.major, self.minor = os.major(st.st_rdev), os.minor(st.st_rdev)

    def untouched(self) -> bool:
        with open(self.backing, "rb") as f:
            return f.read() == HOST_DATA


@pytest.fixture
def loop(tmp_path) -> Iterator[Loop]:
    if shutil.which("losetup") is None:
        pytest.skip("losetup is not installed")
    backing = tmp_path / "disk.img"
    backing.write_bytes(HOST_DATA)
    made = subprocess.run(["losetup", "--find", "--show", str(backing)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"no loop device: {made.stderr.strip()}")
    path = made.stdout.strip()
    try:
        yield Loop(path, str(backing))
    finally:
        subprocess.run(["losetup", "--detach", path], check=True, timeout=30)


class Pod:
    """A running sandbox of one handler and its tasks' log files."""

    def __init__(self, shim: Shim, log_dir: str):
        self.shim = shim
        self.log_dir = log_dir

    async def output(self, task_id: str, script: str, **fields) -> list[str]:
        """Run ``busybox sh -c script`` to its end; its stdout and stderr lines."""
        log_path = os.path.join(self.log_dir, f"{task_id}.log")
        fields.setdefault("capabilities", list(DEFAULT_CAPABILITIES))
        await self.shim.task("Create", task_id=task_id, args=[BUSYBOX, "sh", "-c", script], log_path=log_path,
                             **fields)
        await self.shim.task("Start", task_id=task_id)
        await self.shim.task("Wait", task_id=task_id)
        with open(log_path) as f:
            return [line.rstrip("\n").split(" ", 3)[3] for line in f]


async def a_pod(shims: ShimLauncher, handler: str, log_dir, *, privileged: bool = False) -> Pod:
    options: dict = {"runtime_handler": handler}
    if privileged:
        options["linux"] = {"security_context": {"privileged": True},
                            "pause_process": {"capabilities": caps.names(caps.current())}}
    shim = await shims.start()
    await shim.run_sandbox(options=options)
    return Pod(shim, str(log_dir))


def read_and_write(node: str) -> str:
    """A script that reads the first bytes of ``node`` and writes over them; it prints read=RC and
    write=RC (0: done), with dd's complaints."""
    return (f"dd if={node} bs=20 count=1 2>&1; echo read=$?; "
            f"echo overwritten | dd of={node} conv=notrunc 2>&1; echo write=$?")


# -- from inside tasks --------------------------------------------------------------------------

async def test_a_block_device_made_with_mknod_can_be_neither_read_nor_written(shims, handler, loop, tmp_path) -> None:
    pod = await a_pod(shims, handler, tmp_path)
    lines = await pod.output("attack", f"mknod /dev/disk b {loop.major} {loop.minor} && echo made; "
                             + read_and_write("/dev/disk"))
    assert "made" in lines, lines  # mknod itself is allowed (runc's default), opening the node is not
    assert "read=1" in lines and "write=1" in lines, lines
    assert sum("Operation not permitted" in line for line in lines) == 2, lines
    assert loop.untouched()


async def test_an_image_shipped_device_node_gives_a_user_that_is_not_root_nothing(shims, handler, loop, tmp_path) -> None:
    tree = tmp_path / "image"
    (tree / "bin").mkdir(parents=True)
    shutil.copy(BUSYBOX, tree / "bin" / "busybox")
    os.symlink("busybox", tree / "bin" / "sh")
    os.mknod(tree / "disk", stat.S_IFBLK | 0o666, os.makedev(loop.major, loop.minor))
    os.chmod(tree / "disk", 0o666)
    logs = tmp_path / "logs"
    logs.mkdir()
    pod = await a_pod(shims, handler, logs)
    lines = await pod.output("attack", "id -u; " + read_and_write("/disk"),
                             rootfs=[{"type": "bind", "source": str(tree), "options": ["rbind"]}],
                             user={"uid": 1000, "gid": 1000}, env=["PATH=/bin"])
    assert lines[0] == "1000", lines
    assert "read=1" in lines and "write=1" in lines, lines
    assert sum("Operation not permitted" in line for line in lines) == 2, lines
    assert loop.untouched()


async def test_an_exec_in_a_task_is_held_to_the_tasks_rules(shims, handler, loop, tmp_path) -> None:
    pod = await a_pod(shims, handler, tmp_path)
    await pod.shim.task("Create", task_id="app", args=[BUSYBOX, "sleep", "600"], log_path=str(tmp_path / "app.log"),
                        capabilities=list(DEFAULT_CAPABILITIES))
    await pod.shim.task("Start", task_id="app")
    reply = await pod.shim.task("Exec", task_id="app", args=[
        BUSYBOX, "sh", "-c", f"mknod /dev/disk b {loop.major} {loop.minor}; " + read_and_write("/dev/disk")])
    lines = reply["stdout"].decode().splitlines()
    assert "read=1" in lines and "write=1" in lines, reply
    assert loop.untouched()


async def test_the_standard_devices_still_work(shims, handler, tmp_path) -> None:
    pod = await a_pod(shims, handler, tmp_path)
    lines = await pod.output("standard", "echo x > /dev/null && echo null; "
                             "head -c 4 /dev/zero | wc -c; head -c 4 /dev/urandom | wc -c; "
                             "head -c 4 /dev/random | wc -c; (echo x > /dev/full) 2>&1; "
                             "(: <> /dev/ptmx) && echo ptmx")
    assert lines[:4] == ["null", "4", "4", "4"], lines
    assert "No space left on device" in lines[4] and lines[5] == "ptmx", lines


async def test_a_privileged_task_of_a_privileged_pod_reads_and_writes_a_block_device(shims, handler, loop, tmp_path) -> None:
    pod = await a_pod(shims, handler, tmp_path, privileged=True)
    lines = await pod.output("privileged", f"mknod /dev/disk b {loop.major} {loop.minor}; "
                             + read_and_write("/dev/disk"),
                             privileged=True, capabilities=caps.names(caps.current()))
    assert "read=0" in lines and "write=0" in lines, lines
    with open(loop.backing, "rb") as f:
        assert f.read(12) == b"overwritten\n"


async def test_a_task_that_is_not_privileged_keeps_the_default_rules_in_a_privileged_pod(
        shims, handler, loop, tmp_path) -> None:
    pod = await a_pod(shims, handler, tmp_path, privileged=True)
    lines = await pod.output("attack", f"mknod /dev/disk b {loop.major} {loop.minor}; "
                             + read_and_write("/dev/disk"))
    assert "read=1" in lines and "write=1" in lines, lines
    assert loop.untouched()


async def test_a_privileged_task_of_a_pod_that_is_not_keeps_the_default_rules(shims, handler, loop, tmp_path) -> None:
    pod = await a_pod(shims, handler, tmp_path)
    lines = await pod.output("attack", f"mknod /dev/disk b {loop.major} {loop.minor}; "
                             + read_and_write("/dev/disk"), privileged=True)
    assert "read=1" in lines and "write=1" in lines, lines
    assert loop.untouched()


async def test_a_task_given_a_device_uses_it_and_the_pods_other_tasks_still_cannot(shims, handler, loop, tmp_path) -> None:
    pod = await a_pod(shims, handler, tmp_path)
    attack = f"mknod /dev/disk b {loop.major} {loop.minor}; " + read_and_write("/dev/disk")
    # One task made before the device is given (it waits for the given one to be done), one after.
    await pod.shim.task("Create", task_id="before", log_path=str(tmp_path / "before.log"),
                        capabilities=list(DEFAULT_CAPABILITIES), args=[
                            BUSYBOX, "sh", "-c", "for i in $(seq 300); do [ -e /dev/shm/given ] && break; "
                            "sleep 0.1; done; " + attack])
    await pod.shim.task("Start", task_id="before")
    lines = await pod.output("given", "ls -l /dev/xdisk; dd if=/dev/xdisk bs=20 count=1 2>/dev/null; "
                             "touch /dev/shm/given", devices=[{"container_path": "/dev/xdisk", "host_path": loop.path,
                                                                "permissions": "r"}])
    assert lines[0].startswith("b"), lines
    assert lines[1] == "the host's own data", lines
    after = await pod.output("after", attack)
    assert "read=1" in after and "write=1" in after, after
    await pod.shim.task("Wait", task_id="before")
    with open(tmp_path / "before.log") as f:
        before = [line.rstrip("\n").split(" ", 3)[3] for line in f]
    assert "read=1" in before and "write=1" in before, before
    assert loop.untouched()


async def test_a_device_given_for_reading_only_cannot_be_written(shims, handler, loop, tmp_path) -> None:
    pod = await a_pod(shims, handler, tmp_path)
    lines = await pod.output("given", "echo overwritten | dd of=/dev/xdisk conv=notrunc 2>&1; echo write=$?",
                             devices=[{"container_path": "/dev/xdisk", "host_path": loop.path, "permissions": "r"}])
    assert "write=1" in lines and any("Operation not permitted" in line for line in lines), lines
    assert loop.untouched()


async def test_a_cri_containers_devices_reach_it(roots, handler, loop) -> None:
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config(), runtime_handler=handler)
        cfg = node_container([BUSYBOX, "sh", "-c", "dd if=/dev/given/disk bs=20 count=1 2>/dev/null"])
        cfg["devices"] = [{"container_path": "/dev/given/disk", "host_path": loop.path, "permissions": "rw"}]
        cid = await pods.create_container(pod_id, cfg)
        await pods.start_container(cid)
        await pods._task(pod_id, "Wait", {"task_id": cid}, timeout=30)
        with open(pods.container_log_path(cid)) as f:
            assert [line.rstrip("\n").split(" ", 3)[3] for line in f] == ["the host's own data"]


@pytest.mark.parametrize(("device", "words"), [
    ({"container_path": "/etc/disk", "host_path": "/dev/null"}, "must be below /dev"),
    ({"container_path": "/dev/shm/disk", "host_path": "/dev/null"}, "must be below /dev"),
    ({"container_path": "/dev/x", "host_path": "/dev/null", "permissions": "rx"}, "permissions"),
    ({"container_path": "/dev/x", "host_path": "dev/null"}, "must be an absolute path"),
])
async def test_a_malformed_device_is_refused_naming_it(shims, device, words, tmp_path) -> None:
    from shim.rpc.status import InvalidArgument

    pod = await a_pod(shims, "native", tmp_path)
    with pytest.raises(InvalidArgument, match=words):
        await pod.shim.task("Create", task_id="t", args=["true"], log_path=str(tmp_path / "t.log"), devices=[device])


@pytest.mark.parametrize(("host_path", "words"), [("/no/such/device", "No such file"), ("/etc/hostname", "not a device")])
async def test_a_host_path_that_is_no_device_is_refused(shims, host_path, words, tmp_path) -> None:
    from shim.rpc.status import FailedPrecondition

    pod = await a_pod(shims, "native", tmp_path)
    with pytest.raises(FailedPrecondition, match=words):
        await pod.shim.task("Create", task_id="t", args=["true"], log_path=str(tmp_path / "t.log"),
                            devices=[{"container_path": "/dev/x", "host_path": host_path}])


def attached_device_programs(directory: str) -> int:
    """How many device programs are attached to the v2 cgroup ``directory`` (BPF_PROG_QUERY)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        # target_fd, attach_type (BPF_CGROUP_DEVICE), query_flags, attach_flags, prog_ids, prog_cnt.
        attr = ctypes.create_string_buffer(struct.pack("<IIIIQI4x", fd, 6, 0, 0, 0, 0))
        linux.bpf(16, attr)
    finally:
        os.close(fd)
    return struct.unpack_from("<I", attr.raw, 24)[0]


@pytest.mark.parametrize("privileged", [False, True], ids=["pod", "privileged-pod"])
async def test_the_pauses_cgroup_holds_the_pods_rules_in_both_hierarchies(shims, handler, privileged, tmp_path) -> None:
    pod = await a_pod(shims, handler, tmp_path, privileged=privileged)
    info = await pod.shim.info()
    if "cgroup.devices" not in info and "cgroup.unified" not in info:
        pytest.skip("no devices hierarchy here")
    if "cgroup.devices" in info:
        with open(os.path.join(info["cgroup.devices"], "devices.list")) as f:
            listed = sorted(filter(None, f.read().split("\n")))
        assert listed == (["a *:* rwm"] if privileged else sorted(r.line() for r in devices.DEFAULT_RULES.allowed))
    if "cgroup.unified" in info:
        assert attached_device_programs(info["cgroup.unified"]) == (0 if privileged else 1)


# -- the kernel's side, each hierarchy alone ------------------------------------------------------

def hierarchy_root(fstype: str, controller: str | None = None) -> str | None:
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            dash = fields.index("-")
            if fields[dash + 1] == fstype and (controller is None or controller in fields[dash + 3].split(",")):
                return fields[4]
    return None


@contextlib.contextmanager
def own_cgroup(key: str, root: str | None) -> Iterator[SandboxCgroup]:
    """A cgroup of the test's own below ``root`` of one hierarchy, removed after."""
    if root is None:
        pytest.skip(f"this machine has no {key} hierarchy")
    directory = os.path.join(root, f"podshim-test-devices-{os.getpid()}")
    os.mkdir(directory)
    try:
        yield SandboxCgroup("test", {key: directory})
    finally:
        os.rmdir(directory)


def opens_in(cgroup: SandboxCgroup, path: str) -> bool:
    """Whether a child moved into ``cgroup`` can open ``path`` for reading and writing."""
    directory = next(iter(cgroup.paths.values()))

    def check() -> bool:
        with open(os.path.join(directory, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        try:
            os.close(os.open(path, os.O_RDWR))
        except PermissionError:
            return False
        return True

    status = run_in_child(check)
    assert status in (0, 1), f"the child failed ({status})"
    return status == 0


@pytest.mark.parametrize("hierarchy", ["v1", "v2"])
def test_each_hierarchy_alone_denies_what_the_rules_do_not_allow(hierarchy, loop) -> None:
    root = hierarchy_root("cgroup", "devices") if hierarchy == "v1" else hierarchy_root("cgroup2")
    with own_cgroup("devices" if hierarchy == "v1" else V2, root) as cgroup:
        assert opens_in(cgroup, loop.path)  # the machine's own rules allow it
        devices.apply(cgroup, devices.DEFAULT_RULES)
        assert not opens_in(cgroup, loop.path)
        assert opens_in(cgroup, "/dev/null")
        devices.apply(cgroup, devices.DEFAULT_RULES.plus([devices.DeviceRule("b", loop.major, loop.minor, "rw")]))
        assert opens_in(cgroup, loop.path)
        devices.apply(cgroup, devices.DEFAULT_RULES.plus([devices.DeviceRule("b", loop.major, loop.minor, "r")]))
        assert not opens_in(cgroup, loop.path)  # read and write asked at once: one rule must give both
    assert loop.untouched()


def test_the_v1_rules_are_containerds_list() -> None:
    with own_cgroup("devices", hierarchy_root("cgroup", "devices")) as cgroup:
        devices.apply(cgroup, devices.DEFAULT_RULES)
        with open(os.path.join(cgroup.paths["devices"], "devices.list")) as f:
            listed = f.read().split("\n")
    assert sorted(filter(None, listed)) == sorted(rule.line() for rule in devices.DEFAULT_RULES.allowed)


@pytest.mark.parametrize(("errno_", "refused"), [(1, False), (22, True)], ids=["EPERM", "EINVAL"])
def test_a_v2_program_refused_without_a_v1_controller_fails_unless_bpf_is_not_ours_to_use(
        monkeypatch, caplog, errno_, refused, tmp_path) -> None:
    from shim.rpc.status import FailedPrecondition

    def bpf(cmd, attr):
        raise OSError(errno_, os.strerror(errno_))

    monkeypatch.setattr(linux, "bpf", bpf)
    monkeypatch.setattr(devices, "_loaded", {})
    cgroup = SandboxCgroup("test", {V2: str(tmp_path)})
    if refused:
        with pytest.raises(FailedPrecondition, match="no cgroup v1 devices controller"):
            devices.apply(cgroup, devices.DEFAULT_RULES)
    else:
        devices.apply(cgroup, devices.DEFAULT_RULES)  # inside a container: its runtime's rules hold
        assert "the device rules are those of the cgroups above" in caplog.text
