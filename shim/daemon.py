"""The shim's serve loop: signals, the server, readiness, and an orderly shutdown.

``serve_forever`` is the one path every shim takes, whether ``podshim start`` forked it,
``podshim serve`` runs it in the foreground for systemd, or a template forked it.
:func:`serve_spare` takes the same path for a spare shim (shim.launch.spawn): it sets up all that
does not depend on the sandbox (the event loop, the reaper, the server, a network namespace)
before its sandbox is known, then serves it as any shim.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable

from shim.kernel import netns
from shim.sandbox.events import EventBus
from shim.kernel.linux import set_process_name
from shim.launch.install import long_running
from shim.launch.notify import Notifier
from shim.kernel.reaper import Reaper
from shim.rpc.channel import install_uvloop
from shim.rpc.records import Record, set_field as _set
from shim.rpc.server import Server
from shim.sandbox.sandbox import Sandbox, ShimConfig, State
from shim.sandbox.service import SandboxService, register
from shim.sandbox.task_service import TaskService, register_tasks

__all__ = ["SHUTDOWN_TIMEOUT", "Assignment", "serve_forever", "serve_spare", "setup_logging"]

log = logging.getLogger("shim")

#: How long in-flight answers get to leave once the shim decided to exit (containerd: 3 s).
SHUTDOWN_TIMEOUT = 3.0


def setup_logging(debug: bool = False) -> None:
    """Log lines with a UTC timestamp to stderr (the bundle's log file for a detached shim)."""
    handler = logging.StreamHandler(sys.stderr)
    formatter = logging.Formatter("%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s[%(process)d]: %(message)s",
                                  "%Y-%m-%dT%H:%M:%S")
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else logging.INFO)


class Assignment(Record):
    """A spare shim's sandbox: its config, its bound and listening socket, and the descriptor
    that gets one byte once the shim serves."""

    __slots__ = ("config", "listener", "ready_fd")
    config: ShimConfig
    listener: socket.socket
    ready_fd: int | None

    def __init__(self, config: ShimConfig, listener: socket.socket, ready_fd: int | None) -> None:
        _set(self, "config", config)
        _set(self, "listener", listener)
        _set(self, "ready_fd", ready_fd)


def serve_forever(config: ShimConfig, listener: socket.socket, *, owns_socket: bool = True,
                  ready_fd: int | None = None, shutdown_on_signal: bool = False, recorded: bool = False) -> int:
    """Serve the sandbox on ``listener`` until ShutdownSandbox, SIGTERM or SIGINT. Returns 0.

    ``ready_fd``, when given, receives one byte once the server accepts, then is closed.
    ``owns_socket``: unlink the socket path on exit (not when systemd owns the socket).
    ``shutdown_on_signal``: SIGTERM/SIGINT shut the sandbox down as ShutdownSandbox would
    (systemd units); otherwise the pause is left running for a controller to reconnect or
    ``podshim delete``. ``recorded``: the spawner already wrote this shim's first state.json.
    """
    # A shim forked from the template would otherwise show up as "python3 ... template" in
    # ps; `pgrep -x podshim-shim` finds every shim, however it was started.
    set_process_name("podshim-shim")
    long_running()  # a shim exec'd by `podshim start` or systemd started with the collector off
    install_uvloop()
    with asyncio.Runner() as runner:
        return runner.run(_serve(lambda: _given(Assignment(config, listener, ready_fd)), owns_socket,
                                 shutdown_on_signal, recorded))


def serve_spare(assignment: Callable[[], Awaitable[Assignment | None]], standing_by: Callable[[], None]) -> int:
    """Serve as a spare shim: set up the event loop, the reaper, the server and a network
    namespace for a sandbox not yet known, call ``standing_by()`` once the shim can take one,
    then await ``assignment()`` and serve that sandbox as :func:`serve_forever` would (the
    state.json is the shim's own to write). Returns 0, also when ``assignment()`` gives None
    (retired before it was used)."""
    long_running()
    install_uvloop()
    with asyncio.Runner() as runner:
        return runner.run(_serve(assignment, True, False, False, standing_by=standing_by))


async def _given(assignment: Assignment) -> Assignment | None:
    return assignment


async def _serve(assignment: Callable[[], Awaitable[Assignment | None]], owns_socket: bool,
                 shutdown_on_signal: bool, recorded: bool, *, standing_by: Callable[[], None] | None = None) -> int:
    """The one serve path; ``standing_by`` is a spare's (see :func:`serve_spare`)."""
    loop = asyncio.get_running_loop()
    reaper = Reaper()
    reaper.install(loop)
    notifier = Notifier.from_env()
    server = Server()
    made_netns = None
    if standing_by is not None:
        standing_by()
        # Made after standing by: a Spawn that comes meanwhile waits for it in the socket, and
        # the template forks no later. A sandbox of the host network closes it unused.
        try:
            made_netns = netns.make_netns()
        except Exception as exc:  # CreateSandbox makes one then: only the head start is lost
            log.warning("cannot make a network namespace ahead: %s", exc)
    got = await assignment()
    if got is None:
        if made_netns is not None:
            os.close(made_netns)
        reaper.uninstall()
        notifier.close()
        return 0
    config, listener, ready_fd = got.config, got.listener, got.ready_fd
    if standing_by is not None:
        set_process_name("podshim-shim")
    events = EventBus(config.namespace, config.sandbox_id)
    sandbox = Sandbox(config, reaper, events, made_netns)
    done = asyncio.Event()
    why: list[str] = []

    def finish(reason: str) -> None:
        if not why:
            why.append(reason)
        done.set()

    sandbox.on_state_change = lambda st: notifier.send(f"STATUS=sandbox {config.sandbox_id} {st.value}")
    register(server, SandboxService(sandbox, events, on_shutdown=lambda: finish("ShutdownSandbox")))
    register_tasks(server, TaskService(sandbox))
    await server.start(listener)
    # Record the shim at once (unless its spawner did): a controller killed before
    # CreateSandbox still finds, through state.json, a shim that `podshim delete` can end.
    if not recorded:
        sandbox.persist()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, finish, signal.Signals(sig).name)
    # A detached shim has no terminal, but a hangup must never end it (the caller's session).
    loop.add_signal_handler(signal.SIGHUP, lambda: log.info("SIGHUP ignored"))
    log.info("serving sandbox %s/%s on %s", config.namespace, config.sandbox_id, config.socket_path)
    if ready_fd is not None:
        try:
            os.write(ready_fd, b"R")
        finally:
            os.close(ready_fd)
    notifier.send("READY=1", f"STATUS=serving {config.sandbox_id}", f"MAINPID={os.getpid()}")

    await done.wait()
    log.info("shutting down (%s)", why[0])
    notifier.send("STOPPING=1", f"STATUS=stopping ({why[0]})")
    if shutdown_on_signal and sandbox.state is not State.SHUTDOWN:
        try:
            await asyncio.wait_for(sandbox.shutdown(config.sandbox_id), SHUTDOWN_TIMEOUT * 4)
        except Exception:
            log.exception("shutting the sandbox down on %s failed", why[0])
    # The shutdown callbacks, in order, under one named timeout each.
    try:
        await asyncio.wait_for(server.aclose(SHUTDOWN_TIMEOUT), SHUTDOWN_TIMEOUT + 1)
    except asyncio.TimeoutError:
        log.error("server did not close within %.0fs", SHUTDOWN_TIMEOUT)
    if owns_socket:
        try:
            os.unlink(config.socket_path)
        except FileNotFoundError:
            pass
    listener.close()
    if sandbox.state is not State.SHUTDOWN:
        # SIGTERM/SIGINT: leave the pause running so a restarted controller can still
        # reconnect or `podshim delete`; just record that the shim is gone.
        log.info("leaving sandbox %s in state %s for `podshim delete`", config.sandbox_id, sandbox.state.value)
        sandbox.persist()
    reaper.uninstall()
    notifier.close()
    return 0
