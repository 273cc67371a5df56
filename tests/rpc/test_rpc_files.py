"""shim.rpc.files: a reader sees the old file or the new one, never half, and nothing is left."""

from __future__ import annotations

import os
import stat

import pytest

from shim.rpc.files import write_atomic


@pytest.mark.parametrize("durable", [False, True])
def test_a_new_file_is_written_with_its_mode(tmp_path, durable):
    path = tmp_path / "state.json"
    write_atomic(str(path), b"first", mode=0o644, durable=durable)
    assert path.read_bytes() == b"first"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert os.listdir(tmp_path) == ["state.json"]


@pytest.mark.parametrize("durable", [False, True])
def test_an_update_replaces_the_content_and_leaves_no_temporary_file(tmp_path, durable):
    path = tmp_path / "state.json"
    write_atomic(str(path), b"old content, longer than the new one")
    inode = path.stat().st_ino
    write_atomic(str(path), b"new", durable=durable)
    assert path.read_bytes() == b"new"
    assert path.stat().st_ino != inode  # a new file took the name: an open reader keeps the old
    assert os.listdir(tmp_path) == ["state.json"]


def test_a_reader_holding_the_old_file_keeps_reading_it_whole(tmp_path):
    path = tmp_path / "state.json"
    write_atomic(str(path), b"old", durable=False)
    with open(path, "rb") as reader:
        write_atomic(str(path), b"new", durable=False)
        assert reader.read() == b"old"
    assert path.read_bytes() == b"new"


@pytest.mark.parametrize("durable", [False, True])
def test_a_directory_in_the_way_is_refused_and_kept(tmp_path, durable):
    (tmp_path / "state.json").mkdir()
    (tmp_path / "state.json" / "inside").write_bytes(b"kept")
    with pytest.raises(IsADirectoryError):
        write_atomic(str(tmp_path / "state.json"), b"x", durable=durable)
    assert (tmp_path / "state.json" / "inside").read_bytes() == b"kept"
    assert os.listdir(tmp_path) == ["state.json"]


def test_a_missing_directory_is_an_error_and_leaves_nothing(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_atomic(str(tmp_path / "no" / "state.json"), b"x", durable=False)
    assert os.listdir(tmp_path) == []
