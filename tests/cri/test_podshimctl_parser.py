"""podshimctl builds only the arguments of the command it runs, and reads a command line exactly
as the full parser does (issue #15: building every verb's arguments was 5 ms of each run)."""

from __future__ import annotations

import json

import pytest

from client.cli import main as cli

SAME = [
    ["pods"],
    ["ps", "-a"],
    ["--runtime-root", "/run/x", "pods", "-q"],
    ["--runtime-root=/run/x", "--json", "inspectp", "abc"],
    ["-n", "k8s.io", "--spawner", "systemd", "--no-template", "sandbox", "list"],
    ["--address", "unix:///run/s", "call", "podshim.sandbox.v1.Sandbox", "PingSandbox", "{}"],
    ["--debug", "sandbox", "status", "sb1", "--json"],
]
FULL = [
    ["-h", "pods"],  # the top-level help lists every command
    ["--runt", "/run/x", "pods"],  # an abbreviation: argparse's to resolve
    ["--json=yes", "pods"],
    ["--", "pods"],
    ["nope"],
    ["--runtime-root", "/run/x"],
    [],
]


def _shown(args) -> dict:
    """The parsed arguments, a verb's function by name (each build makes its own closures)."""
    return {k: v.__qualname__ if callable(v) else v for k, v in vars(args).items()}


@pytest.mark.parametrize("argv", SAME, ids=" ".join)
def test_the_command_alone_reads_argv_as_the_full_parser(argv):
    command = cli._command_in(argv, cli.build_parser())
    assert command is not None and command in argv
    alone = cli.build_parser(command)
    assert _shown(alone.parse_args(argv)) == _shown(cli.build_parser().parse_args(argv))
    verbs = alone._subparsers._group_actions[0].choices
    assert list(verbs) == [command]


@pytest.mark.parametrize("argv", FULL, ids=lambda a: " ".join(a) or "nothing")
def test_the_full_parser_decides_when_the_command_is_not_certain(argv) -> None:
    assert cli._command_in(argv, cli.build_parser()) is None


def test_usage_errors_are_the_full_parsers(capsys) -> None:
    assert cli.main(["pods", "--bogus"]) == 2
    alone = capsys.readouterr().err
    parser = cli.build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["pods", "--bogus"])
    assert alone == capsys.readouterr().err


def test_a_run_builds_the_top_level_parser_once(monkeypatch) -> None:
    built = []

    class Counted(cli._Parser):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self.prog)

    monkeypatch.setattr(cli, "_Parser", Counted)
    assert cli.main(["sandbox", "list", "--bogus"]) == 2
    assert built.count("podshimctl") == 1


@pytest.mark.parametrize("before, after", [
    (["--endpoint", "unix:///run/x.sock", "pods"], ["pods", "--endpoint", "unix:///run/x.sock"]),
    (["--runtime-root", "/run/x", "--namespace", "ns", "ps", "-a"], ["ps", "-a", "--runtime-root", "/run/x", "-n", "ns"]),
    (["--root", "/x", "--spawner", "systemd", "sandbox", "list"], ["sandbox", "list", "--root", "/x", "--spawner", "systemd"]),
    (["--json", "--debug", "version"], ["version", "--debug", "--json"]),
], ids=lambda argv: " ".join(argv))
def test_global_options_go_before_or_after_the_command(before, after) -> None:
    assert _shown(cli.build_parser().parse_args(before)) == _shown(cli.build_parser().parse_args(after))


def test_an_option_before_the_command_is_not_undone_after_it() -> None:
    args = cli.build_parser().parse_args(["--endpoint", "unix:///run/x.sock", "pods", "-q"])
    assert args.endpoint == "unix:///run/x.sock"


@pytest.mark.parametrize("argv, said", [
    (["pdos"], "unknown command 'pdos'; did you mean 'pods' or 'ps'?"),
    (["sandbox", "lsit"], "unknown command 'lsit'; did you mean 'list'?"),
    (["--spawner", "exce", "pods"], "unknown choice for --spawner 'exce'; did you mean 'exec'?"),
    (["xyzzy"], "unknown command 'xyzzy' (choose from 'call', "),
    (["--endpiont", "unix:///run/x.sock", "pods"], "unknown option '--endpiont'; did you mean '--endpoint'?"),
    (["logs", "--tial", "5", "abc"], "unknown option '--tial'; did you mean '--tail'?"),
    (["sandbox", "list", "--jsno"], "unknown option '--jsno'; did you mean '--json'?"),
])
def test_a_mistyped_command_gets_did_you_mean(capsys, argv, said) -> None:
    assert cli.main(argv) == 2
    assert said in capsys.readouterr().err


def _completions(words: list[str]) -> list[str]:
    """What bash completes for the last of ``words`` with podshimctl's completion script loaded."""
    import subprocess
    import sys

    from support.critools import REPO

    script = subprocess.run([sys.executable, "-m", "client.cli", "completion", "bash"], cwd=REPO, capture_output=True,
                            text=True, timeout=60, check=True).stdout
    line = " ".join(words)
    probe = (f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; COMP_LINE='{line}'; "
             "COMP_POINT=${#COMP_LINE}; _shtab_podshimctl; printf '%s\\n' \"${COMPREPLY[@]}\"")
    return subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=60, check=True).stdout.split()


@pytest.mark.parametrize("argv, said", [
    (["--json", "pdos"], "podshimctl: unknown command 'pdos'; did you mean 'pods' or 'ps'?"),
    (["logs", "--json"], "podshimctl logs: the following arguments are required: CONTAINER_ID"),
    (["--json", "logs", "--tail"], "podshimctl logs: argument --tail: expected one argument"),
], ids=lambda argv: " ".join(argv) if isinstance(argv, list) else "")
def test_a_usage_error_under_json_is_json_and_exit_status_2(capsys, argv, said) -> None:
    assert cli.main(argv) == 2
    error = json.loads(capsys.readouterr().err)["error"]
    assert (error["code"], error["message"]) == (None, said) and error["usage"].startswith("usage: podshimctl")


def test_a_usage_error_without_json_stays_text_even_when_a_commands_argument_is_json(capsys) -> None:
    assert cli.main(["exec", "--timeout", "x", "ctr", "--", "tool", "--json"]) == 2
    assert "podshimctl exec: error: argument --timeout: invalid" in capsys.readouterr().err


def test_bash_completes_verbs_and_their_options_from_the_parser() -> None:
    assert _completions(["podshimctl", "po"]) == ["pods", "port-forward"]
    assert {"--interactive", "--tty", "--timeout"} <= set(_completions(["podshimctl", "exec", "--"]))
    assert _completions(["podshimctl", "sandbox", "sh"]) == ["shutdown"]


def test_the_manual_page_is_made_from_the_parser_and_man_renders_it() -> None:
    import shutil
    import subprocess
    import sys

    from support.critools import REPO

    page = subprocess.run([sys.executable, "-m", "client.cli", "man"], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=True).stdout
    assert page.startswith('.TH PODSHIMCTL "1" ')
    assert "\n.SH NAME\npodshimctl \\- the node's crictl: " in page  # what whatis and apropos read
    for verb in ("exec", "attach", "port-forward", "logs", "sandbox"):
        assert f".SS \\fBpodshimctl {verb}\\fR".replace("-", "\\-") in page  # roff escapes each hyphen
    if shutil.which("man"):
        shown = subprocess.run(["man", "-l", "-"], input=page, capture_output=True, text=True, timeout=60,
                               env={"MANWIDTH": "100", "PATH": "/usr/bin:/bin", "MANPAGER": "cat"})
        assert shown.returncode == 0 and "podshimctl port-forward" in shown.stdout and not shown.stderr, shown
