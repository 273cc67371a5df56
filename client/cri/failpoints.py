"""Failpoints: named places where a test can make this process die, to prove recovery.

Set ``PODSHIM_FAILPOINT=<name>`` in the environment of a process; when it reaches
``failpoint("<name>")`` it kills itself with SIGKILL on the spot, exactly as an OOM kill or a
node agent crash would. Unset, a failpoint costs one dict lookup.

The names of the pod service's steps are listed in :data:`POD_FAILPOINTS`.
"""

from __future__ import annotations

import os
import signal

__all__ = ["ENV", "POD_FAILPOINTS", "failpoint"]

ENV = "PODSHIM_FAILPOINT"

#: Every step boundary of RunPodSandbox, StopPodSandbox and RemovePodSandbox.
POD_FAILPOINTS = (
    "run:after-record",
    "run:after-create",
    "run:after-start",
    "run:after-network",
    "run:after-ready",
    "stop:after-containers",
    "stop:after-network",
    "stop:after-sandbox",
    "remove:after-stop",
    "remove:after-containers",
    "remove:after-shutdown",
    "remove:after-record",
)


def failpoint(name: str) -> None:
    """Die here (SIGKILL) when ``PODSHIM_FAILPOINT`` names this point."""
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
