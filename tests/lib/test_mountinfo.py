"""shim.lib.mountinfo: one parser of /proc/PID/mountinfo for every reader."""

from __future__ import annotations

import os

from shim.lib import mountinfo

TABLE = (
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro\n"
    "30 22 0:5 / /private rw - tmpfs tmpfs rw\n"
    "31 22 0:6 /sub /slave rw,nosuid master:7 propagate_from:2 - tmpfs none rw\n"
    "32 30 0:7 / /private/with\\040space\\134and\\011tab rw shared:9 - tmpfs my\\040src rw\n"
    "40 22 0:30 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    "this is not a mount\n"
    "41 22 0:31 / /cut rw -\n"
)


def test_each_field_of_a_line_is_parsed() -> None:
    root, private, slave = mountinfo.parse(TABLE)[:3]
    assert root == mountinfo.MountEntry(22, 1, "/", "/", "rw,relatime", ("shared:1",), "ext4", "/dev/sda1",
                                        "rw,errors=remount-ro")
    assert root.shared and not root.slave
    assert not private.shared and not private.slave and private.optional == ()
    assert slave.root == "/sub" and slave.slave and slave.optional == ("master:7", "propagate_from:2")


def test_paths_are_unescaped_and_options_are_left_as_written() -> None:
    escaped = mountinfo.parse(TABLE)[3]
    assert escaped.mount_point == "/private/with space\\and\ttab"
    assert escaped.source == "my src"
    assert mountinfo.parse(TABLE)[4].super_options == "rw,memory"


def test_a_line_that_is_no_mount_is_skipped() -> None:
    assert [m.mount_id for m in mountinfo.parse(TABLE)] == [22, 30, 31, 32, 40]


def test_this_process_sees_its_root_mount() -> None:
    mounts = mountinfo.read()
    assert any(m.mount_point == "/" for m in mounts)
    assert all(os.path.isabs(m.mount_point) for m in mounts)
