"""RuntimeService's streaming RPCs, Exec, Attach and PortForward: not served yet.

Each answers UNIMPLEMENTED with a sentence until podshimd has a streaming server (they return the
URL of one, which the client then speaks SPDY or WebSocket to). ExecSync, which needs none, is
``crictl exec -s``.
"""

from __future__ import annotations

from typing import Any

from shim.rpc.status import Unimplemented

from .handlers import Handlers

__all__ = ["Streaming"]

_WHY = "podshimd has no streaming server yet"


class Streaming(Handlers):
    """Exec, Attach, PortForward: UNIMPLEMENTED, saying what works instead."""

    async def Exec(self, request: Any, context: Any) -> Any:
        raise Unimplemented(f"{_WHY}, so interactive exec is not available: run a command to completion "
                            "with ExecSync (crictl exec -s)")

    async def Attach(self, request: Any, context: Any) -> Any:
        raise Unimplemented(f"{_WHY}, so attach is not available: read the container's output with "
                            "crictl logs")

    async def PortForward(self, request: Any, context: Any) -> Any:
        raise Unimplemented(f"{_WHY}, so port forwarding is not available")
