"""podshimd's gRPC server: CRI v1 (``runtime.v1``) on a Unix socket, on grpc.aio.

So far it answers RuntimeService.Version and Status; every other RuntimeService and ImageService
method answers UNIMPLEMENTED with a sentence. Handlers translate only: proto in, the pod layer's
types out and back, and errors become a gRPC status in one place, :func:`translated`, through
:func:`shim.rpc.status.status_from_exception` (the same mapping the shim's wire uses).

The socket is ``config.listen``'s path, 0600, in a 0700 directory. While it serves, podshimd holds
an exclusive flock on that directory, so two daemons starting at once cannot both take the socket;
a socket file that nobody answers on (a podshimd that was killed) is replaced, one that answers is
another live daemon's and podshimd refuses to start. SIGTERM and SIGINT stop it: calls in flight
get :data:`SHUTDOWN_GRACE` seconds, then the socket is removed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import fcntl
import functools
import json
import logging
import os
import signal
import socket
import stat
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

import shim
from client.criapi import api_pb2, api_pb2_grpc
from client.cri.cni import CniConfig
from shim.launch.notify import Notifier
from shim.rpc.files import ensure_private_dir
from shim.rpc.status import RpcError, Unimplemented, status_from_exception

from .config import Config

__all__ = ["RUNTIME_NAME", "RUNTIME_API_VERSION", "SHUTDOWN_GRACE", "DaemonError", "RuntimeService", "ImageService",
           "serve"]

log = logging.getLogger("podshimd")

RUNTIME_NAME = "podshim"
RUNTIME_API_VERSION = "v1"
#: VersionResponse.version: "the version of the kubelet runtime API", which every runtime answers so.
KUBELET_API_VERSION = "0.1.0"
#: Seconds in-flight calls get to finish once podshimd is told to stop (containerd's shim: 3 s).
SHUTDOWN_GRACE = 5.0
#: A socket that accepts within this is a live daemon's (containerd: 100 ms).
CAN_CONNECT_TIMEOUT = 0.1

_GRPC_CODES = {code.value[0]: code for code in grpc.StatusCode}


class DaemonError(Exception):
    """podshimd cannot start; the message is one sentence for the person who started it."""


# -- translation -------------------------------------------------------------------------------------

def translated(handler: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Wrap a CRI handler: any exception it raises becomes the call's gRPC status (the one place)."""
    @functools.wraps(handler)
    async def handle(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await handler(self, request, context)
        except Exception as exc:
            code, message, _ = status_from_exception(exc, where=handler.__qualname__)
        await context.abort(_GRPC_CODES[int(code)], message)
    return handle


def _unimplemented(service: str, method: str) -> Callable[..., Awaitable[Any]]:
    async def handle(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        raise Unimplemented(f"podshimd does not implement {service}.{method} yet")
    handle.__name__ = handle.__qualname__ = method
    return translated(handle)


def _answer_the_rest_unimplemented(servicer: type) -> type:
    """Give ``servicer`` an UNIMPLEMENTED handler for every method of its service it does not define
    (the generated base class's would be synchronous, which grpc.aio does not run by default)."""
    service = api_pb2.DESCRIPTOR.services_by_name[servicer.__name__]
    for method in service.methods:
        if method.name not in servicer.__dict__:
            setattr(servicer, method.name, _unimplemented(service.full_name, method.name))
    return servicer


# -- the services ------------------------------------------------------------------------------------

@_answer_the_rest_unimplemented
class RuntimeService(api_pb2_grpc.RuntimeServiceServicer):
    """runtime.v1.RuntimeService."""

    def __init__(self, config: Config) -> None:
        self.config = config

    @translated
    async def Version(self, request: api_pb2.VersionRequest, context: Any) -> api_pb2.VersionResponse:
        return api_pb2.VersionResponse(version=KUBELET_API_VERSION, runtime_name=RUNTIME_NAME,
                                       runtime_version=shim.__version__, runtime_api_version=RUNTIME_API_VERSION)

    @translated
    async def Status(self, request: api_pb2.StatusRequest, context: Any) -> api_pb2.StatusResponse:
        conditions = [api_pb2.RuntimeCondition(type="RuntimeReady", status=True), self._network_condition()]
        info = {}
        if request.verbose:
            info["config"] = _config_json(self.config)
        return api_pb2.StatusResponse(status=api_pb2.RuntimeStatus(conditions=conditions), info=info)

    def _network_condition(self) -> api_pb2.RuntimeCondition:
        # As containerd: the network is ready once a CNI network configuration exists.
        def not_ready(message: str) -> api_pb2.RuntimeCondition:
            return api_pb2.RuntimeCondition(type="NetworkReady", status=False, reason="NetworkPluginNotReady",
                                            message=message)
        try:
            network = CniConfig.load(self.config.cni_conf_dir)
        except RpcError as exc:
            return not_ready(f"the CNI network config is not valid: {exc.message}")
        if network is None:
            return not_ready(f"no CNI network config found in {self.config.cni_conf_dir}")
        return api_pb2.RuntimeCondition(type="NetworkReady", status=True)


@_answer_the_rest_unimplemented
class ImageService(api_pb2_grpc.ImageServiceServicer):
    """runtime.v1.ImageService."""


def _config_json(config: Config) -> str:
    return json.dumps(dataclasses.asdict(config), sort_keys=True)


# -- the socket --------------------------------------------------------------------------------------

def _can_connect(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    s.settimeout(CAN_CONNECT_TIMEOUT)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def _claim_directory(directory: str, runtime_root: str) -> int:
    """Make the socket's directory 0700 and lock it; return the locked descriptor.

    A directory that exists is made 0700 only when it is podshim's own (the runtime root or below
    it); any other existing directory must already be 0700: podshimd never narrows /tmp or /run.
    A symbolic link there is refused, never followed."""
    try:
        ensure_private_dir(directory, 0o700, keep_mode=True)  # never a link: its target would be narrowed
    except OSError as exc:
        raise DaemonError(f"cannot use the socket directory {directory}: {exc.strerror}") from None
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode != 0o700:
            inside_root = os.path.commonpath([os.path.realpath(directory), os.path.realpath(runtime_root)]) == \
                os.path.realpath(runtime_root)
            if not inside_root:
                raise DaemonError(f"the socket directory {directory} has mode {mode:04o}, not 0700, and is not "
                                  f"under the runtime root {runtime_root}: give the socket a directory of its own")
            os.fchmod(fd, 0o700)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DaemonError(f"another podshimd is starting or serving in {directory}") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _remove_stale_socket(path: str, listen: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise DaemonError(f"{path} exists and is not a socket")
    if _can_connect(path):
        raise DaemonError(f"another daemon already answers on {listen}")
    log.info("removing the stale socket %s", path)
    os.unlink(path)


# -- serving -----------------------------------------------------------------------------------------

async def serve(config: Config, *, notifier: Notifier | None = None) -> None:
    """Serve CRI on ``config.listen`` until SIGTERM or SIGINT, then remove the socket.

    ``notifier`` (systemd's NOTIFY_SOCKET) gets READY=1 once the socket accepts and STOPPING=1 when
    the daemon stops. Raises :class:`DaemonError` when podshimd cannot
    start (another daemon on the socket, a directory it may not use, a bind that fails).
    """
    path = config.socket_path
    server = None
    bound: tuple[int, int] | None = None
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    lock_fd = None
    try:
        lock_fd = _claim_directory(os.path.dirname(path), config.runtime_root)
        _remove_stale_socket(path, config.listen)
        server = grpc.aio.server()
        api_pb2_grpc.add_RuntimeServiceServicer_to_server(RuntimeService(config), server)
        api_pb2_grpc.add_ImageServiceServicer_to_server(ImageService(), server)
        old_umask = os.umask(0o177)  # the socket is born 0600: no moment where others may connect
        try:
            server.add_insecure_port(config.listen)
        except RuntimeError as exc:
            raise DaemonError(f"cannot listen on {config.listen}: {exc}") from None
        finally:
            os.umask(old_umask)
        st = os.lstat(path)
        bound = (st.st_dev, st.st_ino)
        await server.start()
        log.info("podshimd %s serving CRI %s on %s", shim.__version__, RUNTIME_API_VERSION, config.listen)
        if notifier is not None:
            notifier.send("READY=1", f"STATUS=serving CRI {RUNTIME_API_VERSION} on {config.listen}")
        await stop.wait()
        log.info("stopping: in-flight calls get %.0f s", SHUTDOWN_GRACE)
        if notifier is not None:
            notifier.send("STOPPING=1")
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        if server is not None:
            await server.stop(SHUTDOWN_GRACE)
        if bound is not None:
            _remove_own_socket(path, bound)
        if lock_fd is not None:
            os.close(lock_fd)
    log.info("stopped")


def _remove_own_socket(path: str, bound: tuple[int, int]) -> None:
    # Only the socket this daemon bound: never one that replaced it.
    try:
        st = os.lstat(path)
        if (st.st_dev, st.st_ino) == bound:
            os.unlink(path)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            log.warning("cannot remove the socket %s: %s", path, exc.strerror)
