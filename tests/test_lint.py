"""The linters, run by the suite so that CI fails on a lint error with the linter's own message.

ruff over the code, the tests and the benchmarks, mypy (strict) over shim/, client/, bench/ and the
tests' helpers and (strict but for what a test function needs no annotation for) over the test
modules, import-linter over the layers' import rules; as configured in pyproject.toml
([tool.ruff], [tool.mypy], [tool.importlinter]), from this Python's environment (the `test`
extras install them). And the repository holds only what we wrote: no
upstream schema, no code generated from one, no other project's licence header.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def lint(*argv: str, env: dict[str, str] | None = None) -> str:
    """What the linter said (nothing when it found nothing), with its exit status when not 0."""
    done = subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL, env=env)
    said = done.stdout + done.stderr
    return said if done.returncode == 0 else f"{said}(exit status {done.returncode})"


def test_ruff_finds_nothing() -> None:
    assert lint("ruff", "check", "--quiet", "--no-cache", "--output-format", "concise", "shim", "client", "tests", "bench") == ""


def test_mypy_finds_nothing() -> None:
    assert lint("mypy", "--no-error-summary") == ""


#: How the test modules are judged: [tool.mypy]'s strictness but for what a test function needs no
#: annotation for (pytest hands fixtures in by parameter name; a test returns nothing). A function
#: may go unannotated, and then its body is not checked (nor is a call to it an error); an annotation
#: may use a bare generic (``dict``); Any may be returned; a ``type: ignore`` written for the stricter
#: reading is not flagged, nor is an annotated variable in an unchecked body. Every annotated function
#: and every module's top level is checked as the code is. The tests' helpers (tests/support) are in [tool.mypy]'s files: fully strict.
#: A test function says ``-> None``, so its body is checked; those that do not yet are the ones whose
#: bodies mypy would fault as they are (mostly an attribute read on an Optional the test knows is set).
TEST_MODULES_RELAXED = ("--allow-untyped-defs", "--allow-incomplete-defs", "--allow-untyped-calls",
                        "--no-check-untyped-defs", "--allow-any-generics", "--no-warn-return-any",
                        "--no-warn-unused-ignores", "--disable-error-code", "annotation-unchecked")


def test_mypy_finds_nothing_in_the_test_modules() -> None:
    # Named as pytest imports them: by file name, with each test folder on the path (a test module
    # imports its neighbours by name); each conftest alone, since every folder has one of that name.
    # A cache of their own: these options would spoil the strict run's.
    files = [name for name in tracked_files() if name.startswith("tests/") and name.endswith(".py")
             and not name.startswith("tests/support/")]
    env = {**os.environ, "MYPYPATH": os.pathsep.join(sorted({os.path.dirname(name) for name in files}))}
    mypy = ("mypy", "--no-error-summary", "--cache-dir", os.path.join(".mypy_cache", "tests"), *TEST_MODULES_RELAXED)
    conftests = [name for name in files if os.path.basename(name) == "conftest.py"]
    said = [lint(*mypy, *[name for name in files if name not in conftests], env=env)]
    said += [lint(*mypy, name, env=env) for name in conftests]
    assert "".join(said) == ""


def test_every_layer_imports_only_what_its_contract_allows() -> None:
    # Run from the checkout (sys.path[0] is it), so the code judged is this tree's, not an installed copy's.
    done = subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
                           "sys.exit(lint_imports_command())", "--no-cache"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr


#: A ``noqa`` comment that says which rule it silences and nothing about why.
BARE_NOQA = re.compile(r"#\s*noqa(:\s*[A-Z]+[0-9]+(\s*,\s*[A-Z]+[0-9]+)*)?\s*$")


def test_every_noqa_says_why() -> None:
    bare = []
    for name in tracked_files():
        if name.endswith(".py") and name.split("/")[0] in ("shim", "client", "tests", "bench"):
            with open(os.path.join(ROOT, name), encoding="utf-8") as f:
                bare += [f"{name}:{n}" for n, line in enumerate(f, 1) if BARE_NOQA.search(line)]
    assert bare == []


#: What upstream text looks like: a schema, code protoc generated, another project's notice.
UPSTREAM_FILE = re.compile(r"(\.proto|_pb2(_grpc)?\.pyi?)$")
UPSTREAM_TEXT = re.compile(r"Copyright\s.*The (Kubernetes|containerd) Authors|Licensed under the Apache\s+License"
                           r"|apache\.org/licenses/LICENSE-2\.0|Generated by the protocol\sbuffer compiler", re.I)


def tracked_files() -> list[str]:
    done = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60)
    return [name for name in done.stdout.decode().split("\0") if name]


def test_no_upstream_text_is_tracked() -> None:
    files = tracked_files()
    assert "pyproject.toml" in files  # the listing is the repository's
    found = [name for name in files if UPSTREAM_FILE.search(name)]
    for name in files:
        path = os.path.join(ROOT, name)
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                found += [f"{name}: {match.group(0)}" for match in UPSTREAM_TEXT.finditer(f.read())]
    assert found == []


def test_every_test_module_has_a_name_of_its_own() -> None:
    # pytest imports test modules by their basename (tests/ has no packages): two files of one name
    # in different folders stop the whole suite at collection.
    seen: dict[str, list[str]] = {}
    for name in tracked_files():
        if name.startswith("tests/") and os.path.basename(name).startswith("test_") and name.endswith(".py"):
            seen.setdefault(os.path.basename(name), []).append(name)
    assert {base: paths for base, paths in seen.items() if len(paths) > 1} == {}
