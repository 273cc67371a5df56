"""The README's first command ends in examples/quickstart.sh: it must keep working as written, with
the installed commands, on a machine with no registry and no network."""

from __future__ import annotations

import os
import shutil
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_quickstart_runs_a_pod_and_a_container_and_leaves_nothing():
    assert shutil.which("podshimd") and shutil.which("podshimctl"), "the installed commands (.ci/install)"
    done = subprocess.run([os.path.join(REPO, "examples", "quickstart.sh")], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "no pod, no pause, no shim, no netns, no socket, no record." in done.stdout
    assert "inet 10.88." in done.stdout  # the container saw the pod's address
