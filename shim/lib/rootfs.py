"""A root filesystem as both sides mount it on the host, and paths resolved inside a root.

- **The wire's rootfs** (:func:`parse_rootfs`): the ``rootfs`` entries of Task.Create and
  CreateSandbox (containerd's mount.Mount: an overlay from a snapshotter, or a bind), checked into
  :class:`RootfsMount` records, with the field checks the shim's other mount fields use too.
- **Mounting** (:func:`mount_rootfs`, :func:`unmount_rootfs`): the entries on a directory, one on
  another as containerd's mount.All, an overlay's lower layers id-mapped for a pod's user
  namespace; the shim mounts a task's and a sandbox image's root with it
  (:mod:`shim.runtime.mounts`), the pod layer an image volume's layers
  (:mod:`client.cri.imagevolumes`).
- **Resolving in a root** (:func:`open_in_root`, :func:`resolve_in_root`): a path inside a
  directory as if it were ``/``, never out of it through ``..`` or a symbolic link.

The standard library, the mount calls (:mod:`shim.lib.mountcalls`) and the wire's records and
errors only.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping
from typing import Any

from shim.lib import mountcalls
from shim.lib.idmaps import IdMap
from shim.rpc.records import Record
from shim.rpc.records import set_field as _set
from shim.rpc.status import FailedPrecondition, Internal, InvalidArgument

__all__ = ["AT_ROOT", "PROPAGATION", "RootfsMount", "array_field", "at_root", "idmap_tree", "is_mount_point",
           "mount_rootfs", "open_in_root", "options_field", "parse_rootfs", "resolve_in_root", "root_needs_idmap",
           "string_field", "unmount_rootfs", "unmount_sandbox_rootfs"]

#: mount(8) options of the ``rootfs`` mounts that are flags; the others go to the filesystem as data.
_ROOTFS_FLAGS = {
    "ro": (mountcalls.MS_RDONLY, True), "rw": (mountcalls.MS_RDONLY, False), "nosuid": (mountcalls.MS_NOSUID, True),
    "suid": (mountcalls.MS_NOSUID, False), "nodev": (mountcalls.MS_NODEV, True), "dev": (mountcalls.MS_NODEV, False),
    "noexec": (mountcalls.MS_NOEXEC, True), "exec": (mountcalls.MS_NOEXEC, False), "bind": (mountcalls.MS_BIND, True),
    "rbind": (mountcalls.MS_BIND | mountcalls.MS_REC, True),
}
#: The propagation options of a mount, as the mount(2) flags each stands for.
PROPAGATION = {"rprivate": mountcalls.MS_PRIVATE | mountcalls.MS_REC, "private": mountcalls.MS_PRIVATE,
                   "rslave": mountcalls.MS_SLAVE | mountcalls.MS_REC, "slave": mountcalls.MS_SLAVE,
                   "rshared": mountcalls.MS_SHARED | mountcalls.MS_REC, "shared": mountcalls.MS_SHARED}
_MAX_SYMLINKS = 40
_OVERLAYFS_MAGIC = 0x794C7630
#: mount(2) copies one page of options: longer ones (an overlay of many layers) go through fsconfig.
_MAX_MOUNT_DATA_BYTES = 4095


# -- the wire's rootfs -----------------------------------------------------------------------------

class RootfsMount(Record):
    """One ``rootfs`` entry: containerd's mount.Mount (``overlay`` with lowerdir/upperdir/workdir, ``bind``, ...)."""

    __slots__ = ("type", "source", "options")
    type: str
    source: str
    options: tuple[str, ...]

    def __init__(self, type: str, source: str, options: tuple[str, ...] = ()) -> None:
        _set(self, "type", type)
        _set(self, "source", source)
        _set(self, "options", options)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "source": self.source, "options": list(self.options)}


def parse_rootfs(payload: Mapping[str, Any]) -> tuple[RootfsMount, ...]:
    """The ``rootfs`` mounts of a Task.Create or CreateSandbox payload; InvalidArgument naming the entry."""
    return tuple(_rootfs_mount(entry, f"rootfs[{i}]") for i, entry in enumerate(array_field(payload, "rootfs")))


def _rootfs_mount(entry: Any, where: str) -> RootfsMount:
    if not isinstance(entry, Mapping):
        raise InvalidArgument(f"field {where!r} must be a map {{type, source, options}}")
    mount = RootfsMount(string_field(entry, "type", where), string_field(entry, "source", where), options_field(entry, where))
    if mount.type == "bind" and not os.path.isabs(mount.source):
        raise InvalidArgument(f"field '{where}.source' of a bind must be an absolute path, not {mount.source!r}")
    return mount


def array_field(payload: Mapping[str, Any], name: str) -> list[Any]:
    """The array ``payload[name]`` (none: empty); InvalidArgument naming the field otherwise."""
    value = payload.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidArgument(f"field {name!r} must be an array")
    return value


def string_field(entry: Mapping[str, Any], key: str, where: str, *, required: bool = True) -> str:
    """The non-empty string ``entry[key]`` of the entry at ``where`` (not ``required``: none is
    ""); InvalidArgument naming the field otherwise."""
    value = entry.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value or "\0" in value:
        raise InvalidArgument(f"field '{where}.{key}' must be a non-empty string without NUL")
    return value


def options_field(entry: Mapping[str, Any], where: str) -> tuple[str, ...]:
    """The mount options of the entry at ``where`` (none: empty); InvalidArgument naming the field
    when they are not strings a mount option string can hold."""
    options = entry.get("options")
    if options is None:
        return ()
    if not isinstance(options, list) or not all(isinstance(o, str) and o and "\0" not in o and "," not in o
                                                for o in options):
        raise InvalidArgument(f"field '{where}.options' must be an array of non-empty strings without ',' or NUL")
    return tuple(options)


# -- mounting --------------------------------------------------------------------------------------

def mount_rootfs(mounts: tuple[RootfsMount, ...], target: str, idmap: IdMap | None = None) -> None:
    """Mount ``mounts`` on ``target`` (made, 0755), one on another in order, as containerd's
    mount.All. With ``idmap`` (a pod's user namespace), an overlay's lower layers are id-mapped
    (overlayfs cannot be id-mapped itself) and its upper directory is given to the namespace's
    root, so what the task writes is owned by its mapped ids (as containerd's overlay
    snapshotter does); a bind is id-mapped when the task's root is taken (:func:`open_trees`).
    On failure what was mounted is unmounted and the error is FailedPrecondition
    naming the entry (or the layer whose filesystem cannot be id-mapped) and the kernel's reason."""
    os.makedirs(target, 0o755, exist_ok=True)
    for i, entry in enumerate(mounts):
        if idmap is not None and entry.type == "overlay":
            try:
                _mount_idmapped_overlay(entry, target, idmap)
            except FailedPrecondition:
                unmount_rootfs(target, remove=False)
                raise
            except OSError as exc:
                unmount_rootfs(target, remove=False)
                raise FailedPrecondition(f"cannot mount rootfs[{i}] ({entry.type} {entry.source}) on {target} "
                                         f"with id-mapped layers: {exc.strerror}") from None
            continue
        flags, data = 0, []
        for option in entry.options:
            if option in _ROOTFS_FLAGS:
                bit, on = _ROOTFS_FLAGS[option]
                flags = flags | bit if on else flags & ~bit
            elif option in PROPAGATION:
                continue  # a rootfs is private to the task: the kernel's default here
            else:
                data.append(option)
        kind = None if flags & mountcalls.MS_BIND else entry.type
        try:
            if kind is not None and len(",".join(data).encode()) > _MAX_MOUNT_DATA_BYTES:
                mountcalls.mount_fs(kind, entry.source, _fs_params(data), target, flags)
                continue
            mountcalls.mount(entry.source, target, kind, flags & ~mountcalls.MS_RDONLY if flags & mountcalls.MS_BIND else flags,
                        ",".join(data) or None)
            if flags & mountcalls.MS_BIND and flags & mountcalls.MS_RDONLY:  # a bind is made read-only by a remount
                mountcalls.mount(None, target, None, mountcalls.MS_REMOUNT | mountcalls.MS_BIND | mountcalls.MS_RDONLY)
        except OSError as exc:
            unmount_rootfs(target, remove=False)
            raise FailedPrecondition(f"cannot mount rootfs[{i}] ({entry.type} {entry.source}) on {target}: "
                                     f"{exc.strerror}") from None


def _mount_idmapped_overlay(entry: RootfsMount, target: str, idmap: IdMap) -> None:
    """The overlay ``entry`` on ``target``, its lower layers given as id-mapped detached copies."""
    params: list[tuple[str, str | int | None]] = []
    layers: list[int] = []
    try:
        for option in entry.options:
            key, _, value = option.partition("=")
            if key == "lowerdir":
                for layer in value.split(":"):
                    layers.append(mountcalls.open_tree(layer, False))
                    idmap_tree(layers[-1], idmap, recursive=False, what=f"layer {layer}")
                    params.append(("lowerdir+", layers[-1]))
            elif key == "upperdir":
                os.chown(value, idmap.root_uid, idmap.root_gid)
                params.append((key, value))
            elif key in _ROOTFS_FLAGS or key in PROPAGATION:
                continue
            else:
                params.append((key, value if _ else None))
        mountcalls.mount_fs("overlay", entry.source, params, target)
    finally:
        for fd in layers:
            os.close(fd)


def _fs_params(data: list[str]) -> list[tuple[str, str | None]]:
    """Mount options as fsconfig keys; an overlay's ``lowerdir=a:b:c`` as one ``lowerdir+`` each."""
    params: list[tuple[str, str | None]] = []
    for option in data:
        key, sep, value = option.partition("=")
        if key == "lowerdir" and sep:
            params.extend(("lowerdir+", layer) for layer in value.split(":"))
        else:
            params.append((key, value if sep else None))
    return params


def root_needs_idmap(mount_point: str) -> bool:
    """Whether a task's root mounted on ``mount_point`` is shown to a pod's user namespace only
    through an id-mapped copy: all but an overlay, whose lower layers are id-mapped themselves
    (:func:`mount_rootfs`)."""
    return mountcalls.fs_type(mount_point) != _OVERLAYFS_MAGIC


def idmap_tree(fd: int, idmap: IdMap, *, recursive: bool, what: str) -> None:
    """Id-map the detached mount open on ``fd`` with ``idmap`` (and the mounts below it when
    ``recursive``); FailedPrecondition naming ``what`` when it cannot be."""
    try:
        mountcalls.mount_setattr(fd, userns_fd=idmap.userns_fd, recursive=recursive)
    except OSError as exc:
        reason = "its filesystem cannot be id-mapped" if exc.errno == errno.EINVAL else exc.strerror
        raise FailedPrecondition(f"cannot id-map {what} for the pod's user namespace: {reason}") from None


def is_mount_point(path: str) -> bool:
    """Whether something is mounted on ``path``: its mount id differs from its parent's (a bind
    from the same filesystem has the same device, so ``os.path.ismount`` cannot tell)."""
    try:
        return _mount_id(path) != _mount_id(os.path.dirname(path.rstrip("/")) or "/")
    except OSError:
        return False


def _mount_id(path: str) -> int:
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        with open(f"/proc/self/fdinfo/{fd}", "rb") as f:
            for line in f:
                if line.startswith(b"mnt_id:"):
                    return int(line.split()[1])
    finally:
        os.close(fd)
    raise OSError(errno.ENOTSUP, "no mnt_id in fdinfo", path)


def unmount_rootfs(target: str, *, remove: bool = True) -> None:
    """Unmount everything mounted on ``target`` and, with ``remove``, remove it and its task
    directory (empty ones only: never a recursive delete, so a mount left there fails it instead
    of deleting the files under it). Idempotent. Raises Internal when a mount cannot be removed."""
    _unmount(target)
    if remove:
        for directory in (target, os.path.dirname(target)):
            try:
                os.rmdir(directory)
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno != errno.ENOTEMPTY:
                    raise Internal(f"cannot remove {directory}: {exc.strerror}") from None


def unmount_sandbox_rootfs(target: str) -> None:
    """Unmount everything mounted on the pause's rootfs ``target`` (:func:`shim.runtime.mounts.sandbox_rootfs_path`)
    and remove the directory, not its bundle. Idempotent. Raises Internal when a mount cannot be
    removed, OSError when the directory cannot."""
    _unmount(target)
    try:
        os.rmdir(target)
    except FileNotFoundError:
        pass


def _unmount(target: str) -> None:
    while is_mount_point(target):
        try:
            # Private first, the whole tree: a root that is a recursive bind of a shared tree
            # (``ctr run --rootfs /``) has its submounts as peers of the originals, and unmounting
            # the copies would unmount the originals with them (every pod's netns file, say).
            mountcalls.mount(None, target, None, mountcalls.MS_REC | mountcalls.MS_PRIVATE)
            # Detached: the task's copy of the mount may still be going away with its last process.
            mountcalls.umount2(target, mountcalls.MNT_DETACH | mountcalls.UMOUNT_NOFOLLOW)
        except OSError as exc:
            raise Internal(f"cannot unmount the rootfs {target}: {exc.strerror}") from None


# -- resolving in a root ---------------------------------------------------------------------------

#: The launcher's step when a mount destination resolves to the task's root itself, followed by
#: the destination (:mod:`shim.runtime.process` makes it InvalidArgument, :func:`at_root`'s sentence).
AT_ROOT = "refusing the mount destination "


def at_root(destination: str) -> str:
    """The sentence for a mount ``destination`` that resolves to the task's root itself."""
    return (f"mount destination {destination} resolves to the task's root itself (through a symbolic link in "
            "its root filesystem or a volume): a mount cannot replace the root")


def open_in_root(root_fd: int, path: str, make: str = "", *, sources: Mapping[str, str] | None = None,
                 resolved: list[str] | None = None) -> int:
    """An O_PATH fd of ``path`` resolved inside the directory open on ``root_fd`` as if it were
    ``/``, never out of it: component by component with O_NOFOLLOW, each symbolic link read and
    followed by hand (an absolute one from ``root_fd``, ``..`` never above it), so neither a link
    to the host's paths nor a /proc magic link (/proc/self/root) leads out. ``make`` "dir" or
    "file": what is missing is made on the way (directories 0755, the last one a directory or
    an empty file 0644), by fd in the directory resolved so far, a dangling link's target too.
    Raises OSError: FileNotFoundError (missing, nothing made), ELOOP (too many links),
    ENOTDIR, and EINVAL (:func:`at_root`) when ``path`` resolves to the root itself.
    ``sources`` (resolved path inside the root -> a directory elsewhere) stands for mounts not made
    yet: the walk goes on in that directory where it reaches one. ``resolved``, when given, gets the
    components of the path the result has inside the root (missing: the path it would be made at).

    Runs in the native launcher's child between fork and exec too: no imports, no logging."""
    parts = [p for p in path.split("/") if p]
    chain = [os.dup(root_fd)]  # the directories resolved so far, the root first
    names: list[str] = []  # chain[1:]'s names: the path inside the root
    links = 0
    try:
        while parts:
            part = parts.pop(0)
            if part == ".":
                continue
            if part == "..":
                if len(chain) > 1:
                    os.close(chain.pop())
                    names.pop()
                continue
            last = not parts
            source = sources.get("/" + "/".join([*names, part])) if sources else None
            if source is not None:  # a mount there covers whatever the root has
                chain.append(os.open(source, os.O_PATH | os.O_CLOEXEC))
                names.append(part)
                if not last and not stat.S_ISDIR(os.fstat(chain[-1]).st_mode):
                    raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
                continue
            try:
                fd = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=chain[-1])
            except FileNotFoundError:
                if not make:
                    if resolved is not None:  # where it would be made: the rest taken as names
                        resolved[:] = [*names, part]
                        for rest in parts:
                            if rest == ".." and resolved:
                                resolved.pop()
                            elif rest not in (".", ".."):
                                resolved.append(rest)
                    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path) from None
                try:
                    if last and make == "file":
                        os.close(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                         0o644, dir_fd=chain[-1]))
                    else:
                        os.mkdir(part, 0o755, dir_fd=chain[-1])
                except FileExistsError:
                    pass  # made meanwhile: opened below as it is
                fd = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=chain[-1])
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode):
                try:
                    target = os.readlink("", dir_fd=fd)
                finally:
                    os.close(fd)
                links += 1
                if links > _MAX_SYMLINKS:
                    raise OSError(errno.ELOOP, f"too many symbolic links resolving {path} in the task's root")
                if target.startswith("/"):
                    while len(chain) > 1:
                        os.close(chain.pop())
                    names.clear()
                parts = [p for p in target.split("/") if p] + parts
                continue
            chain.append(fd)
            names.append(part)
            if not last and not stat.S_ISDIR(mode):
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
        if len(chain) == 1:
            raise OSError(errno.EINVAL, at_root(path))
        if resolved is not None:
            resolved[:] = names
        return chain.pop()
    finally:
        for fd in chain:
            os.close(fd)


def resolve_in_root(root: str, path: str) -> str:
    """``path`` inside ``root`` with its symlinks resolved as if ``root`` were ``/`` (never out of it)."""
    parts = [p for p in path.split("/") if p]
    resolved: list[str] = []
    links = 0
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = os.path.join(root, *resolved, part)
        try:
            is_link = stat.S_ISLNK(os.lstat(candidate).st_mode)
        except OSError:
            is_link = False
        if not is_link:
            resolved.append(part)
            continue
        links += 1
        if links > _MAX_SYMLINKS:
            raise FailedPrecondition(f"too many symbolic links resolving {path} in the task's root")
        target = os.readlink(candidate)
        if target.startswith("/"):
            resolved = []
        parts = [p for p in target.split("/") if p] + parts
    return os.path.join(root, *resolved)
