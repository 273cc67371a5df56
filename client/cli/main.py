"""``podshimctl``: talk to a shim directly, or drive sandboxes through the Controller.

    podshimctl --address unix:///run/podshim/s/ab12... call podshim.sandbox.v1.Sandbox PingSandbox '{"sandbox_id":"sb1"}'
    podshimctl --address unix:///run/podshim/s/ab12... events
    podshimctl [--root DIR] [--runtime-root DIR] [--spawner exec|systemd] [--namespace NS] sandbox create|start|stop|wait|status|
               shutdown|metrics|platform|list ... [--json]

Exit status: 0 on success, 1 when the operation failed (stderr says ``STATUS_NAME: message``; with ``--json``
one JSON document ``{"error": {"code": ..., "message": ...}}``), 2 for a usage error. Never a traceback
for bad input. A sandbox command loads only the bundle it needs, so it costs one reconnect however many
sandboxes the node runs.

Top-level commands are registered with :func:`command`; a module named in
:data:`COMMAND_MODULES` is imported before parsing, so another module (the pod verbs) can add
its own commands without this file knowing them.

A command line tool answers at once: building the parser imports nothing but argparse, and each
verb imports what it uses when it runs (the shim-level verbs the RPC client, the sandbox verbs
the Controller, the pod verbs podshimd's gRPC client; none loads pyroute2). A module that
registers commands keeps to the same rule. A verb with nothing to await sets ``run_sync``
instead of ``run``: it runs without an event loop (no asyncio, no anyio to import).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from shim.api.names import TEMPLATE_ENV
from shim.lib.arguments import ArgumentParser, mistyped_option
from shim.lib.files import MAX_JSON_BYTES, decode_json

from client.controller.defaults import DEFAULT_BUNDLE_ROOT, DEFAULT_RUNTIME_ROOT

if TYPE_CHECKING:
    from client.controller import Controller

__all__ = ["main", "run", "command", "COMMAND_MODULES", "CliError", "emit", "open_controller"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEFAULT_NAMESPACE = "default"

Setup = Callable[[argparse.ArgumentParser], None]
_COMMANDS: dict[str, tuple[str, Setup]] = {}
#: Modules imported by :func:`main` that register more commands with :func:`command`.
COMMAND_MODULES: list[str] = ["client.cli.pods", "client.cli.streams"]


class CliError(Exception):
    """Bad input that argparse cannot see (a file that is not JSON...): exit 1 with the message."""


def command(name: str, help: str) -> Callable[[Setup], Setup]:
    """Register a top-level command. ``setup(parser)`` adds its arguments (or sub-commands) and
    sets ``run=async fn(args) -> int`` on every leaf with ``parser.set_defaults`` (or
    ``run_sync=fn(args) -> int`` for a verb with nothing to await: it runs without an event loop)."""
    def register(setup: Setup) -> Setup:
        _COMMANDS[name] = (help, setup)
        return setup
    return register


# -- output -------------------------------------------------------------------------------
def _timestamp(ns: int) -> str:
    if not ns:
        return "-"
    import time

    seconds, fraction = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{fraction // 1_000_000:03d}Z"


def _plain(obj: Any) -> Any:
    if hasattr(obj, "__dataclass_fields__") and not isinstance(obj, type):
        import dataclasses

        return dataclasses.asdict(obj)
    if isinstance(obj, list):
        return [_plain(o) for o in obj]
    return obj


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (bytes, bytearray)):
        return obj.hex()
    raise TypeError(f"cannot show a {type(obj).__name__} as JSON")


def _dumps(obj: Any) -> str:
    import json

    return json.dumps(_plain(obj), default=_json_default, sort_keys=True)


def _human(key: str, value: Any) -> str:
    if key.endswith("_at") and isinstance(value, int):
        return _timestamp(value)
    if isinstance(value, (list, tuple)):
        value = ", ".join(map(str, value))
    if value is None or value == "":
        return "-"
    return str(value)


def _heading(key: str) -> str:
    return key.upper().replace("_", " ")


def _print_fields(obj: Any, out: TextIO) -> None:
    fields = _plain(obj)
    flat = {k: v for k, v in fields.items() if not isinstance(v, dict)}
    width = max((len(k) for k in fields), default=0)
    for key, value in flat.items():
        print(f"{_heading(key):<{width}}  {_human(key, value)}", file=out)
    for key, value in fields.items():
        if isinstance(value, dict) and value:
            print(f"{_heading(key)}:", file=out)
            inner = max(len(k) for k in value)
            for k in sorted(value):
                print(f"  {k:<{inner}}  {_human(k, value[k])}", file=out)


def _print_table(rows: list[dict[str, Any]], columns: list[str], out: TextIO) -> None:
    cells = [[_human(c, row.get(c)) for c in columns] for row in rows]
    heads = [_heading(c) for c in columns]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(heads)]
    for line in [heads, *cells]:
        print("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=False)).rstrip(), file=out)


def emit(args: argparse.Namespace, obj: Any, human: Callable[[TextIO], None] | None = None) -> None:
    """Print ``obj`` as one JSON document with ``--json``; else ``human(stdout)``, or its fields."""
    if args.json:
        print(_dumps(obj))
    elif human is not None:
        human(sys.stdout)
    else:
        _print_fields(obj, sys.stdout)


def _read_json(data: str | bytes, what: str) -> Any:
    try:
        return decode_json(data, what)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _read_json_file(path: str, what: str) -> Any:
    try:
        if path == "-":
            return _read_json(sys.stdin.buffer.read(), what)
        with open(path, "rb") as f:  # a pipe too (`<(...)`): the user named it; a bounded read
            data = f.read(MAX_JSON_BYTES + 1)
        if len(data) > MAX_JSON_BYTES:
            raise CliError(f"{what} {path} is larger than {MAX_JSON_BYTES} bytes: not a config")
        return _read_json(data, f"{what} {path}")
    except OSError as exc:
        raise CliError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


# -- raw access to a shim -------------------------------------------------------------------
def _add_json_flag(p: argparse.ArgumentParser) -> None:
    # SUPPRESS: the flag may come before the command or after it without one hiding the other.
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON for scripts")


@command("call", help="make one call to a shim and print the response payload as JSON (needs --address)")
def _setup_call(p: argparse.ArgumentParser) -> None:
    p.add_argument("service", help="e.g. podshim.sandbox.v1.Sandbox")
    p.add_argument("method", help="e.g. SandboxStatus")
    p.add_argument("payload", nargs="?", default="{}", help="the request payload as a JSON object (- for stdin)")
    p.add_argument("--timeout", type=float, default=None, metavar="S", help="deadline in seconds (default: none)")
    p.set_defaults(run=_run_call, needs_address=True)


async def _run_call(args: argparse.Namespace) -> int:
    from shim.rpc.client import Client

    text = sys.stdin.read() if args.payload == "-" else args.payload
    payload = _read_json(text, "the payload")
    if not isinstance(payload, dict):
        raise CliError("the payload must be a JSON object")
    async with await Client.connect(args.address, namespace=args.namespace) as client:
        reply = await client.call(args.service, args.method, payload, timeout=args.timeout)
    print(_dumps(reply if reply is not None else {}))
    return EXIT_OK


@command("events", help="print a shim's events as JSON lines until interrupted (needs --address)")
def _setup_events(p: argparse.ArgumentParser) -> None:
    p.set_defaults(run=_run_events, needs_address=True, quiet_interrupt=True)


async def _run_events(args: argparse.Namespace) -> int:
    from shim.api.names import EVENTS_SERVICE
    from shim.lib.program import long_running
    from shim.rpc.client import Client

    long_running()  # it prints events until interrupted

    async with await Client.connect(args.address, namespace=args.namespace) as client:
        async for event in client.stream(EVENTS_SERVICE, "Subscribe", {}):
            print(_dumps(event), flush=True)
    return EXIT_OK


# -- sandboxes through the Controller ---------------------------------------------------------
async def open_controller(args: argparse.Namespace, sandbox_id: str | None = None, *,
                          all_namespaces: bool = False, read_only: bool = False) -> Controller:
    """A Controller over ``--root``/``--runtime-root`` that loaded only what the command needs:
    one sandbox, the namespace, or (``all_namespaces``) everything; ``read_only`` for a verb that
    only looks (it changes nothing, not even after a dead shim). The caller must aclose it."""
    from client.controller import Controller

    controller = Controller(args.root, args.runtime_root, spawner=args.spawner, read_only=read_only,
                            **controller_options(args))
    try:
        await controller.load(None if all_namespaces else args.namespace, sandbox_id)
    except BaseException:
        await controller.aclose()
        raise
    return controller


def controller_options(args: argparse.Namespace) -> dict[str, Any]:
    """The Controller's keyword arguments from the global flags (``--no-template``)."""
    return {"template": False} if args.no_template and args.spawner == "exec" else {}


def _sandbox_verb(fn: Callable[[Controller, argparse.Namespace], Awaitable[int]],
                  read_only: bool) -> Callable[[argparse.Namespace], Awaitable[int]]:
    async def run(args: argparse.Namespace) -> int:
        controller = await open_controller(args, args.sandbox_id, read_only=read_only)
        try:
            if args.verb != "create":
                # A one-shot controller loaded only this bundle: say plainly when it is not there.
                controller.sandboxes.get(args.namespace, args.sandbox_id)
            return await fn(controller, args)
        finally:
            await controller.aclose()
    return run


async def _create(c: Controller, args: argparse.Namespace) -> int:
    options = _read_json_file(args.options, "--options") if args.options else None
    if options is not None and not isinstance(options, dict):
        raise CliError("--options must hold a JSON object (a PodSandboxConfig)")
    annotations = {}
    for item in args.annotation:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--annotation {item!r} is not KEY=VALUE")
        annotations[key] = value
    await c.create(args.namespace, args.sandbox_id, options=options, netns_path=args.netns,
                   annotations=annotations or None)
    emit(args, {"namespace": args.namespace, "sandbox_id": args.sandbox_id},
         lambda out: print(f"created sandbox {args.sandbox_id} in namespace {args.namespace}", file=out))
    return EXIT_OK


async def _start(c: Controller, args: argparse.Namespace) -> int:
    emit(args, await c.start(args.namespace, args.sandbox_id))
    return EXIT_OK


async def _stop(c: Controller, args: argparse.Namespace) -> int:
    await c.stop(args.namespace, args.sandbox_id, timeout=args.timeout)
    emit(args, {"namespace": args.namespace, "sandbox_id": args.sandbox_id},
         lambda out: print(f"stopped sandbox {args.sandbox_id}", file=out))
    return EXIT_OK


async def _wait(c: Controller, args: argparse.Namespace) -> int:
    from shim.lib.program import long_running

    long_running()  # it waits as long as the sandbox runs
    result = await c.wait(args.namespace, args.sandbox_id)
    emit(args, result, lambda out: print(f"sandbox {args.sandbox_id} exited with status {result.exit_status} "
                                         f"at {_timestamp(result.exited_at)}", file=out))
    return EXIT_OK


async def _status(c: Controller, args: argparse.Namespace) -> int:
    emit(args, await c.status(args.namespace, args.sandbox_id, verbose=args.verbose))
    return EXIT_OK


async def _shutdown(c: Controller, args: argparse.Namespace) -> int:
    await c.shutdown(args.namespace, args.sandbox_id)
    emit(args, {"namespace": args.namespace, "sandbox_id": args.sandbox_id},
         lambda out: print(f"shut down sandbox {args.sandbox_id}", file=out))
    return EXIT_OK


async def _metrics(c: Controller, args: argparse.Namespace) -> int:
    metrics = await c.metrics(args.namespace, args.sandbox_id)
    emit(args, metrics, lambda out: _print_fields({"sandbox_id": metrics.get("sandbox_id"),
                                                   "read_at": metrics.get("timestamp"),
                                                   **(metrics.get("data") or {})}, out))
    return EXIT_OK


async def _platform(c: Controller, args: argparse.Namespace) -> int:
    emit(args, await c.platform(args.namespace, args.sandbox_id))
    return EXIT_OK


async def _list(args: argparse.Namespace) -> int:
    controller = await open_controller(args, all_namespaces=args.all_namespaces, read_only=True)
    try:
        found = await controller.list(None if args.all_namespaces else args.namespace)
    finally:
        await controller.aclose()
    columns = ["sandbox_id", "state", "pid", "created_at", "exit_status"]
    if args.all_namespaces:
        columns.insert(0, "namespace")
    emit(args, found, lambda out: _print_table(_plain(found), columns, out))
    return EXIT_OK


@command("sandbox", help="create, inspect and remove sandboxes through the Controller")
def _setup_sandbox(p: argparse.ArgumentParser) -> None:
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)

    def verb(name: str, help: str, fn: Callable[[Controller, argparse.Namespace], Awaitable[int]] | None = None, *,
             looks: bool = False) -> argparse.ArgumentParser:
        # ``looks``: the verb only reads, and changes nothing on the way (not even after a dead shim).
        sp = verbs.add_parser(name, help=help, description=help)
        if fn is not None:
            sp.add_argument("sandbox_id", metavar="ID", help="sandbox id")
            sp.set_defaults(run=_sandbox_verb(fn, looks))
        _add_json_flag(sp)
        return sp

    sp = verb("create", "create a sandbox: spawn its shim and send CreateSandbox", _create)
    sp.add_argument("--options", metavar="FILE", help="PodSandboxConfig as JSON (crictl's spelling; - for stdin)")
    sp.add_argument("--netns", metavar="PATH", help="join this network namespace instead of making one")
    sp.add_argument("--annotation", metavar="KEY=VALUE", action="append", default=[], help="add an annotation")
    verb("start", "start the sandbox's pause", _start)
    sp = verb("stop", "stop the pause: SIGTERM, then SIGKILL after the timeout", _stop)
    sp.add_argument("--timeout", type=float, default=None, metavar="S", help="seconds before SIGKILL (default 10)")
    verb("wait", "wait for the sandbox to exit and print its exit status", _wait, looks=True)
    sp = verb("status", "print the sandbox's status", _status, looks=True)
    sp.add_argument("--verbose", "-v", action="store_true", help="add the shim's details (netns, cgroups, ...)")
    verb("shutdown", "shut the sandbox down and remove everything it made", _shutdown)
    verb("metrics", "print the sandbox's cgroup metrics", _metrics, looks=True)
    verb("platform", "print the sandbox's platform", _platform, looks=True)
    sp = verb("list", "list sandboxes (and say which directories under the root are not bundles it knows)")
    sp.add_argument("--all-namespaces", "-A", action="store_true", help="list every namespace")
    sp.set_defaults(run=_list)


@command("completion", help="print the shell completion script of podshimctl (bash, zsh or tcsh), made from "
                             "its parser: `source <(podshimctl completion bash)`")
def _setup_completion(p: argparse.ArgumentParser) -> None:
    p.add_argument("shell", choices=("bash", "zsh", "tcsh"), nargs="?", default="bash")
    p.set_defaults(run_sync=_run_completion)


def _run_completion(args: argparse.Namespace) -> int:
    import shtab

    sys.stdout.write(shtab.complete(build_parser(), shell=args.shell))
    return EXIT_OK


@command("man", help="print podshimctl's manual page (roff), made from its parser: `podshimctl man | man -l -`")
def _setup_man(p: argparse.ArgumentParser) -> None:
    p.set_defaults(run_sync=_run_man)


def _run_man(args: argparse.Namespace) -> int:
    from argparse_manpage.manpage import Manpage

    import shim

    page = Manpage(build_parser(), format="single-commands-section")
    page.source, page.manual = f"podshim {shim.__version__}", "podshim manual"
    # NAME's line, which whatis and apropos read.
    page.description = "the node's crictl: pods, containers and images through podshimd, and podshim's shims"
    sys.stdout.write(str(page))
    return EXIT_OK


# -- the program ----------------------------------------------------------------------------
def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser, with every registered command; with ``only``, the same parser with that
    one command's arguments (the others are left out: see :func:`_command_in`)."""
    _register_commands()
    return _add_commands(_top_parser(), only)


def _add_commands(p: argparse.ArgumentParser, only: str | None) -> argparse.ArgumentParser:
    """``p`` (the top-level parser) with the registered commands, or only the command ``only``."""
    commands = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help, setup) in _COMMANDS.items():
        if only is not None and name != only:
            continue
        sp = commands.add_parser(name, help=help, description=help)
        if name != "sandbox":
            _add_json_flag(sp)
        setup(sp)
        _accept_globals(sp, p)
    return p


def _accept_globals(sp: argparse.ArgumentParser, top: argparse.ArgumentParser) -> None:
    """Let ``top``'s options come after the command too (``podshimctl pods --endpoint X`` as
    ``podshimctl --endpoint X pods``): each is added to ``sp`` and to its sub-commands' parsers,
    unless they have an option of that name, with SUPPRESS as default so that it does not hide
    a value given before the command."""
    for sub in sp._actions:
        if isinstance(sub, argparse._SubParsersAction):
            for leaf in set(sub.choices.values()):
                _accept_globals(leaf, top)
            return
    for action in top._actions:
        if not isinstance(action, (argparse._StoreAction, argparse._StoreTrueAction)):
            continue
        names = [o for o in action.option_strings if o not in sp._option_string_actions]
        if len(names) != len(action.option_strings) or action.dest in ("json",):
            continue  # the command has its own (--json is the command's everywhere already)
        extra: dict[str, Any] = {"action": "store_true"} if isinstance(action, argparse._StoreTrueAction) else \
            {"choices": action.choices, "metavar": action.metavar}
        sp.add_argument(*names, dest=action.dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **extra)


def _register_commands() -> None:
    import importlib

    for module in COMMAND_MODULES:
        importlib.import_module(module)


class _Parser(ArgumentParser):
    """podshimctl's parsers: a mistyped command, choice or long option gets the closest valid ones;
    with --json on the command line, a usage error is a JSON document too (as every other error then is)."""

    #: Whether the command line being parsed asks for --json (set by :func:`main`).
    json_errors = False
    #: The top-level parser and the words it parses (set by :func:`main`), for a mistyped option.
    line: tuple[argparse.ArgumentParser, list[str]] | None = None

    def error(self, message: str) -> NoReturn:
        import re

        # A mistyped option is the cause of whatever argparse says next (its value taken for the
        # command: "unknown command 'unix:///x'"), so it is named first.
        mistyped = mistyped_option(*_Parser.line) if _Parser.line is not None else None
        found = None if mistyped is not None else re.match(r"argument (\S+): invalid choice: '(.*?)' \(choose from (.*)\)$", message)
        if found is not None:
            import difflib

            choices = re.findall(r"'([^']*)'", found.group(3))
            close = difflib.get_close_matches(found.group(2), choices, 3, 0.6)
            what = "command" if found.group(1) in ("COMMAND", "VERB") else f"choice for {found.group(1)}"
            message = f"unknown {what} {found.group(2)!r}" + (
                f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else f" (choose from {found.group(3)})")
        message = mistyped or message
        if _Parser.json_errors:
            print(_dumps({"error": {"code": None, "message": f"{self.prog}: {message}",
                                    "usage": self.format_usage().strip()}}), file=sys.stderr)
            sys.exit(EXIT_USAGE)
        super().error(message)


def _top_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="podshimctl", description=(
        "The node's crictl: runp, create, exec, logs, pull, images and the other pod, container and image "
        "verbs are CRI calls to podshimd; call, events and sandbox talk to podshim's shims and the Controller."))
    env = os.environ.get
    p.add_argument("--address", default=env("PODSHIM_ADDRESS"), help="shim address unix:///path (call, events)")
    p.add_argument("--root", default=env("PODSHIM_ROOT", DEFAULT_BUNDLE_ROOT),
                   help=f"the Controller's bundle root, ROOT/NAMESPACE/ID (default {DEFAULT_BUNDLE_ROOT}, where podshimd "
                        "keeps its pods' sandboxes in namespace k8s.io; docs/roots.md)")
    p.add_argument("--runtime-root", default=env("PODSHIM_RUNTIME_ROOT", DEFAULT_RUNTIME_ROOT),
                   help=f"runtime root; shim sockets live in ROOT/s (default {DEFAULT_RUNTIME_ROOT})")
    p.add_argument("--spawner", choices=("exec", "systemd"), default=env("PODSHIM_SPAWNER", "exec"),
                   help="how sandbox commands start and end shims: exec the podshim binary, or one "
                        "podshim@NS:ID systemd unit each; give every command of a sandbox the same (default exec)")
    p.add_argument("--no-template", action="store_true",
                   default=env(TEMPLATE_ENV, "").strip().lower() in ("0", "no", "false", "off"),
                   help=f"exec every shim (podshim start) instead of forking it from the runtime root's shim "
                        f"template, which is started when none runs (default: use it; ${TEMPLATE_ENV}=0 says no)")
    p.add_argument("--namespace", "-n", default=env("PODSHIM_NAMESPACE"),
                   help=f"namespace (default {DEFAULT_NAMESPACE!r})")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.add_argument("--endpoint", default=None, metavar="unix:///PATH",
                   help="podshimd's socket, for the pod, container and image commands (default $PODSHIM_ENDPOINT, "
                        "else unix://RUNTIME_ROOT/podshimd.sock)")
    p.add_argument("--debug", action="store_true", help="log what the controller does")
    p.add_argument("--version", action="version", version=_version())
    return p


def _version() -> str:
    import shim

    return f"podshimctl {shim.__version__}"


def _command_in(argv: list[str], top: argparse.ArgumentParser) -> str | None:
    """The registered command ``argv`` runs, when that is certain without parsing: only exact
    options of ``top`` (the top-level parser; no abbreviation, no help) come before it. Then its
    parser alone reads ``argv`` exactly as the full one would: building the others' arguments
    (some 30 verbs) was 5 ms of every podshimctl run (issue #15). None: the full parser decides
    (and reports). The commands must be registered."""
    options = top._option_string_actions
    words = iter(argv)
    for word in words:
        if not word.startswith("-"):
            return word if word in _COMMANDS else None
        name, eq, _ = word.partition("=")
        action = options.get(name)
        if action is None or isinstance(action, argparse._HelpAction) or (eq and action.nargs == 0):
            return None
        if action.nargs != 0 and not eq:
            next(words, None)  # its value
    return None


def main(argv: list[str] | None = None) -> int:
    """Run podshimctl; return the exit status (0 ok, 1 failed, 2 usage)."""
    _register_commands()
    parser = _top_parser()
    words = sys.argv[1:] if argv is None else argv
    # Before argparse has read them (a usage error is said while it reads); after "--" they are a command's.
    _Parser.json_errors = "--json" in words[:words.index("--")] if "--" in words else "--json" in words
    _add_commands(parser, _command_in(words, parser))
    _Parser.line = (parser, words)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2): argparse printed why
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if getattr(args, "needs_address", False) and not args.address:
        if args.json:
            _failed(args, None, f"podshimctl {args.command}: --address is required", "")
        else:
            parser.print_usage(sys.stderr)
            print(f"podshimctl {args.command}: --address is required", file=sys.stderr)
        return EXIT_USAGE
    if args.namespace is None and not getattr(args, "needs_address", False):
        args.namespace = DEFAULT_NAMESPACE  # raw calls send no namespace unless asked
    import logging

    from shim.cri.api import NotGenerated
    from shim.rpc.status import RpcError

    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="podshimctl: %(levelname)s: %(message)s", stream=sys.stderr)
    try:
        if getattr(args, "run_sync", None) is not None:
            status: int = args.run_sync(args)
            return status
        import anyio

        status = anyio.run(args.run, args, backend_options={"use_uvloop": True})
        return status
    except RpcError as exc:
        _failed(args, exc.code.name, exc.message, f"{exc.code.name}: {exc.message}")
    except (CliError, NotGenerated) as exc:
        _failed(args, None, str(exc), f"podshimctl: {exc}")
    except KeyboardInterrupt:
        return EXIT_OK if getattr(args, "quiet_interrupt", False) else 130
    except BrokenPipeError:
        # The reader went away (| head): not an error; keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except OSError as exc:
        _failed(args, None, str(exc.strerror or exc), f"podshimctl: {exc.strerror or exc}")
    return EXIT_FAILED


def _failed(args: argparse.Namespace, code: str | None, message: str, sentence: str) -> None:
    """Say why a verb failed on stderr: the sentence, or with --json one JSON document
    ``{"error": {"code": STATUS_NAME or null, "message": ...}}``."""
    if getattr(args, "json", False):
        print(_dumps({"error": {"code": code, "message": message}}), file=sys.stderr)
    else:
        print(sentence, file=sys.stderr)


def run() -> None:
    """The ``podshimctl`` program: :func:`main`, then exit at once (see shim.lib.program.exit_now)."""
    from shim.lib.program import exit_now

    exit_now(main())
