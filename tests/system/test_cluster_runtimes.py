"""The harness's node runtimes (bench/cluster.py --runtime): podshimd, or the pinned containerd
with runc as the side-by-side reference, for every node or one per node. A containerd node
registers, turns Ready showing containerd's version, and runs a pod that kubectl reaches; a
cluster of both runtimes reaches a pod on one node from the other; a Service resolves by name
(CoreDNS) from a pod on either; `down` leaves nothing behind.
"""

from __future__ import annotations

import json
import os

import pytest

from bench import cluster as harness
from support.ctrdtools import containerd_version

POD = """
apiVersion: v1
kind: Pod
metadata: {name: NAME, labels: {app: NAME}}
spec:
  nodeName: NODE
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: IMAGE
    command: ["sh", "-c", "echo hello from $(hostname); mkdir -p /www; hostname > /www/index.html; exec httpd -f -p 8080 -h /www"]
"""


def test_one_runtime_names_every_node_and_a_list_names_one_per_node() -> None:
    assert harness.node_runtimes(2, "containerd") == ["containerd", "containerd"]
    assert harness.node_runtimes(2, ["podshimd", "containerd"]) == ["podshimd", "containerd"]
    assert harness.runtime_argument("podshimd,containerd") == ["podshimd", "containerd"]
    assert harness.runtime_argument("containerd") == "containerd"


def test_an_unknown_runtime_or_a_list_of_the_wrong_length_is_refused_with_a_sentence() -> None:
    with pytest.raises(ValueError, match="no node runtime 'crio': the runtimes are podshimd, containerd"):
        harness.node_runtimes(1, "crio")
    with pytest.raises(ValueError, match="1 runtime.* for 2 node"):
        harness.node_runtimes(2, ["containerd"])


def run_pod(c: harness.Cluster, name: str, node: str) -> dict:
    c.kubectl("apply", "-f", "-", input=POD.replace("NAME", name).replace("NODE", node)
              .replace("IMAGE", harness.BUSYBOX))
    c.kubectl("wait", f"pod/{name}", "--for=condition=Ready", "--timeout=180s", timeout=200)
    return json.loads(c.kubectl("get", "pod", name, "-o", "json").stdout)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_containerd_node_runs_a_pod_a_podshimd_node_reaches_and_both_resolve_a_service_by_name() -> None:
    with harness.cluster(nodes=2, name=f"t{os.getpid()}", runtime=["podshimd", "containerd"]) as c:
        nodes = {n["metadata"]["name"]: n for n in json.loads(c.kubectl("get", "nodes", "-o", "json").stdout)["items"]}
        assert nodes["node1"]["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("podshim://")
        assert nodes["node2"]["status"]["nodeInfo"]["containerRuntimeVersion"] == \
            f"containerd://{containerd_version().removeprefix('v')}"
        on_containerd = run_pod(c, "on-containerd", "node2")
        on_podshimd = run_pod(c, "on-podshimd", "node1")
        assert c.kubectl("exec", "on-containerd", "--", "cat", "/www/index.html").stdout.strip() == "on-containerd"
        assert "hello from on-containerd" in c.kubectl("logs", "on-containerd").stdout
        # containerd's runc shim runs the pod, on node2 only (comm is cut at 15 characters).
        assert "containerd-shim" in c.node_processes(2).values()
        assert "containerd-shim" not in c.node_processes(1).values()
        assert harness.http_get(c, "on-podshimd", on_containerd["status"]["podIP"], 8080) == "on-containerd"
        assert harness.http_get(c, "on-containerd", on_podshimd["status"]["podIP"], 8080) == "on-podshimd"
        # Cluster DNS: a Service's name, short and whole, resolves to its cluster IP from either node.
        c.kubectl("expose", "pod", "on-podshimd", "--name=web", "--port=80", "--target-port=8080")
        ip = json.loads(c.kubectl("get", "service", "web", "-o", "json").stdout)["spec"]["clusterIP"]
        for pod in ("on-podshimd", "on-containerd"):
            said = c.kubectl("exec", pod, "--", "nslookup", "web.default.svc.cluster.local.", timeout=30).stdout
            assert f"Name:\tweb.default.svc.cluster.local\nAddress: {ip}\n" in said, (pod, said)
            # By its short name, through the pod's search list, and its Service to the pod.
            assert harness.http_get(c, pod, "web", 80) == "on-podshimd"
            resolv = c.kubectl("exec", pod, "--", "cat", "/etc/resolv.conf").stdout
            assert f"nameserver {harness.DNS_SERVICE_IP}" in resolv, resolv
        directory, cgroups = c.state.dir, list(c.state.data["cgroup"]["paths"].values())
    assert not os.path.exists(directory)
    assert not [path for path in cgroups if os.path.exists(path)]
