"""The shim template: a process that has paid Python's start-up once and forks shims on request.

A shim started by exec pays Python's start-up and the imports of asyncio, uvloop and msgpack
(time and memory) before it serves anything. The template imports everything a shim needs, freezes its heap
(``gc.freeze()``, so the children's collector never touches — and so never copies — those
pages), and waits on a control socket. It keeps SPARES *spare* shims forked ahead (a double
fork, so the template is never the shim's parent and may die or restart freely), detached and
waiting; asked to spawn, it tells the oldest ready spare its sandbox (whose pieces the spare makes
meanwhile), binds the socket and records the spare, hands it the socket and answers at once
(calls wait in the socket's backlog until the shim serves), then forks the next spare without
waiting for it (the poll loop hears when it is ready). Without a live spare it forks on the spot. Either way the shim takes the same serve path as ``podshim
serve`` and the result is the bootstrap ``podshim start`` prints.

The control socket speaks the podshim protocol: service ``podshim.template.v1.Template``,
methods ``Spawn {namespace, sandbox_id, bundle, runtime_root, pause_binary?, containerd_address?, debug?}`` → the
bootstrap map, and ``Ping`` → ``{pid, spawned, runtime_root, spare_pid, spare_pids}`` (protocol.md 7.5). It
is served without an event loop, one call at a time: forking from inside a running event loop
would hand the child a loop it must not touch. Its poll loop serves each connection as its peer
sends (:class:`shim.rpc.blocking.ServedConnection`), so no caller waits for another's to send its
request or to close, and one that sends nothing for CONTROL_IO_TIMEOUT is dropped.

One template per runtime root: a template holds an exclusive ``flock`` on ``ROOT/template.lock``
for its whole life (the kernel drops it when the process ends), and a second one waits for it
(``LOCK_TIMEOUT``: long enough for a template that is leaving, not for one that stays) before it
refuses to start. A template is *starting* from the moment a process decides to start one until
it holds that lock: all that time someone holds ``ROOT/template.start.lock`` (the starter, then
the template itself, whichever lives), and :func:`stop_template` takes it first, so that it
never misses a template that does not hold its lock yet. A template also remembers the podshim code it loaded (:mod:`shim.launch.install`)
and, before each Spawn, checks that the files on disk are still those (an inotify watch on them
tells it without a stat of each, :class:`shim.launch.install.CodeWatch`): after an upgrade (or an
edit of an editable install) it answers FAILED_PRECONDITION, removes its control socket and exits,
so that no shim is forked from old code; the spawner then starts a new template. Shims it forked
keep running: it is not their parent.

A template ends by itself once nothing needs it (protocol.md 7.5, "Life"). Its *users* are the
processes that connected to its control socket (a Controller's spawner asks it for each shim, and
pings it when the Controller opens), each watched through a pidfd from its first call; its
*sandboxes* are the shim sockets in ``s/`` of every runtime root it served. When none of its users
runs and no shim socket is left, for a whole ``idle_grace`` (checked twice that far apart, so a
daemon that restarts finds it still there), it exits as on SIGTERM, and its spares with it. None of
this is on a Spawn's path: the peer's pid is read once per connection, its pidfd opened after the
answer, and the sockets are only looked at while no user runs.

While it runs, a template also holds the default cgroup parent (podshim/<namespace>) of every
namespace it spawned into (:func:`shim.kernel.cgroups.hold_parent`), so that sandboxes make and
remove their own directory only; it removes its holds when it exits, and those of templates
killed before they could (at start).
"""

from __future__ import annotations

import errno
import fcntl
import functools
import gc
import logging
import os
import select
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

from shim.api.identifiers import validate_identifier
from shim.api.names import TEMPLATE_LOCK, TEMPLATE_SERVICE, TEMPLATE_START_LOCK
from shim.api.paths import control_socket_path, socket_dir, socket_path
from shim.kernel.linux import set_process_name
from shim.launch.install import CodeWatch, code_files
from shim.launch.spawn import START_TIMEOUT, Spare, bind_listener, fork_spare, occupy_stdio, spawn_shim
from shim.lib.files import ensure_private_dir, unlink_quietly
from shim.lib.program import long_running
from shim.rpc.blocking import ServedConnection
from shim.rpc.messages import Request, optional, require
from shim.rpc.status import FailedPrecondition, InvalidArgument, RpcError

__all__ = ["CONTROL_IO_TIMEOUT", "IDLE_GRACE", "LOCK_TIMEOUT", "START_WAIT", "STOP_TIMEOUT", "TemplateRunning", "run_template",
           "stop_template", "template_pid"]

log = logging.getLogger(__name__)

#: A control client that sends nothing for this long is dropped (calls are served in turn).
CONTROL_IO_TIMEOUT = 5.0
#: How long a new template waits for the runtime root's template lock: a template that is
#: leaving (stale code, SIGTERM) lets go of it within milliseconds; one that stays never does.
LOCK_TIMEOUT = 5.0
#: How long stop_template waits for a template to exit after SIGTERM before it sends SIGKILL.
STOP_TIMEOUT = 5.0
#: How long stop_template waits for the start lock: a template being started holds its own lock
#: (or died) within spawn.START_TIMEOUT of its starter's decision, or the starter kills it.
START_WAIT = 15.0
#: How long a template with no user running and no sandbox left waits before it exits: longer
#: than a daemon's restart, so the restarted daemon's first pod still finds it.
IDLE_GRACE = 30.0
#: Spares kept forked ahead. A spare is ready a double fork and two schedulings after it was
#: forked: with one, a burst of Spawns (a node starting a hundred pods) waits for each next spare
#: in turn; with two, each Spawn takes the spare forked a Spawn earlier, which has had that long.
SPARES = 2


class TemplateRunning(OSError):
    """Another template holds the runtime root's template lock (it runs, or is starting)."""


def _preload() -> None:
    """Import everything a shim imports, so a forked shim imports nothing."""
    import asyncio  # noqa: F401  (preloaded for the shims forked from here)

    import msgpack  # noqa: F401  (preloaded for the shims forked from here)

    from shim import cleanup, daemon  # noqa: F401  (preloaded for the shims forked from here)
    from shim.kernel import cgroups, devices, linux, netns, reaper  # noqa: F401  (preloaded for the shims forked from here)
    from shim.lib import notify  # noqa: F401  (preloaded for the shims forked from here)
    from shim.rpc import client, server  # noqa: F401  (preloaded for the shims forked from here)
    from shim.rpc.channel import install_uvloop
    from shim.runtime import native, pause  # noqa: F401  (preloaded for the shims forked from here)
    from shim.runtime.oci import backend, elf  # noqa: F401  (the runc and crun handlers; elf: the pause check)
    from shim.sandbox import events, sandbox, service, tasks  # noqa: F401  (tasks: with a shim's first Task call)

    install_uvloop()
    cgroups.birth_in_v2_allowed()  # asked once here: every shim forked from us inherits the answer
    _compile_runtime_default()
    devices.program(devices.DEFAULT_RULES)  # made once here: a spare only loads it
    try:
        import uvloop  # noqa: F401  (preloaded for the shims forked from here)
    except ImportError:  # pragma: no cover
        pass


def _compile_runtime_default() -> None:
    """Compile the RuntimeDefault seccomp profile of the default capabilities (what kubelet asks
    for most pods and their containers, with the node's seccompDefault) into the compiled-profile
    cache, so that every shim forked from here finds it there: a shim's own first compile is
    libseccomp's load and tens of milliseconds of CPU in its CreateSandbox."""
    from shim.api.defaults import DEFAULT_CAPABILITIES
    from shim.cri.seccomp_default import default_profile
    from shim.kernel import seccomp

    try:
        seccomp.compile_profile(default_profile(DEFAULT_CAPABILITIES))
    except seccomp.ProfileError as exc:  # no libseccomp: a shim asked for a profile says so itself
        log.warning("cannot compile the RuntimeDefault seccomp profile ahead: %s", exc)


def _preload_containerd() -> None:
    """Import what a shim that serves containerd imports besides (containerd's services and the CRI
    translation of its pods), and freeze it as :func:`_serve` freezes the rest: loaded once a Spawn
    first asks for such a shim, so the shims forked after share it and a template that never
    serves containerd pays nothing for it."""
    try:
        from shim.containerd import events, metrics, services, stdio, tasks  # noqa: F401  (preloaded for the shims forked from here)
        from shim.cri import requests, security  # noqa: F401  (preloaded for the shims forked from here)
        from shim.cri.api import api_pb2  # noqa: F401  (preloaded for the shims forked from here)
        from shim.lib import podfiles  # noqa: F401  (preloaded for the shims forked from here)

        services.warm()  # (what a pod's first calls make and keep: made here, shared by the shims)
    except ImportError as exc:  # not generated (.ci/install): each shim says so itself
        log.warning("cannot preload containerd's services: %s", exc)
        return
    gc.collect()
    gc.freeze()


def _hold(namespace: str) -> Any:
    """A hold on the default cgroup parent of ``namespace`` (:func:`shim.kernel.cgroups.hold_parent`),
    or None when it cannot be made (logged: sandboxes then make and prune the parent themselves)."""
    from shim.kernel.cgroups import DEFAULT_PARENT, hold_parent

    try:
        return hold_parent(f"{DEFAULT_PARENT}/{namespace}")
    except RpcError as exc:
        log.warning("cannot hold the cgroup parent of namespace %s: %s", namespace, exc.message)
        return None


def _lock(runtime_root: str, timeout: float) -> int:
    """Take the runtime root's template lock (waiting up to ``timeout`` seconds for a template
    that is leaving) and write our pid into it; the descriptor, kept for the template's life.
    Raises TemplateRunning when another template keeps it."""
    path = os.path.join(runtime_root, TEMPLATE_LOCK)
    deadline = time.monotonic() + timeout
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not _flock_within(fd, max(deadline - time.monotonic(), 0.001)):
                    holder = _lock_holder(path) or "?"
                    raise TemplateRunning(f"another template (pid {holder}) runs on {runtime_root} "
                                          f"(it holds {path})") from None
            if _names(path, fd):
                os.ftruncate(fd, 0)
                os.pwrite(fd, b"%d\n" % os.getpid(), 0)
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # its template removed it as it left: lock the file there now


def _names(path: str, fd: int) -> bool:
    """Whether ``path`` still names the file open on ``fd``."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def _flock_within(fd: int, timeout: float) -> bool:
    """An exclusive blocking flock of ``fd`` that a timer interrupts (no polling: SIGALRM's
    handler raises out of it); whether it was taken within ``timeout`` seconds."""
    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True
    except TimeoutError:
        return False
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _start_lock(runtime_root: str, timeout: float) -> int:
    """Take the runtime root's start lock (see the module docstring), waiting up to ``timeout``
    seconds for the start under way; the descriptor. Raises TemplateRunning when it is not let go."""
    path = os.path.join(runtime_root, TEMPLATE_START_LOCK)
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    if not _flock_within(fd, timeout):
        os.close(fd)
        holder = _lock_holder(path) or "?"
        raise TemplateRunning(f"a template is being started on {runtime_root} (by pid {holder}, which holds {path}) "
                              f"and still was after {timeout:.0f}s")
    return fd


def _lock_holder(path: str) -> int:
    """The pid holding a flock on ``path`` (from /proc/locks), or 0."""
    try:
        st = os.stat(path)
        with open("/proc/locks") as f:
            table = f.read()
    except OSError:
        return 0
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        fields = line.split()  # "1: FLOCK ADVISORY WRITE <pid> <maj:min:inode> <start> <end>"
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == where and fields[4].isdigit():
            return int(fields[4])
    return 0


def template_pid(runtime_root: str) -> int:
    """The pid of the template of ``runtime_root`` (serving, or starting: the holder of its
    lock), or 0 when none runs there."""
    return _lock_holder(os.path.join(runtime_root, TEMPLATE_LOCK))


def stop_template(runtime_root: str, timeout: float = STOP_TIMEOUT) -> int:
    """Stop the template of ``runtime_root``: SIGTERM through a pidfd, SIGKILL after ``timeout``
    seconds; returns once it exited. A template being started is waited for (``START_WAIT``)
    and stopped as it serves, and none starts meanwhile. Its spares go with it; the shims it
    forked stay. Returns its pid, or 0 when none ran. Raises TemplateRunning when a start does
    not end within ``START_WAIT``, OSError when it cannot be signalled (another user's)."""
    try:
        start_fd = _start_lock(runtime_root, START_WAIT)
    except FileNotFoundError:  # no runtime root: no template
        return 0
    try:
        return _stop(runtime_root, timeout)
    finally:
        os.close(start_fd)


def _stop(runtime_root: str, timeout: float) -> int:
    pid = template_pid(runtime_root)
    if not pid:
        return 0
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return 0
    try:
        if template_pid(runtime_root) != pid:  # it ended before we held it: the pid may be reused
            return 0
        signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        if not select.select([pidfd], [], [], timeout)[0]:
            log.warning("the template of %s (pid %d) ignored SIGTERM for %.0fs: SIGKILL", runtime_root, pid, timeout)
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            select.select([pidfd], [], [], timeout)
    finally:
        os.close(pidfd)
    return pid


class _Template:
    def __init__(self, runtime_root: str, pause_binary: str | None, listener: socket.socket, path: str):
        self.runtime_root = runtime_root
        self.pause_binary = pause_binary
        self.listener = listener
        self.path = path
        self.inode = os.stat(path).st_ino  # the socket file is ours only while it has this inode
        self.spawned = 0
        self.containerd_loaded = False  # _preload_containerd ran
        self.spares: list[Spare] = []  # forked ahead, oldest first; ready or still starting
        self.code = CodeWatch(code_files())
        self.stale = False
        self.namespaces: set[str] = set()  # those spawned into
        self.holds: dict[str, Any] = {}  # namespace -> its default cgroup parent's hold (or None)
        self.roots = {runtime_root}  # the runtime roots spawned into: where its sandboxes are
        self.users: dict[int, int] = {}  # pid -> pidfd of each user that may still run

    def add_user(self, pid: int) -> None:
        """Watch ``pid`` (a process that called us) until it exits. A pid we cannot see (another
        pid namespace: 0) or that is gone already is no user."""
        if pid <= 0 or pid in self.users:
            return
        try:
            self.users[pid] = os.pidfd_open(pid)
        except OSError:
            pass

    def drop_user(self, pid: int) -> None:
        os.close(self.users.pop(pid))

    def has_sandboxes(self) -> bool:
        """Whether a shim socket is left in any runtime root we served (a shim removes its own as
        it ends, ``podshim delete`` a dead one's)."""
        for root in self.roots:
            try:
                with os.scandir(socket_dir(root)) as entries:
                    if any(not e.name.startswith(".") for e in entries):
                        return True
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.warning("cannot look for sandboxes in %s: %s; counting them as there", socket_dir(root), exc)
                return True
        return False

    def close_users(self) -> None:
        for pid in list(self.users):
            self.drop_user(pid)

    def unlink(self) -> None:
        """Remove our control socket's file, unless it is already another template's."""
        try:
            if os.stat(self.path).st_ino == self.inode:
                os.unlink(self.path)
        except FileNotFoundError:
            pass

    def check_code(self) -> None:
        """Refuse to fork from code that is no longer what is installed (see the module docstring)."""
        if self.stale or self.code.changed():
            if not self.stale:
                log.warning("the installed podshim changed since this template started; leaving")
                self.stale = True
                self.retire()
                self.unlink()  # before answering: whoever asks next finds no template, not this one
            raise FailedPrecondition(f"the installed podshim changed since this template (pid {os.getpid()}) "
                                     "started: it exits; start a new one")

    def replenish(self, caller: int = 0) -> None:
        """Fork spare shims up to SPARES (without waiting for them: :meth:`hear` sees them get
        ready), hold the default cgroup parent of each namespace spawned into, watch the caller as
        a user, and read what happened to the code meanwhile (after answering: nobody waits for
        any of it)."""
        self.add_user(caller)
        while len(self.spares) < SPARES and not self.stale:
            try:
                self.spares.append(fork_spare(wait=False))
            except OSError as exc:  # the next Spawn forks then
                log.warning("cannot fork a spare shim: %s", exc)
                break
        for namespace in self.namespaces - self.holds.keys():
            self.holds[namespace] = _hold(namespace)
        self.code.look()

    def release_holds(self) -> None:
        """Remove our holds on default cgroup parents, and with them the parents left empty."""
        for namespace, hold in self.holds.items():
            if hold is not None:
                try:
                    hold.remove()
                except RpcError as exc:
                    log.warning("cannot remove the cgroup hold of namespace %s: %s", namespace, exc.message)
        self.holds.clear()

    def hear(self, spare: Spare, *, wait: bool = False) -> bool:
        """Take what ``spare`` sent (with ``wait``, until it is ready, up to START_TIMEOUT);
        whether it is ready. One that died is dropped (the next Spawn forks another)."""
        try:
            if wait:
                spare.wait_ready(START_TIMEOUT)
            else:
                spare.hear()
        except OSError as exc:
            log.warning("spare shim %s: %s", spare.pid or "(pid not known yet)", exc)
            self.spares.remove(spare)
            spare.close()
            return False
        return spare.ready

    def take_spare(self) -> Spare | None:
        """The spare for a Spawn: the oldest ready one, else the oldest still starting, once ready
        (up to START_TIMEOUT); None when none is had (the Spawn forks its shim then)."""
        for spare in list(self.spares):
            self.hear(spare)
        for spare in sorted(self.spares, key=lambda spare: not spare.ready):  # (a stable sort: oldest first)
            if self.hear(spare, wait=True):
                self.spares.remove(spare)
                return spare
        return None

    def retire(self) -> None:
        for spare in self.spares:
            spare.close()
        self.spares.clear()
        self.code.close()  # no Spawn is served from here on

    def handlers(self) -> dict[tuple[str, str], Callable[[Request], dict[str, Any]]]:
        return {(TEMPLATE_SERVICE, "Spawn"): self.spawn, (TEMPLATE_SERVICE, "Ping"): self.ping}

    def ping(self, request: Request) -> dict[str, Any]:
        # A spare that is being forked is waited for: a Ping that follows a Spawn (or the start)
        # names the spare forked after it, ready.
        for spare in list(self.spares):
            self.hear(spare, wait=True)
        ready = [spare.pid for spare in self.spares]
        return {"pid": os.getpid(), "spawned": self.spawned, "runtime_root": self.runtime_root,
                "spare_pid": ready[0] if ready else 0, "spare_pids": ready}

    def spawn(self, request: Request) -> dict[str, Any]:
        from shim.sandbox.sandbox import ShimConfig

        self.check_code()
        p = request.payload
        namespace = validate_identifier("namespace", require(p, "namespace", str))
        sandbox_id = validate_identifier("sandbox id", require(p, "sandbox_id", str))
        bundle = require(p, "bundle", str)
        if not os.path.isabs(bundle):
            raise InvalidArgument(f"bundle {bundle!r} must be an absolute path")
        runtime_root = os.path.normpath(optional(p, "runtime_root", str, self.runtime_root))
        config = ShimConfig(
            namespace=namespace,
            sandbox_id=sandbox_id,
            bundle=os.path.normpath(bundle),
            socket_path=socket_path(namespace, sandbox_id, runtime_root),
            runtime_root=runtime_root,
            pause_binary=optional(p, "pause_binary", str, self.pause_binary),
            containerd_address=optional(p, "containerd_address", str),
        )
        self.namespaces.add(namespace)
        self.roots.add(runtime_root)
        if config.containerd_address is not None and not self.containerd_loaded:
            self.containerd_loaded = True
            _preload_containerd()
        spare = self.take_spare()  # spent by spawn_shim whatever happens: the next is forked after
        result = spawn_shim(config, debug=optional(p, "debug", bool, False), double_fork=True, spare=spare)
        self.spawned += 1
        return result


def run_template(runtime_root: str, *, pause_binary: str | None = None, ready_fd: int | None = None,
                 start_lock_fd: int | None = None, lock_timeout: float = LOCK_TIMEOUT,
                 idle_grace: float = IDLE_GRACE) -> int:
    """Serve the control socket of ``runtime_root`` until SIGTERM/SIGINT, until the installed
    code changes under it, or until nothing needs it for ``idle_grace`` seconds (see the module
    docstring; 0 or less: never). Returns 0; leaves neither its control socket nor its lock file.

    ``start_lock_fd``: the runtime root's start lock, held by whoever started us (``template
    --detach``); without it we take it ourselves. Either way we let it go once we hold the
    template lock (see the module docstring).

    Raises TemplateRunning when another template keeps the runtime root's template lock (or
    another start its start lock) for ``lock_timeout`` seconds, OSError when the control socket
    cannot be bound.
    """
    occupy_stdio()  # before any descriptor of ours can take a closed one's number
    ensure_private_dir(runtime_root, 0o700)
    if start_lock_fd is None:
        start_lock_fd = _start_lock(runtime_root, lock_timeout)
    try:
        lock_fd = _lock(runtime_root, lock_timeout)
    finally:
        os.close(start_lock_fd)  # from here on stop_template sees us by our lock
    try:
        return _serve(runtime_root, pause_binary, ready_fd, idle_grace)
    finally:
        # Removed while still held: a template waiting for it finds it gone and makes its own.
        unlink_quietly(os.path.join(runtime_root, TEMPLATE_LOCK))
        os.close(lock_fd)  # only now may the next template bind: ours is unlinked


def _serve(runtime_root: str, pause_binary: str | None, ready_fd: int | None, idle_grace: float) -> int:
    _preload()
    set_process_name("podshim-tmpl")
    path = control_socket_path(runtime_root)
    listener = bind_listener(path)
    if listener is None:  # not a template (we hold the lock): something else listens there
        raise OSError(errno.EADDRINUSE, f"another process serves {path}")
    # Everything imported so far is shared with every shim forked from here: freezing it keeps
    # the children's garbage collector from writing to (and so copying) those pages.
    gc.collect()
    long_running()  # freezes it, and turns the collector on (started off: shim.lib.program)
    template = _Template(runtime_root, pause_binary, listener, path)
    from shim.kernel.cgroups import remove_stale_holds

    remove_stale_holds()  # of templates killed before they could remove theirs
    template.replenish()
    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True  # the wakeup pipe ends the poll

    def reap(signum: int, frame: Any) -> None:
        # The intermediate children of spawn_shim's double fork and of fork_spare exit on their
        # own once they have forked (and recorded) their shim; nothing waits for them but this.
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass

    # Every signal writes a byte here, so the poll below returns once a handler has run.
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, reap)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    log.info("template serving %s (pid %d)", path, os.getpid())
    if ready_fd is not None:
        try:
            os.write(ready_fd, b"R")
        except BrokenPipeError:  # our starter died meanwhile: we serve all the same
            pass
        os.close(ready_fd)
    allowed = {os.geteuid(), 0}
    handlers = template.handlers()
    poller = select.poll()
    poller.register(listener, select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    # The descriptors registered besides those two: the users' pidfds, the spares' channels and
    # the connections being served (each served as its peer sends: none waits for another).
    polled: set[int] = set()
    served: dict[int, tuple[ServedConnection, float]] = {}  # fd -> connection, when it is dropped if silent
    idle_checks = 0  # checks in a row, idle_grace apart, that found no user and no sandbox
    try:
        while not stopping and not template.stale:
            watched = (set(template.users.values()) | {spare.channel.fileno() for spare in template.spares}
                       | served.keys())
            for fd in polled - watched:
                poller.unregister(fd)
            for fd in watched - polled:
                poller.register(fd, select.POLLIN)
            polled = watched
            # With a user running nothing is checked; without one, every idle_grace seconds. A
            # connection is dropped once its peer sent nothing for CONTROL_IO_TIMEOUT.
            if served:
                first = min(deadline for _, deadline in served.values())
                timeout_ms = max(0, int((first - time.monotonic()) * 1000) + 1)
            else:
                timeout_ms = -1 if template.users or idle_grace <= 0 else int(idle_grace * 1000)
            ready = {fd for fd, _ in poller.poll(timeout_ms)}
            if wake_r in ready:
                while _drain(wake_r):
                    pass
            for spare in [spare for spare in template.spares if spare.channel.fileno() in ready]:
                template.hear(spare)
            ended = [pid for pid, pidfd in template.users.items() if pidfd in ready]
            for pid in ended:
                poller.unregister(template.users[pid])
                polled.discard(template.users[pid])
                template.drop_user(pid)
            now = time.monotonic()
            for fd, (connection, deadline) in list(served.items()):
                if fd in ready:
                    if connection.serve():
                        served[fd] = (connection, time.monotonic() + CONTROL_IO_TIMEOUT)
                    else:
                        del served[fd]
                elif deadline <= now:
                    connection.close()
                    del served[fd]
            if listener.fileno() in ready:
                connection = ServedConnection(listener.accept()[0], handlers, allowed_uids=allowed,
                                              timeout=CONTROL_IO_TIMEOUT)
                if connection.peer is not None and not connection.closed:
                    # The caller becomes a user once answered (replenish, after each answer).
                    connection.after_send = functools.partial(template.replenish, connection.peer.pid)
                    served[connection.fileno()] = (connection, time.monotonic() + CONTROL_IO_TIMEOUT)
                idle_checks = 0
            elif served or ended:
                idle_checks = 0  # a call is being served, or the grace runs from the last user's end
            elif not ready and not template.users:
                idle_checks = idle_checks + 1 if not template.has_sandboxes() else 0
                if idle_checks >= 2:
                    log.info("no user of this template runs and no sandbox is left since %.0fs: leaving",
                             idle_grace)
                    break
    finally:
        for connection, _ in served.values():
            connection.close()
        signal.set_wakeup_fd(-1)
        os.close(wake_r)
        os.close(wake_w)
        template.close_users()
        template.retire()
        listener.close()
        template.unlink()
        template.release_holds()
    log.info("template stopped after spawning %d shims", template.spawned)
    return 0


def _drain(fd: int) -> bool:
    """Read what is in the non-blocking pipe ``fd``; whether there was anything."""
    try:
        return bool(os.read(fd, 512))
    except BlockingIOError:
        return False
