"""Defaults both sides name: the pause a native pod runs when one is installed, the
capabilities a container gets when its config names none, and the waits of the shim's commands
that containerd's fast path (shim.containerd.fastpath) shares with their full path."""

from __future__ import annotations

__all__ = ["CATATONIT", "DEFAULT_CAPABILITIES", "DELETE_KILL_WAIT_TIMEOUT", "TEMPLATE_SPAWN_TIMEOUT"]

#: The pause of native pods when it is installed (podshimd's default pause_binary); else the built-in one.
CATATONIT = "/usr/bin/catatonit"
#: containerd's default capabilities for a container (Docker's list), in containerd's order.
DEFAULT_CAPABILITIES = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID",
    "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL",
    "CAP_AUDIT_WRITE",
)

#: How long `start` waits for a template's Spawn: the template's own wait for the shim
#: (shim.launch.spawn.START_TIMEOUT, 8 s) and a margin, below the Controller's SPAWN_TIMEOUT (10 s).
TEMPLATE_SPAWN_TIMEOUT = 9.0
#: How long (seconds) ``podshim delete`` waits for a process it killed to disappear.
DELETE_KILL_WAIT_TIMEOUT = 5.0
#: How long (seconds) the shim waits for a client to open the reading end of an output FIFO it was
#: given: containerd's fifo package opens it in a goroutine of its own, so the request may come first.
FIFO_READER_WAIT = 1.0
