"""A task's stdout and stderr, appended to its log file in the CRI log format.

Each record is one line, as kubelet reads it and containerd's CRI plugin writes it::

    2016-10-06T00:17:09.669794202Z stdout F a line the task wrote
    2016-10-06T00:17:09.669794202Z stderr P the first 16 KiB of a longer line...

The timestamp is Go's RFC3339Nano in UTC (trailing zeros of the fraction dropped); the tag is
``F`` for a full line and ``P`` for a partial one: a line longer than :data:`MAX_LINE_BYTES`
is cut into pieces of that size, all ``P`` but the last, and what a stream ends with without a
newline is ``P`` too. A trailing ``\\r\\n`` is a newline.

:class:`LineSplitter` is the format without I/O (bytes in, records out); :class:`CriLog`
reads the two pipes on the event loop, never blocking it, and appends to the file.

The log file is only ever a regular file at its own path: a symbolic link there (which would
send the container's output to any file on the host), a FIFO or a device is refused, where
containerd follows and opens whatever is there.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import stat
import time

from shim.lib.pipes import PipeReader

__all__ = ["MAX_LINE_BYTES", "STDOUT", "STDERR", "CriLog", "LineSplitter", "check_log_path", "format_records",
           "rfc3339_nano"]

log = logging.getLogger(__name__)

#: Longest message of one record (containerd's max_container_log_line_size default).
MAX_LINE_BYTES = 16 * 1024
STDOUT = "stdout"
STDERR = "stderr"
FULL = b"F"
PARTIAL = b"P"
LOG_FILE_MODE = 0o640
LOG_DIR_MODE = 0o755  # directories made for a log file

Record = tuple[bytes, bytes]  # (tag, message)


def rfc3339_nano(ns: int) -> str:
    """``ns`` since the epoch as Go's ``time.RFC3339Nano`` in UTC: ``2006-01-02T15:04:05.999999999Z``."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    if fraction:
        text += "." + f"{fraction:09d}".rstrip("0")
    return text + "Z"


def format_records(stream: str, records: list[Record], timestamp_ns: int) -> bytes:
    """The log lines of ``records`` read from ``stream`` at ``timestamp_ns``."""
    prefix = f"{rfc3339_nano(timestamp_ns)} {stream} ".encode()
    return b"".join(b"%s%s %s\n" % (prefix, tag, message) for tag, message in records)


class LineSplitter:
    """Cuts a byte stream into CRI records: ``feed(data)`` returns the records it completes,
    ``end()`` the rest at end of stream. Holds at most ``max_line_bytes`` between calls."""

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES):
        self.max_line_bytes = max_line_bytes
        self._pending = bytearray()

    def feed(self, data: bytes) -> list[Record]:
        buf = self._pending
        buf += data
        records: list[Record] = []
        start = 0
        while (newline := buf.find(b"\n", start)) != -1:
            end = newline - 1 if newline > start and buf[newline - 1] == 0x0D else newline  # \r\n
            start = self._cut(buf, start, end, records)
            records.append((FULL, bytes(buf[start:end])))
            start = newline + 1
        # A line longer than the limit is written as it comes, not held until its newline.
        start = self._cut(buf, start, len(buf), records)
        del buf[:start]
        return records

    def end(self) -> list[Record]:
        records = [(PARTIAL, bytes(self._pending))] if self._pending else []
        self._pending.clear()
        return records

    def _cut(self, buf: bytearray, start: int, end: int, records: list[Record]) -> int:
        # Only a rest *longer* than the limit is cut, so a line of exactly the limit stays F.
        while end - start > self.max_line_bytes:
            records.append((PARTIAL, bytes(buf[start:start + self.max_line_bytes])))
            start += self.max_line_bytes
        return start


def check_log_path(path: str) -> None:
    """OSError (its strerror a sentence) unless ``path`` is missing or a regular file: what
    :class:`CriLog` will open, checked ahead so a bad path fails a task's Create, not its Start."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    _check_log_file(path, st.st_mode)


def _check_log_file(path: str, mode: int) -> None:
    if stat.S_ISLNK(mode):
        raise OSError(errno.ELOOP, "it is a symbolic link, which podshim does not follow for a log file (it "
                                   "would send the output elsewhere); remove it", path)
    if not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, "it is not a regular file", path)


def _open_log_file(path: str) -> int:
    # O_NOFOLLOW: never through a link. O_NONBLOCK and O_NOCTTY: a FIFO or a terminal swapped in
    # can neither block the shim's loop nor become its terminal before it is refused.
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
    try:
        fd = os.open(path, flags, LOG_FILE_MODE)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # a link; a FIFO nobody reads
            check_log_path(path)
        raise
    try:
        _check_log_file(path, os.fstat(fd).st_mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


class CriLog:
    """The pipes of one task's stdout and stderr and the log file they are written to.

    Made before the launch: :attr:`stdout_fd` and :attr:`stderr_fd` are the write ends for the
    child. :meth:`start` (after the launch) closes them here and reads the pipes on the loop;
    :meth:`reopen` switches to a new file at the same path (log rotation); :meth:`drain` returns
    once both reached EOF; :meth:`close` releases everything and is the cleanup path on any
    failure. Raises OSError from the constructor when the file cannot be opened (it is created,
    mode 0640, in a directory that must exist) or is not a regular file at its own path (see
    :func:`check_log_path`).
    """

    def __init__(self, path: str):
        self.path = path
        self._fds: list[int] = []
        self.taps: dict[str, list[int]] = {STDOUT: [], STDERR: []}  # attachers' copies (add_tap)
        self._readers: list[PipeReader] = []
        self.closed = False
        try:
            self._log_fd = self._own(_open_log_file(path))
            pipes = [os.pipe2(os.O_CLOEXEC) for _ in (STDOUT, STDERR)]
            for read_fd, write_fd in pipes:
                self._own(read_fd)
                self._own(write_fd)
        except BaseException:
            self.close()
            raise
        (self._stdout_r, self.stdout_fd), (self._stderr_r, self.stderr_fd) = pipes
        self.failed_writes = 0
        self.terminal: int | None = None  # start()'s terminal master, while the log is open

    def _own(self, fd: int) -> int:
        self._fds.append(fd)
        return fd

    def _release(self, fd: int) -> None:
        if fd in self._fds:
            self._fds.remove(fd)
            os.close(fd)

    def start(self, terminal: int | None = None) -> None:
        """Close the child's ends here and start reading both pipes on the running loop. With
        ``terminal`` (a task's terminal master, which this CriLog owns from now on) the task's output is
        what it writes there, logged as stdout (a terminal has one stream, as containerd logs it)."""
        loop = asyncio.get_running_loop()
        self._release(self.stdout_fd)
        self._release(self.stderr_fd)
        self._readers = [_reader(self, loop, self._stdout_r, STDOUT), _reader(self, loop, self._stderr_r, STDERR)]
        if terminal is not None:
            self.terminal = self._own(terminal)
            self._readers.append(_reader(self, loop, terminal, STDOUT))

    def reopen(self) -> None:
        """Open :attr:`path` again (created if it was moved or removed) and write there from now
        on; what the pipes already hold goes to the previous file, which is then closed.

        Raises OSError when the file cannot be opened (the previous one stays in use), ValueError
        once the log is closed.
        """
        if self.closed:
            raise ValueError(f"the log {self.path} is closed")
        fd = _open_log_file(self.path)
        for reader in self._readers:
            reader.flush()  # written before the reopen: it belongs to the previous file
        previous, self._log_fd = self._log_fd, self._own(fd)
        self._release(previous)

    async def drain(self, timeout: float) -> None:
        """Wait until both pipes reach EOF (every writer closed them), then close everything.

        After ``timeout`` seconds (a process that kept a copy of the pipe, outside the task's
        cgroup), what the pipes hold now is written and they are closed anyway.
        """
        pending = [reader.eof for reader in self._readers if not reader.eof.done()]
        if pending:
            done, _ = await asyncio.wait(pending, timeout=timeout)
            if len(done) < len(pending):
                log.warning("log pipes of %s still open %.1fs after the task exited; closing them", self.path, timeout)
        self.close()

    def close(self) -> None:
        """Write what the pipes hold, then close the pipes and the file (and the taps: their readers
        see the end). Idempotent."""
        self.closed = True
        self.terminal = None
        for reader in self._readers:
            reader.stop()
        for fd in list(self._fds):
            self._release(fd)
        for taps in self.taps.values():
            for fd in taps:
                os.close(fd)
            taps.clear()

    def add_tap(self, stream: str, fd: int) -> None:
        """Copy what the task writes on ``stream`` (stdout or stderr) to ``fd`` too (an attacher's FIFO,
        non-blocking) from now on, until the task's output ends; this CriLog owns ``fd`` then. A tap
        whose reader does not keep up (its FIFO is full) or went away is closed: it is never blocked
        on, and never silently given part of the output."""
        self.taps[stream].append(fd)

    def _tap(self, stream: str, data: bytes) -> None:
        taps = self.taps[stream]
        for fd in list(taps):
            try:
                written = os.write(fd, data)
            except OSError:  # EAGAIN: full; EPIPE: the attacher went away
                written = -1
            if written != len(data):
                log.info("an attacher of %s's %s fell behind or went away; its copy ends", self.path, stream)
                taps.remove(fd)
                os.close(fd)

    def write(self, data: bytes) -> None:
        """Append ``data``; a failed write (disk full) is counted and logged, and reading goes on
        so the task never blocks on a full pipe."""
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._log_fd, view):]
            except OSError as exc:
                self.failed_writes += 1
                if self.failed_writes == 1:
                    log.error("cannot write to log file %s: %s", self.path, exc.strerror)
                return


def _reader(owner: CriLog, loop: asyncio.AbstractEventLoop, fd: int, stream: str) -> PipeReader:
    """A reader of one of the task's pipes whose records go to the CriLog's file."""
    splitter = LineSplitter()

    def emit(records: list[Record]) -> None:
        if records:
            owner.write(format_records(stream, records, time.time_ns()))

    def feed(data: bytes) -> None:
        owner._tap(stream, data)
        emit(splitter.feed(data))

    return PipeReader(loop, fd, feed, lambda: emit(splitter.end()), name=f"the {stream} of {owner.path}")
