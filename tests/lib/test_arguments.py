"""shim.lib.arguments: the commands' parser formats help exactly as argparse does, at the
width shutil would give, without importing shutil."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys

import pytest

from shim.lib.arguments import ArgumentParser, mistyped_option, terminal_columns


def _build(cls: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = cls(prog="tool", description="A tool whose help wraps at the terminal's width. " * 4)
    p.add_argument("--root", default="/run/x", help="where its files live, a sentence long enough to wrap " * 3)
    sub = p.add_subparsers(dest="action", required=True)
    sp = sub.add_parser("start", help="start one", description="start one " * 20)
    sp.add_argument("--namespace", required=True, help="the namespace " * 10)
    return p


@pytest.mark.parametrize("columns", ["40", "123", "0", "wide", None])
def test_terminal_columns_is_shutils(monkeypatch, columns) -> None:
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert terminal_columns() == shutil.get_terminal_size().columns


@pytest.mark.parametrize("columns", ["50", "120"])
def test_help_and_usage_errors_read_as_argparse_writes_them(monkeypatch, columns) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    ours, theirs = _build(ArgumentParser), _build(argparse.ArgumentParser)
    assert ours.format_help() == theirs.format_help()
    start = lambda p: p._subparsers._group_actions[0].choices["start"]  # noqa: E731  (a one-line accessor)
    assert type(start(ours)) is ArgumentParser
    assert start(ours).format_help() == start(theirs).format_help()
    assert ours.format_usage() == theirs.format_usage()


def test_building_and_parsing_does_not_import_shutil() -> None:
    code = ("import sys; from shim.lib.arguments import ArgumentParser\n"
            "p = ArgumentParser(prog='t'); p.add_argument('--x', help='x')\n"
            "sub = p.add_subparsers(dest='a'); sub.add_parser('go').add_argument('--y')\n"
            "p.parse_args(['--x', '1', 'go', '--y', '2']); print('shutil' in sys.modules)")
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("argv", [
    ["start", "--namespace", "n", "--id", "i", "--bundle", "/b", "--no-template"],
    ["serve", "--instance", "n:i", "--shutdown-on-term"],
    ["delete", "--namespace", "n", "--id", "i", "--bundle", "/b", "--debug"],
    ["template", "--runtime-root", "/r", "--detach"],
], ids=lambda a: a[0])
def test_podshim_builds_only_the_action_it_runs_and_reads_argv_the_same(argv):
    from shim import cli

    alone = cli._parser(argv[0])
    assert list(alone._subparsers._group_actions[0].choices) == [argv[0]]
    assert alone.parse_args(argv) == cli._parser().parse_args(argv)


@pytest.mark.parametrize("words, said", [
    (["--rot", "/x", "start"], "unknown option '--rot'; did you mean '--root'?"),
    (["start", "--namespce", "n"], "unknown option '--namespce'; did you mean '--namespace'?"),
    (["--ro", "/x", "start"], None),  # argparse's abbreviation of --root: not a mistake
    (["start", "--", "--rot"], None),  # after "--": a command's own words
    (["--zzzzzz", "start"], None),  # close to nothing: argparse's own message stays
])
def test_a_mistyped_option_is_named_with_the_options_it_may_mean(words, said) -> None:
    assert mistyped_option(_build(ArgumentParser), words) == said
