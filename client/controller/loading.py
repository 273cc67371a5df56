"""Loading: how the Controller finds its bundles and reconnects to their shims after a restart.

containerd's shim_load.go: every bundle under the state root that a Controller made is loaded
concurrently; its shim is reconnected (LIVE), kept UNREACHABLE when it runs but does not answer,
shut down when it never got CreateSandbox, or buried when its process is gone. A directory that
nothing proves a Controller made is left alone and listed in ``Controller.unknown``.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import anyio

from shim.api.names import SANDBOX_SERVICE
from shim.rpc.client import Client
from shim.rpc.status import DeadlineExceeded, InvalidArgument, NotFound, RpcError, error_from_oserror

from client import layouts
from client.controller.bundles import bundle_path, made_here, read_bootstrap, read_shim_process, scan
from client.controller.defaults import LOAD_TIMEOUT
from client.controller.handle import ShimHandle
from client.controller.liveness import Liveness, close_quietly, describe_error, exits_soon

__all__ = ["Loading"]

log = logging.getLogger("client.controller")


class Loading(Liveness):
    """The Controller's load: its bundles found, their shims reconnected."""

    async def load(self, namespace: str | None = None, sandbox_id: str | None = None) -> None:
        """Open the controller (first call) and reconnect to the shims of the state root: every
        bundle, one namespace's, or one sandbox's (``podshimctl`` loads only what it needs).

        Bundles already known are skipped, so calling it again is cheap. Shims are reconnected
        concurrently, each within LOAD_TIMEOUT: a shim whose sandbox exists is back in the map; a
        shim that never got CreateSandbox (we crashed in between) is shut down and forgotten; a
        shim whose process is gone (or whose bundle names none that answers) is cleaned up with
        ``podshim delete`` and kept as a tombstone (state "stopped" with the exit status delete
        found, 255 if unknown) until :meth:`shutdown`. A shim whose process runs but does not
        answer in time is kept, unreachable, and left alone. A bundle another process is
        changing right now is skipped.

        A directory that nothing proves a Controller made is left alone: logged at WARNING and
        kept in :attr:`unknown`, never loaded.

        Raises InvalidArgument for bad identifiers (``sandbox_id`` needs ``namespace``),
        FailedPrecondition when the root is marked as another layout (podshimd's state root),
        the OS error's status when the state root cannot be read.
        """
        await self._open()
        if sandbox_id is not None:
            if namespace is None:
                raise InvalidArgument("load: a sandbox id needs its namespace")
            path = bundle_path(self.state_root, namespace, sandbox_id)
            found = [(namespace, sandbox_id, path)] if os.path.isdir(path) else []
        else:
            try:
                found = scan(self.state_root, namespace, clean=not self.read_only)
            except OSError as exc:
                raise error_from_oserror(exc, f"cannot read state root {self.state_root}") from None
        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            for ns, sid, path in found:
                if self.sandboxes.find(ns, sid) is not None:
                    continue
                if not made_here(path):
                    self._leave_unknown(path)
                    continue
                handle = ShimHandle(ns, sid, path)
                self.sandboxes.add(ns, sid, handle)
                tg.start_soon(self._load_one, handle)
        if found:
            log.debug("loaded %d bundle(s) from %s in %.3fs", len(found), self.state_root, time.monotonic() - started)

    def _leave_unknown(self, path: str) -> None:
        why = (f"no {layouts.MARKER} of a bundle and no bootstrap.json of a podshim shim: nothing says a "
               "Controller made it")
        if path not in self.unknown:
            log.warning("leaving %s alone, unknown: %s (is %s really a bundle root?)", path, why, self.state_root)
        self.unknown[path] = why

    async def _load_one(self, handle: ShimHandle) -> None:
        with handle.hold_bundle() as held:
            if not held:
                log.warning("skipping %s: another process is changing it", handle.bundle)
                self._forget(handle)
                return
            try:
                await self._reconnect(handle)
            except Exception:
                log.exception("loading %s failed", handle.bundle)
            finally:
                if not handle.settled.is_set():  # failed or cancelled half-way: nobody may wait on it
                    self._forget(handle)

    async def _reconnect(self, handle: ShimHandle) -> None:
        """Load one bundle: reach its shim within LOAD_TIMEOUT and settle the handle (LIVE,
        UNREACHABLE, a tombstone, or forgotten when the shim never got CreateSandbox)."""
        ns, sid = handle.namespace, handle.sandbox_id
        try:
            boot = read_bootstrap(handle.bundle)
        except RpcError as exc:
            # No address: whatever runs could never be reached. state.json still names the
            # shim's processes for `podshim delete`.
            log.warning("sandbox %s/%s: cannot reach its shim (%s)", ns, sid, exc.message)
            await self._bury(handle)
            return
        handle.address, handle.version = boot.address, boot.version
        handle.process = read_shim_process(handle.bundle, boot)
        pidfd = None
        if handle.process is not None:
            pidfd = handle.process.open_pidfd()
            if pidfd is None:
                log.warning("sandbox %s/%s: its shim (%s) is gone", ns, sid, handle.process)
                await self._bury(handle)
                return
        try:
            try:
                reply = await self._first_status(handle)
            except (RpcError, TimeoutError, OSError) as exc:
                timed_out = isinstance(exc, (TimeoutError, DeadlineExceeded))
                why = f"did not answer within {LOAD_TIMEOUT:g}s" if timed_out else describe_error(exc)
                client, handle.client = handle.client, None
                if client is not None:
                    await client.aclose()
                if pidfd is None or handle.process is None or await exits_soon(handle.process, pidfd):
                    log.warning("sandbox %s/%s: cannot reach its shim (%s)", ns, sid, why)
                    await self._bury(handle)
                else:
                    self._unreachable(handle, f"runs but {why}" if timed_out else f"runs but cannot be reached ({why})",
                                      pidfd)
                    pidfd = None  # the watch owns it now
                return
        finally:
            close_quietly(pidfd)  # a LIVE shim's connection tells when it goes
        if reply is None:
            # Spawned but never created: the controller died between the two (containerd#6860).
            log.warning("sandbox %s/%s: its shim never got CreateSandbox; shutting it down", ns, sid)
            await self._discard(handle)
            return
        handle.remember(reply)
        self._go_live(handle)

    async def _first_status(self, handle: ShimHandle) -> dict[str, Any] | None:
        """Connect to a loaded shim and ask for its sandbox within LOAD_TIMEOUT; None when it
        never got CreateSandbox. Raises RpcError, TimeoutError, OSError."""
        with anyio.fail_after(LOAD_TIMEOUT):
            client = await Client.connect(handle.address, namespace=handle.namespace, timeout=LOAD_TIMEOUT)
            self._attach(handle, client)
            try:
                reply: dict[str, Any] = await client.call(SANDBOX_SERVICE, "SandboxStatus",
                                                          {"sandbox_id": handle.sandbox_id}, timeout=LOAD_TIMEOUT)
                return reply
            except NotFound:
                return None
