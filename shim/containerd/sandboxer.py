"""podshim's sandbox controller for containerd's proxy-plugin route: what containerd's ``shim``
sandboxer does for a pod (start the shim, call its Sandbox service, delete it once it is gone),
done inside one long-lived process instead of by a ``containerd-shim-podshim-v1 start`` and
``delete`` per pod.

containerd (``[proxy_plugins.NAME] type = "sandbox"``, a runtime handler with ``sandboxer = "NAME"``)
sends every pod's Controller calls here (:mod:`shim.containerd.proxy` serves them over gRPC). For
each pod a :class:`Sandboxer`:

- Create: makes the pod's bundle ``STATE_ROOT/<namespace>/<sandbox id>``, has the shim forked by
  the runtime root's template (else started by ``podshim start``: never forked by the sandboxer,
  whose gRPC threads make a fork unsafe),
  then calls the shim's ``containerd.runtime.sandbox.v1.Sandbox/CreateSandbox`` with containerd's
  request (the PodSandboxConfig, the netns): the shim holds every rule (shim.containerd.services);
- Start: StartSandbox, and answers with the shim's ``ttrpc+unix://`` address and version 3, so
  containerd sends its containers' Task v3 calls straight to the shim;
- Platform, Stop, Wait, Status, Metrics: the shim's own answers;
- Shutdown: ShutdownSandbox (the shim exits by itself), then what ``delete`` does
  (:func:`shim.cleanup.delete_sandbox`: whatever is left is killed and removed), then the bundle;
- Update (UpdatePodSandboxResources): refused with UNIMPLEMENTED, which containerd tolerates.

Nothing is kept in memory that a restart would lose: a pod's bundle, its shim's state.json and
its shim's socket (named by namespace and id, shim.api.paths) are the record, so a restarted
sandboxer answers for pods made before it. A shim that died is found when its socket refuses:
Wait and Status then answer with the exit :func:`shim.cleanup.delete_sandbox` reports after it
removed what the shim left (Wait must not answer UNAVAILABLE for a dead pod: containerd retries
that forever, taking it for the sandboxer restarting).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf.message import Message

from shim.api.defaults import TEMPLATE_SPAWN_TIMEOUT
from shim.api.identifiers import validate_identifier
from shim.api.names import TEMPLATE_SERVICE, TEMPLATE_SOCKET, UNKNOWN_EXIT_STATUS
from shim.api.paths import socket_address, socket_path
from shim.containerd.api import load
from shim.containerd.services import NOT_READY, SANDBOX_SERVICE, timestamp
from shim.rpc.client import Client
from shim.rpc.codecs import PROTOBUF
from shim.rpc.status import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    RpcError,
    Unavailable,
    Unimplemented,
)

__all__ = ["Sandboxer", "SandboxerConfig", "TASK_API_VERSION", "controller_pb2"]

log = logging.getLogger(__name__)

controller_pb2 = load("services.sandbox.v1.sandbox_pb2")
sandbox_pb2 = load("runtime.sandbox.v1.sandbox_pb2")
#: The Task API version containerd is told the shim serves (Task v3 on the same socket).
TASK_API_VERSION = 3
#: Seconds to connect to a pod's shim: a live shim accepts at once.
SHIM_CONNECT_TIMEOUT = 5.0
#: Seconds a helper command (``podshim template --detach``, ``podshim start``) may take: a shim's
#: start (shim.launch.spawn.START_TIMEOUT, 8 s) and a Python start-up, with a margin.
HELPER_TIMEOUT = 15.0
#: The gRPC metadata containerd puts its namespace in (pkg/namespaces/grpc.go: GRPCHeader).
NAMESPACE_HEADER = "containerd-namespace"

M = TypeVar("M", bound=Message)


@dataclass(frozen=True)
class SandboxerConfig:
    """Where the sandboxer keeps its pods and where their shims live."""

    #: The pods' bundles: ``STATE_ROOT/<namespace>/<sandbox id>``.
    state_root: str
    #: podshim's runtime root: the shims' sockets and the template's.
    runtime_root: str
    #: containerd's ttrpc address, which the shims publish their events to.
    containerd_address: str
    pause_binary: str | None = None
    use_template: bool = True
    debug: bool = False


class Sandboxer:
    """containerd's ``sandbox.Controller`` for podshim's shims; see the module docstring. Each
    method takes the namespace containerd's call carries and the parsed request; it raises an
    RpcError with a sentence for what it refuses."""

    def __init__(self, config: SandboxerConfig):
        for name in ("state_root", "runtime_root"):
            if not os.path.isabs(getattr(config, name)):
                raise InvalidArgument(f"the {name.replace('_', ' ')} {getattr(config, name)!r} must be an absolute path")
        if not config.containerd_address:
            raise InvalidArgument("containerd's ttrpc address is needed: the shims publish their events to it")
        self.config = config
        self._clients: dict[tuple[str, str], Client] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._template: Client | None = None

    # -- where a pod is ------------------------------------------------------------------------

    def bundle(self, namespace: str, sandbox_id: str) -> str:
        validate_identifier("namespace", namespace)
        validate_identifier("sandbox id", sandbox_id)
        return os.path.join(self.config.state_root, namespace, sandbox_id)

    def address(self, namespace: str, sandbox_id: str) -> str:
        """The address containerd dials for the pod's tasks: ``ttrpc+unix://<the shim's socket>``."""
        return "ttrpc+" + socket_address(socket_path(namespace, sandbox_id, self.config.runtime_root))

    def _lock(self, namespace: str, sandbox_id: str) -> asyncio.Lock:
        return self._locks.setdefault((namespace, sandbox_id), asyncio.Lock())

    def _known(self, namespace: str, sandbox_id: str) -> str:
        bundle = self.bundle(namespace, sandbox_id)
        if not os.path.isdir(bundle):
            raise NotFound(f"sandbox {sandbox_id!r} in namespace {namespace!r} is not one of podshim-sandboxer's "
                           f"(no {bundle})")
        return bundle

    async def _shim(self, namespace: str, sandbox_id: str) -> Client:
        """A connection to the pod's live shim; NotFound for an unknown pod, Unavailable when
        its shim does not accept."""
        self._known(namespace, sandbox_id)
        key = (namespace, sandbox_id)
        client = self._clients.get(key)
        if client is None or client.closed:
            client = await Client.connect(socket_address(socket_path(namespace, sandbox_id, self.config.runtime_root)),
                                          timeout=SHIM_CONNECT_TIMEOUT, namespace=namespace, codec=PROTOBUF)
            self._clients[key] = client
        return client

    async def _call(self, namespace: str, sandbox_id: str, method: str, request: Message, reply: type[M]) -> M:
        client = await self._shim(namespace, sandbox_id)
        data = await client.call(SANDBOX_SERVICE, method, request.SerializeToString(),
                                 metadata={NAMESPACE_HEADER: [namespace]})
        answer: M = reply.FromString(data)
        return answer

    async def _forget(self, namespace: str, sandbox_id: str) -> None:
        client = self._clients.pop((namespace, sandbox_id), None)
        if client is not None:
            await client.aclose()

    async def _reap(self, namespace: str, sandbox_id: str) -> dict[str, int]:
        """What ``delete`` does for a pod whose shim is gone (or was shut down): kill and remove
        whatever it left; the pause's exit ``{"pid", "exit_status", "exited_at"}``."""
        await self._forget(namespace, sandbox_id)
        ours = self.bundle(namespace, sandbox_id)
        if not os.path.exists(os.path.join(ours, "state.json")):  # the shim never wrote its record
            return {"pid": 0, "exit_status": UNKNOWN_EXIT_STATUS, "exited_at": time.time_ns()}
        return await asyncio.to_thread(self._delete, ours, namespace, sandbox_id)

    def _delete(self, bundle: str, namespace: str, sandbox_id: str) -> dict[str, int]:
        # After a clean ShutdownSandbox (the common case) delete's fast path does it all, as for
        # the shim route's `delete`; anything else takes the full path.
        from shim.containerd.fastpath import delete_clean

        ended = delete_clean(namespace, sandbox_id, bundle)
        if ended is not None:
            return dict(zip(("pid", "exit_status", "exited_at"), ended, strict=True))
        from shim.cleanup import delete_sandbox

        return delete_sandbox(bundle, namespace, sandbox_id, self.config.runtime_root)

    # -- the shims ------------------------------------------------------------------------------

    async def open(self) -> None:
        """Make sure a shim template serves the runtime root (``podshim template --detach``) and
        hold a connection to it, so that it stays while the sandboxer runs; without one, each
        shim is started by ``podshim start`` (logged). Never raises."""
        if self.config.use_template:
            await self._ensure_template()

    async def _ensure_template(self) -> bool:
        """Start the runtime root's template unless one runs, and become its user (a Ping: it
        stays while we run); False, logged, when none can be had."""
        if self._template is not None:
            await self._template.aclose()
            self._template = None
        argv = self._podshim("template", "--detach", "--runtime-root", self.config.runtime_root)
        if self.config.pause_binary:
            argv += ["--pause-binary", self.config.pause_binary]
        try:
            await self._run(argv, "template --detach")
            template = await Client.connect(self._template_address(), timeout=SHIM_CONNECT_TIMEOUT)
            await template.call(TEMPLATE_SERVICE, "Ping", {}, timeout=SHIM_CONNECT_TIMEOUT)
        except RpcError as exc:
            log.warning("no shim template for %s (%s): each pod's shim is started by podshim start instead",
                        self.config.runtime_root, exc.message)
            return False
        self._template = template
        return True

    def _template_address(self) -> str:
        return socket_address(os.path.join(self.config.runtime_root, TEMPLATE_SOCKET))

    def _podshim(self, *args: str) -> list[str]:
        from shim.lib.program import podshim_argv

        return [*podshim_argv(), *args]

    async def _run(self, argv: list[str], what: str) -> None:
        """Run a podshim helper command to its end; Unavailable with its stderr when it fails.
        Never forked from this process as it is: a gRPC server's threads make fork unsafe."""
        try:
            process = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                           stdout=asyncio.subprocess.DEVNULL,
                                                           stderr=asyncio.subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            raise Unavailable(f"cannot run podshim {what}: {exc.strerror or exc}") from None
        try:
            # Shielded: a helper cut short between its fork and the shim's first record would leave
            # a shim nothing records.
            _, stderr = await asyncio.shield(asyncio.wait_for(process.communicate(), HELPER_TIMEOUT))
        except TimeoutError:
            process.kill()
            await process.wait()
            raise Unavailable(f"podshim {what} did not finish within {HELPER_TIMEOUT:.0f} s") from None
        if process.returncode:
            said = stderr.decode(errors="replace").strip()[-1000:]
            raise Unavailable(f"podshim {what} failed with exit status {process.returncode}: {said}")

    async def _spawn(self, namespace: str, sandbox_id: str, bundle: str) -> None:
        """The pod's shim, serving containerd's services: forked by the template (started again
        once if it is gone or leaving), else started by ``podshim start``."""
        payload: dict[str, Any] = {"namespace": namespace, "sandbox_id": sandbox_id, "bundle": bundle,
                                   "runtime_root": self.config.runtime_root, "debug": self.config.debug,
                                   "containerd_address": self.config.containerd_address}
        if self.config.pause_binary:
            payload["pause_binary"] = self.config.pause_binary
        for attempt in range(2 if self.config.use_template else 0):
            try:
                async with await Client.connect(self._template_address(), timeout=SHIM_CONNECT_TIMEOUT) as template:
                    # Shielded: a Spawn cut short could leave a shim nothing records.
                    await asyncio.shield(template.call(TEMPLATE_SERVICE, "Spawn", payload,
                                                       timeout=TEMPLATE_SPAWN_TIMEOUT))
                return
            except (Unavailable, FailedPrecondition) as exc:  # none there, or it is leaving (code out of date)
                log.info("the shim template did not spawn %s/%s (%s)", namespace, sandbox_id, exc.message)
                if attempt or not await self._ensure_template():
                    break
        argv = self._podshim("start", "--namespace", namespace, "--id", sandbox_id, "--bundle", bundle,
                             "--runtime-root", self.config.runtime_root, "--no-template",
                             "--containerd-address", self.config.containerd_address)
        if self.config.pause_binary:
            argv += ["--pause-binary", self.config.pause_binary]
        if self.config.debug:
            argv.append("--debug")
        await self._run(argv, f"start for {namespace}/{sandbox_id}")

    async def aclose(self) -> None:
        for key in list(self._clients):
            await self._forget(*key)
        if self._template is not None:
            await self._template.aclose()

    # -- containerd's calls ---------------------------------------------------------------------

    async def create(self, namespace: str, r: Any) -> Message:
        bundle = self.bundle(namespace, r.sandbox_id)
        async with self._lock(namespace, r.sandbox_id):
            if r.rootfs:
                raise InvalidArgument("Create with a rootfs (a sandbox image's snapshot) is not supported by "
                                      "podshim-sandboxer: a pod's pause is its shim's own")
            try:
                os.makedirs(os.path.dirname(bundle), mode=0o711, exist_ok=True)
                os.mkdir(bundle, 0o711)
            except FileExistsError:
                raise AlreadyExists(f"sandbox {r.sandbox_id!r} in namespace {namespace!r} exists already") from None
            try:
                await self._spawn(namespace, r.sandbox_id, bundle)
                await self._call(namespace, r.sandbox_id, "CreateSandbox", sandbox_pb2.CreateSandboxRequest(
                    sandbox_id=r.sandbox_id, bundle_path=bundle, options=r.options, netns_path=r.netns_path,
                    annotations=r.annotations), sandbox_pb2.CreateSandboxResponse)
            except BaseException:
                # containerd forgets a pod whose Create failed: nothing of it may stay.
                await asyncio.shield(self._remove(namespace, r.sandbox_id))
                raise
        return controller_pb2.ControllerCreateResponse(sandbox_id=r.sandbox_id)

    async def start(self, namespace: str, r: Any) -> Message:
        started = await self._call(namespace, r.sandbox_id, "StartSandbox",
                                   sandbox_pb2.StartSandboxRequest(sandbox_id=r.sandbox_id),
                                   sandbox_pb2.StartSandboxResponse)
        return controller_pb2.ControllerStartResponse(
            sandbox_id=r.sandbox_id, pid=started.pid, created_at=started.created_at,
            address=self.address(namespace, r.sandbox_id), version=TASK_API_VERSION)

    async def platform(self, namespace: str, r: Any) -> Message:
        answer = await self._call(namespace, r.sandbox_id, "Platform",
                                  sandbox_pb2.PlatformRequest(sandbox_id=r.sandbox_id), sandbox_pb2.PlatformResponse)
        return controller_pb2.ControllerPlatformResponse(platform=answer.platform)

    async def stop(self, namespace: str, r: Any) -> Message:
        try:
            await self._call(namespace, r.sandbox_id, "StopSandbox",
                             sandbox_pb2.StopSandboxRequest(sandbox_id=r.sandbox_id, timeout_secs=r.timeout_secs),
                             sandbox_pb2.StopSandboxResponse)
        except Unavailable:  # its shim is gone: so is the pod, once what it left is removed
            await self._reap(namespace, r.sandbox_id)
        return controller_pb2.ControllerStopResponse()

    async def wait(self, namespace: str, r: Any) -> Message:
        while True:
            try:
                done = await self._call(namespace, r.sandbox_id, "WaitSandbox",
                                        sandbox_pb2.WaitSandboxRequest(sandbox_id=r.sandbox_id),
                                        sandbox_pb2.WaitSandboxResponse)
                return controller_pb2.ControllerWaitResponse(exit_status=done.exit_status, exited_at=done.exited_at)
            except Unavailable:
                # The connection broke: a shim that still accepts is asked again; a dead one's
                # pod has ended, and its exit is what delete finds.
                if await self._alive(namespace, r.sandbox_id):
                    continue
                ended = await self._reap(namespace, r.sandbox_id)
                return controller_pb2.ControllerWaitResponse(exit_status=ended["exit_status"],
                                                             exited_at=timestamp(ended["exited_at"]))

    async def _alive(self, namespace: str, sandbox_id: str) -> bool:
        await self._forget(namespace, sandbox_id)
        try:
            await self._shim(namespace, sandbox_id)
        except Unavailable:
            return False
        return True

    async def status(self, namespace: str, r: Any) -> Message:
        address = self.address(namespace, r.sandbox_id)
        try:
            s = await self._call(namespace, r.sandbox_id, "SandboxStatus",
                                 sandbox_pb2.SandboxStatusRequest(sandbox_id=r.sandbox_id, verbose=r.verbose),
                                 sandbox_pb2.SandboxStatusResponse)
        except Unavailable:
            ended = await self._reap(namespace, r.sandbox_id)
            return controller_pb2.ControllerStatusResponse(
                sandbox_id=r.sandbox_id, pid=ended["pid"], state=NOT_READY, exited_at=timestamp(ended["exited_at"]),
                info={"shim": "gone"}, address=address, version=TASK_API_VERSION)
        return controller_pb2.ControllerStatusResponse(
            sandbox_id=r.sandbox_id, pid=s.pid, state=s.state, info=s.info, created_at=s.created_at,
            exited_at=s.exited_at, extra=s.extra, address=address,
            version=TASK_API_VERSION)

    async def shutdown(self, namespace: str, r: Any) -> Message:
        self.bundle(namespace, r.sandbox_id)  # (a bad id is refused, not taken for a missing pod)
        async with self._lock(namespace, r.sandbox_id):
            await self._remove(namespace, r.sandbox_id)
        self._locks.pop((namespace, r.sandbox_id), None)
        return controller_pb2.ControllerShutdownResponse()

    async def _remove(self, namespace: str, sandbox_id: str) -> None:
        """ShutdownSandbox if the shim answers, then what delete does, then the bundle; a pod
        that is not there (removed before) is no error."""
        bundle = self.bundle(namespace, sandbox_id)
        if not os.path.isdir(bundle):
            return
        try:
            await self._call(namespace, sandbox_id, "ShutdownSandbox",
                             sandbox_pb2.ShutdownSandboxRequest(sandbox_id=sandbox_id),
                             sandbox_pb2.ShutdownSandboxResponse)
        except Unavailable:
            pass  # the shim is gone already: delete removes what it left
        except Exception as exc:  # it refused: delete kills it and removes everything anyway
            log.warning("the shim of %s/%s refused ShutdownSandbox (%s); deleting it", namespace, sandbox_id, exc)
        await self._reap(namespace, sandbox_id)
        await asyncio.to_thread(shutil.rmtree, bundle)

    async def metrics(self, namespace: str, r: Any) -> Message:
        answer = await self._call(namespace, r.sandbox_id, "SandboxMetrics",
                                  sandbox_pb2.SandboxMetricsRequest(sandbox_id=r.sandbox_id),
                                  sandbox_pb2.SandboxMetricsResponse)
        return controller_pb2.ControllerMetricsResponse(metrics=answer.metrics)

    async def update(self, namespace: str, r: Any) -> Message:
        self._known(namespace, r.sandbox_id)
        raise Unimplemented(f"podshim-sandboxer does not apply Update ({', '.join(r.fields) or 'no fields'}) to "
                            f"sandbox {r.sandbox_id!r}: pod-level resource updates are not supported; each "
                            f"container keeps its own limits")
