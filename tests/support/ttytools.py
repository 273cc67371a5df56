"""A program on a pseudo-terminal the test holds the master of (as script(1) or a person's terminal gives
one): it types, resizes, and reads what the program shows."""

from __future__ import annotations

import os
import re
import select
import subprocess
import termios

#: Bound on waiting for what the program shows next.
WAIT = 30.0


class OnTerminal:
    """``argv`` on a pty of ``rows`` x ``cols``, the controlling terminal of its session: a size set on it
    reaches the program as SIGWINCH. End it with :meth:`close`."""

    def __init__(self, argv: list[str], rows: int, cols: int, cwd: str | None = None):
        self.master, slave = os.openpty()
        termios.tcsetwinsize(slave, (rows, cols))
        try:
            # setsid(1) --ctty, not a preexec_fn: Python code run between fork and exec in a process with
            # gRPC's threads (a daemon's stubs) can print gRPC's errors on the terminal and die.
            self.proc = subprocess.Popen(["setsid", "--ctty", *argv], cwd=cwd, stdin=slave, stdout=slave,
                                         stderr=slave)
        except BaseException:
            os.close(self.master)
            raise
        finally:
            os.close(slave)
        self.name = os.path.basename(argv[0])
        self.output = b""

    def type(self, text: bytes) -> None:
        os.write(self.master, text)

    def resize(self, rows: int, cols: int) -> None:
        termios.tcsetwinsize(self.master, (rows, cols))

    def read_until(self, pattern: bytes) -> re.Match[bytes]:
        """Read the terminal until ``pattern`` (a regex) appears in what came since the last match."""
        while (found := re.search(pattern, self.output)) is None:
            ready, _, _ = select.select([self.master], [], [], WAIT)
            assert ready, f"no {pattern!r} from {self.name} within {WAIT} s: {self.output!r}"
            try:
                chunk = os.read(self.master, 4096)
            except OSError:  # EIO: the program exited
                chunk = b""
            assert chunk, f"{self.name} ended before {pattern!r}: {self.output!r}"
            self.output += chunk
        self.output = self.output[found.end():]
        return found

    def wait(self) -> int:
        return self.proc.wait(timeout=WAIT)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        os.close(self.master)
