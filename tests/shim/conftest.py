"""The shim tests' fixtures: real shims, each ended however its test ends (tests/support/shimtools.py)."""

from __future__ import annotations

import asyncio
import signal

import pytest

from shim.lib.processes import signal_process
from shim.runtime.pause import PauseSpec, launch

from support.shimtools import shim, shims

# Fixtures are found by name in a conftest module; importing them here, not in each test module,
# keeps a test's parameters from shadowing imported names.
__all__ = ["shim", "shims"]


@pytest.fixture
async def start(reaper):
    """Launch pauses; each is SIGKILLed (if still the same process) and reaped afterwards."""
    started = []

    async def start_pause(**spec):
        pause = await launch(PauseSpec(**spec), reaper)
        started.append(pause)
        return pause

    yield start_pause
    for pause in started:
        signal_process(pause.pid, pause.start_time, signal.SIGKILL)
        await asyncio.wait_for(pause.exit, 5.0)
