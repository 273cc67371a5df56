"""critest, the CRI conformance suite (cri-tools 1.26), against podshimd: the specs that need no
image — Runtime info (version, conditions) and "PodSandbox runtime should support basic
operations" (run, list, stop, remove) — must all pass.

podshimd runs inside a network namespace this test makes, with a CNI bridge config: critest wants
NetworkReady, and the bridge plugin then acts there, never on the machine's network."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile

import pytest

from client.criapi import api_pb2
from critools import running_podshimd

FOCUS = "Runtime info|PodSandbox runtime should support basic"
#: critest 1.26's specs: 85, of which 5 are Windows or benchmark specs it always skips.
ALL_SPECS = 85
#: Seconds the focused run may take (about 2 s when idle).
CRITEST_TIMEOUT = 300


@pytest.fixture
def outer_netns():
    name = f"podshim-crit-{secrets.token_hex(4)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield f"/var/run/netns/{name}"
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.fixture
def directory():
    path = tempfile.mkdtemp(prefix="psd-crit-")
    yield path
    shutil.rmtree(path)


def test_critest_runtime_info_and_basic_pod_sandbox_specs_pass(critest, directory, outer_netns):
    os.makedirs(os.path.join(directory, "net.d"))
    with open(os.path.join(directory, "net.d", "10-critest.conflist"), "w") as f:
        json.dump({"cniVersion": "1.0.0", "name": "critest", "plugins": [
            {"type": "bridge", "bridge": "crit0", "isGateway": True, "ipMasq": False,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.214.0.0/24"}]],
                      "dataDir": os.path.join(directory, "ipam")}}]}, f)
    with running_podshimd(directory, netns=outer_netns) as daemon:
        done = subprocess.run([critest, "--runtime-endpoint", daemon.endpoint, "--image-endpoint", daemon.endpoint,
                               "--ginkgo.focus", FOCUS, "--ginkgo.no-color"], cwd=directory, capture_output=True,
                              text=True, stdin=subprocess.DEVNULL, timeout=CRITEST_TIMEOUT)
        report = done.stdout + done.stderr
        assert done.returncode == 0, report[-6000:]
        assert f"Ran 5 of {ALL_SPECS} Specs" in report, report[-3000:]
        assert re.search(r"SUCCESS! -- 5 Passed \| 0 Failed", report), report[-3000:]
        # critest removed what it made: no pod is left, in the daemon or on the machine.
        assert list(daemon.runtime().ListPodSandbox(api_pb2.ListPodSandboxRequest()).items) == []
        assert daemon.sandbox_bundles() == []
    assert "Traceback" not in daemon.log()
