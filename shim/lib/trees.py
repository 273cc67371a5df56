"""Walking and removing directory trees of any depth and any path length.

A tree podshim walks or removes may be made by someone else: an image layer, a container writing
in its own root file system. Such a tree can be deeper than Python's recursion limit, and its
paths longer than the kernel's PATH_MAX (4096 bytes), so nothing here recurses and nothing names
more than one path component: every call is relative to a directory descriptor (openat, fstatat,
unlinkat). One descriptor is open at a time, whatever the depth: a walk goes down by opening a
child and back up by opening "..", checked to be the directory it came from (a directory moved
meanwhile, by a container that owns the tree, ends the walk with an error instead of leading it
elsewhere). Neither a walk nor a removal enters another file system mounted below the top, or
follows a symbolic link.

One implementation for every tree the shim and the client walk or remove, here where both may
import it.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator

__all__ = ["Entry", "remove_tree", "walk"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Entry:
    """One name below the top of a :func:`walk`. ``dir_fd`` is its directory's descriptor, open
    only until the walk moves on; ``parents`` the names from the top down to its directory."""

    __slots__ = ("dir_fd", "name", "is_dir", "parents", "_stat")

    def __init__(self, dir_fd: int, name: str, is_dir: bool, parents: tuple[str, ...]) -> None:
        self.dir_fd = dir_fd
        self.name = name
        self.is_dir = is_dir
        self.parents = parents
        self._stat: os.stat_result | None = None

    def stat(self) -> os.stat_result:
        """lstat of the entry (fstatat in its directory; cached). Raises OSError
        (FileNotFoundError when it was removed meanwhile)."""
        if self._stat is None:
            self._stat = os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False)
        return self._stat

    def path(self, top: str) -> str:
        """Its path below ``top`` (which may be longer than PATH_MAX: for messages and for
        trees known to be shallow)."""
        return os.path.join(top, *self.parents, self.name)


def walk(top: str) -> Iterator[Entry]:
    """Every name below the directory ``top`` (not ``top`` itself), each directory's names before
    what is inside them. Directories of other file systems are listed, never entered; symbolic
    links never followed. A directory removed meanwhile is skipped.

    Raises OSError when ``top`` cannot be opened as a directory (not following a link) or a
    directory cannot be listed, and OSError ESTALE when a directory was moved out from under
    the walk.
    """
    fd = os.open(top, _DIR_FLAGS)
    try:
        device = os.fstat(fd).st_dev
        here = _identity(os.fstat(fd))
        parents: tuple[str, ...] = ()
        names = iter(_listing(fd))
        stack: list[tuple[Iterator[tuple[str, bool]], tuple[int, int]]] = []
        while True:
            for name, is_dir in names:
                yield Entry(fd, name, is_dir, parents)
                if not is_dir:
                    continue
                opened = _open_child(fd, name, device)
                if opened is None:
                    continue
                child, identity = opened
                try:
                    listing = _listing(child)
                except FileNotFoundError:
                    os.close(child)
                    continue  # removed meanwhile
                except BaseException:
                    os.close(child)
                    raise
                stack.append((names, here))
                here = identity
                os.close(fd)
                fd, parents, names = child, parents + (name,), iter(listing)
                break
            else:
                if not stack:
                    return
                names, here = stack.pop()
                parent = _up(fd, here, top)
                os.close(fd)
                fd, parents = parent, parents[:-1]
    finally:
        os.close(fd)


def remove_tree(path: str, *, ignore_errors: bool = False) -> None:
    """Remove ``path`` and everything below it (a file or a symbolic link at ``path`` is
    unlinked, not followed); nothing when it is not there.

    What can be removed is, whatever fails meanwhile; then the first failure is raised as
    OSError, unless ``ignore_errors``. A file system mounted below ``path`` is not entered:
    its mount point stays (EBUSY). (``path`` itself may be a mount point: it is emptied.)
    """
    errors: list[OSError] = []
    parent, name = os.path.split(os.path.normpath(path))
    try:
        parent_fd = os.open(parent or ".", _DIR_FLAGS)
    except FileNotFoundError:
        return
    except OSError as exc:
        errors.append(exc)
    else:
        try:
            _remove_at(parent_fd, name, path, errors)
        except OSError as exc:
            errors.append(exc)
        finally:
            os.close(parent_fd)
    if errors and not ignore_errors:
        raise errors[0]


def _remove_at(parent_fd: int, name: str, path: str, errors: list[OSError]) -> None:
    """Remove ``name`` in ``parent_fd`` with everything below it; failures that do not stop the
    removal are appended to ``errors``."""
    try:
        os.unlink(name, dir_fd=parent_fd)
        return
    except FileNotFoundError:
        return
    except IsADirectoryError:
        pass
    opened = _open_child(parent_fd, name, None)
    if opened is None:  # gone meanwhile, or no directory any more
        try:
            os.unlink(name, dir_fd=parent_fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            errors.append(exc)
        return
    fd, here = opened
    device = here[0]
    try:
        names = iter(_listing(fd))
        stack: list[tuple[Iterator[tuple[str, bool]], tuple[int, int], str]] = []
        while True:
            for child, is_dir in names:
                if not is_dir:
                    try:
                        os.unlink(child, dir_fd=fd)
                        continue
                    except FileNotFoundError:
                        continue
                    except IsADirectoryError:
                        pass  # a directory now
                    except OSError as exc:
                        errors.append(exc)
                        continue
                opened = _open_child(fd, child, device)
                if opened is None:  # another file system's mount point (EBUSY), or gone
                    _rmdir(fd, child, errors)
                    continue
                below, identity = opened
                try:
                    listing = _listing(below)
                except OSError as exc:
                    os.close(below)
                    errors.append(exc)
                    continue
                stack.append((names, here, child))
                os.close(fd)
                fd, here, names = below, identity, iter(listing)
                break
            else:
                if not stack:
                    break
                names, here, done = stack.pop()
                parent = _up(fd, here, path)
                os.close(fd)
                fd = parent
                _rmdir(fd, done, errors)
    finally:
        os.close(fd)
    _rmdir(parent_fd, name, errors)


def _listing(fd: int) -> list[tuple[str, bool]]:
    """(name, is a directory) of what ``fd`` holds, read whole so that no descriptor stays open
    for it (scandir keeps one until it is exhausted)."""
    with os.scandir(fd) as entries:
        return [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]


def _open_child(fd: int, name: str, device: int | None) -> tuple[int, tuple[int, int]] | None:
    """The directory ``name`` in ``fd``, opened, with its (dev, ino); None when it is gone, is
    no directory (any more), or is on another device than ``device`` (when given)."""
    try:
        child = os.open(name, _DIR_FLAGS, dir_fd=fd)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symbolic link swapped in
            return None
        raise
    identity = _identity(os.fstat(child))
    if device is not None and identity[0] != device:
        os.close(child)
        return None
    return child, identity


def _up(fd: int, expected: tuple[int, int], top: str) -> int:
    """The parent of the directory ``fd``, opened; it must be the directory ``expected`` (dev, ino)."""
    parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
    if _identity(os.fstat(parent)) != expected:
        os.close(parent)
        raise OSError(errno.ESTALE, f"a directory below {top} was moved while it was walked", top)
    return parent


def _rmdir(fd: int, name: str, errors: list[OSError]) -> None:
    try:
        os.rmdir(name, dir_fd=fd)
    except FileNotFoundError:
        pass
    except OSError as exc:
        errors.append(exc)


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino
