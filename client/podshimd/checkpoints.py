"""RuntimeService's CheckpointContainer, CheckpointPod and RestorePod: not supported yet, each
answered UNIMPLEMENTED with a sentence (kubelet then reports checkpointing as unsupported by the
runtime, as it does for a runtime without CRIU)."""

from __future__ import annotations

from typing import Any

from client.criapi import api_pb2
from shim.rpc.status import Unimplemented

from .handlers import Handlers

__all__ = ["Checkpoints"]

_WHY = "podshim cannot checkpoint or restore processes yet (no CRIU support in any runtime handler)"


class Checkpoints(Handlers):
    """CheckpointContainer, CheckpointPod, RestorePod."""

    async def CheckpointContainer(self, request: api_pb2.CheckpointContainerRequest, context: Any) -> Any:
        raise Unimplemented(f"CheckpointContainer is not supported: {_WHY}")

    async def CheckpointPod(self, request: api_pb2.CheckpointPodRequest, context: Any) -> Any:
        raise Unimplemented(f"CheckpointPod is not supported: {_WHY}")

    async def RestorePod(self, request: api_pb2.RestorePodRequest, context: Any) -> Any:
        raise Unimplemented(f"RestorePod is not supported: {_WHY}")
