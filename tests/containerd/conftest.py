"""The containerd tests' fixtures: crictl and a throwaway network namespace (tests/critools.py)."""

from __future__ import annotations

from critools import crictl, outer_netns

__all__ = ["crictl", "outer_netns"]
