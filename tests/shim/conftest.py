"""The shim tests' fixtures: real shims, each ended however its test ends (tests/shimtools.py)."""

from __future__ import annotations

from shimtools import shim, shims

# Fixtures are found by name in a conftest module; importing them here, not in each test module,
# keeps a test's parameters from shadowing imported names.
__all__ = ["shim", "shims"]
