"""podshimd's gRPC server: CRI v1 (``runtime.v1``) on a Unix socket, on :mod:`shim.grpcwire.aio`.

The wiring: each service is composed from *handler groups*, one module each (:data:`RUNTIME_GROUPS`,
:data:`IMAGE_GROUPS`); :func:`compose` answers UNIMPLEMENTED with a sentence for every method no
group defines, and :func:`methods` gives the server each RPC with its messages' codec. Handlers
raise to fail: the server maps what they raise to the call's status in one place
(:func:`shim.rpc.dispatch.status_from_exception`), and runs every call on the event loop that
reads the socket, with no thread between them. Handlers translate only; the semantics are the pod layer's
(:class:`client.cri.pod.PodService`), which podshimd opens at start: it reconnects to every live
shim and finishes or rolls back what a daemon that died left half-done, before the socket accepts.

One state root has one daemon: podshimd holds an exclusive flock on ``STATE_ROOT/podshimd.lock``
(which holds its pid) for its whole life, taken before it reads or writes anything there, and a
second podshimd on that root refuses to start with the first one's pid (docs/roots.md).

The socket is ``config.listen``'s path, 0600, in a 0700 directory. While it serves, podshimd holds
an exclusive flock on that directory, so two daemons starting at once cannot both take the socket;
a socket file that nobody answers on (a podshimd that was killed) is replaced, one that answers is
another live daemon's and podshimd refuses to start. Started by ``systemd/podshimd.socket``, it
serves on the socket systemd made (:mod:`.activation`) and leaves it to systemd, so clients
that connect while the daemon restarts wait instead of failing. SIGTERM and SIGINT stop it: calls in flight
get :data:`SHUTDOWN_GRACE` seconds, pod changes in flight :data:`CHANGES_GRACE`, then the socket is
removed. The shims and their pods keep running: a restarted podshimd finds them again.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import signal
import socket
import stat
from collections.abc import Callable, Iterable
from typing import Any

import shim
from shim.cri.api import api_pb2
from shim.grpcwire.aio import Method, Server
from shim.lib.files import ensure_private_dir, flock_open
from shim.lib.notify import Notifier
from shim.lib.program import Failure
from shim.rpc.blocking import can_connect
from shim.rpc.status import RpcError, Unimplemented

from client import layouts
from client.controller.spawners import ExecSpawner
from client.cri.pod import PodService, open_pod_service
from client.cri.rootfs import StoreImages
from client.images.service import Images
from client.streaming.attach import AttachBackend
from client.streaming.remotecommand import ExecBackend
from client.streaming.server import Backend, StreamingServer

from . import archives, metrics
from .activation import ActivationError, inherited_listener
from .checkpoints import Checkpoints
from .config import Config
from .containers import Containers
from .events import Events
from .execsync import SyncExec
from .handlers import Changes, Handlers
from .images import ImageFilesystem
from .imagestore import ImageStore
from .podmetrics import PodMetrics
from .runtime_info import KUBELET_API_VERSION, RUNTIME_API_VERSION, RUNTIME_NAME, RuntimeInfo
from .sandboxes import Sandboxes
from .stats import Stats
from .streaming import Streaming
from .upkeep import Upkeep

__all__ = ["RUNTIME_NAME", "RUNTIME_API_VERSION", "KUBELET_API_VERSION", "SHUTDOWN_GRACE", "CHANGES_GRACE",
           "RUNTIME_GROUPS", "IMAGE_GROUPS", "DaemonError", "compose", "methods", "serve"]

log = logging.getLogger("podshimd")

#: Seconds in-flight calls get to finish once podshimd is told to stop (containerd's shim: 3 s).
SHUTDOWN_GRACE = 5.0
#: Seconds pod changes still in flight after that get before they are cancelled (and roll back).
CHANGES_GRACE = 20.0
#: In the state root: flock'd by the daemon that serves it, for its whole life; holds its pid.
STATE_LOCK = "podshimd.lock"
#: Connections the socket holds before podshimd accepts them (kubelet, crictl, probes at start).
LISTEN_BACKLOG = 1024

# -- the services: add a handler group here --------------------------------------------------------
#: The handler groups of runtime.v1.RuntimeService, each a :class:`.handlers.Handlers` subclass
#: in a module of its own whose methods are named after the service's RPCs.
RUNTIME_GROUPS: tuple[type[Handlers], ...] = (RuntimeInfo, Sandboxes, Containers, Streaming, SyncExec, Upkeep,
                                               Stats, PodMetrics, Checkpoints, Events)
#: The handler groups of runtime.v1.ImageService.
IMAGE_GROUPS: tuple[type[Handlers], ...] = (ImageStore, ImageFilesystem)


class DaemonError(Failure):
    """podshimd cannot start; the message is one sentence for the person who started it."""


def _unimplemented(service: str, method: str) -> Callable[..., Any]:
    async def handle(self: Any, request: Any, context: Any) -> Any:
        raise Unimplemented(f"podshimd does not implement {service}.{method} yet")
    handle.__name__ = handle.__qualname__ = method
    return handle


def compose(service_name: str, groups: Iterable[type[Handlers]]) -> type:
    """The servicer class of the CRI service ``service_name`` (``RuntimeService``) made of the
    handler ``groups``: every RPC a group defines, its log lines carrying its request's ids, and an
    UNIMPLEMENTED answer for the rest. Raises TypeError when two groups define the same name (an
    RPC, or a helper one group's handlers would find in the other) or a group defines a method that
    is no RPC of the service (a misspelt handler would never run)."""
    service = api_pb2.DESCRIPTOR.services_by_name[service_name]
    rpcs = {method.name for method in service.methods}
    handlers: dict[str, Callable[..., Any]] = {}
    owner: dict[str, str] = {}
    defined: dict[str, str] = {}
    for group in groups:
        for name, value in vars(group).items():
            if name.startswith("__"):
                continue
            if name in defined:  # the first group's would serve the other's calls
                raise TypeError(f"{name} is defined by both {defined[name]} and {group.__qualname__}")
            defined[name] = group.__qualname__
            if not name[:1].isupper() or not callable(value):
                continue
            if name not in rpcs:
                raise TypeError(f"{group.__qualname__}.{name} is not an RPC of {service.full_name}")
            if name in handlers:
                raise TypeError(f"{service.full_name}.{name} is defined by both {owner[name]} and {group.__qualname__}")
            handlers[name], owner[name] = metrics.observed(value), group.__qualname__
    for name in rpcs - handlers.keys():
        handlers[name] = _unimplemented(service.full_name, name)
    return type(service.name, tuple(groups) or (object,), {
        **handlers, "SERVICE": service,
        "__doc__": f"{service.full_name}, composed from {', '.join(g.__qualname__ for g in groups) or 'nothing'}."})


def _serialize(message: Any) -> bytes:
    return bytes(message.SerializeToString())


def methods(servicer: Any) -> dict[str, Method]:
    """The RPCs of a composed servicer (:func:`compose`) by path, each with its messages' codec."""
    service = type(servicer).SERVICE
    table = {}
    for rpc in service.methods:
        request_type = getattr(api_pb2, rpc.input_type.name)
        handler = getattr(servicer, rpc.name)
        table[f"/{service.full_name}/{rpc.name}"] = Method(handler, request_type.FromString, _serialize,
                                                           where=getattr(handler, "__qualname__", rpc.name))
    return table


RuntimeService = compose("RuntimeService", RUNTIME_GROUPS)
ImageService = compose("ImageService", IMAGE_GROUPS)


# -- the socket --------------------------------------------------------------------------------------


def _claim_state_root(stack: contextlib.AsyncExitStack, state_root: str) -> None:
    """Make the state root (0711), lock it for this daemon's life (released and removed with
    ``stack``) and mark it as podshimd's (docs/roots.md), before anything else is read or written
    there. Raises DaemonError when another podshimd holds it (naming its pid) or when it is marked
    as a Controller's bundle root."""
    path = os.path.join(state_root, STATE_LOCK)
    try:
        ensure_private_dir(state_root, 0o711, keep_mode=True)
        layouts.check(state_root, layouts.POD_ROOT)  # before anything is written there
        fd = stack.enter_context(flock_open(path, blocking=False, unlink=True))
        if fd is None:
            raise DaemonError(f"another podshimd ({_holder(path)}) serves the state root {state_root}: one state "
                              "root has one daemon; stop that one, or give this one a state root of its own")
        _write_pid(path)
        layouts.claim(state_root, layouts.POD_ROOT)
    except OSError as exc:
        raise DaemonError(f"cannot use the state root {state_root}: {exc.strerror or exc}") from None
    except RpcError as exc:
        raise DaemonError(exc.message) from None


def _write_pid(path: str) -> None:
    """Record this daemon's pid in its lock file (locked by us: nobody else writes it)."""
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        data = f"{os.getpid()}\n".encode()
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def _holder(path: str) -> str:
    """"pid N" of the daemon that holds the lock file ``path``, as it recorded it."""
    try:
        with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NOFOLLOW)) as f:
            text = f.read(32).decode(errors="replace").strip()
    except OSError:
        text = ""
    return f"pid {text}" if text.isdigit() else "its pid not recorded yet"


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


def _listen(path: str) -> socket.socket:
    """A listening unix socket bound at ``path``, born 0600: no moment where others may connect."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old_umask = os.umask(0o177)
    try:
        sock.bind(path)
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        raise DaemonError(f"cannot listen on unix://{path}: {exc.strerror or exc}") from None
    finally:
        os.umask(old_umask)
    return sock


def _remove_stale_socket(path: str, listen: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise DaemonError(f"{path} exists and is not a socket")
    if can_connect(path):
        raise DaemonError(f"another daemon already answers on {listen}")
    log.info("removing the stale socket %s", path)
    os.unlink(path)


# -- serving -----------------------------------------------------------------------------------------

async def serve(config: Config, *, notifier: Notifier | None = None, on_hangup: Callable[[], None] | None = None) -> None:
    """Serve CRI on ``config.listen`` until SIGTERM or SIGINT, then remove the socket; ``on_hangup``
    runs on each SIGHUP (podshimd's: the log level read again from the config).

    Before the socket accepts, the pod layer is opened over ``config.state_root``: it reconnects
    to every live shim and rolls back or finishes what a daemon that died left half-done.
    ``notifier`` (systemd's NOTIFY_SOCKET) gets READY=1 once the socket accepts and STOPPING=1 when
    the daemon stops. Raises :class:`DaemonError` when podshimd cannot start (another daemon on
    the socket, a directory it may not use, a bind that fails, a pod store it cannot open).
    """
    path = config.socket_path
    server = None
    bound: tuple[int, int] | None = None
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if on_hangup is not None:
        loop.add_signal_handler(signal.SIGHUP, on_hangup)
    lock_fd = None
    changes = Changes(config.max_parallel_pod_starts)
    try:
        async with contextlib.AsyncExitStack() as stack:
            try:
                inherited = inherited_listener(path)  # systemd's podshimd.socket, if it started us
            except ActivationError as exc:
                raise DaemonError(str(exc)) from None
            if inherited is not None:
                stack.callback(inherited.close)  # systemd keeps its own: the socket outlives the daemon
            _claim_state_root(stack, config.state_root)
            lock_fd = _claim_directory(os.path.dirname(path), config.runtime_root)
            if inherited is None:
                _remove_stale_socket(path, config.listen)
            images = await _open_images(stack, config)
            pods = await _open_pods(stack, config, images)
            images.in_use = pods.image_user
            streaming = await _start_streaming(stack, config, pods)
            if config.metrics_address:
                try:
                    stack.callback(metrics.start(config.metrics_address, pods, changes).close)
                except OSError as exc:
                    raise DaemonError(f"cannot serve metrics on {config.metrics_address}: "
                                      f"{exc.strerror or exc}") from None
            server = Server({**methods(RuntimeService(config, pods, changes, images, streaming)),
                             **methods(ImageService(config, pods, changes, images)),
                             **archives.methods(images)},  # podshim.images.v1: no CRI RPC for these
                            on_finished=metrics.finished)
            if inherited is not None:
                await server.start(inherited)
            else:
                listener = _listen(path)  # the server owns it once started
                st = os.lstat(path)
                bound = (st.st_dev, st.st_ino)
                try:
                    await server.start(listener)
                except BaseException:
                    listener.close()
                    raise
            log.info("podshimd %s serving CRI %s on %s (%d pods)", shim.__version__, RUNTIME_API_VERSION,
                     config.listen, len(pods.store.list()))
            if notifier is not None:
                notifier.send("READY=1", f"STATUS=serving CRI {RUNTIME_API_VERSION} on {config.listen}")
            await stop.wait()
            log.info("stopping: in-flight calls get %.0f s", SHUTDOWN_GRACE)
            if notifier is not None:
                notifier.send("STOPPING=1")
            await server.stop(SHUTDOWN_GRACE)
            server = None
            await changes.drain(CHANGES_GRACE)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(signum)
        if server is not None:
            await server.stop(SHUTDOWN_GRACE)
        if bound is not None:
            _remove_own_socket(path, bound)
        if lock_fd is not None:
            os.close(lock_fd)
    log.info("stopped")


async def _open_pods(stack: contextlib.AsyncExitStack, config: Config, images: Images) -> PodService:
    """The pod layer over the config's roots (its containers' images from ``images``), recovered;
    closed (never the shims) with ``stack``."""
    spawner = ExecSpawner(runtime_root=config.runtime_root, use_template=config.template)
    try:
        return await stack.enter_async_context(open_pod_service(
            config.state_root, config.runtime_root, cni_conf_dir=config.cni_conf_dir,
            cni_bin_dirs=config.cni_bin_dirs, spawner=spawner, runtime_handlers=config.runtime_handlers,
            default_runtime_handler=config.default_runtime_handler, cgroup_parent=config.cgroup_parent, cgroup_driver=config.cgroup_driver,
            pause_binary=config.sandbox_binary, images=StoreImages(images.store.resolve),
            snapshots=images.snapshots, sandbox_image=config.sandbox_image, pull=images.pull,
            cdi_spec_dirs=config.cdi_spec_dirs))
    except RpcError as exc:
        raise DaemonError(f"cannot open the pods under {config.state_root}: {exc.message}") from None


async def _start_streaming(stack: contextlib.AsyncExitStack, config: Config, pods: PodService) -> StreamingServer:
    """The Exec/Attach/PortForward server on ``config.streaming_address``, closed with ``stack``."""
    async def pod_network(pod_id: str) -> str:
        return (await pods.pod_network(pod_id))[1]

    async def exec_start(container_id: str, cmd: list[str], stdio: dict[str, Any]) -> tuple[str, str, str]:
        return await pods.exec_start(container_id, cmd, stdio)

    async def exec_wait(handle: tuple[str, str, str]) -> int:
        return await pods.exec_wait(*handle)

    async def exec_kill(handle: tuple[str, str, str]) -> None:
        await pods.exec_kill(*handle)

    # The exec FIFOs live in a 0700 directory of the runtime root (the shim opens them by path).
    execs = ExecBackend(exec_start, exec_wait, exec_kill, os.path.join(config.runtime_root, "exec"))
    attach = AttachBackend(pods.attach_target, pods.attach_output, pods.close_stdin, pods.wait_task,
                           pods.resize_terminal, os.path.join(config.runtime_root, "exec"))
    streaming = StreamingServer(config.streaming_address, Backend(pod_network=pod_network, execs=execs, attach=attach))
    try:
        await streaming.start()
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise DaemonError(f"cannot serve streaming on {config.streaming_address}: {reason}") from None
    stack.push_async_callback(streaming.aclose)
    log.info("streaming (exec, attach, port-forward) on %s", streaming.base_url)
    return streaming


async def _open_images(stack: contextlib.AsyncExitStack, config: Config) -> Images:
    """The node's images under the config's state root (what a killed pull left is removed);
    the pulls in flight are cancelled with ``stack``."""
    images = Images(config.state_root, hosts=config.registries, pull_timeout=config.image_pull_timeout,
                    progress_timeout=config.image_pull_progress_timeout,
                    max_unpacked_bytes=config.image_pull_max_unpacked_bytes)
    try:
        await asyncio.to_thread(images.open)
    except (OSError, RpcError) as exc:
        reason = exc.message if isinstance(exc, RpcError) else exc.strerror or str(exc)
        raise DaemonError(f"cannot open the image store under {config.state_root}: {reason}") from None
    stack.push_async_callback(images.aclose)
    return images


def _remove_own_socket(path: str, bound: tuple[int, int]) -> None:
    # Only the socket this daemon bound: never one that replaced it.
    try:
        st = os.lstat(path)
        if (st.st_dev, st.st_ino) == bound:
            os.unlink(path)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            log.warning("cannot remove the socket %s: %s", path, exc.strerror)
