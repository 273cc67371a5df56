"""Applying one layer into an empty directory in overlayfs's format (client/images/unpack.py)."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile

import pytest

from shim.lib.trees import remove_tree, walk
from shim.rpc.status import InvalidArgument, ResourceExhausted

from client.images.unpack import BadLayer, DigestMismatch, UnpackLimit, apply_layer

from support.layertools import MTIME, Layer, make_layer, member, tree


@pytest.fixture
def dest(tmp_path):
    path = tmp_path / "fs"
    path.mkdir()
    yield str(path)
    remove_tree(str(path))  # a tree deeper than pytest's own removal reaches


def unpack(tmp_path, dest, members, compression="tar"):
    layer = make_layer(str(tmp_path / "layer"), members, compression)
    return apply_layer(dest, layer.path, layer.media_type, diff_id=layer.diff_id)


def test_files_keep_type_mode_owner_times_and_xattrs_exactly(tmp_path, dest) -> None:
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


def test_a_whiteout_becomes_a_character_device_0_0(tmp_path, dest) -> None:
    unpack(tmp_path, dest, [member("etc", "dir"), member("etc/.wh.motd", uid=0, gid=0)])
    st = os.lstat(os.path.join(dest, "etc/motd"))
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == 0 and (st.st_uid, st.st_gid) == (0, 0)
    assert os.listdir(os.path.join(dest, "etc")) == ["motd"]


def test_an_opaque_marker_sets_the_opaque_xattr_on_its_directory(tmp_path, dest) -> None:
    unpack(tmp_path, dest, [member("var", "dir"), member("var/cache", "dir"), member("var/cache/.wh..wh..opq"),
                            member("var/cache/new", data=b"n")])
    assert os.getxattr(os.path.join(dest, "var/cache"), "trusted.overlay.opaque") == b"y"
    assert sorted(os.listdir(os.path.join(dest, "var/cache"))) == ["new"]
    with pytest.raises(OSError):
        os.getxattr(os.path.join(dest, "var"), "trusted.overlay.opaque")


def test_hard_links_across_directories_share_one_inode(tmp_path, dest) -> None:
    stats = unpack(tmp_path, dest, [member("bin", "dir"), member("bin/busybox", data=b"x" * 5000, mode=0o755),
                                    member("sbin", "dir"), member("sbin/init", "hardlink", link="bin/busybox",
                                                                  mode=0o755)])
    a, b = os.lstat(os.path.join(dest, "bin/busybox")), os.lstat(os.path.join(dest, "sbin/init"))
    assert a.st_ino == b.st_ino and a.st_nlink == 2
    assert stats.bytes == 5000


def test_parents_the_tar_does_not_list_are_made_as_plain_directories(tmp_path, dest) -> None:
    unpack(tmp_path, dest, [member("usr/lib/x.so", data=b"elf")])
    st = os.lstat(os.path.join(dest, "usr/lib"))
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o755


def test_a_later_member_replaces_an_earlier_one(tmp_path, dest) -> None:
    unpack(tmp_path, dest, [member("a", "dir"), member("a/f", data=b"1"), member("a", data=b"file now"),
                            member("b", data=b"old"), member("b", "symlink", link="a")])
    with open(os.path.join(dest, "a"), "rb") as f:
        assert f.read() == b"file now"
    assert os.readlink(os.path.join(dest, "b")) == "a"


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_compressed_layers_unpack_to_the_same_tree_with_the_same_diff_id(tmp_path, compression) -> None:
    members = [member("d", "dir"), member("d/big", data=os.urandom(3 << 20)), member("d/s", "symlink", link="big")]
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir()
    packed.mkdir()
    a = make_layer(str(tmp_path / "a"), members)
    b = make_layer(str(tmp_path / "b"), members, compression)
    assert apply_layer(str(plain), a.path).diff_id == apply_layer(str(packed), b.path, b.media_type).diff_id == a.diff_id
    assert tree(str(plain)) == tree(str(packed))


def test_the_diff_id_covers_the_whole_stream_with_its_trailing_blocks(tmp_path, dest) -> None:
    layer = make_layer(str(tmp_path / "l"), [member("f", data=b"abc")])
    with open(layer.path, "rb") as f:
        whole = f.read()
    assert whole.endswith(bytes(1024))
    assert apply_layer(dest, layer.path).diff_id == "sha256:" + hashlib.sha256(whole).hexdigest()


def test_a_wrong_diff_id_is_refused(tmp_path, dest) -> None:
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
def test_a_layer_that_reaches_outside_its_directory_is_refused(tmp_path, dest, members, says) -> None:
    with pytest.raises(BadLayer, match=says):
        unpack(tmp_path, dest, members)
    assert not os.path.exists(os.path.join(os.path.dirname(dest), "passwd"))


def test_a_truncated_gzip_layer_is_refused(tmp_path, dest) -> None:
    layer = make_layer(str(tmp_path / "l"), [member("f", data=os.urandom(200_000))], "gzip")
    with open(layer.path, "r+b") as f:
        f.truncate(os.path.getsize(layer.path) // 2)
    with pytest.raises(BadLayer, match="truncated"):
        apply_layer(dest, layer.path, layer.media_type)


def test_a_corrupt_zstd_layer_is_refused_with_zstds_words(tmp_path, dest) -> None:
    layer = make_layer(str(tmp_path / "l"), [member("f", data=os.urandom(200_000))], "zstd")
    with open(layer.path, "r+b") as f:
        f.seek(100)
        f.write(b"garbage" * 100)
    with pytest.raises(BadLayer, match="not valid zstd data"):
        apply_layer(dest, layer.path, layer.media_type)


def test_a_layer_blob_that_is_a_symbolic_link_is_refused_not_followed(tmp_path, dest) -> None:
    layer = make_layer(str(tmp_path / "l"), [member("f", data=b"through the link")])
    link = str(tmp_path / "blob")
    os.symlink(layer.path, link)
    with pytest.raises(BadLayer, match=f"layer {link} cannot be read: Too many levels of symbolic links$"):
        apply_layer(dest, link, layer.media_type)
    assert os.listdir(dest) == []


def test_a_blob_whose_compression_disagrees_with_its_media_type_is_refused(tmp_path, dest) -> None:
    layer = make_layer(str(tmp_path / "l"), [member("f")])
    with pytest.raises(BadLayer, match="is tar data but its media type .* says gzip"):
        apply_layer(dest, layer.path, "application/vnd.docker.image.rootfs.diff.tar.gzip")
    with pytest.raises(BadLayer, match="is not a layer type"):
        apply_layer(dest, layer.path, "application/json")


def test_a_directory_that_is_not_empty_is_refused(tmp_path, dest) -> None:
    open(os.path.join(dest, "x"), "w").close()
    layer = make_layer(str(tmp_path / "l"), [member("f")])
    with pytest.raises(InvalidArgument, match="not empty"):
        apply_layer(dest, layer.path)


def test_a_name_the_file_system_refuses_is_a_bad_layer_not_a_traceback(tmp_path, dest) -> None:
    with pytest.raises(BadLayer, match="cannot make 'x{300}': File name too long"):
        unpack(tmp_path, dest, [member("x" * 300, data=b"long")])


def test_a_path_longer_than_path_max_is_refused_with_a_sentence(tmp_path, dest) -> None:
    deep = "/".join(["d"] * 3000) + "/f"  # a PAX path header: 3,000 levels, 6,001 bytes
    with pytest.raises(BadLayer, match=r"is a path of 6001 bytes, longer than the 4096 bytes Linux takes"):
        unpack(tmp_path, dest, [member(deep, data=b"deep")])
    assert os.listdir(dest) == []  # refused before anything of it was made


def test_a_directory_deeper_than_the_recursion_limit_is_replaced_by_a_later_member(tmp_path, dest) -> None:
    deep = "/".join(["top"] + ["d"] * 1100)
    unpack(tmp_path, dest, [member(deep + "/f", data=b"x"), member("top", data=b"a file now")])
    assert tree(dest).keys() == {"top"}


def raw_header(name: str, kind: bytes, size: int) -> bytes:
    """One ustar header block of type ``kind`` that says its data has ``size`` bytes."""
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size
    return info.tobuf(tarfile.USTAR_FORMAT)


@pytest.mark.parametrize("kind, says", [(tarfile.XHDTYPE, "a PAX header of 1073741824 bytes"),
                                        (tarfile.GNUTYPE_LONGNAME, "a GNU long name header of 1073741824 bytes")])
def test_a_header_past_one_mib_is_refused_before_it_is_read(tmp_path, dest, kind, says) -> None:
    # The blob holds only the header's first MiB: a reader that took the header whole would find
    # the layer truncated (after holding what it read), not refuse it.
    blob = tmp_path / "layer"
    blob.write_bytes(raw_header("././@Header", kind, 1 << 30) + b"9" * (1 << 20))
    with pytest.raises(BadLayer, match=f"{says} is larger than the 1048576 bytes a layer's headers may have"):
        apply_layer(dest, str(blob))
    assert os.listdir(dest) == []


@pytest.mark.parametrize("pax, says", [
    ({"path": "a\0b"}, r"a PAX path holds a NUL byte \('a\\x00b'\), which no file name can"),
    ({"linkpath": "x\0y"}, r"a PAX linkpath holds a NUL byte"),
    ({"uid": str(1 << 40)}, r"'f' has uid 1099511627776, outside the ids Linux has \(0 to 4294967294\)"),
    ({"gid": "4294967295"}, r"'f' has gid 4294967295, outside the ids Linux has"),
    ({"mtime": "1" + "0" * 25}, r"'f' has mtime 10{25} s, outside the times a file can have"),
    ({"atime": "-" + "9" * 30}, r"'f' has atime -9{30} s, outside the times a file can have"),
])
def test_a_pax_header_no_file_can_have_is_refused_with_a_sentence(tmp_path, dest, pax, says) -> None:
    info, data = member("f", "symlink" if "linkpath" in pax else "file", link="t")
    info.pax_headers = pax
    with pytest.raises(BadLayer, match=says):
        unpack(tmp_path, dest, [(info, data)])
    assert os.listdir(dest) == []


def test_a_gnu_long_name_with_a_nul_byte_is_refused(tmp_path, dest) -> None:
    name = "x" * 120 + "\0y"
    blob = tmp_path / "layer"
    data = name.encode() + b"\0"
    blob.write_bytes(raw_header("././@LongLink", tarfile.GNUTYPE_LONGNAME, len(data)) + data.ljust(512, b"\0")
                     + raw_header("short", tarfile.REGTYPE, 0) + bytes(1024))
    with pytest.raises(BadLayer, match="a GNU long name holds a NUL byte"):
        apply_layer(dest, str(blob))


def test_a_device_number_no_device_has_is_refused(tmp_path, dest) -> None:
    info, _ = member("dev", "char", dev=(1 << 33, 1))
    blob = tmp_path / "layer"
    blob.write_bytes(info.tobuf(tarfile.GNU_FORMAT) + bytes(1024))  # GNU base-256: numbers past 8 octal digits
    with pytest.raises(BadLayer, match=r"device 'dev' has major number 8589934592, which no device has"):
        apply_layer(dest, str(blob))


def test_an_xattr_of_64_kib_is_refused_with_a_sentence(tmp_path, dest) -> None:
    big = "v" * (64 << 10)
    with pytest.raises(BadLayer, match=r"cannot set xattr user.big on 'f': (Argument list too long|No space left)"):
        unpack(tmp_path, dest, [member("f", data=b"x", xattrs={"user.big": big})])


def bomb(tmp_path, name: str, size: int) -> Layer:
    """A gzip layer of one file of ``size`` zero bytes: a few KiB of blob per MiB it unpacks to."""
    return make_layer(str(tmp_path / name), [member(name, data=bytes(size))], "gzip")


def test_a_layer_past_the_pulls_limit_is_refused_with_a_sentence_before_it_is_written(tmp_path, dest) -> None:
    layer = bomb(tmp_path, "zeros", 8 << 20)
    limit = UnpackLimit(1 << 20, dest, setting="the setting")
    with pytest.raises(ResourceExhausted, match=r"the image's layers unpack to more than 1048576 bytes, the most one "
                                                r"pull may write \(the setting\)"):
        apply_layer(dest, layer.path, layer.media_type, limit=limit)
    assert sum(entry.stat().st_size for entry in walk(dest) if not entry.is_dir) <= 1 << 20


def test_the_limit_counts_the_layers_of_a_pull_together(tmp_path) -> None:
    limit = UnpackLimit(3 << 20, str(tmp_path))
    for number in range(2):
        os.mkdir(tmp_path / f"fs{number}")
        layer = bomb(tmp_path, f"zeros{number}", 1 << 20)
        apply_layer(str(tmp_path / f"fs{number}"), layer.path, layer.media_type, limit=limit)
    os.mkdir(tmp_path / "fs2")
    layer = bomb(tmp_path, "zeros2", 2 << 20)
    with pytest.raises(ResourceExhausted, match="more than 3145728 bytes"):
        apply_layer(str(tmp_path / "fs2"), layer.path, layer.media_type, limit=limit)


def test_a_layer_is_refused_when_the_file_system_has_less_than_its_reserve_free(tmp_path, monkeypatch) -> None:
    layer = bomb(tmp_path, "zeros", 1 << 20)
    real = os.statvfs(tmp_path)

    class Full:
        f_frsize, f_blocks, f_bavail = real.f_frsize, real.f_blocks, real.f_blocks // 25  # 4 % free
    monkeypatch.setattr(os, "statvfs", lambda path: Full)
    os.mkdir(tmp_path / "fs")
    with pytest.raises(ResourceExhausted, match=r"has \d+ bytes free, less than the 5% of its size a pull leaves "
                                                r"free \(\d+ bytes\); nothing of the image was kept"):
        apply_layer(str(tmp_path / "fs"), layer.path, layer.media_type, limit=UnpackLimit(1 << 30, str(tmp_path)))


def test_a_second_pax_header_replaces_the_first_so_what_is_held_stays_bounded(tmp_path, dest) -> None:
    first = tarfile.TarInfo("././@PaxHeader")
    record = b"31 SCHILY.xattr.user.first=one\n"
    first.type, first.size = tarfile.XHDTYPE, len(record)
    info, data = member("f", data=b"x", xattrs={"user.second": "two"})
    blob = tmp_path / "layer"
    body = io.BytesIO()
    with tarfile.open(fileobj=body, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(data))
    blob.write_bytes(first.tobuf(tarfile.USTAR_FORMAT) + record.ljust(512, b"\0") + body.getvalue())
    apply_layer(dest, str(blob))
    assert os.listxattr(os.path.join(dest, "f")) == ["user.second"]


def test_a_directory_replaced_by_a_file_keeps_the_files_times_not_the_directorys(tmp_path, dest) -> None:
    unpack(tmp_path, dest, [member("a", "dir", mtime=1), member("a/b", "dir", mtime=2), member("a", data=b"x", mtime=5)])
    assert tree(dest).keys() == {"a"} and os.lstat(os.path.join(dest, "a")).st_mtime == 5



@pytest.mark.timeout(60)  # before the fix it spun for ever
def test_a_negative_size_is_refused_not_looped_on(tmp_path, dest) -> None:
    header = bytearray(tarfile.TarInfo("f").tobuf(tarfile.GNU_FORMAT))
    header[124:136] = b"\xff" * 11 + b"\xfb"  # GNU base-256: -5
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    blob = tmp_path / "layer"
    blob.write_bytes(bytes(header) + bytes(1024))
    with pytest.raises(BadLayer, match=r"'f' has a negative size \(-5\)"):
        apply_layer(dest, str(blob))
