"""Thin ctypes wrappers for the Linux system calls CPython 3.11 does not expose.

Python 3.11 has no ``os.unshare``/``os.setns``/``mount``; these call libc directly. Every
wrapper raises :class:`OSError` with the C ``errno`` (and the path, where there is one) on
failure, like the ``os`` module does, so callers can branch on ``exc.errno``.

Nothing here knows about sandboxes: it is the vocabulary :mod:`shim.kernel.netns`, :mod:`shim.runtime.pause`,
:mod:`shim.kernel.reaper` and :mod:`shim.kernel.cgroups` are written in.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import struct

# /proc reading, the namespace types and setns, and the mount calls live with the code the client shares.
from shim.lib.mountcalls import (
    MNT_DETACH,
    MNT_FORCE,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    MS_SHARED,
    MS_SLAVE,
    UMOUNT_NOFOLLOW,
    fs_type,
    mount,
    mount_fs,
    mount_setattr,
    move_mount,
    new_mount,
    open_tree,
    umount2,
)
from shim.lib.mountcalls import check_result as _check  # (the errno check of every wrapper here too)
from shim.lib.mountcalls import encode_path as _encode
from shim.lib.namespaces import (
    CLONE_NEWCGROUP,
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWTIME,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
    ns_type,
    setns,
)
from shim.lib.processes import (
    STAT_PPID,
    STAT_SESSION,
    STAT_STARTTIME,
    STAT_STATE,
    proc_start_time,
    proc_stat,
    read_status,
    status_mask,
)

__all__ = [
    "CLONE_NEWCGROUP", "CLONE_NEWIPC", "CLONE_NEWNET", "CLONE_NEWNS", "CLONE_NEWPID",
    "CLONE_NEWTIME", "CLONE_NEWUSER", "CLONE_NEWUTS",
    "MS_BIND", "MS_NODEV", "MS_NOEXEC", "MS_NOSUID", "MS_PRIVATE", "MS_RDONLY", "MS_REC",
    "MS_REMOUNT", "MS_SHARED", "MS_SLAVE",
    "MNT_DETACH", "MNT_FORCE", "UMOUNT_NOFOLLOW",
    "STAT_PPID", "STAT_SESSION", "STAT_STARTTIME", "STAT_STATE",
    "CAP_SYS_RESOURCE", "CLONE3_REFUSED", "CLONE_INTO_CGROUP", "block_all_signals", "clone3", "fork_into_cgroup", "get_child_subreaper", "mount", "ns_inode", "ns_type", "proc_start_time",
    "proc_stat", "release_zero_pages", "set_child_subreaper", "set_parent_death_signal", "set_signal_mask", "sethostname", "setns", "umount2", "unshare",
    "write_file", "open_tree", "move_mount", "pivot_root", "mount_fs", "bpf", "new_mount", "mount_setattr", "openat2",
    "RESOLVE_IN_ROOT", "RESOLVE_NO_MAGICLINKS", "RESOLVE_NO_SYMLINKS", "RESOLVE_BENEATH",
    "IN_ATTRIB", "IN_CLOSE_WRITE", "IN_CREATE", "IN_DELETE", "IN_DELETE_SELF", "IN_IGNORED", "IN_MODIFY",
    "IN_MOVED_FROM", "IN_MOVED_TO", "IN_MOVE_SELF", "IN_Q_OVERFLOW", "IN_UNMOUNT",
    "inotify_add_watch", "inotify_init", "inotify_read", "fs_type", "default_signal", "read_status", "status_mask",
    "oom_score_adj_permitted",
]

# <linux/sched.h>
CLONE_INTO_CGROUP = 0x200000000  # clone3 only (Linux 5.7)
#: The errnos of a clone3 the kernel cannot make (ENOSYS: before 5.3; E2BIG, EINVAL: an older
#: clone_args or no CLONE_INTO_CGROUP) or a seccomp filter refuses (ENOSYS, EPERM): the caller
#: does it another way.
CLONE3_REFUSED = frozenset({errno.ENOSYS, errno.E2BIG, errno.EINVAL, errno.EPERM})

# <linux/prctl.h>
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NAME = 15
#: The kernel keeps 15 bytes of a task's name (TASK_COMM_LEN - 1).
COMM_MAX_BYTES = 15
_PR_GET_CHILD_SUBREAPER = 37

# pthread_sigmask(3) "how"; glibc's sigset_t is 1024 bits.
_SIG_BLOCK = 0
_SIG_SETMASK = 2
_SigSet = ctypes.c_ulong * (1024 // (8 * ctypes.sizeof(ctypes.c_ulong)))
_FULL_SIGSET = _SigSet(*[ctypes.c_ulong(-1).value] * len(_SigSet()))

# <sys/inotify.h>
IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_UNMOUNT = 0x00002000
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_INOTIFY_EVENT = struct.Struct("=iIII")  # wd, mask, cookie, len (of the NUL-padded name after it)
#: Room for every event the kernel queues by default (16384) and more, read in one call.
_INOTIFY_READ_BYTES = 65536

_libc = ctypes.CDLL(None, use_errno=True)

_libc.unshare.argtypes = [ctypes.c_int]
_libc.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
_libc.pthread_sigmask.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_libc.inotify_init1.argtypes = [ctypes.c_int]
_libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MADV_DONTNEED = 4
_PAGE = os.sysconf("SC_PAGE_SIZE")


def unshare(flags: int) -> None:
    """Move the calling thread into new namespaces (``CLONE_NEW*`` flags). Raises OSError."""
    _check(_libc.unshare(flags))


# The system calls glibc does not wrap (or wraps with its own rules: rt_sigaction) whose numbers
# differ between architectures; those from 424 on (clone3, openat2, the new mount API) are the same
# everywhere. Elsewhere the wrappers that need one fail ENOSYS, naming the machine.
_MACHINE = os.uname().machine
_ARCH_SYSCALLS = {
    # machine: (pivot_root, rt_sigaction)
    "x86_64": (155, 13),
    "aarch64": (41, 134),  # the generic table (asm-generic/unistd.h)
    "riscv64": (41, 134),
}
_SYS_PIVOT_ROOT, _SYS_RT_SIGACTION = _ARCH_SYSCALLS.get(_MACHINE, (-1, -1))
_SYS_BPF = {"x86_64": 321, "aarch64": 280, "riscv64": 280}.get(_MACHINE, -1)
_SYS_OPENAT2 = 437
# <linux/openat2.h>
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10
_libc.syscall.restype = ctypes.c_long
_SYS_CLONE3 = 435  # the same on every architecture (the generic syscall table)
# The same libc through a handle that keeps the GIL across the call: a clone3 child must come
# back holding it, as its parent's only thread did when it made the call.
_libc_gil = ctypes.PyDLL(None, use_errno=True)
_libc_gil.syscall.restype = ctypes.c_long


def openat2(dir_fd: int, path: str, flags: int, resolve: int, mode: int = 0) -> int:
    """openat2(2): ``path`` opened relative to ``dir_fd`` with the ``RESOLVE_*`` rules of ``resolve``
    (RESOLVE_IN_ROOT: ``dir_fd`` is the root every ``..`` and absolute link stays in;
    RESOLVE_NO_MAGICLINKS: no /proc/PID/root, /proc/PID/fd/N and the like). Raises OSError naming
    ``path`` (EXDEV: it would have left the root; ELOOP: a link refused)."""
    how = struct.pack("=3Q", flags | os.O_CLOEXEC, mode, resolve)
    fd: int = _libc.syscall(_SYS_OPENAT2, ctypes.c_int(dir_fd), _encode(path), how, ctypes.c_size_t(len(how)))
    _check(fd, path)
    return fd


def pivot_root(new_root: str, put_old: str) -> None:
    """pivot_root(2). Raises OSError naming ``new_root``."""
    _check(_libc.syscall(_arch_syscall(_SYS_PIVOT_ROOT, "pivot_root"), _encode(new_root), _encode(put_old)), new_root)


def bpf(cmd: int, attr: bytes | ctypes.Array[ctypes.c_char]) -> int:
    """bpf(2) with the ``union bpf_attr`` bytes ``attr`` (a ctypes buffer when the kernel writes
    into it); its result (a new fd for the commands that make one). Raises OSError."""
    buf = attr if isinstance(attr, ctypes.Array) else ctypes.create_string_buffer(attr, len(attr))
    result: int = _libc.syscall(_arch_syscall(_SYS_BPF, "bpf"), ctypes.c_int(cmd), buf, ctypes.c_uint(len(buf)))
    _check(result)
    return result


def sethostname(name: str) -> None:
    """Set the hostname of the calling thread's UTS namespace. Raises OSError."""
    raw = name.encode()
    _check(_libc.sethostname(raw, len(raw)))


def set_child_subreaper(enabled: bool = True) -> None:
    """PR_SET_CHILD_SUBREAPER: orphaned descendants are re-parented to this process, not PID 1."""
    _check(_libc.prctl(_PR_SET_CHILD_SUBREAPER, int(enabled), 0, 0, 0))


def set_parent_death_signal(sig: int) -> None:
    """PR_SET_PDEATHSIG: the calling thread gets ``sig`` when the thread that forked it exits
    (0: none). The caller checks ``os.getppid()`` afterwards: a parent gone before sends nothing."""
    _check(_libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0))


def release_zero_pages(address: int, length: int) -> int:
    """Give the kernel back each whole page of this process's private anonymous memory in
    [``address``, ``address + length``) that holds only zeros (MADV_DONTNEED: it reads as zeros
    again, and is a page of its own only once written). Returns the bytes given back. Only for
    memory that no other thread writes meanwhile: a write between the look and the madvise
    would be lost."""
    first = -(-address // _PAGE) * _PAGE
    end = (address + length) // _PAGE * _PAGE
    if end <= first:
        return 0
    data = ctypes.string_at(first, end - first)
    zero = bytes(_PAGE)
    released = 0
    run = 0  # the offset where the current run of zero pages began, or -1
    for offset in range(0, end - first + _PAGE, _PAGE):
        if offset < end - first and data[offset:offset + _PAGE] == zero:
            if run < 0:
                run = offset
            continue
        if 0 <= run < offset:
            _check(_libc.madvise(first + run, offset - run, _MADV_DONTNEED))
            released += offset - run
        run = -1
    return released


def set_process_name(name: str) -> None:
    """PR_SET_NAME: the name ps, top and pgrep show for this process (/proc/self/comm),
    cut to 15 bytes by the kernel."""
    buf = ctypes.create_string_buffer(name.encode()[:COMM_MAX_BYTES])
    _check(_libc.prctl(_PR_SET_NAME, ctypes.addressof(buf), 0, 0, 0))


def get_child_subreaper() -> bool:
    """Whether this process is a child subreaper (PR_GET_CHILD_SUBREAPER)."""
    value = ctypes.c_int(0)
    _check(_libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.addressof(value), 0, 0, 0))
    return bool(value.value)


def fork_into_cgroup(cgroup_fd: int) -> int:
    """fork(), the child born in the cgroup v2 directory open on ``cgroup_fd`` (clone3 with
    CLONE_INTO_CGROUP, Linux 5.7): returns the child's pid in the parent and 0 in the child.
    See :func:`clone3`, which this is with no namespaces.
    """
    return clone3(CLONE_INTO_CGROUP, cgroup_fd)


def clone3(flags: int, cgroup_fd: int = -1) -> int:
    """fork() with clone3 ``flags``: ``CLONE_NEW*`` makes the child's new namespaces at its
    birth (with CLONE_NEWPID it is PID 1 of its own), CLONE_INTO_CGROUP makes it born in the
    cgroup v2 directory open on ``cgroup_fd``. Returns the child's pid in the parent and 0 in
    the child.

    Moving a process into a cgroup afterwards (a write to cgroup.procs) takes the kernel's global
    cgroup_threadgroup_rwsem, whose writer first waits for an RCU grace period: 6-8 ms on this
    project's machines, most of a sandbox start. A child born in its cgroup takes no such lock.

    Only for a process with one thread whose child runs system calls until it execs or exits:
    the child skips Python's and libc's after-fork bookkeeping (no ``os.register_at_fork``
    hooks, no threading reset; libc's cached thread id stays the parent's, so no raise() and no
    locking of pthread mutexes it holds). Raises OSError: one of :data:`CLONE3_REFUSED` where the
    kernel or a seccomp filter does not allow it, EBADF/EOPNOTSUPP for a directory that is not
    cgroup v2.
    """
    args = struct.pack("=11Q", flags, 0, 0, 0, signal.SIGCHLD, 0, 0, 0, 0, 0, max(cgroup_fd, 0))
    buf = ctypes.create_string_buffer(args, len(args))
    pid: int = _libc_gil.syscall(ctypes.c_long(_SYS_CLONE3), buf, ctypes.c_size_t(len(args)))
    _check(pid)
    return pid


def block_all_signals() -> bytes:
    """Block every signal in the calling thread; return the previous mask for :func:`set_signal_mask`.

    Like ``signal.pthread_sigmask`` but ~100 times cheaper (3 µs against 0.3 ms for a block and
    a restore, measured): the mask stays raw bytes instead of becoming ~60 ``Signals`` objects.
    That matters on the fork path of every pause launch.
    """
    old = _SigSet()
    _check_pthread(_libc.pthread_sigmask(_SIG_BLOCK, _FULL_SIGSET, old))
    return bytes(old)


def set_signal_mask(mask: bytes = b"") -> None:
    """Set the calling thread's signal mask to ``mask`` from :func:`block_all_signals` (empty: none)."""
    new = _SigSet.from_buffer_copy(mask.ljust(ctypes.sizeof(_SigSet), b"\0"))
    _check_pthread(_libc.pthread_sigmask(_SIG_SETMASK, new, None))


def _arch_syscall(number: int, name: str) -> int:
    """``number``, or OSError(ENOSYS) when this machine's number for ``name`` is not known here."""
    if number < 0:
        raise OSError(errno.ENOSYS, f"{name}: podshim does not know its system call number on {_MACHINE} "
                                    f"(known: {', '.join(sorted(_ARCH_SYSCALLS))})")
    return number


def default_signal(sig: int) -> None:
    """Give ``sig`` its default disposition (SIG_DFL) with the system call itself: the C
    library's sigaction refuses its own signals (glibc: 32 and 33, which its posix_spawn leaves
    ignored in what it starts), the kernel does not. Python's table of handlers is not told: for
    a child about to exec. Raises OSError (not on a machine whose number for it is not known
    here: there the C library's own signals are left as they are)."""
    if _SYS_RT_SIGACTION < 0:
        # Not known on this machine: the C library's way. It refuses its own signals, which a
        # program of the same C library takes back at its start anyway; those are left as they are.
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
        return
    action = (ctypes.c_ulong * 4)()  # struct sigaction as the kernel takes it, all 0: SIG_DFL
    _check(_libc.syscall(_arch_syscall(_SYS_RT_SIGACTION, "rt_sigaction"), ctypes.c_int(sig), action, None,
                         ctypes.c_size_t(8)))


def _check_pthread(result: int) -> None:
    if result != 0:  # pthread functions return the error number instead of setting errno
        raise OSError(result, os.strerror(result))


CAP_SYS_RESOURCE = 24


def oom_score_adj_permitted(value: int, status_path: str = "/proc/self/status") -> bool:
    """Whether a child of this process may set its oom_score_adj to ``value``.

    Raising it is always allowed; lowering it below ours needs CAP_SYS_RESOURCE (bit 24 of CapEff).
    """
    try:
        with open("/proc/self/oom_score_adj") as f:
            if value >= int(f.read()):
                return True
        return bool(status_mask("CapEff", status_path) >> CAP_SYS_RESOURCE & 1)
    except (OSError, ValueError):
        pass
    return False


def write_file(path: str, data: bytes) -> None:
    """Write ``data`` to a kernel file (/proc/sys, cgroupfs) in one write(2), as the kernel expects.

    No buffering, no truncation, no newline. Raises OSError.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def ns_inode(path: str) -> int:
    """Inode of the namespace at ``path`` (``/proc/PID/ns/net``, a bind-mounted netns file, ...).

    Two paths name the same namespace exactly when their inodes (on nsfs) are equal. Raises OSError.
    """
    return os.stat(path).st_ino


def inotify_init() -> int:
    """A new inotify instance (inotify_init1 with IN_NONBLOCK and IN_CLOEXEC): its fd, which the
    caller closes. Raises OSError (EMFILE at the user's ``max_user_instances``, ENOSYS)."""
    fd: int = _libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
    _check(fd)
    return fd


def inotify_add_watch(fd: int, path: str, mask: int) -> int:
    """Watch ``path`` (followed if it is a symbolic link) for the ``IN_*`` events of ``mask`` on the
    inotify instance ``fd``; returns the watch descriptor, the same one for a second watch of the
    same inode (whose mask then replaces the first). Raises OSError naming ``path`` (ENOSPC at
    the user's ``max_user_watches``)."""
    wd: int = _libc.inotify_add_watch(fd, _encode(path), mask)
    _check(wd, path)
    return wd


def inotify_read(fd: int) -> list[tuple[int, int, str]]:
    """The events queued on the non-blocking inotify instance ``fd`` (all of them), as
    ``(wd, mask, name)``: ``name`` is the entry's name for an event in a watched directory, ""
    for one on the watched object itself; wd -1 with IN_Q_OVERFLOW when events were lost.
    [] when none is queued. Raises OSError."""
    events: list[tuple[int, int, str]] = []
    while True:
        try:
            data = os.read(fd, _INOTIFY_READ_BYTES)
        except BlockingIOError:
            return events
        offset = 0
        while offset < len(data):
            wd, mask, _, size = _INOTIFY_EVENT.unpack_from(data, offset)
            offset += _INOTIFY_EVENT.size
            name = os.fsdecode(data[offset:offset + size].rstrip(b"\0"))
            offset += size
            events.append((wd, mask, name))
