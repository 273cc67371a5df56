"""The RuntimeDefault seccomp profile: containerd's default (contrib/seccomp/seccomp_default.go,
itself moby's), as our own data.

Every syscall an ordinary program needs is allowed; what is left fails with EPERM (the default
action), such as keyctl, add_key, unshare, setns, mount, the module and reboot calls, bpf, and
(on kernels before 4.8) ptrace. A few are allowed only with the capability that makes them
useful, read from the container's bounding set as containerd does: with CAP_SYS_ADMIN, mount,
unshare, setns, clone with namespace flags and clone3 (without it, clone may not make
namespaces and clone3 fails with ENOSYS, so that a libc falls back to clone); with
CAP_SYS_PTRACE, kcmp and pidfd_getfd; and so on. socket() is allowed for every address family
but AF_ALG and AF_VSOCK; personality() only for the usual personas.
"""

from __future__ import annotations

import errno
import platform
from collections.abc import Iterable
from typing import Any

__all__ = ["ALLOWED", "default_profile"]

#: Allowed for every container, on every architecture (libseccomp skips what an architecture lacks).
ALLOWED = (
    "accept", "accept4", "access", "adjtimex", "alarm", "bind", "brk", "cachestat", "capget", "capset",
    "chdir", "chmod", "chown", "chown32", "clock_adjtime", "clock_adjtime64", "clock_getres",
    "clock_getres_time64", "clock_gettime", "clock_gettime64", "clock_nanosleep", "clock_nanosleep_time64",
    "close", "close_range", "connect", "copy_file_range", "creat", "dup", "dup2", "dup3", "epoll_create",
    "epoll_create1", "epoll_ctl", "epoll_ctl_old", "epoll_pwait", "epoll_pwait2", "epoll_wait",
    "epoll_wait_old", "eventfd", "eventfd2", "execve", "execveat", "exit", "exit_group", "faccessat",
    "faccessat2", "fadvise64", "fadvise64_64", "fallocate", "fanotify_mark", "fchdir", "fchmod", "fchmodat",
    "fchmodat2", "fchown", "fchown32", "fchownat", "fcntl", "fcntl64", "fdatasync", "fgetxattr", "flistxattr",
    "flock", "fork", "fremovexattr", "fsetxattr", "fstat", "fstat64", "fstatat64", "fstatfs", "fstatfs64",
    "fsync", "ftruncate", "ftruncate64", "futex", "futex_requeue", "futex_time64", "futex_wait",
    "futex_waitv", "futex_wake", "futimesat", "getcpu", "getcwd", "getdents", "getdents64", "getegid",
    "getegid32", "geteuid", "geteuid32", "getgid", "getgid32", "getgroups", "getgroups32", "getitimer",
    "getpeername", "getpgid", "getpgrp", "getpid", "getppid", "getpriority", "getrandom", "getresgid",
    "getresgid32", "getresuid", "getresuid32", "getrlimit", "get_robust_list", "getrusage", "getsid",
    "getsockname", "getsockopt", "get_thread_area", "gettid", "gettimeofday", "getuid", "getuid32",
    "getxattr", "getxattrat", "inotify_add_watch", "inotify_init", "inotify_init1", "inotify_rm_watch",
    "io_cancel", "ioctl", "io_destroy", "io_getevents", "io_pgetevents", "io_pgetevents_time64", "ioprio_get",
    "ioprio_set", "io_setup", "io_submit", "ipc", "kill", "landlock_add_rule", "landlock_create_ruleset",
    "landlock_restrict_self", "lchown", "lchown32", "lgetxattr", "link", "linkat", "listen", "listmount",
    "listxattr", "listxattrat", "llistxattr", "_llseek", "lremovexattr", "lseek", "lsetxattr",
    "lsm_get_self_attr", "lsm_list_modules", "lsm_set_self_attr", "lstat", "lstat64", "madvise", "membarrier",
    "memfd_create", "memfd_secret", "mincore", "mkdir", "mkdirat", "mknod", "mknodat", "mlock", "mlock2",
    "mlockall", "map_shadow_stack", "mmap", "mmap2", "mprotect", "mq_getsetattr", "mq_notify", "mq_open",
    "mq_timedreceive", "mq_timedreceive_time64", "mq_timedsend", "mq_timedsend_time64", "mq_unlink", "mremap",
    "mseal", "msgctl", "msgget", "msgrcv", "msgsnd", "msync", "munlock", "munlockall", "munmap",
    "name_to_handle_at", "nanosleep", "newfstatat", "_newselect", "open", "openat", "openat2", "pause",
    "pidfd_open", "pidfd_send_signal", "pipe", "pipe2", "pkey_alloc", "pkey_free", "pkey_mprotect", "poll",
    "ppoll", "ppoll_time64", "prctl", "pread64", "preadv", "preadv2", "prlimit64", "process_mrelease",
    "pselect6", "pselect6_time64", "pwrite64", "pwritev", "pwritev2", "read", "readahead", "readlink",
    "readlinkat", "readv", "recv", "recvfrom", "recvmmsg", "recvmmsg_time64", "recvmsg", "remap_file_pages",
    "removexattr", "removexattrat", "rename", "renameat", "renameat2", "restart_syscall", "rmdir", "rseq",
    "rt_sigaction", "rt_sigpending", "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn", "rt_sigsuspend",
    "rt_sigtimedwait", "rt_sigtimedwait_time64", "rt_tgsigqueueinfo", "sched_getaffinity", "sched_getattr",
    "sched_getparam", "sched_get_priority_max", "sched_get_priority_min", "sched_getscheduler",
    "sched_rr_get_interval", "sched_rr_get_interval_time64", "sched_setaffinity", "sched_setattr",
    "sched_setparam", "sched_setscheduler", "sched_yield", "seccomp", "select", "semctl", "semget", "semop",
    "semtimedop", "semtimedop_time64", "send", "sendfile", "sendfile64", "sendmmsg", "sendmsg", "sendto",
    "setfsgid", "setfsgid32", "setfsuid", "setfsuid32", "setgid", "setgid32", "setgroups", "setgroups32",
    "setitimer", "setpgid", "setpriority", "setregid", "setregid32", "setresgid", "setresgid32", "setresuid",
    "setresuid32", "setreuid", "setreuid32", "setrlimit", "set_robust_list", "setsid", "setsockopt",
    "set_thread_area", "set_tid_address", "setuid", "setuid32", "setxattr", "setxattrat", "shmat", "shmctl",
    "shmdt", "shmget", "shutdown", "sigaltstack", "signalfd", "signalfd4", "sigprocmask", "sigreturn",
    "socketcall", "socketpair", "splice", "stat", "stat64", "statfs", "statfs64", "statmount", "statx",
    "symlink", "symlinkat", "sync", "sync_file_range", "syncfs", "sysinfo", "tee", "tgkill", "time",
    "timer_create", "timer_delete", "timer_getoverrun", "timer_gettime", "timer_gettime64", "timer_settime",
    "timer_settime64", "timerfd_create", "timerfd_gettime", "timerfd_gettime64", "timerfd_settime",
    "timerfd_settime64", "times", "tkill", "truncate", "truncate64", "ugetrlimit", "umask", "uname", "unlink",
    "unlinkat", "uretprobe", "utime", "utimensat", "utimensat_time64", "utimes", "vfork", "vmsplice", "wait4",
    "waitid", "waitpid", "write", "writev",
)

_AF_ALG = 38
_AF_VSOCK = 40
_CLONE_NAMESPACES = 0x7E020000  # CLONE_NEWNS|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET|NEWCGROUP

#: Architectures of the filter, by machine (what the kernel can run there).
_ARCHES = {
    "x86_64": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
    "aarch64": ["SCMP_ARCH_ARM", "SCMP_ARCH_AARCH64"],
    "s390x": ["SCMP_ARCH_S390", "SCMP_ARCH_S390X"],
    "riscv64": ["SCMP_ARCH_RISCV64"],
    "ppc64le": ["SCMP_ARCH_PPC64LE"],
}
#: Allowed on one machine only.
_BY_MACHINE = {
    "x86_64": ["arch_prctl", "modify_ldt"],
    "i686": ["modify_ldt"],
    "aarch64": ["arm_fadvise64_64", "arm_sync_file_range", "sync_file_range2", "breakpoint", "cacheflush", "set_tls"],
    "ppc64le": ["sync_file_range2", "swapcontext"],
    "s390x": ["s390_pci_mmio_read", "s390_pci_mmio_write", "s390_runtime_instr"],
    "riscv64": ["riscv_flush_icache", "riscv_hwprobe"],
}
#: Allowed when the container's bounding set has the capability.
_BY_CAPABILITY = {
    "CAP_DAC_READ_SEARCH": ["open_by_handle_at"],
    "CAP_SYS_ADMIN": ["bpf", "clone", "clone3", "fanotify_init", "fsconfig", "fsmount", "fsopen", "fspick",
                      "lookup_dcookie", "mount", "mount_setattr", "move_mount", "open_tree", "perf_event_open",
                      "quotactl", "quotactl_fd", "setdomainname", "sethostname", "setns", "syslog", "umount",
                      "umount2", "unshare"],
    "CAP_SYS_BOOT": ["reboot"],
    "CAP_SYS_CHROOT": ["chroot"],
    "CAP_SYS_MODULE": ["delete_module", "init_module", "finit_module"],
    "CAP_SYS_PACCT": ["acct"],
    "CAP_SYS_PTRACE": ["kcmp", "pidfd_getfd", "process_madvise", "process_vm_readv", "process_vm_writev", "ptrace"],
    "CAP_SYS_RAWIO": ["iopl", "ioperm"],
    "CAP_SYS_TIME": ["settimeofday", "stime", "clock_settime", "clock_settime64"],
    "CAP_SYS_TTY_CONFIG": ["vhangup"],
    "CAP_SYS_NICE": ["get_mempolicy", "mbind", "set_mempolicy", "set_mempolicy_home_node"],
    "CAP_SYSLOG": ["syslog"],
    "CAP_BPF": ["bpf"],
    "CAP_PERFMON": ["perf_event_open"],
}


def _allow(names: list[str], *args: dict[str, Any]) -> dict[str, Any]:
    rule: dict[str, Any] = {"names": names, "action": "SCMP_ACT_ALLOW"}
    if args:
        rule["args"] = list(args)
    return rule


def _arg(index: int, value: int, op: str, value_two: int = 0) -> dict[str, Any]:
    arg = {"index": index, "value": value, "op": op}
    if value_two:
        arg["valueTwo"] = value_two
    return arg


def default_profile(bounding: Iterable[str], *, machine: str | None = None,
                    kernel: tuple[int, int] | None = None) -> dict[str, Any]:
    """The RuntimeDefault OCI ``linux.seccomp`` object for a container whose bounding set is
    ``bounding`` (CAP_* names), on ``machine`` (default: this one) with ``kernel`` (major, minor;
    default: this one's)."""
    machine = machine or platform.machine()
    if kernel is None:
        major, minor = platform.release().split(".")[:2]
        kernel = (int(major), int("".join(c for c in minor if c.isdigit()) or 0))
    syscalls = [
        _allow(list(ALLOWED)),
        # Three single-condition ranges, not one rule with two SCMP_CMP_NE: runc splits a
        # repeated argument index into rules of their own, which would OR them (containerd's note).
        _allow(["socket"], _arg(0, _AF_ALG, "SCMP_CMP_LT")),
        _allow(["socket"], _arg(0, _AF_ALG + 1, "SCMP_CMP_EQ")),
        _allow(["socket"], _arg(0, _AF_VSOCK, "SCMP_CMP_GT")),
        *(_allow(["personality"], _arg(0, persona, "SCMP_CMP_EQ")) for persona in (0x0, 0x0008, 0x20000, 0x20008,
                                                                                  0xFFFFFFFF)),
    ]
    if kernel >= (4, 8):
        syscalls.append(_allow(["process_vm_readv", "process_vm_writev", "ptrace"]))
    if machine in _BY_MACHINE:
        syscalls.append(_allow(list(_BY_MACHINE[machine])))
    bounding = list(bounding)
    for cap in bounding:
        if cap in _BY_CAPABILITY:
            syscalls.append(_allow(list(_BY_CAPABILITY[cap])))
    if "CAP_SYS_ADMIN" not in bounding:
        index = 1 if machine.startswith("s390") else 0  # s390's clone has flags second
        syscalls.append(_allow(["clone"], _arg(index, _CLONE_NAMESPACES, "SCMP_CMP_MASKED_EQ", 0)))
        syscalls.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS})
    return {"defaultAction": "SCMP_ACT_ERRNO", "architectures": list(_ARCHES.get(machine, [])),
            "syscalls": syscalls}
