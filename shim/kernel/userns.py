"""A pod's user namespace, made with its uid and gid mappings (their value types, and the id-mapped
mounts' view of a namespace, are :mod:`shim.lib.idmaps`'s).

The shim makes the namespace (:func:`create`) with a child of its own that unshares it and
waits while the shim writes its maps, as root of the host may; the pause joins it, then every
task and exec of the pod, as they join the pod's other namespaces
(:mod:`shim.runtime.process`); mounts are id-mapped with its fd
(:func:`shim.kernel.linux.mount_setattr`). Only the mappings kubelet sends for ``hostUsers: false`` are
taken: one range of each, from id 0 inside (kubelet's hold 65536 ids), never holding the host's 0.
"""

from __future__ import annotations

import asyncio
import os
import time

from shim.kernel import linux
from shim.kernel.reaper import Reaper
from shim.lib.idmaps import UserNamespace
from shim.rpc.status import Internal

__all__ = ["create"]

CREATE_TIMEOUT = 2.0  # seconds for the child to unshare and for its exit


async def create(userns: UserNamespace, reaper: Reaper) -> int:
    """A new user namespace with ``userns``'s mappings, as an O_CLOEXEC fd (to setns into, to
    id-map mounts with, to name as ``/proc/self/fd/N``); the caller closes it. A child unshares
    it and waits while this writes its maps, then exits (the fd keeps the namespace). Raises
    Internal naming the step that failed."""
    go_read, go_write = os.pipe2(os.O_CLOEXEC)
    old_mask = linux.block_all_signals()
    try:
        pid = os.fork()
        if pid == 0:
            try:
                os.close(go_write)
                linux.unshare(linux.CLONE_NEWUSER)
                os.read(go_read, 1)
            finally:
                os._exit(0)
    finally:
        linux.set_signal_mask(old_mask)
    os.close(go_read)
    exit_future = reaper.watch(pid)
    try:
        own = os.stat("/proc/self/ns/user").st_ino
        deadline = time.monotonic() + CREATE_TIMEOUT
        while os.stat(f"/proc/{pid}/ns/user").st_ino == own:
            if exit_future.done() or time.monotonic() > deadline:
                raise Internal("the pod's user namespace could not be made (unshare(CLONE_NEWUSER) failed)")
            await asyncio.sleep(0.0005)
        for name, maps in (("uid_map", userns.uids), ("gid_map", userns.gids)):
            try:
                linux.write_file(f"/proc/{pid}/{name}", "".join(m.line() for m in maps).encode())
            except OSError as exc:
                raise Internal(f"writing the pod's user namespace's {name} failed: {exc.strerror}") from None
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(go_write)
        try:
            await asyncio.wait_for(asyncio.shield(exit_future), CREATE_TIMEOUT)
        except TimeoutError:
            os.kill(pid, 9)
