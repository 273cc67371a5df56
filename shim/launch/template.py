"""The shim template: a process that has paid Python's start-up once and forks shims on request.

A shim started by exec pays about 100 ms and 20 MiB to import asyncio, uvloop and msgpack
before it serves anything. The template imports everything a shim needs, freezes its heap
(``gc.freeze()``, so the children's collector never touches — and so never copies — those
pages), and waits on a control socket. It keeps one *spare* shim forked ahead (a double fork,
so the template is never the shim's parent and may die or restart freely), detached and waiting;
asked to spawn, it hands the spare its sandbox and bound socket, answers once the shim serves,
then forks the next spare. Without a live spare it forks on the spot. Either way the shim takes
the same serve path as ``podshim serve`` and the result is the bootstrap ``podshim start`` prints.

The control socket speaks the podshim protocol: service ``podshim.template.v1.Template``,
methods ``Spawn {namespace, sandbox_id, bundle, runtime_root, pause_binary?, debug?}`` → the
bootstrap map, and ``Ping`` → ``{pid, spawned, runtime_root, spare_pid}`` (protocol.md 7.5). It
is served without an event loop, one call at a time: forking from inside a running event loop
would hand the child a loop it must not touch.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
from typing import Any, Callable

from shim.kernel.linux import set_process_name
from shim.paths import control_socket_path, socket_path
from shim.rpc.api import TEMPLATE_SERVICE
from shim.rpc.blocking import serve_connection
from shim.rpc.files import ensure_private_dir
from shim.rpc.identifiers import validate_identifier
from shim.rpc.messages import Request, optional, require
from shim.rpc.status import InvalidArgument
from shim.launch.spawn import Spare, bind_listener, fork_spare, spawn_shim

__all__ = ["run_template"]

log = logging.getLogger(__name__)

#: A control client that sends nothing for this long is dropped (calls are served in turn).
CONTROL_IO_TIMEOUT = 5.0


def _preload() -> None:
    """Import everything a shim imports, so a forked shim imports nothing."""
    import asyncio  # noqa: F401

    import msgpack  # noqa: F401

    from shim.kernel import cgroups, linux, netns, reaper  # noqa: F401
    from shim import cleanup, daemon  # noqa: F401
    from shim.sandbox import events, sandbox, service  # noqa: F401
    from shim.launch import notify  # noqa: F401
    from shim.runtime import native, pause  # noqa: F401
    from shim.runtime.oci import backend  # noqa: F401  (the runc and crun handlers)
    from shim.rpc import client, server  # noqa: F401
    from shim.rpc.channel import install_uvloop

    install_uvloop()
    try:
        import uvloop  # noqa: F401
    except ImportError:  # pragma: no cover
        pass


class _Template:
    def __init__(self, runtime_root: str, pause_binary: str | None, listener: socket.socket):
        self.runtime_root = runtime_root
        self.pause_binary = pause_binary
        self.listener = listener
        self.spawned = 0
        self.spare: Spare | None = None

    def replenish(self) -> None:
        """Fork the next spare shim if there is none (after answering: nobody waits for it)."""
        if self.spare is None:
            try:
                self.spare = fork_spare()
            except OSError as exc:  # the next Spawn forks then
                log.warning("cannot fork a spare shim: %s", exc)

    def retire(self) -> None:
        if self.spare is not None:
            self.spare.close()
            self.spare = None

    def handlers(self) -> dict[tuple[str, str], Callable[[Request], dict[str, Any]]]:
        return {(TEMPLATE_SERVICE, "Spawn"): self.spawn, (TEMPLATE_SERVICE, "Ping"): self.ping}

    def ping(self, request: Request) -> dict[str, Any]:
        return {"pid": os.getpid(), "spawned": self.spawned, "runtime_root": self.runtime_root,
                "spare_pid": self.spare.pid if self.spare is not None else 0}

    def spawn(self, request: Request) -> dict[str, Any]:
        from shim.sandbox.sandbox import ShimConfig

        p = request.payload
        namespace = validate_identifier("namespace", require(p, "namespace", str))
        sandbox_id = validate_identifier("sandbox id", require(p, "sandbox_id", str))
        bundle = require(p, "bundle", str)
        if not os.path.isabs(bundle):
            raise InvalidArgument(f"bundle {bundle!r} must be an absolute path")
        runtime_root = os.path.normpath(optional(p, "runtime_root", str, self.runtime_root))
        config = ShimConfig(
            namespace=namespace,
            sandbox_id=sandbox_id,
            bundle=os.path.normpath(bundle),
            socket_path=socket_path(namespace, sandbox_id, runtime_root),
            runtime_root=runtime_root,
            pause_binary=optional(p, "pause_binary", str, self.pause_binary),
        )
        spare, self.spare = self.spare, None
        try:
            result = spawn_shim(config, debug=optional(p, "debug", bool, False), double_fork=True, spare=spare)
        finally:
            if spare is not None and not spare.taken:  # a live shim already served the socket
                self.spare = spare
        self.spawned += 1
        return result


def run_template(runtime_root: str, *, pause_binary: str | None = None, ready_fd: int | None = None) -> int:
    """Serve the control socket of ``runtime_root`` until SIGTERM/SIGINT. Returns 0.

    Raises OSError when another live template already owns the control socket.
    """
    _preload()
    set_process_name("podshim-tmpl")
    path = control_socket_path(runtime_root)
    ensure_private_dir(os.path.dirname(path), 0o700)
    listener = bind_listener(path)
    if listener is None:
        raise OSError(f"a template already serves {path}")
    # Everything imported so far is shared with every shim forked from here: freezing it keeps
    # the children's garbage collector from writing to (and so copying) those pages.
    gc.collect()
    gc.freeze()
    template = _Template(runtime_root, pause_binary, listener)
    template.replenish()
    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True
        listener.close()  # wakes accept()

    def reap(signum: int, frame: Any) -> None:
        # The intermediate children of spawn_shim's double fork exit on their own, a grace
        # period after the shim they forked is up; nothing waits for them but this.
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass

    signal.signal(signal.SIGCHLD, reap)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    log.info("template serving %s (pid %d)", path, os.getpid())
    if ready_fd is not None:
        os.write(ready_fd, b"R")
        os.close(ready_fd)
    allowed = {os.geteuid(), 0}
    handlers = template.handlers()
    try:
        while not stopping:
            try:
                conn, _ = listener.accept()
            except OSError:
                if stopping:
                    break
                raise
            serve_connection(conn, handlers, allowed_uids=allowed, timeout=CONTROL_IO_TIMEOUT,
                             after_send=template.replenish)
            template.replenish()
    finally:
        template.retire()
        listener.close()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    log.info("template stopped after spawning %d shims", template.spawned)
    return 0
