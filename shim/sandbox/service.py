"""The shim's RPC handlers. They translate: payload fields in, Sandbox calls, payload out.

Nothing here decides policy; the rules live in :mod:`shim.sandbox.sandbox`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from shim.api.identifiers import validate_identifier
from shim.api.names import EVENTS_SERVICE, SANDBOX_SERVICE
from shim.rpc.messages import optional, require
from shim.rpc.server import CallContext, Server, ServerStream
from shim.rpc.status import InvalidArgument, NotFound
from shim.sandbox.events import EventBus
from shim.sandbox.sandbox import Sandbox

__all__ = ["SandboxService", "register", "request_sandbox_id"]


def request_sandbox_id(ctx: CallContext, payload: dict[str, Any], sandbox: Sandbox) -> str:
    """The call's ``sandbox_id``, checked as an identifier; NotFound when the call is for another
    namespace than the shim's (another id is refused by the sandbox itself)."""
    sandbox_id = validate_identifier("sandbox_id", require(payload, "sandbox_id", str))
    ns = ctx.namespace
    if ns is not None and ns != sandbox.config.namespace:
        raise NotFound(f"sandbox {sandbox_id} not found in namespace {ns!r}")
    return sandbox_id


class SandboxService:
    """Handlers of ``podshim.sandbox.v1.Sandbox`` and ``podshim.events.v1.Events``."""

    def __init__(self, sandbox: Sandbox, events: EventBus, on_shutdown: Callable[[], None]):
        self.sandbox = sandbox
        self.events = events
        self.on_shutdown = on_shutdown

    def _sandbox_id(self, ctx: CallContext, payload: dict[str, Any]) -> str:
        return request_sandbox_id(ctx, payload, self.sandbox)

    async def create(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        from shim.lib.rootfs import parse_rootfs  # with the runtime's code, at CreateSandbox (issue #15)

        sid = self._sandbox_id(ctx, p)
        bundle = optional(p, "bundle_path", str)
        ours = self.sandbox.config.bundle
        # The same path as written (no syscall) or, when not, as resolved (a stat per component).
        if bundle and os.path.normpath(bundle) != os.path.normpath(ours) and os.path.realpath(bundle) != os.path.realpath(ours):
            raise InvalidArgument(f"bundle_path {bundle!r} is not this shim's bundle {ours!r}")
        rootfs = parse_rootfs(p)
        annotations = optional(p, "annotations", dict, {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()):
            raise InvalidArgument("field 'annotations' must map strings to strings")
        await self.sandbox.create(sid, options=optional(p, "options", dict),
                                  netns_path=optional(p, "netns_path", str) or None, annotations=annotations,
                                  rootfs=rootfs)
        return {}

    async def start(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        result = await self.sandbox.start(self._sandbox_id(ctx, p))
        return {"pid": result.pid, "created_at": result.created_at}

    async def platform(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        return {"platform": self.sandbox.platform(self._sandbox_id(ctx, p))}

    async def stop(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        sid = self._sandbox_id(ctx, p)
        timeout = optional(p, "timeout_secs", int)
        if timeout is not None and timeout < 0:
            raise InvalidArgument("field 'timeout_secs' must not be negative")
        await self.sandbox.stop(sid, None if timeout is None else float(timeout))
        return {}

    async def wait(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        result = await self.sandbox.wait(self._sandbox_id(ctx, p))
        return {"exit_status": result.exit_status, "exited_at": result.exited_at}

    async def status(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        sid = self._sandbox_id(ctx, p)
        return self.sandbox.status(sid, verbose=optional(p, "verbose", bool, False))

    async def ping(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        self.sandbox.check_id(self._sandbox_id(ctx, p))
        return {}

    async def shutdown(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        await self.sandbox.shutdown(self._sandbox_id(ctx, p))
        ctx.after_response(self.on_shutdown)
        return {}

    async def metrics(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        return {"metrics": self.sandbox.metrics(self._sandbox_id(ctx, p), details=optional(p, "details", bool, False))}

    async def update(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        await self.sandbox.update(self._sandbox_id(ctx, p), p.get("resources"))  # checked after the sandbox's state
        return {}

    async def subscribe(self, ctx: CallContext, p: dict[str, Any], stream: ServerStream) -> None:
        """Events/Subscribe: every event from now on, until the client goes away."""
        sub = self.events.subscribe()
        try:
            while True:
                await stream.send(await sub.get())
        finally:
            sub.close()


def register(server: Server, service: SandboxService) -> None:
    """Add the Sandbox and Events services to ``server``."""
    server.register(SANDBOX_SERVICE, {
        "CreateSandbox": service.create,
        "StartSandbox": service.start,
        "Platform": service.platform,
        "StopSandbox": service.stop,
        "WaitSandbox": service.wait,
        "SandboxStatus": service.status,
        "PingSandbox": service.ping,
        "ShutdownSandbox": service.shutdown,
        "SandboxMetrics": service.metrics,
        "UpdateSandbox": service.update,
    })
    server.register(EVENTS_SERVICE, streams={"Subscribe": service.subscribe})
