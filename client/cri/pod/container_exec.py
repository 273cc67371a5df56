"""The streaming RPCs' pod side: ExecSync, and what Exec, Attach and their terminals need
of a running container (containerd's container_exec.go, container_execsync.go, container_attach.go)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from shim.rpc.status import DeadlineExceeded, FailedPrecondition, InvalidArgument

from client.cri.logcontext import about
from client.cri.pod.base import CALL_TIMEOUT, PodServiceBase, log
from client.cri.store import ContainerRecord, ContainerState


class ContainerExec(PodServiceBase):
    """The pod service's container exec part (:class:`client.cri.pod.PodService` is all of them)."""

    async def _running(self, container_id: str) -> ContainerRecord:
        """The container, brought up to date; FailedPrecondition unless it is RUNNING."""
        c = await self._refresh_container(self._container(container_id))
        if c.state is not ContainerState.RUNNING:
            raise FailedPrecondition(f"container {c.container_id} is not running (it is CONTAINER_{c.state})")
        return c

    async def exec_sync(self, container_id: str, cmd: list[str], timeout: int = 0) -> dict[str, Any]:
        """ExecSync: run ``cmd`` in a running container (its namespaces, cgroup, environment and
        working directory) until it exits; ``{exit_code, stdout, stderr}`` (bytes, each at most the
        shim's limit, 1 MiB: what is beyond is dropped, as containerd drops beyond its 16 MiB).

        ``timeout`` is in seconds (0: none); when it passes the command and its session are killed
        and DeadlineExceeded says so (containerd's answer, which kubelet reads as a probe that timed
        out). Raises InvalidArgument (bad cmd or timeout), NotFound, FailedPrecondition (not
        running; a program that cannot be run).
        """
        if not isinstance(cmd, (list, tuple)) or not cmd or not all(isinstance(a, str) for a in cmd):
            raise InvalidArgument("cmd must be a non-empty array of strings")
        if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 0:
            raise InvalidArgument(f"timeout must be a whole number of seconds, 0 or more, not {timeout!r}")
        c = await self._running(container_id)
        with about(c.pod_id, c.container_id):
            reply = await self._task(c.pod_id, "Exec", {"task_id": c.container_id, "args": list(cmd),
                                                        "timeout_secs": timeout or None},
                                     timeout=timeout + CALL_TIMEOUT if timeout else None)
            if reply.get("timed_out"):
                raise DeadlineExceeded(f"command {shlex.join(cmd)!r} timed out after {timeout} s and was killed")
            for stream in ("stdout", "stderr"):
                if reply.get(f"{stream}_truncated"):
                    log.info("exec %s: its %s was cut to the first %d bytes", shlex.join(cmd), stream,
                             len(reply.get(stream) or b""))
        return {"exit_code": reply["exit_status"], "stdout": bytes(reply.get("stdout") or b""),
                "stderr": bytes(reply.get("stderr") or b"")}

    async def exec_target(self, container_id: str) -> str:
        """The full id of a RUNNING container, for Exec and Attach. Raises NotFound, FailedPrecondition."""
        return (await self._running(container_id)).container_id

    async def exec_start(self, container_id: str, cmd: list[str], stdio: Mapping[str, Any]) -> tuple[str, str, str]:
        """Start ``cmd`` in a running container with ``stdio`` (ExecStart's ``stdin``, ``stdout``,
        ``stderr`` FIFO paths, or ``console_socket`` with ``console_width``/``console_height``, protocol.md 7.3) and return at once: ``(pod_id,
        container_id, exec_id)`` for :meth:`exec_wait` and :meth:`exec_kill`. Raises InvalidArgument,
        NotFound, FailedPrecondition (not running; a program that cannot be run)."""
        if not isinstance(cmd, (list, tuple)) or not cmd or not all(isinstance(a, str) for a in cmd):
            raise InvalidArgument("cmd must be a non-empty array of strings")
        c = await self._running(container_id)
        with about(c.pod_id, c.container_id):
            reply = await self._task(c.pod_id, "ExecStart", {"task_id": c.container_id, "args": list(cmd), **stdio})
        return c.pod_id, c.container_id, reply["exec_id"]

    async def exec_wait(self, pod_id: str, container_id: str, exec_id: str) -> int:
        """The exit status of an exec :meth:`exec_start` started, once it exited."""
        reply = await self._task(pod_id, "ExecWait", {"task_id": container_id, "exec_id": exec_id}, timeout=None)
        return int(reply["exit_status"])

    async def exec_kill(self, pod_id: str, container_id: str, exec_id: str) -> None:
        """Kill an exec :meth:`exec_start` started, and what it started in its session."""
        await self._task(pod_id, "ExecKill", {"task_id": container_id, "exec_id": exec_id})

    async def attach_target(self, container_id: str) -> dict[str, Any]:
        """What Attach needs of a RUNNING container: ``{pod_id, container_id, log_path, stdin, stdin_once,
        tty}``, ``stdin`` the path of the FIFO its shim keeps open ("" if it has none, or it was
        closed). Raises NotFound, FailedPrecondition."""
        c = await self._running(container_id)
        cfg = self._container_config_of(c)
        stdin = ""
        if cfg.stdin:
            stdin = (await self._task(c.pod_id, "State", {"task_id": c.container_id})).get("stdin") or ""
        return {"pod_id": c.pod_id, "container_id": c.container_id, "log_path": c.log_path, "stdin": stdin,
                "stdin_once": cfg.stdin_once, "tty": cfg.tty}

    async def attach_output(self, pod_id: str, container_id: str, fifos: Mapping[str, str | int]) -> None:
        """Have a container's shim copy its stdout and stderr from now on to ``fifos`` (AttachOutput's
        ``stdout``/``stderr`` FIFO paths, held open for reading by the caller)."""
        await self._task(pod_id, "AttachOutput", {"task_id": container_id, **fifos})

    async def resize_terminal(self, pod_id: str, container_id: str, width: int, height: int) -> None:
        """Set the size of a tty container's terminal (its process gets SIGWINCH). Raises InvalidArgument
        (out of range), FailedPrecondition (no terminal; not running)."""
        await self._task(pod_id, "ResizePty", {"task_id": container_id, "width": width, "height": height})

    async def close_stdin(self, pod_id: str, container_id: str) -> None:
        """Close a container's stdin for good (stdin_once): it reads end-of-file once writers are gone."""
        await self._task(pod_id, "CloseStdin", {"task_id": container_id})

    async def wait_task(self, pod_id: str, container_id: str) -> int:
        """The exit status of a container's process, once it exited."""
        return int((await self._task(pod_id, "Wait", {"task_id": container_id}, timeout=None))["exit_status"])
