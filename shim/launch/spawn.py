"""Making a detached shim: bind its socket, fork it into its own session, wait until it serves.

Two callers share this one path: ``podshim start`` (a short-lived process: one fork, and the
shim is re-parented when ``start`` exits) and the template (long-lived: a double fork, so the
template is never the shim's parent and may die or restart under it).

The template also keeps *spares* (:func:`fork_spare`): shims double-forked ahead of time that
wait, detached, for their sandbox. A Spawn tells it its sandbox's config first (it makes its
pieces meanwhile), then makes the bundle, binds the socket, records it (state.json), hands it the
socket and is answered at once, without a fork on the way: calls made meanwhile wait in the
socket's backlog until it serves. The template forks the next spare after answering.
"""

from __future__ import annotations

import errno
import json
import os
import re
import select
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

from shim.api.paths import BOOTSTRAP_FILE, BOOTSTRAP_VERSION, LOG_FILE, PROTOCOL, socket_address
from shim.kernel.linux import proc_start_time
from shim.lib.files import ensure_private_dir, read_json, unlink_quietly, write_json_atomic
from shim.rpc.records import Record
from shim.rpc.status import Unavailable
from shim.sandbox.record import STATE_NEW, SandboxRecord, write_state

__all__ = ["START_TIMEOUT", "Spare", "bind_listener", "bootstrap", "detach_process",
           "fork_spare", "spawn_shim"]

#: How long a spawner waits for the forked shim to accept; below the Controller's SPAWN_TIMEOUT
#: (10 s), so `podshim start` always ends its own child and reports before it is killed.
START_TIMEOUT = 8.0
_PID_LINE = rb"P(\d+)\n"  # compiled at its first use (a double fork), not at import (issue #15)
_SERVE = b"serve"  # the template to its spare, with the bound socket: serve it



def bind_listener(path: str) -> socket.socket | None:
    """Bind and listen on ``path`` (0600, in a 0700 dir). Returns None if a live shim owns it;
    a stale socket file left by a dead shim is replaced."""
    ensure_private_dir(os.path.dirname(path), 0o700)
    for attempt in (1, 2):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old_umask = os.umask(0o177)  # the socket is born 0600: no window where others can connect
        try:
            sock.bind(path)
        except OSError as exc:
            sock.close()
            if exc.errno != errno.EADDRINUSE or attempt == 2:
                raise
            from shim.rpc.blocking import can_connect  # only when the path is taken: keeps start-up lean

            if can_connect(path):
                return None
            os.unlink(path)  # stale: nobody accepts on it
            continue
        finally:
            os.umask(old_umask)
        sock.listen(256)
        return sock
    raise AssertionError("unreachable")


def bootstrap(address: str, pid: int, start_time: int | None = None) -> dict[str, Any]:
    """The bootstrap result printed by ``podshim start`` and kept in bootstrap.json.

    With the shim's pid goes its start time (protocol.md 8): together they name the shim for its
    whole life, so a controller tells a shim that is gone from one that is slow to answer.
    ``start_time``: the shim's, if the caller has read it already (it is read here otherwise).
    """
    doc: dict[str, Any] = {"version": BOOTSTRAP_VERSION, "address": address, "protocol": PROTOCOL, "pid": pid}
    if start_time is None and pid > 0:
        start_time = proc_start_time(pid)
    if start_time is not None:
        doc["start_time"] = start_time
    return doc


def _log_tail(path: str, lines: int = 10) -> str:
    """The last ``lines`` of the log file ``path``; "" when it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class Spare(Record):
    """A shim forked ahead of time, waiting for its sandbox (see :func:`fork_spare`).

    ``channel``: the template's end of the spare's socket pair. ``P<pid>`` from the intermediate
    child and ``S`` from the spare come in first, in either order: only with both is it *ready*
    (``pid`` known, the spare named, set up and waiting for its assignment). Then its sandbox's
    config goes out, then its bound socket, and the Spawn is answered. A spare handed to
    :func:`spawn_shim` is spent, whatever happens there. Closing the channel before the socket
    went out ends the spare: it exits.
    """

    __slots__ = ("pid", "channel", "standing_by")
    mutable = True
    pid: int  # 0 until the intermediate child reported it
    channel: socket.socket
    standing_by: bool

    def __init__(self, pid: int, channel: socket.socket, standing_by: bool = False) -> None:
        self.pid = pid
        self.channel = channel
        self.standing_by = standing_by

    @property
    def ready(self) -> bool:
        return self.pid != 0 and self.standing_by

    def close(self) -> None:
        self.channel.close()

    def hear(self) -> None:
        """Take the messages that came in, without waiting. Raises OSError once either process
        exited before it was ready (or the spare after it, while waiting)."""
        self.channel.setblocking(False)
        try:
            while True:
                try:
                    message = self.channel.recv(64)
                except BlockingIOError:
                    return
                self._take(message)
        finally:
            self.channel.setblocking(True)

    def wait_ready(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds until it is ready. Raises OSError if either process exits
        first or the time passes."""
        deadline = time.monotonic() + timeout
        try:
            while not self.ready:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise OSError(errno.ETIMEDOUT, f"the spare shim was not ready within {timeout:.0f}s")
                self.channel.settimeout(left)
                try:
                    message = self.channel.recv(64)
                except TimeoutError:
                    continue  # the deadline check above raises
                self._take(message)
        finally:
            self.channel.settimeout(None)

    def _take(self, message: bytes) -> None:
        if message == b"S" and not self.standing_by:
            self.standing_by = True
        elif message.startswith(b"P") and message[1:].isdigit() and not self.pid:
            self.pid = int(message[1:])
        elif not message:  # both ends closed: it died (before it was ready, or waiting)
            raise OSError(errno.ECHILD, "the spare shim exited" + ("" if self.ready else " before it was ready"))
        else:
            raise OSError(errno.EPROTO, f"the spare shim sent {message[:16]!r}")


def fork_spare(*, wait: bool = True) -> Spare:
    """Double-fork a spare shim. With ``wait``, return once it is ready: named
    ``podshim-spare``, set up and waiting for its assignment (:meth:`Spare.wait_ready`); else at
    once (the caller hears from it, :meth:`Spare.hear`). The caller reaps the intermediate child
    (SIGCHLD), which exits once it has forked the spare. Raises OSError."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        pid = os.fork()
        if pid == 0:
            _spare_intermediate(theirs)
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    spare = Spare(0, ours)
    if wait:
        try:
            spare.wait_ready(START_TIMEOUT)
        except BaseException:
            spare.close()  # the intermediate child (and the spare, if any) exit on EOF
            raise
    return spare


def _spare_intermediate(channel: socket.socket) -> NoReturn:
    """In the spare's intermediate child: fork the spare, report its pid and exit."""
    code = 1
    try:
        # Not the template's listener, its callers' connections or its end of the pair: EOF
        # and ECONNREFUSED must reach whoever waits on those when the template dies.
        _close_all_but((channel.fileno(),))
        pid = os.fork()
        if pid == 0:
            _spare_wait(channel)
        channel.send(b"P%d" % pid)
        channel.close()
        code = 0
    except BaseException:
        pass
    finally:
        os._exit(code)


def _spare_wait(channel: socket.socket) -> NoReturn:
    """The spare: detached, it makes what does not depend on its sandbox (a network namespace, a
    running event loop with the reaper installed, the default cgroup v2 device program), waits
    for its assignment, then serves like any forked shim."""
    code = 1
    try:
        os.setsid()
        _close_all_but((channel.fileno(),))
        # Its output goes where the template's goes (ROOT/template.log for a detached one) until
        # it is assigned: a spare that fails before it serves is told in the template's log.
        _stdin_from_devnull()
        _fresh_signals()
        from shim.daemon import serve_when_assigned
        from shim.kernel.linux import set_process_name
        from shim.lib.logs import setup_logging

        set_process_name("podshim-spare")
        setup_logging()
        channel.send(b"S")  # standing by: only now does the template report us as its spare
        # After standing by: a Spawn that comes meanwhile waits in the socket, and the template
        # forks no later. CreateSandbox pins it; a host-network sandbox closes it unused.
        made_netns = _make_netns_ahead()
        from shim.kernel import devices

        devices.preload(devices.DEFAULT_RULES)  # the pod's cgroup v2 device program, ready for CreateSandbox
        code = serve_when_assigned(_Assignment(channel), made_netns)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


class _Assignment:
    """The spare's side of its channel to the template (:class:`shim.daemon.SpareChannel`): its
    sandbox's config comes first, then, once the template has made the bundle, bound the socket
    and written state.json, the socket. EOF at either step (the template closed the channel, or
    died) ends the spare."""

    def __init__(self, channel: socket.socket) -> None:
        self.channel = channel
        self.bundle = ""  # the config's, once it came

    async def _receive(self) -> tuple[bytes, list[int]]:
        from shim.lib.pipes import wait_ready

        await wait_ready(self.channel.fileno(), writable=False)
        message, fds, _, _ = socket.recv_fds(self.channel, 65536, 1)
        if not message:
            for fd in fds:
                os.close(fd)
        return message, fds

    async def config(self) -> Any:
        from shim.lib.logs import setup_logging
        from shim.sandbox.config import ShimConfig

        message, _ = await self._receive()
        if not message:
            return None
        assignment = json.loads(message)
        _reseed()
        if assignment.get("debug"):
            setup_logging(True)
        config = ShimConfig(**assignment["config"])
        self.bundle = config.bundle
        return config

    async def listener(self) -> socket.socket | None:
        message, fds = await self._receive()
        if not message:
            return None
        if message != _SERVE or len(fds) != 1:
            raise RuntimeError(f"the spare's socket came as {message[:16]!r} with {len(fds)} descriptors")
        os.set_inheritable(fds[0], False)  # received without close-on-exec
        listener = socket.socket(fileno=fds[0])
        self.channel.close()  # the template answered its Spawn already: nobody waits for our "R"
        _stdio_to(os.path.join(self.bundle, LOG_FILE))
        return listener


def _make_netns_ahead() -> int | None:
    """A network namespace for the spare's sandbox (:func:`shim.kernel.netns.make_netns`), or None
    when none can be made: CreateSandbox makes one then, only the head start is lost."""
    import logging

    from shim.kernel import netns

    try:
        return netns.make_netns()
    except Exception as exc:
        logging.getLogger("shim").warning("cannot make a network namespace ahead: %s", exc)
        return None


def _give_config(spare: Spare, config: Any, debug: bool) -> bool:
    """Tell ``spare`` its sandbox (it makes its pieces meanwhile); False if it is gone."""
    try:
        spare.channel.send(json.dumps({"config": config.asdict(), "debug": debug}).encode())
    except OSError:
        return False
    return True


def _give_socket(spare: Spare, sock: socket.socket) -> bool:
    """Hand ``spare`` its bound socket: it serves; False if it is gone."""
    try:
        socket.send_fds(spare.channel, [_SERVE], [sock.fileno()])
    except OSError:
        return False
    return True


def spawn_shim(config: Any, *, debug: bool = False, double_fork: bool = False,
               spare: Spare | None = None) -> dict[str, Any]:
    """Start a detached shim for ``config`` (a ShimConfig) and return its bootstrap result.

    If a live shim already serves the socket, its bootstrap is returned instead. Raises
    Unavailable (with the tail of the shim's log) when the shim does not come up within
    :data:`START_TIMEOUT`. With ``double_fork`` the intermediate child may outlive this call by
    a moment: the caller reaps it (SIGCHLD).
    ``spare``: a :class:`Spare` to use instead of forking, spent and closed here: told the
    sandbox first, it is ended when it will not serve it (a live shim serves the socket already,
    or the bundle or the socket cannot be made); a dead spare falls back to forking.
    """
    # The spare makes its sandbox's pieces while the bundle, the socket and state.json are made
    # here (on another CPU): it only serves once it has the socket.
    if spare is not None and not _give_config(spare, config, debug):
        spare.close()  # dead: the shim is forked here instead
        spare = None
    try:
        ensure_private_dir(config.bundle, 0o700)
        address = socket_address(config.socket_path)
        sock = bind_listener(config.socket_path)
        if sock is None:
            try:
                result = read_json(os.path.join(config.bundle, BOOTSTRAP_FILE))
            except (OSError, ValueError):
                result = None
            if not isinstance(result, dict) or result.get("address") != address:
                result = bootstrap(address, 0)
            answer: dict[str, Any] = result
            return answer
        if spare is not None:
            # The spare's first state.json, before it can serve: nobody can call it yet, so
            # this hides no newer record of its own, and whoever dies from here on leaves a shim
            # that `podshim delete` finds.
            try:
                start_time = _record_shim(config, spare.pid)
            except BaseException:
                # No shim will serve the socket: left listening (until collected) and on disk, it
                # would pass for a live shim's, and a repeated Spawn would answer it.
                sock.close()
                unlink_quietly(config.socket_path)
                raise
            if _give_socket(spare, sock):
                sock.close()
                # Answered now: the socket is bound and listening, so a call made at once waits
                # in its backlog until the spare serves (its set-up runs meanwhile, instead of
                # before the answer; so does bootstrap.json's write, which is why it comes after
                # the assignment). A spare that dies first closes the socket: that call fails
                # UNAVAILABLE, and state.json names the shim for `podshim delete`.
                result = bootstrap(address, spare.pid, start_time)
                write_json_atomic(os.path.join(config.bundle, BOOTSTRAP_FILE), result, mode=0o644, durable=False)
                return result
    finally:
        if spare is not None:  # told its sandbox: it serves it now, or it can be no one's spare (it exits)
            spare.close()
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        _become_shim(config, sock, ready_r, ready_w, debug, double_fork)
    if not double_fork:
        _record_shim(config, pid)
    os.close(ready_w)
    sock.close()
    try:
        # With a double fork (the template) the intermediate child exits once it has recorded
        # the shim: the caller reaps it (SIGCHLD).
        shim_pid, ready = _wait_ready(ready_r, START_TIMEOUT, want_pid=double_fork)
    finally:
        os.close(ready_r)
    return _started(config, address, shim_pid or pid, pid if not double_fork else None, ready)


def detach_process(run: Callable[[int], int], log_path: str, *, keep_fds: tuple[int, ...] = (),
                   timeout: float = START_TIMEOUT, what: str = "the process") -> int:
    """Fork ``run(ready_fd)`` into its own session, stdio to ``log_path``, every other descriptor
    of ours but ``keep_fds`` closed; return its pid once it wrote "R" to ``ready_fd``.

    The child is not waited for: it outlives the caller, as a shim outlives ``podshim start``.
    Raises Unavailable (with the tail of its log) when it does not say it is ready within
    ``timeout``; it is killed and reaped then.
    """
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(ready_r)
            os.setsid()
            _close_all_but((ready_w, *keep_fds))
            _stdio_to(log_path)
            _fresh_signals()
            code = run(ready_w)
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(ready_w)
    try:
        _, ready = _wait_ready(ready_r, timeout)
    finally:
        os.close(ready_r)
    if not ready:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        tail = _log_tail(log_path, 5)
        raise Unavailable(f"{what} did not come up within {timeout:.0f}s" + (f"; its log says:\n{tail}" if tail else ""))
    return pid


def _started(config: Any, address: str, shim_pid: int, child_pid: int | None, ready: bool) -> dict[str, Any]:
    """The bootstrap of a shim that said it serves; or, if it did not, end it and say why."""
    if not ready:
        _abandon(shim_pid, child_pid, config.socket_path)
        tail = _log_tail(os.path.join(config.bundle, LOG_FILE))
        raise Unavailable(f"the shim did not come up within {START_TIMEOUT:.0f}s"
                          + (f"; its log says:\n{tail}" if tail else ""))
    result = bootstrap(address, shim_pid)
    write_json_atomic(os.path.join(config.bundle, BOOTSTRAP_FILE), result, mode=0o644, durable=False)
    return result


def _record_shim(config: Any, pid: int) -> int | None:
    """Write the shim's first state.json at once, from the process that forked it: whoever dies
    from now on, `podshim delete` can find the shim and end it. Nothing can have called the
    shim yet (its address is not out), so this never hides a newer record of the shim's own.
    Returns the shim's start time, as recorded (None: it is gone already).
    """
    start_time = proc_start_time(pid)
    write_state(config.bundle, SandboxRecord(namespace=config.namespace, sandbox_id=config.sandbox_id, state=STATE_NEW,
                                             shim_pid=pid, shim_start_time=start_time,
                                             socket_path=config.socket_path))
    return start_time


def _abandon(shim_pid: int, child_pid: int | None, socket_path: str) -> None:
    try:
        os.kill(shim_pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if child_pid is not None:
        os.waitpid(child_pid, 0)
    unlink_quietly(socket_path)


def _wait_ready(fd: int, timeout: float, *, want_pid: bool = False) -> tuple[int | None, bool]:
    """Read ``P<pid>\\n`` (double fork) and ``R`` (serving) from the ready pipe.

    ``want_pid``: the shim's pid comes from the intermediate child of a double fork, which
    writes it after recording the shim, so a shim that comes up fast says ``R`` first; reading
    stops only once both are in (or at EOF: every writer is gone).
    """
    deadline = time.monotonic() + timeout
    data = b""
    while b"R" not in data or (want_pid and _pid_line(data) is None):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        r, _, _ = select.select([fd], [], [], left)
        if not r:
            break
        chunk = os.read(fd, 64)
        if not chunk:
            break
        data += chunk
    return _pid_line(data), b"R" in data


def _pid_line(data: bytes) -> int | None:
    """The pid of the last whole ``P<pid>\\n`` in ``data`` (an ``R`` may come before it)."""
    found = re.findall(_PID_LINE, data)
    return int(found[-1]) if found else None


def _become_shim(config: Any, sock: socket.socket, ready_r: int, ready_w: int, debug: bool,
                 double_fork: bool) -> None:
    """In the forked child: (fork again,) detach, and serve. Never returns."""
    code = 1
    try:
        os.close(ready_r)
        if double_fork:
            pid = os.fork()
            if pid:
                _record_shim(config, pid)
                os.write(ready_w, b"P%d\n" % pid)
                os._exit(0)
        os.setsid()
        _close_all_but((sock.fileno(), ready_w))
        _stdio_to(os.path.join(config.bundle, LOG_FILE))
        _fresh_signals()
        _reseed()
        from shim.daemon import serve_forever
        from shim.lib.logs import setup_logging

        setup_logging(debug)
        os.set_inheritable(ready_w, False)
        code = serve_forever(config, sock, ready_fd=ready_w, recorded=True)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _fresh_signals() -> None:
    """A fresh process in all but name: default signal dispositions (the random state is
    reseeded too, or every shim of a template would share the template's)."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)


def _reseed() -> None:
    """Reseed ``random`` if it is loaded: a forked child must not share its parent's random
    state (a module imported later seeds itself from os.urandom)."""
    random = sys.modules.get("random")
    if random is not None:
        random.seed()


def _close_all_but(keep: tuple[int, ...]) -> None:
    """Close every descriptor above stdio (0-2) that the caller may have leaked to us but ``keep``."""
    low = 3
    for fd in sorted(fd for fd in set(keep) if fd >= 3):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)


def occupy_stdio() -> None:
    """Open /dev/null as each of stdin, stdout and stderr that is closed (a process started with
    ``2>&-``), so that no descriptor opened later takes that number and is handed on to a child
    as its input or output (a spare shim keeps its template's stdio until it serves)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: ``fd``, the ones below are open
            if null == fd:
                os.set_inheritable(fd, True)
            else:
                os.dup2(null, fd)
                os.close(null)


def _stdin_from_devnull() -> None:
    devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    os.dup2(devnull, 0)
    os.close(devnull)


def _stdio_to(log_path: str) -> None:
    """stdin from /dev/null; stdout and stderr appended to ``log_path`` (the bundle's log)."""
    _stdin_from_devnull()
    # Never through a link, as with the tasks' logs (shim.runtime.crilog).
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NOCTTY,
                     0o600)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
