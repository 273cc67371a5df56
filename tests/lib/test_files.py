"""shim.lib.files: a reader sees the old file or the new one, never half, and nothing is left;
podshim's own directories are made with their mode and never through a symbolic link; a lock
(flock_open) excludes others, shares with shared holders, and leaves no file when asked not to."""

from __future__ import annotations

import errno
import os
import stat
import threading

import pytest

from shim.lib.files import (
    MAX_JSON_DEPTH,
    Rewriter,
    decode_json,
    ensure_private_dir,
    flock_open,
    read_json,
    write_atomic,
)


@pytest.mark.parametrize("durable", [False, True])
def test_a_new_file_is_written_with_its_mode(tmp_path, durable) -> None:
    path = tmp_path / "state.json"
    write_atomic(str(path), b"first", mode=0o644, durable=durable)
    assert path.read_bytes() == b"first"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert os.listdir(tmp_path) == ["state.json"]


@pytest.mark.parametrize("durable", [False, True])
def test_an_update_replaces_the_content_and_leaves_no_temporary_file(tmp_path, durable) -> None:
    path = tmp_path / "state.json"
    write_atomic(str(path), b"old content, longer than the new one")
    inode = path.stat().st_ino
    write_atomic(str(path), b"new", durable=durable)
    assert path.read_bytes() == b"new"
    assert path.stat().st_ino != inode  # a new file took the name: an open reader keeps the old
    assert os.listdir(tmp_path) == ["state.json"]


def test_a_reader_holding_the_old_file_keeps_reading_it_whole(tmp_path) -> None:
    path = tmp_path / "state.json"
    write_atomic(str(path), b"old", durable=False)
    with open(path, "rb") as reader:
        write_atomic(str(path), b"new", durable=False)
        assert reader.read() == b"old"
    assert path.read_bytes() == b"new"


@pytest.mark.parametrize("durable", [False, True])
def test_a_directory_in_the_way_is_refused_and_kept(tmp_path, durable) -> None:
    (tmp_path / "state.json").mkdir()
    (tmp_path / "state.json" / "inside").write_bytes(b"kept")
    with pytest.raises(IsADirectoryError):
        write_atomic(str(tmp_path / "state.json"), b"x", durable=durable)
    assert (tmp_path / "state.json" / "inside").read_bytes() == b"kept"
    assert os.listdir(tmp_path) == ["state.json"]


def test_a_missing_directory_is_an_error_and_leaves_nothing(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        write_atomic(str(tmp_path / "no" / "state.json"), b"x", durable=False)
    assert os.listdir(tmp_path) == []


# -- ensure_private_dir ------------------------------------------------------------------------


def test_a_private_dir_is_made_with_exactly_its_mode_whatever_the_umask(tmp_path) -> None:
    path = tmp_path / "a" / "b"
    old = os.umask(0o077)
    try:
        ensure_private_dir(str(path), 0o711)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o711


def test_an_existing_private_dir_gets_its_mode_back_unless_it_keeps_its_own(tmp_path) -> None:
    private, root = tmp_path / "s", tmp_path / "root"
    for path in (private, root):
        path.mkdir()
        os.chmod(path, 0o777)
    ensure_private_dir(str(private), 0o700)
    ensure_private_dir(str(root), 0o711, keep_mode=True)
    assert stat.S_IMODE(os.lstat(private).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(root).st_mode) == 0o777


@pytest.mark.parametrize("keep_mode", [False, True])
def test_a_symlink_where_a_private_dir_goes_is_refused_and_its_target_left_alone(tmp_path, keep_mode):
    target, link = tmp_path / "target", tmp_path / "s"
    target.mkdir()
    os.chmod(target, 0o755)
    link.symlink_to(target)
    with pytest.raises(OSError, match="symbolic link") as caught:
        ensure_private_dir(str(link), 0o700, keep_mode=keep_mode)
    assert caught.value.errno == errno.ELOOP and str(link) in caught.value.strerror
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o755


def test_a_file_where_a_private_dir_goes_is_refused(tmp_path) -> None:
    path = tmp_path / "s"
    path.write_bytes(b"")
    with pytest.raises(NotADirectoryError, match="not a directory"):
        ensure_private_dir(str(path), 0o700)


def test_a_private_dir_of_another_user_is_refused(tmp_path) -> None:
    path = tmp_path / "s"
    path.mkdir(mode=0o700)
    os.chown(path, 65534, 65534)
    with pytest.raises(PermissionError, match="belongs to uid 65534"):
        ensure_private_dir(str(path), 0o700)
    ensure_private_dir(str(path), 0o700, keep_mode=True)  # an administrator's root: theirs to own


# -- decode_json, read_json ----------------------------------------------------------------------


def test_a_json_document_is_decoded_from_text_or_bytes(tmp_path) -> None:
    assert decode_json('{"a": [1, {"b": null}]}', "x") == {"a": [1, {"b": None}]}
    assert decode_json(b'{"a": "\xc3\xa9"}', "x") == {"a": "é"}
    path = tmp_path / "doc.json"
    path.write_bytes(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH)  # exactly the limit
    assert read_json(str(path)) == eval("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH)


@pytest.mark.parametrize("data, says", [
    (b"", "is not valid JSON: Expecting value: line 1 column 1 (char 0)"),
    (b'{"a": 1,}', "is not valid JSON: Expecting property name"),
    (b'{"a": "\xff"}', "is not UTF-8 text (byte 0xff at offset 7)"),
    (b"[" * 100_000 + b"]" * 100_000, f"is not valid JSON: it is nested more than {MAX_JSON_DEPTH} deep"),
    (b"[" * 100_000, f"is not valid JSON: it is nested more than {MAX_JSON_DEPTH} deep"),
    (b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1), "is not valid JSON: it is nested more than"),
    (b"1" * 5000, "is not valid JSON: Exceeds the limit (4300 digits) for integer string conversion"),
    (b"NaN", "is not valid JSON: NaN is not a JSON number"),
], ids=["empty", "trailing-comma", "latin-1", "100000-deep", "100000-open", "over-the-limit", "5000-digits", "nan"])
def test_bad_json_is_one_value_error_naming_its_source(data, says) -> None:
    with pytest.raises(ValueError) as info:
        decode_json(data, "/etc/x.json")
    assert str(info.value).startswith(f"/etc/x.json {says}") and "\n" not in str(info.value), str(info.value)
    assert type(info.value) is ValueError and info.value.__cause__ is None


def test_read_json_names_the_file_and_lets_os_errors_through(tmp_path) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(b"[" * 100_000)
    with pytest.raises(ValueError, match=f"^{path} is not valid JSON: it is nested"):
        read_json(str(path))
    with pytest.raises(FileNotFoundError):
        read_json(str(tmp_path / "absent.json"))


def test_a_held_lock_excludes_another_holder_until_its_block_ends(tmp_path) -> None:
    path = str(tmp_path / "lock")
    with flock_open(path) as fd:
        assert fd is not None and stat.S_IMODE(os.fstat(fd).st_mode) == 0o600
        with flock_open(path, blocking=False) as other:
            assert other is None
        with flock_open(path, shared=True, blocking=False) as other:
            assert other is None
    with flock_open(path, blocking=False) as fd:
        assert fd is not None
    assert os.listdir(tmp_path) == ["lock"]


def test_shared_holders_share_and_exclude_an_exclusive_one(tmp_path) -> None:
    path = str(tmp_path / "lock")
    with flock_open(path, shared=True) as first, flock_open(path, shared=True, blocking=False) as second:
        assert first is not None and second is not None
        with flock_open(path, blocking=False) as exclusive:
            assert exclusive is None


def test_a_directory_is_locked_as_itself(tmp_path) -> None:
    with flock_open(str(tmp_path)) as fd:
        assert fd is not None and os.fstat(fd).st_ino == tmp_path.stat().st_ino
        with flock_open(str(tmp_path), blocking=False) as other:
            assert other is None


def test_a_missing_file_is_not_made_when_create_is_off(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        with flock_open(str(tmp_path / "lock"), create=False):
            pass
    assert os.listdir(tmp_path) == []


def test_a_symbolic_link_is_not_followed(tmp_path) -> None:
    (tmp_path / "target").write_bytes(b"")
    os.symlink("target", tmp_path / "lock")
    with pytest.raises(OSError) as caught:
        with flock_open(str(tmp_path / "lock")):
            pass
    assert caught.value.errno == errno.ELOOP


def test_an_unlinking_holder_leaves_no_file_and_a_waiter_locks_the_new_one(tmp_path) -> None:
    path = str(tmp_path / "lock")
    waiter_holds = []
    with flock_open(path, unlink=True) as fd:
        assert fd is not None
        opened = threading.Event()

        def wait() -> None:
            with flock_open(path) as waiter_fd:
                assert waiter_fd is not None
                waiter_holds.append(os.fstat(waiter_fd).st_ino == os.stat(path).st_ino)
        waiter = threading.Thread(target=wait)
        # The waiter opens the old file before the holder unlinks it: it must not keep a lock on
        # a file that no longer has the name.
        real_open = os.open

        def open_then_signal(*args, **kwargs):
            result = real_open(*args, **kwargs)
            opened.set()
            return result
        os.open = open_then_signal
        try:
            waiter.start()
            opened.wait()
        finally:
            os.open = real_open
    waiter.join()
    assert waiter_holds == [True]  # it held the file that has the name, made anew after the unlink


def test_an_unlinking_holder_that_did_not_get_the_lock_removes_nothing(tmp_path) -> None:
    path = str(tmp_path / "lock")
    with flock_open(path):
        with flock_open(path, blocking=False, unlink=True) as other:
            assert other is None
        assert os.path.exists(path)
    with flock_open(path, unlink=True):
        pass
    assert os.listdir(tmp_path) == []


def test_a_rewritten_file_holds_each_version_whole_and_keeps_one_spare(tmp_path) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(b"the first version, the longest of all")
    rewriter = Rewriter(str(path), mode=0o644)
    for version in (b"second", b"third, longer than the second", b"4th"):
        rewriter.write(version)
        assert path.read_bytes() == version
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        (spare,) = [name for name in os.listdir(tmp_path) if name != "state.json"]
        assert spare.startswith(".state.json.")
    rewriter.close()
    assert os.listdir(tmp_path) == ["state.json"] and path.read_bytes() == b"4th"


def test_a_rewrite_reuses_the_version_before_last_that_nobody_reads(tmp_path) -> None:
    path = tmp_path / "state.json"
    rewriter = Rewriter(str(path))
    rewriter.write(b"one")
    first = path.stat().st_ino
    rewriter.write(b"two")
    rewriter.write(b"three")  # into the first file: nobody has it open
    assert path.stat().st_ino == first and path.read_bytes() == b"three"
    rewriter.close()


def test_a_reader_holding_a_rewritten_version_keeps_reading_it_whole(tmp_path) -> None:
    path = tmp_path / "state.json"
    rewriter = Rewriter(str(path))
    rewriter.write(b"old")
    with open(path, "rb") as reader:
        rewriter.write(b"new")
        rewriter.write(b"newer")  # the file the reader holds is not the one written
        assert reader.read() == b"old"
    assert path.read_bytes() == b"newer"
    rewriter.write(b"newest")
    assert path.read_bytes() == b"newest"
    rewriter.close()
    assert os.listdir(tmp_path) == ["state.json"]


def test_a_rewrite_over_a_directory_is_refused_and_leaves_it(tmp_path) -> None:
    (tmp_path / "state.json").mkdir()
    (tmp_path / "state.json" / "inside").write_bytes(b"kept")
    rewriter = Rewriter(str(tmp_path / "state.json"))
    with pytest.raises(IsADirectoryError):
        rewriter.write(b"x")
    assert (tmp_path / "state.json" / "inside").read_bytes() == b"kept"
    assert os.listdir(tmp_path) == ["state.json"]


def test_the_leftovers_of_a_killed_rewriter_are_removed_and_nothing_else(tmp_path) -> None:
    path = tmp_path / "state.json"
    writer = Rewriter(str(path))
    writer.write(b"1\n")
    writer.write(b"2\n")  # the version before is kept as the spare: a killed writer leaves it
    others = [".state.json.bak", ".state.json.0123456789abcdefg", "state.json.0123456789ab", ".other.json.0123456789ab"]
    for name in others:
        (tmp_path / name).write_text("keep")
    assert len(Rewriter.remove_leftovers(str(path))) == 1
    assert sorted(os.listdir(tmp_path)) == sorted(["state.json", *others])
    assert path.read_bytes() == b"2\n"
