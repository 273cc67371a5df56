"""The argument parser of ``podshim`` and ``podshimctl``: argparse's, without importing shutil.

argparse asks ``shutil.get_terminal_size()`` for the help's width whenever it makes a help
formatter, and it makes one for every ``add_argument`` (to check the argument's metavar), so
every run of a command would import shutil, and with it bz2, lzma and fnmatch: start-up time of
a command that must answer quickly (docs/benchmarks.md), spent for a width that only ``--help``
and a usage error print. :class:`ArgumentParser` (its sub-commands' parsers are of its class too) gives the
formatter the same width from ``os.get_terminal_size``, as shutil would. It is here, with what
the shim shares with its clients, because podshimctl imports nothing else of ``shim``.
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["ArgumentParser", "terminal_columns"]


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
