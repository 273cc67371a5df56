"""Shared test fixtures. Keep this small: prefer fixtures local to a test file."""

from __future__ import annotations

import pytest

from shim.reaper import Reaper


@pytest.fixture
async def reaper():
    """The shim's one Reaper, installed on the test's event loop (the process is a subreaper meanwhile)."""
    reaper = Reaper()
    reaper.install()
    yield reaper
    reaper.uninstall()
