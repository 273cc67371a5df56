"""Making a detached shim: bind its socket, fork it into its own session, wait until it serves.

Two callers share this one path: ``podshim start`` (a short-lived process: one fork, and the
shim is re-parented when ``start`` exits) and the template (long-lived: a double fork, so the
template is never the shim's parent and may die or restart under it).
"""

from __future__ import annotations

import errno
import os
import random
import select
import signal
import socket
import time
from typing import Any

from .linux import proc_start_time
from .paths import (BOOTSTRAP_FILE, BOOTSTRAP_VERSION, LOG_FILE, PROTOCOL, STATE_FILE, read_json, socket_address,
                    write_json_atomic)
from .rpc.status import Unavailable

__all__ = ["START_TIMEOUT", "CAN_CONNECT_TIMEOUT", "bind_listener", "bootstrap", "spawn_shim", "ensure_dir"]

#: How long a spawner waits for the forked shim to accept; below the Controller's SPAWN_TIMEOUT
#: (10 s), so `podshim start` always ends its own child and reports before it is killed.
START_TIMEOUT = 8.0
#: A socket that accepts a connection within this is a live shim (containerd: 100 ms).
CAN_CONNECT_TIMEOUT = 0.1


def ensure_dir(path: str, mode: int) -> None:
    """Create ``path`` (and parents) and make sure it has exactly ``mode``."""
    os.makedirs(path, mode=mode, exist_ok=True)
    if os.stat(path).st_mode & 0o777 != mode:
        os.chmod(path, mode)


def _can_connect(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    s.settimeout(CAN_CONNECT_TIMEOUT)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def bind_listener(path: str) -> socket.socket | None:
    """Bind and listen on ``path`` (0600, in a 0700 dir). Returns None if a live shim owns it;
    a stale socket file left by a dead shim is replaced."""
    ensure_dir(os.path.dirname(path), 0o700)
    for attempt in (1, 2):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old_umask = os.umask(0o177)  # the socket is born 0600: no window where others can connect
        try:
            sock.bind(path)
        except OSError as exc:
            sock.close()
            if exc.errno != errno.EADDRINUSE or attempt == 2:
                raise
            if _can_connect(path):
                return None
            os.unlink(path)  # stale: nobody accepts on it
            continue
        finally:
            os.umask(old_umask)
        sock.listen(256)
        return sock
    raise AssertionError("unreachable")


def bootstrap(address: str, pid: int) -> dict[str, Any]:
    """The bootstrap result printed by ``podshim start`` and kept in bootstrap.json."""
    return {"version": BOOTSTRAP_VERSION, "address": address, "protocol": PROTOCOL, "pid": pid}


def _log_tail(bundle: str, lines: int = 10) -> str:
    try:
        with open(os.path.join(bundle, LOG_FILE), "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def spawn_shim(config: Any, *, debug: bool = False, double_fork: bool = False,
               close_fds: tuple[int, ...] = ()) -> dict[str, Any]:
    """Start a detached shim for ``config`` (a ShimConfig) and return its bootstrap result.

    If a live shim already serves the socket, its bootstrap is returned instead. Raises
    Unavailable (with the tail of the shim's log) when the shim does not come up within
    :data:`START_TIMEOUT`. ``close_fds``: descriptors of the caller the shim must not keep.
    With ``double_fork`` the intermediate child outlives this call by a cgroup grace period
    (see :func:`shim.cgroups.start_attach_grace_period`): the caller reaps it (SIGCHLD).
    """
    ensure_dir(config.bundle, 0o700)
    address = socket_address(config.socket_path)
    sock = bind_listener(config.socket_path)
    if sock is None:
        try:
            result = read_json(os.path.join(config.bundle, BOOTSTRAP_FILE))
        except (OSError, ValueError):
            result = None
        if not isinstance(result, dict) or result.get("address") != address:
            result = bootstrap(address, 0)
        return result
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        _become_shim(config, sock, ready_r, ready_w, debug, double_fork)
    if not double_fork:
        _record_shim(config, pid)
    os.close(ready_w)
    sock.close()
    try:
        if not double_fork:
            _start_attach_grace_period()  # while the shim boots
        # With a double fork the intermediate child does that, then exits: the caller reaps it
        # (the template, on SIGCHLD), since waiting here would wait out the grace period.
        shim_pid, ready = _wait_ready(ready_r, START_TIMEOUT)
    finally:
        os.close(ready_r)
    shim_pid = shim_pid or pid
    if not ready:
        _abandon(shim_pid, pid if not double_fork else None, config.socket_path)
        tail = _log_tail(config.bundle)
        raise Unavailable(f"the shim did not come up within {START_TIMEOUT:.0f}s"
                          + (f"; its log says:\n{tail}" if tail else ""))
    result = bootstrap(address, shim_pid)
    write_json_atomic(os.path.join(config.bundle, BOOTSTRAP_FILE), result, mode=0o644, durable=False)
    return result


def _record_shim(config: Any, pid: int) -> None:
    """Write the shim's first state.json at once, from the process that forked it: whoever dies
    from now on, `podshim delete` can find the shim and end it. Nothing can have called the
    shim yet (its address is not out), so this never hides a newer record of the shim's own.
    """
    record = {"namespace": config.namespace, "sandbox_id": config.sandbox_id, "state": "new", "shim_pid": pid,
              "shim_start_time": proc_start_time(pid), "socket_path": config.socket_path}
    write_json_atomic(os.path.join(config.bundle, STATE_FILE), record, durable=False)


def _abandon(shim_pid: int, child_pid: int | None, socket_path: str) -> None:
    try:
        os.kill(shim_pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if child_pid is not None:
        os.waitpid(child_pid, 0)
    try:
        os.unlink(socket_path)
    except FileNotFoundError:
        pass


def _wait_ready(fd: int, timeout: float) -> tuple[int | None, bool]:
    """Read ``P<pid>\\n`` (double fork) and ``R`` (serving) from the ready pipe."""
    deadline = time.monotonic() + timeout
    data = b""
    while b"R" not in data:
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
    pid = None
    for line in data.split(b"\n"):
        if line.startswith(b"P") and line[1:].isdigit():
            pid = int(line[1:])
    return pid, b"R" in data


def _start_attach_grace_period() -> None:
    """See :func:`shim.cgroups.start_attach_grace_period`: a failure only costs speed."""
    try:
        from .cgroups import start_attach_grace_period

        start_attach_grace_period()
    except Exception:
        pass


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
                os.close(ready_w)
                sock.close()
                _start_attach_grace_period()
                os._exit(0)
        _detach(config.bundle, keep=(sock.fileno(), ready_w))
        # A fresh process in all but name: default signal dispositions, a new random state
        # (the template's would otherwise be shared by every shim it forks).
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        random.seed()
        from .daemon import serve_forever, setup_logging

        setup_logging(debug)
        os.set_inheritable(ready_w, False)
        code = serve_forever(config, sock, ready_fd=ready_w, recorded=True)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _detach(bundle: str, keep: tuple[int, ...]) -> None:
    """Leave the caller's session and process group; stdio to /dev/null and the bundle's log;
    close every other descriptor the caller may have leaked to us."""
    os.setsid()
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    log_fd = os.open(os.path.join(bundle, LOG_FILE), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
