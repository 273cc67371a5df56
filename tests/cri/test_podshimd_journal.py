"""podshimd's lines as journal entries (client/podshimd/journal.py), read back as journald reads them.
The real journald under a real systemd: tests/system/test_systemd_nspawn.py."""

from __future__ import annotations

import io
import logging
import os
import socket
import struct
import sys

from client.cri.logcontext import IdsFilter
from client.podshimd.journal import JournalHandler, journal_stream, priority


def parse(datagram: bytes) -> dict[str, str]:
    """The fields of a native-protocol datagram, as journald parses them."""
    fields, rest = {}, datagram
    while rest:
        line, newline, after = rest.partition(b"\n")
        if b"=" in line:
            key, _, value = line.partition(b"=")
            fields[key.decode()] = value.decode()
            rest = after
        else:  # KEY\n, 64-bit length, value, \n
            (size,) = struct.unpack("<Q", after[:8])
            fields[line.decode()] = after[8:8 + size].decode()
            assert after[8 + size:9 + size] == b"\n"
            rest = after[9 + size:]
    return fields


def journal(tmp_path):
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(tmp_path / "journal.sock"))
    server.settimeout(5)
    text = io.StringIO()
    fallback = logging.StreamHandler(text)
    handler = JournalHandler("podshimd", fallback, path=str(tmp_path / "journal.sock"))
    handler.addFilter(IdsFilter())
    logger = logging.Logger("client.cri.pod")
    logger.addHandler(handler)
    return server, logger, handler, text


def test_a_line_about_a_pod_is_an_entry_with_its_priority_and_ids(tmp_path) -> None:
    server, logger, handler, _ = journal(tmp_path)
    try:
        logger.warning("pod %s: something to act on", "p1", extra={"pod_id": "p1", "pod_name": "web",
                                                                   "pod_namespace": "default"})
        fields = parse(server.recv(65536))
        assert fields["MESSAGE"] == "pod p1: something to act on" and fields["PRIORITY"] == "4"
        assert (fields["POD_ID"], fields["POD_NAME"], fields["POD_NAMESPACE"]) == ("p1", "web", "default")
        assert "CONTAINER_ID" not in fields
        assert (fields["SYSLOG_IDENTIFIER"], fields["LOGGER"]) == ("podshimd", "client.cri.pod")
        assert fields["CODE_FILE"] == __file__ and fields["CODE_FUNC"] == "test_a_line_about_a_pod_is_an_entry_" \
                                                                          "with_its_priority_and_ids"
    finally:
        handler.close()
        server.close()


def test_a_traceback_stays_in_its_lines_entry(tmp_path) -> None:
    server, logger, handler, _ = journal(tmp_path)
    try:
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("it failed")
        fields = parse(server.recv(65536))
        assert fields["MESSAGE"].startswith("it failed\nTraceback (most recent call last):")
        assert fields["MESSAGE"].endswith("ValueError: boom") and fields["PRIORITY"] == "3"
    finally:
        handler.close()
        server.close()


def test_what_the_journal_refuses_goes_to_stderr_as_text(tmp_path) -> None:
    server, logger, handler, text = journal(tmp_path)
    server.close()
    os.unlink(tmp_path / "journal.sock")  # journald gone
    try:
        logger.info("container started", extra={"pod_id": "p1"})
        assert text.getvalue() == "container started\n"
    finally:
        handler.close()


def test_levels_are_syslog_priorities() -> None:
    assert [priority(level) for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR,
                                          logging.CRITICAL)] == [7, 6, 4, 3, 2]


def test_only_the_stream_journal_stream_names_is_the_journal(tmp_path) -> None:
    with open(tmp_path / "stderr", "w") as f:
        st = os.fstat(f.fileno())
        assert journal_stream(f, {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
        assert not journal_stream(f, {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino + 1}"})  # podshimd 2>file
        assert not journal_stream(f, {})
        assert not journal_stream(sys.stderr, {"JOURNAL_STREAM": "garbage"})
