"""``containerd-shim-podshim-v1``: the shim binary of containerd's runtime type ``io.containerd.podshim.v1``.

containerd runs it with Go-style flags and an action (docs/containerd.md)::

    containerd-shim-podshim-v1 -namespace NS -address GRPC -publish-binary EXE -id ID [-debug] start
    containerd-shim-podshim-v1 -namespace NS -address GRPC -publish-binary EXE -id ID -bundle DIR [-debug] delete
    containerd-shim-podshim-v1 -info

``start`` reads containerd's protobuf BootstrapParams on stdin, starts the sandbox's shim (forked by
the runtime root's template when one runs, as ``podshim start`` does) and prints a protobuf
BootstrapResult (version 3, protocol ttrpc) on stdout, and nothing else: containerd reads stdout and
stderr as one. ``delete`` cleans up after a dead shim as ``podshim delete`` does and prints a
protobuf DeleteResponse. Their common case (a template; a delete after a clean ShutdownSandbox)
takes the fast path of :mod:`shim.containerd.fastpath`, which loads only built-in modules: so
this module imports nothing at its top but those and :mod:`shim.api.names`. ``-info`` prints a
protobuf RuntimeInfo whose features are the runtime-spec features document of what the shim
applies (shim.containerd.features). The working directory is containerd's bundle; podshim's own
bundle (state.json, the shim's log, the tasks) is its ``podshim`` directory, so no file of
containerd's (its ``log`` FIFO, ``bootstrap.json``) is ever touched.

The runtime root is ``$PODSHIM_RUNTIME_ROOT`` (default /run/podshim) and the pause binary
``$PODSHIM_PAUSE_BINARY``: containerd passes its environment on, and ``[plugins.'io.containerd.shim.v1.manager'] env``
adds to it. A failure exits 1 with one sentence.
"""

from __future__ import annotations

import os
import sys
import time

from shim.api.names import DEFAULT_RUNTIME_ROOT, UNKNOWN_EXIT_STATUS

__all__ = ["NAME", "PODSHIM_DIR", "RUNTIME_TYPE", "main", "run"]

NAME = "containerd-shim-podshim-v1"
#: The runtime type containerd names the shim by.
RUNTIME_TYPE = "io.containerd.podshim.v1"
#: podshim's bundle inside containerd's.
PODSHIM_DIR = "podshim"
#: containerd's flags that take a value, and those that do not.
_VALUED = ("namespace", "address", "publish-binary", "id", "bundle", "socket")
_BOOLEAN = ("debug", "v", "version", "info")


def parse(argv: list[str]) -> tuple[dict[str, str | bool], str]:
    """containerd's command line as Go's flag package reads it (``-flag value``, ``-flag=value``,
    ``--flag``); the flags and the action."""
    flags: dict[str, str | bool] = {}
    rest = list(argv)
    while rest and rest[0].startswith("-") and rest[0] not in ("-", "--"):
        name, eq, value = rest.pop(0).lstrip("-").partition("=")
        if name in _BOOLEAN:
            flags[name] = value.lower() not in ("false", "0") if eq else True
        elif name in _VALUED:
            if not eq:
                if not rest:
                    raise _usage(f"flag -{name} needs a value")
                value = rest.pop(0)
            flags[name] = value
        else:
            raise _usage(f"flag provided but not defined: -{name}")
    if rest[:1] == ["--"]:
        rest.pop(0)
    if flags.get("v") or flags.get("version"):
        return flags, "version"
    if flags.get("info"):
        return flags, "info"
    if len(rest) != 1 or rest[0] not in ("start", "delete"):
        raise _usage(f"expected one action, start or delete, after the flags; got {rest!r}")
    return flags, rest[0]


def _usage(message: str) -> Exception:
    """shim.lib.program's UsageError (exit 2), imported only when there is one: the commands'
    common case (shim.containerd.fastpath) loads nothing it does not use."""
    from shim.lib.program import UsageError

    return UsageError(message)


def _identity(flags: dict[str, str | bool], namespace: str = "", sandbox_id: str = "") -> tuple[str, str]:
    from shim.api.identifiers import validate_identifier

    namespace = namespace or str(flags.get("namespace") or os.environ.get("NAMESPACE") or "")
    sandbox_id = sandbox_id or str(flags.get("id") or "")
    return validate_identifier("namespace", namespace), validate_identifier("sandbox id", sandbox_id)


def _runtime_root() -> str:
    root = os.environ.get("PODSHIM_RUNTIME_ROOT") or DEFAULT_RUNTIME_ROOT
    if not os.path.isabs(root):
        raise _usage(f"PODSHIM_RUNTIME_ROOT {root!r} must be an absolute path")
    return os.path.normpath(root)


def start(flags: dict[str, str | bool], stdin: bytes) -> bytes:
    """``start``: the bytes of the BootstrapResult of the sandbox's shim, started unless it runs.
    Neither protobuf's runtime nor the sandbox's machinery is loaded (shim.containerd.bootstrap):
    with a template the shim is forked there."""
    from shim.api.paths import socket_path
    from shim.cli import start_shim
    from shim.containerd.bootstrap import BootstrapParams, bootstrap_params, bootstrap_result
    from shim.sandbox.config import ShimConfig

    try:
        params = bootstrap_params(stdin)
    except ValueError:
        # containerd before 2.3 (and a runtime named *shim-runc-v1) gives the bare options: the
        # rest comes from the flags and the environment then.
        params = BootstrapParams()
    namespace, sandbox_id = _identity(flags, params.namespace, params.instance_id)
    address = params.containerd_ttrpc_address or os.environ.get("TTRPC_ADDRESS", "")
    if not address:
        raise _usage("containerd's ttrpc address is unknown: neither BootstrapParams nor TTRPC_ADDRESS gives it")
    root = _runtime_root()
    config = ShimConfig(namespace=namespace, sandbox_id=sandbox_id,
                        bundle=os.path.join(os.getcwd(), PODSHIM_DIR),
                        socket_path=socket_path(namespace, sandbox_id, root), runtime_root=root,
                        pause_binary=os.environ.get("PODSHIM_PAUSE_BINARY") or None,
                        containerd_address=address)
    return bootstrap_result(start_shim(config, debug=bool(flags.get("debug")))["address"])


def delete(flags: dict[str, str | bool]) -> bytes:
    """``delete``: clean up after the sandbox's dead shim; the bytes of its DeleteResponse."""
    from shim.cleanup import delete_sandbox
    from shim.containerd.bootstrap import delete_response

    namespace, sandbox_id = _identity(flags)
    bundle = str(flags.get("bundle") or os.getcwd())
    if not os.path.isabs(bundle):
        raise _usage(f"-bundle {bundle!r} must be an absolute path")
    ours = os.path.join(bundle, PODSHIM_DIR)
    if os.path.isdir(ours):
        result = delete_sandbox(ours, namespace, sandbox_id, _runtime_root())
    else:  # `start` failed before the shim made anything: there is nothing to clean, no exit known
        result = {"pid": 0, "exit_status": UNKNOWN_EXIT_STATUS, "exited_at": time.time_ns()}
    return delete_response(result["pid"], result["exit_status"], result["exited_at"])


def info(stdin: bytes) -> bytes:
    """``-info``: the bytes of the shim's RuntimeInfo: its name and version, the runtime options
    containerd gave on stdin (an Any, echoed as runc's shim does), and its runtime-spec features
    (shim.containerd.features), which containerd's CRI reads a handler's features from."""
    import json

    from google.protobuf import any_pb2
    from google.protobuf.message import DecodeError

    from shim import __version__
    from shim.containerd.api import load
    from shim.containerd.features import FEATURES_TYPE_URL, runtime_features

    try:
        options = any_pb2.Any.FromString(stdin)
    except DecodeError as exc:
        raise _usage(f"-info reads the runtime options (a protobuf Any) on stdin: {exc}") from None
    introspection = load("types.introspection_pb2")
    result = introspection.RuntimeInfo(name=RUNTIME_TYPE, version=introspection.RuntimeVersion(version=__version__),
                                       features=any_pb2.Any(type_url=FEATURES_TYPE_URL,
                                                            value=json.dumps(runtime_features()).encode()))
    if options.type_url:
        result.options.CopyFrom(options)
    encoded: bytes = result.SerializeToString()
    return encoded


def act(flags: dict[str, str | bool], action: str, stdin: bytes | None = None) -> int:
    """Do ``action`` (parse's) with ``flags``: what it prints goes to stdout. ``stdin``: what was
    read of stdin already (by the fast path), None to read it."""
    if action == "version":
        print(f"{NAME}: podshim's shim for containerd (runtime type {RUNTIME_TYPE})")
        return 0
    if action in ("start", "info") and stdin is None:
        stdin = sys.stdin.buffer.read()
    if action == "start":
        out = start(flags, stdin or b"")
    elif action == "info":
        out = info(stdin or b"")
    else:
        out = delete(flags)
    sys.stdout.buffer.write(out)
    sys.stdout.buffer.flush()
    return 0


def main(argv: list[str] | None = None, *, stdin: bytes | None = None) -> int:
    from shim.lib.program import exit_status

    argv = sys.argv[1:] if argv is None else argv
    parsed: list[tuple[dict[str, str | bool], str]] = []

    def read_command_line() -> int:
        parsed.append(parse(argv))
        return 0

    status = exit_status(NAME, read_command_line)
    if status:
        return status
    flags, action = parsed[0]
    return exit_status(f"{NAME} {action}", lambda: act(flags, action, stdin))


def fast(argv: list[str]) -> tuple[bytes | None, bytes | None]:
    """The common case of ``start`` and ``delete`` (shim.containerd.fastpath): what to print, or
    None for the full path; and what was read of stdin (None: nothing)."""
    try:
        flags, action = parse(argv)
    except Exception:  # (parse's UsageError) the full path says what is wrong with the command line
        return None, None
    from shim.containerd import fastpath

    if action == "start":
        stdin = sys.stdin.buffer.read()
        return fastpath.start(flags, stdin, os.path.join(os.getcwd(), PODSHIM_DIR)), stdin
    if action == "delete":
        namespace = str(flags.get("namespace") or os.environ.get("NAMESPACE") or "")
        sandbox_id, bundle = str(flags.get("id") or ""), str(flags.get("bundle") or os.getcwd())
        ours = os.path.join(bundle, PODSHIM_DIR)
        if namespace and sandbox_id and os.path.isabs(bundle) and os.path.isdir(ours):
            return fastpath.delete(namespace, sandbox_id, ours), None
    return None, None


def run() -> None:
    """The program: ``start`` and ``delete`` on their fast path when it serves (:func:`fast`),
    else :func:`main`; then exit at once (see shim.lib.program.exit_now)."""
    out, stdin = fast(sys.argv[1:])
    if out is not None:
        try:
            sys.stdout.buffer.write(out)
            sys.stdout.buffer.flush()
        except OSError:  # containerd went away: nobody reads what this did
            os._exit(1)
        os._exit(0)
    from shim.lib.program import exit_now

    exit_now(main(stdin=stdin))


if __name__ == "__main__":
    run()
