"""``podshim-sandboxer``: podshim's sandbox controller served to containerd as a proxy plugin,
gRPC ``containerd.services.sandbox.v1.Controller`` on a Unix socket (shim.grpcwire's server, as podshimd).

    podshim-sandboxer [--listen PATH] [--state-root DIR] [--runtime-root DIR]
                      [--containerd-address TTRPC_SOCKET] [--pause-binary PATH] [--no-template] [--debug]

containerd's config (docs/containerd.md)::

    [proxy_plugins.podshim]
      type = "sandbox"
      address = "/run/podshim/sandboxer.sock"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.podshim]
      runtime_type = "io.containerd.podshim.v1"
      sandboxer = "podshim"

Every call is the :class:`~shim.containerd.sandboxer.Sandboxer`'s; this module only decodes,
reads containerd's namespace from the call's metadata, and turns what a handler raises into a
gRPC status with a sentence (:func:`shim.rpc.dispatch.status_from_exception`, the shims' one
mapping). SIGTERM and SIGINT stop it; the pods and their shims keep running, and a sandboxer
started again answers for them. A bad flag is a sentence and exit status 2; a socket another
sandboxer answers on, exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from shim import __version__
from shim.api.names import (
    DEFAULT_CONTAINERD_TTRPC_ADDRESS,
    DEFAULT_RUNTIME_ROOT,
    DEFAULT_SANDBOXER_SOCKET,
    DEFAULT_SANDBOXER_STATE_ROOT,
)
from shim.containerd.api import load
from shim.containerd.sandboxer import NAMESPACE_HEADER, Sandboxer, SandboxerConfig
from shim.grpcwire.aio import Context, Method, Server
from shim.lib.files import ensure_private_dir
from shim.lib.program import Failure
from shim.rpc.blocking import can_connect
from shim.rpc.status import InvalidArgument

__all__ = ["NAME", "serve", "main", "run", "CONTROLLER_SERVICE"]

log = logging.getLogger(__name__)

NAME = "podshim-sandboxer"
CONTROLLER_SERVICE = "containerd.services.sandbox.v1.Controller"
#: Seconds calls in flight get when the sandboxer is stopped.
SHUTDOWN_GRACE = 5.0

Handler = Callable[[str, Any], Awaitable[Any]]


def _namespace(context: Context) -> str:
    for key, value in context.invocation_metadata():
        if key == NAMESPACE_HEADER:
            return str(value)
    raise InvalidArgument(f"the call carries no containerd namespace (gRPC metadata {NAMESPACE_HEADER!r})")


def _method(name: str, handler: Handler) -> Callable[[Any, Context], Awaitable[Any]]:
    """``handler(namespace, request)`` as a gRPC method (what it raises is the server's to map)."""
    where = f"/{CONTROLLER_SERVICE}/{name}"

    @functools.wraps(handler)
    async def unary(request: Any, context: Context) -> Any:
        started = time.perf_counter()
        answer = await handler(_namespace(context), request)
        log.debug("%s %s: %.1f ms", where, request.sandbox_id, (time.perf_counter() - started) * 1000)
        return answer

    return unary


def _serialize(message: Any) -> bytes:
    return bytes(message.SerializeToString())


def methods(sandboxer: Sandboxer) -> dict[str, Method]:
    """The Controller service on ``sandboxer`` by path: each of containerd's nine methods."""
    pb2 = load("services.sandbox.v1.sandbox_pb2")
    handlers = {"Create": sandboxer.create, "Start": sandboxer.start, "Platform": sandboxer.platform,
                "Stop": sandboxer.stop, "Wait": sandboxer.wait, "Status": sandboxer.status,
                "Shutdown": sandboxer.shutdown, "Metrics": sandboxer.metrics, "Update": sandboxer.update}
    service = pb2.DESCRIPTOR.services_by_name["Controller"]
    if {m.name for m in service.methods} != set(handlers):
        raise Failure(f"{CONTROLLER_SERVICE} of the generated code has methods "
                      f"{sorted(m.name for m in service.methods)}, not the nine podshim-sandboxer serves")
    return {f"/{CONTROLLER_SERVICE}/{m.name}": Method(_method(m.name, handlers[m.name]),
                                                     getattr(pb2, m.input_type.name).FromString, _serialize,
                                                     where=f"/{CONTROLLER_SERVICE}/{m.name}")
            for m in service.methods}


def _take_socket(path: str) -> None:
    """Make ``path``'s directory and remove a socket nobody answers on (a sandboxer that died);
    Failure when another one serves there."""
    if not os.path.isabs(path):
        raise InvalidArgument(f"--listen {path!r} must be an absolute path")
    ensure_private_dir(os.path.dirname(path), 0o700)
    if os.path.exists(path):
        if can_connect(path):
            raise Failure(f"another process serves on {path}: one sandboxer per socket")
        os.unlink(path)


async def serve(config: SandboxerConfig, listen: str, *, stop: asyncio.Event | None = None) -> None:
    """Serve containerd's Controller on the Unix socket ``listen`` until ``stop`` is set (or
    SIGTERM/SIGINT when it is None); the socket is removed on the way out."""
    sandboxer = Sandboxer(config)
    _take_socket(listen)
    os.makedirs(config.state_root, mode=0o711, exist_ok=True)
    await sandboxer.open()
    server = Server(methods(sandboxer))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old_umask = os.umask(0o177)  # born 0600: no moment where others may connect
    try:
        listener.bind(listen)
        listener.listen(1024)
    except OSError as exc:
        listener.close()
        await sandboxer.aclose()
        raise Failure(f"cannot listen on {listen}: {exc.strerror or exc}") from None
    finally:
        os.umask(old_umask)
    await server.start(listener)
    log.info("%s %s serves containerd's sandbox controller on %s", NAME, __version__, listen)
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        await server.stop(SHUTDOWN_GRACE)
        await sandboxer.aclose()
        try:
            os.unlink(listen)
        except FileNotFoundError:
            pass


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=NAME, description="podshim's sandbox controller for containerd (a proxy "
                                                       "plugin: gRPC containerd.services.sandbox.v1.Controller)")
    p.add_argument("--version", action="version", version=f"{NAME} {__version__}")
    p.add_argument("--listen", default=DEFAULT_SANDBOXER_SOCKET,
                   help=f"the Unix socket containerd's proxy plugin names ({DEFAULT_SANDBOXER_SOCKET})")
    p.add_argument("--state-root", default=DEFAULT_SANDBOXER_STATE_ROOT,
                   help=f"the pods' bundles, <root>/<namespace>/<sandbox id> ({DEFAULT_SANDBOXER_STATE_ROOT})")
    p.add_argument("--runtime-root", default=os.environ.get("PODSHIM_RUNTIME_ROOT", DEFAULT_RUNTIME_ROOT),
                   help=f"podshim's runtime root: the shims' sockets ($PODSHIM_RUNTIME_ROOT or {DEFAULT_RUNTIME_ROOT})")
    p.add_argument("--containerd-address", default=DEFAULT_CONTAINERD_TTRPC_ADDRESS,
                   help=f"containerd's ttrpc socket, for the shims' events ({DEFAULT_CONTAINERD_TTRPC_ADDRESS})")
    p.add_argument("--pause-binary", default=os.environ.get("PODSHIM_PAUSE_BINARY"),
                   help="the pause program ($PODSHIM_PAUSE_BINARY; default: podshim's own)")
    p.add_argument("--no-template", action="store_true",
                   help="fork every shim in the sandboxer instead of asking the runtime root's shim template")
    p.add_argument("--debug", action="store_true", help="log at debug level")
    return p


def main(argv: list[str] | None = None) -> int:
    from shim.lib.logs import setup_logging
    from shim.lib.program import exit_status
    from shim.rpc.channel import install_uvloop

    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)  # usage errors: exit 2

    def body() -> int:
        config = SandboxerConfig(state_root=os.path.normpath(args.state_root),
                                 runtime_root=os.path.normpath(args.runtime_root),
                                 containerd_address=args.containerd_address, pause_binary=args.pause_binary,
                                 use_template=not args.no_template, debug=args.debug)
        Sandboxer(config)  # (refuses a bad config before anything is made)
        setup_logging(args.debug)
        install_uvloop()
        asyncio.run(serve(config, os.path.normpath(args.listen)))
        return 0

    return exit_status(NAME, body)


def run() -> None:
    """The ``podshim-sandboxer`` program (bin/podshim's launcher runs it)."""
    from shim.lib.program import long_running

    long_running()
    sys.exit(main())


if __name__ == "__main__":
    run()
