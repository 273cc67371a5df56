"""The system tests' fixtures: shims (tests/shimtools.py) and the real crictl (tests/critools.py)."""

from __future__ import annotations

from critools import crictl
from shimtools import shims

# Fixtures are found by name in a conftest module; importing them here, not in each test module,
# keeps a test's parameters from shadowing imported names.
__all__ = ["crictl", "shims"]
