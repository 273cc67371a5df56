"""The exec spawner: shims forked from the runtime root's shim template, or exec'd.

:class:`ExecSpawner` forks shims from the runtime root's shim template, starting the template
when none answers, and runs the ``podshim`` binary as a helper process for everything else.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from shim.api.names import TEMPLATE_ENV, TEMPLATE_SERVICE, TEMPLATE_SOCKET, TEMPLATE_SOCKET_ENV
from shim.lib.files import decode_json
from shim.rpc import blocking
from shim.rpc.client import Client
from shim.rpc.status import DeadlineExceeded, FailedPrecondition, Internal, InvalidArgument, RpcError, Unavailable

from client.controller.defaults import (
    DEFAULT_RUNTIME_ROOT,
    DELETE_TIMEOUT,
    SPAWN_THREADS,
    SPAWN_TIMEOUT,
    TEMPLATE_CONNECT_TIMEOUT,
    TEMPLATE_SPAWNS_AT_ONCE,
    TEMPLATE_START_TIMEOUT,
)
from client.controller.results import UNKNOWN_EXIT_STATUS, Bootstrap, ExitStatus
from client.controller.spawners.base import Spawner, stderr_tail

__all__ = [
    "ExecSpawner",
    "default_command",
    "template_wanted",
]

log = logging.getLogger(__name__)

_YES, _NO = ("1", "yes", "true", "on"), ("0", "no", "false", "off")


def default_command() -> list[str]:
    """The ``podshim`` command: this interpreter running the ``shim`` package this process
    imported (same code as this client), without site-packages' start-up hooks (see
    :func:`shim.lib.program.podshim_argv`)."""
    from shim.lib.program import podshim_argv

    return podshim_argv()


def template_wanted(value: bool | None = None) -> bool:
    """Whether shims come from a template: ``value`` when given, else $PODSHIM_TEMPLATE (yes or
    no), else yes. Raises InvalidArgument for a value of $PODSHIM_TEMPLATE it cannot read."""
    if value is not None:
        return bool(value)
    text = os.environ.get(TEMPLATE_ENV, "").strip().lower()
    if text in ("", *_YES):
        return True
    if text in _NO:
        return False
    raise InvalidArgument(f"${TEMPLATE_ENV} is {text!r}: write 1 (use a shim template, the default) or 0 "
                          "(exec every shim)")


class _NoTemplate(Exception):
    """No template answers on the runtime root's control socket, or the one there is leaving."""


class ExecSpawner(Spawner):
    """Forks shims from the runtime root's shim template; runs ``podshim start|delete`` as
    helper processes for the rest.

    ``command`` is the podshim command as a list (or one path); default :func:`default_command`.
    ``runtime_root`` is passed as ``--runtime-root`` (shim sockets live in ``ROOT/s``).
    ``use_template`` (default :func:`template_wanted`): ask the template on ``ROOT/template.sock``
    (or on $PODSHIM_TEMPLATE_SOCKET) for each shim, which forks a preloaded shim in milliseconds.
    When none answers on the runtime root's own socket, the spawner starts one
    (``podshim template --detach``): detached, it outlives this spawner and serves every later
    Controller and podshimctl on that runtime root, and one that runs code older than what is
    installed is replaced. Only when a template cannot be started are shims exec'd
    (``podshim start``; logged once). With ``use_template=False`` every shim is exec'd.
    ``max_helpers`` bounds how many helpers run at once: a helper is a Python start-up, and
    fifty of them at once on two cores would each take longer than SPAWN_TIMEOUT; queued ones
    start their clock only when they run. So do Spawns asked of a template beyond
    TEMPLATE_SPAWNS_AT_ONCE: they wait here, not in the template's queue.
    """

    def __init__(self, command: Sequence[str] | str | None = None, runtime_root: str = DEFAULT_RUNTIME_ROOT, *,
                 env: Mapping[str, str] | None = None, max_helpers: int | None = None,
                 use_template: bool | None = None):
        if command is None:
            command = default_command()
        elif isinstance(command, str):
            command = [command]
        if not command:
            raise ValueError("command must not be empty")
        if not os.path.isabs(runtime_root):
            raise ValueError(f"runtime root {runtime_root!r} must be an absolute path")
        self.command = list(command)
        self.runtime_root = os.path.normpath(runtime_root)
        self.env = dict(env) if env is not None else None
        self.use_template = template_wanted(use_template)
        self._helpers = anyio.CapacityLimiter(max_helpers or max(4, 2 * (os.cpu_count() or 1)))
        # Spawns in the template at once, taken and let go in the threads that ask it (so a slot is
        # free as soon as the template answered, not once this process's loop got round to it), and
        # the threads those Spawns (and the ones waiting for a slot) run in.
        self._spawns = threading.BoundedSemaphore(TEMPLATE_SPAWNS_AT_ONCE)
        self._spawn_threads = anyio.CapacityLimiter(SPAWN_THREADS)
        self._starting = anyio.Lock()  # one template start at a time from this spawner
        self._starts = 0  # templates this spawner started (or found) under that lock
        self._cannot_start: str | None = None  # why starting a template failed, once it did

    def _argv(self, action: str, namespace: str, sandbox_id: str, bundle: str) -> list[str]:
        return [*self.command, action, "--namespace", namespace, "--id", sandbox_id, "--bundle", bundle,
                "--runtime-root", self.runtime_root]

    async def _run(self, argv: list[str], what: str, cwd: str, timeout: float, *,
                   shield: bool = True) -> subprocess.CompletedProcess[bytes]:
        async with self._helpers:
            try:
                # Once started, a helper runs to its end or its own timeout, whoever cancels us:
                # `podshim start` killed between its fork and the shim's first state.json would
                # leave a shim that nothing records, so nothing could delete it. The caller's
                # cancellation takes effect right after.
                with anyio.CancelScope(shield=shield), anyio.fail_after(timeout):
                    # A new session, as containerd's Setpgid: a Ctrl-C meant for the controller's
                    # terminal must not kill a helper half-way through starting a shim.
                    return await anyio.run_process(argv, stdin=subprocess.DEVNULL, check=False, cwd=cwd,
                                                   env=self.env, start_new_session=True)
                raise AssertionError("a shielded scope swallowed the helper's end")  # neither scope can
            except TimeoutError:
                raise DeadlineExceeded(f"podshim {what} did not finish within {timeout:.0f}s") from None
            except OSError as exc:  # not the errno's code: a NOT_FOUND would read as "no such sandbox"
                raise Internal(f"cannot run {argv[0]!r} for podshim {what}: {exc.strerror or exc}") from None

    async def spawn(self, namespace: str, sandbox_id: str, bundle: str) -> Bootstrap:
        """Fork the shim from the template (starting one if none answers) unless the spawner
        does not use one; else run ``podshim start`` and parse the bootstrap JSON it prints.

        Raises DeadlineExceeded after SPAWN_TIMEOUT, Unavailable when the shim did not come up
        (exit 1), Internal for any other failure or output that is not bootstrap JSON; the
        message carries what the shim said on stderr.
        """
        if self.use_template:
            forked = await self._spawn_from_template(namespace, sandbox_id, bundle)
            if forked is not None:
                return forked
        # The template was asked already (or is not wanted): `start` must not ask it again.
        argv = [*self._argv("start", namespace, sandbox_id, bundle), "--no-template"]
        done = await self._run(argv, f"start for {namespace}/{sandbox_id}", bundle, SPAWN_TIMEOUT)
        if done.returncode != 0:
            said = stderr_tail(done.stderr)
            cls = Unavailable if done.returncode == 1 else Internal
            raise cls(f"podshim start for {namespace}/{sandbox_id} failed with exit status {done.returncode}"
                      + (f": {said}" if said else " and printed nothing on stderr"))
        lines = done.stdout.decode(errors="replace").strip().splitlines()
        return Bootstrap.from_json(lines[-1] if lines else "",
                                   source=f"the output of podshim start for {namespace}/{sandbox_id}")

    async def open(self) -> None:
        """Make this process a user of the runtime root's template if one runs (a Ping: the
        template stays while its users run, protocol.md 7.5), without starting one."""
        if not self.use_template:
            return
        path, _ = self._template_socket()
        if not os.path.exists(path):
            return
        try:
            with anyio.fail_after(TEMPLATE_CONNECT_TIMEOUT):
                async with await Client.connect("unix://" + path, timeout=TEMPLATE_CONNECT_TIMEOUT) as template:
                    await template.call(TEMPLATE_SERVICE, "Ping", {}, timeout=TEMPLATE_CONNECT_TIMEOUT)
        except (RpcError, TimeoutError, OSError) as exc:
            log.debug("no shim template answers on %s (%s); one is started with the first shim", path, exc)

    def _template_socket(self) -> tuple[str, bool]:
        """The template to ask, and whether it is the runtime root's own (which we may start)."""
        own = os.path.join(self.runtime_root, TEMPLATE_SOCKET)
        path = os.environ.get(TEMPLATE_SOCKET_ENV) or own
        return path, os.path.normpath(path) == own

    async def _spawn_from_template(self, namespace: str, sandbox_id: str, bundle: str) -> Bootstrap | None:
        """The template's Spawn, starting the runtime root's template when none answers (or the
        one there is leaving, its code out of date); None when no template can be had (then we
        exec)."""
        path, own = self._template_socket()
        for _ in range(3):  # the template may be replaced under us once more: then we exec
            try:
                return await self._ask_template(path, namespace, sandbox_id, bundle)
            except _NoTemplate as why:
                if not own or self._cannot_start is not None:
                    log.debug("no shim template for %s/%s (%s); exec'ing its shim", namespace, sandbox_id, why)
                    return None
                starts = self._starts
                async with self._starting:
                    if self._cannot_start is not None:
                        return None
                    if starts == self._starts:  # nobody started one while we waited for the lock
                        if not await self._start_template(why):
                            return None
                        self._starts += 1
        return None

    async def _ask_template(self, path: str, namespace: str, sandbox_id: str, bundle: str) -> Bootstrap | None:
        """One Spawn. Raises _NoTemplate when nothing accepts on ``path`` or the template there
        says it is leaving; None when the template failed otherwise (then we exec)."""
        payload = {"namespace": namespace, "sandbox_id": sandbox_id, "bundle": bundle,
                   "runtime_root": self.runtime_root}
        return await self._spawn_in_template(path, namespace, sandbox_id, payload)

    async def _spawn_in_template(self, path: str, namespace: str, sandbox_id: str,
                                 payload: dict[str, str]) -> Bootstrap | None:
        # A blocking call in a worker thread, not a call on the event loop: the template serves
        # one connection at a time, so every Spawn would otherwise wait for this process's loop
        # to get round to sending the request and closing the connection (on a busy daemon, most
        # of the template's time). Shielded like a helper process: a Spawn cut short could leave
        # a shim unrecorded.
        def ask() -> Any:
            with self._spawns:  # SPAWN_TIMEOUT is the template's time on a Spawn, not its queue's
                return blocking.call("unix://" + path, TEMPLATE_SERVICE, "Spawn", payload, timeout=SPAWN_TIMEOUT,
                                     connect_timeout=TEMPLATE_CONNECT_TIMEOUT)

        try:
            # In threads of its own, not queued behind the store's work in anyio's shared ones.
            with anyio.CancelScope(shield=True):
                doc = await anyio.to_thread.run_sync(ask, limiter=self._spawn_threads)
        except blocking.NotServed as exc:
            raise _NoTemplate(exc.message) from None
        except FailedPrecondition as exc:  # its code is out of date: it removed its socket and exits
            raise _NoTemplate(exc.message) from None
        except blocking.NoAnswer:
            raise DeadlineExceeded(f"the shim template did not spawn {namespace}/{sandbox_id} "
                                   f"within {SPAWN_TIMEOUT:.0f}s") from None
        except Unavailable as exc:
            log.info("the shim template on %s did not spawn %s/%s (%s); starting podshim instead",
                     path, namespace, sandbox_id, exc.message)
            return None
        return Bootstrap.from_dict(doc, source=f"the shim template's answer for {namespace}/{sandbox_id}")

    async def _start_template(self, why: _NoTemplate) -> bool:
        """``podshim template --detach``: True once a template serves the runtime root (ours, or
        one another process started meanwhile). False when none can be started: logged once,
        and from then on this spawner execs its shims (it still uses a template that answers)."""
        argv = [*self.command, "template", "--detach", "--runtime-root", self.runtime_root]
        try:
            done = await self._run(argv, "template --detach", "/", TEMPLATE_START_TIMEOUT, shield=False)
            if done.returncode != 0:
                said = stderr_tail(done.stderr)
                raise Internal(f"exit status {done.returncode}" + (f": {said}" if said else ""))
            started = decode_json(done.stdout, "the output of podshim template --detach")
        except (RpcError, ValueError, IndexError) as exc:
            self._cannot_start = str(exc)
            log.warning("cannot start a shim template on %s (%s); its shims are exec'd instead (podshim start: a "
                        "Python start-up each)", self.runtime_root, exc)
            return False
        if started.get("started"):
            # Why none answered (nothing there yet, or one that left after an upgrade) is the normal
            # course of things: at INFO it read like an error on every fresh start.
            log.info("started the shim template of %s (pid %s)", self.runtime_root, started.get("pid"))
            log.debug("no shim template answered on %s before: %s", self.runtime_root, why)
        return True

    async def delete(self, namespace: str, sandbox_id: str, bundle: str) -> ExitStatus:
        """Run ``podshim delete``; its exit status, or 255 and now when it fails (logged)."""
        try:
            done = await self._run(self._argv("delete", namespace, sandbox_id, bundle),
                                   f"delete for {namespace}/{sandbox_id}", bundle, DELETE_TIMEOUT)
            if done.returncode != 0:
                raise Internal(f"exit status {done.returncode}: {stderr_tail(done.stderr)}")
            doc = decode_json(done.stdout, "its output")
            status, exited_at = doc["exit_status"], doc["exited_at"]
            if not isinstance(status, int) or not isinstance(exited_at, int):
                raise ValueError(f"unexpected output {doc!r:.200}")
            return ExitStatus(status, exited_at)
        except (RpcError, ValueError, KeyError, TypeError) as exc:
            log.warning("podshim delete for %s/%s failed (%s); reporting exit status %d",
                        namespace, sandbox_id, exc, UNKNOWN_EXIT_STATUS)
            return ExitStatus(UNKNOWN_EXIT_STATUS, time.time_ns(), cleaned_up=False)
