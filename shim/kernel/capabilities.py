"""Linux capabilities: their names and numbers, this kernel's and this process's sets, and the
calls that change a process's sets (capset, the bounding set, the ambient set).

The setters are meant for a forked child about to exec (:mod:`shim.runtime.confine`): the
ctypes structures they pass are built by :func:`capset_args` in the parent, so the child only
makes system calls. Every setter raises OSError with the C errno.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["CAPABILITIES", "CapsetArgs", "capset", "capset_args", "clear_ambient", "current", "drop_bounding",
           "last_cap", "mask", "names", "set_keepcaps"]

#: <linux/capability.h>: every capability's name and number.
CAPABILITIES: dict[str, int] = {f"CAP_{name}": number for number, name in enumerate((
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
    "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER",
    "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
    "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP",
    "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF",
    "CHECKPOINT_RESTORE",
))}

_PR_SET_KEEPCAPS = 8
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.capset.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def _check(result: int) -> None:
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def last_cap() -> int:
    """The highest capability number this kernel knows (/proc/sys/kernel/cap_last_cap)."""
    with open("/proc/sys/kernel/cap_last_cap", "rb") as f:
        return int(f.read())


def current(field: str = "CapEff", pid: int | str = "self") -> int:
    """A capability set of a process as a bit mask: ``field`` of /proc/PID/status (CapEff, CapPrm,
    CapBnd, CapInh, CapAmb)."""
    from shim.kernel.linux import status_mask

    return status_mask(field, f"/proc/{pid}/status")


def mask(cap_names: tuple[str, ...] | list[str]) -> int:
    """The bit mask of known capability names (KeyError for an unknown one)."""
    bits = 0
    for name in cap_names:
        bits |= 1 << CAPABILITIES[name]
    return bits


def names(bits: int) -> list[str]:
    """The names of the capabilities in a bit mask, in number order."""
    return [name for name, number in CAPABILITIES.items() if bits >> number & 1]


class CapsetArgs:
    """The two structures capset(2) takes, built before a fork."""

    def __init__(self, effective: int, permitted: int, inheritable: int):
        self.header = _Header(_LINUX_CAPABILITY_VERSION_3, 0)
        self.data = (_Data * 2)()
        for i in range(2):
            self.data[i].effective = effective >> (32 * i) & 0xFFFFFFFF
            self.data[i].permitted = permitted >> (32 * i) & 0xFFFFFFFF
            self.data[i].inheritable = inheritable >> (32 * i) & 0xFFFFFFFF


def capset_args(effective: int, permitted: int, inheritable: int = 0) -> CapsetArgs:
    return CapsetArgs(effective, permitted, inheritable)


def capset(args: CapsetArgs) -> None:
    """Set the calling thread's effective, permitted and inheritable sets."""
    _check(_libc.capset(ctypes.addressof(args.header), ctypes.addressof(args.data)))


def drop_bounding(number: int) -> None:
    """Remove a capability from the calling thread's bounding set (needs CAP_SETPCAP)."""
    _check(_libc.prctl(_PR_CAPBSET_DROP, number, 0, 0, 0))


def clear_ambient() -> None:
    _check(_libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0))


def set_keepcaps(keep: bool) -> None:
    """Whether the permitted set survives a change from uid 0 to another uid (cleared by exec)."""
    _check(_libc.prctl(_PR_SET_KEEPCAPS, int(keep), 0, 0, 0))
