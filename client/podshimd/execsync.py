"""RuntimeService's ExecSync (``crictl exec -s``, kubelet's exec probes): a command run to its end
in a running container, its output and exit code. The semantics are the pod layer's
(:meth:`client.cri.pod.PodService.exec_sync`) and the shim's (protocol.md 7.3, Exec)."""

from __future__ import annotations

from typing import Any

from shim.cri.api import api_pb2

from .handlers import Handlers

__all__ = ["SyncExec"]


class SyncExec(Handlers):
    """ExecSync."""

    async def ExecSync(self, request: api_pb2.ExecSyncRequest, context: Any) -> api_pb2.ExecSyncResponse:
        # CRI: the timeout is in seconds, 0 for none; a timeout is DEADLINE_EXCEEDED, as containerd answers.
        result = await self.pods.exec_sync(request.container_id, list(request.cmd), timeout=request.timeout)
        return api_pb2.ExecSyncResponse(stdout=result["stdout"], stderr=result["stderr"],
                                        exit_code=result["exit_code"])
