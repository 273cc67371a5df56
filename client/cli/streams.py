"""podshimctl's streaming verbs, as crictl's: ``exec -i``/``-t`` (an ``exec`` with either goes through CRI
Exec and the streaming server instead of ExecSync), ``attach [-i] [-t]`` and ``port-forward``.

    echo hi | podshimctl exec -i CONTAINER_ID cat      # stdin is read only with -i
    podshimctl exec -it CONTAINER_ID sh                # a terminal: raw mode, its size followed
    podshimctl attach -it CONTAINER_ID
    podshimctl port-forward POD_ID 8080:80 [LOCAL:REMOTE...]

The CRI call returns a URL; :mod:`client.streaming.client` speaks SPDY/3.1 (``v4.channel.k8s.io``,
``portforward.k8s.io``) on it, without asyncio. With ``-t`` the local terminal (stdin) is put in raw mode
for the session and restored after; its size is sent at once and after every SIGWINCH.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from client.cli.main import EXIT_OK, CliError
from client.cli.pods import _exec as exec_sync
from client.cli.pods import _Podshimd, _verb

__all__ = ["stream_exec"]


def _terminal_size() -> tuple[int, int] | None:
    """(columns, rows) of the terminal on stdout, else stdin, else stderr; None without one."""
    for fd in (1, 0, 2):
        try:
            size = os.get_terminal_size(fd)
        except OSError:
            continue
        return size.columns, size.lines
    return None


@contextmanager
def _raw_terminal(active: bool) -> Iterator[None]:
    """stdin in raw mode while the session runs (keys go to the command as typed), when it is a terminal."""
    if not active or not os.isatty(0):
        yield
        return
    import termios
    import tty

    saved = termios.tcgetattr(0)
    tty.setraw(0, termios.TCSANOW)  # not the default TCSAFLUSH: what was typed ahead is kept
    try:
        yield
    finally:
        termios.tcsetattr(0, termios.TCSADRAIN, saved)


@contextmanager
def _resize_pipe(active: bool) -> Iterator[int | None]:
    """A descriptor that becomes readable on each SIGWINCH (signal.set_wakeup_fd), while ``active``."""
    if not active:
        yield None
        return
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    previous = signal.signal(signal.SIGWINCH, lambda signum, frame: None)
    old_fd = signal.set_wakeup_fd(w)
    try:
        yield r
    finally:
        signal.set_wakeup_fd(old_fd)
        signal.signal(signal.SIGWINCH, previous)
        os.close(r)
        os.close(w)


def _session(url: str, args: argparse.Namespace) -> int:
    from client.streaming.client import StreamingError, remote_command

    sys.stdout.flush()
    sys.stderr.flush()
    try:
        with _resize_pipe(args.tty) as resize_fd, _raw_terminal(args.tty):
            return remote_command(url, stdin=0 if args.interactive else None, tty=args.tty,
                                  size=_terminal_size if args.tty else None, resize_fd=resize_fd)
    except StreamingError as exc:
        raise CliError(str(exc)) from None


def stream_exec(args: argparse.Namespace, daemon: _Podshimd) -> int:
    """``exec -i``/``-t``: CRI Exec, then the session; the command's exit status."""
    url = daemon.call("Exec", container_id=args.id, cmd=args.cmd, tty=args.tty, stdin=args.interactive,
                      stdout=True, stderr=not args.tty).url
    return _session(url, args) & 0xFF


def _attach(args: argparse.Namespace, daemon: _Podshimd) -> int:
    url = daemon.call("Attach", container_id=args.id, tty=args.tty, stdin=args.interactive, stdout=True,
                      stderr=not args.tty).url
    _session(url, args)
    return EXIT_OK


def stream_flags(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--interactive", "-i", action="store_true",
                   help="send stdin to the process (without -i stdin is not read, as crictl)")
    p.add_argument("--tty", "-t", action="store_true",
                   help="give the process a terminal: this one's, in raw mode, its size followed")
    return p


def _exec_arguments(p: argparse.ArgumentParser) -> None:
    stream_flags(p)
    p.add_argument("--timeout", type=int, default=0, metavar="S",
                   help="seconds before the command (and what it started) is killed (default 0: none)")
    p.add_argument("id", metavar="CONTAINER_ID")
    p.add_argument("cmd", metavar="CMD", nargs=argparse.REMAINDER, help="the command and its arguments")


def _checked_exec(args: argparse.Namespace, daemon: _Podshimd) -> int:
    if not args.cmd:
        raise CliError("exec needs a command to run: podshimctl exec CONTAINER_ID CMD [ARG...]")
    if args.timeout < 0:
        raise CliError(f"--timeout must be 0 or more seconds, not {args.timeout}")
    if args.interactive or args.tty:
        if args.timeout:
            raise CliError("--timeout is for an exec without -i and -t (ExecSync): a streamed command runs "
                           "until it ends")
        return stream_exec(args, daemon)
    return exec_sync(args, daemon)


_verb("exec", "run a command in a running container and exit with its status: to its end (ExecSync) without "
      "-i/-t, stdin not read; with -i (stdin) or -t (a terminal) through the streaming server",
      _checked_exec, _exec_arguments)


_verb("attach", "attach to a running container's stdio (its output; its stdin with -i; detach with ^C)",
      _attach, lambda p: (stream_flags(p), p.add_argument("id", metavar="CONTAINER_ID")))


def _ports(specs: list[str]) -> list[tuple[int, int]]:
    """LOCAL:REMOTE (or PORT, the same both sides; LOCAL 0 or empty: any free port)."""
    pairs = []
    for spec in specs:
        local, sep, remote = spec.rpartition(":")
        if not sep:
            local = remote
        try:
            pair = (int(local or 0), int(remote))
        except ValueError:
            raise CliError(f"port {spec!r} must be LOCAL:REMOTE or PORT (numbers)") from None
        if not (0 <= pair[0] < 65536 and 0 < pair[1] < 65536):
            raise CliError(f"port {spec!r}: ports are 1-65535 (LOCAL may be 0: any free port)")
        pairs.append(pair)
    return pairs


def _port_forward(args: argparse.Namespace, daemon: _Podshimd) -> int:
    from client.streaming.client import StreamingError, port_forward

    pairs = _ports(args.ports)
    listeners: list[tuple[socket.socket, int]] = []
    try:
        for local, remote in pairs:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            listeners.append((listener, remote))
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                listener.bind((args.address, local))
            except OSError as exc:
                raise CliError(f"cannot listen on {args.address}:{local}: {exc.strerror}") from None
            listener.listen(128)
        url = daemon.call("PortForward", pod_sandbox_id=args.pod_id, port=[r for _, r in pairs]).url
        for listener, remote in listeners:
            print(f"Forwarding from {args.address}:{listener.getsockname()[1]} -> {remote}", flush=True)
        try:
            port_forward(url, listeners, lambda said: print(f"podshimctl: {said}", file=sys.stderr, flush=True))
        except StreamingError as exc:
            raise CliError(str(exc)) from None
    finally:
        for listener, _ in listeners:
            listener.close()
    return EXIT_OK


def _port_forward_arguments(p: argparse.ArgumentParser) -> Any:
    p.add_argument("--address", default="127.0.0.1", help="the local address to listen on (default 127.0.0.1)")
    p.add_argument("pod_id", metavar="POD_ID")
    p.add_argument("ports", metavar="LOCAL:REMOTE", nargs="+",
                   help="a local port and the pod's port it forwards to (PORT: the same; LOCAL 0: any free one)")
    p.set_defaults(quiet_interrupt=True)


_verb("port-forward", "forward local TCP ports to a pod's ports until interrupted", _port_forward,
      _port_forward_arguments)
