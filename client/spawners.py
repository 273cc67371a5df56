"""Spawners: how the Controller starts a shim, cleans up after a dead one, and lets it go.

A spawner has three coroutines, mirroring containerd's shim binary actions:

- ``spawn(namespace, sandbox_id, bundle) -> Bootstrap``: start a shim for the sandbox and say
  where it listens (``podshim start``);
- ``delete(namespace, sandbox_id, bundle) -> ExitStatus``: kill what is left of a shim that
  died or cannot be reached and remove what it made (``podshim delete``); never raises, a
  failed delete reports exit status 255 and now;
- ``release(namespace, sandbox_id)``: called once a sandbox was shut down (a systemd spawner
  stops its unit here; the exec spawner has nothing to do).

:class:`ExecSpawner` runs the ``podshim`` binary as a helper process for each action.
"""

from __future__ import annotations

import abc
import logging
import os
import shutil
import subprocess
import sys
import time
from typing import Mapping, Sequence

import anyio

from shim.rpc.api import TEMPLATE_SERVICE, TEMPLATE_SOCKET, TEMPLATE_SOCKET_ENV
from shim.rpc.client import Client
from shim.rpc.files import decode_json
from shim.rpc.status import DeadlineExceeded, Internal, RpcError, Unavailable

from client.defaults import DEFAULT_RUNTIME_ROOT, DELETE_TIMEOUT, SPAWN_TIMEOUT, TEMPLATE_CONNECT_TIMEOUT
from client.results import UNKNOWN_EXIT_STATUS, Bootstrap, ExitStatus

__all__ = [
    "Spawner",
    "ExecSpawner",
    "default_command",
]

log = logging.getLogger(__name__)

#: How much of a helper's stderr goes into an error message.
_STDERR_CHARS = 2000


def default_command() -> list[str]:
    """The ``podshim`` command: the one installed beside this interpreter (same version as this
    client), else the first on $PATH, else ``python -m shim``."""
    beside = os.path.join(os.path.dirname(sys.executable), "podshim")
    if os.access(beside, os.X_OK):
        return [beside]
    found = shutil.which("podshim")
    if found:
        return [found]
    return [sys.executable, "-m", "shim"]


class Spawner(abc.ABC):
    """How shims are started and cleaned up; see the module docstring for the contract."""

    @abc.abstractmethod
    async def spawn(self, namespace: str, sandbox_id: str, bundle: str) -> Bootstrap:
        """Start a shim for the sandbox whose bundle directory is ``bundle``; return where it
        listens. Raises an RpcError when the shim could not be started."""

    @abc.abstractmethod
    async def delete(self, namespace: str, sandbox_id: str, bundle: str) -> ExitStatus:
        """Clean up after a shim that is dead or unreachable; return how the sandbox ended
        (255 and now when that cannot be told). Never raises."""

    async def release(self, namespace: str, sandbox_id: str) -> None:
        """Called after the sandbox was shut down and before its bundle is removed."""


class ExecSpawner(Spawner):
    """Runs ``podshim start|delete`` as helper processes.

    ``command`` is the podshim command as a list (or one path); default :func:`default_command`.
    ``runtime_root`` is passed as ``--runtime-root`` (shim sockets live in ``ROOT/s``).
    ``use_template``: ask the shim template of ``runtime_root`` first (``podshim template``),
    which forks a preloaded shim in milliseconds; without one, helpers are run.
    ``max_helpers`` bounds how many helpers run at once: a helper is a Python start-up, and
    fifty of them at once on two cores would each take longer than SPAWN_TIMEOUT; queued ones
    start their clock only when they run.
    """

    def __init__(self, command: Sequence[str] | str | None = None, runtime_root: str = DEFAULT_RUNTIME_ROOT, *,
                 env: Mapping[str, str] | None = None, max_helpers: int | None = None, use_template: bool = True):
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
        self.use_template = use_template
        self._helpers = anyio.CapacityLimiter(max_helpers or max(4, 2 * (os.cpu_count() or 1)))

    def _argv(self, action: str, namespace: str, sandbox_id: str, bundle: str) -> list[str]:
        return [*self.command, action, "--namespace", namespace, "--id", sandbox_id, "--bundle", bundle,
                "--runtime-root", self.runtime_root]

    async def _run(self, action: str, namespace: str, sandbox_id: str, bundle: str,
                   timeout: float) -> subprocess.CompletedProcess:
        argv = self._argv(action, namespace, sandbox_id, bundle)
        async with self._helpers:
            try:
                # Once started, a helper runs to its end or its own timeout, whoever cancels us:
                # `podshim start` killed between its fork and the shim's first state.json would
                # leave a shim that nothing records, so nothing could delete it. The caller's
                # cancellation takes effect right after.
                with anyio.CancelScope(shield=True), anyio.fail_after(timeout):
                    # A new session, as containerd's Setpgid: a Ctrl-C meant for the controller's
                    # terminal must not kill a helper half-way through starting a shim.
                    return await anyio.run_process(argv, stdin=subprocess.DEVNULL, check=False, cwd=bundle,
                                                   env=self.env, start_new_session=True)
            except TimeoutError:
                raise DeadlineExceeded(f"podshim {action} for {namespace}/{sandbox_id} did not finish "
                                       f"within {timeout:.0f}s") from None
            except OSError as exc:  # not the errno's code: a NOT_FOUND would read as "no such sandbox"
                raise Internal(f"cannot run {argv[0]!r} for podshim {action}: {exc.strerror or exc}") from None

    async def spawn(self, namespace: str, sandbox_id: str, bundle: str) -> Bootstrap:
        """Ask the runtime root's shim template for the shim when one answers (no process start
        at all); else run ``podshim start`` and parse the bootstrap JSON it prints.

        Raises DeadlineExceeded after SPAWN_TIMEOUT, Unavailable when the shim did not come up
        (exit 1), Internal for any other failure or output that is not bootstrap JSON; the
        message carries what the shim said on stderr.
        """
        if self.use_template:
            forked = await self._spawn_from_template(namespace, sandbox_id, bundle)
            if forked is not None:
                return forked
        done = await self._run("start", namespace, sandbox_id, bundle, SPAWN_TIMEOUT)
        if done.returncode != 0:
            said = _said(done.stderr)
            cls = Unavailable if done.returncode == 1 else Internal
            raise cls(f"podshim start for {namespace}/{sandbox_id} failed with exit status {done.returncode}"
                      + (f": {said}" if said else " and printed nothing on stderr"))
        lines = done.stdout.decode(errors="replace").strip().splitlines()
        return Bootstrap.from_json(lines[-1] if lines else "",
                                   source=f"the output of podshim start for {namespace}/{sandbox_id}")

    async def _spawn_from_template(self, namespace: str, sandbox_id: str, bundle: str) -> Bootstrap | None:
        """The template's Spawn, or None when no template answers (then we exec)."""
        path = os.environ.get(TEMPLATE_SOCKET_ENV) or os.path.join(self.runtime_root, TEMPLATE_SOCKET)
        if not os.path.exists(path):
            return None
        payload = {"namespace": namespace, "sandbox_id": sandbox_id, "bundle": bundle,
                   "runtime_root": self.runtime_root}
        try:
            # Shielded like a helper process: a Spawn cut short could leave a shim unrecorded.
            with anyio.CancelScope(shield=True), anyio.fail_after(SPAWN_TIMEOUT):
                async with await Client.connect("unix://" + path, timeout=TEMPLATE_CONNECT_TIMEOUT) as template:
                    doc = await template.call(TEMPLATE_SERVICE, "Spawn", payload, timeout=SPAWN_TIMEOUT)
        except Unavailable as exc:
            log.info("no shim template answers on %s (%s); starting podshim instead", path, exc.message)
            return None
        except TimeoutError:
            raise DeadlineExceeded(f"the shim template did not spawn {namespace}/{sandbox_id} "
                                   f"within {SPAWN_TIMEOUT:.0f}s") from None
        return Bootstrap.from_dict(doc, source=f"the shim template's answer for {namespace}/{sandbox_id}")

    async def delete(self, namespace: str, sandbox_id: str, bundle: str) -> ExitStatus:
        """Run ``podshim delete``; its exit status, or 255 and now when it fails (logged)."""
        try:
            done = await self._run("delete", namespace, sandbox_id, bundle, DELETE_TIMEOUT)
            if done.returncode != 0:
                raise Internal(f"exit status {done.returncode}: {_said(done.stderr)}")
            doc = decode_json(done.stdout, "its output")
            status, exited_at = doc["exit_status"], doc["exited_at"]
            if not isinstance(status, int) or not isinstance(exited_at, int):
                raise ValueError(f"unexpected output {doc!r:.200}")
            return ExitStatus(status, exited_at)
        except (RpcError, ValueError, KeyError, TypeError) as exc:
            log.warning("podshim delete for %s/%s failed (%s); reporting exit status %d",
                        namespace, sandbox_id, exc, UNKNOWN_EXIT_STATUS)
            return ExitStatus(UNKNOWN_EXIT_STATUS, time.time_ns())


def _said(stderr: bytes | None) -> str:
    text = (stderr or b"").decode(errors="replace").strip()
    return text[-_STDERR_CHARS:]
