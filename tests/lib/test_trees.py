"""shim.lib.trees: trees deeper than the recursion limit and longer than PATH_MAX are walked and
removed like any other, never across a mount point or through a symbolic link."""

from __future__ import annotations

import os
import subprocess

import pytest

from shim.lib.trees import remove_tree, walk

from support.layertools import deep_tree


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_tree_deeper_than_the_recursion_limit_and_longer_than_path_max_is_walked(tmp_path) -> None:
    deep_tree(str(tmp_path), 3000)
    try:
        fds = open_fds()
        entries = [(entry.parents, entry.name, entry.is_dir) for entry in walk(str(tmp_path))]
        assert len(entries) == 3001
        assert entries[-1] == (("d",) * 3000, "f", False)
        assert open_fds() == fds
    finally:
        remove_tree(str(tmp_path / "d"))


def test_a_tree_deeper_than_the_recursion_limit_and_longer_than_path_max_is_removed(tmp_path) -> None:
    os.mkdir(tmp_path / "top")
    deep_tree(str(tmp_path / "top"), 3000)
    fds = open_fds()
    remove_tree(str(tmp_path / "top"))  # (if it fails, pytest's removal fails too)
    assert os.listdir(tmp_path) == []
    assert open_fds() == fds


def test_a_wide_tree_is_walked_parents_first_and_removed(tmp_path) -> None:
    for a in range(3):
        for b in range(3):
            os.makedirs(tmp_path / "top" / f"a{a}" / f"b{b}")
            (tmp_path / "top" / f"a{a}" / f"b{b}" / "f").write_text("x")
    os.symlink("/etc", tmp_path / "top" / "link")
    seen = [entry.path("") for entry in walk(str(tmp_path / "top"))]
    assert len(seen) == 3 + 9 + 9 + 1
    assert all(seen.index(os.path.dirname(path)) < seen.index(path) for path in seen if os.path.dirname(path))
    remove_tree(str(tmp_path / "top"))
    assert os.listdir(tmp_path) == [] and os.path.isdir("/etc")


def test_removing_what_is_not_there_is_nothing_and_a_link_is_unlinked_not_followed(tmp_path) -> None:
    remove_tree(str(tmp_path / "nothing"))
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "f").write_text("x")
    os.symlink(tmp_path / "kept", tmp_path / "link")
    remove_tree(str(tmp_path / "link"))
    assert os.listdir(tmp_path) == ["kept"] and (tmp_path / "kept" / "f").exists()


@pytest.fixture
def mounted_tmpfs(tmp_path):
    target = tmp_path / "top" / "mnt"
    target.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(target)], check=True)
    try:
        (target / "precious").write_text("not ours")
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=True)


def test_a_file_system_mounted_below_is_neither_entered_nor_emptied(tmp_path, mounted_tmpfs) -> None:
    (tmp_path / "top" / "ours").write_text("x")
    assert [entry.name for entry in walk(str(tmp_path / "top"))] in (["mnt", "ours"], ["ours", "mnt"])
    with pytest.raises(OSError):
        remove_tree(str(tmp_path / "top"))
    assert (mounted_tmpfs / "precious").read_text() == "not ours"
    assert sorted(os.listdir(tmp_path / "top")) == ["mnt"]
