"""Failpoints: named places where a test can make this process die or freeze, to prove recovery.

Set ``PODSHIM_FAILPOINT=<name>`` in the environment of a process; when it reaches
``failpoint("<name>")`` it kills itself with SIGKILL on the spot, exactly as an OOM kill or a
node agent crash would. With ``PODSHIM_FAILPOINT_ACTION=stop`` it stops itself with SIGSTOP
instead: the whole process freezes there, holding whatever it holds (its pod's lock, a half-made
pod), until it gets SIGCONT. A parent sees the stop with ``waitpid(pid, WUNTRACED)``, so a test
can act while another process is in the middle of an operation without timing anything. Unset,
a failpoint costs one dict lookup.

The names of the pod service's steps are listed in :data:`POD_FAILPOINTS`.
"""

from __future__ import annotations

import os
import signal

__all__ = ["ACTION_ENV", "ACTIONS", "ENV", "POD_FAILPOINTS", "failpoint"]

ENV = "PODSHIM_FAILPOINT"
ACTION_ENV = "PODSHIM_FAILPOINT_ACTION"
#: What a process does at its failpoint: die (the default) or freeze until SIGCONT.
ACTIONS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}

#: Every step boundary of RunPodSandbox, StopPodSandbox and RemovePodSandbox, and CreateContainer's
#: between its root filesystem and its task.
POD_FAILPOINTS = (
    "run:after-record",
    "run:after-create",
    "run:after-start",
    "run:after-network",
    "run:after-ready",
    "create:after-rootfs",
    "stop:after-containers",
    "stop:after-network",
    "stop:after-sandbox",
    "remove:after-stop",
    "remove:after-containers",
    "remove:after-shutdown",
    "remove:after-record",
)


def failpoint(name: str) -> None:
    """Die here (SIGKILL), or freeze (SIGSTOP), when ``PODSHIM_FAILPOINT`` names this point.

    Raises ValueError if ``PODSHIM_FAILPOINT_ACTION`` is not one of :data:`ACTIONS`.
    """
    if os.environ.get(ENV) != name:
        return
    action = os.environ.get(ACTION_ENV) or "kill"
    if action not in ACTIONS:
        raise ValueError(f"{ACTION_ENV}={action!r} is not one of {', '.join(ACTIONS)}")
    os.kill(os.getpid(), ACTIONS[action])
