"""Applying one layer into an empty directory in overlayfs's format (client/images/unpack.py)."""

from __future__ import annotations

import hashlib
import os
import stat

import pytest
from layertools import MTIME, make_layer, member, tree

from client.images.unpack import BadLayer, DigestMismatch, apply_layer
from shim.rpc.status import InvalidArgument


@pytest.fixture
def dest(tmp_path):
    path = tmp_path / "fs"
    path.mkdir()
    return str(path)


def unpack(tmp_path, dest, members, compression="tar"):
    layer = make_layer(str(tmp_path / "layer"), members, compression)
    return apply_layer(dest, layer.path, layer.media_type, diff_id=layer.diff_id)


def test_files_keep_type_mode_owner_times_and_xattrs_exactly(tmp_path, dest):
    stats = unpack(tmp_path, dest, [
        member("etc", "dir", mode=0o750, uid=3, gid=4, mtime="1600000000.123456789"),
        member("etc/passwd", data=b"root:x:0:0::/root:/bin/sh\n", mode=0o4755, uid=1000, gid=1001,
               mtime="1700000000.987654321", xattrs={"user.note": "hello", "trusted.mark": "x"}),
        member("etc/link", "symlink", link="../nowhere", uid=5, gid=6),
        member("dev", "dir"),
        member("dev/null", "char", mode=0o666, dev=(1, 3)),
        member("dev/loop9", "block", mode=0o660, gid=6, dev=(7, 9)),
        member("dev/pipe", "fifo", mode=0o620),
        member("empty", data=b""),
    ])
    t = tree(dest)
    assert t["etc"][:5] == (stat.S_IFDIR, 0o750, 3, 4, 1600000000_123456789)
    assert t["etc/passwd"][:5] == (stat.S_IFREG, 0o4755, 1000, 1001, 1700000000_987654321)
    assert t["etc/passwd"][6] == hashlib.sha256(b"root:x:0:0::/root:/bin/sh\n").hexdigest()[:16]
    assert dict(t["etc/passwd"][7]) == {"user.note": b"hello", "trusted.mark": b"x"}
    assert t["etc/link"][:5] == (stat.S_IFLNK, 0o777, 5, 6, MTIME * 10**9) and t["etc/link"][6] == "../nowhere"
    assert (t["dev/null"][0], t["dev/null"][1], t["dev/null"][5]) == (stat.S_IFCHR, 0o666, os.makedev(1, 3))
    assert (t["dev/loop9"][0], t["dev/loop9"][3], t["dev/loop9"][5]) == (stat.S_IFBLK, 6, os.makedev(7, 9))
    assert t["dev/pipe"][:2] == (stat.S_IFIFO, 0o620)
    assert stats.bytes == len(b"root:x:0:0::/root:/bin/sh\n") and stats.inodes == 8


def test_a_whiteout_becomes_a_character_device_0_0(tmp_path, dest):
    unpack(tmp_path, dest, [member("etc", "dir"), member("etc/.wh.motd", uid=0, gid=0)])
    st = os.lstat(os.path.join(dest, "etc/motd"))
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == 0 and (st.st_uid, st.st_gid) == (0, 0)
    assert os.listdir(os.path.join(dest, "etc")) == ["motd"]


def test_an_opaque_marker_sets_the_opaque_xattr_on_its_directory(tmp_path, dest):
    unpack(tmp_path, dest, [member("var", "dir"), member("var/cache", "dir"), member("var/cache/.wh..wh..opq"),
                            member("var/cache/new", data=b"n")])
    assert os.getxattr(os.path.join(dest, "var/cache"), "trusted.overlay.opaque") == b"y"
    assert sorted(os.listdir(os.path.join(dest, "var/cache"))) == ["new"]
    with pytest.raises(OSError):
        os.getxattr(os.path.join(dest, "var"), "trusted.overlay.opaque")


def test_hard_links_across_directories_share_one_inode(tmp_path, dest):
    stats = unpack(tmp_path, dest, [member("bin", "dir"), member("bin/busybox", data=b"x" * 5000, mode=0o755),
                                    member("sbin", "dir"), member("sbin/init", "hardlink", link="bin/busybox",
                                                                  mode=0o755)])
    a, b = os.lstat(os.path.join(dest, "bin/busybox")), os.lstat(os.path.join(dest, "sbin/init"))
    assert a.st_ino == b.st_ino and a.st_nlink == 2
    assert stats.bytes == 5000


def test_parents_the_tar_does_not_list_are_made_as_plain_directories(tmp_path, dest):
    unpack(tmp_path, dest, [member("usr/lib/x.so", data=b"elf")])
    st = os.lstat(os.path.join(dest, "usr/lib"))
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o755


def test_a_later_member_replaces_an_earlier_one(tmp_path, dest):
    unpack(tmp_path, dest, [member("a", "dir"), member("a/f", data=b"1"), member("a", data=b"file now"),
                            member("b", data=b"old"), member("b", "symlink", link="a")])
    with open(os.path.join(dest, "a"), "rb") as f:
        assert f.read() == b"file now"
    assert os.readlink(os.path.join(dest, "b")) == "a"


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_compressed_layers_unpack_to_the_same_tree_with_the_same_diff_id(tmp_path, compression):
    members = [member("d", "dir"), member("d/big", data=os.urandom(3 << 20)), member("d/s", "symlink", link="big")]
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir()
    packed.mkdir()
    a = make_layer(str(tmp_path / "a"), members)
    b = make_layer(str(tmp_path / "b"), members, compression)
    assert apply_layer(str(plain), a.path).diff_id == apply_layer(str(packed), b.path, b.media_type).diff_id == a.diff_id
    assert tree(str(plain)) == tree(str(packed))


def test_the_diff_id_covers_the_whole_stream_with_its_trailing_blocks(tmp_path, dest):
    layer = make_layer(str(tmp_path / "l"), [member("f", data=b"abc")])
    with open(layer.path, "rb") as f:
        whole = f.read()
    assert whole.endswith(bytes(1024))
    assert apply_layer(dest, layer.path).diff_id == "sha256:" + hashlib.sha256(whole).hexdigest()


def test_a_wrong_diff_id_is_refused(tmp_path, dest):
    layer = make_layer(str(tmp_path / "l"), [member("f", data=b"abc")], "gzip")
    with pytest.raises(DigestMismatch, match="not the diff_id sha256:0000"):
        apply_layer(dest, layer.path, layer.media_type, diff_id="sha256:" + "0" * 64)


@pytest.mark.parametrize("members, says", [
    ([member("/etc/passwd", data=b"x")], "is an absolute path"),
    ([member("a/../../x", data=b"x")], "has a '..' component"),
    ([member("a", "symlink", link="/etc"), member("a/passwd", data=b"x")], "goes through the symbolic link 'a'"),
    ([member("a", "symlink", link=".."), member("a/b/c", data=b"x")], "goes through the symbolic link 'a'"),
    ([member("l", "symlink", link="/etc/shadow"), member("h", "hardlink", link="l/x")],
     "points to 'l/x', which is not a file this layer holds"),
    ([member("h", "hardlink", link="../etc/passwd")], "has a '..' component"),
    ([member("h", "hardlink", link="etc/passwd")], "which is not a file this layer holds"),
    ([member("f", data=b"x"), member("f/g", data=b"x")], "inside 'f', which is not a directory"),
    ([member("f", data=b"x", xattrs={"trusted.overlay.opaque": "y"})], "overlayfs's own xattr"),
], ids=["absolute", "dotdot", "through-symlink", "through-dotdot-symlink", "hardlink-through-symlink",
        "hardlink-dotdot", "hardlink-outside", "file-as-dir", "overlay-xattr"])
def test_a_layer_that_reaches_outside_its_directory_is_refused(tmp_path, dest, members, says):
    with pytest.raises(BadLayer, match=says):
        unpack(tmp_path, dest, members)
    assert not os.path.exists(os.path.join(os.path.dirname(dest), "passwd"))


def test_a_truncated_gzip_layer_is_refused(tmp_path, dest):
    layer = make_layer(str(tmp_path / "l"), [member("f", data=os.urandom(200_000))], "gzip")
    with open(layer.path, "r+b") as f:
        f.truncate(os.path.getsize(layer.path) // 2)
    with pytest.raises(BadLayer, match="truncated"):
        apply_layer(dest, layer.path, layer.media_type)


def test_a_corrupt_zstd_layer_is_refused_with_zstds_words(tmp_path, dest):
    layer = make_layer(str(tmp_path / "l"), [member("f", data=os.urandom(200_000))], "zstd")
    with open(layer.path, "r+b") as f:
        f.seek(100)
        f.write(b"garbage" * 100)
    with pytest.raises(BadLayer, match="not valid zstd data"):
        apply_layer(dest, layer.path, layer.media_type)


def test_a_layer_blob_that_is_a_symbolic_link_is_refused_not_followed(tmp_path, dest):
    layer = make_layer(str(tmp_path / "l"), [member("f", data=b"through the link")])
    link = str(tmp_path / "blob")
    os.symlink(layer.path, link)
    with pytest.raises(BadLayer, match=f"layer {link} cannot be read: Too many levels of symbolic links$"):
        apply_layer(dest, link, layer.media_type)
    assert os.listdir(dest) == []


def test_a_blob_whose_compression_disagrees_with_its_media_type_is_refused(tmp_path, dest):
    layer = make_layer(str(tmp_path / "l"), [member("f")])
    with pytest.raises(BadLayer, match="is tar data but its media type .* says gzip"):
        apply_layer(dest, layer.path, "application/vnd.docker.image.rootfs.diff.tar.gzip")
    with pytest.raises(BadLayer, match="is not a layer type"):
        apply_layer(dest, layer.path, "application/json")


def test_a_directory_that_is_not_empty_is_refused(tmp_path, dest):
    open(os.path.join(dest, "x"), "w").close()
    layer = make_layer(str(tmp_path / "l"), [member("f")])
    with pytest.raises(InvalidArgument, match="not empty"):
        apply_layer(dest, layer.path)


def test_a_name_the_file_system_refuses_is_a_bad_layer_not_a_traceback(tmp_path, dest):
    with pytest.raises(BadLayer, match="cannot make 'x{300}': File name too long"):
        unpack(tmp_path, dest, [member("x" * 300, data=b"long")])
