"""``python3 -m client.podshimd``: run podshimd, the CRI v1 runtime, in the foreground.

    python3 -m client.podshimd [--config FILE] [--listen unix:///PATH] [--state-root DIR]
                               [--runtime-root DIR] [--cni-conf-dir DIR] [--cni-bin-dir DIRS]
                               [--log-level LEVEL] [--check-config | --print-default-config]

A bad config or flag value is one sentence on stderr and exit status 1 (a usage error: 2), and so
is an install without the generated CRI code (shim/cri/api); a clean stop on SIGTERM or SIGINT is 0.
SIGHUP reads the config again and applies its log level (the rest needs a restart). Under
systemd, log lines go to the journal with their level and fields (:mod:`.journal`).
``--check-config`` loads the config and the flags as a start would, checks the paths they name
(:mod:`.checkconfig`), prints each thing wrong and exits 1 if any is an error, 0 otherwise;
``--print-default-config`` prints the defaults as a config file.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import NoReturn

import shim
from shim.cri.api import NotGenerated
from shim.lib.arguments import mistyped_option
from shim.lib.logs import setup_logging
from shim.lib.notify import Notifier
from shim.lib.program import exit_status
from shim.rpc.channel import install_uvloop

from client.cri import logcontext

from . import config as configuration
from . import journal


class _Parser(argparse.ArgumentParser):
    """podshimd's flags: a mistyped one is named with the flag it may mean."""

    words: list[str] = []

    def error(self, message: str) -> NoReturn:
        super().error(mistyped_option(self, self.words) or message)


def _parser(words: list[str] | None = None) -> argparse.ArgumentParser:
    """podshimd's parser, for the command line ``words`` (whose mistyped flags its errors name)."""
    parser = _Parser(prog="podshimd", description="podshim's CRI v1 runtime (gRPC on a Unix socket)")
    parser.words = words or []
    configuration.add_arguments(parser)
    parser.add_argument("--version", action="version", version=f"podshimd {shim.__version__}")
    once = parser.add_mutually_exclusive_group()
    once.add_argument("--check-config", action="store_true",
                      help="check the config (the file and these flags) and the paths it names, print what is "
                           "wrong, and exit: 0 when podshimd can start on it, 1 when not")
    once.add_argument("--print-default-config", action="store_true",
                      help="print the defaults as a config file (TOML) and exit")
    return parser


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    args = _parser(words).parse_args(words)  # usage errors: argparse prints them and exits 2
    # A bad config is a ValueError, the daemon's own failures shim.lib.program.Failure: one sentence each.
    return exit_status("podshimd", lambda: _serve(args), NotGenerated)


def _serve(args: argparse.Namespace) -> int:
    if args.print_default_config:
        from .checkconfig import default_config

        sys.stdout.write(default_config())
        return 0
    config = configuration.from_arguments(args)
    if args.check_config:
        return _check_config(args, config)
    from .checkconfig import cgroup_driver_unmet

    for reason in cgroup_driver_unmet(config.cgroup_driver):  # pods would fail one by one: refuse now
        raise configuration.ConfigError(_source(args), "cgroup_driver", reason)
    from .server import serve  # the generated CRI code, before anything starts

    setup_logging(debug=config.log_level == "debug")
    logcontext.install()  # pod_id= and container_id= on every line about a pod
    journal.install("podshimd")  # under systemd: each line a journal entry with its level and fields
    logging.getLogger().setLevel(config.log_level.upper())
    install_uvloop()
    notifier = Notifier.from_env()
    running = config

    def on_hangup() -> None:
        nonlocal running
        running = configuration.reload_log_level(args, running, logging.getLogger("client.podshimd"))

    try:
        asyncio.run(serve(config, notifier=notifier, on_hangup=on_hangup))
    finally:
        notifier.close()
    return 0


def _check_config(args: argparse.Namespace, config: configuration.Config) -> int:
    from .checkconfig import check

    source = _source(args)
    findings = check(config)
    for finding in findings:
        print(f"podshimd: {finding}", file=sys.stderr)
    errors = sum(f.level == "error" for f in findings)
    if errors:
        print(f"podshimd: {source}: {errors} error(s): podshimd would not run on it", file=sys.stderr)
        return 1
    print(f"podshimd: {source}: OK" + (f" ({len(findings)} warning(s))" if findings else ""))
    return 0


def _source(args: argparse.Namespace) -> str:
    """Where the config came from, for messages: its file, or the defaults when there is none."""
    source: str = args.config or configuration.DEFAULT_CONFIG_PATH
    if args.config is None and not os.path.exists(source):
        return f"the defaults (no {source})"
    return source


def run() -> None:
    """The ``podshimd`` program (bin/podshim's launcher runs it): :func:`main`, then exit."""
    from shim.lib.program import long_running

    long_running()  # the launcher starts with the garbage collector off; a daemon needs it
    sys.exit(main())


if __name__ == "__main__":
    run()
