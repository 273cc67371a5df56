"""critest, the CRI conformance suite (cri-tools 1.26), against podshimd: the specs that need no
image — Runtime info (version, conditions) and "PodSandbox runtime should support basic
operations" (run, list, stop, remove) — must all pass; and with images (issue 17) every Image
Manager, Container, Multiple containers, Mount propagation, Networking, PodSandbox and Runtime info
spec.

podshimd runs inside a network namespace this test makes, with a CNI bridge config: critest wants
NetworkReady, and the bridge plugin then acts there, never on the machine's network. With images,
critest runs there too (it reaches the pods' addresses and host ports, through portmap, from where
they are), critest's images are built offline into the tests' local registry (tests/imagebuild.py),
podshimd mirrors the registries critest names to it, and a relay (tests/netrelay.py) makes the
registry's loopback address answer inside the namespace. Mounts are the machine's: critest's mount
propagation specs mount on the host, and podshimd shares its mount namespace."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile

import pytest

from client.criapi import api_pb2
from critools import cni_config, critest_in, run_critest, running_podshimd
from netrelay import loopback_relay

FOCUS = "Runtime info|PodSandbox runtime should support basic"
#: critest 1.26's specs: 85, of which 5 are Windows or benchmark specs it always skips.
ALL_SPECS = 85
#: Seconds the focused run may take (about 2 s when idle).
CRITEST_TIMEOUT = 300

#: The spec groups issue 17 needs passing (ginkgo --focus, a regular expression over spec texts).
IMAGES_FOCUS = "Image Manager|Container|Multiple containers|Mount propagation|Networking|PodSandbox|Runtime info"
#: What is left out (ginkgo --skip), each for a reason outside podshimd:
IMAGES_SKIPPED = {
    # issue 18's specs (their texts say "container" too): test_critest_security_context_and_sysctl_specs_pass
    "Security Context": "issue 18",
    # pulls upstream's gcr.io/k8s-staging-cri-tools/test-image-digest@sha256:9700f9…, a manifest no
    # offline build can reproduce (tests/imagebuild.py: CritestImages.unavailable)
    "public image with digest should be pulled and removed": "upstream digest",
}
IMAGES_SKIP = "|".join(IMAGES_SKIPPED)
#: Seconds the focused run with images may take (it has minute-long waits in a few specs).
IMAGES_CRITEST_TIMEOUT = 1800


@pytest.fixture
def directory():
    path = tempfile.mkdtemp(prefix="psd-crit-")
    yield path
    shutil.rmtree(path)


def test_critest_runtime_info_and_basic_pod_sandbox_specs_pass(critest, directory, outer_netns):
    cni_config(directory, portmap=False)
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


def test_critest_image_container_network_and_mount_specs_pass(critest, critest_image_set, directory, outer_netns):
    images = critest_image_set
    cni_config(directory)
    port = int(images.registry.host.rpartition(":")[2])
    with loopback_relay(outer_netns, port), \
            running_podshimd(directory, config=images.podshim_registry_config(), netns=outer_netns) as daemon:
        result = run_critest(critest_in(outer_netns, critest, directory), daemon.endpoint, images, focus=IMAGES_FOCUS,
                             skip=IMAGES_SKIP, cwd=directory, timeout=IMAGES_CRITEST_TIMEOUT)
        assert result.failed == 0 and result.returncode == 0, (
            f"{result.summary()}\nfailed: {list(result.failures)}\n{result.output[-8000:]}")
        assert result.passed == result.ran >= 37, result.summary()  # 39 of the 85 when written
        # critest removed what it made: no pod or container is left, in the daemon or on the machine.
        runtime = daemon.runtime()
        assert list(runtime.ListPodSandbox(api_pb2.ListPodSandboxRequest()).items) == []
        assert list(runtime.ListContainers(api_pb2.ListContainersRequest()).containers) == []
        assert daemon.sandbox_bundles() == []
    assert "Traceback" not in daemon.log()



#: issue 18's spec groups: the Security Context specs and the pod sysctls.
SECURITY_FOCUS = "Security Context|should support sysctls"
#: What is left out of them, for a reason outside podshimd:
SECURITY_SKIPPED = {
    # masks /bin/ls and expects `/bin/sh -c ls` to fail; the test image's sh is Debian's busybox,
    # built with FEATURE_SH_STANDALONE: it runs its ls applet in-process and never execs /bin/ls
    # (masking itself is tested in tests/shim/test_task_rootfs.py and with the node's sh here)
    "runtime should support MaskedPaths": "busybox's standalone shell",
}


@pytest.mark.parametrize("handler", ["native", "runc", "crun"])
def test_critest_security_context_and_sysctl_specs_pass(critest, critest_image_set, directory, outer_netns, handler):
    if handler != "native" and not shutil.which(handler, path="/usr/sbin:/usr/bin:/sbin:/bin"):
        pytest.skip(f"{handler} is not installed")
    images = critest_image_set
    cni_config(directory)
    port = int(images.registry.host.rpartition(":")[2])
    with loopback_relay(outer_netns, port), \
            running_podshimd(directory, config=images.podshim_registry_config(), netns=outer_netns) as daemon:
        result = run_critest(critest_in(outer_netns, critest, directory), daemon.endpoint, images,
                             focus=SECURITY_FOCUS, skip="|".join(SECURITY_SKIPPED), cwd=directory,
                             extra=["--runtime-handler", handler], timeout=IMAGES_CRITEST_TIMEOUT)
        assert result.failed == 0 and result.returncode == 0, (
            f"{result.summary()}\nfailed: {list(result.failures)}\n{result.output[-8000:]}")
        assert result.passed == result.ran >= 36, result.summary()  # 36 of the 85 when written
        runtime = daemon.runtime()
        assert list(runtime.ListPodSandbox(api_pb2.ListPodSandboxRequest()).items) == []
        assert daemon.sandbox_bundles() == []
    assert "Traceback" not in daemon.log()


@pytest.mark.parametrize("handler", ["native", "runc", "crun"])
def test_critest_mount_propagation_specs_pass_on_every_handler(critest, critest_image_set, directory, outer_netns,
                                                              handler):
    """Private, rslave and rshared (a mount made inside a container reaches the host) with each handler."""
    if handler != "native" and not shutil.which(handler, path="/usr/sbin:/usr/bin:/sbin:/bin"):
        pytest.skip(f"{handler} is not installed")
    images = critest_image_set
    cni_config(directory)
    port = int(images.registry.host.rpartition(":")[2])
    with loopback_relay(outer_netns, port), \
            running_podshimd(directory, config=images.podshim_registry_config(), netns=outer_netns) as daemon:
        result = run_critest(critest_in(outer_netns, critest, directory), daemon.endpoint, images,
                             focus="runtime should support mount propagation", cwd=directory, extra=["--runtime-handler", handler],
                             timeout=IMAGES_CRITEST_TIMEOUT)
        assert result.failed == 0 and result.returncode == 0, (
            f"{result.summary()}\nfailed: {list(result.failures)}\n{result.output[-8000:]}")
        assert result.passed == result.ran >= 3, result.summary()
        assert daemon.sandbox_bundles() == []
    assert "Traceback" not in daemon.log()
