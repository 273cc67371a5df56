"""SystemdSpawner: every shim is a systemd unit, ``podshim@NAMESPACE:SANDBOX_ID.service``.

systemd then owns the shim's process: it starts it (``podshim serve``, Type=notify, so a start
returns once the shim serves), puts it and its whole sandbox in the unit's cgroup, logs it to
the journal, and a ``systemctl stop`` shuts the sandbox down. The units are in ``systemd/``.

- ``spawn``: when the socket path of ``podshim@.socket`` fits in sun_path, start the *socket*
  and return its address: the shim starts on the first connection (normally the Controller's,
  at once). Otherwise start the *service* and return what the shim wrote to bootstrap.json.
  Either way the bundle's bootstrap.json names the address, so a restarted Controller
  reconnects exactly as with :class:`~client.controller.spawners.ExecSpawner`.
- ``delete``: the shim is dead (or was shut down and does not answer): stop the socket (no new
  shim), SIGKILL the shim, stop the service (its ExecStopPost runs ``podshim delete``), run
  ``podshim delete`` here too for the exit status, and ``reset-failed`` both units.
- ``release``: the sandbox was shut down: stop both units and reset them.

The shims' environment (state root, runtime root, PATH) is written to ``env_file``
(``RUNTIME_ROOT/systemd.env``), which the service reads at every start: one environment per
runtime root, so every SystemdSpawner of a runtime root must agree on it (the last one to spawn
wins). The units in ``systemd/`` read ``/run/podshim/systemd.env`` and listen in
``/run/podshim/u``: they serve the default runtime root. A SystemdSpawner of another runtime root
writes its own ``ROOT/systemd.env`` (never the default root's) and starts services without their
socket unless told otherwise; units for it must name ``ROOT/systemd.env`` and ``ROOT/u``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence

import anyio

from shim.api.identifiers import validate_identifier
from shim.lib.files import ensure_private_dir, write_atomic
from shim.rpc.status import (
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    NotFound,
    RpcError,
    Unavailable,
    error_from_oserror,
)

from client.controller.bundles import read_bootstrap
from client.controller.defaults import DEFAULT_BUNDLE_ROOT, DEFAULT_RUNTIME_ROOT, SPAWN_TIMEOUT, UNIT_STOP_TIMEOUT
from client.controller.results import BOOTSTRAP_FILE, BOOTSTRAP_VERSION, PROTOCOL, Bootstrap, ExitStatus
from client.controller.spawners.base import Spawner, stderr_tail
from client.controller.spawners.exec import ExecSpawner

__all__ = [
    "ENV_FILE_NAME",
    "SOCKET_DIR_NAME",
    "SystemdSpawner",
    "activation_socket_path",
    "env_file_path",
    "instance_name",
    "unit_names",
]

log = logging.getLogger(__name__)

#: The file podshim@.service reads with EnvironmentFile=, in the runtime root.
ENV_FILE_NAME = "systemd.env"
#: podshim@.socket's ListenStream= directory in the runtime root: ``ROOT/u/NAMESPACE:SANDBOX_ID.sock``.
SOCKET_DIR_NAME = "u"
#: systemd's UNIT_NAME_MAX (a name is at most this minus one bytes).
_UNIT_NAME_MAX = 256
#: sizeof(sockaddr_un.sun_path), NUL included.
_SUN_PATH_MAX = 108
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def instance_name(namespace: str, sandbox_id: str) -> str:
    """The unit instance of a sandbox, ``NAMESPACE:SANDBOX_ID`` as ``systemd-escape`` writes it.

    Identifiers hold letters, digits, '.', '_' and '-'; only '-' needs escaping (``\\x2d``),
    because systemd's %I turns a plain '-' into '/'. Raises InvalidArgument for a bad identifier.
    """
    validate_identifier("namespace", namespace)
    validate_identifier("sandbox id", sandbox_id)
    return f"{namespace}:{sandbox_id}".replace("-", "\\x2d")


def unit_names(namespace: str, sandbox_id: str) -> tuple[str, str]:
    """``(service, socket)`` unit names of a sandbox. Raises InvalidArgument for a bad identifier
    or a name longer than systemd allows (many '-' in long identifiers)."""
    instance = instance_name(namespace, sandbox_id)
    service, socket = f"podshim@{instance}.service", f"podshim@{instance}.socket"
    if len(service) >= _UNIT_NAME_MAX:
        raise InvalidArgument(f"the unit name of sandbox {namespace}/{sandbox_id} would be {len(service)} characters; "
                              f"systemd allows {_UNIT_NAME_MAX - 1} ('-' counts 4 once escaped)")
    return service, socket


def env_file_path(runtime_root: str = DEFAULT_RUNTIME_ROOT) -> str:
    """The environment file of the units serving ``runtime_root``: ``ROOT/systemd.env``."""
    return os.path.join(os.path.normpath(runtime_root), ENV_FILE_NAME)


def activation_socket_path(namespace: str, sandbox_id: str, runtime_root: str = DEFAULT_RUNTIME_ROOT) -> str | None:
    """Where podshim@.socket listens for the sandbox (``ROOT/u/NAMESPACE:SANDBOX_ID.sock``), or
    None when that path is too long for a Unix socket (then the service is started alone and
    binds its short hashed path)."""
    path = os.path.join(os.path.normpath(runtime_root), SOCKET_DIR_NAME, f"{namespace}:{sandbox_id}.sock")
    return path if len(path.encode()) < _SUN_PATH_MAX else None


class SystemdSpawner(Spawner):
    """Starts shims as ``podshim@.service`` units; see the module docstring for each action.

    ``state_root`` and ``runtime_root`` are the Controller's: bundles must be
    ``STATE_ROOT/NAMESPACE/SANDBOX_ID``, where the unit's shim looks for them.
    ``systemctl`` is the command as a list, e.g. ``["systemctl", "--user"]`` or
    ``["nsenter", "-t", PID, "-a", "systemctl"]``. ``env`` adds to (or overrides) the shims'
    environment: PODSHIM_STATE_ROOT, PODSHIM_RUNTIME_ROOT and, when a podshim is installed
    beside this interpreter, a PATH that finds it first (the shims then run this client's
    version). ``env_file`` is where that environment is written (default
    :func:`env_file_path` of the runtime root). ``socket_activation``: start the sandbox's socket
    unit, listening in ``RUNTIME_ROOT/u``; the default is on for the default runtime root, where
    the units of ``systemd/`` listen, and off for any other (the service is started alone).
    ``podshim`` is the command that runs ``podshim delete`` (default: as ExecSpawner finds it).
    """

    def __init__(self, state_root: str = DEFAULT_BUNDLE_ROOT, runtime_root: str = DEFAULT_RUNTIME_ROOT, *,
                 systemctl: Sequence[str] = ("systemctl",), env: Mapping[str, str] | None = None,
                 env_file: str | None = None, socket_activation: bool | None = None,
                 podshim: Sequence[str] | str | None = None):
        for name, path in (("state root", state_root), ("runtime root", runtime_root)):
            if not os.path.isabs(path):
                raise ValueError(f"{name} {path!r} must be an absolute path")
        if env_file is None:
            env_file = env_file_path(runtime_root)
        elif not os.path.isabs(env_file):
            raise ValueError(f"env file {env_file!r} must be an absolute path")
        if not systemctl:
            raise ValueError("systemctl must not be empty")
        self.state_root = os.path.normpath(state_root)
        self.runtime_root = os.path.normpath(runtime_root)
        self.systemctl = list(systemctl)
        self.env_file = env_file
        if socket_activation is None:
            socket_activation = self.runtime_root == os.path.normpath(DEFAULT_RUNTIME_ROOT)
        self.socket_activation = socket_activation
        self.env = {"PODSHIM_STATE_ROOT": self.state_root, "PODSHIM_RUNTIME_ROOT": self.runtime_root}
        if os.access(os.path.join(os.path.dirname(sys.executable), "podshim"), os.X_OK):
            self.env["PATH"] = f"{os.path.dirname(sys.executable)}:{_SYSTEM_PATH}"
        self.env.update(env or {})
        self._env_text = _env_file_text(self.env)
        # `podshim delete` is the same cleanup whoever started the shim.
        self._cleanup = ExecSpawner(podshim, self.runtime_root)

    # -- the Spawner API --------------------------------------------------------------------
    async def spawn(self, namespace: str, sandbox_id: str, bundle: str) -> Bootstrap:
        """Start the sandbox's socket (the shim follows on the first connection) or, when its
        path does not fit, its service (returns once the shim serves). Returns its bootstrap.

        Raises InvalidArgument when ``bundle`` is not where the unit's shim looks for it or the
        unit name is too long; Unavailable when systemctl fails (the message has its words);
        DeadlineExceeded after SPAWN_TIMEOUT; Internal when the shim wrote no valid bootstrap.
        """
        service, socket = unit_names(namespace, sandbox_id)
        expected = os.path.join(self.state_root, namespace, sandbox_id)
        if os.path.normpath(bundle) != expected:
            raise InvalidArgument(f"bundle {bundle!r} is not {expected!r}, where podshim@.service looks for it "
                                  f"(the spawner's state root is {self.state_root})")
        self._write_env_file()
        path = activation_socket_path(namespace, sandbox_id, self.runtime_root) if self.socket_activation else None
        if path is not None:
            # Written before the socket exists, so whoever finds the bundle can reconnect; the
            # shim rewrites it (with its pid) when the first connection starts it.
            boot = Bootstrap(BOOTSTRAP_VERSION, "unix://" + path, PROTOCOL, 0)
            write_atomic(os.path.join(bundle, BOOTSTRAP_FILE), _bootstrap_json(boot))
            await self._start(socket, SPAWN_TIMEOUT)
            return boot
        await self._start(service, SPAWN_TIMEOUT)
        try:
            return read_bootstrap(bundle)
        except NotFound:
            raise Internal(f"{service} is active but wrote no {BOOTSTRAP_FILE} in {bundle}: does its "
                           f"PODSHIM_STATE_ROOT differ from {self.state_root} (see {self.env_file})?") from None

    async def delete(self, namespace: str, sandbox_id: str, bundle: str) -> ExitStatus:
        """Kill what is left of the sandbox's shim and stop its units, run ``podshim delete``,
        and reset the units. Never raises: a step that fails is logged and the rest still run."""
        try:
            units = self._units(namespace, sandbox_id)
        except InvalidArgument as exc:
            log.warning("delete %s/%s: %s", namespace, sandbox_id, exc)
            return await self._cleanup.delete(namespace, sandbox_id, bundle)
        service, sockets = units[0], units[1:]
        # The socket first, so no connection starts a new shim meanwhile; then SIGKILL, since a
        # shim that does not answer would not answer the SIGTERM of a stop either; the stop then
        # waits for the unit's ExecStopPost `podshim delete`, so ours never runs beside it.
        if sockets:
            await self._quietly("stop", *sockets)
        await self._quietly("kill", "--kill-whom=main", "--signal=SIGKILL", service)
        await self._quietly("stop", service)
        status = await self._cleanup.delete(namespace, sandbox_id, bundle)
        await self._quietly("reset-failed", *units)
        return status

    async def release(self, namespace: str, sandbox_id: str) -> None:
        """Stop both units of a sandbox that was shut down, and forget a failed state.

        Raises Unavailable when systemctl cannot stop them, DeadlineExceeded after UNIT_STOP_TIMEOUT.
        """
        units = self._units(namespace, sandbox_id)
        done = await self._systemctl("stop", *units, timeout=UNIT_STOP_TIMEOUT)
        if done.returncode != 0:
            raise Unavailable(f"systemctl stop {' '.join(units)} failed with exit status {done.returncode}: "
                              f"{stderr_tail(done.stderr)}")
        await self._quietly("reset-failed", *units)

    # -- internals --------------------------------------------------------------------------
    def _units(self, namespace: str, sandbox_id: str) -> list[str]:
        """The service, and the socket when this spawner starts sockets and its path fits (systemd
        does not load a socket unit whose path is too long, and systemctl fails on a unit that
        is not loaded)."""
        service, socket = unit_names(namespace, sandbox_id)
        if self.socket_activation and activation_socket_path(namespace, sandbox_id, self.runtime_root):
            return [service, socket]
        return [service]

    async def _systemctl(self, *args: str, timeout: float) -> subprocess.CompletedProcess[bytes]:
        argv = [*self.systemctl, "--no-ask-password", *args]
        try:
            with anyio.fail_after(timeout):
                # A new session, as for podshim helpers: a Ctrl-C meant for the controller must
                # not interrupt a start or stop half-way.
                return await anyio.run_process(argv, stdin=subprocess.DEVNULL, check=False, start_new_session=True)
        except TimeoutError:
            raise DeadlineExceeded(f"{' '.join(argv)} did not finish within {timeout:.0f}s") from None
        except OSError as exc:  # not the errno's code: a NOT_FOUND here would read as "no such sandbox"
            raise Internal(f"cannot run {argv[0]!r}: {exc.strerror or exc}") from None

    async def _start(self, unit: str, timeout: float) -> None:
        # `systemctl start` waits for the job: a socket listens, a Type=notify service sent
        # READY=1 (the shim serves), or the start failed.
        done = await self._systemctl("start", unit, timeout=timeout)
        if done.returncode != 0:
            raise Unavailable(f"systemctl start {unit} failed with exit status {done.returncode}: "
                              f"{stderr_tail(done.stderr) or 'no message'} (journalctl -u {unit!r} says more)")

    async def _quietly(self, *args: str) -> None:
        """A systemctl call whose failure is only logged (units that are not loaded, not running)."""
        try:
            done = await self._systemctl(*args, timeout=UNIT_STOP_TIMEOUT)
        except RpcError as exc:
            log.warning("systemctl %s: %s", " ".join(args), exc)
            return
        if done.returncode != 0:
            log.info("systemctl %s: exit status %d: %s", " ".join(args), done.returncode, stderr_tail(done.stderr))

    def _write_env_file(self) -> None:
        try:
            with open(self.env_file) as f:
                if f.read() == self._env_text:
                    return
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise error_from_oserror(exc, f"cannot read {self.env_file}") from None
        try:
            ensure_private_dir(os.path.dirname(self.env_file), 0o711, keep_mode=True)
            write_atomic(self.env_file, self._env_text.encode())
        except OSError as exc:
            raise error_from_oserror(exc, f"cannot write {self.env_file}") from None


def _env_file_text(env: Mapping[str, str]) -> str:
    """An EnvironmentFile= for ``env``; ValueError for what it cannot hold."""
    lines = ["# Written by podshim's SystemdSpawner; podshim@.service reads it at every start."]
    for key, value in env.items():
        if not key.replace("_", "a").isalnum() or not key.isascii() or key[0].isdigit():
            raise ValueError(f"environment variable name {key!r} is not valid")
        if any(c in value for c in '"\\\n\r'):
            raise ValueError(f"the value of {key} may not contain a quote, backslash or newline: {value!r}")
        lines.append(f'{key}="{value}"')
    return "\n".join(lines) + "\n"


def _bootstrap_json(boot: Bootstrap) -> bytes:
    # The shim's own layout (sorted keys, one line), so both writers produce the same document.
    doc = {"version": boot.version, "address": boot.address, "protocol": boot.protocol, "pid": boot.pid}
    return (json.dumps(doc, sort_keys=True) + "\n").encode()
