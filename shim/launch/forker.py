"""The template's forker: a child of the template that forks its spares and does nothing else.

A forked shim shares every page of its parent that neither has written since the fork. The
template writes to its pages at each Spawn (it serves the call, records the shim, forks the
next spare), and each page it writes is a page it no longer shares with any shim forked before:
every shim then keeps a copy of its own of those pages, about 1 MiB each. The forker is forked
from the template once it has imported and frozen everything, and from then on only forks:
asked for a spare, it forks one (:func:`shim.launch.spawn.fork_spare`), hands the template the
spare's channel and pid, and waits for the next request, so what it writes between two spares
is the few pages of that loop. The shims forked from it share its pages with one another.

Requests are single datagrams on a socket pair: ``F`` (fork a spare), answered ``P<pid>`` with
the spare's channel; ``C`` first preloads what shims that serve containerd import
(``shim.launch.template``'s containerd preload), so the spares after it share that too. An error
is answered ``E<message>``. The forker exits when the template's end closes (the template exits
or drops it).
"""

from __future__ import annotations

import errno
import os
import signal
import socket
from collections.abc import Callable
from typing import NoReturn

from shim.kernel.linux import set_process_name
from shim.launch.spawn import Spare, close_all_but, fork_spare

__all__ = ["FORKER_TIMEOUT", "Forker"]

#: How long the template waits for a spare from its forker: the spare's own START_TIMEOUT bounds
#: the forker's wait, and this is a little longer.
FORKER_TIMEOUT = 10.0
_FORK = b"F"
_PRELOAD = b"C"


class Forker:
    """The template's end of its forker (see the module docstring)."""

    def __init__(self, pid: int, pidfd: int, channel: socket.socket) -> None:
        self.pid = pid
        self.pidfd = pidfd  # signalled and waited for through this: its pid may be reaped and reused
        self.channel = channel

    @classmethod
    def start(cls, preload: Callable[[], None]) -> Forker:
        """Fork the forker; ``preload`` is what it runs on a ``C`` request. Raises OSError."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            pid = os.fork()
            if pid == 0:
                _serve(theirs, preload)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        try:
            pidfd = os.pidfd_open(pid)  # our child, not reaped before we wait: it is the forker
        except BaseException:
            ours.close()  # it exits on EOF
            raise
        ours.settimeout(FORKER_TIMEOUT)
        return cls(pid, pidfd, ours)

    def fork_spare(self, *, containerd: bool = False) -> Spare:
        """A spare forked by the forker (after its containerd preload, with ``containerd``).
        Raises OSError when the forker cannot fork one or is gone."""
        self.channel.sendall((_PRELOAD if containerd else b"") + _FORK)
        message, fds, _, _ = socket.recv_fds(self.channel, 256, 1)
        if message.startswith(b"P") and message[1:].isdigit() and len(fds) == 1:
            return Spare(int(message[1:]), socket.socket(fileno=fds[0]))
        for fd in fds:
            os.close(fd)
        if not message:
            raise OSError(errno.ECHILD, "the template's forker exited")
        raise OSError(errno.EPROTO, f"the template's forker could not fork a spare: "
                                    f"{message[1:].decode(errors='replace')}")

    def close(self, *, kill: bool = False) -> None:
        """Let the forker go (it exits on EOF; with ``kill``, at once: one that failed a request
        may still be forking) and reap it."""
        self.channel.close()
        try:
            if kill:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED)
        except (ProcessLookupError, ChildProcessError):  # reaped already (the template's SIGCHLD handler)
            pass
        finally:
            os.close(self.pidfd)


def _serve(channel: socket.socket, preload: Callable[[], None]) -> NoReturn:
    """In the forker: answer requests until EOF."""
    code = 1
    try:
        close_all_but((channel.fileno(),))  # not the template's lock, socket or users' pidfds
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the spares' intermediate children reap themselves
        set_process_name("podshim-forker")
        preloaded = False
        while request := channel.recv(16):
            if _PRELOAD in request and not preloaded:
                preload()
                preloaded = True
            try:
                spare = fork_spare()
            except OSError as exc:
                channel.send(b"E" + str(exc).encode()[:200])
                continue
            try:
                socket.send_fds(channel, [b"P%d" % spare.pid], [spare.channel.fileno()])
            finally:
                spare.close()  # the template's copy keeps the spare
        code = 0
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)
