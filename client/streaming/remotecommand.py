"""``channel.k8s.io`` (v1-v4): Exec (and Attach, :mod:`.attach`) over SPDY streams, as Kubernetes'
remotecommand client speaks it.

The client opens one stream per channel, each named by its ``streamType`` header: ``error`` always,
``stdin``, ``stdout`` and ``stderr`` as the request asked (no ``stderr`` with a tty: the terminal
carries both), and ``resize`` with a tty from v3 on (JSON ``{"Width": W, "Height": H}`` values, one
after another). Once all expected streams are there the command starts (ExecStart, protocol.md 7.3)
with podshimd's FIFOs or terminal (:mod:`.execio`) as its stdio, and bytes are copied between streams
and files. When the command has exited and its output is drained, the output streams are closed and
the outcome is written on the error stream, which is then closed: v4 writes a JSON ``metav1.Status``
(``Success``; ``Failure`` with reason ``NonZeroExitCode`` and the code in an ``ExitCode`` cause),
v1-v3 nothing on success and a sentence otherwise. A client that goes away kills the command.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from shim.rpc.status import RpcError

from . import execio
from .attach import AttachBackend, AttachRequest, run_attach
from .session import Stream, StreamClosed
from .sizes import TerminalSizes

__all__ = ["PROTOCOLS", "STREAMS_TIMEOUT", "OUTPUT_DRAIN", "ExecRequest", "ExecBackend", "RemoteCommandSession",
           "status_message"]

log = logging.getLogger("podshimd.streaming")

#: The sub-protocols, the client's first shared one wins.
PROTOCOLS = ("v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io", "channel.k8s.io")
#: Seconds the client has to open every stream it asked for (kubelet's stream creation timeout).
STREAMS_TIMEOUT = 30.0
#: After the command exited, seconds its output may stay open (a background process holding it).
OUTPUT_DRAIN = 2.0
#: Seconds the command's start waits for the client's first terminal size (the Go client sends it
#: as soon as its streams exist), so that the command starts at its size rather than 0x0 or 80x24.
FIRST_SIZE_WAIT = 1.0


@dataclass(frozen=True, slots=True)
class ExecRequest:
    container_id: str
    cmd: tuple[str, ...]
    tty: bool
    stdin: bool
    stdout: bool
    stderr: bool


def status_message(protocol: str, exit_status: int | None, error: str = "") -> bytes:
    """What the error stream carries at the end: ``exit_status`` None means the command did not run
    (``error`` says why)."""
    if protocol == PROTOCOLS[0]:
        if exit_status == 0:
            status: dict[str, Any] = {"metadata": {}, "status": "Success"}
        elif exit_status is not None:
            status = {"metadata": {}, "status": "Failure",
                      "message": f"command terminated with non-zero exit code: exit status {exit_status}",
                      "reason": "NonZeroExitCode",
                      "details": {"causes": [{"reason": "ExitCode", "message": str(exit_status)}]}}
        else:
            status = {"metadata": {}, "status": "Failure", "message": error, "reason": "InternalError", "code": 500}
        return json.dumps(status).encode()
    if exit_status == 0:
        return b""
    if exit_status is not None:
        return f"command terminated with non-zero exit code: exit status {exit_status}".encode()
    return error.encode()


class ExecBackend:
    """What an exec needs from the pod layer (podshimd gives :class:`client.cri.pod.PodService`'s)."""

    def __init__(self, start: Callable[[str, list[str], dict[str, Any]], Awaitable[Any]],
                 wait: Callable[[Any], Awaitable[int]], kill: Callable[[Any], Awaitable[None]], directory: str) -> None:
        self.start, self.wait, self.kill, self.directory = start, wait, kill, directory


class RemoteCommandSession:
    """The streams of one exec: gathers them, runs the command, copies, reports the end."""

    def __init__(self, request: ExecRequest | AttachRequest, protocol: str, backend: ExecBackend | AttachBackend,
                 spawn: Callable[[Coroutine[Any, Any, Any]], None]) -> None:
        self.request = request
        self.protocol = protocol
        self.backend = backend
        self._spawn = spawn
        expected = {"error"}
        if request.stdin:
            expected.add("stdin")
        if request.stdout:
            expected.add("stdout")
        if request.stderr and not request.tty:
            expected.add("stderr")
        if request.tty and protocol in PROTOCOLS[:2]:
            expected.add("resize")
        self._expected = expected
        self._streams: dict[str, Stream] = {}
        self._timer: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(STREAMS_TIMEOUT,
                                                                                         self._too_late)
        self._started = False

    def stream_opened(self, stream: Stream) -> None:
        kind = stream.header("streamtype") or ""
        if self._started or kind not in self._expected or kind in self._streams:
            log.debug("exec: refusing an unexpected %r stream", kind)
            stream.reset()
            return
        self._streams[kind] = stream
        if set(self._streams) == self._expected:
            self._started = True
            self.close()
            self._spawn(self._run())

    def _too_late(self) -> None:
        self._timer = None
        if not self._started:
            missing = ", ".join(sorted(self._expected - set(self._streams)))
            log.debug("exec: the client did not open its %s stream(s) within %.0f s", missing, STREAMS_TIMEOUT)
            for stream in self._streams.values():
                stream.reset()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _run(self) -> None:
        self._streams["error"].discard()
        try:
            if isinstance(self.request, AttachRequest):
                assert isinstance(self.backend, AttachBackend)
                await run_attach(self.request, self._streams, self.backend, self._finish)
            else:
                await self._run_exec()
        except Exception as exc:
            # A bug of ours: logged with its traceback, and the client told rather than left waiting.
            log.exception("streaming session failed")
            await self._finish(None, f"internal error in podshimd's streaming server: {exc}")

    async def _run_exec(self) -> None:
        streams, request, backend = self._streams, self.request, self.backend
        assert isinstance(request, ExecRequest) and isinstance(backend, ExecBackend)
        try:
            io = execio.ExecIO(backend.directory, stdin=request.stdin, stdout=request.stdout,
                               stderr=request.stderr and not request.tty, tty=request.tty)
        except OSError as exc:
            await self._finish(None, f"cannot make the command's {'terminal' if request.tty else 'pipes'}: "
                                     f"{exc.strerror}")
            return
        sizes = TerminalSizes(streams["resize"]) if "resize" in streams else None
        if sizes is not None:
            try:
                first = await asyncio.wait_for(sizes.next(), FIRST_SIZE_WAIT)
            except TimeoutError:
                first = None
            if first is not None:
                io.size(*first)  # the terminal is made at this size, before the command runs
        handle = None
        exited = False
        try:
            try:
                handle = await backend.start(request.container_id, list(request.cmd), io.paths)
            except RpcError as exc:
                await self._finish(None, exc.message)
                return
            if request.tty:
                try:
                    await io.receive_terminal()
                except OSError as exc:
                    await self._finish(None, f"the command's terminal did not come: {exc.strerror}")
                    return
            io.started()
            copies = []
            if "stdout" in streams and io.stdout is not None:
                copies.append(asyncio.ensure_future(_copy_out(io.stdout, streams["stdout"])))
            if "stderr" in streams and io.stderr is not None:
                copies.append(asyncio.ensure_future(_copy_out(io.stderr, streams["stderr"])))
            helpers = []
            if "stdin" in streams:
                helpers.append(asyncio.ensure_future(_copy_in(streams["stdin"], io)))
            if sizes is not None:
                helpers.append(asyncio.ensure_future(_resizes(sizes, io)))
            try:
                exit_status = await backend.wait(handle)
                exited = True
                if copies:
                    await asyncio.wait(copies, timeout=OUTPUT_DRAIN)
            finally:
                for task in copies + helpers:
                    task.cancel()
                await asyncio.gather(*copies, *helpers, return_exceptions=True)
            await self._finish(exit_status)
        finally:
            if handle is not None and not exited:
                # The client went away (or the session ended): the command goes too.
                try:
                    await asyncio.shield(backend.kill(handle))
                except RpcError as exc:
                    log.info("exec: cannot kill the command of a client that went away: %s", exc.message)
            io.close()

    async def _finish(self, exit_status: int | None, error: str = "") -> None:
        for kind in ("stdout", "stderr"):
            if kind in self._streams:
                self._streams[kind].close()
        message = status_message(self.protocol, exit_status, error)
        stream = self._streams["error"]
        try:
            if message:
                await stream.write(message)
        except StreamClosed:
            pass
        stream.close()
        for kind in ("stdin", "resize"):
            if kind in self._streams:
                self._streams[kind].discard()
                self._streams[kind].close()


async def _copy_out(fd: int, stream: Stream) -> None:
    try:
        while data := await execio.read(fd):
            await stream.write(data)
    except StreamClosed:
        pass


async def _copy_in(stream: Stream, io: execio.ExecIO) -> None:
    try:
        while data := await stream.read():
            if io.stdin is None:
                continue
            await execio.write(io.stdin, data)
    except OSError:  # EPIPE: the command closed its stdin; what else the client sends is dropped
        stream.discard()
        return
    io.close_stdin()


def _resize(io: execio.ExecIO, width: int, height: int) -> None:
    try:
        io.resize(width, height)
    except (OSError, struct.error):  # out of range for the kernel's winsize
        log.debug("exec: ignoring a terminal size of %d x %d", width, height)


async def _resizes(sizes: TerminalSizes, io: execio.ExecIO) -> None:
    while (size := await sizes.next()) is not None:
        _resize(io, *size)
