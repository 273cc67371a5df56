"""ImageService's ImageFsInfo: the usage of the filesystem images are kept on.

The image store is ``<state root>/images`` (:mod:`client.images.service`: blobs, records,
snapshots); its usage is measured, not assumed. The figures are what kubelet's
image garbage collection reads: ``used_bytes`` (the store's files' allocated blocks, each inode
once) and ``inodes_used``; ``fs_id.mountpoint`` is the store's directory, from which kubelet finds
the filesystem's device and capacity. The walk runs in a thread: a large store never stalls the
daemon's loop.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from shim.cri.api import api_pb2
from shim.lib.files import ensure_private_dir
from shim.lib.trees import walk
from shim.rpc.status import Internal

from client.images.service import IMAGES_DIR

from .handlers import Handlers

__all__ = ["IMAGE_STORE_DIR", "ImageFilesystem", "usage"]

#: The image store, below the state root.
IMAGE_STORE_DIR = IMAGES_DIR


def usage(root: str) -> tuple[int, int]:
    """(bytes allocated, inodes) of ``root`` and everything below it, each inode counted once;
    symbolic links are counted, never followed, and other filesystems mounted below are skipped.
    A tree of any depth is measured (shim.lib.trees): a container's upper directory is in it."""
    top = os.lstat(root)
    seen = {top.st_ino}
    used = top.st_blocks * 512
    for entry in walk(root):
        try:
            st = entry.stat()
        except FileNotFoundError:
            continue  # removed while we walked
        if st.st_dev != top.st_dev or st.st_ino in seen:
            continue
        seen.add(st.st_ino)
        used += st.st_blocks * 512
    return used, len(seen)


class ImageFilesystem(Handlers):
    """ImageFsInfo."""

    async def ImageFsInfo(self, request: api_pb2.ImageFsInfoRequest, context: Any) -> api_pb2.ImageFsInfoResponse:
        store = os.path.join(self.config.state_root, IMAGE_STORE_DIR)
        try:
            ensure_private_dir(store, 0o700, keep_mode=True)
            used, inodes = await asyncio.to_thread(usage, store)
        except OSError as exc:
            raise Internal(f"cannot measure the image store {store}: {exc.strerror}") from None
        return api_pb2.ImageFsInfoResponse(image_filesystems=[api_pb2.FilesystemUsage(
            timestamp=time.time_ns(), fs_id=api_pb2.FilesystemIdentifier(mountpoint=store),
            used_bytes=api_pb2.UInt64Value(value=used), inodes_used=api_pb2.UInt64Value(value=inodes))])
