"""The directories podshim keeps its own files in, writing a file so a reader sees the old one
or the new one, never half, reading a JSON document, and locking a file or directory.

bootstrap.json is part of the protocol (protocol.md, "Bootstrap"): it is written atomically by
whoever writes it, the shim or a client-side spawner, and pod records need the same. The
directories they live in (socket directory, bundles, records, logs) are made one way, never
through a symbolic link. Every JSON document podshim reads (configs, records, state, what a
helper process prints) is decoded one way, so a bad one is one sentence, never a traceback.
One implementation for all of them, here where both the shim and the client may import it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["MAX_JSON_BYTES", "write_json_atomic", "json_document", "MAX_JSON_DEPTH", "decode_json", "ensure_private_dir", "flock_open", "fsync_dir", "read_json",
           "read_all", "read_file", "read_regular", "rename_noreplace", "Rewriter", "unlink_quietly", "write_atomic",
           "write_temporary"]

#: How deeply a JSON document podshim reads may nest. Real ones (CRI and CNI configs, records)
#: nest less than 10 deep; a deeper one would be refused later anyway, by the recursion limit
#: of whatever walks or encodes it.
MAX_JSON_DEPTH = 100

_RENAME_NOREPLACE = 1  # renameat2(2) flags, <linux/fs.h>
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_renameat2: Any = None  # libc's renameat2, loaded on first use; False where libc has none


def ensure_private_dir(path: str, mode: int, *, keep_mode: bool = False) -> None:
    """Make ``path``, a directory podshim keeps its own files in, or check the one that is there.

    Missing parents are made as ``os.makedirs`` makes them. ``path`` itself must be a directory,
    never a symbolic link: a link there (planted to make us chmod its target, or put our files
    outside our root) or any other file is refused with OSError (ELOOP, ENOTDIR), whose strerror
    is a sentence naming the path. A directory made here gets exactly ``mode``. One that was
    there must belong to this user (EPERM otherwise) and is set to ``mode``, unless
    ``keep_mode``: a root an administrator may have made (a state root, a log directory) keeps
    the mode and owner they gave it. The mode is set through an O_NOFOLLOW descriptor, so a
    link swapped in meanwhile is not followed either.
    """
    made = False
    try:
        os.mkdir(path, mode)
        made = True
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            os.mkdir(path, mode)
            made = True
        except FileExistsError:
            pass
    except FileExistsError:
        pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        if os.path.islink(path):
            raise OSError(errno.ELOOP, f"{path} is a symbolic link, which podshim does not follow where it keeps "
                                       "its own files; remove it", path) from None
        raise OSError(errno.ENOTDIR, f"{path} is not a directory", path) from None
    try:
        st = os.fstat(fd)
        if not made and not keep_mode and st.st_uid != os.geteuid():
            raise OSError(errno.EPERM, f"{path} belongs to uid {st.st_uid}, not to this user "
                                       f"(uid {os.geteuid()}); podshim keeps its own files only in its own "
                                       "directories", path)
        if (made or not keep_mode) and stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(fd, mode)  # mkdir's mode was filtered by the umask
    finally:
        os.close(fd)


@contextmanager
def flock_open(path: str, *, shared: bool = False, blocking: bool = True, create: bool = True,
               unlink: bool = False) -> Iterator[int | None]:
    """Hold an exclusive (or ``shared``) flock on the file or directory ``path`` for a block.

    Yields the locked descriptor (read-only, close-on-exec), or None when ``blocking`` is off
    and another holds the lock; closing it at the block's end drops the lock. A missing file is
    made (0600) unless ``create`` is off (then FileNotFoundError); a symbolic link at ``path``
    is never followed (OSError ELOOP). flock locks belong to an open file, so this excludes
    threads of one process as it excludes processes, and the kernel drops a dead holder's lock.

    ``unlink`` removes the file at the end of a block that held the lock (and raised nothing),
    while still holding it, so lock files are not left behind. A waiter that opened the old
    file then finds, once it gets the lock, that ``path`` names another file (or none) and locks
    again: whoever holds the lock always holds the file at ``path``.
    """
    mode = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if blocking else fcntl.LOCK_NB)
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
    while True:
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            if not create:
                raise
            fd = os.open(path, flags | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, mode)
        except BlockingIOError:
            os.close(fd)
            yield None
            return
        except BaseException:
            os.close(fd)
            raise
        held = os.fstat(fd)
        try:
            current = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            current = None
        if current is not None and (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
            break
        os.close(fd)  # unlinked (or replaced) by its holder while we waited: lock the file there now
    try:
        yield fd
        if unlink:
            unlink_quietly(path)  # gone with its directory, if that was removed meanwhile
    finally:
        os.close(fd)


def decode_json(data: bytes | str, source: str) -> Any:
    """Decode one JSON document (bytes are UTF-8, or UTF-16/32 as JSON allows).

    Raises ValueError whose message is one sentence starting with ``source`` (a path, or what
    printed it) and saying what is wrong: not UTF-8, not JSON (with the decoder's position),
    nested more than :data:`MAX_JSON_DEPTH` deep, an integer too long to convert.
    """
    try:
        doc = json.loads(data, parse_constant=_refuse_constant)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{source} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"
                         ) from None
    except RecursionError:
        doc = _TOO_DEEP
    except ValueError as exc:  # JSONDecodeError; int() past sys.get_int_max_str_digits()
        raise ValueError(f"{source} is not valid JSON: {exc}") from None
    if doc is _TOO_DEEP or _deeper_than(doc, MAX_JSON_DEPTH):
        raise ValueError(f"{source} is not valid JSON: it is nested more than {MAX_JSON_DEPTH} deep")
    return doc


#: The most :func:`read_json` reads of one document: far above any config, record or state file
#: podshim writes or takes, far below what would hurt a daemon to hold.
MAX_JSON_BYTES = 64 << 20


def read_json(path: str, *, limit: int = MAX_JSON_BYTES) -> Any:
    """Read and decode the JSON file ``path`` (a regular file of at most ``limit`` bytes, as
    :func:`read_regular`); ValueError naming it as :func:`decode_json` says, OSError when it
    cannot be read."""
    return decode_json(read_regular(path, limit), path)


def read_regular(path: str, limit: int) -> bytes:
    """The whole of the regular file ``path`` when it holds at most ``limit`` bytes.

    For a file someone else names (a config, a seccomp profile, a record): it is opened without
    blocking and refused unless it is a regular file, so a FIFO, a device (/dev/zero) or a
    socket neither hangs the reader nor feeds it without end; and never more than ``limit`` + 1
    bytes are read, whatever the file claims. Raises OSError, whose ``strerror`` is a sentence:
    EINVAL "not a regular file (...)", EFBIG "larger than N bytes", or the open's own.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"not a regular file ({_file_kind(st.st_mode)})", path)
        chunks: list[bytes] = []
        size = 0
        while size <= limit and (chunk := os.read(fd, min(65536, limit + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes", path)
    return b"".join(chunks)


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a file"


_TOO_DEEP = object()


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _deeper_than(doc: Any, limit: int) -> bool:
    # Iterative: a walk that recursed would hit the interpreter's limit on what it checks.
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def fsync_dir(path: str) -> None:
    """fsync a directory: a rename or unlink in it is durable only once its entry is on disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_file(path: str) -> bytes:
    """The whole of a kernel file (/proc, cgroupfs) in read(2)s, without Python's file objects
    (a third of their cost on a small file). Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return read_all(fd)
    finally:
        os.close(fd)


def read_all(fd: int) -> bytes:
    """Everything ``fd`` gives until EOF, read from where it is. Raises OSError."""
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def write_temporary(path: str, data: bytes, *, mode: int = 0o600, durable: bool = True) -> str:
    """``data`` in a new file next to ``path``, named as :func:`write_atomic`'s temporary files
    (a '.' first), fsynced when ``durable``; its path, for the caller to rename into place (or
    unlink). Made apart from the rename so that a caller can make it before it takes a lock that
    the rename needs."""
    fd, tmp = _temporary(path)
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
    except BaseException:
        unlink_quietly(tmp)
        raise
    return tmp


def write_atomic(path: str, data: bytes, *, mode: int = 0o600, durable: bool = True,
                 sync_dir: bool = True) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename.

    The temporary name starts with '.', so a directory scan never takes it for the real file.
    ``durable`` fsyncs the file and then the directory, so the new content survives a power
    cut; runtime state that a reboot makes meaningless anyway skips that, and replaces an
    existing file by exchanging the two names (see :func:`_exchange`). ``sync_dir=False``
    leaves the directory's fsync to a caller that writes several files in it (one fsync_dir
    after the batch).
    """
    directory = os.path.dirname(path) or "."
    tmp = write_temporary(path, data, mode=mode, durable=durable)
    try:
        if not durable and _swap_in(tmp, path):
            os.unlink(tmp)  # it now holds the old content
        else:
            os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise
    if durable and sync_dir:
        fsync_dir(directory)


class Rewriter:
    """One file that its one writer replaces again and again (a shim's state.json), with
    :func:`write_atomic`'s non-durable guarantee: a reader sees the old content or the new,
    never half.

    A new inode costs 30-60 µs, and 0.3-0.7 ms in a crowded ext4 block group (/tmp here);
    so the exchange's leftover, the version before, is kept under its temporary name (the
    *spare*) and the next write fills it and exchanges it back, instead of making a new file
    and unlinking the old one. The spare is written only when nobody else has it open: a reader
    that opened the file before it was exchanged away must keep reading the version it opened.
    A write lease (fcntl F_SETLEASE) is granted only when no other open file refers to the
    inode, and holds off a new opener (of the temporary name: nobody) until the spare is
    written; where the lease is refused (a reader, no leases on this filesystem) the spare is
    unlinked and a new file made, as write_atomic does. :meth:`close` removes the spare.
    """

    def __init__(self, path: str, *, mode: int = 0o600) -> None:
        self.path = path
        self.mode = mode
        self._spare: str | None = None

    def write(self, data: bytes) -> None:
        """Replace the file's content with ``data``. Raises OSError as :func:`write_atomic`."""
        fd, tmp = self._take_spare()
        if fd is None:
            fd, tmp = _temporary(self.path)
        try:
            try:
                view, offset = memoryview(data), 0
                while offset < len(view):
                    offset += os.pwrite(fd, view[offset:], offset)
                os.ftruncate(fd, len(view))  # a longer version was there; never to 0 (see below)
                os.fchmod(fd, self.mode)
            finally:
                os.close(fd)  # ends the lease
            if _swap_in(tmp, self.path):
                self._spare = tmp  # it now holds the version before
            else:
                os.replace(tmp, self.path)
        except BaseException:
            self._spare = None
            unlink_quietly(tmp)
            raise

    def close(self) -> None:
        """Remove the spare (idempotent); a later write makes a new one."""
        if self._spare is not None:
            unlink_quietly(self._spare)
            self._spare = None

    @staticmethod
    def remove_leftovers(path: str) -> list[str]:
        """Remove what a writer of ``path`` that was killed left: its spare (and a temporary file
        a write had not renamed yet). Only while no writer of ``path`` runs. Returns their paths."""
        directory = os.path.dirname(path) or "."
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return []
        gone = [os.path.join(directory, name) for name in names if _is_temporary(name, path)]
        for leftover in gone:
            unlink_quietly(leftover)
        return gone

    def _take_spare(self) -> tuple[int | None, str]:
        """The spare opened for writing under a write lease, or (None, "") when there is none
        to use (then none is kept)."""
        spare, self._spare = self._spare, None
        if spare is None:
            return None, ""
        try:
            fd = os.open(spare, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            unlink_quietly(spare)
            return None, ""
        try:
            # A lease break would signal us (SIGIO, whose default ends a process); SIGURG's
            # default is to ignore it. Truncating to 0 would make ext4 flush the file at close
            # (auto_da_alloc): the content is overwritten and cut to its length instead.
            fcntl.fcntl(fd, fcntl.F_SETSIG, signal.SIGURG)
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
        except OSError:  # EAGAIN: a reader has it open; EINVAL, EACCES: no lease here
            os.close(fd)
            unlink_quietly(spare)
            return None, ""
        return fd, spare


def unlink_quietly(path: str) -> None:
    """Unlink ``path``; nothing when it is gone already. Raises other OSErrors."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def rename_noreplace(src: str, dst: str) -> bool:
    """Rename ``src`` to ``dst`` unless ``dst`` exists, atomically (renameat2 RENAME_NOREPLACE):
    of two processes renaming onto one name, exactly one wins, and nothing is ever replaced (a
    plain rename replaces an empty directory). Raises FileExistsError when ``dst`` exists, other
    OSErrors as rename does; False when the filesystem or libc cannot do it (nothing renamed).
    """
    if _renameat2_or_none() is None:
        return False
    return _rename2(src, dst, _RENAME_NOREPLACE)


_TEMPORARY_RANDOM_BYTES = 6  # a temporary file's name ends in twice as many hex digits


def _temporary(path: str) -> tuple[int, str]:
    """A new file ``.<name>.<random>`` next to ``path`` (0600, close-on-exec): tempfile.mkstemp's
    contract, without importing tempfile (and random, shutil...) into every shim."""
    directory, prefix = os.path.dirname(path) or ".", "." + os.path.basename(path) + "."
    while True:
        tmp = os.path.join(directory, prefix + os.urandom(_TEMPORARY_RANDOM_BYTES).hex())
        try:
            return os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600), tmp
        except FileExistsError:  # 48 random bits taken already: draw again
            continue


def _is_temporary(name: str, path: str) -> bool:
    """Whether ``name`` (in ``path``'s directory) is one of :func:`_temporary`'s files for ``path``."""
    prefix = "." + os.path.basename(path) + "."
    suffix = name[len(prefix):]
    return (name.startswith(prefix) and len(suffix) == 2 * _TEMPORARY_RANDOM_BYTES
            and all(c in "0123456789abcdef" for c in suffix))


def _swap_in(tmp: str, path: str) -> bool:
    """Put ``tmp`` at ``path`` by exchanging the two (:func:`_exchange`): True, and ``tmp`` then
    names the old content; False when they cannot be exchanged (the caller renames). A directory
    at ``path`` is put back and IsADirectoryError raised, as a rename over it would."""
    if not _exchange(tmp, path):
        return False
    if stat.S_ISDIR(os.lstat(tmp).st_mode):
        _exchange(tmp, path)
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    return True


def _exchange(tmp: str, path: str) -> bool:
    """Swap the names ``tmp`` and ``path`` atomically; False if that cannot be done here.

    ext4 (auto_da_alloc) starts writing a file's data out when a rename replaces another file
    with it: 150 µs per state.json update on this project's machines, several per sandbox.
    An exchange does not, and leaves the old content under ``tmp`` for the caller: to unlink
    (:func:`write_atomic`) or to fill with the next version (:class:`Rewriter`).
    False when ``path`` does not exist yet, or the filesystem or libc has no RENAME_EXCHANGE:
    the caller renames instead.
    """
    if _renameat2_or_none() is None:
        return False
    try:
        return _rename2(tmp, path, _RENAME_EXCHANGE)
    except FileNotFoundError:
        return False


def _renameat2_or_none() -> Any:
    """libc's renameat2, loaded on first use; None where libc has none (older than 2.28)."""
    global _renameat2
    if _renameat2 is None:
        import ctypes  # here, not at the top: a client importing shim.rpc never pays for it

        try:
            fn = ctypes.CDLL(None, use_errno=True).renameat2
            fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
            _renameat2 = fn
        except AttributeError:
            _renameat2 = False
    return _renameat2 or None


def _rename2(src: str, dst: str, flags: int) -> bool:
    """renameat2(src, dst, flags): True when done, False when this filesystem cannot do it;
    raises OSError (FileExistsError, FileNotFoundError...) for anything else."""
    import ctypes

    if _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EXDEV, errno.EPERM, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), dst)


def write_json_atomic(path: str, doc: Any, mode: int = 0o600, *, durable: bool = True, sync_dir: bool = True) -> None:
    """Write JSON so a reader sees the old file or the new one, never half (write + rename).

    ``durable`` also fsyncs, so the new file survives a power cut; runtime state that a reboot
    makes meaningless anyway (state.json, bootstrap.json) skips it. ``sync_dir``: as
    :func:`write_atomic`'s.
    """
    write_atomic(path, json_document(doc), mode=mode, durable=durable, sync_dir=sync_dir)


def json_document(doc: Any) -> bytes:
    """The bytes of a JSON file podshim writes: sorted keys, one line, a newline."""
    return (json.dumps(doc, sort_keys=True) + "\n").encode()
