"""The snapshotter: committed layer chains, active overlay snapshots, read_file, gc
(client/images/snapshots.py). The overlay tests mount for real and unmount in a finaliser."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import subprocess
import sys
import threading

import pytest

from shim.lib.trees import remove_tree
from shim.rpc.status import AlreadyExists, FailedPrecondition, NotFound

from client.images import snapshots as snapshots_module
from client.images.snapshots import Mount, Snapshotter, chain_ids
from client.images.unpack import DigestMismatch, apply_layer

from support.disktools import at_once, slow_fsyncs
from support.layertools import deep_tree, make_layer, member, mount_overlay, mounted, tree, umount

PASSWD1 = b"root:x:0:0:root:/root:/bin/sh\n"
PASSWD2 = b"root:x:0:0:root:/root:/bin/ash\nuser:x:1000:1000::/home/user:/bin/sh\n"
GROUP1 = b"root:x:0:\n"
GROUP3 = b"root:x:0:\nusers:x:100:\n"


@pytest.fixture
def snapshotter(tmp_path):
    yield Snapshotter(str(tmp_path / "images" / "snapshots"))
    remove_tree(str(tmp_path / "images"))  # a tree deeper than pytest's own removal reaches


@pytest.fixture
def mountpoints(tmp_path):
    """Directories to mount on; whatever is mounted on them is unmounted after the test,
    however it ends."""
    made = []

    def make(name="rootfs"):
        path = tmp_path / name
        path.mkdir()
        made.append(str(path))
        return str(path)

    yield make
    for path in made:
        umount(path)


@pytest.fixture
def counted(monkeypatch):
    """Counts apply_layer calls by diff_id."""
    calls: dict[str, int] = {}

    def wrapped(dest, blob, media_type=None, *, diff_id=None, limit=None):
        calls[diff_id] = calls.get(diff_id, 0) + 1
        return apply_layer(dest, blob, media_type, diff_id=diff_id, limit=limit)

    monkeypatch.setattr(snapshots_module, "apply_layer", wrapped)
    return calls


def three_layers(tmp_path, compression="gzip"):
    """A base, a layer with a whiteout, an opaque dir and hard links, and a top layer."""
    l1 = make_layer(str(tmp_path / "l1"), [
        member("etc", "dir"), member("etc/passwd", data=PASSWD1), member("etc/group", data=GROUP1),
        member("etc/motd", data=b"hi"), member("etc/abs", "symlink", link="/etc/passwd"),
        member("etc/escape", "symlink", link="../../../../../etc/group"),
        member("var", "dir"), member("var/cache", "dir"), member("var/cache/a", data=b"a"),
        member("var/cache/b", data=b"b"), member("opt", "dir"), member("opt/keep", data=b"k"),
        member("usr", "dir"), member("usr/lib", "dir"), member("usr/lib/libc.so", data=b"libc", mode=0o755),
        member("lib", "symlink", link="usr/lib"), member("srv", "dir"), member("srv/dir", "dir"),
        member("srv/dir/x", data=b"x"),
    ], compression)
    l2 = make_layer(str(tmp_path / "l2"), [
        member("etc", "dir"), member("etc/.wh.motd"), member("etc/passwd", data=PASSWD2),
        member("var", "dir"), member("var/cache", "dir"), member("var/cache/.wh..wh..opq"),
        member("var/cache/c", data=b"c"), member("opt", "dir"), member("opt/new", data=b"n"),
        member("bin", "dir"), member("bin/sh", data=b"busybox", mode=0o755), member("sbin", "dir"),
        member("sbin/init", "hardlink", link="bin/sh", mode=0o755),
    ], compression)
    l3 = make_layer(str(tmp_path / "l3"), [
        member("etc/group", data=GROUP3), member("opt/.wh.keep"), member("var/cache/d", data=b"d"),
        member("srv/dir", data=b"a file now"),
    ], compression)
    return [(layer.diff_id, layer.path, layer.media_type) for layer in (l1, l2, l3)]


MERGED = {
    "etc/passwd": PASSWD2, "etc/group": GROUP3, "var/cache/c": b"c", "var/cache/d": b"d", "opt/new": b"n",
    "usr/lib/libc.so": b"libc", "bin/sh": b"busybox", "sbin/init": b"busybox", "srv/dir": b"a file now",
}
MERGED_PATHS = set(MERGED) | {"etc", "etc/abs", "etc/escape", "var", "var/cache", "opt", "usr", "usr/lib", "lib",
                              "bin", "sbin", "srv"}


def test_chain_ids_are_containerds() -> None:
    a, b, c = ("sha256:" + hashlib.sha256(x).hexdigest() for x in (b"a", b"b", b"c"))
    ab = "sha256:" + hashlib.sha256(f"{a} {b}".encode()).hexdigest()
    assert chain_ids([a, b, c]) == [a, ab, "sha256:" + hashlib.sha256(f"{ab} {c}".encode()).hexdigest()]
    assert chain_ids([]) == []


def test_unpack_commits_each_layer_on_its_parent(tmp_path, snapshotter) -> None:
    layers = three_layers(tmp_path)
    chain = chain_ids(d for d, _, _ in layers)
    assert snapshotter.unpack(layers) == chain[2]
    records = [snapshotter.stat(c) for c in chain]
    assert [r.parent for r in records] == [None, chain[0], chain[1]]
    assert [r.diff_id for r in records] == [d for d, _, _ in layers]
    assert all(r.kind == "committed" for r in records)


def test_images_sharing_layers_share_their_snapshots(tmp_path, snapshotter, counted) -> None:
    layers = three_layers(tmp_path)
    other = make_layer(str(tmp_path / "other"), [member("other", data=b"o")])
    snapshotter.unpack(layers[:2])
    top = snapshotter.unpack([*layers[:2], (other.diff_id, other.path, other.media_type)])
    snapshotter.unpack(layers)
    assert counted == {layers[0][0]: 1, layers[1][0]: 1, other.diff_id: 1, layers[2][0]: 1}
    assert snapshotter.stat(top).parent == chain_ids(d for d, _, _ in layers)[1]
    assert len(snapshotter.snapshots()) == 4


def test_a_three_layer_chain_mounts_as_one_overlay_showing_the_merged_view(tmp_path, snapshotter, mountpoints) -> None:
    layers = three_layers(tmp_path)
    top = snapshotter.unpack(layers)
    mounts = snapshotter.prepare("container-1", top)
    [overlay] = mounts
    lowers = [os.path.join(snapshotter.root, "snapshots", str(snapshotter.stat(c).snapshot_id), "fs")
              for c in chain_ids(d for d, _, _ in layers)]
    assert overlay.type == "overlay" and overlay.source == "overlay"
    assert overlay.options[0] == "lowerdir=" + ":".join(reversed(lowers))
    rootfs = mountpoints()
    mount_overlay(rootfs, mounts)
    merged = tree(rootfs)
    assert set(merged) == MERGED_PATHS
    for path, data in MERGED.items():
        with open(os.path.join(rootfs, path), "rb") as f:
            assert f.read() == data, path
    # Each path shows exactly what its top-most layer holds: type, mode, owner, mtime, content, xattrs.
    layer_trees = [tree(lower) for lower in reversed(lowers)]
    for path, seen in merged.items():
        top_most = next(t[path] for t in layer_trees if path in t)
        assert seen == top_most[:7] + (tuple(x for x in top_most[7] if not x[0].startswith("trusted.overlay.")),), path
    assert merged["bin/sh"][:2] == (stat.S_IFREG, 0o755) and merged["usr/lib/libc.so"][1] == 0o755
    assert os.lstat(os.path.join(rootfs, "bin/sh")).st_ino == os.lstat(os.path.join(rootfs, "sbin/init")).st_ino
    assert os.readlink(os.path.join(rootfs, "lib")) == "usr/lib"
    # The container writes to its own upper dir, never to the layers.
    with open(os.path.join(rootfs, "etc/hostname"), "w") as f:
        f.write("pod")
    upper = overlay.options[1].removeprefix("upperdir=")
    assert os.listdir(os.path.join(upper, "etc")) == ["hostname"]
    assert not any(os.path.exists(os.path.join(lower, "etc/hostname")) for lower in lowers)


def test_read_file_resolves_a_path_as_the_overlay_shows_it(tmp_path, snapshotter, mountpoints) -> None:
    top = snapshotter.unpack(three_layers(tmp_path))
    rootfs = mountpoints()
    mount_overlay(rootfs, snapshotter.prepare("c", top))
    for path in MERGED:
        with open(os.path.join(rootfs, path), "rb") as f:
            assert snapshotter.read_file(top, "/" + path) == f.read(), path
    assert snapshotter.read_file(top, "/etc/motd") is None  # whited out
    assert snapshotter.read_file(top, "/opt/keep") is None  # whited out
    assert snapshotter.read_file(top, "/var/cache/a") is None  # below an opaque directory
    assert snapshotter.read_file(top, "/srv/dir/x") is None  # its directory became a file
    assert snapshotter.read_file(top, "/lib/libc.so") == b"libc"  # through a relative link
    assert snapshotter.read_file(top, "/etc/abs") == PASSWD2  # an absolute link, inside the image
    assert snapshotter.read_file(top, "etc/escape") == GROUP3  # '..' stops at the image's root
    assert snapshotter.read_file(top, "/etc/passwd/x") is None
    assert snapshotter.read_file(top, "/nonexistent/passwd") is None
    with pytest.raises(FailedPrecondition, match="is a directory"):
        snapshotter.read_file(top, "/etc")
    with pytest.raises(NotFound):
        snapshotter.read_file("sha256:" + "1" * 64, "/etc/passwd")


def test_read_file_stops_at_a_symlink_loop(tmp_path, snapshotter) -> None:
    layer = make_layer(str(tmp_path / "l"), [member("a", "symlink", link="b"), member("b", "symlink", link="a")])
    top = snapshotter.unpack([(layer.diff_id, layer.path, layer.media_type)])
    with pytest.raises(FailedPrecondition, match="too many levels of symbolic links"):
        snapshotter.read_file(top, "/a")


def test_a_one_layer_image_is_still_an_overlay(tmp_path, snapshotter, mountpoints) -> None:
    layer = make_layer(str(tmp_path / "l"), [member("hello", data=b"world")])
    top = snapshotter.unpack([(layer.diff_id, layer.path, layer.media_type)])
    mounts = snapshotter.prepare("c", top)
    assert [m.type for m in mounts] == ["overlay"]
    rootfs = mountpoints()
    mount_overlay(rootfs, mounts)
    assert os.listdir(rootfs) == ["hello"]


def test_the_empty_image_is_a_bind_mount_of_an_empty_directory(snapshotter, mountpoints) -> None:
    assert snapshotter.unpack([]) == "" and snapshotter.has("")
    mounts = snapshotter.prepare("c", "")
    assert mounts == [Mount("bind", mounts[0].source, ("rw", "rbind"))]
    rootfs = mountpoints()
    mount_overlay(rootfs, mounts)
    assert mounted(rootfs) and os.listdir(rootfs) == []


def test_prepare_refuses_a_taken_key_and_an_unknown_chain(tmp_path, snapshotter) -> None:
    snapshotter.prepare("c", "")
    with pytest.raises(AlreadyExists):
        snapshotter.prepare("c", "")
    with pytest.raises(NotFound, match="does not exist"):
        snapshotter.prepare("d", "sha256:" + "2" * 64)
    assert [s.name for s in snapshotter.snapshots()] == ["c"]


def test_containers_prepared_at_once_wait_for_the_disk_together_for_their_records_directory(snapshotter, monkeypatch) -> None:
    # Each prepare records its snapshot durably (the record, then the records' directory,
    # fsynced). A hundred containers created at once: the directory's fsyncs are made
    # together, after the snapshotter's lock is let go, not one after another under it.
    prepares = 8
    overlap = slow_fsyncs(monkeypatch, 0.25)
    lock, holding = snapshotter._global_lock, []

    @contextlib.contextmanager
    def watched_lock():
        with lock():
            holding.append(threading.get_ident())
            try:
                yield
            finally:
                holding.remove(threading.get_ident())

    slowed, directory_fsyncs = os.fsync, []  # for each fsync of a directory: whether its thread held the lock

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            directory_fsyncs.append(threading.get_ident() in holding)
        slowed(fd)

    monkeypatch.setattr(snapshotter, "_global_lock", watched_lock)
    monkeypatch.setattr(os, "fsync", fsync)
    at_once(prepares, lambda i: snapshotter.prepare(f"c{i}", ""))
    monkeypatch.undo()
    assert sorted(s.name for s in snapshotter.snapshots()) == [f"c{i}" for i in range(prepares)]
    assert len(directory_fsyncs) >= prepares and not any(directory_fsyncs), directory_fsyncs
    assert overlap.most >= 2  # a directory's fsync waited for beside another prepare's


def test_remove_deletes_the_upper_dir_and_refuses_while_mounted(tmp_path, snapshotter, mountpoints) -> None:
    layer = make_layer(str(tmp_path / "l"), [member("f", data=b"x")])
    top = snapshotter.unpack([(layer.diff_id, layer.path, layer.media_type)])
    mounts = snapshotter.prepare("c", top)
    upper = mounts[0].options[1].removeprefix("upperdir=")
    rootfs = mountpoints()
    mount_overlay(rootfs, mounts)
    with pytest.raises(FailedPrecondition, match="still mounted"):
        snapshotter.remove("c")
    umount(rootfs)
    assert snapshotter.remove("c") is True
    assert not os.path.exists(os.path.dirname(upper))
    assert snapshotter.remove("c") is False
    assert snapshotter.has(top)


def test_concurrent_unpacks_of_one_chain_unpack_each_layer_once(tmp_path, snapshotter, counted) -> None:
    layers = three_layers(tmp_path)
    barrier = threading.Barrier(6)
    results, errors = [], []

    def pull():
        try:
            barrier.wait()
            results.append(snapshotter.unpack(layers))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=pull) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert set(results) == {chain_ids(d for d, _, _ in layers)[2]} and len(results) == 6
    assert counted == {d: 1 for d, _, _ in layers}
    assert len(os.listdir(os.path.join(snapshotter.root, "snapshots"))) == 3


def test_images_on_a_shared_committed_base_unpack_side_by_side(tmp_path, snapshotter, monkeypatch):
    base = make_layer(str(tmp_path / "base"), [member("etc", "dir")])
    tops = [make_layer(str(tmp_path / f"top{n}"), [member(f"f{n}", data=b"x")]) for n in range(2)]
    snapshotter.unpack([(base.diff_id, base.path, base.media_type)])
    both_inside = threading.Barrier(2, timeout=60)  # broken if one unpack waited for the other

    def wrapped(dest, blob, media_type=None, *, diff_id=None, limit=None):
        both_inside.wait()
        return apply_layer(dest, blob, media_type, diff_id=diff_id, limit=limit)

    monkeypatch.setattr(snapshots_module, "apply_layer", wrapped)
    errors = []

    def pull(top):
        try:
            snapshotter.unpack([(base.diff_id, base.path, base.media_type), (top.diff_id, top.path, top.media_type)])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=pull, args=(top,)) for top in tops]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_gc_during_an_unpack_keeps_the_layer_it_builds_on(tmp_path, snapshotter, monkeypatch):
    layers = three_layers(tmp_path)
    chain = chain_ids(d for d, _, _ in layers)
    snapshotter.unpack(layers[:1])
    freed = []

    def wrapped(dest, blob, media_type=None, *, diff_id=None, limit=None):
        freed.append(snapshotter.gc([]))  # nothing recorded uses the base yet
        return apply_layer(dest, blob, media_type, diff_id=diff_id, limit=limit)

    monkeypatch.setattr(snapshots_module, "apply_layer", wrapped)
    assert snapshotter.unpack(layers[:2]) == chain[1]
    assert [f.removed for f in freed] == [()]
    assert snapshotter.stat(chain[1]).parent == chain[0] and snapshotter.has(chain[0])


def test_gc_keeps_a_chain_while_its_puller_records_it(tmp_path, snapshotter) -> None:
    layers = three_layers(tmp_path)
    with snapshotter.unpacked(layers) as top:
        assert snapshotter.gc([]).removed == ()  # the pull has not recorded its image yet
    assert top in snapshotter.gc([]).removed


def test_a_failed_layer_leaves_nothing_and_the_layers_below_stay_committed(tmp_path, snapshotter) -> None:
    layers = three_layers(tmp_path)
    bad = (layers[1][0], layers[2][1], layers[2][2])  # layer 3's blob under layer 2's diff_id
    with pytest.raises(DigestMismatch):
        snapshotter.unpack([layers[0], bad, layers[2]])
    chain = chain_ids(d for d, _, _ in layers)
    assert snapshotter.has(chain[0]) and not snapshotter.has(chain[1]) and not snapshotter.has(chain[2])
    assert os.listdir(os.path.join(snapshotter.root, "snapshots")) == [str(snapshotter.stat(chain[0]).snapshot_id)]
    assert snapshotter.unpack(layers) == chain[2]


KILLED_UNPACK = """
import os, sys
from client.images import snapshots
def stuck(dest, *args, **kwargs):
    with open(os.path.join(dest, "half"), "w") as f:
        f.write("half a layer")
    print("unpacking", flush=True)
    sys.stdin.read()  # until killed
setattr(snapshots, "apply_layer", stuck)  # the name Snapshotter calls
snapshots.Snapshotter(sys.argv[1]).unpack([(sys.argv[2], sys.argv[3], None)])
"""


def test_what_a_killed_unpack_left_is_removed_at_start(tmp_path, snapshotter):
    layer = make_layer(str(tmp_path / "l"), [member("f", data=b"x")])
    proc = subprocess.Popen([sys.executable, "-c", KILLED_UNPACK, snapshotter.root, layer.diff_id, layer.path],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "unpacking\n"
        dirs = os.path.join(snapshotter.root, "snapshots")
        [tmp] = os.listdir(dirs)
        assert tmp.startswith("tmp-")
        # While it runs, a new snapshotter leaves its work alone (its chain lock is held).
        Snapshotter(snapshotter.root)
        assert os.listdir(dirs) == [tmp]
    finally:
        proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()
    os.mkdir(os.path.join(dirs, "17"))  # a snapshot made but never recorded
    os.mkdir(os.path.join(dirs, "trash-0123"))
    fresh = Snapshotter(snapshotter.root)
    assert os.listdir(dirs) == []
    assert not fresh.has(layer.diff_id)
    assert fresh.unpack([(layer.diff_id, layer.path, layer.media_type)]) == layer.diff_id


def test_staged_layers_are_committed_by_renaming_their_directories(tmp_path, snapshotter, counted) -> None:
    layers = three_layers(tmp_path)
    with snapshotter.staging() as staging:
        staged = {diff_id: staging.stage(path) for diff_id, path, _ in layers[1:]}  # in any order
        inodes = {diff_id: os.stat(os.path.join(s.path, "fs")).st_ino for diff_id, s in staged.items()}
        top = snapshotter.unpack(layers, staged)
        assert os.listdir(staging.directory) == []
    assert counted == {None: 2, layers[0][0]: 1}  # staged before their diff_id was known; the third by unpack()
    for diff_id, chain_id in zip([d for d, _, _ in layers], chain_ids(d for d, _, _ in layers), strict=False):
        if diff_id in inodes:
            record = snapshotter.stat(chain_id)
            fs = os.path.join(snapshotter.root, "snapshots", str(record.snapshot_id), "fs")
            assert os.stat(fs).st_ino == inodes[diff_id]
    assert snapshotter.read_file(top, "etc/passwd") == PASSWD2
    assert sorted(os.listdir(os.path.join(snapshotter.root, "snapshots"))) == ["1", "2", "3"]


def test_a_staged_layer_that_is_not_the_configs_is_unpacked_from_its_blob_which_says_why(tmp_path, snapshotter) -> None:
    layers = three_layers(tmp_path)
    with snapshotter.staging() as staging:
        wrong = {layers[1][0]: staging.stage(layers[2][1])}  # layer 3 staged under layer 2's diff_id
        with pytest.raises(DigestMismatch):
            snapshotter.unpack([layers[0], (layers[1][0], layers[2][1], layers[2][2]), layers[2]], wrong)
    assert not snapshotter.has(chain_ids(d for d, _, _ in layers)[1])
    assert snapshotter.unpack(layers) == chain_ids(d for d, _, _ in layers)[2]


def test_a_staging_directory_whose_process_died_is_removed_at_start(tmp_path, snapshotter) -> None:
    dirs = os.path.join(snapshotter.root, "snapshots")
    with snapshotter.staging() as staging:
        Snapshotter(snapshotter.root)  # in use: left alone
        assert os.listdir(dirs) == [os.path.basename(staging.directory)]
    os.mkdir(os.path.join(dirs, "stage-0123456789ab"))  # its lock is held by no one: its pull was killed
    os.mkdir(os.path.join(dirs, "stage-0123456789ab", "0"))
    Snapshotter(snapshotter.root)
    assert os.listdir(dirs) == [] and os.listdir(os.path.join(snapshotter.root, "locks")) == []


def test_gc_removes_what_no_image_or_container_uses(tmp_path, snapshotter) -> None:
    layers = three_layers(tmp_path)
    chain = chain_ids(d for d, _, _ in layers)
    other = make_layer(str(tmp_path / "other"), [member("other", data=b"o" * 100)])
    lone = make_layer(str(tmp_path / "lone"), [member("lone", data=b"l" * 10)])
    image_a = snapshotter.unpack(layers)
    image_b = snapshotter.unpack([layers[0], (other.diff_id, other.path, other.media_type)])
    image_c = snapshotter.unpack([(lone.diff_id, lone.path, lone.media_type)])
    snapshotter.prepare("container-of-c", image_c)
    freed = snapshotter.gc([chain[1]])  # image A's first two layers are an image too
    assert set(freed.removed) == {image_a, image_b}
    assert freed.bytes == len(GROUP3) + len(b"d") + len(b"a file now") + 100
    assert {s.name for s in snapshotter.snapshots()} == {chain[0], chain[1], image_c, "container-of-c"}
    assert len(os.listdir(os.path.join(snapshotter.root, "snapshots"))) == 4
    snapshotter.remove("container-of-c")
    assert set(snapshotter.gc([]).removed) == {image_c, chain[1], chain[0]}
    assert snapshotter.snapshots() == []
    assert os.listdir(os.path.join(snapshotter.root, "snapshots")) == []


def test_usage_counts_layers_and_upper_dirs(tmp_path, snapshotter) -> None:
    layer = make_layer(str(tmp_path / "l"), [member("d", "dir"), member("d/f", data=b"x" * 1000)])
    top = snapshotter.unpack([(layer.diff_id, layer.path, layer.media_type)])
    assert (snapshotter.usage().bytes, snapshotter.usage().inodes) == (1000, 2)
    upper = snapshotter.prepare("c", top)[0].options[1].removeprefix("upperdir=")
    with open(os.path.join(upper, "new"), "wb") as f:
        f.write(b"y" * 500)
    assert (snapshotter.usage().bytes, snapshotter.usage().inodes) == (1500, 3)


def test_an_image_whose_overlay_options_pass_a_page_is_prepared(tmp_path, snapshotter) -> None:
    # The shim mounts those through fsconfig (a lowerdir+ per layer): no page limit here.
    per_lowerdir = len(os.path.join(snapshotter.root, "snapshots", "99", "fs")) + 1
    count = 4096 // per_lowerdir + 2
    top = snapshotter.unpack(tiny_layers(tmp_path, count))
    [overlay] = snapshotter.prepare("c", top)
    assert len(",".join(overlay.options)) > 4096 and overlay.options[0].count(":") == count - 1


def test_an_image_with_more_layers_than_an_overlay_stacks_is_refused_with_a_sentence(tmp_path, snapshotter,
                                                                                       monkeypatch) -> None:
    monkeypatch.setattr(snapshots_module, "MAX_LAYERS", 3)
    layers = tiny_layers(tmp_path, 4)
    top = snapshotter.unpack(layers)
    with pytest.raises(FailedPrecondition, match="the image has 4 layers, more than the 3 one overlay can stack"):
        snapshotter.prepare("c", top)
    # The refused prepare left nothing: its key is free, for an image of fewer layers.
    assert snapshotter.prepare("c", chain_ids(d for d, _, _ in layers)[2])[0].type == "overlay"
    assert [s.kind for s in snapshotter.snapshots()].count("active") == 1


def tiny_layers(tmp_path, count):
    layers = []
    for n in range(count):
        layer = make_layer(str(tmp_path / f"l{n}"), [member(f"f{n}", data=b"x")])
        layers.append((layer.diff_id, layer.path, layer.media_type))
    return layers


def test_a_layer_deeper_than_the_recursion_limit_is_unpacked_and_collected_leaving_nothing(tmp_path, snapshotter) -> None:
    deep = "/".join(["d"] * 1100)
    layer = make_layer(str(tmp_path / "l"), [member(deep + "/f", data=b"deep")])
    top = snapshotter.unpack([(layer.diff_id, layer.path, layer.media_type)])
    assert snapshotter.read_file(top, deep + "/f") == b"deep"
    assert snapshotter.gc([]).removed == (top,)
    assert os.listdir(os.path.join(snapshotter.root, "snapshots")) == []


def test_a_deep_leftover_is_removed_at_start(snapshotter) -> None:
    trash = os.path.join(snapshotter.root, "snapshots", "trash-0123")
    os.mkdir(trash)
    deep_tree(trash, 1100)
    Snapshotter(snapshotter.root)
    assert os.listdir(os.path.join(snapshotter.root, "snapshots")) == []


def test_a_leftover_that_cannot_be_removed_is_a_warning_and_the_snapshotter_starts(tmp_path, snapshotter,
                                                                                  mountpoints, caplog) -> None:
    trash = os.path.join(snapshotter.root, "snapshots", "trash-0123")
    os.mkdir(trash)
    busy = mountpoints("busy")  # a mount point in it: rmdir fails with EBUSY
    os.rename(busy, os.path.join(trash, "busy"))
    os.mkdir(busy)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", os.path.join(trash, "busy")], check=True)
    try:
        with open(os.path.join(trash, "busy", "kept"), "w") as f:
            f.write("not the snapshotter's")
        layer = make_layer(str(tmp_path / "l"), [member("f", data=b"x")])
        fresh = Snapshotter(snapshotter.root)
        assert fresh.unpack([(layer.diff_id, layer.path, layer.media_type)]) == layer.diff_id
        assert f"cannot remove {trash}, left for the next start to remove" in caplog.text
        assert os.listdir(os.path.join(trash, "busy")) == ["kept"]  # another file system is never entered
    finally:
        umount(os.path.join(trash, "busy"))
    Snapshotter(snapshotter.root)
    assert not os.path.exists(trash)


def test_usage_counts_an_upper_dir_deeper_than_path_max(tmp_path, snapshotter) -> None:
    layer = make_layer(str(tmp_path / "l"), [member("f", data=b"x")])
    top = snapshotter.unpack([(layer.diff_id, layer.path, layer.media_type)])
    upper = snapshotter.prepare("c", top)[0].options[1].removeprefix("upperdir=")
    deep_tree(upper, 2100)
    assert (snapshotter.usage().bytes, snapshotter.usage().inodes) == (1, 1 + 2100 + 1)


@pytest.mark.parametrize("damage", [b"", b"{not json", b'{"schema": 1, "kind": "committed", "name": 7}'])
def test_a_snapshot_record_that_cannot_be_read_is_dropped_with_a_warning_and_its_layer_unpacked_again(
        tmp_path, snapshotter, caplog, damage) -> None:
    layers = three_layers(tmp_path)
    chain = chain_ids(d for d, _, _ in layers)
    top = snapshotter.unpack(layers)
    record = os.path.join(snapshotter.root, "metadata", "committed", chain[1].partition(":")[2] + ".json")
    with open(record, "wb") as f:
        f.write(damage)
    fresh = Snapshotter(snapshotter.root)  # starts; the middle layer's directory is a leftover now
    assert f"snapshot record {record} cannot be read, so its snapshot is dropped" in caplog.text
    assert not os.path.exists(record) and not fresh.has(chain[1])
    assert {s.name for s in fresh.snapshots()} == {chain[0], top}
    assert fresh.gc([]).removed  # what is left is collected without an error
    assert fresh.unpack(layers) == top and fresh.read_file(top, "etc/passwd") == PASSWD2
