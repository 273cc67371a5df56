"""A task's pseudo-terminal as the shim holds it (Task.Create ``terminal``, protocol.md 7.3).

The terminal is made where the task will see it, in its own devpts: by the native launcher's child
after it entered the task's root (:mod:`shim.runtime.process`), or by runc/crun (``process.terminal``).
Either way the master comes to the shim over a unix socket in one ``SCM_RIGHTS`` message, runc's
``--console-socket`` protocol: :class:`Console` is the shim's end, a socket pair for the launcher or
a listening socket for an OCI runtime, and owns the master it receives until :meth:`Console.take`.

:func:`copy_input` writes the task's stdin FIFO to the master, :func:`copy_output` the master to a FIFO;
:func:`resize` sets its size.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import socket
import stat
import struct
import termios
from collections.abc import Iterator
from typing import Any

from shim.api.paths import SUN_PATH_MAX
from shim.lib.pipes import wait_ready
from shim.rpc.status import InvalidArgument

__all__ = ["Console", "check_size", "check_socket", "connect", "copy_input", "copy_output", "resize", "CONSOLE_TIMEOUT"]

#: Seconds an OCI runtime has, once it ran, to have sent the master (it sends it before it returns).
CONSOLE_TIMEOUT = 2.0
_READ_BYTES = 64 * 1024
_MAX_FDS = 4  # a sender that sends more than the one master gets them closed


class Console:
    """The shim's end of a console socket and the master received on it. :meth:`close` is the one
    cleanup path (what was received and not taken is closed too)."""

    def __init__(self) -> None:
        self.master: int | None = None
        self._sock: socket.socket | None = None
        self._peer: socket.socket | None = None
        self.path = ""  # a listening socket's path (runc's --console-socket)

    def pair(self) -> int:
        """A socket pair: the fd to give the launcher's child (it sends the master on it)."""
        self._sock, self._peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        return self._peer.fileno()

    def launched(self) -> None:
        """The child has its copy of the pair's other end (or failed): drop ours, so a child that dies
        before sending lets :meth:`receive` see the end instead of waiting."""
        if self._peer is not None:
            self._peer.close()
            self._peer = None

    def listen(self, path: str) -> None:
        """Listen on ``path`` (0600; a stale file there is replaced) for an OCI runtime's connection.
        Raises OSError."""
        self.path = path
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            with socket_address(path) as address:
                self._sock.bind(address)
        finally:
            os.umask(old)
        self._sock.listen(1)

    async def receive(self, timeout: float = CONSOLE_TIMEOUT) -> int:
        """The master, once the other side sent it (at once from a socket pair whose child has
        exec'd). Raises OSError (ETIMEDOUT, or EPROTO when the peer closed without sending one)."""
        assert self._sock is not None, "pair() or listen() first"
        loop = asyncio.get_running_loop()
        self._sock.setblocking(False)
        async with asyncio.timeout(timeout):
            try:
                if self.path:
                    conn, _ = await loop.sock_accept(self._sock)
                    try:
                        self.master = await _receive_fd(conn)
                    finally:
                        conn.close()
                else:
                    self.master = await _receive_fd(self._sock)
            except TimeoutError:
                raise OSError(errno.ETIMEDOUT, "no terminal was sent on the console socket in time") from None
        return self.master

    def take(self) -> int:
        """The master; its new owner closes it."""
        assert self.master is not None
        master, self.master = self.master, None
        return master

    def close(self) -> None:
        for sock in (self._sock, self._peer):
            if sock is not None:
                sock.close()
        self._sock = self._peer = None
        if self.path:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self.path = ""
        if self.master is not None:
            os.close(self.master)
            self.master = None


async def _receive_fd(sock: socket.socket) -> int:
    while True:
        try:
            _, fds, _, _ = socket.recv_fds(sock, 1024, _MAX_FDS)
        except BlockingIOError:
            await wait_ready(sock.fileno(), writable=False)
            continue
        if not fds:
            raise OSError(errno.EPROTO, "the console socket closed without a terminal")
        for extra in fds[1:]:
            os.close(extra)
        if not os.isatty(fds[0]):
            os.close(fds[0])
            raise OSError(errno.ENOTTY, "what came on the console socket is not a terminal")
        os.set_inheritable(fds[0], False)
        return fds[0]


#: The longest path bind() and connect() take as it is (sun_path holds its NUL too).
MAX_SOCKET_PATH_BYTES = SUN_PATH_MAX - 1


@contextlib.contextmanager
def socket_address(path: str) -> Iterator[str]:
    """An address for ``path`` that fits in sun_path: ``path`` itself, or, when it is longer (a bundle
    named by two 64-digit ids), the same file through ``/proc/self/fd/<its directory>/``."""
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH_BYTES:
        yield path
        return
    directory = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{directory}/{os.path.basename(path)}"
    finally:
        os.close(directory)


def check_socket(path: str, field_name: str = "console_socket") -> None:
    """InvalidArgument unless ``path`` is an absolute path of a unix socket (not through a link)."""
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise InvalidArgument(f"field {field_name!r} must be an absolute path, not {path!r}")
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        raise InvalidArgument(f"field {field_name!r}: {path}: {exc.strerror}") from None
    if not stat.S_ISSOCK(mode):
        raise InvalidArgument(f"field {field_name!r}: {path} is not a unix socket")


def check_size(field_name: str, value: Any) -> None:
    """InvalidArgument unless ``value`` (a terminal's columns or rows) is an integer in 0..65535."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0xFFFF:
        raise InvalidArgument(f"field {field_name!r} must be an integer in 0..65535, not {value!r}")


async def connect(path: str, timeout: float = CONSOLE_TIMEOUT) -> socket.socket:
    """A connection to the client's console socket ``path`` (checked by :func:`check_socket` first).
    Raises InvalidArgument (nobody listens there, or not within ``timeout``)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        async with asyncio.timeout(timeout):
            with socket_address(path) as address:
                await asyncio.get_running_loop().sock_connect(sock, address)
    except (OSError, TimeoutError) as exc:
        sock.close()
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "timed out"
        raise InvalidArgument(f"field 'console_socket': cannot connect to {path}: {reason}") from None
    except BaseException:
        sock.close()
        raise
    return sock


def resize(master: int, width: int, height: int) -> None:
    """Set the terminal's size: ``width`` columns by ``height`` rows. Raises OSError, struct.error
    (out of 0..65535)."""
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))


async def copy_input(fifo: int, master: int) -> None:
    """Copy what comes on the stdin FIFO ``fifo`` to the terminal ``master`` (both non-blocking), never
    blocking the loop; at the FIFO's end, the terminal's end-of-file character once. Ends quietly when
    the terminal is gone (EIO: the task closed it)."""
    os.set_blocking(fifo, False)
    try:
        while True:
            try:
                data = os.read(fifo, _READ_BYTES)
            except BlockingIOError:
                await wait_ready(fifo, writable=False)
                continue
            end = not data
            if end:
                data = termios.tcgetattr(master)[6][termios.VEOF]
            view = memoryview(data)
            while view:
                try:
                    view = view[os.write(master, view):]
                except BlockingIOError:  # the line discipline's buffer is full: the task is not reading
                    await wait_ready(master, writable=True)
            if end:
                return
    except OSError as exc:
        if exc.errno != errno.EIO:
            raise


async def copy_output(master: int, out: int | None) -> None:
    """Copy what the terminal ``master`` shows to ``out`` (a FIFO) until the terminal's end (EIO: every
    process that had it exited), never blocking the loop. Once ``out``'s reader is gone (or with no
    ``out``), what comes is read and dropped, so the terminal's program never blocks on a full terminal."""
    os.set_blocking(master, False)
    if out is not None:
        os.set_blocking(out, False)
    while True:
        try:
            data = os.read(master, _READ_BYTES)
        except BlockingIOError:
            await wait_ready(master, writable=False)
            continue
        except OSError as exc:
            if exc.errno == errno.EIO:
                return
            raise
        if not data:
            return
        view = memoryview(data)
        while view and out is not None:
            try:
                view = view[os.write(out, view):]
            except BlockingIOError:
                await wait_ready(out, writable=True)
            except BrokenPipeError:
                out = None
