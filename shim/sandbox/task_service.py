"""The RPC handlers of ``podshim.task.v1.Task``. They translate: payload fields in, TaskSet calls,
payload out. The rules live in :mod:`shim.sandbox.tasks`.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

from shim.api.identifiers import validate_labels
from shim.api.names import TASK_SERVICE
from shim.rpc.messages import optional, require
from shim.rpc.server import CallContext, Server
from shim.rpc.status import InvalidArgument
from shim.sandbox.options import namespace_mode
from shim.sandbox.service import request_sandbox_id

if TYPE_CHECKING:
    from shim.runtime.confine import Rlimit
    from shim.sandbox.sandbox import Sandbox
    from shim.sandbox.tasks import TaskSet

__all__ = ["TaskService", "register_tasks"]


class TaskService:
    """Handlers of ``podshim.task.v1.Task``.

    The sandbox's :class:`~shim.sandbox.tasks.TaskSet`, and with it the code that runs tasks
    (launcher, CRI logs, exec), is made by the first Task call: a shim exec'd for a sandbox spends
    no start-up on what only some of its calls need (a template's shims have it preloaded).
    """

    def __init__(self, sandbox: Sandbox):
        self.sandbox = sandbox
        self._tasks: TaskSet | None = None

    @property
    def tasks(self) -> TaskSet:
        if self._tasks is None:
            from shim.sandbox.tasks import TaskSet

            self._tasks = TaskSet(self.sandbox)
        return self._tasks

    def _ids(self, ctx: CallContext, p: dict[str, Any]) -> tuple[str, str]:
        return request_sandbox_id(ctx, p, self.sandbox), require(p, "task_id", str)

    async def create(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        from shim.runtime import confine  # with the task code (self.tasks), not at the shim's start
        from shim.runtime.base import CONTAINER, PID_MODES
        from shim.runtime.hooks import parse_hooks
        from shim.runtime.hostdevices import parse_devices
        from shim.runtime.mounts import parse_filesystem

        sid, tid = self._ids(ctx, p)
        labels = optional(p, "labels", dict, {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise InvalidArgument("field 'labels' must map strings to strings")
        validate_labels(labels)  # a container's labels, with a pod's limits
        pid_mode = optional(p, "pid_mode", (str, int))
        await self.tasks.create(
            sid, tid,
            args=require(p, "args", list),
            env=optional(p, "env", list, []),
            cwd=optional(p, "cwd", str),
            log_path=require(p, "log_path", str),
            pid_mode=CONTAINER if pid_mode is None else namespace_mode(pid_mode, "pid_mode", PID_MODES),
            pid_target=optional(p, "pid_target", str),
            labels=labels,
            confinement=confine.from_request(p),
            filesystem=parse_filesystem(p),
            devices=parse_devices(p),
            hooks=parse_hooks(p),
            stdin=optional(p, "stdin", bool, False),
            terminal=optional(p, "terminal", bool, False),
            resources=optional(p, "resources", dict),
        )
        return {}

    async def start(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        task = await self.tasks.start(*self._ids(ctx, p))
        return {"pid": task.pid, "started_at": task.started_at}

    async def kill(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        self.tasks.kill(*self._ids(ctx, p), optional(p, "signal", int, signal.SIGTERM), optional(p, "all", bool, False))
        return {}

    async def wait(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        result = await self.tasks.wait(*self._ids(ctx, p))
        return {"exit_status": result.exit_status, "exited_at": result.exited_at, "oom_killed": result.oom_killed}

    async def delete(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        result = await self.tasks.delete(*self._ids(ctx, p))
        return {"exit_status": result.exit_status, "exited_at": result.exited_at, "pid": result.pid,
                "oom_killed": result.oom_killed}

    async def exec(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        sid, tid = self._ids(ctx, p)
        result = await self.tasks.exec(sid, tid, args=require(p, "args", list),
                                       timeout_secs=optional(p, "timeout_secs", int), rlimits=_exec_rlimits(p))
        return result.payload()

    async def exec_start(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        sid, tid = self._ids(ctx, p)
        return await self.tasks.exec_start(sid, tid, args=require(p, "args", list), stdin=optional(p, "stdin", str),
                                           stdout=optional(p, "stdout", str), stderr=optional(p, "stderr", str),
                                           terminal=optional(p, "terminal", str),
                                           console_socket=optional(p, "console_socket", str),
                                           console_size=(optional(p, "console_width", int),
                                                         optional(p, "console_height", int)),
                                           rlimits=_exec_rlimits(p))

    async def exec_wait(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        sid, tid = self._ids(ctx, p)
        return await self.tasks.exec_wait(sid, tid, require(p, "exec_id", str))

    async def exec_kill(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        sid, tid = self._ids(ctx, p)
        self.tasks.exec_kill(sid, tid, require(p, "exec_id", str))
        return {}

    async def attach_output(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        sid, tid = self._ids(ctx, p)
        await self.tasks.attach_output(sid, tid, stdout=optional(p, "stdout", str), stderr=optional(p, "stderr", str))
        return {}

    async def close_stdin(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        self.tasks.close_stdin(*self._ids(ctx, p))
        return {}

    async def resize_pty(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        sid, tid = self._ids(ctx, p)
        self.tasks.resize_pty(sid, tid, require(p, "width", int), require(p, "height", int))
        return {}

    async def stats(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        return self.tasks.stats(*self._ids(ctx, p), details=optional(p, "details", bool, False))

    async def update(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        sid, tid = self._ids(ctx, p)
        await self.tasks.update(sid, tid, require(p, "resources", dict))
        return {}

    async def reopen_log(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        self.tasks.reopen_log(*self._ids(ctx, p))
        return {}

    async def state(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        return self.tasks.get(*self._ids(ctx, p)).state()

    async def list(self, ctx: CallContext, p: dict[str, Any]) -> dict[str, Any]:
        return {"tasks": [task.state() for task in self.tasks.list(request_sandbox_id(ctx, p, self.sandbox))]}


def _exec_rlimits(p: dict[str, Any]) -> tuple[Rlimit, ...] | None:
    """An exec's own ``rlimits`` (None: the task's)."""
    from shim.runtime.confine import parse_rlimits

    given = p.get("rlimits")
    return None if given is None else parse_rlimits(given)


def register_tasks(server: Server, service: TaskService) -> None:
    """Add the Task service to ``server``."""
    server.register(TASK_SERVICE, {
        "Create": service.create,
        "Start": service.start,
        "Kill": service.kill,
        "Wait": service.wait,
        "Delete": service.delete,
        "State": service.state,
        "List": service.list,
        "Exec": service.exec,
        "ExecStart": service.exec_start,
        "ExecWait": service.exec_wait,
        "ExecKill": service.exec_kill,
        "CloseStdin": service.close_stdin,
        "AttachOutput": service.attach_output,
        "Stats": service.stats,
        "Update": service.update,
        "ReopenLog": service.reopen_log,
        "ResizePty": service.resize_pty,
    })
