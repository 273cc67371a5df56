"""critest's Runtime info, Container and Security Context specs (the pinned critest, as
tests/cri/test_podshimd_critest.py runs it whole on the host) against podshimd on pure cgroup v2,
under each cgroup driver and runtime handler (marker ``cgroupv2``: they run in the guest of
tests/support/guest.py, whose image carries the Debian busybox critest's default image is made of).
Every spec in focus passes but the ones EXPECTED lists, each with the state it ends in and why; a
listed spec that ends otherwise fails the test, and so does an entry no spec matches. Afterwards
nothing of podshim's is left: no pod, no bundle, no process in its cgroups, no unit of its in systemd."""

from __future__ import annotations

import glob
import re
import shutil
import subprocess
import tempfile
import time

import pytest

from shim.cri.api import api_pb2

from support.critools import ExpectedSpecs, cni_config, critest_in, critest_surprises, run_critest, running_podshimd
from support.netrelay import loopback_relay

pytestmark = pytest.mark.cgroupv2

#: critest's specs that a pod's and a container's cgroups touch.
FOCUS = r"\[k8s\.io\] (Runtime info|Container |Security Context)"
#: How many specs the focus selects in this critest (its benchmark among them; the others are left skipped).
FOCUSED_SPECS = 69
#: Seconds one focused run may take in the emulated guest.
CRITEST_TIMEOUT = 3000

HANDLERS = ["native"] + [h for h in ("runc", "crun") if shutil.which(h, path="/usr/sbin:/usr/bin:/sbin:/bin")]

EXPECTED = [
    ExpectedSpecs(r"benchmark about ", "skipped", "critest's benchmarks run only with --benchmark"),
    ExpectedSpecs(r"UserNamespaces when Host idmap mount support is needed runtime should support NamespaceMode_POD",
                  "failed", "the guest's kernel (Debian 12's 6.1) refuses an overlay of id-mapped layers "
                  "(EOPNOTSUPP), so CreateContainer is FAILED_PRECONDITION 'cannot mount rootfs[0] ... with "
                  "id-mapped layers' (docs/user-namespaces.md); the host's 6.18 takes it and passes the spec"),
]
#: What ends otherwise under one driver only.
DRIVER_EXPECTED: dict[str, list[ExpectedSpecs]] = {}


@pytest.fixture
def directory():
    path = tempfile.mkdtemp(prefix="psd-crit2-")
    yield path
    shutil.rmtree(path)


def podshims_leftovers() -> list[str]:
    """Processes still in podshim's cgroupfs directories, and podshim's units systemd still has."""
    procs = []
    for path in glob.glob("/sys/fs/cgroup/podshim/**/cgroup.procs", recursive=True):
        with open(path) as f:
            procs += f.read().split()
    units = subprocess.run(["systemctl", "list-units", "--all", "--plain", "--no-legend", "podshim-*.scope",
                            "*podshim_*.slice"], capture_output=True, text=True, timeout=60).stdout.split()
    return procs + units


@pytest.mark.timeout(CRITEST_TIMEOUT + 600)
@pytest.mark.parametrize("driver", ["cgroupfs", "systemd"])
@pytest.mark.parametrize("handler", HANDLERS)
def test_on_cgroup_v2_critests_runtime_container_and_security_specs_pass_under_each_driver(
        critest, critest_image_set, directory, outer_netns, handler, driver) -> None:
    images = critest_image_set
    cni_config(directory)
    port = int(images.registry.host.rpartition(":")[2])
    config = f'cgroup_driver = "{driver}"\n{images.podshim_registry_config()}'
    with loopback_relay(outer_netns, port), running_podshimd(directory, config=config, netns=outer_netns) as daemon:
        started = time.monotonic()
        result = run_critest(critest_in(outer_netns, critest, directory), daemon.endpoint, cwd=directory,
                             focus=FOCUS, extra=["--runtime-handler", handler], timeout=CRITEST_TIMEOUT)
        took = time.monotonic() - started
        focused = {name: state for name, state in result.specs.items() if re.search(FOCUS, name)}
        assert len(focused) == FOCUSED_SPECS, f"{result.summary()}\n{result.output[-6000:]}"
        surprises = critest_surprises(result, EXPECTED + DRIVER_EXPECTED.get(driver, []), handler, reference={
            name: "skipped" for name in result.specs if name not in focused})
        assert not surprises, (f"{result.summary()} in {took:.0f} s under {driver}; not as expected:\n"
                               + "\n".join(surprises) + "\n\nFailures:\n"
                               + "\n".join(f"{name}:\n{result.messages.get(name, '')[:3000]}" for name in result.failures))
        runtime = daemon.runtime()
        assert list(runtime.ListPodSandbox(api_pb2.ListPodSandboxRequest()).items) == []
        assert list(runtime.ListContainers(api_pb2.ListContainersRequest()).containers) == []
        assert daemon.sandbox_bundles() == []
    assert "Traceback" not in daemon.log()
    assert podshims_leftovers() == []
