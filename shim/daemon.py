"""The shim's serve loop: signals, the server, readiness, and an orderly shutdown.

``_Shim.serve`` is the one serve path every shim takes: through ``serve_forever`` when
``podshim start`` forked it, ``podshim serve`` runs it in the foreground for systemd or a
template forked it on the spot, and through ``serve_when_assigned`` when it was a template's spare.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from shim.kernel.linux import release_zero_pages, set_process_name
from shim.kernel.reaper import Reaper
from shim.lib.files import unlink_quietly
from shim.lib.notify import Notifier
from shim.lib.program import long_running
from shim.rpc.channel import install_uvloop
from shim.rpc.server import Server
from shim.sandbox.config import ShimConfig
from shim.sandbox.events import EventBus
from shim.sandbox.sandbox import Sandbox, State
from shim.sandbox.service import SandboxService, register
from shim.sandbox.task_service import TaskService, register_tasks

if TYPE_CHECKING:
    from shim.containerd.events import Publisher

__all__ = ["SHUTDOWN_TIMEOUT", "SpareChannel", "serve_forever", "serve_when_assigned"]

log = logging.getLogger("shim")

#: How long in-flight answers get to leave once the shim decided to exit (containerd: 3 s).
SHUTDOWN_TIMEOUT = 3.0
#: Why the shim ends when a call (ShutdownSandbox, or containerd's Task Shutdown) asked it to.
SHUTDOWN_CALL = "ShutdownSandbox"
#: How long a shim started by containerd waits at exit for containerd to take its queued events.
EVENTS_FLUSH_TIMEOUT = 3.0
#: A loop object this big holds its read buffer (uvloop's): see _release_read_buffer.
_BIG_LOOP = 64 * 1024


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

    async def main() -> int:
        return await _Shim(_Base(), config, None).serve(listener, owns_socket, ready_fd, shutdown_on_signal, recorded)

    return _run(main)


class SpareChannel(Protocol):
    """How a spare shim learns its sandbox, in two steps (see :func:`serve_when_assigned`)."""

    async def config(self) -> ShimConfig | None:
        """Its sandbox's config; None when retired (it exits)."""

    async def listener(self) -> socket.socket | None:
        """Its bound socket, once its first state.json is written and its bundle is made, with
        stdio moved to the bundle's log; None when it is not to serve (a live shim serves the
        socket already, the bundle or the socket could not be made, the template died): it exits."""


def serve_when_assigned(channel: SpareChannel, made_netns: int | None) -> int:
    """A spare shim: run the event loop and install the reaper before the sandbox is known; then
    make the shim's pieces for ``channel.config()`` (the sandbox, its services, the signal
    handlers) while the template binds the socket and writes state.json, and serve
    ``channel.listener()`` as :func:`serve_forever` does. 0 at once when either is None, or when
    SIGTERM or SIGINT comes before the socket.
    ``made_netns``: a network namespace made ahead (:func:`shim.kernel.netns.make_netns`), which
    CreateSandbox pins if the sandbox wants a new one (:class:`Sandbox`'s ``made_netns``)."""

    async def main() -> int:
        base = _Base()  # what does not depend on the sandbox, made while nobody waits
        try:
            config = await channel.config()
            if config is None:
                base.close()
                return 0
            set_process_name("podshim-shim")
            shim = _Shim(base, config, made_netns)
            listener = await _socket_unless_signalled(channel, shim)
        except BaseException:
            base.close()
            raise
        if listener is None:
            shim.close()
            base.close()
            return 0
        return await shim.serve(listener, True, None, False, True)

    return _run(main)


async def _socket_unless_signalled(channel: SpareChannel, shim: _Shim) -> socket.socket | None:
    """``channel.listener()``, or None once SIGTERM or SIGINT came first: a spare without its
    socket serves nobody yet, so a signal ends it at once, as it ends one not yet told its
    sandbox (the template's hand-off then fails, and it forks the shim on the spot)."""
    task = asyncio.current_task()
    assert task is not None
    shim.waiting = task
    try:
        return await channel.listener()
    except asyncio.CancelledError:
        if not shim.why:  # not a signal's doing
            raise
        task.uncancel()
        return None
    finally:
        shim.waiting = None


def _run(main: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """Run ``main()`` on a new event loop (uvloop's when installed) in a process that goes on
    running: a shim exec'd by `podshim start` or systemd, or forked, started with the collector off."""
    long_running()
    install_uvloop()
    with asyncio.Runner() as runner:
        return runner.run(main())


def _release_read_buffer(loop: asyncio.AbstractEventLoop) -> None:
    """uvloop's loop holds the buffer every read goes through (250 kB) in the object itself, made
    zeroed, so a new loop has written all of it: give those pages back until a read needs them (a
    shim's reads are small, and touch a page or two of it). Nothing for a loop whose object is small."""
    size = type(loop).__basicsize__
    if size >= _BIG_LOOP:
        release_zero_pages(id(loop), size)


class _Base:
    """A shim's pieces that do not depend on its sandbox: the installed reaper and the notifier."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        _release_read_buffer(loop)
        self.reaper = Reaper()
        self.reaper.install(loop)
        self.notifier = Notifier.from_env()

    def close(self) -> None:
        self.reaper.uninstall()
        self.notifier.close()


class _Shim:
    """One sandbox's shim before it serves: its sandbox, services and signal handlers, made for
    ``config`` (a spare makes them while the template binds its socket, see
    :func:`serve_when_assigned`); :meth:`serve` starts serving on the bound socket."""

    def __init__(self, base: _Base, config: ShimConfig, made_netns: int | None) -> None:
        loop = asyncio.get_running_loop()
        self.base, self.config = base, config
        self.events = EventBus(config.namespace, config.sandbox_id)
        self.sandbox = Sandbox(config, base.reaper, self.events, made_netns)
        self.done = asyncio.Event()
        self.why: list[str] = []
        self.waiting: asyncio.Task[Any] | None = None  # a spare's wait for its socket, which a signal ends
        notifier = base.notifier
        self.sandbox.on_state_change = lambda st: notifier.send(f"STATUS=sandbox {config.sandbox_id} {st.value}")
        self.server = Server()
        service = SandboxService(self.sandbox, self.events, on_shutdown=lambda: self.finish(SHUTDOWN_CALL))
        tasks = TaskService(self.sandbox)
        register(self.server, service)
        register_tasks(self.server, tasks)
        self.publisher: Publisher | None = None
        if config.containerd_address is not None:  # started by containerd: its services too
            from shim.containerd.services import register_containerd

            self.publisher = register_containerd(self.server, service, tasks)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.finish, signal.Signals(sig).name)
        # A detached shim has no terminal, but a hangup must never end it (the caller's session).
        loop.add_signal_handler(signal.SIGHUP, lambda: log.info("SIGHUP ignored"))

    def finish(self, reason: str) -> None:
        if not self.why:
            self.why.append(reason)
        self.done.set()
        if self.waiting is not None:
            self.waiting.cancel()

    def close(self) -> None:
        """Drop what :meth:`serve` was never called for (a spare that is not to serve)."""
        self.sandbox.close()

    async def _close_server(self) -> None:
        """Stop accepting and close every connection, in-flight answers given SHUTDOWN_TIMEOUT.
        After ShutdownSandbox, containerd closes its connections itself (Server.aclose)."""
        asked = self.why[:1] == [SHUTDOWN_CALL]
        try:
            await asyncio.wait_for(self.server.aclose(SHUTDOWN_TIMEOUT, protobuf_peers_close=asked),
                                   SHUTDOWN_TIMEOUT + 1)
        except TimeoutError:
            log.error("server did not close within %.0fs", SHUTDOWN_TIMEOUT)

    async def serve(self, listener: socket.socket, owns_socket: bool, ready_fd: int | None,
                    shutdown_on_signal: bool, recorded: bool) -> int:
        """Serve on ``listener`` until ShutdownSandbox, SIGTERM or SIGINT (see :func:`serve_forever`)."""
        config, sandbox, server, notifier, why = self.config, self.sandbox, self.server, self.base.notifier, self.why
        await server.start(listener)
        # Record the shim at once (unless its spawner did): a controller killed before
        # CreateSandbox still finds, through state.json, a shim that `podshim delete` can end.
        if not recorded:
            sandbox.persist()
        log.info("serving sandbox %s/%s on %s", config.namespace, config.sandbox_id, config.socket_path)
        if ready_fd is not None:
            try:
                os.write(ready_fd, b"R")
            finally:
                os.close(ready_fd)
        notifier.send("READY=1", f"STATUS=serving {config.sandbox_id}", f"MAINPID={os.getpid()}")

        await self.done.wait()
        log.info("shutting down (%s)", why[0])
        notifier.send("STOPPING=1", f"STATUS=stopping ({why[0]})")
        if shutdown_on_signal and sandbox.state is not State.SHUTDOWN:
            try:
                await asyncio.wait_for(sandbox.shutdown(config.sandbox_id), SHUTDOWN_TIMEOUT * 4)
            except Exception:
                log.exception("shutting the sandbox down on %s failed", why[0])
        if owns_socket:
            # While we still listen, the path is ours (a Spawn of the same sandbox finds us
            # serving and binds nothing); once we stopped, it may already be another shim's.
            unlink_quietly(config.socket_path)
        await self._close_server()
        listener.close()
        if self.publisher is not None:  # the last exits and deletes, which containerd may still wait for
            await self.publisher.aclose(EVENTS_FLUSH_TIMEOUT)
        if sandbox.state is not State.SHUTDOWN:
            # SIGTERM/SIGINT: leave the pause running so a restarted controller can still
            # reconnect or `podshim delete`; just record that the shim is gone.
            log.info("leaving sandbox %s in state %s for `podshim delete`", config.sandbox_id, sandbox.state.value)
            sandbox.persist()
        sandbox.close()
        self.base.close()
        return 0
