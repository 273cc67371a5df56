"""Applying one image layer to an empty directory, in overlayfs's own format.

A layer is a tar (plain, gzip or zstd) of the changes one build step made. :func:`apply_layer`
streams it into an empty directory that becomes one overlayfs lower layer, converting the OCI
whiteouts as containerd's overlayfs snapshotter does (``archive.OverlayConvertWhiteout``):

- ``DIR/.wh.NAME`` becomes ``DIR/NAME``, a character device 0:0 (overlayfs's whiteout), owned
  as the tar header says;
- ``DIR/.wh..wh..opq`` becomes the xattr ``trusted.overlay.opaque=y`` on ``DIR``;
- other ``.wh..wh.`` names are AUFS bookkeeping and are skipped, as containerd skips them.

Everything else is recreated exactly: regular files, directories, hard links (within the layer),
symbolic links, character and block devices, fifos; mode (with setuid, setgid, sticky), numeric
uid/gid, mtime and atime to the nanosecond (PAX), xattrs (PAX ``SCHILY.xattr.*``). Directory
times are set last, once nothing more is made inside them.

A layer cannot reach outside its directory: absolute names, ``..`` components, names that go
through a symbolic link, and hard links to something this layer does not hold are refused with
:class:`BadLayer`. The layer's diff_id (the sha256 of the uncompressed tar, every byte to the
end of the stream) is computed while unpacking and checked against the image config's.

Speed: the blob is read and decompressed (zlib in a thread, which runs without the GIL; ``zstd``
in a child process) and hashed while this thread writes files, in MiB chunks; file data goes
from the decompressed chunk to the file with no copy in between. Unpacking is blocking work:
async callers run it in a worker thread. Layers of one image are independent directories, so the
snapshotter unpacks them side by side (client.images.snapshots).
"""

from __future__ import annotations

import errno
import hashlib
import os
import queue
import re
import shutil
import stat
import subprocess
import tarfile
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from shim.lib.trees import remove_tree
from shim.rpc.status import InvalidArgument, ResourceExhausted, Unimplemented

__all__ = ["BadLayer", "DigestMismatch", "LAYER_MEDIA_TYPES", "LayerStats", "UnpackLimit", "apply_layer",
           "compression_of"]

_GZIP, _ZSTD, _TAR = "gzip", "zstd", "tar"

#: The layer media types a layer may have, and the compression each names (OCI image-spec
#: media-types.md; Docker image manifest v2 schema 2).
LAYER_MEDIA_TYPES: dict[str, str] = {
    "application/vnd.oci.image.layer.v1.tar": _TAR,
    "application/vnd.oci.image.layer.v1.tar+gzip": _GZIP,
    "application/vnd.oci.image.layer.v1.tar+zstd": _ZSTD,
    "application/vnd.oci.image.layer.nondistributable.v1.tar": _TAR,
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip": _GZIP,
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd": _ZSTD,
    "application/vnd.docker.image.rootfs.diff.tar": _TAR,
    "application/vnd.docker.image.rootfs.diff.tar.gzip": _GZIP,
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip": _GZIP,
}

WHITEOUT_PREFIX = ".wh."
WHITEOUT_META_PREFIX = ".wh..wh."
WHITEOUT_OPAQUE = ".wh..wh..opq"
OPAQUE_XATTR = "trusted.overlay.opaque"

#: Bytes read from the blob at a time, and the most one decompressed chunk holds.
CHUNK_BYTES = 1 << 20
#: Decompressed chunks waiting for the writer: bounds memory to a few MiB per layer.
QUEUE_CHUNKS = 8
#: The share of its file system's size a pull leaves free (what unprivileged users could still
#: use, statvfs's f_bavail): kubelet's image garbage collection and eviction act before that.
MIN_FREE_FRACTION = 0.05
#: Bytes unpacked between two looks at the free space.
FREE_CHECK_BYTES = 64 << 20

#: The largest PAX or GNU long-name header a layer may have, as containerd's reader (Go's
#: archive/tar) bounds them: such a header is read whole into memory before it is used.
MAX_HEADER_BYTES = 1 << 20
#: The largest uid, gid or device number a file can have ((uid_t) -1 means "no change").
MAX_ID = (1 << 32) - 2
#: The times a file can have: a signed 64-bit count of seconds (time_t).
MAX_TIME_NS = ((1 << 63) - 1) * 1_000_000_000
MIN_TIME_NS = -(1 << 63) * 1_000_000_000
_HEADER_KINDS = {tarfile.XHDTYPE: "PAX", tarfile.XGLTYPE: "PAX global", tarfile.GNUTYPE_LONGNAME: "GNU long name",
                 tarfile.GNUTYPE_LONGLINK: "GNU long link name"}
#: The longest path Linux takes, with its NUL (<linux/limits.h>): a member whose path in the
#: layer's directory is longer could be made only relative to descriptors, and nothing could
#: open it by its name (containerd refuses it too, with ENAMETOOLONG).
PATH_MAX = 4096

_BLOCK = 512
_ZERO_BLOCK = bytes(_BLOCK)
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_XATTR_PREFIX = "SCHILY.xattr."
_F_SETPIPE_SZ = 1031
#: Errors making an entry that come from what the layer says (a name too long, a device number
#: or a link count the file system refuses), not from the machine.
_LAYER_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.EINVAL, errno.EMLINK, errno.ERANGE, errno.EEXIST})


def _shortened(name: str, keep: int = 80) -> str:
    """``name`` quoted, cut in the middle when it is long (a hostile one may be megabytes)."""
    if len(name) <= 2 * keep:
        return repr(name)
    return f"{name[:keep]!r}...{name[-keep:]!r}"


class BadLayer(InvalidArgument):
    """The layer is not a tar this unpacker accepts: corrupt, truncated, escaping its directory,
    or of an unknown media type. The message names the layer and says what is wrong."""


class DigestMismatch(BadLayer):
    """The uncompressed layer's sha256 is not the diff_id the image config gives for it."""


class UnpackLimit:
    """What one pull may unpack, for all its layers together (they unpack side by side, each in
    a thread: this is thread-safe): at most ``max_bytes`` of uncompressed layer stream, headers
    included, so that neither a decompression bomb (gigabytes of zeros in a few megabytes of
    gzip) nor a flood of tiny files writes more than the node allows; and never so much that the
    file system holding ``directory`` keeps less than :data:`MIN_FREE_FRACTION` of its size free
    (looked at when the first byte is taken and every :data:`FREE_CHECK_BYTES` after).
    ``setting`` names where ``max_bytes`` comes from, for the message."""

    def __init__(self, max_bytes: int, directory: str, *, setting: str = "") -> None:
        self.max_bytes = max_bytes
        self.directory = directory
        self.setting = setting
        self.used = 0
        self._next_check = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        """Count ``n`` more bytes unpacked. Raises ResourceExhausted with a sentence once the
        total passes ``max_bytes``, or the file system's free space is below its reserve."""
        with self._lock:
            self.used += n
            used, check = self.used, self.used >= self._next_check
            if check:
                self._next_check = used + FREE_CHECK_BYTES
        if used > self.max_bytes:
            raise ResourceExhausted(f"the image's layers unpack to more than {self.max_bytes} bytes, the most one "
                                    f"pull may write{f' ({self.setting})' if self.setting else ''}; nothing of it "
                                    "was kept")
        if check:
            st = os.statvfs(self.directory)
            free, reserve = st.f_bavail * st.f_frsize, int(st.f_blocks * st.f_frsize * MIN_FREE_FRACTION)
            if free < reserve:
                raise ResourceExhausted(f"the file system of {self.directory} has {free} bytes free, less than the "
                                        f"{MIN_FREE_FRACTION:.0%} of its size a pull leaves free ({reserve} bytes); "
                                        "nothing of the image was kept: free space (remove unused images) and "
                                        "pull again")


@dataclass(frozen=True)
class LayerStats:
    """What :func:`apply_layer` made: the diff_id it computed, the bytes of file data written
    (each inode once), the inodes made (whiteouts included) and the blob's compression as its
    first bytes show it ("gzip", "zstd" or "tar")."""

    diff_id: str
    bytes: int
    inodes: int
    compression: str = ""


def apply_layer(dest: str, blob_path: str, media_type: str | None = None, *,
                diff_id: str | None = None, limit: UnpackLimit | None = None) -> LayerStats:
    """Unpack the layer blob at ``blob_path`` into the empty directory ``dest`` (see the module
    docstring for the format) and return its :class:`LayerStats`.

    ``media_type`` is the layer descriptor's (one of :data:`LAYER_MEDIA_TYPES`); None accepts
    any of them. The compression is read from the blob's first bytes, as containerd does, and
    must agree with the media type. ``diff_id`` ("sha256:<hex>"), when given, must equal the
    uncompressed tar's sha256. ``limit``, when given, counts every uncompressed byte (see
    :class:`UnpackLimit`).

    Raises BadLayer (INVALID_ARGUMENT) for a layer that is corrupt, truncated, of an unknown
    media type, or reaches outside ``dest``; DigestMismatch (a BadLayer) for a wrong diff_id;
    Unimplemented for zstd when no ``zstd`` program is installed; ResourceExhausted past
    ``limit``; InvalidArgument when ``dest``
    is not an empty directory; OSError for the machine's own failures (ENOSPC...). On any error
    ``dest`` holds part of the layer: the caller removes it.
    """
    if media_type is not None and media_type not in LAYER_MEDIA_TYPES:
        raise BadLayer(f"layer {blob_path}: media type {media_type!r} is not a layer type this "
                       f"unpacker knows ({', '.join(sorted(LAYER_MEDIA_TYPES))})")
    if diff_id is not None and not _DIGEST.fullmatch(diff_id):
        raise InvalidArgument(f"diff_id {diff_id!r} is not a sha256 digest (sha256:<64 hex digits>)")
    _check_empty_dir(dest)
    with _Inflow(blob_path, media_type, limit) as inflow:
        writer = _Writer(dest, blob_path, inflow)
        try:
            writer.run()
        except BadLayer:
            # Garbage from a corrupt blob reads as a bad tar: when the decompressor fails further
            # on, its error is the one that says what is wrong.
            inflow.drain()
            raise
        inflow.drain()
        digest = inflow.digest()
    if diff_id is not None and digest != diff_id:
        raise DigestMismatch(f"layer {blob_path}: its uncompressed content has digest {digest}, "
                             f"not the diff_id {diff_id} the image config gives")
    return LayerStats(diff_id=digest, bytes=writer.bytes, inodes=writer.inodes, compression=inflow.kind)


def compression_of(media_type: str | None) -> str | None:
    """The compression ("gzip", "zstd", "tar") a layer media type names; None for a type that is
    not a layer's (or None)."""
    return LAYER_MEDIA_TYPES.get(media_type or "")


def _check_empty_dir(dest: str) -> None:
    try:
        fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise InvalidArgument(f"cannot unpack a layer into {dest}: {exc.strerror}") from None
    try:
        if os.listdir(fd):
            raise InvalidArgument(f"cannot unpack a layer into {dest}: the directory is not empty")
    finally:
        os.close(fd)


class _Inflow:
    """The layer's uncompressed bytes in chunks, hashed as they pass.

    A thread reads and decompresses the blob (zlib releases the GIL while it inflates, hashlib
    while it hashes) while the caller's thread writes files. It owns the ``zstd`` child, if
    any; :meth:`close` stops both, on success or failure.
    """

    def __init__(self, blob_path: str, media_type: str | None, limit: UnpackLimit | None = None):
        self._blob_path = blob_path
        self._limit = limit
        self._hash = hashlib.sha256()
        self._chunks: queue.Queue[bytes | BaseException | None] = queue.Queue(QUEUE_CHUNKS)
        self._stop = threading.Event()
        self._done = False
        self._proc: subprocess.Popen[bytes] | None = None
        try:
            # Unbuffered: reads are of CHUNK_BYTES anyway, and zstd gets the descriptor at offset 0.
            # Never through a symbolic link (a blob replaced by one is damage: BadLayer, and the
            # store's check removes it).
            self._file: IO[bytes] = open(blob_path, "rb", buffering=0,
                                         opener=lambda path, flags: os.open(path, flags | os.O_NOFOLLOW))
        except OSError as exc:
            raise BadLayer(f"layer {blob_path} cannot be read: {exc.strerror}") from None
        try:
            magic = os.pread(self._file.fileno(), 4, 0)
            kind = _GZIP if magic[:2] == b"\x1f\x8b" else _ZSTD if magic == b"\x28\xb5\x2f\xfd" else _TAR
            named = compression_of(media_type) or kind
            if named != kind:
                raise BadLayer(f"layer {blob_path} is {kind} data but its media type {media_type} says {named}")
            source: Iterator[bytes] = {_GZIP: self._gunzip, _ZSTD: self._unzstd, _TAR: self._read}[kind]()
            self.kind = kind
        except BaseException:
            self._file.close()
            raise
        self._thread = threading.Thread(target=self._produce, args=(source,), name="layer-inflow", daemon=True)
        self._thread.start()

    def __enter__(self) -> _Inflow:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def next_chunk(self) -> bytes | None:
        """The next decompressed chunk; None at the end of the stream. Raises BadLayer for a
        corrupt or truncated blob."""
        if self._done:
            return None
        item = self._chunks.get()
        if item is None:
            self._done = True
        elif isinstance(item, BaseException):
            self._done = True
            raise item
        return item

    def drain(self) -> None:
        """Read the stream to its end (the tar's trailing zero blocks count in the diff_id)."""
        while self.next_chunk() is not None:
            pass

    def digest(self) -> str:
        return "sha256:" + self._hash.hexdigest()

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():  # unblock a producer waiting for room in the queue
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()
            try:
                self._chunks.get(timeout=0.1)
            except queue.Empty:
                pass
        self._thread.join()
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            assert self._proc.stdout is not None and self._proc.stderr is not None
            self._proc.stdout.close()
            self._proc.stderr.close()
            self._proc.wait()
        self._file.close()

    def _produce(self, source: Iterator[bytes]) -> None:
        try:
            for chunk in source:
                if self._limit is not None:
                    self._limit.take(len(chunk))  # before the chunk is written: never past the limit
                self._hash.update(chunk)
                self._chunks.put(chunk)
                if self._stop.is_set():
                    return
            self._chunks.put(None)
        except BadLayer as exc:
            self._chunks.put(exc)
        except OSError as exc:
            self._chunks.put(BadLayer(f"layer {self._blob_path} cannot be read: {exc.strerror}"))
        except BaseException as exc:  # handed to the writer's thread, which raises it
            self._chunks.put(exc)

    def _read(self) -> Iterator[bytes]:
        while chunk := self._file.read(CHUNK_BYTES):
            yield chunk

    def _gunzip(self) -> Iterator[bytes]:
        # A gzip file may hold several members one after another (pigz, concatenated files).
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        pending = b""
        while True:
            if not pending:
                pending = self._file.read(CHUNK_BYTES // 4)
                if not pending:
                    if inflater.eof:
                        return
                    raise BadLayer(f"layer {self._blob_path}: the gzip stream is truncated")
                if inflater.eof:
                    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            try:
                out = inflater.decompress(pending, CHUNK_BYTES)
            except zlib.error as exc:
                raise BadLayer(f"layer {self._blob_path} is not valid gzip data: {exc}") from None
            pending = inflater.unconsumed_tail or inflater.unused_data
            if out:
                yield out
            if inflater.eof and pending:
                inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)

    def _unzstd(self) -> Iterator[bytes]:
        zstd = shutil.which("zstd")
        if zstd is None:
            raise Unimplemented(f"layer {self._blob_path} is zstd-compressed and this machine has no zstd "
                                "program to decompress it (Debian package zstd)")
        self._proc = subprocess.Popen([zstd, "-d", "-c", "-q", "--no-progress"], stdin=self._file,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=True)
        assert self._proc.stdout is not None and self._proc.stderr is not None
        out = self._proc.stdout.fileno()
        try:
            import fcntl

            fcntl.fcntl(out, _F_SETPIPE_SZ, CHUNK_BYTES)
        except OSError:
            pass  # a smaller pipe costs more reads, nothing else
        while chunk := os.read(out, CHUNK_BYTES):
            yield chunk
        if self._proc.wait() != 0:
            err = self._proc.stderr.read().decode(errors="replace").strip()
            raise BadLayer(f"layer {self._blob_path} is not valid zstd data: {err or 'zstd failed'}")


@dataclass
class _Entry:
    """One tar member, with the PAX and GNU extensions applied."""

    info: tarfile.TarInfo
    name: str
    linkname: str
    size: int
    mtime_ns: int
    atime_ns: int
    xattrs: dict[str, bytes]


class _Writer:
    """Reads tar members from an :class:`_Inflow` and makes them under ``dest``.

    ``kinds`` maps every path made so far (relative, "" for ``dest``) to what it is: "d", "l"
    (symlink) or "f" (anything else). Every path in it has only directories as ancestors, which
    is what lets a name be checked for a symlink on its way without a system call. ``children``
    indexes it by directory, so that forgetting a directory a later member replaced costs what
    it held, not a scan of everything made. ``dir_times`` holds the times to give directories
    at the end, by path.
    """

    def __init__(self, dest: str, blob_path: str, inflow: _Inflow):
        self.dest = dest
        self.blob = blob_path
        self.inflow = inflow
        self.kinds: dict[str, str] = {"": "d"}
        self.children: dict[str, set[str]] = {}
        self.dir_times: dict[str, tuple[int, int]] = {}
        self.bytes = 0
        self.inodes = 0
        self._chunk = memoryview(b"")
        self._pos = 0
        self._left = 0  # bytes of the current member's data not read yet

    # -- the stream ----------------------------------------------------------------------------

    def _take(self, n: int) -> memoryview:
        """Up to ``n`` (> 0) bytes of the stream, without copying; at least one."""
        if self._pos == len(self._chunk):
            chunk = self.inflow.next_chunk()
            if chunk is None:
                raise BadLayer(f"layer {self.blob}: the tar ends in the middle of an entry (truncated)")
            self._chunk, self._pos = memoryview(chunk), 0
        start = self._pos
        self._pos = min(start + n, len(self._chunk))
        return self._chunk[start:self._pos]

    def _read(self, n: int) -> bytes:
        if len(self._chunk) - self._pos >= n:
            start = self._pos
            self._pos += n
            return bytes(self._chunk[start:self._pos])
        parts = []
        while n:
            part = self._take(n)
            parts.append(bytes(part))
            n -= len(part)
        return b"".join(parts)

    def _skip(self, n: int) -> None:
        while n:
            n -= len(self._take(n))

    def _at_end(self) -> bool:
        """True at the end of the stream (a tar without its zero blocks ends on a member)."""
        if self._pos < len(self._chunk):
            return False
        while True:
            chunk = self.inflow.next_chunk()
            if chunk is None:
                return True
            if chunk:
                self._chunk, self._pos = memoryview(chunk), 0
                return False

    # -- members -------------------------------------------------------------------------------

    def _entries(self) -> Iterator[_Entry]:
        pax: dict[str, bytes] = {}
        long_name = long_link = None
        while not self._at_end():
            block = self._read(_BLOCK)
            if block == _ZERO_BLOCK:
                return  # end of archive; what follows is padding, hashed by drain()
            try:
                info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
            except tarfile.HeaderError as exc:
                raise BadLayer(f"layer {self.blob} is not a valid tar: {exc}") from None
            size = info.size
            if size < 0:  # a GNU base-256 field can say it; the stream would never move on
                raise BadLayer(f"layer {self.blob}: {_shortened(info.name)} has a negative size ({size})")
            if info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK):
                if size > MAX_HEADER_BYTES:  # before reading it: its data is held in memory whole
                    raise BadLayer(f"layer {self.blob}: a {_HEADER_KINDS[info.type]} header of {size} bytes is "
                                   f"larger than the {MAX_HEADER_BYTES} bytes a layer's headers may have")
                data = self._read(size)
                self._skip(-size % _BLOCK)
                if info.type == tarfile.XHDTYPE:
                    # A second one replaces the first, as in Go's archive/tar (containerd's reader):
                    # what is held for one entry stays within one header's bound.
                    pax = dict(self._pax_records(data))
                elif info.type == tarfile.GNUTYPE_LONGNAME:
                    long_name = self._text("GNU long name", data.rstrip(b"\0"))
                elif info.type == tarfile.GNUTYPE_LONGLINK:
                    long_link = self._text("GNU long link name", data.rstrip(b"\0"))
                # A global header (XGLTYPE) is skipped, as containerd skips it.
                continue
            name, linkname = long_name or info.name, long_link or info.linkname
            mtime_ns = int(info.mtime) * 1_000_000_000
            atime_ns = None
            xattrs = {}
            for key, value in pax.items():
                if key == "path":
                    name = self._text("PAX path", value)
                elif key == "linkpath":
                    linkname = self._text("PAX linkpath", value)
                elif key in ("size", "uid", "gid"):
                    number = self._pax_int(key, value)
                    if key == "size":
                        size = number
                    else:
                        setattr(info, key, number)
                elif key == "mtime":
                    mtime_ns = self._pax_time(key, value)
                elif key == "atime":
                    atime_ns = self._pax_time(key, value)
                elif key.startswith(_XATTR_PREFIX):
                    xattrs[key[len(_XATTR_PREFIX):]] = value
                elif key.startswith("GNU.sparse."):
                    raise BadLayer(f"layer {self.blob}: {name!r} is a sparse file, which layers do not use "
                                   "and this unpacker does not read")
            if info.type == tarfile.GNUTYPE_SPARSE:
                raise BadLayer(f"layer {self.blob}: {name!r} is a sparse file, which layers do not use "
                               "and this unpacker does not read")
            pax, long_name, long_link = {}, None, None
            self._check_numbers(name, info, mtime_ns, atime_ns)
            self._left = size
            yield _Entry(info, name, linkname, size, mtime_ns, mtime_ns if atime_ns is None else atime_ns, xattrs)
            # The member's data, or what of it the handler left unread, and the padding.
            self._skip(self._left + (-size % _BLOCK))

    def _pax_records(self, data: bytes) -> Iterator[tuple[str, bytes]]:
        pos = 0
        while pos < len(data):
            space = data.find(b" ", pos)
            try:
                length = int(data[pos:space])
                record = data[space + 1:pos + length]
                if space < 0 or length <= 0 or not record.endswith(b"\n") or b"=" not in record:
                    raise ValueError
            except ValueError:
                raise BadLayer(f"layer {self.blob}: a PAX header is malformed") from None
            key, _, value = record[:-1].partition(b"=")
            yield self._text("PAX record name", key), value
            pos += length

    def _text(self, what: str, value: bytes) -> str:
        """A name from a header; BadLayer for one with a NUL byte, which no Linux name can hold
        (Go's archive/tar, containerd's reader, refuses it too)."""
        if b"\0" in value:
            raise BadLayer(f"layer {self.blob}: a {what} holds a NUL byte "
                           f"({_shortened(value.decode('utf-8', 'replace'))}), which no file name can")
        return value.decode("utf-8", "surrogateescape")

    def _check_numbers(self, name: str, info: tarfile.TarInfo, mtime_ns: int, atime_ns: int | None) -> None:
        """Refuse owner, times and device numbers this machine cannot give a file (a tar header
        can say numbers of 95 bits, a PAX one of any length)."""
        for what, value in (("uid", info.uid), ("gid", info.gid)):
            if not 0 <= value <= MAX_ID:
                raise BadLayer(f"layer {self.blob}: {_shortened(name)} has {what} {value}, outside the ids Linux "
                               f"has (0 to {MAX_ID})")
        for what, ns in (("mtime", mtime_ns), ("atime", atime_ns)):
            if ns is not None and not MIN_TIME_NS <= ns <= MAX_TIME_NS:
                raise BadLayer(f"layer {self.blob}: {_shortened(name)} has {what} {ns // 1_000_000_000} s, outside "
                               "the times a file can have (a signed 64-bit count of seconds)")
        if info.type in (tarfile.CHRTYPE, tarfile.BLKTYPE):
            for what, value in (("major", info.devmajor), ("minor", info.devminor)):
                if not 0 <= value <= MAX_ID:
                    raise BadLayer(f"layer {self.blob}: device {_shortened(name)} has {what} number {value}, "
                                   "which no device has")

    def _pax_int(self, key: str, value: bytes) -> int:
        try:
            number = int(value)
            if number < 0:
                raise ValueError
            return number
        except ValueError:
            raise BadLayer(f"layer {self.blob}: PAX {key}={value!r} is not a number") from None

    def _pax_time(self, key: str, value: bytes) -> int:
        match = re.fullmatch(rb"(-?)(\d+)(?:\.(\d*))?", value)
        if match is None:
            raise BadLayer(f"layer {self.blob}: PAX {key}={value!r} is not a time")
        sign, seconds, fraction = match.groups()
        ns = int(seconds) * 1_000_000_000 + int((fraction or b"")[:9].ljust(9, b"0"))
        return -ns if sign else ns

    def _clean(self, name: str, what: str = "entry") -> str:
        if name.startswith("/"):
            raise BadLayer(f"layer {self.blob}: {what} {name!r} is an absolute path; layer paths are relative "
                           "to the layer's root")
        parts = [part for part in name.split("/") if part not in ("", ".")]
        if ".." in parts:
            raise BadLayer(f"layer {self.blob}: {what} {name!r} has a '..' component, which could reach "
                           "outside the layer")
        return "/".join(parts)

    # -- making things -------------------------------------------------------------------------

    def run(self) -> None:
        for entry in self._entries():
            rel = self._clean(entry.name)
            if len(os.fsencode(self._path(rel))) >= PATH_MAX:
                raise BadLayer(f"layer {self.blob}: entry {_shortened(entry.name)} is a path of "
                               f"{len(os.fsencode(rel))} bytes, longer than the {PATH_MAX} bytes Linux takes "
                               "in one path (PATH_MAX)")
            try:
                self._apply(entry, rel)
            except OSError as exc:
                if exc.errno not in _LAYER_ERRNOS:
                    raise  # the machine's failure (ENOSPC, EIO...), not the layer's
                raise BadLayer(f"layer {self.blob}: cannot make {rel!r}: {exc.strerror}") from None
        # Last, so that nothing made inside a directory afterwards changes its mtime.
        for rel, times in self.dir_times.items():
            os.utime(self._path(rel), ns=times, follow_symlinks=False)

    def _apply(self, entry: _Entry, rel: str) -> None:
        parent, _, base = rel.rpartition("/")
        self._ensure_dir(parent, rel)
        if not base.startswith(WHITEOUT_PREFIX):
            self._make(entry, rel)
        elif base == WHITEOUT_OPAQUE:
            os.setxattr(self._path(parent), OPAQUE_XATTR, b"y", follow_symlinks=False)
        elif not base.startswith(WHITEOUT_META_PREFIX):
            self._whiteout(entry, parent, base[len(WHITEOUT_PREFIX):])

    def _path(self, rel: str) -> str:
        return self.dest + "/" + rel if rel else self.dest

    def _ensure_dir(self, rel: str, child: str) -> None:
        """Make ``rel`` and its missing ancestors as plain directories (0755, root's), as
        containerd does for a member whose parents the tar does not list; refuse a name that
        goes through a symlink or a file."""
        missing = []
        at = rel
        while (kind := self.kinds.get(at)) is None:
            missing.append(at)
            at = at.rpartition("/")[0]
        if kind == "l":
            raise BadLayer(f"layer {self.blob}: {child!r} goes through the symbolic link {at!r}; a layer "
                           "cannot write through a link (it could point outside the layer)")
        if kind != "d":
            raise BadLayer(f"layer {self.blob}: {child!r} is inside {at!r}, which is not a directory")
        for at in reversed(missing):
            os.mkdir(self._path(at))
            os.chmod(self._path(at), 0o755)  # exactly, whatever the umask
            self._add(at, "d")
            self.inodes += 1

    def _clear(self, rel: str, keep_dir: bool = False) -> bool:
        """Remove what an earlier member made at ``rel`` (the later member wins, as in tar).
        True when it is a directory kept because ``keep_dir``."""
        kind = self.kinds.get(rel)
        if kind is None:
            return False
        if kind == "d":
            if keep_dir:
                return True
            if not rel:
                raise BadLayer(f"layer {self.blob}: an entry replaces the layer's root directory")
            remove_tree(self._path(rel))
        else:
            os.unlink(self._path(rel))
        self._forget(rel)
        return False

    def _add(self, rel: str, kind: str) -> None:
        self.kinds[rel] = kind
        self.children.setdefault(rel.rpartition("/")[0], set()).add(rel)

    def _forget(self, rel: str) -> None:
        """Forget ``rel`` and everything made below it."""
        self.children.get(rel.rpartition("/")[0], set()).discard(rel)
        stack = [rel]
        while stack:
            at = stack.pop()
            del self.kinds[at]
            self.dir_times.pop(at, None)
            stack.extend(self.children.pop(at, ()))

    def _whiteout(self, entry: _Entry, parent: str, name: str) -> None:
        if name in ("", ".", ".."):
            raise BadLayer(f"layer {self.blob}: {entry.name!r} is not a valid whiteout")
        rel = f"{parent}/{name}" if parent else name
        self._clear(rel)
        path = self._path(rel)
        os.mknod(path, stat.S_IFCHR, 0)
        os.chown(path, entry.info.uid, entry.info.gid, follow_symlinks=False)
        self._add(rel, "f")
        self.inodes += 1

    def _make(self, entry: _Entry, rel: str) -> None:
        info = entry.info
        path = self._path(rel)
        mode = info.mode & 0o7777
        kind = "f"
        if info.type in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE):
            self._clear(rel)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                self._write_data(fd, entry.size)
                os.chown(fd, info.uid, info.gid)
                os.chmod(fd, mode)  # after chown, which clears setuid and setgid
                self._set_xattrs(fd, rel, entry.xattrs)
                os.utime(fd, ns=(entry.atime_ns, entry.mtime_ns))
            finally:
                os.close(fd)
            self.bytes += entry.size
            self._add(rel, "f")
            self.inodes += 1
            return
        if info.type == tarfile.DIRTYPE:
            if not self._clear(rel, keep_dir=True):
                os.mkdir(path, 0o700)
                self.inodes += 1
            kind = "d"
        elif info.type == tarfile.LNKTYPE:
            target = self._clean(entry.linkname, "hard link target")
            if self.kinds.get(target) in (None, "d"):
                raise BadLayer(f"layer {self.blob}: hard link {rel!r} points to {entry.linkname!r}, which is not "
                               "a file this layer holds (a layer can link only to its own files)")
            if target == rel:
                return
            self._clear(rel)
            os.link(self._path(target), path, follow_symlinks=False)
            kind = self.kinds[target]
        elif info.type == tarfile.SYMTYPE:
            self._clear(rel)
            os.symlink(entry.linkname, path)
            kind = "l"
            self.inodes += 1
        elif info.type in (tarfile.CHRTYPE, tarfile.BLKTYPE):
            self._clear(rel)
            devtype = stat.S_IFCHR if info.type == tarfile.CHRTYPE else stat.S_IFBLK
            os.mknod(path, devtype | 0o600, os.makedev(info.devmajor, info.devminor))
            self.inodes += 1
        elif info.type == tarfile.FIFOTYPE:
            self._clear(rel)
            os.mkfifo(path, 0o600)
            self.inodes += 1
        else:
            raise BadLayer(f"layer {self.blob}: {entry.name!r} has tar type {info.type!r}, which is not a file "
                           "type a layer may hold")
        self._add(rel, kind)
        # containerd applies a hard link's header to the inode too (lchown, xattrs, lchmod, times).
        os.chown(path, info.uid, info.gid, follow_symlinks=False)
        if kind != "l":
            os.chmod(path, mode)
        self._set_xattrs(path, rel, entry.xattrs)
        if kind == "d":
            self.dir_times[rel] = (entry.atime_ns, entry.mtime_ns)
        else:
            os.utime(path, ns=(entry.atime_ns, entry.mtime_ns), follow_symlinks=False)

    def _write_data(self, fd: int, size: int) -> None:
        left = size
        while left:
            view = self._take(left)
            left -= len(view)
            while view:
                view = view[os.write(fd, view):]
        self._left = 0

    def _set_xattrs(self, target: Any, rel: str, xattrs: dict[str, bytes]) -> None:
        for name, value in xattrs.items():
            if name.startswith("trusted.overlay."):
                raise BadLayer(f"layer {self.blob}: {rel!r} carries overlayfs's own xattr {name}; a layer "
                               "says whiteouts and opaque directories with .wh. entries")
            try:
                # On a descriptor (a regular file) as it is; on a path, the link itself.
                os.setxattr(target, name, value, follow_symlinks=isinstance(target, int))
            except OSError as exc:
                # E2BIG: past the kernel's 64 KiB; ENOSPC: past what this file system keeps for a file.
                if exc.errno in (errno.ENOTSUP, errno.EPERM, errno.EINVAL, errno.ERANGE, errno.E2BIG, errno.ENOSPC):
                    raise BadLayer(f"layer {self.blob}: cannot set xattr {name} on {rel!r}: {exc.strerror}") from None
                raise
