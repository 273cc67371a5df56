"""The installed code, as a long-lived podshim process sees it: :func:`code_files` and
:func:`fingerprint`, the files of the podshim code a long-lived process (the template) loaded,
and what is on disk at those paths now, so the process can tell the installed package changed
under it; :class:`CodeWatch` tells it as surely for a read of an inotify instance instead of a
stat per file (one read instead of a stat per module on each Spawn).

How a podshim program starts another, ends, and goes on running is :mod:`shim.lib.program`'s.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable
from typing import Any

from shim.lib.program import CODE_PACKAGES

__all__ = ["CodeWatch", "code_files", "fingerprint"]

def code_files() -> list[str]:
    """The source files of every module of :data:`CODE_PACKAGES` this process has loaded, sorted."""
    files = set()
    for name, module in list(sys.modules.items()):
        if name.partition(".")[0] in CODE_PACKAGES:
            origin = getattr(module, "__file__", None)
            if origin:
                files.add(os.path.abspath(origin))
    return sorted(files)


def fingerprint(files: list[str]) -> tuple[Any, ...]:
    """What is at ``files`` now: each one's inode, size and modification time (or why it cannot
    be read), to compare with an earlier fingerprint. An upgrade or an edit of any of them
    changes it; it costs a stat per file, a fraction of a millisecond for a shim's modules."""
    return _stat_each(files, lambda st: (st.st_ino, st.st_size, st.st_mtime_ns))


def _stat_each(paths: list[str] | tuple[str, ...], key: Callable[[os.stat_result], Any]) -> tuple[Any, ...]:
    """``key`` of the stat of each of ``paths`` (links followed), or the errno of that stat."""
    state: list[Any] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError as exc:
            state.append(exc.errno)
        else:
            state.append(key(st))
    return tuple(state)


#: Filesystems (statfs magic numbers) whose files another machine, or a server in user space,
#: changes without an inotify event here: NFS, SMB (three), FUSE (virtiofs, sshfs), 9p, Ceph,
#: AFS (two), Lustre, GPFS, GFS2, OCFS2.
_REMOTE_FILESYSTEMS = frozenset({0x6969, 0xFF534D42, 0xFE534D42, 0x517B, 0x65735546, 0x01021997, 0x00C36400,
                                 0x5346414F, 0x6B414653, 0x0BD00BD0, 0x47504653, 0x01161970, 0x7461636F})


def _identities(paths: tuple[str, ...]) -> tuple[Any, ...]:
    """What each of ``paths`` is now: its (device, inode), or the errno of its stat."""
    return _stat_each(paths, lambda st: (st.st_dev, st.st_ino))


def _local(path: str) -> None:
    """Raise OSError unless inotify tells every change of ``path`` (it is not on a remote filesystem)."""
    from shim.kernel import linux

    if linux.fs_type(path) in _REMOTE_FILESYSTEMS:
        raise OSError(errno.EREMOTE, "on a filesystem whose changes inotify does not see", path)


class CodeWatch:
    """Whether the code ``files`` are still what was on disk when the watch was made
    (:func:`fingerprint` then and now), for one read of an inotify instance while nothing
    happens to them.

    Watched: each file, each directory holding one, and every directory above those up to
    ``/``, on the path given and on the one its links lead to (an upgrade that replaces a file
    by a rename, removes and remakes a directory, or renames a whole tree or a symbolic link on
    the way into place, shows there); in a directory
    only the events of the entries on the way to a file count, so a ``__pycache__`` write, an
    editor's swap file or another package installed beside them costs nothing. Any event that
    counts, lost events (IN_Q_OVERFLOW) or a watch the kernel dropped (IN_IGNORED) makes the
    next :meth:`changed` compare the whole fingerprint, after watching anew, so that a change
    made meanwhile is an event of the new watches.

    A mount made or removed over a directory on the way shows no inotify event: the mount table
    is watched too (poll on /proc/self/mountinfo), and when it changed, a directory holding a
    file that is no longer the one it was (another device or inode: a tree mounted over it or
    over a directory above it, or unmounted from there) counts as an event; a stat per such
    directory, however many mounts the node has. A single file bind-mounted over a code file is
    not seen.

    Without inotify (no instance left to the user, no room for a watch, a file that cannot be
    watched, a path on a filesystem whose changes this kernel need not see: NFS, FUSE, ..., or
    no mount table to poll) every call compares the whole fingerprint, as :func:`fingerprint`'s
    caller would.
    """

    def __init__(self, files: list[str]) -> None:
        from shim.kernel import linux  # here: the commands that import this module need no ctypes

        self._linux = linux
        self.files = files
        self._fd = -1
        self._relevant: dict[int, frozenset[str] | None] = {}  # wd -> names whose events count (None: all)
        self._directories: tuple[str, ...] = ()  # the directories that hold a file, on either way
        self._mount_table = -1  # /proc/self/mountinfo, polled for a change of the mount table
        self._identities: tuple[Any, ...] = ()  # what each of the directories was when the watches were made
        self._dirty = False  # something that counts happened since the watches were made
        self._watch()  # before the fingerprint: a change from now on is an event
        self.code = fingerprint(files)

    @property
    def watching(self) -> bool:
        """Whether :meth:`changed` reads inotify (False: it compares the whole fingerprint)."""
        return self._fd >= 0

    def changed(self) -> bool:
        """Whether any of the files differs from what it was when the watch was made."""
        if self._fd >= 0:
            self.look()
            if not self._dirty:
                return False
            self._watch()
        return fingerprint(self.files) != self.code

    def look(self) -> None:
        """Take in what happened since the last look (the inotify events, a change of the mount
        table) and keep whether any of it counts for :meth:`changed`. The template looks after
        answering a Spawn, so that the next Spawn's check has little left to read."""
        if self._fd < 0 or self._dirty:
            return
        try:
            events = self._linux.inotify_read(self._fd)
        except OSError:
            events = None
        if events is None or any(self._counts(*event) for event in events) or self._mounts_changed():
            self._dirty = True

    def close(self) -> None:
        """Stop watching (the inotify instance is closed); :meth:`changed` still answers, with
        the whole fingerprint."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._mount_table >= 0:
            os.close(self._mount_table)
            self._mount_table = -1
        self._relevant = {}
        self._dirty = False

    def _mounts_changed(self) -> bool:
        """Whether a directory on the way is another one than when the watches were made, asked
        only when the kernel says the mount table changed (a netns mounted elsewhere costs a
        stat per directory, not a whole fingerprint)."""
        import select

        poller = select.poll()
        poller.register(self._mount_table, select.POLLPRI)
        return bool(poller.poll(0)) and _identities(self._directories) != self._identities

    def _counts(self, wd: int, mask: int, name: str) -> bool:
        linux = self._linux
        if mask & (linux.IN_Q_OVERFLOW | linux.IN_IGNORED | linux.IN_DELETE_SELF | linux.IN_MOVE_SELF
                   | linux.IN_UNMOUNT):
            return True
        names = self._relevant.get(wd, None)
        return names is None or not name or name in names

    def _watch(self) -> None:
        """Watch the files and their directories on a new inotify instance, or on none at all."""
        linux = self._linux
        # What changes what a path names or holds: pip replaces a file by a rename, an edit
        # writes in place, an ``rm -rf`` or a ``mv`` of a directory or of a link on the way.
        entry_events = (linux.IN_MODIFY | linux.IN_ATTRIB | linux.IN_CLOSE_WRITE | linux.IN_DELETE_SELF
                        | linux.IN_MOVE_SELF)
        directory_events = (entry_events | linux.IN_CREATE | linux.IN_DELETE | linux.IN_MOVED_FROM
                            | linux.IN_MOVED_TO)
        self.close()
        on_the_way: dict[str, set[str]] = {}  # directory -> the entries in it leading to a file
        # The way a path names, and the way it leads through its links: the directories above
        # a link's target are not on the first (a tree replaced there shows only on the second).
        ways = {way for path in self.files for way in (path, os.path.realpath(path))}
        for path in ways:
            child, parent = os.path.basename(path), os.path.dirname(path)
            while child:
                on_the_way.setdefault(parent, set()).add(child)
                child, parent = os.path.basename(parent), os.path.dirname(parent)
        # The mount table's baseline, then the directories as they are, then the watches: a
        # mount from the first on is a change of the table, and the watches are made on what the
        # directories are at least as late as what they are compared with.
        try:
            mount_table = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        # The directories that hold a file: a tree mounted over one of them, or over any
        # directory above, makes it another directory (another device or inode).
        directories = tuple(sorted({os.path.dirname(path) for path in ways}))
        identities = _identities(directories)
        try:
            fd = linux.inotify_init()
        except OSError:
            os.close(mount_table)
            return
        relevant: dict[int, frozenset[str] | None] = {}
        try:
            for directory, names in on_the_way.items():
                _local(directory)
                wd = linux.inotify_add_watch(fd, directory, directory_events)
                if wd not in relevant:
                    relevant[wd] = frozenset(names)
                elif (known := relevant[wd]) is not None:  # the same directory by another path (a link)
                    relevant[wd] = known | names
            for path in self.files:
                _local(path)
                relevant[linux.inotify_add_watch(fd, path, entry_events)] = None
        except OSError:
            os.close(fd)
            os.close(mount_table)
            return
        self._fd, self._relevant, self._mount_table = fd, relevant, mount_table
        self._directories, self._identities = directories, identities
