"""ExecStart's stdio: the files the client names, opened by the shim for the command (protocol.md 7.3).

The client (podshimd) makes FIFOs, or a pseudo-terminal, and holds their other ends, so the command's
bytes go straight between it and the client: the shim only opens the paths and hands the fds to the
launcher. Every open is non-blocking and refuses symbolic links; a FIFO is then made blocking again,
as a program expects its stdio to be.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from shim.api.defaults import FIFO_READER_WAIT
from shim.lib.console import check_size, check_socket
from shim.rpc.status import InvalidArgument

__all__ = ["ExecStdio", "NoReader", "TaskStdin", "hold_fifo", "open_stdio", "open_tap", "open_taps",
           "opened_once_read"]


@dataclass
class ExecStdio:
    """The command's stdin, stdout and stderr fds (None: /dev/null) and whether they are one terminal.
    :meth:`close` is the one cleanup path (once the command has its copies)."""

    stdin: int | None = None
    stdout: int | None = None
    stderr: int | None = None
    terminal: bool = False
    console_socket: str = ""  # instead: the client's socket for a new terminal's master
    console_size: tuple[int, int] = (0, 0)
    _fds: list[int] = field(default_factory=list)

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


class NoReader(InvalidArgument):
    """The FIFO ``path`` given for output (field ``field_name``) has no reader (yet): opened for
    writing without blocking, it fails with ENXIO. ``waited``: how long the shim waited for one."""

    def __init__(self, field_name: str, path: str, waited: float = 0.0) -> None:
        within = f" within {waited:g} s" if waited else " (the client opens its reading end first)"
        super().__init__(f"field {field_name!r}: cannot open FIFO {path} for writing: "
                         f"nobody opened it for reading{within}")
        self.field_name = field_name
        self.path = path


_T = TypeVar("_T")


async def opened_once_read(open_fifos: Callable[[], _T]) -> _T:
    """``open_fifos()`` (:func:`open_stdio`, :func:`open_tap`), tried again every few milliseconds
    while an output FIFO has no reader, for :data:`FIFO_READER_WAIT` seconds: the client may open
    its end just after its request arrives (containerd's fifo package does). ``open_fifos`` closes
    what it opened when it raises. Raises what the last try raised (a NoReader that says how long the
    shim waited)."""
    deadline = time.monotonic() + FIFO_READER_WAIT
    while True:
        try:
            return open_fifos()
        except NoReader as exc:
            if time.monotonic() >= deadline:
                raise NoReader(exc.field_name, exc.path, FIFO_READER_WAIT) from None
        await asyncio.sleep(0.005)


#: The pipe buffer asked for an attacher's FIFO (F_SETPIPE_SZ; the kernel's default is 64 KiB): room
#: for bursts while podshimd forwards them.
TAP_PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = 1031


def open_tap(path: str, field_name: str) -> int:
    """An attacher's FIFO opened for writing, non-blocking (the shim never waits on it), with a large
    pipe buffer when the kernel allows. Raises InvalidArgument."""
    fd = _open(path, field_name, os.O_WRONLY, want_fifo=True, blocking=False)
    try:
        fcntl.fcntl(fd, _F_SETPIPE_SZ, TAP_PIPE_BYTES)
    except OSError:  # above /proc/sys/fs/pipe-max-size for an unprivileged shim: the default will do
        pass
    return fd


def open_taps(fifos: Mapping[str, str]) -> list[tuple[str, int]]:
    """Attachers' FIFOs by stream (stdout, stderr) opened as :func:`open_tap` does: ``(stream, fd)``
    each, in ``fifos``' order; when one cannot be opened, those already open are closed. Raises
    InvalidArgument (NoReader: one has no reader)."""
    opened: list[tuple[str, int]] = []
    try:
        for stream, path in fifos.items():
            opened.append((stream, open_tap(path, stream)))
    except BaseException:
        for _, fd in opened:
            os.close(fd)
        raise
    return opened


def _open(path: str, field_name: str, flags: int, *, want_fifo: bool, blocking: bool = True) -> int:
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise InvalidArgument(f"field {field_name!r} must be an absolute path, not {path!r}")
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        # ENXIO: a FIFO opened for writing that nobody reads (the client must hold its end first).
        if exc.errno == errno.ENXIO:
            raise NoReader(field_name, path) from None
        raise InvalidArgument(f"field {field_name!r}: cannot open {path}: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if want_fifo and not stat.S_ISFIFO(mode):
            raise InvalidArgument(f"field {field_name!r}: {path} is not a FIFO")
        if not want_fifo and not os.isatty(fd):
            raise InvalidArgument(f"field {field_name!r}: {path} is not a terminal")
        if blocking:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_stdio(stdin: str | None, stdout: str | None, stderr: str | None, terminal: str | None,
               console_socket: str | None = None, console_size: tuple[int | None, int | None] = (None, None)
               ) -> ExecStdio:
    """Open ExecStart's ``stdin``/``stdout``/``stderr`` FIFOs or its ``terminal``, or check its
    ``console_socket`` and ``console_size`` (columns, rows). Raises InvalidArgument (a path that is not
    absolute, not a FIFO, terminal or socket, or cannot be opened; a terminal with FIFOs; a size out of
    0..65535 or without a console socket)."""
    stdio = ExecStdio()
    if console_socket is None:
        if console_size != (None, None):
            raise InvalidArgument("fields 'console_width' and 'console_height' go with 'console_socket'")
    else:
        if stdin is not None or stdout is not None or stderr is not None or terminal is not None:
            raise InvalidArgument("field 'console_socket' is the command's stdin, stdout and stderr: give it alone")
        for name, value in zip(("console_width", "console_height"), console_size, strict=False):
            if value is not None:
                check_size(name, value)
        check_socket(console_socket)
        stdio.console_socket = console_socket
        stdio.console_size = (console_size[0] or 0, console_size[1] or 0)
        return stdio
    try:
        if terminal is not None:
            if stdin is not None or stdout is not None or stderr is not None:
                raise InvalidArgument("field 'terminal' is the command's stdin, stdout and stderr: give it alone")
            fd = _open(terminal, "terminal", os.O_RDWR, want_fifo=False)
            stdio._fds.append(fd)
            stdio.stdin = stdio.stdout = stdio.stderr = fd
            stdio.terminal = True
            return stdio
        for name, path, flags in (("stdin", stdin, os.O_RDONLY), ("stdout", stdout, os.O_WRONLY),
                                  ("stderr", stderr, os.O_WRONLY)):
            if path is not None:
                fd = _open(path, name, flags, want_fifo=True)
                stdio._fds.append(fd)
                setattr(stdio, name, fd)
    except BaseException:
        stdio.close()
        raise
    return stdio


def hold_fifo(path: str, field_name: str) -> int:
    """The FIFO ``path`` opened read-write by the shim, non-blocking (which never waits for, nor fails
    for want of, the other end): while the shim holds it, the FIFO's reader sees no end of input, even
    before its writer opened its end. Raises InvalidArgument."""
    return _open(path, field_name, os.O_RDWR, want_fifo=True, blocking=False)


class TaskStdin:
    """A task's stdin, kept open through the shim (Create's ``stdin``, protocol.md 7.3): a FIFO at
    ``path`` (0600) whose read end the task gets and whose write end the shim holds until
    :meth:`close` (CloseStdin), so a client that stops writing does not end the task's input.
    With ``given``, the FIFO is the caller's (containerd's): opened, never made or removed.
    :meth:`remove` is the one cleanup path (the task stopped, or did not start). Raises OSError;
    InvalidArgument when a given path is no FIFO."""

    def __init__(self, path: str, given: bool = False) -> None:
        self.path = path
        self.given = given
        self.read_fd: int | None = None
        self.write_fd: int | None = None
        if not given:
            try:
                os.unlink(path)  # a FIFO a shim that died left behind
            except FileNotFoundError:
                pass
            os.mkfifo(path, 0o600)
        try:
            if given:
                self.read_fd = _open(path, "stdin", os.O_RDONLY, want_fifo=True, blocking=False)
            else:
                self.read_fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
            self.write_fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
            os.set_blocking(self.read_fd, True)  # the task's: a program expects a blocking stdin
        except BaseException:
            self.remove()
            raise

    def started(self) -> None:
        """The task has its read end."""
        if self.read_fd is not None:
            os.close(self.read_fd)
            self.read_fd = None

    def close(self) -> None:
        """Drop the shim's write end: the task reads end-of-file once clients' ends are closed too."""
        if self.write_fd is not None:
            os.close(self.write_fd)
            self.write_fd = None

    def remove(self) -> None:
        self.started()
        self.close()
        if self.given:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
