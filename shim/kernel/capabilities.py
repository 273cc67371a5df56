"""Linux capabilities: this kernel's set, and the calls that change a process's sets (capset, the
bounding set, the ambient set); their names and numbers are :mod:`shim.lib.capabilities`'s.

The setters are meant for a forked child about to exec (:mod:`shim.runtime.confine`): the
ctypes structures they pass are built by :func:`capset_args` in the parent, so the child only
makes system calls. Every setter raises OSError with the C errno.
"""

from __future__ import annotations

import ctypes
import os

from shim.lib.capabilities import CAPABILITIES, current, mask, names

# The names and a process's sets (shim.lib.capabilities) beside the calls that change them.
__all__ = ["CAPABILITIES", "CapsetArgs", "capset", "capset_args", "clear_ambient", "current", "drop_bounding",
           "last_cap", "mask", "names", "set_keepcaps"]

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
