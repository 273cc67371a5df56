"""An exec's stdio as podshimd holds it: FIFOs in a private directory, or a pseudo-terminal.

podshimd makes the files and keeps its own ends; the shim opens the paths (ExecStart,
protocol.md 7.3) so that the command's bytes go between podshimd and the command directly. The
order of opens is what keeps every one of them from blocking and the command from seeing a false
end of input: podshimd opens a stdout/stderr FIFO for reading before the shim opens it for writing,
and opens stdin's for writing (through a reader it holds for that moment) before the shim opens it
for reading. A terminal: podshimd keeps the master, the command gets the slave, whose size
(``resize``) is set on the master. podshimd's ends are non-blocking; :func:`read` and :func:`write`
wait on the event loop.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import shutil
import struct
import termios

from shim.rpc.files import ensure_private_dir
from shim.runtime.pipes import wait_ready

__all__ = ["ExecIO", "read", "write"]

READ_BYTES = 64 * 1024
# <asm-generic/ioctls.h>: unlockpt() and ptsname()'s ioctls (the termios module has neither).
_TIOCSPTLCK = 0x40045431
_TIOCGPTN = 0x80045430


class ExecIO:
    """podshimd's ends of one exec's stdio. :attr:`paths` are ExecStart's fields; call :meth:`started`
    once ExecStart answered (the command has its ends: podshimd drops the slave and the files) and
    :meth:`close` in every case (the one cleanup path)."""

    def __init__(self, directory: str, *, stdin: bool, stdout: bool, stderr: bool, tty: bool, root: str = "") -> None:
        self.stdin: int | None = None  # podshimd writes the command's input here
        self.stdout: int | None = None  # and reads its output here (the terminal's master with a tty)
        self.stderr: int | None = None
        self.master: int | None = None
        self._dir: str | None = None
        self.paths: dict[str, str] = {}
        try:
            if tty:
                self.master, self.paths["terminal"] = _terminal(root)
                os.set_blocking(self.master, False)
                self.stdin = self.stdout = self.master if (stdin or stdout) else None
                return
            ensure_private_dir(directory, 0o700)
            self._dir = os.path.join(directory, secrets.token_hex(8))
            os.mkdir(self._dir, 0o700)
            for name, wanted in (("stdin", stdin), ("stdout", stdout), ("stderr", stderr)):
                if not wanted:
                    continue
                path = os.path.join(self._dir, name)
                os.mkfifo(path, 0o600)
                if name == "stdin":
                    holder = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                    try:
                        self.stdin = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                    finally:
                        os.close(holder)
                else:
                    setattr(self, name, os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
                self.paths[name] = path
        except BaseException:
            self.close()
            raise

    def started(self) -> None:
        """The command has its ends: drop the FIFOs' names."""
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def close_stdin(self) -> None:
        """The client's input ended: the command reads end-of-file (not with a terminal, which stays)."""
        if self.stdin is not None and self.stdin != self.master:
            os.close(self.stdin)
        self.stdin = None

    def resize(self, width: int, height: int) -> None:
        """Set the terminal's size (the command gets SIGWINCH)."""
        if self.master is not None:
            fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))

    def close(self) -> None:
        self.started()
        for fd in {self.stdin, self.stdout, self.stderr, self.master} - {None}:
            assert fd is not None
            os.close(fd)
        self.stdin = self.stdout = self.stderr = self.master = None


def _terminal(root: str) -> tuple[int, str]:
    """A new pseudo-terminal's master and its slave's path, made in the devpts instance of the
    container whose root is ``root`` (``/proc/PID/root``: its /dev/ptmx leads to its own /dev/pts, so the
    command sees its terminal there), or in podshimd's own when ``root`` is "". Raises OSError."""
    master = os.open(os.path.join(root or "/", "dev/ptmx"), os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(master, _TIOCSPTLCK, struct.pack("i", 0))  # unlockpt
        number = struct.unpack("i", fcntl.ioctl(master, _TIOCGPTN, struct.pack("i", 0)))[0]
    except BaseException:
        os.close(master)
        raise
    return master, os.path.join(root or "/", f"dev/pts/{number}")


async def read(fd: int) -> bytes:
    """The next bytes of a non-blocking fd; b"" at its end (a terminal whose slave is closed: EIO)."""
    while True:
        try:
            return os.read(fd, READ_BYTES)
        except BlockingIOError:
            await wait_ready(fd, writable=False)
        except OSError as exc:
            if exc.errno == errno.EIO:
                return b""
            raise


async def write(fd: int, data: bytes) -> None:
    """Write all of ``data`` to a non-blocking fd. Raises OSError (EPIPE: the command closed its end)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            await wait_ready(fd, writable=True)
