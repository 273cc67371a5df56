"""``podshim``: the shim binary's actions, shaped like containerd's shim.

    podshim start  --namespace NS --id ID --bundle DIR [--runtime-root DIR]
    podshim serve  --namespace NS --id ID --bundle DIR [--runtime-root DIR]
    podshim delete --namespace NS --id ID --bundle DIR [--runtime-root DIR]
    podshim template [--runtime-root DIR] [--detach | --stop]

Bad arguments exit 2 with a sentence; a failure to start exits 1 with the reason and the tail
of the shim's log. Nothing is imported until an action needs it: ``start`` and ``serve`` load
what a shim serves with and no more, ``delete`` what cleans up after one.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from typing import TYPE_CHECKING, Any

from shim import __version__
from shim.api.defaults import TEMPLATE_SPAWN_TIMEOUT
from shim.api.names import DEFAULT_BUNDLE_ROOT, TEMPLATE_LOG, TEMPLATE_SERVICE, TEMPLATE_START_LOCK
from shim.api.paths import (
    BOOTSTRAP_FILE,
    DEFAULT_RUNTIME_ROOT,
    control_socket_path,
    socket_address,
    socket_path,
    template_socket_for,
    validate_identifier,
)
from shim.lib.arguments import ArgumentParser
from shim.lib.files import ensure_private_dir, flock_open, write_json_atomic
from shim.lib.program import Failure, UsageError, exit_status, os_error_sentence
from shim.rpc.status import FailedPrecondition, RpcError, Unavailable

if TYPE_CHECKING:
    from shim.sandbox.config import ShimConfig

__all__ = ["ACTIONS", "Failure", "UsageError", "exit_status", "main", "os_error_sentence", "run", "start_shim"]


#: The actions; a command line that starts with one builds that action's arguments only.
ACTIONS = ("start", "serve", "delete", "template")


def _parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every action; with ``only``, of that action alone (the same parse of a
    command line that starts with it, without building the others' arguments)."""
    p = ArgumentParser(prog="podshim", description="The per-sandbox shim daemon of podshim.")
    p.add_argument("--version", action="version", version=f"podshim {__version__}")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    def root(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--runtime-root", default=os.environ.get("PODSHIM_RUNTIME_ROOT", DEFAULT_RUNTIME_ROOT),
                        help=f"root of runtime files; sockets live in ROOT/s (default {DEFAULT_RUNTIME_ROOT})")
        sp.add_argument("--debug", action="store_true", help="log at debug level")

    def common(sp: argparse.ArgumentParser, required: bool = True) -> None:
        sp.add_argument("--namespace", required=required, help="namespace of the sandbox (an identifier)")
        sp.add_argument("--id", required=required, dest="sandbox_id", help="sandbox id (an identifier)")
        sp.add_argument("--bundle", required=required, help="the sandbox's bundle directory (absolute)")
        root(sp)

    def daemon_flags(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--pause-binary", default=os.environ.get("PODSHIM_PAUSE_BINARY"),
                        help="pause binary (default: catatonit when installed, else the built-in pause)")

    for name, text in (("start", "start a detached shim and print its bootstrap JSON"),
                       ("serve", "run the shim in the foreground (systemd; honours LISTEN_FDS, NOTIFY_SOCKET)"),
                       ("delete", "clean up after a dead shim and print its exit as JSON")):
        if only not in (None, name):
            continue
        sp = sub.add_parser(name, help=text, description=text)
        common(sp, required=name == "start")
        if name != "delete":
            daemon_flags(sp)
        if name != "start":  # the systemd unit's ExecStart= (serve) and ExecStopPost= (delete)
            sp.add_argument("--instance", metavar="NAMESPACE:ID",
                            help="name the sandbox as a systemd instance does (instead of --namespace/--id); "
                                 "the bundle defaults to STATE_ROOT/NAMESPACE/ID")
            sp.add_argument("--state-root", default=os.environ.get("PODSHIM_STATE_ROOT", DEFAULT_BUNDLE_ROOT),
                            help=f"the bundle root, where bundles live when --bundle is not given "
                                 f"(default {DEFAULT_BUNDLE_ROOT})")
        if name == "serve":
            sp.add_argument("--shutdown-on-term", action="store_true",
                            help="on SIGTERM/SIGINT shut the sandbox down (stop the pause, remove its netns and "
                                 "cgroup) instead of leaving it for `podshim delete`; for systemd units")
        if name == "start":
            sp.add_argument("--no-template", action="store_true",
                            help="do not ask a running template; always fork this process")
            sp.add_argument("--containerd-address", metavar="TTRPC_SOCKET",
                            help="containerd's ttrpc socket: the shim serves containerd's Sandbox and Task v3 "
                                 "services too and publishes its events there (podshim-sandboxer)")
    if only not in (None, "template"):
        return p
    text = "run a shim template: a preloaded process that forks shims on request (see `start`)"
    sp = sub.add_parser("template", help=text, description=text)
    root(sp)
    daemon_flags(sp)
    how = sp.add_mutually_exclusive_group()
    how.add_argument("--detach", action="store_true",
                     help="unless a template already answers on the runtime root, start one in the background "
                          f"(its output in ROOT/{TEMPLATE_LOG}); return once it serves and print its pid as JSON")
    how.add_argument("--stop", action="store_true",
                     help="stop the runtime root's template (the shims it forked keep running) and print its pid "
                          "as JSON (0: none ran)")
    sp.add_argument("--idle-grace", type=float, default=None, metavar="S",
                    help="end once no process that called the template runs and no sandbox is left in its runtime "
                         "roots, for S seconds (default 30; 0: never; protocol.md 7.5)")
    return p


def _config(args: argparse.Namespace) -> ShimConfig:
    from shim.sandbox.config import ShimConfig

    return ShimConfig(
        namespace=args.namespace,
        sandbox_id=args.sandbox_id,
        bundle=args.bundle,
        socket_path=socket_path(args.namespace, args.sandbox_id, args.runtime_root),
        runtime_root=args.runtime_root,
        pause_binary=args.pause_binary,
        containerd_address=getattr(args, "containerd_address", None),
    )


def _validate(args: argparse.Namespace) -> None:
    if not os.path.isabs(args.runtime_root):
        raise UsageError(f"--runtime-root {args.runtime_root!r} must be an absolute path")
    args.runtime_root = os.path.normpath(args.runtime_root)
    if args.action == "template":
        if args.idle_grace is not None and not args.idle_grace >= 0:  # also NaN
            raise UsageError(f"--idle-grace {args.idle_grace} must be zero (never) or more seconds")
        return
    if getattr(args, "instance", None):
        if args.namespace or args.sandbox_id:
            raise UsageError("give either --instance or --namespace and --id, not both")
        args.namespace, sep, args.sandbox_id = args.instance.partition(":")
        if not sep:
            raise UsageError(f"--instance {args.instance!r} must be NAMESPACE:SANDBOX_ID")
        if "/" in args.instance:
            # %I unescapes the unit's instance, and unescaping turns '-' into '/'.
            raise UsageError(f"--instance {args.instance!r}: systemd turned a '-' of the unit name into '/'; "
                             "write '-' as \\x2d (systemd-escape --template podshim@.service NAMESPACE:ID)")
    if args.namespace is None or args.sandbox_id is None:
        raise UsageError("--namespace and --id (or --instance) are required")
    if args.bundle is None:
        if not os.path.isabs(args.state_root):
            raise UsageError(f"--state-root {args.state_root!r} must be an absolute path")
        args.bundle = os.path.join(args.state_root, args.namespace, args.sandbox_id)
    try:
        validate_identifier("namespace", args.namespace)
        validate_identifier("sandbox id", args.sandbox_id)
        socket_path(args.namespace, args.sandbox_id, args.runtime_root)
    except RpcError as exc:
        raise UsageError(exc.message) from None
    if not os.path.isabs(args.bundle):
        raise UsageError(f"--bundle {args.bundle!r} must be an absolute path")
    args.bundle = os.path.normpath(args.bundle)


def _start(args: argparse.Namespace) -> int:
    print(json.dumps(start_shim(_config(args), debug=args.debug, no_template=args.no_template)))
    return 0


def start_shim(config: ShimConfig, *, debug: bool = False, no_template: bool = False) -> dict[str, Any]:
    """Start the detached shim of ``config`` (a ShimConfig) and return its bootstrap document: forked
    by the runtime root's template when one runs (unless ``no_template``), else by this process."""
    result = None if no_template else _start_from_template(config, debug)
    if result is None:
        from shim.launch.spawn import spawn_shim  # (the fork path's imports: a template spares them)

        result = spawn_shim(config, debug=debug, double_fork=False)
    return result


def _start_from_template(config: ShimConfig, debug: bool) -> dict[str, Any] | None:
    """Ask a running template for the shim; None when no template answers, or it answers that
    its code is out of date and it is leaving (then we fork the shim ourselves)."""
    path = template_socket_for(config.runtime_root)
    if not os.path.exists(path):
        return None
    from shim.rpc import blocking

    payload: dict[str, Any] = {"namespace": config.namespace, "sandbox_id": config.sandbox_id, "bundle": config.bundle,
               "runtime_root": config.runtime_root, "debug": debug}
    if config.pause_binary:
        payload["pause_binary"] = config.pause_binary
    if config.containerd_address is not None:
        payload["containerd_address"] = config.containerd_address
    try:
        spawned: dict[str, Any] = blocking.call(socket_address(path), TEMPLATE_SERVICE, "Spawn", payload,
                                                timeout=TEMPLATE_SPAWN_TIMEOUT)
        return spawned
    except (Unavailable, FailedPrecondition):
        return None


def _template(args: argparse.Namespace) -> int:
    if args.detach:
        return _detach_template(args)
    if args.stop:
        from shim.launch.template import stop_template

        print(json.dumps({"pid": stop_template(args.runtime_root)}))
        return 0
    from shim.launch.template import run_template
    from shim.lib.logs import setup_logging

    setup_logging(args.debug)
    return run_template(args.runtime_root, pause_binary=args.pause_binary, idle_grace=_idle_grace(args))


def _idle_grace(args: argparse.Namespace) -> float:
    from shim.launch.template import IDLE_GRACE

    return IDLE_GRACE if args.idle_grace is None else float(args.idle_grace)


def _detach_template(args: argparse.Namespace) -> int:
    """``template --detach``: make sure a template serves the runtime root, starting one in the
    background if none answers; print ``{"pid", "address", "started"}``.

    Checking and starting happen under ``ROOT/template.start.lock``, so of several callers at
    once (Controllers, podshimctl) exactly one starts a template and the others find it. The
    template is forked into its own session with its output in ``ROOT/template.log``, and this
    returns once it serves (it outlives us: it is never a caller's child for long).
    """
    from shim.rpc import blocking

    root = args.runtime_root
    ensure_private_dir(root, 0o700)
    address = socket_address(control_socket_path(root))
    # Blocking: the callers bound how long they wait for us.
    with flock_open(os.path.join(root, TEMPLATE_START_LOCK)) as lock_fd:
        assert lock_fd is not None  # a blocking flock_open waits for the lock
        try:
            ping = blocking.call(address, TEMPLATE_SERVICE, "Ping", timeout=2.0)
        except Unavailable:
            ping = None
        if ping is not None:
            print(json.dumps({"pid": ping["pid"], "address": address, "started": False}))
            return 0
        from shim.launch.spawn import START_TIMEOUT, detach_process

        log_path = os.path.join(root, TEMPLATE_LOG)
        # The template holds the start lock too until it holds its own: if we die meanwhile,
        # `template --stop` still waits for it (shim.launch.template).
        pid = detach_process(lambda ready_fd: _run_detached_template(args, ready_fd, lock_fd), log_path,
                             keep_fds=(lock_fd,), timeout=START_TIMEOUT, what="the shim template")
    print(json.dumps({"pid": pid, "address": address, "started": True}))
    return 0


def _run_detached_template(args: argparse.Namespace, ready_fd: int, start_lock_fd: int) -> int:
    from shim.launch.template import run_template
    from shim.lib.logs import setup_logging

    setup_logging(args.debug)
    return run_template(args.runtime_root, pause_binary=args.pause_binary, ready_fd=ready_fd,
                        start_lock_fd=start_lock_fd, idle_grace=_idle_grace(args))


def _serve(args: argparse.Namespace) -> int:
    from shim.daemon import serve_forever
    from shim.launch.spawn import bind_listener, bootstrap
    from shim.lib.logs import setup_logging
    from shim.lib.notify import listen_fds

    setup_logging(args.debug)
    ensure_private_dir(args.bundle, 0o700)
    config = _config(args)
    fds = listen_fds()
    sock: socket.socket | None
    if fds:
        sock = socket.socket(fileno=fds[0])
        owns = False
        # systemd chose the path (podshim@.socket): report where we really listen.
        bound = sock.getsockname()
        if isinstance(bound, str) and bound.startswith("/"):
            config = config.replace(socket_path=bound)
    else:
        sock = bind_listener(config.socket_path)
        if sock is None:
            raise UsageError(f"a live shim already serves {args.namespace}/{args.sandbox_id} on {config.socket_path}")
        owns = True
    write_json_atomic(os.path.join(args.bundle, BOOTSTRAP_FILE),
                      bootstrap(socket_address(config.socket_path), os.getpid()), mode=0o644, durable=False)
    return serve_forever(config, sock, owns_socket=owns, shutdown_on_signal=args.shutdown_on_term)


def _delete(args: argparse.Namespace) -> int:
    from shim.cleanup import delete_sandbox

    if not os.path.isdir(args.bundle):
        raise UsageError(f"bundle {args.bundle!r} does not exist")
    result = delete_sandbox(args.bundle, args.namespace, args.sandbox_id, args.runtime_root)
    print(json.dumps(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser(argv[0] if argv and argv[0] in ACTIONS else None).parse_args(argv)

    def action() -> int:
        _validate(args)
        return {"start": _start, "serve": _serve, "delete": _delete, "template": _template}[args.action](args)

    return exit_status(f"podshim {args.action}", action)


def run() -> None:
    """The ``podshim`` program: :func:`main`, then exit at once (see shim.lib.program.exit_now)."""
    from shim.lib.program import exit_now

    exit_now(main())


if __name__ == "__main__":
    run()
