"""What runc and crun need from the shim for a pod's user namespace: the mounts they cannot make,
and a way to the root they are given.

runc 1.1 has no id-mapped mounts (no ``idmap`` option nor mount mappings), and neither runtime may
mount a sysfs in a user namespace that does not own the pod's network namespace (CNI's, the
host's): crun falls back to a read-write bind of the host's /sys with its mounts, runc fails. So
the shim prepares them as detached trees (:mod:`shim.runtime.mounts`): the host's sysfs,
read-only; each bind's source id-mapped with the pod's user namespace; a task's root that is not
an overlay (whose layers are id-mapped already), id-mapped; the pause's root (the shared pause
rootfs), as it is. They are attached in the mount namespace the runtime's ``create`` runs in
(:class:`shim.runtime.process.ProcessSpec` ``attach``), on mount points in
``<shim bundle>/userns/<container>/``, and the config names those: the runtime binds them from
there, binds keep their mapping, and once the container has pivoted into its root nothing of them
is left on the host. The mount points are removed after the create.

The runtime opens bind sources before it enters the user namespace, but looks its root up from
inside, as the pod's root: every directory above the root must let it search. So the shim's bundle
is given to the group of the pod's root with mode 0710 (containerd does the same with its bundle),
and a root whose path does not let it through is refused with a sentence naming the directory.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

from shim.kernel import linux
from shim.lib.idmaps import IdMap, UserNamespace
from shim.lib.rootfs import root_needs_idmap
from shim.rpc.status import FailedPrecondition
from shim.runtime import mounts

__all__ = ["PreparedMounts", "check_reachable", "open_bundle"]

USERNS_DIR = "userns"  # <shim bundle>/userns/<container>/: the mount points of the prepared trees
_BUNDLE_MODE = 0o710  # the shim's bundle, in a pod's user namespace: searchable by the pod's root group
_DIR_MODE = 0o711


def open_bundle(bundle: str, userns: UserNamespace) -> None:
    """Let the root of ``userns`` search the shim's ``bundle`` (group: its root's, mode 0710), where
    its containers' roots are."""
    os.chown(bundle, -1, userns.root_gid)
    os.chmod(bundle, _BUNDLE_MODE)


def check_reachable(path: str, userns: UserNamespace) -> None:
    """FailedPrecondition unless the root of ``userns`` may search every directory above ``path``."""
    directory = os.path.dirname(os.path.normpath(path))
    while True:
        st = os.stat(directory)
        mode = stat.S_IMODE(st.st_mode)
        if not (mode & 0o001 or (mode & 0o010 and st.st_gid == userns.root_gid)
                or (mode & 0o100 and st.st_uid == userns.root_uid)):
            raise FailedPrecondition(f"the root of the pod's user namespace cannot reach {path}: {directory} "
                                     f"(mode {mode:04o}) does not let it search; every directory above the "
                                     "runtime's state must be searchable by others (mode o+x, as 0711)")
        if directory == "/":
            return
        directory = os.path.dirname(directory)


class PreparedMounts:
    """The detached trees of one container's create (``attach``: fd and mount point) and where
    the config finds them: ``root`` (the pause's), ``sysfs`` (the host's sysfs), ``sources``
    (each bind's, in order). :meth:`close` closes the fds and removes the mount points; it is
    called once the create is over."""

    def __init__(self, bundle: str, name: str):
        self.directory = os.path.join(bundle, USERNS_DIR, name)
        self.attach: list[tuple[int, str]] = []
        self.root = ""
        self.sysfs = ""
        self.sources: list[str] = []

    @classmethod
    def for_pause(cls, bundle: str, rootfs: str) -> PreparedMounts:
        """The pause's (in the shim's ``bundle``): its /sys, and ``rootfs`` (the shared pause rootfs,
        whose directory the pod's root may not reach) on a mount point it can reach."""
        prepared = cls(bundle, "pause")
        try:
            prepared._add_sysfs()
            prepared.root = os.path.join(prepared.directory, "root")
            prepared._add(_take(lambda: linux.open_tree(rootfs, True), f"the pause's root {rootfs}"),
                          prepared.root, True)
        except BaseException:
            prepared.close()
            raise
        return prepared

    @classmethod
    def for_task(cls, bundle: str, task_id: str, fs: mounts.TaskFilesystem, rootfs: str,
                 idmap: IdMap) -> PreparedMounts:
        """A task's (in the shim's ``bundle``): its /sys, its root on ``rootfs`` unless an overlay,
        and each bind's source, id-mapped with ``idmap``. FailedPrecondition names what cannot be
        taken or id-mapped."""
        if fs.privileged:
            raise FailedPrecondition("a privileged task cannot run in a pod's user namespace")
        prepared = cls(bundle, f"task-{task_id}")
        try:
            prepared._add_sysfs()
            if root_needs_idmap(rootfs):
                prepared.attach.append((mounts.open_root(rootfs, idmap), rootfs))
            for i, mount in enumerate(fs.mounts):
                target = os.path.join(prepared.directory, str(i))
                prepared._add(mounts.open_source(mount, i, idmap), target, os.path.isdir(mount.source))
                prepared.sources.append(target)
        except BaseException:
            prepared.close()
            raise
        return prepared

    def _add_sysfs(self) -> None:
        self.sysfs = os.path.join(self.directory, "sys")
        self._add(mounts.host_sysfs(), self.sysfs, True)

    def _add(self, fd: int, target: str, directory: bool) -> None:
        """Attach ``fd`` on ``target`` (made: an empty directory, or file) at the create."""
        try:
            os.makedirs(self.directory, _DIR_MODE, exist_ok=True)
            os.chmod(os.path.dirname(self.directory), _DIR_MODE)
            if directory:
                os.makedirs(target, _DIR_MODE, exist_ok=True)
            else:
                os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        except BaseException:
            os.close(fd)
            raise
        self.attach.append((fd, target))

    def close(self) -> None:
        for fd, _ in self.attach:
            os.close(fd)
        self.attach = []
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return
        for name in names:
            path = os.path.join(self.directory, name)
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    os.rmdir(path)
                else:
                    os.unlink(path)
            except FileNotFoundError:
                pass
        for directory in (self.directory, os.path.dirname(self.directory)):
            try:
                os.rmdir(directory)
            except OSError:  # gone, or (the parent) another container's are there
                pass


def _take(open_tree: Callable[[], int], what: str) -> int:
    try:
        return open_tree()
    except OSError as exc:
        raise FailedPrecondition(f"cannot take {what} for the pod's user namespace: {exc.strerror}") from None
