"""The life and death of shims: what the Controller does when a connection is lost.

A lost connection is judged (containerd's cleanupAfterDeadShim): when the shim's process is gone
the sandbox is buried (``podshim delete``, the bundle removed, a tombstone kept with the exit
status); when it runs, the shim is *unreachable*, watched until its process exits and tried again
on the next call (revived). The ends of a sandbox live here too: discard (undo one that never came
to be), release and forget. :class:`Liveness` holds the Controller's state and these steps;
:mod:`client.controller.loading` and :mod:`client.controller.controller` build on it.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any

import anyio

from shim.api.names import SANDBOX_SERVICE
from shim.lib.processes import pidfd_exited, process_exiting
from shim.rpc.client import Client
from shim.rpc.status import DeadlineExceeded, NotFound, RpcError, Unavailable

from client import layouts
from client.controller.bundles import ShimProcess, remove_bundle
from client.controller.defaults import CONNECT_TIMEOUT, DISCARD_TIMEOUT, EXIT_GRACE
from client.controller.handle import ENDED, Phase, ShimHandle
from client.controller.nsmap import NSMap
from client.controller.results import UNKNOWN_EXIT_STATUS, ExitStatus, SandboxState
from client.controller.spawners import Spawner
from client.phases import phase

__all__ = ["Liveness", "close_quietly", "describe_error", "exits_soon", "remove_quietly", "unreachable_sentence"]

log = logging.getLogger("client.controller")


class Liveness:
    """The Controller's state, how it opens, and what it does when a shim's connection is lost."""

    state_root: str
    runtime_root: str
    spawner: Spawner
    read_only: bool
    sandboxes: NSMap[ShimHandle]
    unknown: dict[str, str]
    _tg: anyio.abc.TaskGroup | None
    _losses: Any  # the send side of the lost-connection queue, once open
    _closed: bool

    async def _open(self) -> None:
        if self._closed:
            raise Unavailable("the controller is closed")
        if self._tg is not None:
            return
        layouts.check(self.state_root, layouts.BUNDLE_ROOT)
        if not self.read_only:
            await self.spawner.open()
        self._losses, losses = anyio.create_memory_object_stream[tuple[ShimHandle, Client]](math.inf)
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        tg.start_soon(self._judge_losses, losses)

    def _attach(self, handle: ShimHandle, client: Client) -> None:
        handle.client = client
        client.on_close(lambda: self._on_closed(handle, client))

    def _go_live(self, handle: ShimHandle) -> None:
        handle.stop_watching()
        handle.unreachable_reason = ""
        handle.move(Phase.LIVE)
        # The connection may have dropped while the handle was not LIVE, when a close is not
        # reported: report it now or nobody would judge it.
        if handle.client is not None and handle.client.closed:
            self._on_closed(handle, handle.client)

    def _on_closed(self, handle: ShimHandle, client: Client) -> None:
        """A connection closed (on the loop, from the rpc client). If we did not close it, queue
        the judgement of whether the shim died. Calls in flight already failed with Unavailable."""
        if handle.closing or handle.client is not client or handle.phase is not Phase.LIVE:
            return
        try:
            self._losses.send_nowait((handle, client))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # the controller is closing

    async def _judge_losses(self, losses: Any) -> None:
        async with losses:
            async for handle, client in losses:
                assert self._tg is not None
                self._tg.start_soon(self._judge_loss, handle, client)

    async def _judge_loss(self, handle: ShimHandle, client: Client) -> None:
        """A LIVE shim's connection ``client`` was lost: bury the sandbox when the shim's process
        is gone or exiting (a killed process closes its sockets a moment before it is a zombie:
        wait for that, within EXIT_GRACE); otherwise it is UNREACHABLE and watched. Once per
        connection; a caller that comes second waits for the first. Never raises."""
        async with handle.reach_lock:
            if handle.client is not client or handle.phase is not Phase.LIVE or handle.closing:
                return  # judged already, or revived, or we closed it ourselves
            process = handle.process
            if process is None:
                # Nothing names the shim's process: a lost connection is all we can go by.
                await self._bury(handle)
                return
            pidfd = process.open_pidfd()
            try:
                gone = pidfd is None or await exits_soon(process, pidfd)
            except BaseException:
                close_quietly(pidfd)
                raise
            if gone or handle.phase is not Phase.LIVE or handle.closing:  # or shut down while we waited
                close_quietly(pidfd)
                if gone:
                    await self._bury(handle)
                return
            assert pidfd is not None  # not gone
            handle.client = None
            self._unreachable(handle, "runs but its connection was lost", pidfd)
        await client.aclose()

    def _unreachable(self, handle: ShimHandle, reason: str, pidfd: int) -> None:
        """Keep a shim whose process runs but does not answer: UNREACHABLE, with a task that
        buries it once its process exits (it owns ``pidfd``)."""
        log.warning("sandbox %s/%s: its shim (%s) %s; it is left running and tried again on the next call",
                    handle.namespace, handle.sandbox_id, handle.process, reason)
        handle.unreachable_reason = reason
        handle.move(Phase.UNREACHABLE)
        handle.stop_watching()
        handle.watch_scope = scope = anyio.CancelScope()
        assert self._tg is not None
        self._tg.start_soon(self._watch, handle, pidfd, scope)

    async def _watch(self, handle: ShimHandle, pidfd: int, scope: anyio.CancelScope) -> None:
        """Wait for an UNREACHABLE shim's process to exit, then bury the sandbox; until
        ``scope`` is cancelled (it answered again, was shut down, or the controller closes)."""
        try:
            with scope:
                await anyio.wait_readable(pidfd)
        finally:
            os.close(pidfd)
        if scope.cancel_called or handle.closing:
            return
        await self._bury(handle)

    async def _revive(self, handle: ShimHandle, timeout: float | None) -> None:
        """Try an UNREACHABLE shim again: connect and, if it never said it holds the sandbox,
        ask. It is LIVE again when it answers; DYING when its process turned out to be gone;
        GONE when it never got CreateSandbox (it is shut down). Raises Unavailable or
        DeadlineExceeded with a sentence when it still does not answer (it stays UNREACHABLE)."""
        async with handle.reach_lock:
            if handle.phase is not Phase.UNREACHABLE:
                return  # revived, buried or forgotten while we waited
            budget = CONNECT_TIMEOUT if timeout is None else min(timeout, CONNECT_TIMEOUT)
            client: Client | None = None
            reply: dict[str, Any] | None = None
            try:
                with anyio.fail_after(budget):
                    client = await Client.connect(handle.address, namespace=handle.namespace, timeout=budget)
                    if not handle.confirmed:
                        reply = await client.call(SANDBOX_SERVICE, "SandboxStatus",
                                                  {"sandbox_id": handle.sandbox_id}, timeout=budget)
            except (RpcError, TimeoutError) as exc:
                if client is not None:
                    await client.aclose()
                if isinstance(exc, NotFound):
                    with handle.hold_bundle() as held:
                        if not held:
                            raise Unavailable(f"sandbox {handle.sandbox_id} is being changed by another process; "
                                              "try again") from None
                        log.warning("sandbox %s/%s: its shim never got CreateSandbox; shutting it down",
                                    handle.namespace, handle.sandbox_id)
                        await self._discard(handle)
                    return
                if handle.process is not None:
                    pidfd = handle.process.open_pidfd()
                    try:
                        gone = pidfd is None or await exits_soon(handle.process, pidfd)
                    finally:
                        close_quietly(pidfd)
                    if gone:
                        await self._bury(handle)
                        return
                timed_out = isinstance(exc, (TimeoutError, DeadlineExceeded))
                why = f"did not answer within {budget:g}s" if timed_out else f"cannot be reached ({exc})"
                handle.unreachable_reason = f"runs but {why}"
                cls = DeadlineExceeded if timed_out else Unavailable
                raise cls(unreachable_sentence(handle)) from None
            log.info("sandbox %s/%s: its shim answers again", handle.namespace, handle.sandbox_id)
            self._attach(handle, client)
            if reply is not None:
                handle.remember(reply)
            self._go_live(handle)

    async def _bury(self, handle: ShimHandle) -> None:
        """The dead-shim cleanup, once per handle: ``podshim delete`` (kills what is left,
        removes netns, cgroup and socket), remove the bundle, keep a tombstone with the exit
        status. Concurrent callers wait for the first. Never raises."""
        if handle.phase in ENDED:
            await handle.dead.wait()
            return
        if handle.phase not in (Phase.LIVE, Phase.UNREACHABLE, Phase.PENDING):
            return
        handle.move(Phase.DYING)
        handle.stop_watching()
        exit_status = None
        with handle.hold_bundle() as held, anyio.CancelScope(shield=True):
            try:
                if handle.client is not None:
                    await handle.client.aclose()  # it is DYING now: this close is not reported again
                if self.read_only:
                    handle.uncleaned = True
                    log.warning("the shim of sandbox %s/%s is gone; left as it is (read-only: a Controller that "
                                "may change things cleans up after it)", handle.namespace, handle.sandbox_id)
                elif held:
                    log.warning("the shim of sandbox %s/%s is gone; cleaning up after it",
                                handle.namespace, handle.sandbox_id)
                    exit_status = await self.spawner.delete(handle.namespace, handle.sandbox_id, handle.bundle)
                    if exit_status.cleaned_up:
                        remove_quietly(handle.bundle)
                    else:
                        handle.cleanup_unfinished = True
                        log.warning("the cleanup after the shim of sandbox %s/%s did not finish; its bundle is "
                                    "kept, and shutting the sandbox down cleans up again",
                                    handle.namespace, handle.sandbox_id)
                else:
                    log.warning("the shim of sandbox %s/%s is gone; another process is cleaning up after it",
                                handle.namespace, handle.sandbox_id)
            except Exception:
                log.exception("cleanup after the shim of %s/%s failed", handle.namespace, handle.sandbox_id)
            finally:
                handle.exit = exit_status or ExitStatus(UNKNOWN_EXIT_STATUS, time.time_ns())
                handle.state = SandboxState.STOPPED
                handle.move(Phase.DEAD)
                handle.dead.set()

    async def _clean_again(self, handle: ShimHandle) -> None:
        """``podshim delete`` again for a dead shim whose first cleanup did not finish
        (:attr:`ShimHandle.cleanup_unfinished`). Raises Unavailable when it still does not: the
        sandbox is kept, for the next shutdown to try again."""
        exit_status = await self.spawner.delete(handle.namespace, handle.sandbox_id, handle.bundle)
        if not exit_status.cleaned_up:
            raise Unavailable(f"the cleanup after the dead shim of sandbox {handle.sandbox_id} in namespace "
                              f"{handle.namespace} did not finish (podshim delete failed: see the log); try again")
        handle.cleanup_unfinished = False
        if handle.exit is None or handle.exit.exit_status == UNKNOWN_EXIT_STATUS:
            handle.exit = exit_status

    async def _shutdown_shim(self, handle: ShimHandle, timeout: float) -> bool:
        """ShutdownSandbox and wait for the shim to close the connection; True when it went
        away cleanly. The connection is closed either way."""
        client = handle.client
        assert client is not None
        clean = False
        try:
            with phase("ShutdownSandbox call"):
                await client.call(SANDBOX_SERVICE, "ShutdownSandbox", {"sandbox_id": handle.sandbox_id},
                                  timeout=timeout)
        except RpcError as exc:
            # Unavailable/NotFound: already dead; DeadlineExceeded: hung. delete will see to it.
            log.debug("ShutdownSandbox %s/%s: %s", handle.namespace, handle.sandbox_id, exc)
        else:
            with anyio.move_on_after(timeout), phase("shim exit"):
                await client.wait_closed()
            clean = client.closed
        await client.aclose()
        return clean

    async def _discard(self, handle: ShimHandle) -> None:
        """Undo a sandbox that never came to be (a failed create, or a shim found alive on load
        that never got CreateSandbox): shut the shim down, `podshim delete`, remove the bundle,
        forget the id; a read-only controller only forgets it. Shielded from cancellation; never
        raises."""
        with anyio.CancelScope(shield=True):
            try:
                handle.closing = True
                if self.read_only:
                    if handle.client is not None:
                        await handle.client.aclose()
                    self._forget(handle)
                    return
                if handle.client is not None:
                    await self._shutdown_shim(handle, DISCARD_TIMEOUT)
                await self.spawner.delete(handle.namespace, handle.sandbox_id, handle.bundle)
                await self._release(handle)
            except Exception:
                log.exception("undoing sandbox %s/%s failed", handle.namespace, handle.sandbox_id)
                self._forget(handle)

    async def _release(self, handle: ShimHandle) -> None:
        """The end of every sandbox: the spawner's release, the bundle, the map entry."""
        try:
            with phase("release"):
                await self.spawner.release(handle.namespace, handle.sandbox_id)
        finally:
            with phase("bundle removal"):
                remove_quietly(handle.bundle)
            self._forget(handle)

    def _forget(self, handle: ShimHandle) -> None:
        handle.stop_watching()
        if handle.phase is not Phase.GONE:
            handle.move(Phase.GONE)
        handle.dead.set()  # nobody may wait forever on a sandbox that is gone
        self.sandboxes.delete(handle.namespace, handle.sandbox_id, handle)


def remove_quietly(path: str) -> None:
    """Remove a bundle; a failure is logged, not raised."""
    try:
        remove_bundle(path)
    except OSError as exc:
        log.error("cannot remove bundle %s: %s", path, exc)


def unreachable_sentence(handle: ShimHandle) -> str:
    """The sentence of a call on a shim that runs but does not answer."""
    return (f"the shim of sandbox {handle.sandbox_id} in namespace {handle.namespace} "
            f"({handle.process or 'pid unknown'}) {handle.unreachable_reason or 'does not answer'}; "
            "it is left running and tried again on the next call")


async def exits_soon(process: ShimProcess, pidfd: int) -> bool:
    """Whether the process behind ``pidfd`` has exited, or is on its way out and exits within
    EXIT_GRACE (a killed process closes its sockets a moment before it is a zombie)."""
    if pidfd_exited(pidfd):
        return True
    if not process_exiting(process.pid):
        return False
    with anyio.move_on_after(EXIT_GRACE):
        await anyio.wait_readable(pidfd)
        return True
    return False


def close_quietly(fd: int | None) -> None:
    """Close ``fd`` unless it is None."""
    if fd is not None:
        os.close(fd)


def describe_error(exc: BaseException) -> str:
    """An error as a log or status message says it."""
    if isinstance(exc, RpcError):
        return str(exc)
    if isinstance(exc, TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
