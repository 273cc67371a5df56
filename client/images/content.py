"""The content store: blobs (manifests, configs, layers) by digest, as containerd keeps them.

A blob is the file ``<root>/blobs/sha256/<hex>`` (``<root>`` is ``<state root>/images/content``).
Only a verified blob is ever there: a blob comes in from a file or from bytes, its size and sha256
are checked through the very descriptor that is then renamed into place (same filesystem, so the
rename is atomic), and a file that does not match is refused with a :class:`BlobError` naming the
digest. Files being written live under ``<root>/ingest/``, which :meth:`ContentStore.open` empties
(what a killed daemon was writing is never taken for a blob). Blobs are 0600 in 0700 directories.

A blob can still be damaged on disk later (a flipped bit, a truncation, a symbolic link put in
its place). It heals: :meth:`read` and :meth:`check` verify it again and remove a damaged one,
and a blob added again replaces what was there, so the next pull downloads it and the store has
it whole again. A blob's file is never opened through a symbolic link: one is damage.
Synchronous: callers on an event loop run the verifying calls in a thread.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import stat
import tempfile

from shim.lib.files import ensure_private_dir, fsync_dir, write_atomic
from shim.lib.trees import remove_tree

from .reference import ReferenceError, check_digest

__all__ = ["BLOBS_DIR", "INGEST_DIR", "BlobError", "ContentStore", "file_digest", "sha256_digest"]

log = logging.getLogger(__name__)

BLOBS_DIR = os.path.join("blobs", "sha256")
INGEST_DIR = "ingest"
_CHUNK_BYTES = 1 << 20
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


class BlobError(ValueError):
    """A blob whose content is not what its digest or size says, or no blob at all; the message
    names the digest."""


def sha256_digest(data: bytes) -> str:
    """``sha256:<hex>`` of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def file_digest(path: str) -> str:
    """``sha256:<hex>`` of the file at ``path``. Raises OSError."""
    fd = os.open(path, _READ_FLAGS)
    try:
        return _sha256_fd(fd)
    finally:
        os.close(fd)


def _sha256_fd(fd: int) -> str:
    hasher = hashlib.sha256()
    while chunk := os.read(fd, _CHUNK_BYTES):
        hasher.update(chunk)
    return "sha256:" + hasher.hexdigest()


def _checked(digest: str) -> str:
    try:
        return check_digest(digest, "blob digest")
    except ReferenceError as exc:
        raise BlobError(str(exc)) from None


class ContentStore:
    """Blobs by digest under ``root``."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.blobs = os.path.join(root, BLOBS_DIR)
        self.ingest = os.path.join(root, INGEST_DIR)

    def open(self) -> ContentStore:
        """Make the directories (0700) and remove whatever an earlier process left in ingest/;
        returns self. Raises OSError."""
        for path in (self.root, os.path.dirname(self.blobs), self.blobs):
            ensure_private_dir(path, 0o700)
        try:
            remove_tree(self.ingest)
        except OSError as exc:  # never a reason not to start: tried again at the next start
            log.warning("cannot remove what an earlier process left in %s: %s", self.ingest, exc)
        ensure_private_dir(self.ingest, 0o700)
        return self

    def path(self, digest: str) -> str:
        """Where the blob ``digest`` is (whether or not it is there). BlobError for a bad digest."""
        return os.path.join(self.blobs, _checked(digest).partition(":")[2])

    def has(self, digest: str) -> bool:
        """Whether the blob ``digest`` is in the store."""
        try:
            return stat.S_ISREG(os.lstat(self.path(digest)).st_mode)
        except FileNotFoundError:
            return False

    def read(self, digest: str) -> bytes:
        """The blob's bytes (for manifests and configs, which are small), checked against its
        digest. BlobError when absent, or when damaged on disk (it is then removed, so that the
        next pull fetches it again)."""
        try:
            fd = self._open(digest)
        except FileNotFoundError:
            raise BlobError(f"blob {digest} is not in the content store") from None
        if fd is None:
            raise BlobError(f"blob {digest} was damaged in the content store (it is a symbolic link); "
                            "it was removed, and a pull fetches it again")
        with open(fd, "rb") as f:
            data = f.read()
        actual = sha256_digest(data)
        if actual != digest:
            self.remove(digest)
            raise BlobError(f"blob {digest} was damaged in the content store (its sha256 is now {actual}); "
                            "it was removed, and a pull fetches it again")
        return data

    def check(self, digest: str) -> bool:
        """Whether the stored blob ``digest`` still has its digest; a damaged one is removed (the
        next pull fetches it again). False when absent."""
        try:
            fd = self._open(digest)
        except FileNotFoundError:
            return False
        if fd is None:
            return False
        try:
            intact = _sha256_fd(fd) == digest
        finally:
            os.close(fd)
        if not intact:
            self.remove(digest)
        return intact

    def _open(self, digest: str) -> int | None:
        """A descriptor of the blob's file, never opened through a symbolic link: a link in its
        place is damage, removed as a damaged blob is (None then). FileNotFoundError when absent."""
        try:
            return os.open(self.path(digest), _READ_FLAGS)
        except OSError as exc:
            if exc.errno != errno.ELOOP:  # O_NOFOLLOW's answer for a symbolic link
                raise
        self.remove(digest)
        return None

    def digests(self) -> set[str]:
        """Every blob's digest."""
        try:
            names = os.listdir(self.blobs)
        except FileNotFoundError:
            return set()
        return {"sha256:" + name for name in names if len(name) == 64 and not name.startswith(".")}

    def temporary_dir(self, prefix: str) -> str:
        """A new private directory under ingest/ (same filesystem as the blobs, so files made
        there can be added with a rename); the caller removes it."""
        return tempfile.mkdtemp(prefix=prefix, dir=self.ingest)

    def add_bytes(self, data: bytes, digest: str) -> str:
        """Store ``data`` as the blob ``digest``; its path. BlobError if ``data`` has another digest."""
        actual = sha256_digest(data)
        if actual != _checked(digest):
            raise BlobError(f"blob {digest} has the wrong content: its sha256 is {actual}")
        path = self.path(digest)
        try:
            fd = self._open(digest)
        except FileNotFoundError:
            fd = None
        if fd is not None:
            with open(fd, "rb") as f:
                if f.read() == data:
                    return path
        write_atomic(path, data)  # a temporary '.name' beside it, fsynced, renamed (over a damaged one)
        return path

    def add_file(self, source: str, digest: str, size: int | None = None, *, verified: bool = False,
                 durable: bool = False) -> str:
        """Move the file ``source`` (on the store's filesystem: under :meth:`temporary_dir`) in
        as the blob ``digest`` once its size (when given) and sha256 match; its path. Raises
        BlobError naming the blob when they do not (``source`` is then left to its owner).

        ``verified``: the caller hashed this very file already (:func:`file_digest`), so only
        its size is checked here; ``durable``: its writer fsynced it (skopeo does), so it is not
        fsynced again. A blob of that digest already in the store is replaced: the new file is
        checked, the old one may have been damaged on disk since. Call :meth:`sync` after a batch."""
        path = self.path(digest)
        fd = os.open(source, _READ_FLAGS)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise BlobError(f"blob {digest} is not a regular file")
            if size is not None and st.st_size != size:
                raise BlobError(f"blob {digest} is {st.st_size} bytes, but its descriptor says {size}: "
                                "it is truncated or corrupt")
            if not verified:
                actual = _sha256_fd(fd)
                if actual != digest:
                    raise BlobError(f"blob {digest} has the wrong content: its sha256 is {actual}")
            if stat.S_IMODE(st.st_mode) != 0o600:
                os.fchmod(fd, 0o600)
            if not durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.rename(source, path)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            raise OSError(errno.EXDEV, f"{source} is not on the content store's filesystem", source) from None
        return path

    def sync(self) -> None:
        """Make the renames into blobs/ durable (one directory fsync for many blobs)."""
        fsync_dir(self.blobs)

    def remove(self, digest: str) -> bool:
        """Remove the blob ``digest``; whether it was there."""
        try:
            os.unlink(self.path(digest))
            return True
        except FileNotFoundError:
            return False

