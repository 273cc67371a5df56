"""Seccomp filters from OCI ``linux.seccomp`` objects, compiled with libseccomp.

:func:`validate` checks a profile's shape (what runc and crun would refuse, refused first);
:func:`compile_profile` turns it into a classic BPF program with libseccomp (ctypes on
``libseccomp.so.2``, the maintained library runc and crun link), in the parent, so a launched
child only has to :func:`load` the bytes right before exec. Rules follow runc's
libcontainer/seccomp: a syscall name this libseccomp does not know is skipped (profiles list
syscalls of newer kernels and other architectures), a rule whose action is the default one is
skipped, the arguments of one rule are ANDed unless an argument index repeats (then each is a
rule of its own, ORed), and ``errnoRet`` defaults to EPERM.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
from collections.abc import Mapping
from typing import Any

from shim.lib.files import read_all

__all__ = ["ACTIONS", "ARCHITECTURES", "FLAGS", "OPERATORS", "Program", "ProfileError", "compile_profile", "load",
           "validate"]


class ProfileError(ValueError):
    """A seccomp profile that cannot be used; the message names the bad part (``syscalls[3].action``)."""


_ACT_KILL_PROCESS = 0x80000000
_ACT_KILL_THREAD = 0x00000000
_ACT_TRAP = 0x00030000
_ACT_ERRNO = 0x00050000
_ACT_TRACE = 0x7FF00000
_ACT_LOG = 0x7FFC0000
_ACT_ALLOW = 0x7FFF0000
#: The OCI action names this filter supports (SCMP_ACT_NOTIFY needs a listener: not supported).
ACTIONS = ("SCMP_ACT_KILL", "SCMP_ACT_KILL_THREAD", "SCMP_ACT_KILL_PROCESS", "SCMP_ACT_TRAP", "SCMP_ACT_ERRNO",
           "SCMP_ACT_TRACE", "SCMP_ACT_ALLOW", "SCMP_ACT_LOG")
#: OCI comparison operators and libseccomp's enum scmp_compare.
OPERATORS = {"SCMP_CMP_NE": 1, "SCMP_CMP_LT": 2, "SCMP_CMP_LE": 3, "SCMP_CMP_EQ": 4, "SCMP_CMP_GE": 5,
             "SCMP_CMP_GT": 6, "SCMP_CMP_MASKED_EQ": 7}
#: OCI architecture names (libseccomp's names, upper-cased, after ``SCMP_ARCH_``).
ARCHITECTURES = ("SCMP_ARCH_X86", "SCMP_ARCH_X86_64", "SCMP_ARCH_X32", "SCMP_ARCH_ARM", "SCMP_ARCH_AARCH64",
                 "SCMP_ARCH_MIPS", "SCMP_ARCH_MIPS64", "SCMP_ARCH_MIPS64N32", "SCMP_ARCH_MIPSEL",
                 "SCMP_ARCH_MIPSEL64", "SCMP_ARCH_MIPSEL64N32", "SCMP_ARCH_PPC", "SCMP_ARCH_PPC64",
                 "SCMP_ARCH_PPC64LE", "SCMP_ARCH_S390", "SCMP_ARCH_S390X", "SCMP_ARCH_PARISC", "SCMP_ARCH_PARISC64",
                 "SCMP_ARCH_RISCV64")
#: The filter flags (seccomp(2) SECCOMP_FILTER_FLAG_*) that can be applied.
FLAGS = {"SECCOMP_FILTER_FLAG_TSYNC": 1, "SECCOMP_FILTER_FLAG_LOG": 2, "SECCOMP_FILTER_FLAG_SPEC_ALLOW": 4}
_MAX_ARGS = 6
_U64 = 2**64 - 1
_KEYS = {"defaultAction", "defaultErrnoRet", "architectures", "flags", "syscalls", "listenerPath", "listenerMetadata"}
_SYSCALL_KEYS = {"names", "action", "errnoRet", "args"}
_ARG_KEYS = {"index", "value", "valueTwo", "op"}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_keys(doc: Mapping[str, Any], allowed: set[str], path: str) -> None:
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise ProfileError(f"{path}{unknown[0]} is not a field of an OCI seccomp profile")


def _errno_ret(doc: Mapping[str, Any], key: str, path: str) -> None:
    value = doc.get(key)
    if value is not None and not (_is_int(value) and 0 <= value <= 0xFFFF):
        raise ProfileError(f"{path}{key} must be an errno number (0..65535), got {value!r}")


def _action(value: Any, path: str) -> None:
    if value == "SCMP_ACT_NOTIFY":
        raise ProfileError(f"{path} SCMP_ACT_NOTIFY is not supported (no seccomp notify listener)")
    if value not in ACTIONS:
        raise ProfileError(f"{path} {value!r} is not a seccomp action ({', '.join(ACTIONS)})")


def validate(profile: Any) -> None:
    """Check an OCI ``linux.seccomp`` object; ProfileError naming the bad part."""
    if not isinstance(profile, Mapping):
        raise ProfileError("must be an object")
    _check_keys(profile, _KEYS, "")
    if profile.get("listenerPath") or profile.get("listenerMetadata"):
        raise ProfileError("listenerPath is not supported (no seccomp notify listener)")
    _action(profile.get("defaultAction"), "defaultAction")
    _errno_ret(profile, "defaultErrnoRet", "")
    for key, allowed in (("architectures", ARCHITECTURES), ("flags", tuple(FLAGS))):
        values = profile.get(key) or []
        if not isinstance(values, list):
            raise ProfileError(f"{key} must be an array")
        for i, value in enumerate(values):
            if value not in allowed:
                raise ProfileError(f"{key}[{i}] {value!r} is not supported ({', '.join(allowed)})")
    if profile.get("flags") and _SYS_SECCOMP.get(os.uname().machine) is None:
        raise ProfileError(f"flags are not supported on {os.uname().machine}")
    syscalls = profile.get("syscalls") or []
    if not isinstance(syscalls, list):
        raise ProfileError("syscalls must be an array")
    for i, rule in enumerate(syscalls):
        path = f"syscalls[{i}]."
        if not isinstance(rule, Mapping):
            raise ProfileError(f"syscalls[{i}] must be an object")
        _check_keys(rule, _SYSCALL_KEYS, path)
        names = rule.get("names")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
            raise ProfileError(f"{path}names must be a non-empty array of syscall names")
        _action(rule.get("action"), f"{path}action")
        _errno_ret(rule, "errnoRet", path)
        args = rule.get("args") or []
        if not isinstance(args, list):
            raise ProfileError(f"{path}args must be an array")
        if len(args) > _MAX_ARGS:
            raise ProfileError(f"{path}args has {len(args)} comparisons; at most {_MAX_ARGS}")
        for j, arg in enumerate(args):
            apath = f"{path}args[{j}]."
            if not isinstance(arg, Mapping):
                raise ProfileError(f"{path}args[{j}] must be an object")
            _check_keys(arg, _ARG_KEYS, apath)
            index = arg.get("index")
            if not (isinstance(index, int) and _is_int(index) and 0 <= index < _MAX_ARGS):
                raise ProfileError(f"{apath}index must be 0..5, got {index!r}")
            for key in ("value", "valueTwo"):
                value = arg.get(key, 0)
                if not (_is_int(value) and 0 <= value <= _U64):
                    raise ProfileError(f"{apath}{key} must be an unsigned 64-bit integer, got {value!r}")
            if arg.get("op") not in OPERATORS:
                raise ProfileError(f"{apath}op {arg.get('op')!r} is not one of {', '.join(OPERATORS)}")


# -- libseccomp -------------------------------------------------------------------------------


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


@functools.cache
def _library() -> ctypes.CDLL:
    name = "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        from ctypes.util import find_library  # only here: it imports shutil and tempfile, the shim need not

        found = find_library("seccomp")
        if found is None:
            raise ProfileError("seccomp filters need libseccomp.so.2 (Debian: libseccomp2), which is not "
                               "installed") from None
        lib = ctypes.CDLL(found, use_errno=True)
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.restype = None
    lib.seccomp_arch_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_arch_resolve_name.restype = ctypes.c_uint32
    lib.seccomp_arch_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    lib.seccomp_arch_exist.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp)]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def _action_value(name: str, errno_ret: int | None, default_errno: int) -> int:
    if name == "SCMP_ACT_ERRNO":
        return _ACT_ERRNO | ((default_errno if errno_ret is None else errno_ret) & 0xFFFF)
    if name == "SCMP_ACT_TRACE":
        return _ACT_TRACE | ((default_errno if errno_ret is None else errno_ret) & 0xFFFF)
    return {"SCMP_ACT_KILL": _ACT_KILL_THREAD, "SCMP_ACT_KILL_THREAD": _ACT_KILL_THREAD,
            "SCMP_ACT_KILL_PROCESS": _ACT_KILL_PROCESS, "SCMP_ACT_TRAP": _ACT_TRAP, "SCMP_ACT_ALLOW": _ACT_ALLOW,
            "SCMP_ACT_LOG": _ACT_LOG}[name]


def _libseccomp_error(result: int, what: str) -> None:
    if result < 0:
        raise ProfileError(f"{what}: libseccomp says {os.strerror(-result)}")


def compile_profile(profile: Mapping[str, Any]) -> bytes:
    """The BPF program (struct sock_filter array) of a valid profile (:func:`validate` first).

    Cached by the profile's JSON: every container of a pod usually gets the same one. Raises
    ProfileError when libseccomp refuses it or is missing.
    """
    return _compile(json.dumps(profile, sort_keys=True))


@functools.lru_cache(maxsize=16)
def _compile(profile_json: str) -> bytes:
    profile = json.loads(profile_json)
    lib = _library()
    default_errno = profile.get("defaultErrnoRet")
    default = _action_value(profile["defaultAction"], default_errno, errno.EPERM)
    ctx = lib.seccomp_init(default)
    if not ctx:
        raise ProfileError("libseccomp could not make a filter (seccomp_init failed)")
    try:
        for arch in profile.get("architectures") or []:
            token = lib.seccomp_arch_resolve_name(arch.removeprefix("SCMP_ARCH_").lower().encode())
            if token == 0:
                raise ProfileError(f"architecture {arch} is not known to this libseccomp")
            if lib.seccomp_arch_exist(ctx, token) == 0:
                continue  # the native one, added by seccomp_init
            _libseccomp_error(lib.seccomp_arch_add(ctx, token), f"adding architecture {arch}")
        for i, rule in enumerate(profile.get("syscalls") or []):
            action = _action_value(rule["action"], rule.get("errnoRet"), errno.EPERM)
            if action == default:
                continue  # libseccomp refuses a rule that does what the default does
            args = rule.get("args") or []
            comparisons = [(a["index"], OPERATORS[a["op"]], a.get("value", 0), a.get("valueTwo", 0)) for a in args]
            indexes = [c[0] for c in comparisons]
            groups = [comparisons] if len(set(indexes)) == len(indexes) else [[c] for c in comparisons]
            for name in rule["names"]:
                number = lib.seccomp_syscall_resolve_name(name.encode())
                if number == -1:  # __NR_SCMP_ERROR: unknown to this libseccomp (runc skips it too)
                    continue
                for group in groups:
                    array = (_ArgCmp * max(len(group), 1))(*(_ArgCmp(*c) for c in group))
                    _libseccomp_error(lib.seccomp_rule_add_array(ctx, action, number, len(group), array),
                                      f"syscalls[{i}] ({name})")
        fd = os.memfd_create("seccomp-bpf", os.MFD_CLOEXEC)
        try:
            _libseccomp_error(lib.seccomp_export_bpf(ctx, fd), "exporting the filter")
            os.lseek(fd, 0, os.SEEK_SET)
            return read_all(fd)
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)


# -- loading, in the child ------------------------------------------------------------------------

_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_SECCOMP_SET_MODE_FILTER = 1
_SYS_SECCOMP = {"x86_64": 317, "aarch64": 277, "riscv64": 277, "ppc64le": 358, "s390x": 348}
_SOCK_FILTER_BYTES = 8


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_libc.syscall.argtypes = [ctypes.c_long, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_void_p]


class Program:
    """A compiled filter ready to load: its sock_fprog built before a fork, and its flags."""

    def __init__(self, bpf: bytes, flags: list[str] | tuple[str, ...] = ()):
        if not bpf or len(bpf) % _SOCK_FILTER_BYTES or len(bpf) // _SOCK_FILTER_BYTES > 0xFFFF:
            raise ProfileError(f"a BPF program of {len(bpf)} bytes cannot be loaded")
        self._buffer = ctypes.create_string_buffer(bpf, len(bpf))
        self._fprog = _SockFprog(len(bpf) // _SOCK_FILTER_BYTES, ctypes.addressof(self._buffer))
        self.flags = 0
        for flag in flags:
            self.flags |= FLAGS[flag]
        self._sys_seccomp = _SYS_SECCOMP.get(os.uname().machine, -1)  # validate() refused flags without it
        self.instructions = len(bpf) // _SOCK_FILTER_BYTES


def load(program: Program) -> None:
    """Install the filter on the calling thread (needs no_new_privs or CAP_SYS_ADMIN). OSError."""
    if program.flags:
        result = _libc.syscall(program._sys_seccomp, _SECCOMP_SET_MODE_FILTER, program.flags,
                               ctypes.addressof(program._fprog))
    else:
        result = _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(program._fprog), 0, 0)
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
