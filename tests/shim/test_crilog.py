"""The CRI log format without I/O: line splitting, tags and timestamps, as containerd writes them;
and the log file, which is only ever a regular file at its own path, and its reopening (log rotation)."""

from __future__ import annotations

import os

import pytest

from shim.runtime.crilog import FULL, MAX_LINE_BYTES, PARTIAL, CriLog, LineSplitter, format_records, rfc3339_nano


def split(*chunks: bytes, limit: int = MAX_LINE_BYTES) -> list[tuple[bytes, bytes]]:
    splitter = LineSplitter(limit)
    records = [record for chunk in chunks for record in splitter.feed(chunk)]
    return records + splitter.end()


def test_each_line_is_a_full_record() -> None:
    assert split(b"one\ntwo\n") == [(FULL, b"one"), (FULL, b"two")]


def test_a_line_may_arrive_in_pieces() -> None:
    assert split(b"o", b"n", b"e\nt", b"wo\n") == [(FULL, b"one"), (FULL, b"two")]


def test_an_empty_line_is_an_empty_full_record() -> None:
    assert split(b"\n\n") == [(FULL, b""), (FULL, b"")]


def test_crlf_is_a_newline() -> None:
    assert split(b"dos\r\n", b"cr\rinside\n") == [(FULL, b"dos"), (FULL, b"cr\rinside")]


def test_the_end_of_a_stream_without_newline_is_partial() -> None:
    assert split(b"done\nno newline") == [(FULL, b"done"), (PARTIAL, b"no newline")]


def test_nothing_at_all_gives_no_record() -> None:
    assert split(b"") == []


@pytest.mark.parametrize("length,expected", [
    (16, [(FULL, 16)]),                                  # exactly the limit: one full record
    (17, [(PARTIAL, 16), (FULL, 1)]),
    (32, [(PARTIAL, 16), (FULL, 16)]),
    (40, [(PARTIAL, 16), (PARTIAL, 16), (FULL, 8)]),
])
def test_a_long_line_is_cut_into_partial_records_and_a_full_last_piece(length, expected) -> None:
    records = split(b"x" * length + b"\n", limit=16)
    assert [(tag, len(message)) for tag, message in records] == expected
    assert b"".join(message for _, message in records) == b"x" * length


def test_a_long_line_is_written_before_its_newline_arrives() -> None:
    splitter = LineSplitter(16)
    assert splitter.feed(b"y" * 40) == [(PARTIAL, b"y" * 16), (PARTIAL, b"y" * 16)]
    assert splitter.feed(b"\n") == [(FULL, b"y" * 8)]


def test_the_default_limit_is_16_kib() -> None:
    assert MAX_LINE_BYTES == 16384


@pytest.mark.parametrize("ns,text", [
    (1_475_712_829_669_794_202, "2016-10-06T00:13:49.669794202Z"),
    (1_475_712_829_669_000_000, "2016-10-06T00:13:49.669Z"),  # trailing zeros dropped, as Go does
    (1_475_712_829_000_000_000, "2016-10-06T00:13:49Z"),      # no fraction at all
    (1_475_712_829_000_000_001, "2016-10-06T00:13:49.000000001Z"),
])
def test_timestamps_are_go_rfc3339nano_in_utc(ns, text) -> None:
    assert rfc3339_nano(ns) == text


def test_records_are_formatted_as_cri_log_lines() -> None:
    line = format_records("stderr", [(FULL, b"a b"), (PARTIAL, b"")], 1_475_712_829_669_794_202)
    assert line == (b"2016-10-06T00:13:49.669794202Z stderr F a b\n"
                    b"2016-10-06T00:13:49.669794202Z stderr P \n")


# -- the log file ------------------------------------------------------------------------------


def test_the_log_file_is_made_0640_and_appended_to(tmp_path) -> None:
    path = tmp_path / "c.log"
    path.write_bytes(b"earlier\n")
    log = CriLog(str(path))
    try:
        log.write(b"later\n")
    finally:
        log.close()
    assert path.read_bytes() == b"earlier\nlater\n"
    fresh = CriLog(str(tmp_path / "new.log"))
    fresh.close()
    assert os.stat(tmp_path / "new.log").st_mode & 0o777 == 0o640


@pytest.mark.parametrize("kind, says", [("symlink", "symbolic link"), ("fifo", "not a regular file")])
def test_a_log_path_that_is_not_a_regular_file_is_refused_and_nothing_goes_through_it(tmp_path, kind, says) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    path = tmp_path / "c.log"
    reader = None
    if kind == "symlink":
        path.symlink_to(victim)
    else:
        os.mkfifo(path)
        reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # someone reads: an open for writing would succeed
    try:
        with pytest.raises(OSError, match=says):
            CriLog(str(path)).close()
        if reader is not None:
            assert os.read(reader, 100) == b""
    finally:
        if reader is not None:
            os.close(reader)
    assert victim.read_bytes() == b"precious\n"


# -- reopening the file --------------------------------------------------------------------------


def messages(path: str) -> list[str]:
    with open(path) as f:
        return [line.split(" ", 3)[1] + " " + line.split(" ", 3)[3] for line in f.read().splitlines()]


@pytest.fixture
async def crilog(tmp_path):
    """A started CriLog and a copy of each write end, as a task would hold them."""
    log = CriLog(str(tmp_path / "c.log"))
    ends = os.dup(log.stdout_fd), os.dup(log.stderr_fd)
    log.start()
    yield log, ends
    log.close()
    for fd in ends:
        os.close(fd)


async def test_reopen_after_a_move_writes_to_a_new_file_and_the_rest_to_the_moved_one(crilog, tmp_path) -> None:
    log, (out, err) = crilog
    os.write(out, b"before\n")
    os.rename(log.path, tmp_path / "c.log.1")
    log.reopen()
    os.write(out, b"after\n")
    os.write(err, b"oops\n")
    log.close()
    assert messages(str(tmp_path / "c.log.1")) == ["stdout before"]
    assert messages(log.path) == ["stdout after", "stderr oops"]
    assert oct(os.stat(log.path).st_mode & 0o777) == "0o640"


async def test_a_reopen_that_fails_keeps_the_previous_file(crilog, tmp_path) -> None:
    log, (out, _) = crilog
    os.rename(log.path, tmp_path / "c.log.1")
    os.mkdir(log.path)  # a directory where the file was: it cannot be opened for writing
    with pytest.raises(IsADirectoryError):
        log.reopen()
    os.write(out, b"still here\n")
    log.close()
    assert messages(str(tmp_path / "c.log.1")) == ["stdout still here"]


async def test_a_closed_log_is_not_reopened(crilog) -> None:
    log, _ = crilog
    log.close()
    with pytest.raises(ValueError, match="is closed"):
        log.reopen()
