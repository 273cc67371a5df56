"""The pause rootfs every OCI pause runs from: ``<runtime root>/pause-rootfs/`` with a static catatonit."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile

from shim.api.defaults import CATATONIT
from shim.lib.files import ensure_private_dir
from shim.lib.trees import remove_tree
from shim.runtime import pause

__all__ = ["PAUSE_FILE", "PAUSE_ROOTFS_DIR", "ensure_pause_rootfs"]

PAUSE_ROOTFS_DIR = "pause-rootfs"  # under the runtime root, shared by every sandbox
PAUSE_FILE = "pause"  # the pause's program in the rootfs: /pause
_RUNTIME_ROOT_MODE = 0o711
_ROOTFS_MODE = 0o755
_MOUNT_POINTS = ("proc", "dev", "sys")


def ensure_pause_rootfs(runtime_root: str, source: str = CATATONIT) -> str:
    """The shared pause rootfs under ``runtime_root``, built on first use; returns its path.

    Built in a temporary directory and renamed into place, so a concurrent shim sees all of it or
    none (the loser of a race drops its copy). Raises FailedPrecondition when ``source`` is missing
    or is not a static executable (the rootfs holds no libraries).
    """
    target = os.path.join(runtime_root, PAUSE_ROOTFS_DIR)
    if os.access(os.path.join(target, PAUSE_FILE), os.X_OK):
        return target
    _check_static_executable(source)
    ensure_private_dir(runtime_root, _RUNTIME_ROOT_MODE, keep_mode=True)
    tmp = tempfile.mkdtemp(prefix=f".{PAUSE_ROOTFS_DIR}-", dir=runtime_root)
    try:
        os.chmod(tmp, _ROOTFS_MODE)
        for mount_point in _MOUNT_POINTS:
            os.mkdir(os.path.join(tmp, mount_point), _ROOTFS_MODE)
        shutil.copyfile(source, os.path.join(tmp, PAUSE_FILE))
        os.chmod(os.path.join(tmp, PAUSE_FILE), _ROOTFS_MODE)
        try:
            os.rename(tmp, target)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    finally:
        remove_tree(tmp, ignore_errors=True)  # gone when the rename won
    return target


def _check_static_executable(path: str) -> None:
    """FailedPrecondition unless ``path`` is a static executable (the rootfs holds no libraries)."""
    pause.check_static_executable(
        path, f"the OCI pause needs catatonit at {path}, a static binary (apt-get install catatonit)")
