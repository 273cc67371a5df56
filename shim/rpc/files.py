"""Writing a file so a reader sees the old one or the new one, never half.

bootstrap.json is part of the protocol (protocol.md, "Bootstrap"): it is written atomically by
whoever writes it, the shim or a client-side spawner, and pod records need the same. One
implementation for all of them, here where both the shim and the client may import it.
"""

from __future__ import annotations

import os
import tempfile

__all__ = ["fsync_dir", "write_atomic"]


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
    cut; runtime state that a reboot makes meaningless anyway skips that.
    """
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if durable:
        fsync_dir(directory)
