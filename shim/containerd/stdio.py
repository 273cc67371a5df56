"""An exec's stdio as containerd hands it to the shim: FIFOs containerd made and holds the other ends
of (its ``fifo`` IO), with a terminal or without.

Without a terminal the command gets the FIFOs themselves; the shim holds the stdin FIFO open as well
(:func:`shim.runtime.execstream.hold_fifo`) until CloseIO or the command's end, so the command sees
no end of input before containerd opened its own end and closed it. With a terminal,
:class:`ExecTerminal` is the shim's end of it: the runtime makes the terminal in the task's devpts
and sends its master on the console socket, and the shim copies the stdin FIFO to the master and
the master to the stdout FIFO, until the terminal ends (every process that had it exited).
"""

from __future__ import annotations

import asyncio
import contextlib
import os

from shim.lib import console
from shim.lib.console import Console
from shim.runtime import execstream

__all__ = ["ExecTerminal", "OUTPUT_DRAIN_TIMEOUT"]

#: Seconds an exec's Wait waits, once the command exited, for what its terminal still shows to
#: have reached containerd (a process it left running keeps the terminal open).
OUTPUT_DRAIN_TIMEOUT = 5.0


class ExecTerminal:
    """An exec's terminal: :meth:`listen` (the socket the runtime sends the master to), then
    :meth:`attach` once the command runs. :meth:`aclose` is the one cleanup path (idempotent)."""

    def __init__(self) -> None:
        self.console = Console()
        self.master: int | None = None
        self.stdin: int | None = None  # the stdin FIFO, read
        self.hold: int | None = None  # and held open, until CloseIO
        self.stdout: int | None = None
        self.input: asyncio.Task[None] | None = None
        self.output: asyncio.Task[None] | None = None

    def listen(self, path: str) -> str:
        """Listen for the master on ``path``; the path. Raises OSError."""
        self.console.listen(path)
        return path

    async def attach(self, stdin: str, stdout: str) -> None:
        """Take the master the runtime sent, and copy containerd's ``stdin`` FIFO to it and it to
        ``stdout`` (each may be ""). Raises OSError (no master came), InvalidArgument (a FIFO)."""
        await self.console.receive()
        self.master = self.console.take()
        self.console.close()
        if stdout:
            self.stdout = await execstream.opened_once_read(lambda: execstream.open_tap(stdout, "stdout"))
        self.output = asyncio.ensure_future(console.copy_output(self.master, self.stdout))
        if stdin:
            self.hold = execstream.hold_fifo(stdin, "stdin")
            self.stdin = os.open(stdin, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
            self.input = asyncio.ensure_future(console.copy_input(self.stdin, self.master))

    def resize(self, width: int, height: int) -> None:
        """Raises OSError."""
        if self.master is not None:
            console.resize(self.master, width, height)

    def close_stdin(self) -> None:
        """CloseIO: the terminal gets its end of input once containerd closed its end too."""
        if self.hold is not None:
            os.close(self.hold)
            self.hold = None

    async def drained(self) -> None:
        """Once the command exited: wait (at most :data:`OUTPUT_DRAIN_TIMEOUT`) for the terminal's
        last output to be copied, then close everything."""
        if self.output is not None:
            with contextlib.suppress(TimeoutError, OSError):
                await asyncio.wait_for(asyncio.shield(self.output), OUTPUT_DRAIN_TIMEOUT)
        await self.aclose()

    async def aclose(self) -> None:
        copies = [copy for copy in (self.input, self.output) if copy is not None]
        self.input = self.output = None
        for copy in copies:
            copy.cancel()
        await asyncio.gather(*copies, return_exceptions=True)  # they no longer wait on the fds
        self.close_stdin()
        for name in ("stdin", "stdout", "master"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)
        self.console.close()
