"""Writing a file so a reader sees the old one or the new one, never half.

bootstrap.json is part of the protocol (protocol.md, "Bootstrap"): it is written atomically by
whoever writes it, the shim or a client-side spawner, and pod records need the same. One
implementation for all of them, here where both the shim and the client may import it.
"""

from __future__ import annotations

import errno
import os
import tempfile
from typing import Any

__all__ = ["fsync_dir", "write_atomic"]

_RENAME_EXCHANGE = 2  # renameat2(2) flag, <linux/fs.h>
_AT_FDCWD = -100
_renameat2: Any = None  # libc's renameat2, loaded on first use; False where libc has none


def fsync_dir(path: str) -> None:
    """fsync a directory: a rename or unlink in it is durable only once its entry is on disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes, *, mode: int = 0o600, durable: bool = True) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename.

    The temporary name starts with '.', so a directory scan never takes it for the real file.
    ``durable`` fsyncs the file and then the directory, so the new content survives a power
    cut; runtime state that a reboot makes meaningless anyway skips that, and replaces an
    existing file by exchanging the two names (see :func:`_exchange`).
    """
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=directory)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        if not durable and _exchange(tmp, path):
            try:
                os.unlink(tmp)  # it now holds the old content
            except IsADirectoryError:  # ``path`` was a directory: put it back, fail as rename would
                _exchange(tmp, path)
                raise
        else:
            os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if durable:
        fsync_dir(directory)


def _exchange(tmp: str, path: str) -> bool:
    """Swap the names ``tmp`` and ``path`` atomically; False if that cannot be done here.

    ext4 (auto_da_alloc) starts writing a file's data out when a rename replaces another file
    with it: 150 µs per state.json update on this project's machines, several per sandbox.
    An exchange does not, and leaves the old content under ``tmp`` for the caller to unlink.
    False when ``path`` does not exist yet, or the filesystem or libc has no RENAME_EXCHANGE:
    the caller renames instead.
    """
    global _renameat2
    import ctypes  # here, not at the top: a client importing shim.rpc never pays for it

    if _renameat2 is None:
        try:
            fn = ctypes.CDLL(None, use_errno=True).renameat2
            fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
            _renameat2 = fn
        except AttributeError:  # libc older than 2.28
            _renameat2 = False
    if _renameat2 is False:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(tmp), _AT_FDCWD, os.fsencode(path), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOENT, errno.EINVAL, errno.ENOSYS, errno.EXDEV, errno.EPERM, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), path)
