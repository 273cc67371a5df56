"""Paths inside a container are resolved inside its root, on every runtime handler: a mount's
destination, the pod's /etc files and the working directory, through the symbolic links an image
carries (to /proc/self/root/..., to /proc/1/root/..., to the host's directories, to ``/``) or a
volume carries, never reach the host's filesystem; a destination that is the root itself is
INVALID_ARGUMENT with a sentence.

The image is a layer written here (tests/support/layertools.py) and unpacked by podshim's own unpacker,
an overlay's lower layer as a snapshotter gives it; the tasks run through a real shim (and, for
the pod's files and the log path, through the pod layer), and what they must not reach (a
directory of the host, named by the image's links) is compared before and after."""

from __future__ import annotations

import asyncio
import errno
import os
import time

import pytest

from shim.lib.rootfs import open_in_root
from shim.rpc import FailedPrecondition, InvalidArgument, RpcError

from client.cri.rootfs import ContainerImage, image_not_found
from client.images.snapshots import Mount
from client.images.unpack import apply_layer

from support.layertools import make_layer, member
from support.podtools import (
    container_config,
    pod_config,
    pod_service,
    roots,  # noqa: F401  (the fixture)
)
from support.shimtools import (
    HANDLERS,
    WAIT,
    ShimLauncher,
    host_untouched,  # noqa: F401  (autouse: what this module's shims made is checked at the end)
    shims,  # noqa: F401  (the fixture)
)

BUSYBOX = "/bin/busybox"
TOOLS = ("sh", "cat", "ls", "touch", "pwd", "sleep")


class Pod:
    """A running sandbox of one handler, its tasks made from the hostile image."""

    def __init__(self, shim, handler: str, tmp_path):
        self.shim, self.handler, self.tmp_path = shim, handler, tmp_path
        self.host = tmp_path / "host"  # what the image's links name: it must stay as it is
        self.host.mkdir()
        (self.host / "marker").write_text("the host's\n")
        self.rootfs = hostile_image(tmp_path, str(self.host))
        (tmp_path / "logs").mkdir()

    def host_tree(self) -> list[str]:
        return sorted(os.path.relpath(os.path.join(d, name), self.host)
                      for d, dirs, files in os.walk(self.host) for name in dirs + files)

    async def run(self, task_id: str, script: str, **fields) -> None:
        """Create and start a task of the image running ``script``, kept running by a sleep."""
        upper = self.tmp_path / task_id
        for name in ("upper", "work"):
            (upper / name).mkdir(parents=True)
        rootfs = [{"type": "overlay", "source": "overlay",
                   "options": [f"lowerdir={self.rootfs}", f"upperdir={upper / 'upper'}", f"workdir={upper / 'work'}"]}]
        log = self.tmp_path / "logs" / f"{task_id}.log"
        await self.shim.task("Create", task_id=task_id, args=["sh", "-c", f"{script}; echo ran; exec sleep 600"],
                             env=["PATH=/bin"], rootfs=rootfs, log_path=str(log), **fields)
        await self.shim.task("Start", task_id=task_id)
        deadline = time.monotonic() + WAIT
        while not log.read_text().endswith(" ran\n"):  # the script has run
            assert time.monotonic() < deadline, log.read_text()
            await asyncio.sleep(0.01)

    async def started(self, task_id: str, script: str, **fields) -> bool:
        """Whether the task started; an OCI runtime may refuse a path instead of resolving it in
        the root (crun's openat2 refuses a link through /proc with EXDEV), the native launcher not."""
        try:
            await self.run(task_id, script, **fields)
        except RpcError:
            if self.handler == "native":
                raise
            return False
        return True

    async def sh(self, task_id: str, script: str) -> str:
        reply = await self.shim.task("Exec", task_id=task_id, args=["sh", "-c", script])
        out = (reply["stdout"] + reply["stderr"]).decode()
        assert reply["exit_status"] == 0, out
        return out


def hostile_image(tmp_path, host: str) -> str:
    """The image's one layer unpacked: busybox, and links out of the root to ``host``."""
    with open(BUSYBOX, "rb") as f:
        busybox = f.read()
    layer = make_layer(str(tmp_path / "layer"), [
        member("bin", "dir"), member("bin/busybox", data=busybox, mode=0o755),
        *(member(f"bin/{tool}", "symlink", link="busybox") for tool in TOOLS),
        member("magic", "symlink", link=f"/proc/self/root{host}"),  # the launcher's own root: the host's
        member("pause-root", "symlink", link=f"/proc/1/root{host}"),  # the pause's root (POD pid mode)
        member("etc", "symlink", link=f"/proc/self/root{host}/etc"),
        member("to-root", "symlink", link="/"),
        member("up-to-root", "symlink", link="bin/../.."),
    ])
    dest = tmp_path / "image"
    dest.mkdir()
    apply_layer(str(dest), layer.path, layer.media_type, diff_id=layer.diff_id)
    return str(dest)


@pytest.fixture(params=HANDLERS)
async def pod(request, shims: ShimLauncher, tmp_path) -> Pod:  # noqa: F811  (shims: the imported fixture)
    shim = await shims.start()
    await shim.run_sandbox(options={"runtime_handler": request.param})
    return Pod(shim, request.param, tmp_path)


def volume(tmp_path, name: str, **links: str) -> str:
    path = tmp_path / name
    path.mkdir()
    (path / "file").write_text(f"{name}'s file\n")
    for link, target in links.items():
        os.symlink(target, path / link)
    return str(path)


async def test_a_mount_target_through_a_link_to_proc_self_root_stays_in_the_root(pod, tmp_path) -> None:
    before = pod.host_tree()
    started = await pod.started("app", "true",
                                mounts=[{"destination": "/magic/made/vol", "source": volume(tmp_path, "vol")}])
    assert pod.host_tree() == before  # nothing made on the host
    if started:
        assert await pod.sh("app", "cat /magic/made/vol/file") == "vol's file\n"


@pytest.mark.parametrize("link", ["out", "magic", "up"])
async def test_a_mount_below_a_volume_whose_link_points_to_the_hosts_paths_stays_in_the_root(pod, tmp_path, link) -> None:
    before = pod.host_tree()
    targets = {"out": str(pod.host), "magic": f"/proc/self/root{pod.host}", "up": f"../../../../../../../../..{pod.host}"}
    outer = volume(tmp_path, "outer", **{link: targets[link]})
    started = await pod.started("app", "true", mounts=[
        {"destination": "/outer", "source": outer},
        {"destination": f"/outer/{link}/made/inner", "source": volume(tmp_path, "inner")}])
    assert pod.host_tree() == before
    assert sorted(os.listdir(outer)) == ["file", link]  # the volume as it was, too
    if started:
        assert await pod.sh("app", f"cat /outer/{link}/made/inner/file") == "inner's file\n"


async def test_the_pods_etc_files_through_an_etc_link_stay_in_the_root(pod, tmp_path) -> None:
    files = tmp_path / "pod-files"
    files.mkdir()
    for name in ("hosts", "resolv.conf", "hostname"):
        (files / name).write_text(f"the pod's {name}\n")
    before = pod.host_tree()
    started = await pod.started("app", "true", mounts=[{"destination": f"/etc/{name}", "source": str(files / name)}
                                                       for name in ("hosts", "resolv.conf", "hostname")])
    assert pod.host_tree() == before
    if started:
        assert await pod.sh("app", "cat /etc/hosts /etc/resolv.conf /etc/hostname") == (
            "the pod's hosts\nthe pod's resolv.conf\nthe pod's hostname\n")


async def test_a_working_dir_through_proc_1_root_is_never_the_hosts(pod) -> None:
    before = pod.host_tree()
    try:
        await pod.run("app", "touch made-in-the-working-dir", cwd="/pause-root", pid_mode="POD")
    except RpcError as exc:
        refused: RpcError | None = exc
    else:
        refused = None
    assert pod.host_tree() == before
    if pod.handler == "native":  # a magic link is refused; under runc and crun the pause has a root of its own
        assert isinstance(refused, FailedPrecondition)
        assert "chdir /pause-root: Too many levels of symbolic links" in str(refused)


@pytest.mark.parametrize("destination", ["/to-root", "/up-to-root", "/to-root/to-root"])
async def test_a_mount_target_that_resolves_to_the_root_is_invalid_argument(pod, tmp_path, destination) -> None:
    with pytest.raises(InvalidArgument, match=f"mount destination {destination} resolves to the task's root itself"):
        await pod.run("app", "true", mounts=[{"destination": destination, "source": volume(tmp_path, "vol")}])


async def test_a_mount_target_through_a_volumes_link_to_the_root_is_invalid_argument(pod, tmp_path) -> None:
    outer = volume(tmp_path, "outer", root="/", up="../..")
    for link in ("root", "up"):
        with pytest.raises(InvalidArgument, match=f"mount destination /outer/{link} resolves to the task's root itself"):
            await pod.run(link, "true", mounts=[{"destination": "/outer", "source": outer},
                                                {"destination": f"/outer/{link}", "source": volume(tmp_path, link)}])


# -- through the pod layer ---------------------------------------------------------------------

class HostileImages:
    """The pod layer's image store and snapshotter, with one image: the hostile one, each
    container's root an overlay of it."""

    def __init__(self, tmp_path, lower: str):
        self.tmp_path, self.lower = tmp_path, lower
        self.image = ContainerImage(image_id="sha256:" + "a" * 64, name="registry.test/hostile:1",
                                    image_ref="registry.test/hostile@sha256:" + "b" * 64,
                                    chain_id="sha256:" + "c" * 64, config={"Env": ["PATH=/bin"]})

    def container_image(self, reference: str) -> ContainerImage:
        if reference != self.image.name:
            raise image_not_found(reference)
        return self.image

    async def prepare(self, key: str, chain_id: str) -> list[Mount]:
        for name in ("upper", "work"):
            (self.tmp_path / key / name).mkdir(parents=True)
        return [Mount("overlay", "overlay", (f"lowerdir={self.lower}", f"upperdir={self.tmp_path / key / 'upper'}",
                                             f"workdir={self.tmp_path / key / 'work'}"))]

    def remove(self, key: str) -> None:
        pass

    def read_file(self, chain_id: str, path: str) -> bytes:
        raise FileNotFoundError(path)


@pytest.fixture(params=HANDLERS)
def handler(request) -> str:
    return request.param


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def tree(path) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, name), path) for d, dirs, files in os.walk(path)
                  for name in dirs + files)


async def test_the_pods_files_through_the_images_etc_link_stay_in_the_root(handler, roots, tmp_path) -> None:  # noqa: F811  (roots: the imported fixture)
    host = tmp_path / "host"
    host.mkdir()
    images = HostileImages(tmp_path, hostile_image(tmp_path, str(host)))
    cfg = pod_config()
    cfg["hostname"] = "web-0"
    async with pod_service(roots, images=images, snapshots=images) as pods:
        pod_id = await pods.run_pod_sandbox(cfg, runtime_handler=handler)
        container = {**container_config(["sh", "-c", "cat /etc/hostname; exec sleep 600"]),
                     "image": {"image": images.image.name}}
        try:
            cid = await pods.create_container(pod_id, container)
            await pods.start_container(cid)
        except RpcError:
            if handler == "native":
                raise
            cid = ""  # crun refuses the link through /proc
        assert tree(host) == []  # nothing made on the host
        if cid:
            deadline = time.monotonic() + WAIT
            while "web-0" not in read(pods.container_log_path(cid)):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
        assert tree(host) == []


async def test_a_log_path_through_a_link_in_the_pods_log_directory_is_refused(roots, tmp_path) -> None:  # noqa: F811  (roots: the imported fixture)
    host = tmp_path / "host"
    host.mkdir()
    images = HostileImages(tmp_path, hostile_image(tmp_path, str(host)))
    logs = tmp_path / "logs"
    logs.mkdir()
    os.symlink(host, logs / "out")
    cfg = pod_config()
    cfg["log_directory"] = str(logs)
    async with pod_service(roots, images=images, snapshots=images) as pods:
        pod_id = await pods.run_pod_sandbox(cfg)
        container = {**container_config(["sh", "-c", "echo written; exec sleep 600"], name="app"),
                     "image": {"image": images.image.name}, "log_path": "out/sub/app.log"}
        refused: RpcError | None = None
        try:
            await pods.start_container(await pods.create_container(pod_id, container))
        except RpcError as exc:
            refused = exc
        assert tree(host) == []  # nothing made or written on the host
        assert isinstance(refused, InvalidArgument)
        assert "log_path 'out/sub/app.log' goes through a symbolic link in the pod's log directory" in str(refused)


# -- the walk itself (shim.lib.rootfs.open_in_root) -------------------------------------------

def walk(root, path: str, make: str = "", **kwargs) -> str:
    """Where ``path`` resolves inside ``root`` (made as ``make`` says), as a path relative to it."""
    root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        fd = open_in_root(root_fd, path, make, **kwargs)
    finally:
        os.close(root_fd)
    try:
        return os.path.relpath(os.readlink(f"/proc/self/fd/{fd}"), root)
    finally:
        os.close(fd)


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "usr" / "lib").mkdir(parents=True)
    os.symlink("../run/systemd/resolve/stub-resolv.conf", root / "etc" / "resolv.conf")  # dangling, as in images
    os.symlink("/usr/lib", root / "lib")
    os.symlink("../../../../..", root / "usr" / "up")
    os.symlink("loop", root / "loop")
    return root


@pytest.mark.parametrize("path, where", [
    ("/lib/x", "usr/lib/x"),  # an absolute link, from the root
    ("/usr/up/etc", "etc"),  # '..' never above the root
    ("/usr/lib/../../etc", "etc"),
    ("/./etc/", "etc"),
])
def test_links_and_dot_dot_resolve_inside_the_root(root, path, where) -> None:
    (root / "usr" / "lib" / "x").mkdir()
    assert walk(root, path) == where


def test_a_dangling_links_target_is_made_inside_the_root(root) -> None:
    assert walk(root, "/etc/resolv.conf", "file") == "run/systemd/resolve/stub-resolv.conf"
    assert (root / "run" / "systemd" / "resolve" / "stub-resolv.conf").is_file()


def test_missing_directories_are_made_only_when_asked(root) -> None:
    with pytest.raises(FileNotFoundError):
        walk(root, "/lib/new/dir")
    assert not (root / "usr" / "lib" / "new").exists()
    assert walk(root, "/lib/new/dir", "dir") == "usr/lib/new/dir" and (root / "usr" / "lib" / "new" / "dir").is_dir()


def test_a_link_loop_and_the_root_itself_are_errors(root) -> None:
    with pytest.raises(OSError) as loop:
        walk(root, "/loop/x")
    assert loop.value.errno == errno.ELOOP
    with pytest.raises(OSError, match="resolves to the task's root itself") as at_root:
        walk(root, "/usr/up")
    assert at_root.value.errno == errno.EINVAL


def test_the_sources_of_mounts_not_made_yet_stand_in_for_their_destinations(root, tmp_path) -> None:
    volume = tmp_path / "volume"
    (volume / "inside").mkdir(parents=True)
    os.symlink("/", volume / "to-root")
    resolved: list[str] = []
    assert walk(root, "/lib/vol/inside", sources={"/usr/lib/vol": str(volume)}, resolved=resolved) == (
        os.path.relpath(volume / "inside", root))
    assert resolved == ["usr", "lib", "vol", "inside"]
    with pytest.raises(OSError, match="resolves to the task's root itself"):
        walk(root, "/usr/lib/vol/to-root", sources={"/usr/lib/vol": str(volume)})
