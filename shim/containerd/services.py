"""containerd's services on the shim: ``containerd.runtime.sandbox.v1.Sandbox`` and
``containerd.task.v3.Task`` (protocol.md 11), translated onto the shim's own handlers
(:class:`shim.sandbox.service.SandboxService`, :class:`shim.sandbox.task_service.TaskService`),
which hold every rule. What the shim cannot do for containerd is refused with a status and a
sentence, never answered as if done.

containerd's CRI decides the pod's network namespace (``netns_path``) and hands the pod's
PodSandboxConfig in CreateSandbox's ``options``; the shim makes of it the options podshimd's pod
layer would give (shim.cri.configs, the CRI layer both share), so a pod is the same whichever of the two drives it.
containerd's CRI leaves a pod's hosts, resolv.conf and hostname to the sandbox controller when
it is not its own (it mounts them only where its podsandbox controller wrote them): the shim
writes them from the PodSandboxConfig into its bundle (:func:`pod_files`) as containerd's
podsandbox controller would, and binds them into every container that mounts nothing there.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from google.protobuf import any_pb2, message_factory
from google.protobuf.message import DecodeError, Message
from google.protobuf.timestamp_pb2 import Timestamp

from shim.api.handlers import NATIVE
from shim.containerd.api import load
from shim.rpc.server import CallContext, Server
from shim.rpc.status import FailedPrecondition, Internal, InvalidArgument, Unimplemented

if TYPE_CHECKING:
    from shim.containerd.events import Publisher
    from shim.cri.configs import PodSandboxConfig
    from shim.lib.podfiles import PodFiles
    from shim.sandbox.service import SandboxService
    from shim.sandbox.task_service import TaskService

__all__ = ["SANDBOX_SERVICE", "TASK_SERVICE", "POD_SANDBOX_CONFIG_TYPE", "POD_FILES_DIR", "pod_files",
           "register_containerd", "timestamp", "nanos", "sandbox_pb2", "task_pb2"]

sandbox_pb2 = load("runtime.sandbox.v1.sandbox_pb2")
task_pb2 = load("runtime.task.v3.shim_pb2")
platform_pb2 = load("types.platform_pb2")
metrics_pb2 = load("types.metrics_pb2")

SANDBOX_SERVICE = "containerd.runtime.sandbox.v1.Sandbox"
TASK_SERVICE = "containerd.task.v3.Task"
#: The type of CreateSandbox's ``options`` that containerd's CRI gives: the pod's config.
POD_SANDBOX_CONFIG_TYPE = "runtime.v1.PodSandboxConfig"
#: The pod's hosts, resolv.conf and hostname files, in the shim's bundle.
POD_FILES_DIR = "etc"
#: SandboxStatus's states, as CRI's PodSandboxState names them (containerd reads them so).
READY, NOT_READY = "SANDBOX_READY", "SANDBOX_NOTREADY"

Handler = Callable[[CallContext, Any], Awaitable[Message]]


def timestamp(ns: int) -> Timestamp | None:
    """A protobuf Timestamp of ``ns`` nanoseconds since the epoch; None (unset) for 0."""
    return Timestamp(seconds=ns // 1_000_000_000, nanos=ns % 1_000_000_000) if ns else None


def nanos(ts: Timestamp) -> int:
    total: int = ts.seconds * 1_000_000_000 + ts.nanos
    return total


def _serve(server: Server, service_name: str, module: Any, handlers: dict[str, Handler]) -> None:
    """Register ``handlers`` (by method name) as the protobuf service ``service_name`` of the
    generated ``module``: each is given the parsed request message and returns the response
    message; a method without a handler is refused with UNIMPLEMENTED and a sentence."""
    unary = {name: _method(service_name, name, request_type, handlers.get(name))
             for name, request_type in _request_types(service_name, module)}
    unknown = set(handlers) - set(unary)
    if unknown:
        raise ValueError(f"{service_name} has no methods {sorted(unknown)}")
    server.register(service_name, unary, protobuf=True)


#: Each service's methods and their request classes, by service name: made once, by the shim template
#: (:func:`warm`), so that the descriptors protobuf makes the first time they are asked for are the
#: template's, shared by the shims forked from it, and not made again in each.
_REQUEST_TYPES: dict[str, list[tuple[str, type[Message]]]] = {}


def _request_types(service_name: str, module: Any) -> list[tuple[str, type[Message]]]:
    if service_name not in _REQUEST_TYPES:
        service = module.DESCRIPTOR.services_by_name[service_name.rsplit(".", 1)[1]]
        _REQUEST_TYPES[service_name] = [(method.name, message_factory.GetMessageClass(method.input_type))
                                        for method in service.methods]
    return _REQUEST_TYPES[service_name]


def _method(service: str, name: str, request_type: type[Message], handler: Handler | None) -> Any:
    async def call(ctx: CallContext, payload: bytes) -> bytes:
        if handler is None:
            raise Unimplemented(f"/{service}/{name} is not supported by podshim's shim")
        try:
            request = request_type.FromString(payload)
        except DecodeError as exc:
            raise InvalidArgument(f"the {request_type.DESCRIPTOR.full_name} of /{service}/{name} is not valid "
                                  f"protobuf: {exc}") from None
        response = await handler(ctx, request)
        encoded: bytes = response.SerializeToString()
        return encoded

    return call


def pod_config(options: Any) -> PodSandboxConfig | None:
    """CreateSandbox's ``options`` (an Any): the PodSandboxConfig containerd's CRI gives, or None
    when there are none; anything else is refused."""
    if not options.type_url:
        return None
    if options.type_url.rsplit("/", 1)[-1] != POD_SANDBOX_CONFIG_TYPE:
        raise InvalidArgument(f"CreateSandbox options of type {options.type_url!r} are not understood: podshim's "
                              f"shim takes containerd CRI's {POD_SANDBOX_CONFIG_TYPE}")
    # The shared CRI layer's translation, loaded only here: a shim that never creates a pod for containerd
    # does not pay for CRI's schema.
    from shim.cri.api import api_pb2
    from shim.cri.requests import pod_sandbox_config

    try:
        config = api_pb2.PodSandboxConfig.FromString(options.value)
    except DecodeError as exc:
        raise InvalidArgument(f"CreateSandbox options are not a valid {POD_SANDBOX_CONFIG_TYPE}: {exc}") from None
    return pod_sandbox_config(api_pb2.RunPodSandboxRequest(config=config))


def pod_options(cfg: PodSandboxConfig | None) -> dict[str, Any]:
    """The shim's sandbox options (protocol.md 7.4) of a pod's config (:func:`pod_config`)."""
    if cfg is None:
        return {"runtime_handler": NATIVE}
    from shim.cri import security

    pause = security.pause_fields(cfg.security)  # refuses what cannot be honoured (AppArmor, ...)
    result = {**cfg.to_shim_options(), "runtime_handler": NATIVE}
    result["linux"] = {**result["linux"], "pause_process": pause}
    return result


def pod_files(bundle: str) -> PodFiles:
    """Where the pod's hosts, resolv.conf and hostname are in the shim's ``bundle``."""
    from shim.lib.podfiles import PodFiles

    return PodFiles(os.path.join(bundle, POD_FILES_DIR))


class SandboxV1:
    """``containerd.runtime.sandbox.v1.Sandbox`` on the shim's SandboxService."""

    def __init__(self, service: SandboxService):
        self.service = service

    async def create(self, ctx: CallContext, r: Any) -> Message:
        if r.rootfs:
            raise InvalidArgument("CreateSandbox with a rootfs (a sandbox image's snapshot) is not supported by "
                                  "podshim's shim for containerd: its pause is its own")
        cfg = pod_config(r.options)
        payload: dict[str, Any] = {"sandbox_id": r.sandbox_id, "options": pod_options(cfg),
                                   "annotations": dict(r.annotations)}
        if r.netns_path:
            payload["netns_path"] = r.netns_path
        await self.service.create(ctx, payload)
        if cfg is not None:
            from shim.lib.podfiles import write_pod_files

            try:  # containerd's CRI copies the node's hosts for every pod: so do we
                write_pod_files(pod_files(self.service.sandbox.config.bundle).directory, cfg, node_hosts=True)
            except OSError as exc:
                raise Internal(f"cannot write the pod's hosts, resolv.conf and hostname files: {exc}") from None
        return sandbox_pb2.CreateSandboxResponse()

    async def start(self, ctx: CallContext, r: Any) -> Message:
        result = await self.service.start(ctx, {"sandbox_id": r.sandbox_id})
        return sandbox_pb2.StartSandboxResponse(pid=result["pid"], created_at=timestamp(result["created_at"]))

    async def platform(self, ctx: CallContext, r: Any) -> Message:
        platform = (await self.service.platform(ctx, {"sandbox_id": r.sandbox_id}))["platform"]
        return sandbox_pb2.PlatformResponse(platform=platform_pb2.Platform(**platform))

    async def stop(self, ctx: CallContext, r: Any) -> Message:
        # containerd's CRI gives no timeout (0): its containers were killed already, and the pause
        # is killed at once, as the shim's timeout 0 does.
        await self.service.stop(ctx, {"sandbox_id": r.sandbox_id, "timeout_secs": r.timeout_secs})
        return sandbox_pb2.StopSandboxResponse()

    async def wait(self, ctx: CallContext, r: Any) -> Message:
        result = await self.service.wait(ctx, {"sandbox_id": r.sandbox_id})
        return sandbox_pb2.WaitSandboxResponse(exit_status=result["exit_status"],
                                               exited_at=timestamp(result["exited_at"]))

    async def status(self, ctx: CallContext, r: Any) -> Message:
        status = await self.service.status(ctx, {"sandbox_id": r.sandbox_id, "verbose": r.verbose})
        return sandbox_pb2.SandboxStatusResponse(
            sandbox_id=status["sandbox_id"], pid=status["pid"],
            state=READY if status["state"] == "running" else NOT_READY,
            info={k: str(v) for k, v in status["info"].items()},
            created_at=timestamp(status["created_at"]), exited_at=timestamp(status["exited_at"]))

    async def ping(self, ctx: CallContext, r: Any) -> Message:
        await self.service.ping(ctx, {"sandbox_id": r.sandbox_id})
        return sandbox_pb2.PingResponse()

    async def shutdown(self, ctx: CallContext, r: Any) -> Message:
        await self.service.shutdown(ctx, {"sandbox_id": r.sandbox_id})
        return sandbox_pb2.ShutdownSandboxResponse()

    async def metrics(self, ctx: CallContext, r: Any) -> Message:
        from shim.containerd.metrics import cgroup_metrics  # (the cgroups schema, only when asked)

        sandbox = self.service.sandbox
        sandbox.check_id(r.sandbox_id)
        if sandbox.cgroup is None:
            raise FailedPrecondition(f"sandbox {r.sandbox_id} has no cgroup: it was never started, or it stopped")
        return sandbox_pb2.SandboxMetricsResponse(metrics=metrics_pb2.Metric(
            timestamp=timestamp(time.time_ns()), id=r.sandbox_id, data=cgroup_metrics(sandbox.cgroup)))


def warm() -> None:
    """Run what a pod's CreateSandbox, StartSandbox and SandboxStatus run of this module and the pod
    layer, without a pod: in a shim template (shim.launch.template) before it forks, so what
    their first run makes and keeps (protobuf's lazily made descriptors and message classes' state,
    the pod layer's caches and compiled patterns) is made once and shared by every shim forked
    after, instead of written into each shim's own pages."""
    from shim.cri.api import api_pb2

    _request_types(SANDBOX_SERVICE, sandbox_pb2)
    _request_types(TASK_SERVICE, task_pb2)
    config = api_pb2.PodSandboxConfig(
        metadata=api_pb2.PodSandboxMetadata(name="warm", namespace="default", uid="warm", attempt=0),
        hostname="warm", log_directory="/var/log/pods/warm", labels={"app": "warm"},
        annotations={"warm": "warm"}, dns_config=api_pb2.DNSConfig(servers=["10.0.0.10"], searches=["svc"]),
        linux=api_pb2.LinuxPodSandboxConfig(security_context=api_pb2.LinuxSandboxSecurityContext(
            namespace_options=api_pb2.NamespaceOption(network=api_pb2.POD, pid=api_pb2.CONTAINER))))
    request = sandbox_pb2.CreateSandboxRequest(
        sandbox_id="warm", netns_path="/var/run/netns/warm", annotations={"warm": "warm"},
        options=any_pb2.Any(type_url=f"type.googleapis.com/{POD_SANDBOX_CONFIG_TYPE}", value=config.SerializeToString()))
    request = sandbox_pb2.CreateSandboxRequest.FromString(request.SerializeToString())
    cfg = pod_config(request.options)
    assert cfg is not None  # (options given)
    pod_options(cfg)
    from shim.lib.podfiles import write_pod_files

    with tempfile.TemporaryDirectory(prefix="podshim-warm-") as directory:
        write_pod_files(pod_files(directory).directory, cfg, node_hosts=True)
    now = timestamp(time.time_ns())
    for response in (sandbox_pb2.CreateSandboxResponse(), sandbox_pb2.StartSandboxResponse(pid=1, created_at=now),
                     sandbox_pb2.SandboxStatusResponse(sandbox_id="warm", pid=1, state=READY, info={"warm": "warm"},
                                                       created_at=now, exited_at=now),
                     sandbox_pb2.WaitSandboxResponse(exit_status=0, exited_at=now)):
        response.SerializeToString()


def register_containerd(server: Server, service: SandboxService, tasks: TaskService) -> Publisher:
    """Serve containerd's Sandbox and Task v3 services on ``server`` (protobuf connections);
    returns the publisher of their events, for the shim to close as it exits."""
    sandbox = SandboxV1(service)
    _serve(server, SANDBOX_SERVICE, sandbox_pb2, {
        "CreateSandbox": sandbox.create, "StartSandbox": sandbox.start, "Platform": sandbox.platform,
        "StopSandbox": sandbox.stop, "WaitSandbox": sandbox.wait, "SandboxStatus": sandbox.status,
        "PingSandbox": sandbox.ping, "ShutdownSandbox": sandbox.shutdown, "SandboxMetrics": sandbox.metrics,
    })
    from shim.containerd.events import Publisher  # (they use this module's helpers)
    from shim.containerd.tasks import TaskV3

    config = service.sandbox.config
    assert config.containerd_address is not None  # (a shim containerd started)
    events = Publisher(config.containerd_address, config.namespace)
    events.follow(service.events)
    task = TaskV3(service, tasks, events)
    _serve(server, TASK_SERVICE, task_pb2, {
        "Create": task.create, "Start": task.start, "Delete": task.delete, "Pids": task.pids, "Kill": task.kill,
        "Exec": task.exec, "ResizePty": task.resize_pty, "CloseIO": task.close_io, "State": task.state,
        "Wait": task.wait, "Connect": task.connect, "Shutdown": task.shutdown, "Update": task.update,
        "Stats": task.stats, "Pause": task.unsupported, "Resume": task.unsupported,
        "Checkpoint": task.unsupported,
    })
    return events
