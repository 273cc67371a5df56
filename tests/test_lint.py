"""The linters, run by the suite so that CI fails on a lint error with the linter's own message.

ruff over the code, the tests and the benchmarks, mypy (strict) over the wire and the state
machines; both as configured in pyproject.toml ([tool.ruff], [tool.mypy]), from this Python's
environment (the `test` extras install them).
"""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def lint(*argv: str) -> str:
    """What the linter said (nothing when it found nothing), with its exit status when not 0."""
    done = subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    said = done.stdout + done.stderr
    return said if done.returncode == 0 else f"{said}(exit status {done.returncode})"


def test_ruff_finds_nothing():
    assert lint("ruff", "check", "--quiet", "--no-cache", "--output-format", "concise", "shim", "client", "tests", "bench") == ""


def test_mypy_finds_nothing():
    assert lint("mypy", "--no-error-summary") == ""
