"""The system tests' fixtures: shims (tests/support/shimtools.py) and the real crictl (tests/support/critools.py)."""

from __future__ import annotations

from support.critools import crictl, outer_netns
from support.shimtools import shims

# Fixtures are found by name in a conftest module; importing them here, not in each test module,
# keeps a test's parameters from shadowing imported names.
__all__ = ["crictl", "outer_netns", "shims"]
