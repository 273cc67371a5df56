"""The argument parser of ``podshim`` and ``podshimctl``: argparse's, without importing shutil.

argparse asks ``shutil.get_terminal_size()`` for the help's width whenever it makes a help
formatter, and it makes one for every ``add_argument`` (to check the argument's metavar), so
every run of a command would import shutil, and with it bz2, lzma and fnmatch: start-up time of
a command that must answer quickly (docs/benchmarks.md), spent for a width that only ``--help``
and a usage error print. :class:`ArgumentParser` (its sub-commands' parsers are of its class too) gives the
formatter the same width from ``os.get_terminal_size``, as shutil would. It is here, with what
the shim shares with its clients, because podshimctl imports nothing else of ``shim``.

:func:`mistyped_option` names the option a mistyped ``--word`` of a command line may mean, for a
usage error that says so (podshimctl's and podshimd's).
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["ArgumentParser", "mistyped_option", "terminal_columns"]


class ArgumentParser(argparse.ArgumentParser):
    """argparse.ArgumentParser whose help formatter is told the terminal's width (see above)."""

    def _get_formatter(self) -> argparse.HelpFormatter:
        return self.formatter_class(prog=self.prog, width=terminal_columns() - 2)  # type: ignore[call-arg]  # argparse's own margin


def terminal_columns(fallback: int = 80) -> int:
    """``shutil.get_terminal_size().columns``: $COLUMNS when it is a positive number, else the
    width of the terminal on stdout, else ``fallback``."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns > 0:
        return columns
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or fallback  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):  # no stdout, closed or detached, or not a terminal
        return fallback


def _long_options(parser: argparse.ArgumentParser) -> set[str]:
    """Every --option of ``parser`` and of its commands, at any depth."""
    found: set[str] = set()
    for action in parser._actions:
        found.update(s for s in action.option_strings if s.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _long_options(sub)
    return found


def mistyped_option(parser: argparse.ArgumentParser, words: list[str]) -> str | None:
    """"unknown option '--tial'; did you mean '--tail'?" for the first --word of ``words`` (before
    "--") that is no option of ``parser``'s or its commands', nor the start of one (argparse's
    abbreviations), and is close to one; else None."""
    import difflib

    known = _long_options(parser)
    for word in words:
        if word == "--":
            break
        name = word.partition("=")[0]
        if not name.startswith("--") or any(option.startswith(name) for option in known):
            continue
        close = difflib.get_close_matches(name, sorted(known), 3, 0.75)
        if close:
            return f"unknown option {name!r}; did you mean {' or '.join(repr(c) for c in close)}?"
    return None
