"""Hand-made image layers for the unpacker and snapshotter tests, and a way to compare trees.

A layer is written with tarfile from a list of :func:`member` tuples, so every test shows exactly
what its tar holds. :func:`tree` describes a directory (or an overlay mount) by everything the
unpacker must keep: type, mode, owner, mtime, device number, link target, content, xattrs.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import subprocess
import tarfile
from dataclasses import dataclass
from typing import Any

from client.images.snapshots import Mount

__all__ = ["Layer", "deep_tree", "member", "make_layer", "tree", "mount_overlay", "mounted", "umount"]

MTIME = 1_700_000_000


def member(name: str, kind: str = "file", data: bytes = b"", *, mode: int | None = None, uid: int = 0,
           gid: int = 0, mtime: int | str = MTIME, link: str = "", dev: tuple[int, int] = (0, 0),
           xattrs: dict[str, str] | None = None) -> tuple[tarfile.TarInfo, bytes]:
    """One tar member: kind is file, dir, symlink, hardlink, char, block or fifo. ``mtime`` as a
    string ("1700000000.123456789") goes into a PAX header, to the nanosecond."""
    info = tarfile.TarInfo(name)
    info.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
                 "hardlink": tarfile.LNKTYPE, "char": tarfile.CHRTYPE, "block": tarfile.BLKTYPE,
                 "fifo": tarfile.FIFOTYPE}[kind]
    info.mode = mode if mode is not None else (0o755 if kind == "dir" else 0o644)
    info.uid, info.gid = uid, gid
    info.linkname = link
    info.devmajor, info.devminor = dev
    info.size = len(data) if kind == "file" else 0
    pax = {f"SCHILY.xattr.{k}": v for k, v in (xattrs or {}).items()}
    if isinstance(mtime, str):
        pax["mtime"] = mtime
        info.mtime = int(mtime.split(".")[0])
    else:
        info.mtime = mtime
    info.pax_headers = pax
    return info, data


@dataclass(frozen=True)
class Layer:
    path: str
    diff_id: str
    media_type: str


def make_layer(path: str, members: list[tuple[tarfile.TarInfo, bytes]], compression: str = "tar") -> Layer:
    """Write ``members`` as a PAX tar at ``path`` (+.gz/.zst), return it with its diff_id."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    raw = buf.getvalue()
    diff_id = "sha256:" + hashlib.sha256(raw).hexdigest()
    if compression == "gzip":
        blob, media_type = gzip.compress(raw, 1), "application/vnd.oci.image.layer.v1.tar+gzip"
    elif compression == "zstd":
        blob = subprocess.run(["zstd", "-q", "-c"], input=raw, stdout=subprocess.PIPE, check=True).stdout
        media_type = "application/vnd.oci.image.layer.v1.tar+zstd"
    else:
        blob, media_type = raw, "application/vnd.oci.image.layer.v1.tar"
    with open(path, "wb") as f:
        f.write(blob)
    return Layer(path, diff_id, media_type)


def tree(root: str) -> dict[str, tuple[Any, ...]]:
    """Everything under ``root`` (not root itself) by relative path: (type, mode, uid, gid,
    mtime_ns, rdev, link target or sha256 of content, sorted xattrs)."""
    out: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                what = os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    what = hashlib.sha256(f.read()).hexdigest()[:16]
            else:
                what = ""
            xattrs = tuple(sorted((k, os.getxattr(path, k, follow_symlinks=False))
                                  for k in os.listxattr(path, follow_symlinks=False)))
            out[os.path.relpath(path, root)] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid,
                                                st.st_gid, st.st_mtime_ns, st.st_rdev, what, xattrs)
    return out


def deep_tree(top: str, depth: int, name: str = "d") -> None:
    """``depth`` nested directories ``name`` in ``top`` and a file ``f`` in the deepest, made
    relative to descriptors: the whole path may be longer than PATH_MAX, as a container can make
    it in its own root file system. Remove it with shim.lib.trees.remove_tree (pytest's own
    removal of tmp_path recurses, and fails past Python's recursion limit)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    finally:
        os.close(fd)


def mount_overlay(target: str, mounts: list[Mount]) -> None:
    """Mount what the snapshotter's prepare returned on ``target`` (mount(8), as the shim would)."""
    for m in mounts:
        kind = [] if m.type == "bind" else ["-t", m.type]  # mount(8) takes a bind as an option
        subprocess.run(["mount", *kind, "-o", ",".join(m.options), m.source, target], check=True,
                       capture_output=True)


def umount(target: str) -> None:
    """Unmount whatever is mounted on ``target``."""
    while mounted(target):
        subprocess.run(["umount", target], check=True, capture_output=True)


def mounted(target: str) -> bool:
    """Whether something is mounted on ``target`` (a bind mount from the same file system too,
    which os.path.ismount cannot tell)."""
    real = os.path.realpath(target)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == real for line in f)
