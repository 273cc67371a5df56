"""An exec's stdio as podshimd holds it: FIFOs in a private directory, or a pseudo-terminal's master.

podshimd makes the files and keeps its own ends; the shim opens the paths (ExecStart,
protocol.md 7.3) so that the command's bytes go between podshimd and the command directly. The
order of opens is what keeps every one of them from blocking and the command from seeing a false
end of input: podshimd opens a stdout/stderr FIFO for reading before the shim opens it for writing,
and opens stdin's for writing (through a reader it holds for that moment) before the shim opens it
for reading. A terminal: podshimd listens on a console socket (ExecStart's ``console_socket``), the
runtime makes the terminal in the container's own devpts and sends its master there (runc's protocol,
with every runtime handler: :meth:`ExecIO.receive_terminal`); podshimd keeps the master, whose size
(``resize``) it sets. podshimd's ends are non-blocking; :func:`read` and :func:`write` wait on the
event loop.
"""

from __future__ import annotations

import errno
import os
import secrets

from shim.lib.console import Console, resize
from shim.lib.files import ensure_private_dir
from shim.lib.pipes import wait_ready
from shim.lib.trees import remove_tree

__all__ = ["ExecIO", "read", "write"]

READ_BYTES = 64 * 1024


class ExecIO:
    """podshimd's ends of one exec's stdio. :attr:`paths` are ExecStart's fields; with a tty, call
    :meth:`receive_terminal` once ExecStart answered; call :meth:`started` then (the command has its ends:
    podshimd drops the files) and :meth:`close` in every case (the one cleanup path)."""

    def __init__(self, directory: str, *, stdin: bool, stdout: bool, stderr: bool, tty: bool) -> None:
        self.stdin: int | None = None  # podshimd writes the command's input here
        self.stdout: int | None = None  # and reads its output here (the terminal's master with a tty)
        self.stderr: int | None = None
        self.master: int | None = None
        self._dir: str | None = None
        self._console: Console | None = None
        self._uses_terminal = stdin or stdout
        self.paths: dict[str, str | int] = {}
        try:
            ensure_private_dir(directory, 0o700)
            self._dir = os.path.join(directory, secrets.token_hex(8))
            os.mkdir(self._dir, 0o700)
            if tty:
                self._console = Console()
                self._console.listen(os.path.join(self._dir, "console.sock"))
                self.paths["console_socket"] = self._console.path
                return
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

    def size(self, width: int, height: int) -> None:
        """The terminal's size from its start (ExecStart's ``console_width`` and ``console_height``)."""
        if self._console is not None and 0 <= width <= 0xFFFF and 0 <= height <= 0xFFFF:
            self.paths.update(console_width=width, console_height=height)

    async def receive_terminal(self) -> None:
        """The terminal's master, which the runtime sent to the console socket (ExecStart answered).
        Raises OSError (none came in time)."""
        assert self._console is not None
        await self._console.receive()
        self.master = self._console.take()
        os.set_blocking(self.master, False)
        self.stdin = self.stdout = self.master if self._uses_terminal else None

    def started(self) -> None:
        """The command has its ends: drop the files' names."""
        if self._console is not None:
            self._console.close()
            self._console = None
        if self._dir is not None:
            remove_tree(self._dir, ignore_errors=True)
            self._dir = None

    def close_stdin(self) -> None:
        """The client's input ended: the command reads end-of-file (not with a terminal, which stays)."""
        if self.stdin is not None and self.stdin != self.master:
            os.close(self.stdin)
        self.stdin = None

    def resize(self, width: int, height: int) -> None:
        """Set the terminal's size (the command gets SIGWINCH)."""
        if self.master is not None:
            resize(self.master, width, height)

    def close(self) -> None:
        self.started()
        for fd in {self.stdin, self.stdout, self.stderr, self.master} - {None}:
            assert fd is not None
            os.close(fd)
        self.stdin = self.stdout = self.stderr = self.master = None


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
