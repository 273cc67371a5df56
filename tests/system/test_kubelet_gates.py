"""kubelet with the feature gates that change how it uses CRI, on a podshimd node.

EventedPLEG: kubelet takes a pod's container statuses from PodSandboxStatus whenever the response
has a timestamp, and asks ContainerStatus only when it has none; a runtime that stamps the response
without the statuses tells kubelet the pod has no container, and kubelet runs the pod's container
again and again (a Never pod's `true` ran hundreds of times in five minutes). Each pod's containers
are counted on the node, by crictl, against its restart count.

PodAndContainerStatsFromCRI: the summary API's figures come from the runtime's stats RPCs instead of
cadvisor, a pod's network from PodSandboxStats (without it, the summary has no pod network).

Slow: one single-node cluster, about a minute on a warm tools cache.
"""

from __future__ import annotations

import ipaddress
import json
import os
import sys
from collections.abc import Iterator

import pytest

from bench import cluster as harness

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from support import kubetools as kt  # noqa: E402  (once bench/ or tests/ is on the path)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

KUBELET = {"featureGates": {"EventedPLEG": True, "PodAndContainerStatsFromCRI": True},
           "crashLoopBackOff": {"maxContainerRestartPeriod": "2s"}}

NEVER_SUCCEEDS = """
apiVersion: v1
kind: Pod
metadata: {name: never-succeeds}
spec:
  restartPolicy: Never
  containers: [{name: c, image: IMAGE, command: ["true"]}]
"""


@pytest.fixture(scope="module")
def c() -> Iterator[harness.Cluster]:
    with harness.cluster(nodes=1, name=f"e{os.getpid()}", kubelet=KUBELET) as made:
        yield made


def finished(phase: str):
    return lambda p: p["status"].get("phase") == phase


def containers_on_node(c: harness.Cluster, p: dict) -> list[dict]:
    return kt.node_containers(c, 1, p["metadata"]["uid"])


def test_each_pod_runs_its_container_as_often_as_its_restart_policy_says(c) -> None:
    kt.apply(c, NEVER_SUCCEEDS, IMAGE=harness.BUSYBOX)
    kt.apply(c, kt.RESTART_POLICIES, IMAGE=harness.BUSYBOX)
    succeeded = kt.wait_pod(c, "never-succeeds", "Succeeded", finished("Succeeded"))
    failed = kt.wait_pod(c, "never-fails", "Failed", finished("Failed"))
    for p, code in ((succeeded, 0), (failed, 3)):
        state = kt.container(p, "c")
        assert state["restartCount"] == 0 and state["state"]["terminated"]["exitCode"] == code
        assert len(containers_on_node(c, p)) == 1, p["metadata"]["name"]
    once = kt.wait_pod(c, "onfailure-once", "Succeeded", finished("Succeeded"))
    # Its first container may be collected already once the pod is done: never more than its two runs.
    assert kt.container(once, "c")["restartCount"] == 1 and 1 <= len(containers_on_node(c, once)) <= 2
    again = kt.wait_pod(c, "always-exits-0", "restarted twice after exiting 0",
                        lambda p: kt.container(p, "c").get("restartCount", 0) >= 2)
    held = len(containers_on_node(c, again))
    # One container per run at most (kubelet may have made the next one since the count was read).
    assert 1 <= held <= kt.container(kt.pod(c, "always-exits-0"), "c")["restartCount"] + 2
    c.kubectl("delete", "pod", "never-succeeds", "never-fails", "onfailure-once", "always-exits-0", "--wait=false")


PINGER = """
apiVersion: v1
kind: Pod
metadata: {name: pinger}
spec:
  terminationGracePeriodSeconds: 1
  containers: [{name: c, image: IMAGE, command: ["sleep", "3600"]}]
"""


def pod_network(c: harness.Cluster, uid: str) -> dict:
    """The network figures of the pod of UID ``uid`` in its node's summary API ({} if none)."""
    summary = json.loads(c.kubectl("get", "--raw", "/api/v1/nodes/node1/proxy/stats/summary").stdout)
    return next((p.get("network") or {} for p in summary.get("pods", []) if p["podRef"]["uid"] == uid), {})


def test_the_summary_apis_pod_network_is_the_pods_interface_as_podshimd_reads_it(c) -> None:
    kt.apply(c, PINGER, IMAGE=harness.BUSYBOX)
    running = kt.wait_pod(c, "pinger", "running", kt.running)
    gateway = str(ipaddress.ip_network(c.nodes()[0]["pod_cidr"]).network_address + 1)  # the node's cni0
    c.kubectl("exec", "pinger", "--", "ping", "-c", "3", "-i", "0.2", "-W", "2", gateway)
    network = kt.wait_until("the pod's network in the summary API", lambda: pod_network(c, running["metadata"]["uid"]),
                            lambda n: n.get("rxBytes", 0) > 0 and n.get("txBytes", 0) >= 3 * 84)
    assert network["name"] == "eth0" and [i["name"] for i in network["interfaces"]] == ["eth0"]
    assert network["rxErrors"] == 0 and network["txErrors"] == 0
    c.kubectl("delete", "pod", "pinger", "--wait=false")
