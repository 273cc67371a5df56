"""Linux capabilities by name: each one's number (<linux/capability.h>), a set of names as a bit
mask and back, and a process's sets as /proc shows them. The shim confines its tasks with them
(:mod:`shim.kernel.capabilities` sets them); the pod layer checks and reports a container's.
"""

from __future__ import annotations

from shim.lib.processes import status_mask

__all__ = ["CAPABILITIES", "current", "mask", "names"]

#: <linux/capability.h>: every capability's name and number.
CAPABILITIES: dict[str, int] = {f"CAP_{name}": number for number, name in enumerate((
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
    "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER",
    "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
    "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP",
    "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF",
    "CHECKPOINT_RESTORE",
))}


def current(field: str = "CapEff", pid: int | str = "self") -> int:
    """A capability set of a process as a bit mask: ``field`` of /proc/PID/status (CapEff, CapPrm,
    CapBnd, CapInh, CapAmb)."""
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
