"""The pod and podshimd tests' fixtures: crictl, critest and a podshimd (tests/support/critools.py), a pod
service's roots (tests/support/podtools.py), private Controller roots (tests/support/sandbox_env.py)."""

from __future__ import annotations

from support.critools import crictl, critest, daemon, module_daemon, outer_netns
from support.imagebuild import critest_image_set
from support.podtools import roots
from support.sandbox_env import env

# Fixtures are found by name in a conftest module; importing them here, not in each test module,
# keeps a test's parameters from shadowing imported names.
__all__ = ["crictl", "critest", "critest_image_set", "daemon", "env", "module_daemon", "outer_netns", "roots"]
