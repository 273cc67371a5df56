"""A task's filesystem: the mount fields of Task.Create (protocol.md 7.3), the rootfs the shim
mounts for a task on the host, and the native launcher's mounts in the task's mount namespace.

Three parts, one per place they run:

- **The wire** (:func:`parse_filesystem`): ``rootfs``, ``readonly_rootfs``, ``mounts``,
  ``masked_paths``, ``readonly_paths`` and ``privileged``, checked once in Task.Create into a
  :class:`TaskFilesystem` that every runtime handler applies (native here, runc/crun through
  :func:`shim.runtime.oci.spec.task_spec`).
- **The host**: the ``rootfs`` mounts (containerd's mount.Mount: an overlay from a snapshotter,
  or a bind; without any, :data:`OWN_ROOT`, an empty tmpfs) on ``<bundle>/tasks/<task id>/rootfs``
  (:func:`rootfs_path`), mounted at Create and unmounted at Delete, after a failed Create and by
  ``podshim delete`` with :mod:`shim.lib.rootfs`, which the pod layer's image volumes share.
- **The native child** (:func:`open_trees` in the shim before the fork, :func:`enter_root` in the
  task's process before exec). The shim's mount namespace is not the task's (the task's is a
  copy of the pause's, made when the pod started, and this host's ``/`` does not propagate), so
  the root and every bind source are taken with ``open_tree(OPEN_TREE_CLONE)`` in the shim's
  namespace: detached copies, attached with ``move_mount`` in the task's namespace. A copy of a
  shared mount is in its peer group, so ``rslave``/``rshared`` work as for a bind made on the host.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from shim.kernel import linux
from shim.lib.idmaps import IdMap
from shim.lib.rootfs import (
    AT_ROOT,
    PROPAGATION,
    RootfsMount,
    array_field,
    at_root,
    idmap_tree,
    open_in_root,
    options_field,
    parse_rootfs,
    root_needs_idmap,
    string_field,
)
from shim.rpc.records import Record
from shim.rpc.records import set_field as _set
from shim.rpc.status import FailedPrecondition, InvalidArgument

__all__ = ["MASKED_PATHS", "READONLY_PATHS", "ROOTFS_DIR", "TASKS_DIR", "TMPFS_FLAGS", "BindMount", "TaskMount",
           "TmpfsMount", "tmpfs_refusal", "HostDevice", "PauseRoot", "RootSetup", "TaskFilesystem",
           "check_destinations", "enter_pause_root", "enter_root", "host_devices", "host_sysfs", "open_root",
           "open_source", "open_trees", "parse_filesystem", "rootfs_path", "sandbox_rootfs_path"]

#: runc's default masked and read-only paths (`runc spec`).
MASKED_PATHS = (
    "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
    "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi",
)
READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")

TASKS_DIR = "tasks"  # <bundle>/tasks/<task id>/rootfs: where the shim mounts a task's rootfs
ROOTFS_DIR = "rootfs"

#: The options of a ``mounts`` entry (a bind): read-only or not, recursive or not, propagation, flags,
#: and ``idmapped``: its source is id-mapped for the pod's user namespace already (an image volume's
#: overlay of id-mapped layers, which cannot be id-mapped itself), so it is bound as it is.
_BIND_OPTIONS = frozenset({"ro", "rro", "rw", "bind", "rbind", "nosuid", "nodev", "noexec", "idmapped",
                           *PROPAGATION})
_BIND_FLAGS = {"ro": linux.MS_RDONLY, "nosuid": linux.MS_NOSUID, "nodev": linux.MS_NODEV, "noexec": linux.MS_NOEXEC}
#: The flags set on the bind and on every mount below it (mount_setattr with AT_RECURSIVE): OCI's ``rro``.
_BIND_RECURSIVE_FLAGS = {"rro": linux.MS_RDONLY}
_MS_STRICTATIME = 1 << 24
#: The options of a ``tmpfs`` entry of ``mounts``: flags (each sets or clears a mount attribute),
#: and the tmpfs parameters ``key=value`` it may set.
_TMPFS_FLAGS = {"ro": (linux.MS_RDONLY, True), "rw": (linux.MS_RDONLY, False),
                "nosuid": (linux.MS_NOSUID, True), "suid": (linux.MS_NOSUID, False),
                "nodev": (linux.MS_NODEV, True), "dev": (linux.MS_NODEV, False),
                "noexec": (linux.MS_NOEXEC, True), "exec": (linux.MS_NOEXEC, False),
                "strictatime": (_MS_STRICTATIME, True), "relatime": (_MS_STRICTATIME, False)}
_TMPFS_PARAMS = frozenset({"size", "mode", "nr_inodes", "uid", "gid"})
#: The propagation a tmpfs takes (it is new: nothing to propagate from).
_TMPFS_PROPAGATION = frozenset({"private", "rprivate"})
_DEV_TMPFS: list[tuple[str, str | None]] = [("mode", "755"), ("size", "65536k")]
_DEVPTS: list[tuple[str, str | None]] = [("newinstance", None), ("ptmxmode", "0666"), ("mode", "0620"), ("gid", "5")]
#: The nodes of a task's /dev: name, major, minor (all character devices, mode 0666; runc's list).
DEV_NODES = (("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8), ("urandom", 1, 9), ("tty", 5, 0))
#: What a privileged task does not get from the host's /dev (containerd's HostDevices skips them):
#: its own devpts, shm and mqueue, the fd link, the host's console, and ptmx (a link to pts/ptmx).
_HOST_DEVICES_SKIPPED = frozenset({"pts", "shm", "mqueue", "fd", ".lxc", ".lxd-mounts", ".udev", "console", "ptmx"})
_STANDARD_NODES = frozenset(name for name, _, _ in DEV_NODES)
#: The links of a task's /dev (runc's and crun's).
DEV_LINKS = (("ptmx", "pts/ptmx"), ("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
             ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"), ("core", "/proc/kcore"))


class BindMount(Record):
    """One ``mounts`` entry: ``source`` (a host path) bound on ``destination`` in the task's root."""

    __slots__ = ("destination", "source", "options")
    destination: str
    source: str
    options: tuple[str, ...]

    def __init__(self, destination: str, source: str, options: tuple[str, ...] = ()) -> None:
        _set(self, "destination", destination)
        _set(self, "source", source)
        _set(self, "options", options)

    @property
    def recursive(self) -> bool:
        return "rbind" in self.options

    @property
    def idmapped(self) -> bool:
        """Whether the source is id-mapped for the pod's user namespace already."""
        return "idmapped" in self.options

    @property
    def propagation(self) -> str:
        """The last propagation option given; ``rprivate`` by default."""
        return next((o for o in reversed(self.options) if o in PROPAGATION), "rprivate")

    def to_oci(self) -> dict[str, Any]:
        """The OCI mount: the options as given, with the bind kind and propagation made explicit."""
        options = [o for o in self.options if o != "idmapped"]
        if "bind" not in options and "rbind" not in options:
            options.insert(0, "rbind" if self.recursive else "bind")
        if not any(o in PROPAGATION for o in options):
            options.append(self.propagation)
        return {"destination": self.destination, "type": "bind", "source": self.source, "options": options}


class TmpfsMount(Record):
    """One ``mounts`` entry of type ``tmpfs``: a new, empty tmpfs on ``destination``, with the
    flags and tmpfs parameters (``size=``, ``mode=``, ...) of its ``options``."""

    __slots__ = ("destination", "options")
    destination: str
    options: tuple[str, ...]
    #: What code written for a bind reads of any ``mounts`` entry.
    source = "tmpfs"
    recursive = False
    idmapped = False
    propagation = "rprivate"

    def __init__(self, destination: str, options: tuple[str, ...] = ()) -> None:
        _set(self, "destination", destination)
        _set(self, "options", options)

    @property
    def flags(self) -> int:
        """Its mount attributes (MS_RDONLY, MS_NOSUID, ...), the last option on each winning."""
        flags = 0
        for option in self.options:
            if option in _TMPFS_FLAGS:
                bit, on = _TMPFS_FLAGS[option]
                flags = flags | bit if on else flags & ~bit
        return flags

    @property
    def params(self) -> list[tuple[str, str | int | None]]:
        """Its tmpfs parameters, for fsconfig."""
        return [(key, value) for key, _, value in (o.partition("=") for o in self.options if "=" in o)]

    def to_oci(self) -> dict[str, Any]:
        """The OCI mount."""
        return {"destination": self.destination, "type": "tmpfs", "source": "tmpfs", "options": list(self.options)}


#: One ``mounts`` entry: a bind of a host path, or a new tmpfs.
TaskMount = BindMount | TmpfsMount


class HostDevice(Record):
    """A device node of the host's /dev: ``path`` (absolute), ``kind`` ``c`` or ``b``, its numbers,
    permission bits and owner."""

    __slots__ = ("path", "kind", "major", "minor", "mode", "uid", "gid")
    path: str
    kind: str
    major: int
    minor: int
    mode: int
    uid: int
    gid: int

    def __init__(self, path: str, kind: str, major: int, minor: int, mode: int, uid: int, gid: int) -> None:
        _set(self, "path", path)
        _set(self, "kind", kind)
        _set(self, "major", major)
        _set(self, "minor", minor)
        _set(self, "mode", mode)
        _set(self, "uid", uid)
        _set(self, "gid", gid)

    def to_oci(self) -> dict[str, Any]:
        return {"path": self.path, "type": self.kind, "major": self.major, "minor": self.minor,
                "fileMode": self.mode, "uid": self.uid, "gid": self.gid}


def host_devices(directory: str = "/dev") -> tuple[HostDevice, ...]:
    """Every character and block device under the host's /dev, as containerd's HostDevices lists
    them for a privileged container (what :data:`_HOST_DEVICES_SKIPPED` names aside)."""
    found: list[HostDevice] = []
    for entry in os.scandir(directory):
        if entry.name in _HOST_DEVICES_SKIPPED or directory == "/dev" and entry.name in _STANDARD_NODES:
            continue  # the standard nodes are made anyway (and runc's device rules allow only its own)
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue  # gone meanwhile
        if stat.S_ISDIR(st.st_mode):
            found.extend(host_devices(entry.path))
        elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            found.append(HostDevice(entry.path, "c" if stat.S_ISCHR(st.st_mode) else "b", os.major(st.st_rdev),
                                    os.minor(st.st_rdev), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid))
    return tuple(sorted(found, key=lambda device: device.path))


#: The root of a task given no ``rootfs``: an empty tmpfs of its own (mounted where a rootfs is),
#: made read-only once its mounts are made. Nothing of the node is in it but what the task's
#: ``mounts`` bind there: a task without an image shows no secret, socket or state of the node.
OWN_ROOT = (RootfsMount("tmpfs", "tmpfs", ("nosuid", "nodev", "mode=755", "size=1m", "nr_inodes=4096")),)


class TaskFilesystem(Record):
    """The mount fields of Task.Create, checked (:func:`parse_filesystem`); the defaults are a
    Create that gives none: a root of the task's own (:data:`OWN_ROOT`, read-only), runc's masked
    and read-only paths."""

    __slots__ = ("rootfs", "readonly_rootfs", "mounts", "masked_paths", "readonly_paths", "privileged")
    rootfs: tuple[RootfsMount, ...]
    readonly_rootfs: bool
    mounts: tuple[TaskMount, ...]
    masked_paths: tuple[str, ...]
    readonly_paths: tuple[str, ...]
    privileged: bool

    def __init__(self, rootfs: tuple[RootfsMount, ...] = (), readonly_rootfs: bool = False,
                 mounts: tuple[TaskMount, ...] = (), masked_paths: tuple[str, ...] = MASKED_PATHS,
                 readonly_paths: tuple[str, ...] = READONLY_PATHS, privileged: bool = False) -> None:
        _set(self, "rootfs", rootfs or OWN_ROOT)
        _set(self, "readonly_rootfs", readonly_rootfs or not rootfs)
        _set(self, "mounts", mounts)
        _set(self, "masked_paths", masked_paths)
        _set(self, "readonly_paths", readonly_paths)
        _set(self, "privileged", privileged)

    @property
    def effective_masked_paths(self) -> tuple[str, ...]:
        return () if self.privileged else self.masked_paths

    @property
    def effective_readonly_paths(self) -> tuple[str, ...]:
        return () if self.privileged else self.readonly_paths


# -- the wire --------------------------------------------------------------------------------

def parse_filesystem(payload: Mapping[str, Any]) -> TaskFilesystem:
    """The mount fields of a Task.Create payload; InvalidArgument with a sentence naming the field."""
    rootfs = parse_rootfs(payload)
    mounts = tuple(_task_mount(entry, f"mounts[{i}]") for i, entry in enumerate(array_field(payload, "mounts")))
    return TaskFilesystem(
        rootfs=rootfs,
        readonly_rootfs=_bool(payload, "readonly_rootfs"),
        mounts=mounts,
        masked_paths=_paths(payload, "masked_paths", MASKED_PATHS),
        readonly_paths=_paths(payload, "readonly_paths", READONLY_PATHS),
        privileged=_bool(payload, "privileged"),
    )


def _bool(payload: Mapping[str, Any], name: str) -> bool:
    value = payload.get(name)
    if value is not None and not isinstance(value, bool):
        raise InvalidArgument(f"field {name!r} must be true or false")
    return bool(value)


def _absolute(path: str, where: str) -> str:
    if not os.path.isabs(path) or ".." in path.split("/"):
        raise InvalidArgument(f"field {where!r} must be an absolute path without '..', not {path!r}")
    return os.path.normpath(path)


def tmpfs_refusal(options: Iterable[str]) -> str:
    """What is wrong with a tmpfs mount's ``options`` (the first option that is not one, said),
    or "" when they are all applied."""
    for option in options:
        key, eq, _ = option.partition("=")
        if not (option in _TMPFS_FLAGS or option in _TMPFS_PROPAGATION or (eq and key in _TMPFS_PARAMS)):
            return (f"{option!r}, not a tmpfs option (flags {', '.join(sorted(_TMPFS_FLAGS))}; "
                    f"{', '.join(sorted(_TMPFS_PARAMS))} as key=value; private propagation)")
    return ""


#: The flag options of a tmpfs mount (its parameters are ``key=value``).
TMPFS_FLAGS = frozenset(_TMPFS_FLAGS) | _TMPFS_PROPAGATION


def _task_mount(entry: Any, where: str) -> TaskMount:
    if not isinstance(entry, Mapping):
        raise InvalidArgument(f"field {where!r} must be a map {{destination, source, type, options}}")
    kind = entry.get("type", "bind")
    if kind not in ("bind", "tmpfs"):
        raise InvalidArgument(f"field '{where}.type' {kind!r} is not supported: a task's mounts are binds and "
                              "tmpfs mounts")
    options = options_field(entry, where)
    destination = _absolute(string_field(entry, "destination", where), f"{where}.destination")
    if destination == "/":
        raise InvalidArgument(f"field '{where}.destination' must not be '/': the root is 'rootfs'")
    if kind == "tmpfs":
        refused = tmpfs_refusal(options)
        if refused:
            raise InvalidArgument(f"field '{where}.options' has {refused}")
        return TmpfsMount(destination, options)
    unknown = [o for o in options if o not in _BIND_OPTIONS]
    if unknown:
        raise InvalidArgument(f"field '{where}.options' has {unknown[0]!r}, not a bind option "
                              f"({', '.join(sorted(_BIND_OPTIONS))})")
    return BindMount(destination, _absolute(string_field(entry, "source", where), f"{where}.source"), options)


def _paths(payload: Mapping[str, Any], name: str, default: tuple[str, ...]) -> tuple[str, ...]:
    if payload.get(name) is None:
        return default
    values = payload[name]
    if not isinstance(values, list) or not all(isinstance(v, str) and "\0" not in v for v in values):
        raise InvalidArgument(f"field {name!r} must be an array of absolute paths")
    return tuple(_absolute(v, f"{name}[{i}]") for i, v in enumerate(values))


# -- the host: a task's rootfs ---------------------------------------------------------------

def sandbox_rootfs_path(bundle: str) -> str:
    """Where the shim mounts the pause's rootfs (a sandbox image's)."""
    return os.path.join(bundle, ROOTFS_DIR)


def rootfs_path(bundle: str, task_id: str) -> str:
    """Where the shim mounts a task's rootfs."""
    return os.path.join(bundle, TASKS_DIR, task_id, ROOTFS_DIR)


def check_destinations(fs: TaskFilesystem, root: str) -> None:
    """Check, before a task starts on any handler, the mounts' destinations in its ``root`` (the
    mounted rootfs): InvalidArgument when one resolves to the root itself (a symbolic link to
    ``/`` in the image: a mount there would replace the root). Under /dev (the task's own tmpfs)
    a destination is always made. Resolved as the native handler's launcher resolves them
    (:func:`open_in_root`), each through the earlier mounts' sources where it goes below one (a
    link in a volume counts), for every handler: runc and crun would refuse such a destination
    in their own words (INTERNAL)."""
    root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    sources: dict[str, str] = {}  # the earlier mounts: resolved destination -> source
    empty = ""  # what a new tmpfs holds (nothing), for the mounts below one
    if any(isinstance(mount, TmpfsMount) for mount in fs.mounts):
        import tempfile

        empty = tempfile.mkdtemp(prefix="podshim-tmpfs-")
    try:
        for i, mount in enumerate(fs.mounts):
            if mount.destination.startswith("/dev/"):
                continue
            source = empty if isinstance(mount, TmpfsMount) else mount.source
            resolved: list[str] = []
            try:
                fd = open_in_root(root_fd, mount.destination, sources=sources, resolved=resolved)
                sources["/" + "/".join(resolved)] = source
            except FileNotFoundError:
                if resolved:
                    sources["/" + "/".join(resolved)] = source
                continue
            except OSError as exc:
                if exc.errno == errno.EINVAL:
                    raise InvalidArgument(f"mounts[{i}].destination: {at_root(mount.destination)}") from None
                continue  # the launcher says what is wrong with it, as the OCI runtimes do
            os.close(fd)
    finally:
        os.close(root_fd)
        if empty:
            os.rmdir(empty)


# -- the native child ------------------------------------------------------------------------

class RootSetup(Record):
    """What the native launcher's child needs to build a task's root, all computed and opened in
    the shim before the fork: ``mount_point`` (``<bundle>/tasks/<id>/rootfs``, where the root is
    attached in the task's namespace), the detached trees (:func:`open_trees`), and the
    destination, inside the root, of every mount (resolved by the child, :func:`open_in_root`). :meth:`close` closes the trees' fds (the shim's; the child's
    copies go with it)."""

    __slots__ = ("mount_point", "root_fd", "readonly", "privileged", "own_ipc", "binds", "masked_paths",
                 "readonly_paths", "devices", "userns", "cgroup_namespace", "sysfs_fd", "cgroup_v1")
    mutable = True
    mount_point: str
    root_fd: int
    readonly: bool
    privileged: bool
    own_ipc: bool
    binds: list[tuple[int, str, bool, int, int, int]]  # fd, destination, is dir, prop, flags, recursive flags
    masked_paths: tuple[str, ...]
    readonly_paths: tuple[str, ...]
    devices: tuple[HostDevice, ...]  # privileged: the host's, made in the task's /dev
    userns: bool  # in a pod's user namespace: device nodes bound from the host's
    sysfs_fd: int  # in a pod's user namespace: the host's sysfs (host_sysfs), bound on /sys
    #: a cgroup namespace of its own, rooted at its cgroup (pure cgroup v2), whose cgroup2 is on /sys/fs/cgroup
    cgroup_namespace: bool
    #: on cgroup v1: the task's own cgroup directory of each hierarchy, a detached tree (fd), and
    #: the name it has under /sys/fs/cgroup (the host's mount point's: "cpu,cpuacct", "systemd")
    cgroup_v1: list[tuple[int, str]]

    def __init__(self, mount_point: str, root_fd: int, readonly: bool, privileged: bool,
                 own_ipc: bool, binds: list[tuple[int, str, bool, int, int, int]] | None = None,
                 masked_paths: tuple[str, ...] = (), readonly_paths: tuple[str, ...] = (),
                 devices: tuple[HostDevice, ...] = (), userns: bool = False, cgroup_namespace: bool = False,
                 sysfs_fd: int = -1, cgroup_v1: list[tuple[int, str]] | None = None) -> None:
        self.mount_point = mount_point
        self.root_fd = root_fd
        self.readonly = readonly
        self.privileged = privileged
        self.own_ipc = own_ipc
        self.binds = [] if binds is None else binds
        self.masked_paths = masked_paths
        self.readonly_paths = readonly_paths
        self.devices = devices
        self.userns = userns
        self.cgroup_namespace = cgroup_namespace
        self.sysfs_fd = sysfs_fd
        self.cgroup_v1 = [] if cgroup_v1 is None else cgroup_v1

    def close(self) -> None:
        for fd in [self.root_fd, self.sysfs_fd, *(bind[0] for bind in self.binds), *(tree[0] for tree in self.cgroup_v1)]:
            if fd >= 0:
                os.close(fd)
        self.root_fd = self.sysfs_fd = -1
        self.binds = []
        self.cgroup_v1 = []


def open_trees(fs: TaskFilesystem, mount_point: str, *, own_ipc: bool, idmap: IdMap | None = None) -> RootSetup:
    """Open, in the shim's mount namespace, the detached trees a task's root is built from: its
    rootfs (mounted on ``mount_point``) and every bind source; with ``idmap`` (a pod's user
    namespace), each id-mapped with it (an overlay rootfs is not: its layers are, by
    :func:`mount_rootfs`). The caller closes the result. FailedPrecondition names a source that
    cannot be taken or id-mapped."""
    if idmap is not None and fs.privileged:
        raise FailedPrecondition("a privileged task cannot run in a pod's user namespace")
    setup = RootSetup(mount_point, -1, fs.readonly_rootfs, fs.privileged, own_ipc,
                      masked_paths=fs.effective_masked_paths, readonly_paths=fs.effective_readonly_paths,
                      devices=host_devices() if fs.privileged else (), userns=idmap is not None)
    try:
        setup.root_fd = _open_tree(mount_point, recursive=True, what="the task's root")
        if idmap is not None and root_needs_idmap(mount_point):
            idmap_tree(setup.root_fd, idmap, recursive=True, what=f"the task's root {mount_point}")
        if idmap is not None:
            setup.sysfs_fd = host_sysfs()
        for i, mount in enumerate(fs.mounts):
            if isinstance(mount, TmpfsMount):
                setup.binds.append((open_tmpfs(mount, i, idmap), mount.destination, True,
                                    PROPAGATION[mount.propagation], 0, 0))
                continue
            fd = open_source(mount, i, idmap)
            flags = recursive_flags = 0
            for option in mount.options:
                flags |= _BIND_FLAGS.get(option, 0)
                recursive_flags |= _BIND_RECURSIVE_FLAGS.get(option, 0)
            setup.binds.append((fd, mount.destination, os.path.isdir(mount.source), PROPAGATION[mount.propagation],
                                flags, recursive_flags))
    except BaseException:
        setup.close()
        raise
    return setup


def open_root(mount_point: str, idmap: IdMap) -> int:
    """A detached copy of the task's root on ``mount_point`` (with what is mounted below it),
    id-mapped with ``idmap``; FailedPrecondition when it cannot be."""
    fd = _open_tree(mount_point, recursive=True, what="the task's root")
    try:
        idmap_tree(fd, idmap, recursive=True, what=f"the task's root {mount_point}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_tmpfs(mount: TmpfsMount, index: int, idmap: IdMap | None) -> int:
    """The new tmpfs of ``mounts[index]``, detached, with its flags and parameters;
    FailedPrecondition with the kernel's reason when it cannot be made, or in a pod's user
    namespace (not supported yet: it would be the host's root's)."""
    if idmap is not None:
        raise FailedPrecondition(f"mounts[{index}] ({mount.destination}) is a tmpfs mount: not supported yet in a "
                                 "pod's user namespace")
    try:
        return linux.new_mount("tmpfs", "tmpfs", mount.params, mount.flags)
    except OSError as exc:
        raise FailedPrecondition(f"cannot make the tmpfs of mounts[{index}] ({mount.destination}): "
                                 f"{exc.strerror}") from None


def open_source(mount: TaskMount, index: int, idmap: IdMap | None) -> int:
    """A detached copy of the source of ``mounts[index]`` (recursive as the bind is), id-mapped
    with ``idmap`` when given unless it is already (``idmapped``); FailedPrecondition names a
    source that cannot be taken or id-mapped (and a tmpfs, :func:`open_tmpfs`, in a pod's user namespace)."""
    if isinstance(mount, TmpfsMount):
        return open_tmpfs(mount, index, idmap)
    fd = _open_tree(mount.source, recursive=mount.recursive, what=f"mounts[{index}].source")
    if idmap is not None and not mount.idmapped:
        try:
            idmap_tree(fd, idmap, recursive=mount.recursive, what=f"mounts[{index}].source {mount.source}")
        except BaseException:
            os.close(fd)
            raise
    return fd


def host_sysfs() -> int:
    """A detached copy of the host's sysfs (/sys, without the mounts below it, as a new sysfs
    has none), read-only, nosuid, nodev, noexec: the /sys of a task in a pod's user namespace,
    which may not mount a sysfs of the network namespace (CNI's, the host's) it does not own (as
    runc binds the host's then). Taken in the host's user namespace: inside the pod's, the mounts
    below /sys are locked to it and a copy without them is refused. FailedPrecondition when it
    cannot be taken."""
    try:
        sysfs = linux.open_tree("/sys", False)
        try:
            linux.mount_setattr(sysfs, flags=linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC)
        except BaseException:
            os.close(sysfs)
            raise
    except OSError as exc:
        raise FailedPrecondition(f"cannot take the host's /sys for the pod's user namespace: {exc.strerror}") \
            from None
    return sysfs


def open_cgroup_trees(setup: RootSetup, directories: Mapping[str, str]) -> None:
    """On cgroup v1, take the task's cgroup ``directories`` (mount point of a v1 hierarchy -> the
    task's directory in it) for its /sys/fs/cgroup, as runc makes it: each under the name of the
    host's mount point. FailedPrecondition names one that cannot be taken."""
    for mountpoint, directory in sorted(directories.items()):
        setup.cgroup_v1.append((_open_tree(directory, recursive=False, what="the task's cgroup"),
                                os.path.basename(mountpoint.rstrip("/"))))


def _open_tree(path: str, *, recursive: bool, what: str) -> int:
    try:
        return linux.open_tree(path, recursive)
    except OSError as exc:
        raise FailedPrecondition(f"cannot take {what} {path}: {exc.strerror}") from None


# The child's side runs between fork and exec: syscalls in a fixed order, no imports, no logging.
# ``step`` names what failed in the launcher's report (a list so the caller sees the last one).
# Every path inside the task's root is resolved there by fd (open_in_root) and mounted on the fd
# it gave: never looked up again by name, where a link in the image could send it to the host's.

def _mount_point(root_fd: int, name: str) -> int:
    """The directory ``name`` right under the root (made if missing), an O_PATH fd: /proc, /dev
    and /sys are directories of the root itself, never what a link there names."""
    try:
        os.mkdir(name, 0o755, dir_fd=root_fd)
    except FileExistsError:
        pass
    return os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=root_fd)


def _attach(mnt: int, target_fd: int) -> None:
    try:
        linux.move_mount(mnt, target_fd)
    finally:
        os.close(mnt)
        os.close(target_fd)


def enter_root(setup: RootSetup, step: list[str], before_pivot: Callable[[], object] | None = None) -> None:
    """In the task's new mount namespace (a recursive slave), in its pid namespace: build its root
    on ``setup.mount_point`` and pivot into it. Order: the root, /proc, /dev, /dev/pts, /dev/shm (the pod's), /dev/mqueue
    (own IPC), /sys, the binds, ``before_pivot`` (its OCI hooks up to createContainer), the
    read-only remount of the root, pivot_root, the masked and the read-only paths. Raises OSError;
    ``step[0]`` says which step."""
    root = setup.mount_point
    nosuid_nodev_noexec = linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
    step[0] = f"attaching the task's root on {root}"
    # On the cwd (the launcher's chdir to ``root``, carried into this namespace), then on the
    # tree's own fd: in a pod's user namespace no path through the shim's directories is looked up.
    linux.move_mount(setup.root_fd, os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
    linux.mount_setattr(setup.root_fd, propagation=linux.MS_PRIVATE, recursive=True)
    root_fd = os.dup(setup.root_fd)
    try:
        _standard_mounts(setup, root_fd, step)
        for fd, destination, is_dir, propagation, flags, recursive_flags in setup.binds:
            step[0] = f"binding a mount on {destination}"
            try:
                target = open_in_root(root_fd, destination, "dir" if is_dir else "file")
            except OSError as exc:
                if exc.errno == errno.EINVAL:
                    step[0] = AT_ROOT + destination
                raise
            try:
                linux.move_mount(fd, target)
            finally:
                os.close(target)
            # On the tree's own fd, now attached: the mount just made, whatever its path names now.
            linux.mount_setattr(fd, propagation=propagation & ~linux.MS_REC, recursive=bool(propagation & linux.MS_REC))
            if flags:
                linux.mount_setattr(fd, flags=flags)
            if recursive_flags:
                linux.mount_setattr(fd, flags=recursive_flags, recursive=True)
        if before_pivot is not None:  # (as runc: the root is still writable, as a hook may need)
            before_pivot()
        if setup.readonly:
            step[0] = "making the root read-only"
            linux.mount_setattr(root_fd, flags=linux.MS_RDONLY)
        # pivot_root(".", "."): the old root ends up stacked under the new one and is detached at
        # once, so no path of the host's filesystem stays reachable from the task.
        step[0] = f"pivot_root into {root}"
        os.fchdir(root_fd)
    finally:
        os.close(root_fd)
    linux.pivot_root(".", ".")
    linux.umount2(".", linux.MNT_DETACH)
    os.chdir("/")
    for path in setup.masked_paths:
        step[0] = f"masking {path}"
        try:
            is_dir = stat.S_ISDIR(os.stat(path).st_mode)
        except FileNotFoundError:
            continue
        if is_dir:
            linux.mount("tmpfs", path, "tmpfs", linux.MS_RDONLY)
        else:
            linux.mount("/dev/null", path, None, linux.MS_BIND)
    for path in setup.readonly_paths:
        step[0] = f"making {path} read-only"
        try:
            linux.mount(path, path, None, linux.MS_BIND | linux.MS_REC)
        except FileNotFoundError:
            continue
        linux.mount(None, path, None, linux.MS_REMOUNT | linux.MS_BIND | linux.MS_RDONLY | nosuid_nodev_noexec)


def _standard_mounts(setup: RootSetup, root_fd: int, step: list[str]) -> None:
    """/proc, /dev (a tmpfs with the standard nodes and links, devpts, the pod's /dev/shm, an own
    mqueue) and /sys, each on a directory right under the root open on ``root_fd``."""
    nosuid_nodev_noexec = linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
    step[0] = "mounting proc on /proc"
    _attach(linux.new_mount("proc", "proc", [], nosuid_nodev_noexec), _mount_point(root_fd, "proc"))
    step[0] = "mounting a tmpfs on /dev"
    dev = linux.new_mount("tmpfs", "tmpfs", _DEV_TMPFS, linux.MS_NOSUID | _MS_STRICTATIME)
    try:
        target = _mount_point(root_fd, "dev")
        try:
            linux.move_mount(dev, target)
        finally:
            os.close(target)
        _dev_entries(setup, dev, step)
    finally:
        os.close(dev)
    flags = nosuid_nodev_noexec | (0 if setup.privileged else linux.MS_RDONLY)
    if setup.sysfs_fd >= 0:
        step[0] = "binding the host's /sys on /sys"
        _attach(setup.sysfs_fd, _mount_point(root_fd, "sys"))
    else:
        step[0] = "mounting sysfs on /sys"
        _attach(linux.new_mount("sysfs", "sysfs", [], flags), _mount_point(root_fd, "sys"))
    if setup.cgroup_namespace:
        # The process is in its own cgroup namespace already: this cgroup2 shows its cgroup as /.
        step[0] = "mounting cgroup2 on /sys/fs/cgroup"
        cgroup2 = linux.new_mount("cgroup2", "cgroup2", [], flags)
        try:
            target = os.open("sys/fs/cgroup", os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=root_fd)
        except BaseException:
            os.close(cgroup2)
            raise
        _attach(cgroup2, target)
    if setup.cgroup_v1:
        _cgroup_v1_mounts(setup, root_fd, nosuid_nodev_noexec, step)


def _cgroup_v1_mounts(setup: RootSetup, root_fd: int, nosuid_nodev_noexec: int, step: list[str]) -> None:
    """/sys/fs/cgroup on cgroup v1, as runc makes it: a tmpfs holding, for each hierarchy, the
    task's own cgroup directory bound under the host's name for it, a link for each controller of
    a co-mounted one (cpu -> cpu,cpuacct); read-only unless the task is privileged."""
    step[0] = "mounting a tmpfs on /sys/fs/cgroup"
    tmpfs = linux.new_mount("tmpfs", "tmpfs", [("mode", "755")], nosuid_nodev_noexec)
    try:
        target = os.open("sys/fs/cgroup", os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=root_fd)
        try:
            linux.move_mount(tmpfs, target)
        finally:
            os.close(target)
        names = {name for _, name in setup.cgroup_v1}
        for fd, name in setup.cgroup_v1:
            step[0] = f"binding the task's cgroup on /sys/fs/cgroup/{name}"
            os.mkdir(name, 0o755, dir_fd=tmpfs)
            target = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=tmpfs)
            try:
                linux.move_mount(fd, target)
            finally:
                os.close(target)
            linux.mount_setattr(fd, flags=nosuid_nodev_noexec | (0 if setup.privileged else linux.MS_RDONLY))
            for controller in name.split(","):
                if controller != name and controller not in names:
                    os.symlink(name, controller, dir_fd=tmpfs)
        if not setup.privileged:
            step[0] = "making /sys/fs/cgroup read-only"
            linux.mount_setattr(tmpfs, flags=linux.MS_RDONLY)
    finally:
        os.close(tmpfs)


def _dev_entries(setup: RootSetup, dev: int, step: list[str]) -> None:
    """What goes in the task's /dev, the tmpfs open on ``dev``: the standard nodes (and a
    privileged task's host devices), the links, devpts, the pod's /dev/shm, an own mqueue."""
    umask = os.umask(0)  # the nodes' modes as given
    try:
        for name, major, minor in DEV_NODES:
            step[0] = f"making /dev/{name}"
            if setup.userns:
                # No mknod in a user namespace: the host's node is bound on an empty file (runc's way).
                os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o666, dir_fd=dev))
                _attach(linux.open_tree(f"/dev/{name}", False), os.open(name, os.O_PATH | os.O_CLOEXEC, dir_fd=dev))
                continue
            os.mknod(name, stat.S_IFCHR | 0o666, os.makedev(major, minor), dir_fd=dev)
        for device in setup.devices:
            step[0] = f"making {device.path}"
            directory, name = os.path.split(device.path[len("/dev/"):])
            parent = open_in_root(dev, directory, "dir") if directory else os.dup(dev)
            try:
                try:
                    os.mknod(name, (stat.S_IFCHR if device.kind == "c" else stat.S_IFBLK) | device.mode,
                             os.makedev(device.major, device.minor), dir_fd=parent)
                except FileExistsError:
                    continue  # one of the standard nodes
                os.chown(name, device.uid, device.gid, dir_fd=parent, follow_symlinks=False)
            finally:
                os.close(parent)
    finally:
        os.umask(umask)
    for name, target in DEV_LINKS:
        os.symlink(target, name, dir_fd=dev)
    step[0] = "mounting devpts on /dev/pts"
    _attach(linux.new_mount("devpts", "devpts", _DEVPTS, linux.MS_NOSUID | linux.MS_NOEXEC),
            _mount_point(dev, "pts"))
    step[0] = "binding the pod's /dev/shm"
    _attach(linux.open_tree("/dev/shm", True), _mount_point(dev, "shm"))
    if setup.own_ipc:
        step[0] = "mounting mqueue on /dev/mqueue"
        _attach(linux.new_mount("mqueue", "mqueue", [], linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC),
                _mount_point(dev, "mqueue"))


# -- the pause's root ------------------------------------------------------------------------

#: Where the pause's empty root is attached in its own mount namespace, before it pivots into it:
#: a directory every host has, hidden this way from nobody but the pause (the namespace is its own).
PAUSE_ROOT_MOUNT_POINT = "/dev"
_PAUSE_ROOT_TMPFS = [("mode", "755"), ("size", "64k"), ("nr_inodes", "64")]


class PauseRoot(Record):
    """The pause's own root, which it pivots into (:func:`enter_pause_root`) so that nothing of
    the host is reachable through it (``/proc/<pause>/root``, ``/proc/<pause>/cwd`` or a setns
    into its mount namespace): the sandbox image's rootfs the shim mounted on ``rootfs``, or
    (``rootfs`` empty) an empty tmpfs holding only ``binary``, the pause program (bound
    read-only at its own path; "" for the builtin pause, which execs nothing). ``shm_size_bytes``,
    when not 0, mounts the tmpfs of a pod IPC namespace (that big) on its /dev/shm, where the
    tasks take it from. The root is read-only."""

    __slots__ = ("rootfs", "binary", "shm_size_bytes")
    rootfs: str
    binary: str
    shm_size_bytes: int

    def __init__(self, rootfs: str = "", binary: str = "", shm_size_bytes: int = 0) -> None:
        _set(self, "rootfs", rootfs)
        _set(self, "binary", binary)
        _set(self, "shm_size_bytes", shm_size_bytes)


def enter_pause_root(setup: PauseRoot, step: list[str]) -> None:
    """In the pause's new mount namespace (a recursive slave of the shim's), right before its
    cwd: build its root (:class:`PauseRoot`) and pivot into it, the old root detached. Every path
    inside it is resolved by fd (:func:`open_in_root`): a sandbox image's /dev may be a link to
    anywhere. Raises OSError; ``step[0]`` says which step."""
    root = setup.rootfs or PAUSE_ROOT_MOUNT_POINT
    nosuid_nodev_noexec = linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
    if not setup.rootfs:
        step[0] = f"mounting the pause's root (a tmpfs) on {root}"
        tmpfs = linux.new_mount("tmpfs", "tmpfs", _PAUSE_ROOT_TMPFS, nosuid_nodev_noexec)
        try:
            linux.move_mount(tmpfs, root)
        finally:
            os.close(tmpfs)
    linux.mount(None, root, None, linux.MS_PRIVATE | linux.MS_REC)
    root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if setup.binary:
            step[0] = f"binding {setup.binary} into the pause's root"
            program = linux.open_tree(setup.binary, False)
            try:
                linux.mount_setattr(program, flags=linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV)
            except BaseException:
                os.close(program)
                raise
            _attach(program, open_in_root(root_fd, setup.binary, "file"))
        if setup.shm_size_bytes:
            step[0] = "mounting a tmpfs on /dev/shm"
            shm = linux.new_mount("tmpfs", "shm", [("mode", "1777"), ("size", str(setup.shm_size_bytes))],
                                  nosuid_nodev_noexec)
            try:
                target = open_in_root(root_fd, "/dev/shm", "dir")
            except BaseException:
                os.close(shm)
                raise
            _attach(shm, target)
    finally:
        os.close(root_fd)
    step[0] = "making the pause's root read-only"
    linux.mount(None, root, None, linux.MS_REMOUNT | linux.MS_BIND | linux.MS_RDONLY
                | (0 if setup.rootfs else nosuid_nodev_noexec))
    step[0] = f"pivot_root into {root}"
    os.chdir(root)
    linux.pivot_root(".", ".")
    linux.umount2(".", linux.MNT_DETACH)
    os.chdir("/")
