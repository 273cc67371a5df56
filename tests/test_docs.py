"""The documentation against the code: docs/configuration.md names every config key of podshimd (with
the schema's default), every flag of podshimd, podshimctl and podshim, and every PODSHIM_* variable
the tree reads; and every relative link of README.md and docs/*.md leads to a file that exists.
No daemon runs: the parsers and the schema are read as they are.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import re
import subprocess

import pytest

from client.podshimd import config as podshimd_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "configuration.md")
CONFIG_TABLE = re.compile(r"<!-- config keys:[^\n]*-->\n(.*?)<!-- end of config keys -->", re.S)

#: PODSHIM_* names in the tree that are no environment variable any program of ours reads.
NOT_VARIABLES = {
    "PODSHIM_DIR": "a constant of shim/containerd/cli.py (a directory's name)",
    "PODSHIM_DEMO": "set in the example container's environment (examples/container-config.json)",
}
#: A PODSHIM_* name as code reads or sets it: in a string, or after $ (shell, unit files, messages).
VARIABLE_USE = re.compile(r"""["'$]\{?(PODSHIM_[A-Z0-9_]+)""")
VARIABLE = re.compile(r"PODSHIM_[A-Z0-9_]+")


def page() -> str:
    with open(PAGE, encoding="utf-8") as f:
        return f.read()


def toml_value(value: object) -> str:
    """A default as config.toml would spell it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, tuple):
        if value and not isinstance(value[0], str):
            raise AssertionError(f"no spelling for the default {value!r}")
        return "{}" if not value else "[" + ", ".join(json.dumps(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


def config_rows() -> dict[str, list[str]]:
    """The config table's rows: key -> its cells (default, flag, meaning), code spans unwrapped."""
    found = CONFIG_TABLE.search(page())
    assert found, "docs/configuration.md has no config table between its markers"
    rows = {}
    for line in found.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        key = re.fullmatch(r"`(\w+)`", cells[0])
        if key:
            rows[key.group(1)] = cells[1:]
    return rows


def test_the_config_table_has_every_key_of_the_schema_and_no_other() -> None:
    fields = {f.name: f for f in dataclasses.fields(podshimd_config.Config)}
    rows = config_rows()
    missing = [f"| `{name}` | `{toml_value(field.default)}` | "
               f"{'`' + podshimd_config._FLAGS[name] + '`' if name in podshimd_config._FLAGS else ''} | MEANING |"
               for name, field in fields.items() if name not in rows]
    assert missing == [], "docs/configuration.md's config table lacks these rows:\n" + "\n".join(missing)
    assert sorted(set(rows) - set(fields)) == [], "the config table names keys the schema does not have"


@pytest.mark.parametrize("field", dataclasses.fields(podshimd_config.Config), ids=lambda f: f.name)
def test_each_config_default_is_the_schemas(field) -> None:
    default, flag = config_rows()[field.name][:2]
    assert default == f"`{toml_value(field.default)}`"
    expected_flag = podshimd_config._FLAGS.get(field.name)
    if expected_flag is None:
        assert flag == "", f"{field.name} has no flag"
    else:
        assert flag.startswith(f"`{expected_flag}`")


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every option of ``parser`` and of its subcommands' parsers."""
    options: set[str] = set()
    for action in parser._actions:
        options.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                options |= option_strings(sub)
    return options


def parsers() -> dict[str, argparse.ArgumentParser]:
    from shim.cli import _parser as podshim_parser
    from shim.containerd.proxy import _parser as sandboxer_parser

    from client.cli.main import _top_parser
    from client.podshimd.__main__ import _parser as podshimd_parser

    return {"podshimd": podshimd_parser(), "podshimctl": _top_parser(), "podshim": podshim_parser(),
            "podshim-sandboxer": sandboxer_parser()}


@pytest.mark.parametrize("program", ["podshimd", "podshimctl", "podshim", "podshim-sandboxer"])
def test_every_flag_is_on_the_page(program) -> None:
    text = page()
    section = text.split(f"\n### {program}\n", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    missing = sorted(o for o in option_strings(parsers()[program])
                     if not re.search(rf"`{re.escape(o)}[ `]|, {re.escape(o)}[ `]", section))
    assert missing == [], f"docs/configuration.md's {program} section lacks {missing}"


def variables_read() -> dict[str, str]:
    """Every PODSHIM_* variable the tree reads or sets -> the first file that does."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True,
                           timeout=30).stdout.decode().split("\0")
    found: dict[str, str] = {}
    for name in files:
        if not name or name.endswith(".md") or name == "tests/test_docs.py":
            continue
        try:
            with open(os.path.join(ROOT, name), encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue
        for variable in VARIABLE_USE.findall(text):
            found.setdefault(variable, name)
    return {v: where for v, where in found.items() if v not in NOT_VARIABLES}


def test_every_podshim_variable_is_on_the_page_and_every_one_there_is_read() -> None:
    read = variables_read()
    assert "PODSHIM_ENDPOINT" in read  # the scan finds what it must
    environment = page().split("\n## Environment variables\n", 1)[1]
    documented = set(re.findall(r"^\| `(PODSHIM_[A-Z0-9_]+)`", environment, re.M))
    missing = {v: where for v, where in read.items() if v not in documented}
    assert missing == {}, f"docs/configuration.md does not describe these variables (read in): {missing}"
    assert sorted(set(VARIABLE.findall(page())) - set(read)) == [], "the page names variables nothing reads"


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def pages() -> list[str]:
    return [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]


@pytest.mark.parametrize("path", pages(), ids=lambda p: os.path.relpath(p, ROOT))
def test_every_relative_link_resolves(path) -> None:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor of this page
        file = target.split("#", 1)[0]
        if not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(path), file))):
            broken.append(target)
    assert broken == [], f"{os.path.relpath(path, ROOT)} links to what does not exist: {broken}"
