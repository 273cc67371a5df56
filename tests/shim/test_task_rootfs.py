"""A task's filesystem through a real shim, with each runtime handler (native, runc, crun): its
root (a rootfs given as a bind or an overlay, the node's / as tests ask for it, or without one an
empty read-only root of its own), /proc, /dev, /sys, its
mounts with their options and propagation, masked and read-only paths, and what Delete and
``podshim delete`` unmount (protocol.md 7.3). Checked from inside the task (Exec) and on the host
(/proc/self/mountinfo)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat

import pytest

from shim.api.defaults import DEFAULT_CAPABILITIES
from shim.api.names import TASK_SERVICE
from shim.kernel import linux
from shim.rpc import FailedPrecondition, InvalidArgument

from support.shimtools import (
    WAIT,
    Shim,
    ShimLauncher,
    host_untouched,  # noqa: F401  (autouse: what this module's shims made is checked at the end)
)

HANDLERS = ["native"] + [h for h in ("runc", "crun") if shutil.which(h, path="/usr/sbin:/usr/bin:/sbin:/bin")]
BUSYBOX = "/bin/busybox"
#: What a task's /dev holds without privileges (runc's list, and the mount points), and "core"
#: (-> /proc/kcore), which runc makes only when the host has a /proc/kcore.
DEV_ENTRIES = {"fd", "full", "mqueue", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout", "tty",
               "urandom", "zero"}


class Pod:
    """A running sandbox of one runtime handler, and helpers to run tasks in it."""

    def __init__(self, shim: Shim, handler: str, log_dir: str):
        self.shim = shim
        self.handler = handler
        self.log_dir = log_dir
        self.call = shim.task  # a Task method for this sandbox

    async def run(self, task_id: str, *args: str, **fields) -> int:
        await self.call("Create", task_id=task_id, args=list(args),
                        log_path=os.path.join(self.log_dir, f"{task_id}.log"), **fields)
        return (await self.call("Start", task_id=task_id))["pid"]

    async def sh(self, task_id: str, script: str) -> tuple[int, str]:
        reply = await self.call("Exec", task_id=task_id, args=["sh", "-c", script])
        return reply["exit_status"], (reply["stdout"] + reply["stderr"]).decode()

    async def end(self, task_id: str) -> None:
        await self.call("Kill", task_id=task_id, signal=9)
        await self.call("Wait", task_id=task_id)
        await self.call("Delete", task_id=task_id)

    def rootfs(self, task_id: str) -> str:
        return os.path.join(self.shim.bundle, "tasks", task_id, "rootfs")

    def mounted(self) -> list[str]:
        """The host's mounts in this shim's bundle."""
        return [line for line in host_mountinfo().splitlines() if self.shim.bundle in line]


@pytest.fixture(params=HANDLERS)
async def pod(request, shims: ShimLauncher, tmp_path) -> Pod:
    shim = await shims.start()
    await shim.run_sandbox(options={"runtime_handler": request.param})
    logs = tmp_path / "logs"
    logs.mkdir()
    return Pod(shim, request.param, str(logs))


def a_tree(path) -> str:
    """A small root: busybox as /bin/sh and friends, a file of its own, empty /etc and /tmp."""
    for directory in ("bin", "etc", "tmp", "data"):
        (path / directory).mkdir(parents=True)
    shutil.copy(BUSYBOX, path / "bin" / "busybox")
    for tool in ("sh", "cat", "ls", "sleep", "touch", "mkdir", "mount", "grep", "stat", "readlink", "wc"):
        os.symlink("busybox", path / "bin" / tool)
    (path / "etc" / "marker").write_text("the task's own tree\n")
    return str(path)


def host_mountinfo() -> str:
    with open("/proc/self/mountinfo") as f:
        return f.read()


def mount_options(mountinfo: str, mount_point: str) -> set[str]:
    """The per-mount options of the last mount on ``mount_point`` in a mountinfo text."""
    found = [fields for fields in map(str.split, mountinfo.splitlines()) if len(fields) > 5 and fields[4] == mount_point]
    assert found, f"nothing mounted on {mount_point}"
    return set(found[-1][5].split(","))


def bound(tree: str, *options: str) -> list[dict]:
    return [{"type": "bind", "source": tree, "options": ["rbind", *options]}]


def overlay(tmp_path, tree: str) -> list[dict]:
    """An overlay as a snapshotter gives it: ``tree`` below, a fresh upper and work directory."""
    for name in ("upper", "work"):
        (tmp_path / name).mkdir()
    return [{"type": "overlay", "source": "overlay",
             "options": [f"lowerdir={tree}", f"upperdir={tmp_path / 'upper'}", f"workdir={tmp_path / 'work'}"]}]


@contextlib.contextmanager
def shared_mount(path: str):
    """``path`` bound on itself and made shared (a peer group mounts below it propagate through)."""
    linux.mount(path, path, None, linux.MS_BIND)
    try:
        linux.mount(None, path, None, linux.MS_SHARED)
        yield path
    finally:
        linux.umount2(path, linux.MNT_DETACH)


@contextlib.contextmanager
def tmpfs_on(path: str):
    linux.mount("tmpfs", path, "tmpfs", 0, "size=64k")
    try:
        yield path
    finally:
        linux.umount2(path, linux.MNT_DETACH)


# -- the root ---------------------------------------------------------------------------------

async def test_a_bound_rootfs_is_the_tasks_root_and_nothing_of_the_host_is_there(pod, tmp_path) -> None:
    tree = a_tree(tmp_path / "tree")
    await pod.run("app", "sleep", "600", rootfs=bound(tree), env=["PATH=/bin"])
    status, out = await pod.sh("app", "cat /etc/marker; ls /; ls /work 2>&1")
    lines = out.splitlines()
    assert status != 0 and lines[0] == "the task's own tree"
    assert set(lines[1:-1]) == {"bin", "data", "dev", "etc", "proc", "sys", "tmp"}
    assert "No such file or directory" in lines[-1]
    await pod.end("app")


async def test_an_overlay_rootfs_is_the_tree_with_the_tasks_writes_in_its_upper_dir(pod, tmp_path) -> None:
    tree = a_tree(tmp_path / "tree")
    await pod.run("app", "sleep", "600", rootfs=overlay(tmp_path, tree), env=["PATH=/bin"])
    status, out = await pod.sh("app", "cat /etc/marker && touch /etc/written && ls /etc")
    assert (status, out.split()) == (0, ["the", "task's", "own", "tree", "marker", "written"])
    assert (tmp_path / "upper" / "etc" / "written").exists() and not os.path.exists(f"{tree}/etc/written")
    await pod.end("app")


async def test_an_overlay_of_more_layers_than_mount_options_can_hold_has_every_layer(pod, tmp_path) -> None:
    layers = [a_tree(tmp_path / "tree")]
    for n in range(60):  # each above the one before; the options come to about 6 KiB
        layer = tmp_path / "layers" / f"{n:02d}-{'x' * 60}"
        layer.mkdir(parents=True)
        (layer / f"layer-{n:02d}").write_text("")
        layers.insert(0, str(layer))
    (tmp_path / "upper").mkdir()
    (tmp_path / "work").mkdir()
    options = [f"lowerdir={':'.join(layers)}", f"upperdir={tmp_path / 'upper'}", f"workdir={tmp_path / 'work'}"]
    assert len(",".join(options)) > 4096
    await pod.run("app", "sleep", "600", env=["PATH=/bin"],
                  rootfs=[{"type": "overlay", "source": "overlay", "options": options}])
    status, out = await pod.sh("app", "ls / | grep -c '^layer-'; cat /etc/marker")
    assert (status, out) == (0, "60\nthe task's own tree\n")


async def test_a_readonly_rootfs_cannot_be_written(pod, tmp_path) -> None:
    tree = a_tree(tmp_path / "tree")
    await pod.run("app", "sleep", "600", rootfs=overlay(tmp_path, tree), readonly_rootfs=True, env=["PATH=/bin"])
    status, out = await pod.sh("app", "touch /etc/written")
    assert status != 0 and "Read-only file system" in out
    assert not os.path.exists(tmp_path / "upper" / "etc")


BUSYBOX_MOUNT = {"destination": "/bin/busybox", "source": "/bin/busybox", "options": ["ro"]}


async def test_the_node_root_a_task_asks_for_is_read_only(pod, tmp_path) -> None:
    (tmp_path / "host-file").write_text("from the host\n")
    await pod.run("app", "sleep", "600")  # rootfs: the node's /, as the pod helper gives it
    status, out = await pod.sh("app", f"cat {tmp_path}/host-file; touch {tmp_path}/written 2>&1; touch /written 2>&1")
    assert status != 0 and out.splitlines()[0] == "from the host"
    assert out.count("Read-only file system") == 2
    assert not (tmp_path / "written").exists() and not os.path.exists("/written")


async def test_without_a_rootfs_the_root_is_its_own_empty_and_read_only(pod, tmp_path) -> None:
    # Nothing of the node but what its mounts bind: no secret, no socket, no state of the node.
    (tmp_path / "host-file").write_text("from the host\n")
    await pod.run("app", "/bin/busybox", "sleep", "600", rootfs=[], mounts=[BUSYBOX_MOUNT])
    reply = await pod.call("Exec", task_id="app", args=["/bin/busybox", "sh", "-c",
                                                        f"/bin/busybox ls -a /; /bin/busybox cat /etc/shadow {tmp_path}/host-file; "
                                                        "/bin/busybox ls /run /var /tmp; /bin/busybox touch /written"])
    out = (reply["stdout"] + reply["stderr"]).decode()
    assert reply["exit_status"] != 0
    assert reply["stdout"].decode().split() == [".", "..", "bin", "dev", "proc", "sys"]
    assert "root:" not in out and "from the host" not in out and "Read-only file system" in out
    assert not os.path.exists("/written")


async def test_a_task_of_pod_pid_mode_has_the_root_it_was_given_too(pod, tmp_path) -> None:
    tree = a_tree(tmp_path / "tree")
    await pod.run("app", "sleep", "600", rootfs=bound(tree), env=["PATH=/bin"], pid_mode="POD")
    assert (await pod.sh("app", "cat /etc/marker")) == (0, "the task's own tree\n")


# -- /proc, /dev, /sys, masked and read-only paths ----------------------------------------------

async def test_proc_shows_the_tasks_own_pid_namespace(pod, tmp_path) -> None:
    await pod.run("app", "sleep", "600", rootfs=bound(a_tree(tmp_path / "tree")), env=["PATH=/bin"])
    # Shell builtins only: the exec's sh is the one process besides the task's.
    status, out = await pod.sh("app", "cd /proc; for p in [0-9]*; do read c < $p/comm; echo $p $c; done")
    assert status == 0
    processes = dict(line.split() for line in out.splitlines())
    assert processes.pop("1") == "sleep" and list(processes.values()) == ["sh"]


async def test_dev_has_exactly_the_standard_nodes(pod, tmp_path) -> None:
    await pod.run("app", "sleep", "600", rootfs=bound(a_tree(tmp_path / "tree")), env=["PATH=/bin"])
    status, out = await pod.sh("app", "ls -a /dev; stat -c '%n %t:%T %a' /dev/null /dev/zero /dev/full /dev/random "
                                      "/dev/urandom /dev/tty; readlink /dev/ptmx; readlink /dev/fd")
    lines = out.splitlines()
    assert status == 0
    assert set(lines[:-8]) - {".", "..", "core"} == DEV_ENTRIES
    assert lines[-8:] == ["/dev/null 1:3 666", "/dev/zero 1:5 666", "/dev/full 1:7 666", "/dev/random 1:8 666",
                          "/dev/urandom 1:9 666", "/dev/tty 5:0 666", "pts/ptmx", "/proc/self/fd"]


async def test_dev_shm_is_the_pods_shared_by_its_tasks(pod, tmp_path) -> None:
    tree = a_tree(tmp_path / "tree")
    await pod.run("writer", "sleep", "600", rootfs=bound(tree), env=["PATH=/bin"])
    await pod.run("reader", "sleep", "600", rootfs=bound(tree), env=["PATH=/bin"], pid_mode="POD")
    assert (await pod.sh("writer", "echo shared > /dev/shm/note"))[0] == 0
    assert await pod.sh("reader", "cat /dev/shm/note") == (0, "shared\n")


async def test_sys_is_read_only_and_masked_paths_unreadable_and_proc_sys_read_only(pod) -> None:
    await pod.run("app", "sleep", "600")
    status, out = await pod.sh("app", "cat /proc/self/mountinfo; wc -c < /proc/timer_list; ls /sys/firmware | wc -l")
    lines = out.splitlines()
    assert status == 0 and lines[-2:] == ["0", "0"]
    mountinfo = "\n".join(lines[:-2])
    for path in ("/sys", "/proc/sys", "/proc/bus"):
        assert "ro" in mount_options(mountinfo, path), path
    assert "rw" in mount_options(mountinfo, "/proc")


async def test_masked_and_readonly_paths_given_replace_the_defaults(pod, tmp_path) -> None:
    tree = a_tree(tmp_path / "tree")
    await pod.run("app", "sleep", "600", rootfs=overlay(tmp_path, tree), env=["PATH=/bin"],
                  masked_paths=["/etc/marker", "/data"], readonly_paths=["/tmp"])
    status, out = await pod.sh("app", "wc -c < /etc/marker; touch /data/x /tmp/x 2>&1; wc -c < /proc/timer_list")
    lines = out.splitlines()
    assert lines[0] == "0" and len([line for line in lines if "Read-only file system" in line]) == 2
    assert lines[-1] != "0"  # /proc/timer_list is not masked any more


async def test_privileged_has_no_masked_paths_a_writable_sys_and_the_hosts_devices(pod) -> None:
    devices = {f"{name} {st.st_rdev}" for name, st in ((name, os.lstat(f"/dev/{name}")) for name in os.listdir("/dev"))
               if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)} - {f"{n} {os.lstat('/dev/' + n).st_rdev}"
                                                                          for n in ("console", "ptmx")}
    dev_before = os.listdir("/dev")
    await pod.run("app", "sleep", "600", privileged=True)
    status, out = await pod.sh("app", "cat /proc/self/mountinfo; cd /dev; for d in *; do "
                                      "[ ! -L $d ] && [ -c $d -o -b $d ] && echo DEV $d $(stat -c '%t %T' $d); done")
    assert status == 0, out
    assert "rw" in mount_options(out, "/sys")
    assert not any(line.split()[4] in ("/proc/timer_list", "/proc/sys") for line in out.splitlines()
                   if not line.startswith("DEV "))
    inside = {f"{name} {os.makedev(int(major, 16), int(minor, 16))}"
              for _, name, major, minor in (line.split() for line in out.splitlines() if line.startswith("DEV "))}
    assert inside == devices
    assert os.listdir("/dev") == dev_before  # nothing made in the host's /dev


# -- mounts ---------------------------------------------------------------------------------

async def test_mounts_are_bound_read_write_or_read_only_and_their_destinations_made(pod, tmp_path) -> None:
    tree = a_tree(tmp_path / "tree")
    (tmp_path / "rw").mkdir()
    (tmp_path / "ro").mkdir()
    (tmp_path / "file").write_text("a file\n")
    await pod.run("app", "sleep", "600", rootfs=overlay(tmp_path, tree), env=["PATH=/bin"], mounts=[
        {"destination": "/data", "source": str(tmp_path / "rw")},
        {"destination": "/new/dir", "source": str(tmp_path / "ro"), "options": ["ro"]},
        {"destination": "/new/file", "source": str(tmp_path / "file"), "options": ["ro", "rbind"]},
    ])
    status, out = await pod.sh("app", "touch /data/written && cat /new/file && touch /new/dir/x 2>&1")
    assert status != 0 and out.splitlines() == ["a file", "touch: /new/dir/x: Read-only file system"]
    assert (tmp_path / "rw" / "written").exists()


async def test_a_tmpfs_mount_is_a_new_tmpfs_with_its_flags_and_size_and_mounts_below_it_are_made_in_it(pod,
                                                                                                       tmp_path) -> None:
    tree = a_tree(tmp_path / "tree")
    (tmp_path / "vol").mkdir()
    await pod.run("app", "sleep", "600", rootfs=overlay(tmp_path, tree), env=["PATH=/bin"], mounts=[
        {"destination": "/run", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "nodev", "strictatime", "mode=1777", "size=1m"]},
        {"destination": "/run/vol", "source": str(tmp_path / "vol")},
        {"destination": "/frozen", "type": "tmpfs", "options": ["ro"]},
    ])
    status, out = await pod.sh("app", "touch /run/written && grep -E ' /(run|frozen) ' /proc/self/mountinfo && "
                                      "ls /run && stat -c %a /run && touch /frozen/x 2>&1")
    lines = out.splitlines()
    assert status != 0 and lines[-1] == "touch: /frozen/x: Read-only file system", out
    run, frozen = (line.split() for line in lines[:2])
    assert run[4] == "/run" and {"nosuid", "nodev"} <= set(run[5].split(","))
    assert run[run.index("-") + 1] == "tmpfs" and "size=1024k" in run[-1]
    assert frozen[4] == "/frozen" and "ro" in frozen[5].split(",")
    assert lines[2:5] == ["vol", "written", "1777"]  # the bind below it made in it; nothing of the image's
    assert not (tmp_path / "tree" / "run" / "written").exists()


async def test_a_mount_destination_of_a_task_without_a_rootfs_is_made_in_its_own_root(pod, tmp_path) -> None:
    (tmp_path / "marker").write_text("mounted\n")
    await pod.run("app", "/bin/busybox", "sleep", "600", rootfs=[],
                  mounts=[BUSYBOX_MOUNT, {"destination": "/no/such/dir", "source": str(tmp_path)}])
    reply = await pod.call("Exec", task_id="app", args=["/bin/busybox", "cat", "/no/such/dir/marker"])
    assert (reply["exit_status"], reply["stdout"]) == (0, b"mounted\n")
    assert not os.path.exists("/no/such")


@pytest.mark.parametrize("propagation, appears", [("rslave", True), ("rshared", True), ("rprivate", False)])
async def test_a_mount_made_on_the_host_below_a_source_appears_inside_as_its_propagation_says(
        pod, tmp_path, propagation, appears) -> None:
    source = tmp_path / "source"
    (source / "sub").mkdir(parents=True)
    with shared_mount(str(source)):
        await pod.run("app", "sleep", "600", rootfs=overlay(tmp_path, a_tree(tmp_path / "tree")), env=["PATH=/bin"],
                      mounts=[{"destination": "/data", "source": str(source), "options": ["rbind", propagation]}])
        with tmpfs_on(str(source / "sub")):
            status, out = await pod.sh("app", "cat /proc/self/mountinfo")
            assert (" /data/sub " in out) is appears
        await pod.end("app")


async def test_a_mount_made_inside_below_an_rshared_bind_appears_on_the_host(pod, tmp_path) -> None:
    """critest's "mount propagation: rshared": what the task mounts below a bidirectional bind
    reaches the host (and is unmounted there again by the test)."""
    source = tmp_path / "source"
    (source / "sub").mkdir(parents=True)
    with shared_mount(str(source)):
        try:
            await pod.run("app", "sleep", "600", rootfs=overlay(tmp_path, a_tree(tmp_path / "tree")),
                          env=["PATH=/bin"], capabilities=[*DEFAULT_CAPABILITIES, "CAP_SYS_ADMIN"],
                          mounts=[{"destination": "/data", "source": str(source), "options": ["rbind", "rshared"]}])
            status, out = await pod.sh("app", "mount -t tmpfs made-inside /data/sub && touch /data/sub/inside")
            assert status == 0, out
            assert (source / "sub" / "inside").exists()
            assert any(line.split()[4] == str(source / "sub") for line in host_mountinfo().splitlines())
            await pod.end("app")
        finally:
            while any(line.split()[4] == str(source / "sub") for line in host_mountinfo().splitlines()):
                linux.umount2(str(source / "sub"), linux.MNT_DETACH)


# -- what is undone -------------------------------------------------------------------------------

async def test_delete_unmounts_the_rootfs_and_removes_its_directory(pod, tmp_path) -> None:
    await pod.run("app", "sleep", "600", rootfs=overlay(tmp_path, a_tree(tmp_path / "tree")), env=["PATH=/bin"])
    assert pod.mounted()
    await pod.end("app")
    assert pod.mounted() == [] and not os.path.exists(os.path.dirname(pod.rootfs("app")))


async def test_shutdown_unmounts_the_rootfs_of_tasks_not_deleted(pod, tmp_path) -> None:
    await pod.run("app", "sleep", "600", rootfs=overlay(tmp_path, a_tree(tmp_path / "tree")), env=["PATH=/bin"])
    await pod.shim.call("ShutdownSandbox")
    assert pod.mounted() == [] and not os.path.exists(os.path.dirname(pod.rootfs("app")))


async def test_a_rootfs_that_cannot_be_mounted_fails_create_and_leaves_nothing(pod, tmp_path) -> None:
    rootfs = [{"type": "overlay", "source": "overlay", "options": [f"lowerdir={tmp_path}/no-such"]}]
    with pytest.raises(FailedPrecondition, match=r"cannot mount rootfs\[0\] \(overlay overlay\)"):
        await pod.call("Create", task_id="app", args=["true"], log_path=f"{pod.log_dir}/app.log", rootfs=rootfs)
    assert pod.mounted() == [] and not os.path.exists(os.path.dirname(pod.rootfs("app")))
    assert (await pod.call("List"))["tasks"] == []


async def test_podshim_delete_after_a_shim_crash_unmounts_the_rootfs(pod, tmp_path) -> None:
    await pod.run("app", "sleep", "600", rootfs=overlay(tmp_path, a_tree(tmp_path / "tree")), env=["PATH=/bin"])
    assert pod.shim.record()["tasks"]["app"]["rootfs"] == pod.rootfs("app")
    pod.shim.process.kill()
    await pod.shim.process.exited()
    result = await asyncio.to_thread(pod.shim.delete)
    assert result.returncode == 0, result.stderr
    assert pod.mounted() == [] and not os.path.exists(pod.rootfs("app"))
    assert pod.shim.record()["tasks"]["app"]["rootfs"] == ""


# -- the wire -------------------------------------------------------------------------------------

@pytest.mark.parametrize("fields, sentence", [
    ({"rootfs": {"type": "bind"}}, "field 'rootfs' must be an array"),
    ({"rootfs": [{"source": "/x"}]}, r"field 'rootfs\[0\].type' must be a non-empty string"),
    ({"rootfs": [{"type": "bind", "source": "x"}]}, r"rootfs\[0\].source' of a bind must be an absolute path"),
    ({"readonly_rootfs": "yes"}, "field 'readonly_rootfs' must be true or false"),
    ({"mounts": [{"destination": "/d", "source": "/s", "type": "proc"}]}, r"mounts\[0\].type' 'proc' is not supp"),
    ({"mounts": [{"destination": "/d", "type": "tmpfs", "options": ["rshared"]}]},
     r"'mounts\[0\].options' has 'rshared', not a tmpfs option"),
    ({"mounts": [{"destination": "d", "source": "/s"}]}, r"mounts\[0\].destination' must be an absolute path"),
    ({"mounts": [{"destination": "/d", "source": "/s/../etc"}]}, r"mounts\[0\].source' must be an absolute path"),
    ({"mounts": [{"destination": "/d", "source": "/s", "options": ["rnoexec"]}]}, r"'mounts\[0\].options' has 'rnoexec'"),
    ({"masked_paths": ["proc/kcore"]}, r"field 'masked_paths\[0\]' must be an absolute path"),
    ({"readonly_paths": "/proc/sys"}, "field 'readonly_paths' must be an array"),
    ({"privileged": 1}, "field 'privileged' must be true or false"),
])
async def test_a_malformed_filesystem_field_is_invalid_argument_naming_it(shim, tmp_path, fields, sentence) -> None:
    await shim.run_sandbox()
    with pytest.raises(InvalidArgument, match=sentence):
        await shim.client.call(TASK_SERVICE, "Create", {"sandbox_id": shim.sandbox_id, "task_id": "app",
                                                        "args": ["true"], "log_path": f"{tmp_path}/app.log", **fields},
                               timeout=WAIT)

