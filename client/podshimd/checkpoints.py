"""RuntimeService's CheckpointContainer, CheckpointPod and RestorePod: not supported, each
answered UNIMPLEMENTED with a sentence (kubelet then reports checkpointing as unsupported by the
runtime, as it does for a runtime without CRIU).

Checkpoints would be criu's work (containerd's runc shim runs ``runc checkpoint``, which runs
criu). The sentence says what criu is on this node, as ``criu check`` finds it, asked once per
podshimd: not installed, or failing before it could dump anything (Debian 12's criu 3.17.1 on
Linux 6.18: "vdso: Unexpected rt vDSO area bounds", as it does not expect the ``[vvar_vclock]``
mapping of newer kernels), or working while podshim has no checkpoint code (docs/cri.md).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from typing import Any

from shim.cri.api import api_pb2
from shim.rpc.status import Unimplemented

from client.cri.process import DEFAULT_PATH

from .handlers import Handlers

__all__ = ["CRIU_CHECK_TIMEOUT", "Checkpoints", "criu_state"]

CRIU_CHECK_TIMEOUT = 10.0  # seconds for ``criu check``
_MAX_REASON_CHARS = 300

_state: str | None = None  # criu_state(), once per process


def criu_state(binary: str | None = None) -> str:
    """What criu (``binary``, default: ``criu`` from PATH) is here, in a few words, as ``criu
    check`` finds it: not installed, failing (its first error line), or working."""
    if binary is None:
        binary = shutil.which("criu", path=os.pathsep.join(filter(None, (os.environ.get("PATH"), DEFAULT_PATH))))
        if binary is None:
            return "criu is not installed"
    try:
        done = subprocess.run([binary, "check"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              errors="replace", timeout=CRIU_CHECK_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"{binary} check did not finish within {CRIU_CHECK_TIMEOUT:g} s"
    except OSError as exc:
        return f"{binary} cannot be run: {exc.strerror}"
    if done.returncode == 0:
        return f"{binary} check passes, but podshim has no checkpoint code"
    said = (done.stderr + done.stdout).splitlines()
    first = next((line for line in said if "Error" in line), next((line for line in said if line.strip()), ""))
    reason = first.strip()[:_MAX_REASON_CHARS] or f"exit status {done.returncode}"
    return f"{binary} check fails on Linux {os.uname().release}: {reason}"


async def _why() -> str:
    global _state
    if _state is None:
        _state = await asyncio.to_thread(criu_state)
    return f"podshim cannot checkpoint or restore processes ({_state})"


class Checkpoints(Handlers):
    """CheckpointContainer, CheckpointPod, RestorePod."""

    async def CheckpointContainer(self, request: api_pb2.CheckpointContainerRequest, context: Any) -> Any:
        raise Unimplemented(f"CheckpointContainer is not supported: {await _why()}")

    async def CheckpointPod(self, request: api_pb2.CheckpointPodRequest, context: Any) -> Any:
        raise Unimplemented(f"CheckpointPod is not supported: {await _why()}")

    async def RestorePod(self, request: api_pb2.RestorePodRequest, context: Any) -> Any:
        raise Unimplemented(f"RestorePod is not supported: {await _why()}")
