"""critest, the CRI conformance suite (cri-tools at the version .ci/pins.toml pins), whole, against
podshimd with each runtime handler: every spec passes but the ones EXPECTED lists, each with the
state it ends in and why. A listed spec that ends otherwise (passes, say, once its issue is fixed)
fails the test as an unexpected failure does, and so does an entry no spec matches: the list
cannot rot.

podshimd and critest run inside a network namespace this test makes, with a CNI bridge config
there (critest wants NetworkReady, reaches the pods' addresses and host ports from where they
are, and the bridge plugin never touches the machine's network). critest's images are built
offline into the tests' local registry (tests/support/imagebuild.py), podshimd mirrors the registries
critest names to it, and a relay (tests/support/netrelay.py) makes the registry's loopback address answer
inside the namespace. Mounts are the machine's: critest's mount propagation specs mount on the
host, and podshimd shares its mount namespace."""

from __future__ import annotations

import shutil
import tempfile
import time

import pytest

from shim.cri.api import api_pb2

from support.critools import ExpectedSpecs, cni_config, critest_in, critest_surprises, run_critest, running_podshimd
from support.netrelay import loopback_relay

#: Seconds one whole run may take (about 2 minutes on a quiet machine; a few specs wait a minute).
CRITEST_TIMEOUT = 1800


EXPECTED = [
    # Offline-impossible.
    ExpectedSpecs(r"Image Manager public image with digest should be pulled and removed", "failed",
                  "pulls upstream's gcr.io/k8s-staging-cri-tools/test-image-digest@sha256:9700f9…, a manifest no offline "
                  "build can reproduce (tests/support/imagebuild.py: CritestImages.unavailable)"),
    # What critest runs only when asked, or what this machine has not.
    ExpectedSpecs(r"benchmark about ", "skipped", "critest's benchmarks run only with --benchmark"),
    ExpectedSpecs(r"\[k8s.io\] NRI ", "skipped",
                  "critest runs the NRI specs only with --nri-socket; podshimd has no NRI"),
    ExpectedSpecs(r"\[k8s.io\] AppArmor ", "skipped", "AppArmor is disabled on this machine's kernel"),
]
#: critest's specs (its Windows specs included), as this version lists them.
ALL_SPECS = 142


@pytest.fixture
def directory():
    path = tempfile.mkdtemp(prefix="psd-crit-")
    yield path
    shutil.rmtree(path)


@pytest.mark.parametrize("handler", ["native", "runc", "crun"])
def test_critest_passes_every_spec_but_the_expected_ones(critest, critest_image_set, directory, outer_netns,
                                                         handler) -> None:
    if handler != "native" and not shutil.which(handler, path="/usr/sbin:/usr/bin:/sbin:/bin"):
        pytest.skip(f"{handler} is not installed")
    images = critest_image_set
    cni_config(directory)
    port = int(images.registry.host.rpartition(":")[2])
    with loopback_relay(outer_netns, port), \
            running_podshimd(directory, config=images.podshim_registry_config(), netns=outer_netns) as daemon:
        started = time.monotonic()
        result = run_critest(critest_in(outer_netns, critest, directory), daemon.endpoint, cwd=directory,
                             extra=["--runtime-handler", handler], timeout=CRITEST_TIMEOUT)
        took = time.monotonic() - started
        assert len(result.specs) == result.total == ALL_SPECS, f"{result.summary()}\n{result.output[-6000:]}"
        surprises = critest_surprises(result, EXPECTED, handler)
        assert not surprises, (f"{result.summary()} in {took:.0f} s; not as expected:\n" + "\n".join(surprises))
        # critest removed what it made: no pod or container is left, in the daemon or on the machine.
        runtime = daemon.runtime()
        assert list(runtime.ListPodSandbox(api_pb2.ListPodSandboxRequest()).items) == []
        assert list(runtime.ListContainers(api_pb2.ListContainersRequest()).containers) == []
        assert daemon.sandbox_bundles() == []
    assert "Traceback" not in daemon.log()

