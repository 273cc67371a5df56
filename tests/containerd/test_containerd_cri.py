"""containerd's CRI running pods on podshim's shim: the real containerd (.ci/pins.toml's), started
privately (tests/containerd/ctrdtools.py) with a ``podshim`` runtime handler (``sandboxer = "shim"``),
driven by the real crictl with ``--runtime podshim``. Nothing is left once a pod is removed: no shim,
pause, bundle, socket or network namespace.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import pytest

from ctrdtools import running_containerd
from netrelay import loopback_relay
from shimtools import ProcessRef


@pytest.fixture
def directory():
    path = tempfile.mkdtemp(prefix="ctrd-")  # short: containerd's socket path must fit sun_path
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def containerd(directory, outer_netns, test_images):
    registry = test_images.registry
    port = int(registry.host.rpartition(":")[2])
    with loopback_relay(outer_netns, port), \
            running_containerd(directory, outer_netns, registry.host, test_images.busybox.ref) as daemon:
        yield daemon


def pod_config(directory: str, name: str) -> str:
    path = os.path.join(directory, f"{name}.json")
    with open(path, "w") as f:
        json.dump({"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
                   "hostname": name, "log_directory": os.path.join(directory, "logs", name)}, f)
    return path


def test_a_pod_runs_on_podshims_shim_through_containerds_cri_and_leaves_nothing(containerd, crictl, directory):
    ran = containerd.crictl(crictl, "runp", "--runtime", "podshim", pod_config(directory, "web"))
    assert ran.returncode == 0, f"{ran.stderr}\n{containerd.log()[-6000:]}"
    pod_id = ran.stdout.strip()
    inspected = containerd.crictl(crictl, "inspectp", pod_id)
    assert inspected.returncode == 0, inspected.stderr
    status = json.loads(inspected.stdout)
    assert status["status"]["state"] == "SANDBOX_READY"
    assert containerd.sandbox_bundles() == [pod_id]
    with open(os.path.join(containerd.state, "io.containerd.sandbox.controller.v1.shim", "k8s.io", pod_id,
                           "podshim", "state.json")) as f:
        record = json.load(f)  # podshim's own bundle, inside containerd's
    assert (record["sandbox_id"], record["state"]) == (pod_id, "running")
    pause = ProcessRef(record["pause"]["pid"])
    assert containerd.shims() == [record["shim_pid"]]
    # The pause is in the network namespace containerd's CRI made (and ran CNI in).
    assert [os.path.join(containerd.state, "io.containerd.grpc.v1.cri", "netns", name)
            for name in containerd.netns_files()] == [record["netns_path"]]
    assert os.stat(f"/proc/{pause.pid}/ns/net").st_ino == os.stat(record["netns_path"]).st_ino

    stopped = containerd.crictl(crictl, "stopp", pod_id)
    assert stopped.returncode == 0, f"{stopped.stderr}\n{containerd.log()[-6000:]}"
    inspected = json.loads(containerd.crictl(crictl, "inspectp", pod_id).stdout)
    assert inspected["status"]["state"] == "SANDBOX_NOTREADY"
    assert pause.has_exited()
    pause.close()

    removed = containerd.crictl(crictl, "rmp", pod_id)
    assert removed.returncode == 0, f"{removed.stderr}\n{containerd.log()[-6000:]}"
    assert containerd.crictl(crictl, "pods", "-q").stdout.strip() == ""
    assert containerd.sandbox_bundles() == []
    assert containerd.netns_files() == []
    assert containerd.shim_sockets() == []
    assert containerd.shims() == []
