"""What a task's own root costs on the native launcher's start path, without the RPC around it.

    python3 bench/task_root.py [--launches 200]

Launches ``/bin/true`` with :func:`shim.runtime.process.launch` in a new pid and mount namespace,
the way a CONTAINER task is started, three ways, interleaved so the machine's load hits each alike:
``plain`` (no root: the launcher as it was before tasks had one, /proc remounted), ``host root``
(the host's ``/`` read-only, with /proc, /dev, /sys, masked and read-only paths, pivot_root:
what every task gets now) and ``overlay root`` (an overlay of a busybox tree mounted once, as a
snapshotter's). The figure is the time until ``launch`` returned (the program has exec'd);
``open_trees`` (in the shim, before the fork) is included. Prints a markdown table of medians and
minimums. Run as root.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time

from shim.kernel import linux
from shim.kernel.reaper import Reaper
from shim.lib.rootfs import RootfsMount, mount_rootfs, unmount_rootfs
from shim.runtime import mounts, process

from bench.common import busybox_tree


async def launch_once(reaper: Reaper, fs: mounts.TaskFilesystem | None, mount_point: str) -> float:
    t0 = time.perf_counter()
    root = mounts.open_trees(fs, mount_point, own_ipc=True) if fs is not None else None
    try:
        proc = await process.launch(process.ProcessSpec(
            name="bench task", argv=("/bin/true",), unshare_flags=linux.CLONE_NEWPID | linux.CLONE_NEWNS,
            root=root), reaper)
    finally:
        if root is not None:
            root.close()
    elapsed = (time.perf_counter() - t0) * 1000
    await proc.exit
    return elapsed


async def bench(launches: int) -> None:
    base = tempfile.mkdtemp(prefix="task-root-bench-")
    reaper = Reaper()
    reaper.install()
    overlay_root = f"{base}/overlay/rootfs"
    try:
        lower = busybox_tree(f"{base}/lower", "true")
        for name in ("upper", "work"):
            os.makedirs(f"{base}/{name}")
        mount_rootfs((RootfsMount("overlay", "overlay", (
            f"lowerdir={lower}", f"upperdir={base}/upper", f"workdir={base}/work")),), overlay_root)
        ways = {"plain": (None, ""), "host root": (mounts.TaskFilesystem(), f"{base}/host/rootfs"),
                "overlay root": (mounts.TaskFilesystem(rootfs=(RootfsMount("bind", overlay_root),)),
                                 overlay_root)}
        times: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(launches):
            for way, (fs, mount_point) in ways.items():
                times[way].append(await launch_once(reaper, fs, mount_point))
    finally:
        unmount_rootfs(overlay_root)
        reaper.uninstall()
        shutil.rmtree(base, ignore_errors=True)
    print("| task's root | launch median, ms | min, ms | n |")
    print("|---|---|---|---|")
    for way, values in times.items():
        print(f"| {way} | {statistics.median(values):.2f} | {min(values):.2f} | {len(values)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=200, help="launches of each kind (default 200)")
    asyncio.run(bench(parser.parse_args().launches))


if __name__ == "__main__":
    main()
