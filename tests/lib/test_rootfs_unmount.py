"""shim.lib.rootfs: taking a task's root down touches nothing but that root.

Run in a mount namespace of the test's own (``unshare --mount``), whose tree is made shared as a
node's ``/`` is (systemd mounts it shared): a rootfs that is a recursive bind of a tree holding
other mounts (``ctr run --rootfs /``, containerd's bind rootfs) has its submounts as peers of the
originals, and a lazy unmount of the copy propagated to the originals, unmounting, say, every
pod's network namespace file on the node.
"""

from __future__ import annotations

import subprocess
import sys

SCENARIO = r"""
import os, sys
from shim.lib import mountcalls
from shim.lib.rootfs import mount_rootfs, parse_rootfs, unmount_rootfs
top = sys.argv[1]
mountcalls.mount("none", "/", None, mountcalls.MS_REC | mountcalls.MS_PRIVATE)
mountcalls.mount("tmpfs", top, "tmpfs")
mountcalls.mount(None, top, None, mountcalls.MS_SHARED)  # a node's tree: shared, as systemd makes /
host = os.path.join(top, "host")
os.makedirs(os.path.join(host, "run", "netns"))
open(os.path.join(host, "run", "netns", "pod"), "w").close()
mountcalls.mount("/proc/self/ns/net", os.path.join(host, "run", "netns", "pod"), None, mountcalls.MS_BIND)
os.makedirs(os.path.join(host, "tasks", "t"))
rootfs = os.path.join(host, "tasks", "t", "rootfs")
os.mkdir(rootfs)
{how}
unmount_rootfs(rootfs)
with open("/proc/self/mountinfo") as f:
    print(sum(line.split()[4] == os.path.join(host, "run", "netns", "pod") for line in f))
"""


def survivors(tmp_path, how: str) -> int:
    done = subprocess.run(["unshare", "--mount", sys.executable, "-c", SCENARIO.replace("{how}", how),
                           str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def test_unmounting_a_root_that_is_a_recursive_bind_leaves_the_originals_of_its_submounts(tmp_path) -> None:
    how = "mount_rootfs(parse_rootfs({'rootfs': [{'type': 'bind', 'source': host, 'options': ['rbind', 'rw']}]}), rootfs)"
    assert survivors(tmp_path, how) == 1


def test_unmounting_a_root_bound_by_hand_leaves_the_originals_of_its_submounts(tmp_path) -> None:
    # podshim delete after a crash finds whatever was left mounted there, made by anyone
    how = "mountcalls.mount(host, rootfs, None, mountcalls.MS_BIND | mountcalls.MS_REC)"
    assert survivors(tmp_path, how) == 1
