"""Attach: a running container's stdio on ``channel.k8s.io`` streams (:mod:`.remotecommand` gathers them).

Output: the container's stdout and stderr as its CRI log records them (the shim writes every byte
there as it reads it), followed from the log's end at the moment of attaching, so several attachers
see the same bytes and none takes them from another; ``P`` (partial) records carry no newline.
Input: written to the FIFO the container's shim keeps open as its stdin (a container created with
``stdin``; protocol.md 7.3), opened by each attacher; with ``stdin_once`` the first attacher's end of
input closes the container's stdin for good. The attach ends when the container exits (``Success`` on
the error stream) or when the client goes away, which leaves the container running.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from shim.rpc.status import RpcError

from . import execio
from .session import Stream, StreamClosed

__all__ = ["AttachRequest", "AttachBackend", "LOG_POLL", "parse_records", "run_attach"]

log = logging.getLogger("podshimd.streaming")

#: Seconds between looks at the log for new output (the container's exit wakes the follower at once).
LOG_POLL = 0.05


@dataclass(frozen=True, slots=True)
class AttachRequest:
    container_id: str
    tty: bool
    stdin: bool
    stdout: bool
    stderr: bool


@dataclass(frozen=True, slots=True)
class AttachBackend:
    """``target(container_id)`` -> the pod layer's ``attach_target`` map; ``close_stdin(pod_id,
    container_id)``; ``wait(pod_id, container_id)`` -> the exit status once the container exited."""

    target: Callable[[str], Awaitable[dict[str, Any]]]
    close_stdin: Callable[[str, str], Awaitable[None]]
    wait: Callable[[str, str], Awaitable[int]]


def parse_records(buffer: bytes) -> tuple[list[tuple[str, bytes]], bytes]:
    """The complete CRI log records in ``buffer`` as (stream, bytes) and what is left after them."""
    records = []
    start = 0
    while (end := buffer.find(b"\n", start)) >= 0:
        parts = buffer[start:end].split(b" ", 3)
        start = end + 1
        if len(parts) < 3 or parts[1] not in (b"stdout", b"stderr"):
            continue  # not a record of ours: skipped, never guessed at
        message = parts[3] if len(parts) == 4 else b""
        records.append((parts[1].decode(), message if parts[2] == b"P" else message + b"\n"))
    return records, buffer[start:]


class _LogFollower:
    """The container's log from its end at the moment of attaching (what follows is the attacher's),
    following it into a new file after ReopenLog. :meth:`close` is the one cleanup path."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self.file: Any = open(path, "rb")
        except OSError as exc:
            log.info("attach: cannot read the container's log %s: %s", path, exc.strerror)
            self.file = None
        else:
            self.file.seek(0, os.SEEK_END)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    async def follow(self, outputs: dict[str, Stream], exited: asyncio.Future[Any]) -> None:
        """Send each record to its stream until the container exited and the log is read to its end."""
        pending = b""
        while self.file is not None:
            chunk = self.file.read(execio.READ_BYTES)
            if chunk:
                records, pending = parse_records(pending + chunk)
                for stream, data in records:
                    target = outputs.get(stream)
                    if target is not None:
                        await target.write(data)
                continue
            if exited.done():
                return
            try:
                renewed = os.stat(self.path).st_ino != os.fstat(self.file.fileno()).st_ino
            except OSError:
                renewed = False
            if renewed:  # ReopenLog: the shim writes a new file now
                self.file.close()
                self.file = open(self.path, "rb")
                pending = b""
                continue
            await asyncio.wait([exited], timeout=LOG_POLL)
        await asyncio.wait([exited])


async def _write_stdin(stream: Stream, fifo: str, close_for_good: Callable[[], Awaitable[None]] | None) -> None:
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        log.info("attach: cannot open the container's stdin %s: %s", fifo, exc.strerror)
        stream.discard()
        return
    try:
        while data := await stream.read():
            await execio.write(fd, data)
    except OSError:  # EPIPE: the container closed its stdin
        stream.discard()
        return
    finally:
        os.close(fd)
    if close_for_good is not None:
        await close_for_good()


async def run_attach(request: AttachRequest, streams: dict[str, Stream], backend: AttachBackend,
                     finish: Callable[[int | None, str], Awaitable[None]]) -> None:
    """Serve one attach until the container exits (then ``finish(0, "")``); a client that goes away
    cancels it, and the container goes on."""
    try:
        target = await backend.target(request.container_id)
    except RpcError as exc:
        await finish(None, exc.message)
        return
    pod_id, container_id = target["pod_id"], target["container_id"]
    exited = asyncio.ensure_future(backend.wait(pod_id, container_id))
    outputs = {kind: streams[kind] for kind in ("stdout", "stderr") if kind in streams}
    if request.tty and "stdout" in outputs:
        outputs["stderr"] = outputs["stdout"]  # a terminal carries both
    # The log is opened at its end before any input goes in: output the input causes is this attacher's.
    log_file = _LogFollower(target["log_path"])
    helpers = []
    if "stdin" in streams:
        if target["stdin"]:
            once = (lambda: backend.close_stdin(pod_id, container_id)) if target["stdin_once"] else None
            helpers.append(asyncio.ensure_future(_write_stdin(streams["stdin"], target["stdin"], once)))
        else:
            streams["stdin"].discard()
    if "resize" in streams:
        streams["resize"].discard()  # the container has no terminal of podshim's to resize
    follower = asyncio.ensure_future(log_file.follow(outputs, exited))
    try:
        await asyncio.wait([follower, exited], return_when=asyncio.FIRST_EXCEPTION)
        await follower
        exit_status = exited.result()
    except (StreamClosed, RpcError) as exc:
        log.info("attach to %s ended: %s", container_id, exc)
        return
    finally:
        for task in (follower, exited, *helpers):
            task.cancel()
        await asyncio.gather(follower, exited, *helpers, return_exceptions=True)
        log_file.close()
    log.info("attach: container %s exited with status %d", container_id, exit_status)
    await finish(0, "")
