"""Kubernetes on podshimd: a cluster of Kubernetes' own binaries (the pinned release, built by
.ci/gotool) on this machine, with two nodes whose runtime is this checkout's podshimd
(bench/cluster.py). The smoke: both nodes register and turn Ready showing podshim's runtime
version, a Deployment of 6 spreads over them and becomes Available, exec and logs reach its
pods, a pod reaches a pod on the other node by its IP (ping and HTTP), a ClusterIP Service
answers from its pods through kube-proxy, and `down` leaves nothing behind.

Slow: minutes on a warm tools cache; the first run builds Kubernetes (tens of minutes).
"""

from __future__ import annotations

import json
import os

import pytest

from bench import cluster as harness

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]


def test_two_podshimd_nodes_run_a_deployment_a_service_exec_logs_and_pod_to_pod_across_nodes() -> None:
    name = f"t{os.getpid()}"
    with harness.cluster(nodes=2, name=name) as c:
        nodes = json.loads(c.kubectl("get", "nodes", "-o", "json").stdout)["items"]
        assert sorted(n["metadata"]["name"] for n in nodes) == ["node1", "node2"]
        for node in nodes:
            assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("podshim://"), node["status"]
        line = harness.smoke(c, 2)
        assert line.startswith("smoke: 6 pods on 2 nodes"), line
        directory, cgroups = c.state.dir, list(c.state.data["cgroup"]["paths"].values())
    assert not os.path.exists(directory)
    assert not [path for path in cgroups if os.path.exists(path)]
