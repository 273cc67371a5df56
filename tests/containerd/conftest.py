"""The containerd tests' fixtures: crictl (tests/support/critools.py), a throwaway network namespace, a
directory of the test's own and the real containerd started in them, and podshim-sandboxer serving its
proxy plugin (tests/support/ctrdtools.py)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
import time

import pytest

from support.critools import crictl, critest, outer_netns
from support.ctrdtools import running_containerd, running_sandboxer
from support.imagebuild import critest_image_set
from support.netrelay import loopback_relay

__all__ = ["crictl", "critest", "critest_image_set", "ctrd_netns", "directory", "containerd", "outer_netns",
           "sandboxer"]

#: Seconds the namespace's removal is retried: a mount namespace that copied its bind mount may
#: hold it busy for a moment after the processes that made it are gone.
REMOVE_TIMEOUT = 10.0


@pytest.fixture
def ctrd_netns():
    """A network namespace of the test's own (loopback up) for containerd and its CNI; its path.
    Removed after the test, and the test fails if it cannot be."""
    name = f"podshim-ctrd-{secrets.token_hex(4)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    path = f"/var/run/netns/{name}"
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield path
    finally:
        deadline = time.monotonic() + REMOVE_TIMEOUT
        while True:
            done = subprocess.run(["ip", "netns", "del", name], capture_output=True, text=True)
            if not os.path.exists(path):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"cannot remove the network namespace {path}: {done.stderr.strip()}")
            time.sleep(0.1)


@pytest.fixture
def directory():
    path = tempfile.mkdtemp(prefix="ctrd-")  # short: containerd's socket path must fit sun_path
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def containerd(directory, ctrd_netns, test_images):
    """containerd (ctrdtools.running_containerd) in ``ctrd_netns``, pulling from the tests' registry."""
    registry = test_images.registry
    port = int(registry.host.rpartition(":")[2])
    with loopback_relay(ctrd_netns, port), \
            running_containerd(directory, ctrd_netns, registry.host, test_images.busybox.ref) as daemon:
        yield daemon


@pytest.fixture
def sandboxer(containerd):
    """podshim-sandboxer (ctrdtools.running_sandboxer) serving ``containerd``'s proxy plugin."""
    with running_sandboxer(containerd) as process:
        yield process
