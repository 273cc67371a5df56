"""``podshim``: the shim binary's actions, shaped like containerd's shim.

    podshim start  --namespace NS --id ID --bundle DIR [--runtime-root DIR]
    podshim serve  --namespace NS --id ID --bundle DIR [--runtime-root DIR]
    podshim delete --namespace NS --id ID --bundle DIR [--runtime-root DIR]

Bad arguments exit 2 with a sentence; a failure to start exits 1 with the reason and the tail
of the shim's log. Nothing heavy is imported until an action needs it, so ``start`` stays fast.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import select
import socket
import sys
import time

from .paths import (
    BOOTSTRAP_FILE,
    BOOTSTRAP_VERSION,
    DEFAULT_RUNTIME_ROOT,
    LOG_FILE,
    PROTOCOL,
    read_json,
    socket_address,
    socket_dir,
    socket_path,
    validate_identifier,
    write_json_atomic,
)
from .rpc.status import RpcError

__all__ = ["main", "START_TIMEOUT", "bind_listener"]

#: How long `podshim start` waits for the forked shim to accept.
START_TIMEOUT = 10.0
#: A socket that accepts a connection within this is a live shim (containerd: 100 ms).
CAN_CONNECT_TIMEOUT = 0.1


class UsageError(Exception):
    """Bad input from the command line: exit 2."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="podshim", description="The per-sandbox shim daemon of podshim.")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--namespace", required=True, help="namespace of the sandbox (an identifier)")
        sp.add_argument("--id", required=True, dest="sandbox_id", help="sandbox id (an identifier)")
        sp.add_argument("--bundle", required=True, help="the sandbox's bundle directory (absolute)")
        sp.add_argument("--runtime-root", default=os.environ.get("PODSHIM_RUNTIME_ROOT", DEFAULT_RUNTIME_ROOT),
                        help=f"root of runtime files; sockets live in ROOT/s (default {DEFAULT_RUNTIME_ROOT})")
        sp.add_argument("--debug", action="store_true", help="log at debug level")

    def daemon_flags(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--pause-binary", default=os.environ.get("PODSHIM_PAUSE_BINARY"),
                        help="pause binary (default: catatonit when installed, else the built-in pause)")

    for name, text in (("start", "start a detached shim and print its bootstrap JSON"),
                       ("serve", "run the shim in the foreground (systemd; honours LISTEN_FDS, NOTIFY_SOCKET)"),
                       ("delete", "clean up after a dead shim and print its exit as JSON")):
        sp = sub.add_parser(name, help=text, description=text)
        common(sp)
        if name != "delete":
            daemon_flags(sp)
    return p


def _config(args: argparse.Namespace):
    from .sandbox import ShimConfig  # the daemon's modules load only for actions that run one

    return ShimConfig(
        namespace=args.namespace,
        sandbox_id=args.sandbox_id,
        bundle=args.bundle,
        socket_path=socket_path(args.namespace, args.sandbox_id, args.runtime_root),
        runtime_root=args.runtime_root,
        pause_binary=args.pause_binary,
    )


def _validate(args: argparse.Namespace) -> None:
    try:
        validate_identifier("namespace", args.namespace)
        validate_identifier("sandbox id", args.sandbox_id)
        socket_path(args.namespace, args.sandbox_id, args.runtime_root)
    except RpcError as exc:
        raise UsageError(exc.message) from None
    if not os.path.isabs(args.bundle):
        raise UsageError(f"--bundle {args.bundle!r} must be an absolute path")
    args.bundle = os.path.normpath(args.bundle)
    args.runtime_root = os.path.normpath(args.runtime_root)


def _ensure_dir(path: str, mode: int) -> None:
    os.makedirs(path, mode=mode, exist_ok=True)
    st = os.stat(path)
    if st.st_mode & 0o777 != mode:
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
    _ensure_dir(os.path.dirname(path), 0o700)
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


def _bootstrap(address: str, pid: int) -> dict:
    return {"version": BOOTSTRAP_VERSION, "address": address, "protocol": PROTOCOL, "pid": pid}


def _log_tail(bundle: str, lines: int = 10) -> str:
    try:
        with open(os.path.join(bundle, LOG_FILE), "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _start(args: argparse.Namespace) -> int:
    _ensure_dir(args.bundle, 0o700)
    config = _config(args)
    address = socket_address(config.socket_path)
    sock = bind_listener(config.socket_path)
    if sock is None:
        # A live shim already serves this sandbox: report it instead of starting another.
        try:
            result = read_json(os.path.join(args.bundle, BOOTSTRAP_FILE))
        except (OSError, ValueError):
            result = None
        if not isinstance(result, dict) or result.get("address") != address:
            result = _bootstrap(address, 0)
        print(json.dumps(result))
        return 0
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the shim-to-be
        code = 1
        try:
            os.close(ready_r)
            _detach(args.bundle, keep=(sock.fileno(), ready_w))
            from .daemon import serve_forever, setup_logging
            setup_logging(args.debug)
            code = serve_forever(config, sock, ready_fd=ready_w)
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(ready_w)
    sock.close()
    ready = _wait_ready(ready_r, START_TIMEOUT)
    os.close(ready_r)
    if not ready:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        try:
            os.unlink(config.socket_path)
        except FileNotFoundError:
            pass
        tail = _log_tail(args.bundle)
        print(f"podshim start: the shim did not come up within {START_TIMEOUT:.0f}s"
              + (f"; its log says:\n{tail}" if tail else ""), file=sys.stderr)
        return 1
    result = _bootstrap(address, pid)
    write_json_atomic(os.path.join(args.bundle, BOOTSTRAP_FILE), result, mode=0o644, durable=False)
    print(json.dumps(result))
    return 0


def _wait_ready(fd: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        r, _, _ = select.select([fd], [], [], left)
        if r:
            return os.read(fd, 1) == b"R"


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
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)


def _serve(args: argparse.Namespace) -> int:
    from .daemon import serve_forever, setup_logging
    from .notify import listen_fds

    setup_logging(args.debug)
    _ensure_dir(args.bundle, 0o700)
    config = _config(args)
    fds = listen_fds()
    if fds:
        sock = socket.socket(fileno=fds[0])
        owns = False
    else:
        sock = bind_listener(config.socket_path)
        if sock is None:
            raise UsageError(f"a live shim already serves {args.namespace}/{args.sandbox_id} on {config.socket_path}")
        owns = True
    write_json_atomic(os.path.join(args.bundle, BOOTSTRAP_FILE),
                      _bootstrap(socket_address(config.socket_path), os.getpid()), mode=0o644, durable=False)
    return serve_forever(config, sock, owns_socket=owns)


def _delete(args: argparse.Namespace) -> int:
    from .cleanup import delete_sandbox

    if not os.path.isdir(args.bundle):
        raise UsageError(f"bundle {args.bundle!r} does not exist")
    result = delete_sandbox(args.bundle, args.namespace, args.sandbox_id, args.runtime_root)
    print(json.dumps(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        _validate(args)
        return {"start": _start, "serve": _serve, "delete": _delete}[args.action](args)
    except UsageError as exc:
        print(f"podshim {args.action}: {exc}", file=sys.stderr)
        return 2
    except RpcError as exc:
        print(f"podshim {args.action}: {exc.code.name}: {exc.message}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"podshim {args.action}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
