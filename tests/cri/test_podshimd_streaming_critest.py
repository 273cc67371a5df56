"""critest 1.26's Streaming specs (exec, attach, port-forward through the runtime's streaming server)
against podshimd, with critest's images from the local registry (tests/imagebuild.py).

Port-forward's spec first fetches the web server's page at the pod's IP, so the pod needs a network:
podshimd and critest both run inside a network namespace this test makes, with a CNI bridge there
(never on the machine's network); the local registry, on the machine's loopback, is reached through a
relay that listens on the same address inside that namespace."""

from __future__ import annotations

import shutil
import tempfile

from critools import cni_config, critest_in, run_critest, running_podshimd
from imagebuild import critest_images
from netrelay import loopback_relay


def test_critest_streaming_specs_pass(critest, test_images, outer_netns, tmp_path):
    images = critest_images(test_images)
    port = int(images.registry.host.rpartition(":")[2])
    directory = tempfile.mkdtemp(prefix="psd-cst-")
    try:
        cni_config(directory, portmap=False)
        with loopback_relay(outer_netns, port), \
                running_podshimd(directory, config=images.podshim_registry_config(), netns=outer_netns) as daemon:
            result = run_critest(critest_in(outer_netns, critest, directory), daemon.endpoint, images,
                                 focus="Streaming", cwd=str(tmp_path))
            assert "Traceback" not in daemon.log()
    finally:
        shutil.rmtree(directory)
    assert (result.passed, result.failed) == (5, 0), f"{result.failures}\n{result.output[-6000:]}"
