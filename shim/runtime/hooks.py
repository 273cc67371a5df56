"""OCI hooks a task is given (Task.Create's ``hooks``, from its CDI devices), run at the points of
the OCI runtime specification's lifecycle. An OCI runtime (runc, crun) is told them in config.json
and runs them itself; the native handler runs them here and in its launcher
(:mod:`shim.runtime.process`):

- ``prestart`` and ``createRuntime``: once the task's namespaces and mounts are made, before it
  pivots into its root, in the runtime's namespaces (the shim's): :func:`run`;
- ``createContainer``: right after, in the task's namespaces, before the pivot (its path is the
  host's), and ``startContainer``: in the task's root, right before its user, capabilities and
  seccomp filter are applied and its program is exec'd: by the launcher's child;
- ``poststart``: once the program runs, and ``poststop``: once the task is deleted, in the shim's
  namespaces: :func:`run_logged`.

Each gets the task's OCI state (``ociVersion``, ``id``, ``status``, ``pid``, ``bundle``) on its
stdin (under the native handler, ``bundle`` has a config.json of the task's root and process until
poststart's hooks are done), runs with its ``env`` (none said: the shim's, or the task's for the two run in the task),
``args`` (its argv, ``args[0]`` included; none said: its path) and is killed when it has not exited
within its ``timeout`` (none said: :data:`DEFAULT_TIMEOUT`). A failure of one of the first four
fails the task's start with FailedPrecondition naming the hook, its exit and the end of its output;
a failure of poststart or poststop is logged, as the specification says.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from shim.kernel.reaper import Reaper
from shim.lib.files import write_json_atomic
from shim.rpc.records import Record
from shim.rpc.records import set_field as _set
from shim.rpc.status import FailedPrecondition, InvalidArgument, RpcError
from shim.runtime import process

__all__ = ["DEFAULT_TIMEOUT", "HOOK_NAMES", "IN_TASK", "OCI_VERSION", "Hook", "oci_hooks", "parse_hooks",
           "run", "run_logged", "state", "write_bundle_config"]

log = logging.getLogger(__name__)

#: The lifecycle points, in the order they come.
HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
#: The points whose hooks run in the task's namespaces (by the launcher's child).
IN_TASK = ("createContainer", "startContainer")
#: Seconds a hook that says no timeout may run (the specification sets none; a hook never ends no start).
DEFAULT_TIMEOUT = 30
#: The runtime specification version of the state documents.
OCI_VERSION = "1.2.0"
_OUTPUT_BYTES = 512  # the end of a failed hook's output kept for its error


class Hook(Record):
    """One hook: ``name`` (its lifecycle point), ``path`` (the program), ``args`` (its argv),
    ``env`` (``KEY=value``) and ``timeout`` (seconds, or None)."""

    __slots__ = ("name", "path", "args", "env", "timeout")
    name: str
    path: str
    args: tuple[str, ...]
    env: tuple[str, ...]
    timeout: int | None

    def __init__(self, name: str, path: str, args: tuple[str, ...] = (), env: tuple[str, ...] = (),
                 timeout: int | None = None) -> None:
        _set(self, "name", name)
        _set(self, "path", path)
        _set(self, "args", args)
        _set(self, "env", env)
        _set(self, "timeout", timeout)

    @property
    def argv(self) -> tuple[str, ...]:
        return self.args or (self.path,)

    @property
    def seconds(self) -> int:
        return self.timeout or DEFAULT_TIMEOUT

    def environment(self, default: Mapping[str, str]) -> dict[str, str]:
        """What the hook runs with: its ``env``, or ``default`` when it says none."""
        return dict(entry.split("=", 1) for entry in self.env) if self.env else dict(default)

    def to_oci(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"path": self.path, "args": list(self.argv)}
        if self.env:
            doc["env"] = list(self.env)
        doc["timeout"] = self.seconds
        return doc

    def describe(self) -> str:
        return f"{self.name} hook {self.path}"


def parse_hooks(payload: Mapping[str, Any]) -> tuple[Hook, ...]:
    """The ``hooks`` of a Task.Create payload (each ``hook_name``, ``path``, ``args``, ``env``,
    ``timeout``); InvalidArgument naming a malformed entry."""
    entries = payload.get("hooks")
    if entries is None:
        return ()
    if not isinstance(entries, list):
        raise InvalidArgument("field 'hooks' must be an array")
    hooks = []
    for i, entry in enumerate(entries):
        where = f"hooks[{i}]"
        if not isinstance(entry, Mapping):
            raise InvalidArgument(f"field '{where}' must be a map")
        name, path = entry.get("hook_name"), entry.get("path")
        if name not in HOOK_NAMES:
            raise InvalidArgument(f"field '{where}.hook_name' must be one of {', '.join(HOOK_NAMES)}, not {name!r}")
        if not isinstance(path, str) or not os.path.isabs(path) or "\0" in path:
            raise InvalidArgument(f"field '{where}.path' must be an absolute path")
        args, env = entry.get("args") or [], entry.get("env") or []
        for key, value in (("args", args), ("env", env)):
            if not isinstance(value, list) or not all(isinstance(s, str) and "\0" not in s for s in value):
                raise InvalidArgument(f"field '{where}.{key}' must be an array of strings without NUL")
        if any(s.find("=") <= 0 for s in env):
            raise InvalidArgument(f"field '{where}.env' must be NAME=VALUE strings")
        timeout = entry.get("timeout")
        if timeout is not None and (not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0):
            raise InvalidArgument(f"field '{where}.timeout' must be a positive number of seconds")
        hooks.append(Hook(name, path, tuple(args), tuple(env), timeout))
    return tuple(hooks)


def oci_hooks(hooks: Iterable[Hook]) -> dict[str, list[dict[str, Any]]]:
    """config.json's ``hooks`` object."""
    doc: dict[str, list[dict[str, Any]]] = {}
    for hook in hooks:
        doc.setdefault(hook.name, []).append(hook.to_oci())
    return doc


def write_bundle_config(bundle: str, rootfs: str, args: Iterable[str], env: Mapping[str, str], cwd: str) -> str:
    """Write ``<bundle>/config.json`` for a task of the native handler, which has no OCI bundle: what
    a hook reads of its container there (its root, mounted on ``rootfs``; its process). The path;
    the caller removes it."""
    path = os.path.join(bundle, "config.json")
    write_json_atomic(path, {"ociVersion": OCI_VERSION, "root": {"path": rootfs},
                             "process": {"args": list(args), "env": [f"{k}={v}" for k, v in env.items()],
                                         "cwd": cwd}}, 0o644, durable=False)
    return path


def state(task_id: str, status: str, pid: int, bundle: str) -> bytes:
    """The OCI state document a hook reads on its stdin."""
    doc: dict[str, Any] = {"ociVersion": OCI_VERSION, "id": task_id, "status": status, "bundle": bundle,
                           "annotations": {}}
    if pid:
        doc["pid"] = pid
    return json.dumps(doc).encode()


async def run(hooks: Iterable[Hook], names: tuple[str, ...], state_doc: bytes, reaper: Reaper) -> None:
    """Run the ``hooks`` of the points ``names``, in order, in the shim's namespaces, each with
    ``state_doc`` on its stdin; FailedPrecondition for the first that fails (the others are not run)."""
    for hook in hooks:
        if hook.name in names:
            await _run_one(hook, state_doc, reaper)


async def run_logged(hooks: Iterable[Hook], name: str, state_doc: bytes, reaper: Reaper, task_id: str) -> None:
    """:func:`run` for poststart and poststop: a failure is logged and the next hook runs."""
    for hook in hooks:
        if hook.name == name:
            try:
                await _run_one(hook, state_doc, reaper)
            except RpcError as exc:
                log.warning("task %s: %s", task_id, exc.message)


async def _run_one(hook: Hook, state_doc: bytes, reaper: Reaper) -> None:
    stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    try:
        os.write(stdin_w, state_doc)  # far below a pipe's buffer: the hook need not read it
        os.close(stdin_w)
        stdin_w = -1
        try:
            started = await process.launch(process.ProcessSpec(
                name=hook.describe(), argv=hook.argv, program=hook.path, env=hook.environment(os.environ),
                stdin=stdin_r, stdout=out_w, stderr=out_w), reaper)
        except process.ExecFailed as exc:
            raise FailedPrecondition(f"{hook.describe()} failed: {exc.step}: {os.strerror(exc.errno)}") from None
        os.close(out_w)
        out_w = -1
        try:
            info = await process.wait_exit(started, time.monotonic() + hook.seconds)
        except TimeoutError:
            raise FailedPrecondition(f"{hook.describe()} did not finish within its timeout of {hook.seconds} s; "
                                     "it was killed") from None
        output = " ".join(process.read_available(out_r)[-_OUTPUT_BYTES:].decode("utf-8", "replace").split())
    finally:
        for fd in (stdin_r, stdin_w, out_r, out_w):
            if fd >= 0:
                os.close(fd)
    if info.exit_status != 0:
        raise FailedPrecondition(f"{hook.describe()} failed: exit status {info.exit_status}"
                                 + (f": {output}" if output else ""))
