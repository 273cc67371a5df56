"""The mount system calls, as thin ctypes wrappers: mount(2) and umount2(2), the new mount API
(open_tree, move_mount, mount_setattr, fsopen/fsconfig/fsmount) and statfs(2)'s filesystem type.

Both sides mount: the shim a task's root and its volumes, the pod layer an image volume's layers
(:mod:`shim.lib.rootfs`); :mod:`shim.kernel.linux` re-exports these with the shim's other system
calls. Every wrapper raises :class:`OSError` with the C ``errno`` (and the path, where there is
one), as the ``os`` module does. The standard library only.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Sequence

__all__ = ["MS_BIND", "MS_NODEV", "MS_NOEXEC", "MS_NOSUID", "MS_PRIVATE", "MS_RDONLY", "MS_REC", "MS_REMOUNT",
           "MS_SHARED", "MS_SLAVE", "MNT_DETACH", "MNT_FORCE", "UMOUNT_NOFOLLOW", "AT_RECURSIVE", "OPEN_TREE_CLOEXEC",
           "OPEN_TREE_CLONE", "check_result", "encode_path", "fs_type", "mount", "mount_fs", "mount_setattr", "move_mount", "new_mount", "open_tree",
           "umount2"]

# <linux/mount.h>
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_SLAVE = 1 << 19
MS_SHARED = 1 << 20

MNT_FORCE = 1
MNT_DETACH = 2
UMOUNT_NOFOLLOW = 8

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.statfs.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
_libc.syscall.restype = ctypes.c_long

# The new mount API's system call numbers are the same on every architecture (from 424 on).
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
AT_RECURSIVE = 0x8000
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOVE_MOUNT_T_EMPTY_PATH = 0x40


def check_result(result: int, *filenames: str | None) -> None:
    """OSError with the C ``errno`` (and ``filenames``) when a libc call's ``result`` is -1, as
    the ``os`` module raises: every ctypes wrapper here and in :mod:`shim.kernel.linux` checks so."""
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), *filenames)


def encode_path(value: str | bytes | None) -> bytes | None:
    """``value`` as the bytes a C call takes (None stays NULL)."""
    return os.fsencode(value) if value is not None else None


def mount(source: str | None, target: str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    """mount(2). Raises OSError naming ``target``."""
    check_result(_libc.mount(encode_path(source), encode_path(target), encode_path(fstype), flags, encode_path(data)), target)


def umount2(target: str, flags: int = 0) -> None:
    """umount2(2). Raises OSError naming ``target`` (EINVAL when it is not a mount point)."""
    check_result(_libc.umount2(encode_path(target), flags), target)


def open_tree(path: str, recursive: bool) -> int:
    """A detached copy of the mount at ``path`` (with the mounts below it when ``recursive``), as
    an fd to :func:`move_mount` elsewhere, in this or another mount namespace. Closing the fd
    unmounts the copy if it was never attached. Raises OSError naming ``path``."""
    flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | (AT_RECURSIVE if recursive else 0)
    fd: int = _libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, encode_path(path), ctypes.c_uint(flags))
    check_result(fd, path)
    return fd


def move_mount(fd: int, target: str | int, name: str = "") -> None:
    """Attach the detached mount ``fd`` (from :func:`open_tree` or :func:`new_mount`) on ``target``:
    a path, or an open fd (O_PATH will do), mounted on as it is with no path looked up again, so
    nothing can swap what it names in between. Raises OSError naming ``name`` or the path."""
    if isinstance(target, int):
        to_fd, to_path, flags = target, b"", _MOVE_MOUNT_F_EMPTY_PATH | _MOVE_MOUNT_T_EMPTY_PATH
    else:
        to_fd, to_path, flags = _AT_FDCWD, os.fsencode(target), _MOVE_MOUNT_F_EMPTY_PATH
    check_result(_libc.syscall(_SYS_MOVE_MOUNT, ctypes.c_int(fd), b"", ctypes.c_int(to_fd), to_path, ctypes.c_uint(flags)),
           name or (target if isinstance(target, str) else None))


def mount_setattr(fd: int, *, propagation: int = 0, flags: int = 0, recursive: bool = False,
                  userns_fd: int = -1) -> None:
    """mount_setattr(2) on the mount open on ``fd`` (attached or detached): ``propagation`` one of
    MS_PRIVATE, MS_SLAVE, MS_SHARED (0: unchanged), ``flags`` the MS_RDONLY, MS_NOSUID, MS_NODEV,
    MS_NOEXEC to set; ``userns_fd``, a user namespace whose mappings id-map the mount (a detached
    one, never mapped before: EINVAL where its filesystem cannot be); ``recursive``: on the
    mounts below it too. Raises OSError."""
    attrs = _mount_attrs(flags) | (_MOUNT_ATTR_IDMAP if userns_fd >= 0 else 0)
    attr = struct.pack("=4Q", attrs, 0, propagation, max(userns_fd, 0))  # attr_set, attr_clr, propagation, userns_fd
    check_result(_libc.syscall(_SYS_MOUNT_SETATTR, ctypes.c_int(fd), b"",
                         ctypes.c_uint(_AT_EMPTY_PATH | (AT_RECURSIVE if recursive else 0)), attr,
                         ctypes.c_size_t(len(attr))))


_SYS_FSOPEN = 430
_SYS_FSCONFIG = 431
_SYS_FSMOUNT = 432
_FSOPEN_CLOEXEC = 1
_FSMOUNT_CLOEXEC = 1
_FSCONFIG_SET_FLAG = 0
_FSCONFIG_SET_STRING = 1
_FSCONFIG_SET_FD = 5
_MOUNT_ATTR_IDMAP = 0x00100000
_FSCONFIG_CMD_CREATE = 6
#: fsmount(2)'s and mount_setattr(2)'s attributes, by the mount(2) flag each stands for.
_MOUNT_ATTRS = ((MS_RDONLY, 0x1), (MS_NOSUID, 0x2), (MS_NODEV, 0x4), (MS_NOEXEC, 0x8), (1 << 24, 0x20))


def _mount_attrs(flags: int) -> int:
    return sum(attr for flag, attr in _MOUNT_ATTRS if flags & flag)


def new_mount(fstype: str, source: str | None, params: Sequence[tuple[str, str | int | None]], flags: int = 0) -> int:
    """A new ``fstype`` through fsopen/fsconfig/fsmount, detached: its fd, to :func:`move_mount`
    (and to make files in through ``dir_fd`` once attached). Each of ``params`` is one fsconfig
    key (a flag when its value is None, an fd when an int), so no option string and no page-size limit on it
    (overlayfs takes its lower layers one by one as ``lowerdir+``). ``flags``: MS_RDONLY,
    MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_STRICTATIME. Raises OSError naming the key that failed,
    or ``fstype``."""
    fs = _libc.syscall(_SYS_FSOPEN, encode_path(fstype), ctypes.c_uint(_FSOPEN_CLOEXEC))
    check_result(fs, fstype)
    try:
        if source is not None:
            params = [("source", source), *params]
        for key, value in params:
            if isinstance(value, int):  # an fd: a directory given by fd (an id-mapped layer)
                cmd, text, aux = _FSCONFIG_SET_FD, None, value
            else:
                cmd, text, aux = _FSCONFIG_SET_FLAG if value is None else _FSCONFIG_SET_STRING, value, 0
            check_result(_libc.syscall(_SYS_FSCONFIG, ctypes.c_int(fs), ctypes.c_uint(cmd), encode_path(key), encode_path(text),
                                 ctypes.c_int(aux)), f"{key}={value}" if value is not None else key)
        check_result(_libc.syscall(_SYS_FSCONFIG, ctypes.c_int(fs), ctypes.c_uint(_FSCONFIG_CMD_CREATE), None, None,
                             ctypes.c_int(0)), fstype)
        mnt: int = _libc.syscall(_SYS_FSMOUNT, ctypes.c_int(fs), ctypes.c_uint(_FSMOUNT_CLOEXEC),
                                 ctypes.c_uint(_mount_attrs(flags)))
        check_result(mnt, fstype)
        return mnt
    finally:
        os.close(fs)


def mount_fs(fstype: str, source: str | None, params: Sequence[tuple[str, str | int | None]], target: str,
             flags: int = 0) -> None:
    """Mount a new ``fstype`` on ``target`` (:func:`new_mount`, attached there). Raises OSError
    naming the key that failed, or ``target``."""
    try:
        mnt = new_mount(fstype, source, params, flags)
    except OSError as exc:
        if exc.filename == fstype:
            exc.filename = target
        raise
    try:
        move_mount(mnt, target)
    finally:
        os.close(mnt)


def fs_type(path: str) -> int:
    """The magic number of the filesystem holding ``path`` (statfs(2)'s ``f_type``, as
    <linux/magic.h> names it: 0x6969 for NFS). Raises OSError naming ``path``."""
    buf = ctypes.create_string_buffer(256)  # struct statfs: 120 bytes on 64-bit, f_type first
    check_result(_libc.statfs(encode_path(path), buf), path)
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF
