"""Device rules: which device nodes the processes of a cgroup may create (mknod), read and write.

A rule set (:class:`DeviceRules`) is "every device", or "none but these" — containerd's two
shapes: its default spec denies every device and then allows some, a privileged container allows
all. :func:`apply` makes a rule set the rules of a cgroup in every hierarchy that has them:

- cgroup v1, the ``devices`` controller: ``a`` written to devices.deny (no device), then one line
  per rule to devices.allow; or ``a`` to devices.allow (every device). A new directory starts with
  a copy of its parent's rules, and may never allow what its parent does not.
- cgroup v2: a BPF_PROG_TYPE_CGROUP_DEVICE program compiled here from the rules
  (:func:`program`), loaded once per rule set in a process and attached to the directory with
  BPF_F_ALLOW_OVERRIDE, as one program per cgroup: a child cgroup that attaches its own (a task
  whose rules are not its pod's) is judged by its own, one that attaches none by its parent's;
  programs attached above with BPF_F_ALLOW_MULTI (systemd's) still apply. "Every device" attaches
  nothing. On a hybrid machine the kernel asks both: the program of the process's v2 cgroup, then
  the v1 controller. runc's and crun's cgroup managers attach a program of their own to their
  container's cgroup, with BPF_F_ALLOW_MULTI, from the spec's rules; the kernel refuses it beside
  one attached with another flag, so a task of theirs gets none of the shim's (``program``).

So a task whose rules are its pod's needs no write at all (``inherited``).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import struct
from collections.abc import Iterable
from typing import Any

from shim.kernel import linux
from shim.kernel.cgroups import V2, SandboxCgroup
from shim.rpc.records import Record
from shim.rpc.records import set_field as _set
from shim.rpc.status import FailedPrecondition, InvalidArgument, error_from_oserror

__all__ = ["ALL_DEVICES", "DEFAULT_RULES", "DeviceRule", "DeviceRules", "apply", "normal_access", "pod_rules", "preload",
           "program", "widen"]

log = logging.getLogger(__name__)

_ACCESS_ORDER = "rwm"
_MAX_NUMBER = (1 << 31) - 1  # a BPF immediate is a signed 32-bit number; majors and minors fit far below


def normal_access(access: str) -> str:
    """``access`` (some of ``r``, ``w`` and ``m``, each once) in the order ``rwm``; InvalidArgument
    for anything else."""
    if not isinstance(access, str) or not access or set(access) - set(_ACCESS_ORDER) or len(set(access)) != len(access):
        raise InvalidArgument(f"device permissions {access!r} must be some of r, w and m, each once")
    return "".join(c for c in _ACCESS_ORDER if c in access)


class DeviceRule(Record):
    """One allowed kind of device: ``kind`` ``c`` (character), ``b`` (block) or ``a`` (both),
    ``major`` and ``minor`` (None: any), and ``access``, some of ``r``, ``w``, ``m`` (mknod).
    InvalidArgument for anything else."""

    __slots__ = ("kind", "major", "minor", "access")
    kind: str
    major: int | None
    minor: int | None
    access: str

    def __init__(self, kind: str, major: int | None = None, minor: int | None = None, access: str = "rwm") -> None:
        if kind not in ("a", "b", "c"):
            raise InvalidArgument(f"device type {kind!r} must be c, b or a")
        for name, number in (("major", major), ("minor", minor)):
            if number is not None and (not isinstance(number, int) or not 0 <= number <= _MAX_NUMBER):
                raise InvalidArgument(f"device {name} {number!r} must be a number from 0 to {_MAX_NUMBER}")
        _set(self, "kind", kind)
        _set(self, "major", major)
        _set(self, "minor", minor)
        _set(self, "access", normal_access(access))

    def line(self) -> str:
        """The rule as the v1 controller's devices.allow takes it: ``c 1:3 rwm``, ``c 136:* rwm``."""
        major = "*" if self.major is None else str(self.major)
        minor = "*" if self.minor is None else str(self.minor)
        return f"{self.kind} {major}:{minor} {self.access}"

    def to_oci(self) -> dict[str, Any]:
        """The rule as an OCI ``linux.resources.devices`` entry (an absent number is any)."""
        entry: dict[str, Any] = {"allow": True, "type": self.kind}
        if self.major is not None:
            entry["major"] = self.major
        if self.minor is not None:
            entry["minor"] = self.minor
        entry["access"] = self.access
        return entry


class DeviceRules(Record):
    """Every device (``allow_all``), or none but those ``allowed`` lists."""

    __slots__ = ("allow_all", "allowed")
    allow_all: bool
    allowed: tuple[DeviceRule, ...]

    def __init__(self, allow_all: bool = False, allowed: tuple[DeviceRule, ...] = ()) -> None:
        _set(self, "allow_all", allow_all)
        _set(self, "allowed", allowed)

    def plus(self, rules: Iterable[DeviceRule]) -> DeviceRules:
        """These rules and ``rules`` (those not already here, in order)."""
        if self.allow_all:
            return self
        added = tuple(dict.fromkeys((*self.allowed, *rules)))
        return self if added == self.allowed else DeviceRules(allowed=added)

    def to_oci(self) -> list[dict[str, Any]]:
        """OCI ``linux.resources.devices``: containerd's deny-all entry, then the allowed ones;
        or one entry that allows every device."""
        if self.allow_all:
            return [{"allow": True, "access": "rwm"}]
        return [{"allow": False, "access": "rwm"}, *(rule.to_oci() for rule in self.allowed)]


#: containerd's default rules (its spec's deny-all and WithDefaultUnixDevices) with runc's own
#: defaults (mknod of any character or block device, which runc adds to every container).
DEFAULT_RULES = DeviceRules(allowed=(
    DeviceRule("c", None, None, "m"),
    DeviceRule("b", None, None, "m"),
    DeviceRule("c", 1, 3),  # /dev/null
    DeviceRule("c", 1, 8),  # /dev/random
    DeviceRule("c", 1, 7),  # /dev/full
    DeviceRule("c", 5, 0),  # /dev/tty
    DeviceRule("c", 1, 5),  # /dev/zero
    DeviceRule("c", 1, 9),  # /dev/urandom
    DeviceRule("c", 5, 1),  # /dev/console
    DeviceRule("c", 136, None),  # /dev/pts/*
    DeviceRule("c", 5, 2),  # /dev/ptmx
    DeviceRule("c", 10, 200),  # /dev/net/tun
))
#: Every device: containerd's WithAllDevicesAllowed, for what is privileged.
ALL_DEVICES = DeviceRules(allow_all=True)


def pod_rules(privileged: bool) -> DeviceRules:
    """The rules of a pod's own cgroup (its pause's, the parent of its tasks'): every device for a
    privileged pod, so that its privileged tasks may have them; else the default ones."""
    return ALL_DEVICES if privileged else DEFAULT_RULES


# -- cgroup v1 ----------------------------------------------------------------------------------

def _write_v1(directory: str, rules: DeviceRules) -> None:
    if rules.allow_all:
        writes = [("devices.allow", "a")]
    else:
        writes = [("devices.deny", "a"), *(("devices.allow", rule.line()) for rule in rules.allowed)]
    for name, line in writes:
        _write_v1_line(directory, name, line)


def _write_v1_line(directory: str, name: str, line: str) -> None:
    path = os.path.join(directory, name)
    try:
        linux.write_file(path, line.encode())
    except OSError as exc:
        if exc.errno == errno.EPERM:
            raise FailedPrecondition(f"cannot allow '{line}' in {path}: the parent cgroup does not allow it") from None
        raise error_from_oserror(exc, f"cannot write '{line}' to {path}") from exc


# -- cgroup v2: the BPF program -----------------------------------------------------------------

# bpf_cgroup_dev_ctx: access_type (the device type in its low 16 bits, the access asked in its
# high ones), major, minor; each a u32.
_CTX_ACCESS_TYPE, _CTX_MAJOR, _CTX_MINOR = 0, 4, 8
_DEVICE_TYPE = {"b": 1, "c": 2}  # BPF_DEVCG_DEV_BLOCK, BPF_DEVCG_DEV_CHAR
_ACCESS_BIT = {"m": 1, "r": 2, "w": 4}  # BPF_DEVCG_ACC_MKNOD, _READ, _WRITE
# Opcodes: class | operation | source (K: the immediate, X: a register).
_LDX_W = 0x61  # BPF_LDX | BPF_MEM | BPF_W
_AND_K = 0x57  # BPF_ALU64 | BPF_AND | BPF_K
_RSH_K = 0x77  # BPF_ALU64 | BPF_RSH | BPF_K
_MOV_K = 0xB7  # BPF_ALU64 | BPF_MOV | BPF_K
_MOV_X = 0xBF  # BPF_ALU64 | BPF_MOV | BPF_X
_JNE_K = 0x55  # BPF_JMP | BPF_JNE | BPF_K
_JNE_X = 0x5D  # BPF_JMP | BPF_JNE | BPF_X
_EXIT = 0x95  # BPF_JMP | BPF_EXIT
_INSN = struct.Struct("<BBhi")  # struct bpf_insn: code, dst_reg | src_reg << 4, off, imm

_BPF_PROG_LOAD = 5
_BPF_PROG_ATTACH = 8
_BPF_PROG_TYPE_CGROUP_DEVICE = 15
_BPF_CGROUP_DEVICE = 6
_BPF_F_ALLOW_OVERRIDE = 1
_PROG_NAME = b"podshim_devices"  # 15 bytes and the NUL: what bpftool shows
_LICENSE = b"Apache-2.0"
_LOG_BYTES = 1 << 16


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return _INSN.pack(code, dst | src << 4, off, imm)


@functools.cache
def program(rules: DeviceRules) -> bytes:
    """The instructions of a BPF_PROG_TYPE_CGROUP_DEVICE program that answers as ``rules`` do: 1
    (allowed) when one rule covers the device's type and numbers and every access asked at once (an
    open for reading and writing asks both), else 0 (EPERM). Kept once made: the template makes
    the default rules' (a shim it forks then only loads it)."""
    if rules.allow_all:
        return _insn(_MOV_K, 0, imm=1) + _insn(_EXIT)
    # r2: the device type, r3: the access asked, r4: major, r5: minor (r1, the context, is free after).
    code = [_insn(_LDX_W, 2, 1, _CTX_ACCESS_TYPE), _insn(_AND_K, 2, imm=0xFFFF),
            _insn(_LDX_W, 3, 1, _CTX_ACCESS_TYPE), _insn(_RSH_K, 3, imm=16),
            _insn(_LDX_W, 4, 1, _CTX_MAJOR), _insn(_LDX_W, 5, 1, _CTX_MINOR)]
    for rule in rules.allowed:
        # (code, dst, src, imm, whether it jumps past the block when the rule does not match)
        block: list[tuple[int, int, int, int, bool]] = []
        if rule.kind != "a":
            block.append((_JNE_K, 2, 0, _DEVICE_TYPE[rule.kind], True))
        mask = sum(_ACCESS_BIT[c] for c in rule.access)
        if mask != 7:  # asked & mask must be all that was asked
            block += [(_MOV_X, 1, 3, 0, False), (_AND_K, 1, 0, mask, False), (_JNE_X, 1, 3, 0, True)]
        if rule.major is not None:
            block.append((_JNE_K, 4, 0, rule.major, True))
        if rule.minor is not None:
            block.append((_JNE_K, 5, 0, rule.minor, True))
        block += [(_MOV_K, 0, 0, 1, False), (_EXIT, 0, 0, 0, False)]
        for i, (op, dst, src, imm, jumps) in enumerate(block):
            code.append(_insn(op, dst, src, len(block) - i - 1 if jumps else 0, imm))
    code += [_insn(_MOV_K, 0, imm=0), _insn(_EXIT)]
    return b"".join(code)


#: The programs this process loaded, by rule set: each compiled and verified once, and attached
#: as often as asked (the fds stay open for the process's life).
_loaded: dict[DeviceRules, int] = {}


def _program_fd(rules: DeviceRules) -> int:
    fd = _loaded.get(rules)
    if fd is None:
        fd = _load(program(rules))
        _loaded[rules] = fd
    return fd


def preload(rules: DeviceRules) -> None:
    """Load the v2 program of ``rules`` now, off the path of a start (a spare shim does, while it
    waits for its sandbox); a program the kernel refuses is left for :func:`apply` to report."""
    try:
        _program_fd(rules)
    except OSError:
        pass


def _load(instructions: bytes) -> int:
    insns = ctypes.create_string_buffer(instructions, len(instructions))
    license_ = ctypes.create_string_buffer(_LICENSE)

    def attr(log_buf: ctypes.Array[ctypes.c_char] | None) -> bytes:
        # union bpf_attr for BPF_PROG_LOAD, up to expected_attach_type.
        return struct.pack("<IIQQIIQII16sII", _BPF_PROG_TYPE_CGROUP_DEVICE, len(instructions) // _INSN.size,
                           ctypes.addressof(insns), ctypes.addressof(license_), 1 if log_buf is not None else 0,
                           len(log_buf) if log_buf is not None else 0,
                           ctypes.addressof(log_buf) if log_buf is not None else 0, 0, 0, _PROG_NAME, 0,
                           _BPF_CGROUP_DEVICE)

    try:
        return linux.bpf(_BPF_PROG_LOAD, attr(None))
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EACCES):
            raise
    log_buf = ctypes.create_string_buffer(_LOG_BYTES)  # the verifier's words, asked for only now
    try:
        return linux.bpf(_BPF_PROG_LOAD, attr(log_buf))
    except OSError as exc:
        words = log_buf.value.decode(errors="replace").strip().splitlines()[-3:]
        raise OSError(exc.errno, f"{exc.strerror}: the kernel refused the device program: {' / '.join(words)}") \
            from None


def _attach(directory: str, prog_fd: int) -> None:
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        # union bpf_attr for BPF_PROG_ATTACH: target_fd, attach_bpf_fd, attach_type, attach_flags.
        linux.bpf(_BPF_PROG_ATTACH, struct.pack("<IIII", dir_fd, prog_fd, _BPF_CGROUP_DEVICE, _BPF_F_ALLOW_OVERRIDE))
    finally:
        os.close(dir_fd)


# -- both ---------------------------------------------------------------------------------------

def widen(cgroup: SandboxCgroup, rules: Iterable[DeviceRule]) -> None:
    """Add ``rules`` to what ``cgroup`` (a pod's) allows, so that a cgroup below it may be given
    them: in the v1 devices controller, where a child can never allow what its parent does not. A
    v2 program needs no widening (a child's own program overrides its parent's). Raises as
    :func:`apply`."""
    for key, path in cgroup.paths.items():
        if key != V2 and "devices" in key.split(","):
            for rule in rules:
                _write_v1_line(path, "devices.allow", rule.line())


def apply(cgroup: SandboxCgroup, rules: DeviceRules, inherited: DeviceRules | None = None, *,
          program: bool = True) -> None:
    """Make ``rules`` the device rules of ``cgroup``'s processes, in its v1 devices hierarchy and
    its v2 one, before any process is in it. ``inherited``: the rules its directories already have
    from their parents (those of a task's pod); None when unknown. ``program`` False: no v2
    program, as the OCI runtime that starts the cgroup's process attaches its own there (runc's
    and crun's, ``BPF_F_ALLOW_MULTI``: the kernel refuses it beside one attached with another
    flag); the v1 rules are written still. Raises FailedPrecondition when
    a parent does not allow a rule, or when the v2 program cannot be attached and there is no v1
    controller to hold the rules; the OS error's status for other errors. Logged, not raised: a
    v2 program the kernel refuses where v1's controller holds the rules; one refused with EPERM
    (bpf(2) not allowed to the shim, or a program above that may not be overridden: inside a
    container, its runtime's rules hold); a cgroup with neither hierarchy (inside a container
    whose cgroups are read-only).
    """
    if rules == inherited:
        return
    v1_done = False
    v2_error: OSError | None = None
    v2_path = None
    for key, path in cgroup.paths.items():
        if key == V2:
            if not program:
                continue
            v2_path = path
            if rules.allow_all:
                continue
            try:
                _attach(path, _program_fd(rules))
            except OSError as exc:
                v2_error = exc
        elif "devices" in key.split(","):
            _write_v1(path, rules)
            v1_done = True
    if not v1_done and v2_path is None and program and not rules.allow_all:
        log.warning("cgroup %s has no devices hierarchy: its device rules are not applied", cgroup.name)
    if v2_error is not None:
        why = f"cannot attach the device program to cgroup {v2_path}: {v2_error.strerror}"
        if v1_done:
            log.warning("%s (the cgroup v1 devices controller holds the rules)", why)
        elif v2_error.errno == errno.EPERM:
            # bpf(2) refused to us (inside a container: systemd-nspawn's filter), or a program
            # above that may not be overridden: the rules in force are those of the cgroups above.
            log.warning("%s: the device rules are those of the cgroups above (this shim's container's)", why)
        else:
            raise FailedPrecondition(f"{why}, and there is no cgroup v1 devices controller to hold the rules")
