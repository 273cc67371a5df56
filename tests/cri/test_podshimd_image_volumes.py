"""Image volumes through the real crictl and podshimd: a container's mount of an image (CRI
``Mount.image``) shows the image's files read-only, or its directory ``image_sub_path`` (resolved
inside the image), on every runtime handler; RemoveImage is refused while a container mounts the
image; in a pod with a user namespace, the image's files show their owners as in the image;
the pod's volume is kept while a container uses it and released with the last one, also
after a podshimd that died in the middle of a CreateContainer; nothing is left (mounts, snapshots,
directories)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator

import grpc
import pytest

from support.critools import Podshimd, private_podshimd, running_podshimd
from support.imagebuild import Entry
from support.podtools import container_config, pod_config
from support.shimtools import HANDLERS

#: The files of the volume image: two layers over none (an overlay of lower layers alone).
VOLUME_LAYERS = [
    {"data/hello.txt": "hello from the image\n", "inside/marker": "the image's own\n"},
    [Entry("data/up", "symlink", target="/../../../../inside"), Entry("data/more/deep.txt", data=b"deep\n"),
     Entry("data/owned", data=b"not root's\n", uid=1000, gid=2000)],
]
#: The mappings of a pod's user namespace (kubelet's for ``hostUsers: false``): a range no other test's pod is given.
USERNS_MAPPING = [{"container_id": 0, "host_id": 3_000_000 + (os.getpid() % 500) * 65536, "length": 65536}]


@pytest.fixture(scope="module")
def volume_daemon(test_images) -> Iterator[Podshimd]:
    """A podshimd under a private directory (removed afterwards), with the tests' busybox pulled."""
    with private_podshimd("psd-iv-", test_images.busybox) as daemon:
        yield daemon


@pytest.fixture
def daemon(volume_daemon, crictl) -> Iterator[Podshimd]:
    yield volume_daemon
    volume_daemon.remove_every_pod(crictl)
    assert leftovers(volume_daemon) == ([], [], [])


@pytest.fixture(scope="module")
def images(test_images) -> dict:
    """The volume images: ``layered`` (two layers, no base) and ``single`` (one layer)."""
    return {"layered": test_images.build("volume-layered", VOLUME_LAYERS, base=None),
            "single": test_images.build("volume-single", [{"only/one.txt": "one layer\n"}], base=None)}


def pull(daemon: Podshimd, crictl: str, image) -> str:
    """Pull ``image`` as kubelet does before CreateContainer; its id (what kubelet sends in Mount.image)."""
    daemon.crictl(crictl, "pull", image.ref)
    return json.loads(daemon.crictl(crictl, "inspecti", image.ref).stdout)["status"]["id"]


def leftovers(daemon: Podshimd) -> tuple[list[str], list[str], list[str]]:
    """What image volumes left: mounts under the state root's image-volumes (in this mount
    namespace, podshimd's), their directories, and their snapshot records."""
    root = os.path.join(daemon.state_root, "image-volumes")
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split()[4] for line in f if line.split()[4].startswith(root + "/")]
    directories = [os.path.join(pod, name) for pod in (os.listdir(root) if os.path.isdir(root) else [])
                   for name in os.listdir(os.path.join(root, pod))]
    active = os.path.join(daemon.state_root, "images", "snapshots", "metadata", "active")
    snapshots = []
    for name in os.listdir(active) if os.path.isdir(active) else []:
        with open(os.path.join(active, name)) as f:
            key = json.load(f)["name"]
        if key.startswith("imagevolume-"):
            snapshots.append(key)
    return mounts, directories, snapshots


def run_pod(daemon: Podshimd, crictl: str, tmp_path, handler: str = "native", userns: bool = False
            ) -> tuple[str, str]:
    """A pod of ``handler``, in a user namespace of :data:`USERNS_MAPPING` with ``userns``."""
    config = pod_config()
    if userns:
        config["linux"]["security_context"]["namespace_options"]["userns_options"] = {
            "mode": 0, "uids": USERNS_MAPPING, "gids": USERNS_MAPPING}
    path = tmp_path / "pod.json"
    path.write_text(json.dumps(config))
    return daemon.crictl(crictl, "runp", "--runtime", handler, str(path)).stdout.strip(), str(path)


def volume(image_id: str, path: str = "/vol", sub_path: str = "", readonly: bool = True) -> dict:
    return {"container_path": path, "readonly": readonly, "image": {"image": image_id},
            **({"image_sub_path": sub_path} if sub_path else {})}


def create(daemon: Podshimd, crictl: str, tmp_path, pod: tuple[str, str], *mounts: dict, name: str = "c") -> str:
    config = {**container_config(["sleep", "600"], name=name), "image": {"image": daemon.image},
              "mounts": list(mounts)}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(config))
    return daemon.crictl(crictl, "create", pod[0], str(path), pod[1]).stdout.strip()


def refused(daemon: Podshimd, pod: tuple[str, str], *mounts: dict) -> grpc.RpcError:
    config = {**container_config(["sleep", "600"]), "mounts": list(mounts)}
    with pytest.raises(grpc.RpcError) as raised:
        daemon.create_container(pod[0], config, pod[1])
    return raised.value


def sh(daemon: Podshimd, crictl: str, container_id: str, script: str, check: bool = True):
    return daemon.crictl(crictl, "exec", "-s", container_id, "sh", "-c", script, check=check)


@pytest.mark.parametrize("handler", HANDLERS)
@pytest.mark.parametrize("kind", ["layered", "single"])
def test_a_container_sees_the_image_files_read_only_and_nothing_is_left_after_it(daemon, crictl, images, tmp_path,
                                                                                handler, kind) -> None:
    image_id = pull(daemon, crictl, images[kind])
    pod = run_pod(daemon, crictl, tmp_path, handler)
    container_id = create(daemon, crictl, tmp_path, pod, volume(image_id))
    daemon.crictl(crictl, "start", container_id)
    wanted = "hello from the image" if kind == "layered" else "one layer"
    shown = sh(daemon, crictl, container_id, "cat /vol/data/hello.txt /vol/only/one.txt 2>/dev/null; true").stdout
    assert shown.strip() == wanted
    write = sh(daemon, crictl, container_id, "touch /vol/new", check=False)
    assert write.returncode != 0 and "Read-only file system" in write.stderr
    [mount] = json.loads(daemon.crictl(crictl, "inspect", container_id).stdout)["status"]["mounts"]
    assert mount["image"]["image"] == image_id and mount["image"]["imageRef"] == image_id
    mounted, directories, snapshots = leftovers(daemon)
    assert len(mounted) == len(directories) == len(snapshots) == 1
    daemon.crictl(crictl, "rm", "-f", container_id)
    assert leftovers(daemon) == ([], [], [])
    daemon.crictl(crictl, "rmp", "-f", pod[0])


@pytest.mark.parametrize("handler", HANDLERS)
def test_image_sub_path_mounts_a_directory_of_the_image_and_links_stay_inside_it(daemon, crictl, images, tmp_path,
                                                                                 handler) -> None:
    image_id = pull(daemon, crictl, images["layered"])
    pod = run_pod(daemon, crictl, tmp_path, handler)
    container_id = create(daemon, crictl, tmp_path, pod, volume(image_id, "/data", "data"),
                          volume(image_id, "/linked", "data/up"), volume(image_id, "/root-again", "data/.."))
    daemon.crictl(crictl, "start", container_id)
    assert sh(daemon, crictl, container_id, "cat /data/hello.txt /data/more/deep.txt").stdout.strip() == \
        "hello from the image\ndeep"
    # data/up is a link to /../../../../inside: resolved in the image's root, never the node's.
    assert sh(daemon, crictl, container_id, "cat /linked/marker").stdout.strip() == "the image's own"
    assert sh(daemon, crictl, container_id, "ls /root-again").stdout.split() == ["data", "inside"]
    assert len(leftovers(daemon)[0]) == 1  # one volume of the image for the pod, bound three times


@pytest.mark.parametrize("sub_path, sentence", [
    ("missing", "image_sub_path 'missing' of image volume {id!r} does not exist in the image"),
    ("data/hello.txt", "image_sub_path 'data/hello.txt' of image volume {id!r} is not a directory of the image"),
])
def test_a_sub_path_that_is_no_directory_of_the_image_is_invalid(daemon, crictl, images, tmp_path, sub_path,
                                                                 sentence) -> None:
    image_id = pull(daemon, crictl, images["layered"])
    pod = run_pod(daemon, crictl, tmp_path)
    error = refused(daemon, pod, volume(image_id, sub_path=sub_path))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert sentence.format(id=image_id) in error.details()
    assert daemon.crictl(crictl, "ps", "-a", "-q").stdout.split() == []
    assert leftovers(daemon) == ([], [], [])


def test_an_image_not_on_the_node_and_a_writable_image_volume_are_refused(daemon, crictl, images, tmp_path) -> None:
    pod = run_pod(daemon, crictl, tmp_path)
    error = refused(daemon, pod, volume("sha256:" + "e" * 64))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert f"image 'sha256:{'e' * 64}' not found: pull it first" in error.details()
    image_id = pull(daemon, crictl, images["single"])
    error = refused(daemon, pod, volume(image_id, readonly=False))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "is an image volume" in error.details() and "readonly must be true" in error.details()
    error = refused(daemon, pod, {**volume(image_id), "host_path": "/tmp"})
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "an image volume has no host path" in error.details()


def test_remove_image_is_refused_while_a_container_mounts_it_and_the_volume_goes_with_its_last_user(
        daemon, crictl, images, tmp_path) -> None:
    image = images["single"]
    image_id = pull(daemon, crictl, image)
    pod = run_pod(daemon, crictl, tmp_path)
    first = create(daemon, crictl, tmp_path, pod, volume(image_id), name="first")
    second = create(daemon, crictl, tmp_path, pod, volume(image_id, "/again"), name="second")
    assert len(leftovers(daemon)[0]) == 1  # one volume per pod and image
    rmi = daemon.crictl(crictl, "rmi", image.ref, check=False)
    assert rmi.returncode != 0 and "code = FailedPrecondition" in rmi.stderr
    assert f"in use by container {first} as its image volume at /vol; remove the container first" in rmi.stderr
    daemon.crictl(crictl, "rm", first)
    assert len(leftovers(daemon)[0]) == 1  # kept for the second
    daemon.crictl(crictl, "start", second)
    assert sh(daemon, crictl, second, "cat /again/only/one.txt").stdout.strip() == "one layer"
    daemon.crictl(crictl, "rm", "-f", second)
    assert leftovers(daemon) == ([], [], [])
    daemon.crictl(crictl, "rmi", image.ref)


def test_a_pods_removal_releases_its_volumes(daemon, crictl, images, tmp_path) -> None:
    image_id = pull(daemon, crictl, images["layered"])
    pod = run_pod(daemon, crictl, tmp_path)
    daemon.crictl(crictl, "start", create(daemon, crictl, tmp_path, pod, volume(image_id)))
    daemon.crictl(crictl, "rmp", "-f", pod[0])
    assert leftovers(daemon) == ([], [], [])


@pytest.mark.parametrize("userns", [False, True], ids=["host-users", "userns"])
def test_volumes_in_use_survive_a_restart_and_a_dead_creates_volume_is_released(test_images, images, crictl,
                                                                               tmp_path, userns) -> None:
    directory = tempfile.mkdtemp(prefix="psd-ivr-")
    try:
        with running_podshimd(directory, image=test_images.busybox) as daemon:
            image_id = pull(daemon, crictl, images["layered"])
            other_id = pull(daemon, crictl, images["single"])
            pod = run_pod(daemon, crictl, tmp_path, userns=userns)
            kept = create(daemon, crictl, tmp_path, pod, volume(image_id))
            daemon.crictl(crictl, "start", kept)
        # A podshimd that dies in CreateContainer, after the volume is mounted and before its task is.
        with running_podshimd(directory, env={"PODSHIM_FAILPOINT": "create:after-rootfs"}) as daemon:
            daemon.image = test_images.busybox.ref
            with pytest.raises(AssertionError):
                create(daemon, crictl, tmp_path, pod, volume(other_id, "/other"), name="dies")
            assert daemon.process.wait(timeout=60) < 0
            assert len(leftovers(daemon)[0]) == 2
        with running_podshimd(directory) as daemon:
            daemon.image = test_images.busybox.ref
            mounted, _, snapshots = leftovers(daemon)
            assert len(mounted) == len(snapshots) == 1 and snapshots[0].endswith(image_id.partition(":")[2])
            assert sh(daemon, crictl, kept, "cat /vol/data/hello.txt").stdout.strip() == "hello from the image"
            assert sh(daemon, crictl, kept, "stat -c %u:%g /vol/data/owned").stdout.split("\n")[0] == "1000:2000"
            rmi = daemon.crictl(crictl, "rmi", images["layered"].ref, check=False)
            assert f"in use by container {kept} as its image volume at /vol" in rmi.stderr
            daemon.crictl(crictl, "rmp", "-f", pod[0])
            assert leftovers(daemon) == ([], [], [])
    finally:
        shutil.rmtree(directory)


@pytest.mark.parametrize("handler", HANDLERS)
@pytest.mark.parametrize("kind", ["layered", "single"])
def test_in_a_pod_with_a_user_namespace_the_volume_shows_the_images_owners_read_only(daemon, crictl, images,
                                                                                   tmp_path, handler, kind) -> None:
    image_id = pull(daemon, crictl, images[kind])
    pod = run_pod(daemon, crictl, tmp_path, handler, userns=True)
    container_id = create(daemon, crictl, tmp_path, pod, volume(image_id), volume(image_id, "/sub", "data")
                          if kind == "layered" else volume(image_id, "/sub", "only"))
    daemon.crictl(crictl, "start", container_id)
    assert sh(daemon, crictl, container_id, "cat /proc/self/uid_map").stdout.split() == \
        ["0", str(USERNS_MAPPING[0]["host_id"]), "65536"]
    if kind == "layered":  # an overlay of the image's layers, each id-mapped with the pod's mappings
        owners = "stat -c '%n %u:%g' /vol/data/hello.txt /vol/data/owned /vol/inside /sub/owned"
        assert sh(daemon, crictl, container_id, owners).stdout.split("\n")[:4] == [
            "/vol/data/hello.txt 0:0", "/vol/data/owned 1000:2000", "/vol/inside 0:0", "/sub/owned 1000:2000"]
    else:  # one layer: a bind of it, id-mapped as every bind of the pod
        owners = "stat -c '%n %u:%g' /vol/only/one.txt /sub/one.txt"
        assert sh(daemon, crictl, container_id, owners).stdout.split("\n")[:2] == [
            "/vol/only/one.txt 0:0", "/sub/one.txt 0:0"]
    for target in ("/vol/new", "/sub/new"):
        write = sh(daemon, crictl, container_id, f"touch {target}", check=False)
        assert write.returncode != 0 and "Read-only file system" in write.stderr
    assert len(leftovers(daemon)[0]) == 1
    daemon.crictl(crictl, "rm", "-f", container_id)
    assert leftovers(daemon) == ([], [], [])
    daemon.crictl(crictl, "start", create(daemon, crictl, tmp_path, pod, volume(image_id), name="again"))
    daemon.crictl(crictl, "rmp", "-f", pod[0])
    assert leftovers(daemon) == ([], [], [])
