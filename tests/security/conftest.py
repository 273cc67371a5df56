"""The attack tests' fixtures: a podshimd serving every installed runtime handler, with the
tests' busybox image pulled, and a CRI client (tests/security/attacktools.py) that runs pods and
containers on it the way kubelet does. Every pod a test makes is removed after it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from attacktools import Cri, handlers

from support.critools import Podshimd, private_podshimd
from support.podtools import roots
from support.shimtools import shims

# Fixtures found by name here rather than imported into test modules (where a test's parameter
# would shadow the import): private pod service roots, and real shims.
__all__ = ["roots", "shims"]


@pytest.fixture(scope="module")
def attack_daemon(test_images) -> Iterator[Podshimd]:
    """One podshimd for a module: every installed handler, the test registry, busybox pulled."""
    with private_podshimd("psd-sec-", test_images.busybox,
                          config=f"runtime_handlers = {json.dumps(handlers())}\n") as daemon:
        yield daemon


@pytest.fixture
def cri(attack_daemon) -> Iterator[Cri]:
    """A CRI client of the module's podshimd; the pods it ran are removed after the test."""
    client = Cri(attack_daemon, image=attack_daemon.image)
    try:
        yield client
    finally:
        client.remove_pods()


@pytest.fixture(params=handlers())
def handler(request) -> str:
    """Each installed runtime handler."""
    return request.param
