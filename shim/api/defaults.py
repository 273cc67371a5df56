"""Defaults both sides name: the pause a native pod runs when one is installed, and the
capabilities a container gets when its config names none."""

from __future__ import annotations

__all__ = ["CATATONIT", "DEFAULT_CAPABILITIES"]

#: The pause of native pods when it is installed (podshimd's default pause_binary); else the built-in one.
CATATONIT = "/usr/bin/catatonit"
#: containerd's default capabilities for a container (Docker's list), in containerd's order.
DEFAULT_CAPABILITIES = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID",
    "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL",
    "CAP_AUDIT_WRITE",
)
