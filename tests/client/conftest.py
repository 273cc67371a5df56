"""The Controller tests' fixtures: private roots and the leak check after each test (tests/support/sandbox_env.py)."""

from __future__ import annotations

from support.sandbox_env import env

# Fixtures are found by name in a conftest module; importing them here, not in each test module,
# keeps a test's parameters from shadowing imported names.
__all__ = ["env"]
