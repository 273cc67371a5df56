"""RuntimeService's streaming RPCs, Exec, Attach and PortForward: each answers the URL of podshimd's
streaming server (:mod:`client.streaming`) with a one-time token, which the client then upgrades to
SPDY/3.1 and speaks Kubernetes' protocol on. The pod layer checks the pod or container first, so a
bad id is NOT_FOUND here, not an HTTP error later."""

from __future__ import annotations

from typing import Any

from shim.cri.api import api_pb2
from shim.rpc.status import FailedPrecondition, InvalidArgument

from client.streaming.server import AttachRequest, ExecRequest, PortForwardRequest, StreamingServer

from .handlers import Handlers

__all__ = ["Streaming"]


class Streaming(Handlers):
    """Exec, Attach, PortForward."""

    def _server(self) -> StreamingServer:
        assert self.streaming is not None, "podshimd's RuntimeService is made with its streaming server"
        return self.streaming

    async def Exec(self, request: api_pb2.ExecRequest, context: Any) -> api_pb2.ExecResponse:
        cmd = tuple(request.cmd)
        if not cmd or not cmd[0]:
            raise InvalidArgument("cmd must name a program to run")
        if not (request.stdin or request.stdout or request.stderr):
            raise InvalidArgument("one of stdin, stdout and stderr must be requested")
        if request.tty and request.stderr:
            raise InvalidArgument("tty and stderr cannot both be true: a terminal carries stderr with stdout")
        container_id = await self.pods.exec_target(request.container_id)
        return api_pb2.ExecResponse(url=self._server().url(ExecRequest(
            container_id, cmd, request.tty, request.stdin, request.stdout, request.stderr)))

    async def Attach(self, request: api_pb2.AttachRequest, context: Any) -> api_pb2.AttachResponse:
        if not (request.stdin or request.stdout or request.stderr):
            raise InvalidArgument("one of stdin, stdout and stderr must be requested")
        if request.tty and request.stderr:
            raise InvalidArgument("tty and stderr cannot both be true: a terminal carries stderr with stdout")
        target = await self.pods.attach_target(request.container_id)
        if request.stdin and not target["stdin"]:
            raise FailedPrecondition(f"container {target['container_id']} has no stdin to attach to: it was created "
                                     "without stdin, or its stdin was closed (stdin_once)")
        return api_pb2.AttachResponse(url=self._server().url(AttachRequest(
            target["container_id"], request.tty, request.stdin, request.stdout, request.stderr)))

    async def PortForward(self, request: api_pb2.PortForwardRequest, context: Any) -> api_pb2.PortForwardResponse:
        # The ports asked for are checked here; the client names the port again on each connection.
        for port in request.port:
            if not 1 <= port <= 65535:
                raise InvalidArgument(f"port {port} is not a number from 1 to 65535")
        pod_id, _ = await self.pods.pod_network(request.pod_sandbox_id)
        return api_pb2.PortForwardResponse(url=self._server().url(PortForwardRequest(pod_id)))
