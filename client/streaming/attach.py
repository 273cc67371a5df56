"""Attach: a running container's stdio on ``channel.k8s.io`` streams (:mod:`.remotecommand` gathers them).

Output: the container's stdout and stderr from the moment of attaching, byte for byte and as they
come: podshimd makes FIFOs and the container's shim copies the output to them as well as to the log
(AttachOutput, protocol.md 7.3), so several attachers see the same bytes and none takes them from
another. Input: written to the FIFO the shim keeps open as the container's stdin (a container
created with ``stdin``), opened by each attacher; with ``stdin_once`` the first attacher's end of
input closes the container's stdin for good. A container with a terminal (CRI ``tty``) has one output, its
terminal's, which goes to the client's stdout; the client's terminal sizes (``resize``) are set on the
container's terminal (ResizePty), whichever attacher sent them last. The attach ends when the container's output ends (it
exited: ``Success`` on the error stream) or when the client goes away, which leaves the container
running.
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
from .sizes import TerminalSizes

__all__ = ["AttachRequest", "AttachBackend", "run_attach"]

log = logging.getLogger("podshimd.streaming")


@dataclass(frozen=True, slots=True)
class AttachRequest:
    container_id: str
    tty: bool
    stdin: bool
    stdout: bool
    stderr: bool


@dataclass(frozen=True, slots=True)
class AttachBackend:
    """``target(container_id)`` -> the pod layer's ``attach_target`` map; ``output(pod_id, container_id,
    fifos)`` starts the shim's copies (AttachOutput); ``close_stdin(pod_id, container_id)``; ``wait(pod_id,
    container_id)`` -> the exit status once the container exited; ``resize(pod_id, container_id, width, height)``
    sets its terminal's size; ``directory`` holds the FIFOs (0700)."""

    target: Callable[[str], Awaitable[dict[str, Any]]]
    output: Callable[[str, str, dict[str, str | int]], Awaitable[None]]
    close_stdin: Callable[[str, str], Awaitable[None]]
    wait: Callable[[str, str], Awaitable[int]]
    resize: Callable[[str, str, int, int], Awaitable[None]]
    directory: str


async def _copy_out(fd: int, stream: Stream) -> None:
    while data := await execio.read(fd):
        await stream.write(data)


async def _write_stdin(stream: Stream, fifo: str, close_for_good: Callable[[], Awaitable[None]] | None) -> None:
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        log.debug("attach: cannot open the container's stdin %s: %s", fifo, exc.strerror)
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


async def _resizes(sizes: TerminalSizes, backend: AttachBackend, pod_id: str, container_id: str) -> None:
    while (size := await sizes.next()) is not None:
        try:
            await backend.resize(pod_id, container_id, *size)
        except RpcError as exc:  # out of range, or the container just exited: the attach goes on
            log.debug("attach: cannot resize the terminal of %s to %d x %d: %s", container_id, *size, exc.message)


async def run_attach(request: AttachRequest, streams: dict[str, Stream], backend: AttachBackend,
                     finish: Callable[[int | None, str], Awaitable[None]]) -> None:
    """Serve one attach until the container's output ends (then ``finish(0, "")``); a client that goes
    away cancels it, and the container goes on."""
    try:
        target = await backend.target(request.container_id)
    except RpcError as exc:
        await finish(None, exc.message)
        return
    pod_id, container_id = target["pod_id"], target["container_id"]
    # With a terminal the client has one output stream: the container's stderr goes there too.
    sinks = {kind: streams.get(kind) or (streams.get("stdout") if request.tty else None)
             for kind in ("stdout", "stderr")}
    io = execio.ExecIO(backend.directory, stdin=False, stdout=sinks["stdout"] is not None,
                       stderr=sinks["stderr"] is not None, tty=False)
    outputs: list[asyncio.Future[Any]] = []
    helpers: list[asyncio.Future[Any]] = []
    try:
        try:
            if io.paths:  # before any input goes in: output the input causes is this attacher's
                await backend.output(pod_id, container_id, io.paths)
        except RpcError as exc:
            await finish(None, exc.message)
            return
        io.started()
        for kind, fd in (("stdout", io.stdout), ("stderr", io.stderr)):
            sink = sinks[kind]
            if fd is not None and sink is not None:
                outputs.append(asyncio.ensure_future(_copy_out(fd, sink)))
        if "stdin" in streams:
            if target["stdin"]:
                once = (lambda: backend.close_stdin(pod_id, container_id)) if target["stdin_once"] else None
                helpers.append(asyncio.ensure_future(_write_stdin(streams["stdin"], target["stdin"], once)))
            else:
                streams["stdin"].discard()
        if "resize" in streams:
            if target["tty"]:
                helpers.append(asyncio.ensure_future(_resizes(TerminalSizes(streams["resize"]), backend, pod_id,
                                                              container_id)))
            else:
                streams["resize"].discard()  # the container has no terminal to resize
        exited = asyncio.ensure_future(backend.wait(pod_id, container_id))
        helpers.append(exited)
        # The output ends when the container stopped (the shim closes the FIFOs); then its exit is known.
        await asyncio.gather(*outputs)
        exit_status = await exited
    except (StreamClosed, RpcError) as exc:
        log.debug("attach to %s ended: %s", container_id, exc)
        return
    finally:
        for task in outputs + helpers:
            task.cancel()
        await asyncio.gather(*outputs, *helpers, return_exceptions=True)
        io.close()
    log.debug("attach: container %s exited with status %d", container_id, exit_status)
    await finish(0, "")
