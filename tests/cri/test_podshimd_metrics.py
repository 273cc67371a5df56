"""podshimd's ListMetricDescriptors, ListPodSandboxMetrics and StreamPodSandboxMetrics (``crictl
metricdescs``, ``crictl metricsp``): cadvisor's metric names, with the values of a running busybox
container's cgroup files, its /proc, its writable layer and its pod's network namespace."""

from __future__ import annotations

import json
import os

import pytest

from shim.cri.api import api_pb2

from client.cri import podmetrics

from support.podtools import cgroup_file, container_config, pod_config

#: Bound on a gRPC call in these tests.
CALL_TIMEOUT = 60
#: What the container is limited to.
MEMORY_LIMIT = 64 << 20
CPU_PERIOD, CPU_QUOTA, CPU_SHARES = 100000, 20000, 512
#: The metrics critest 1.37 requires a runtime to describe and report for a pod with a running
#: container (its pod.go: expected names less the unimplemented and the block IO ones).
CRITEST_REQUIRED = {
    "container_cpu_cfs_periods_total", "container_cpu_cfs_throttled_periods_total",
    "container_cpu_cfs_throttled_seconds_total", "container_cpu_system_seconds_total",
    "container_cpu_usage_seconds_total", "container_cpu_user_seconds_total", "container_file_descriptors",
    "container_fs_inodes_free", "container_fs_inodes_total", "container_fs_limit_bytes", "container_fs_usage_bytes",
    "container_last_seen", "container_memory_cache", "container_memory_failcnt", "container_memory_failures_total",
    "container_memory_kernel_usage", "container_memory_mapped_file", "container_memory_max_usage_bytes",
    "container_memory_rss", "container_memory_swap", "container_memory_usage_bytes",
    "container_memory_working_set_bytes", "container_oom_events_total", "container_processes", "container_sockets",
    "container_spec_cpu_period", "container_spec_cpu_shares", "container_spec_memory_limit_bytes",
    "container_spec_memory_swap_limit_bytes", "container_start_time_seconds", "container_threads",
    "container_threads_max",
}
NETWORK = {"container_network_receive_bytes_total", "container_network_receive_packets_total",
           "container_network_receive_packets_dropped_total", "container_network_receive_errors_total",
           "container_network_transmit_bytes_total", "container_network_transmit_packets_total",
           "container_network_transmit_packets_dropped_total", "container_network_transmit_errors_total"}
#: What critest requires described, whose values it leaves optional.
BLOCK_IO = {"container_blkio_device_usage_total", "container_fs_reads_bytes_total", "container_fs_reads_total",
            "container_fs_writes_bytes_total", "container_fs_writes_total"}


@pytest.fixture
def pod(daemon, crictl, tmp_path):
    """A ready pod: its id, the path of its config, and its config."""
    config = pod_config()
    path = tmp_path / "pod.json"
    path.write_text(json.dumps(config))
    return daemon.crictl(crictl, "runp", str(path)).stdout.strip(), str(path), config


def limited_busybox(daemon, crictl, pod) -> str:
    """A running busybox ``sleep`` under a memory, swap and CPU limit; its id."""
    config = container_config(["sleep", "600"], name="limited")
    config["linux"]["resources"] = {"cpu_period": CPU_PERIOD, "cpu_quota": CPU_QUOTA, "cpu_shares": CPU_SHARES,
                                    "memory_limit_in_bytes": MEMORY_LIMIT,
                                    "memory_swap_limit_in_bytes": MEMORY_LIMIT}
    container_id = daemon.create_container(pod[0], config, pod[1])
    daemon.crictl(crictl, "start", container_id)
    return container_id


def by_name(metrics: list[dict]) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for metric in metrics:
        found.setdefault(metric["name"], []).append(metric)
    return found


def value(metric: dict) -> int:
    return int(metric["value"]["value"])


def read_int(path: str) -> int:
    with open(path) as f:
        return int(f.read())


def keyed(path: str) -> dict[str, int]:
    with open(path) as f:
        return {k: int(v) for k, v in (line.split() for line in f)}


def test_crictl_metricdescs_lists_cadvisors_metrics_with_help_and_label_keys(daemon, crictl) -> None:
    descs = json.loads(daemon.crictl(crictl, "metricdescs", "-o", "json").stdout)["descriptors"]
    names = [d["name"] for d in descs]
    assert len(names) == len(set(names))
    assert CRITEST_REQUIRED | NETWORK | BLOCK_IO <= set(names)
    for desc in descs:
        assert desc["help"] and desc["labelKeys"][:5] == ["pod", "namespace", "container", "id", "image"]
    keys = {d["name"]: d["labelKeys"][5:] for d in descs}
    assert keys["container_network_receive_bytes_total"] == ["interface"]
    assert keys["container_fs_usage_bytes"] == ["device"]
    assert keys["container_memory_failures_total"] == ["failure_type", "scope"]
    assert keys["container_blkio_device_usage_total"] == ["device", "major", "minor", "operation"]


def test_crictl_metricsp_reports_a_running_busybox_as_its_cgroup_files_say(daemon, crictl, pod) -> None:
    container_id = limited_busybox(daemon, crictl, pod)
    inspect = json.loads(daemon.crictl(crictl, "inspect", container_id).stdout)
    pid, image = inspect["info"]["pid"], inspect["status"]["image"]["image"]
    before = read_int(cgroup_file(pid, "cpuacct", "cpuacct.usage"))
    out = json.loads(daemon.crictl(crictl, "metricsp", "-o", "json").stdout)
    after = read_int(cgroup_file(pid, "cpuacct", "cpuacct.usage"))
    [pod_metrics] = [p for p in out["podMetrics"] if p["podSandboxId"] == pod[0]]
    [container] = pod_metrics["containerMetrics"]
    assert container["containerId"] == container_id
    metrics = by_name(container["metrics"])
    assert CRITEST_REQUIRED <= set(metrics) | NETWORK
    meta = pod[2]["metadata"]
    descs = {d.name: list(d.label_keys) for d in daemon.runtime().ListMetricDescriptors(
        api_pb2.ListMetricDescriptorsRequest(), timeout=CALL_TIMEOUT).descriptors}
    for name, found in metrics.items():
        for metric in found:
            assert metric["labelValues"][:5] == [meta["name"], meta["namespace"], "limited", container_id, image]
            assert len(metric["labelValues"]) == len(descs[name]), name
    one = {name: value(found[0]) for name, found in metrics.items()}
    # The limits in force, as the cgroup files say.
    assert one["container_spec_memory_limit_bytes"] == MEMORY_LIMIT == read_int(
        cgroup_file(pid, "memory", "memory.limit_in_bytes"))
    assert one["container_spec_cpu_period"] == CPU_PERIOD and one["container_spec_cpu_quota"] == CPU_QUOTA
    assert one["container_spec_cpu_shares"] == CPU_SHARES == read_int(cgroup_file(pid, "cpu", "cpu.shares"))
    if os.path.exists(cgroup_file(pid, "memory", "memory.memsw.limit_in_bytes")):
        assert one["container_spec_memory_swap_limit_bytes"] == 0  # memory+swap = memory: no swap
    with open(cgroup_file(pid, "pids", "pids.max")) as f:
        pids_max = f.read().strip()
    assert one["container_threads_max"] == (0 if pids_max == "max" else int(pids_max))  # 0: unlimited
    # Usage, read around the call.
    assert before // 10**9 <= one["container_cpu_usage_seconds_total"] <= after // 10**9
    assert one["container_processes"] == 1 and one["container_threads"] == 1
    assert one["container_file_descriptors"] == len(os.listdir(f"/proc/{pid}/fd"))
    assert one["container_oom_events_total"] == keyed(cgroup_file(pid, "memory", "memory.oom_control"))["oom_kill"]
    assert 0 < one["container_memory_usage_bytes"] <= one["container_memory_max_usage_bytes"]
    stat = keyed(cgroup_file(pid, "memory", "memory.stat"))
    assert one["container_memory_mapped_file"] == stat["total_mapped_file"]  # a sleeping busybox maps nothing new
    faults = {tuple(m["labelValues"][5:]): value(m) for m in metrics["container_memory_failures_total"]}
    assert set(faults) == {("pgfault", "hierarchy"), ("pgmajfault", "hierarchy")}
    assert faults[("pgmajfault", "hierarchy")] <= stat["total_pgmajfault"]
    status = daemon.runtime().ContainerStatus(api_pb2.ContainerStatusRequest(container_id=container_id),
                                              timeout=CALL_TIMEOUT).status
    assert one["container_start_time_seconds"] == status.started_at // 10**9 <= one["container_last_seen"]
    # The writable layer, on the filesystem statvfs describes.
    [usage] = metrics["container_fs_usage_bytes"]
    assert usage["labelValues"][5]  # the device
    assert one["container_fs_inodes_total"] > 0 and one["container_fs_limit_bytes"] > 0
    # The pod: its cgroup (the pause and the container) and its interfaces but loopback.
    pod_one = by_name(pod_metrics["metrics"])
    assert {m["labelValues"][2] for found in pod_one.values() for m in found} == {""}
    assert value(pod_one["container_processes"][0]) == 2
    interfaces = {m["labelValues"][5] for m in pod_one.get("container_network_receive_bytes_total", [])}
    assert "lo" not in interfaces


def test_a_figure_the_host_does_not_keep_is_left_out_not_zero() -> None:
    data = {"cpu_usage_ns": 3 * 10**9, "memory_usage_bytes": None, "details": {"memory_failcnt": None, "threads": 4}}
    doc = podmetrics.container_metrics({"name": "p", "namespace": "n"}, "c1", "c", "busybox", 0, 10**18, data, None)
    names = {m["name"]: m["value"]["value"] for m in doc["metrics"]}
    assert names == {"container_cpu_usage_seconds_total": 3, "container_threads": 4, "container_last_seen": 10**9}


def test_stream_pod_sandbox_metrics_answers_as_list(daemon, crictl, pod) -> None:
    limited_busybox(daemon, crictl, pod)
    runtime = daemon.runtime()
    listed = runtime.ListPodSandboxMetrics(api_pb2.ListPodSandboxMetricsRequest(), timeout=CALL_TIMEOUT).pod_metrics
    streamed = [m for reply in runtime.StreamPodSandboxMetrics(api_pb2.StreamPodSandboxMetricsRequest(),
                                                               timeout=CALL_TIMEOUT)
                for m in reply.pod_sandbox_metrics]

    def shape(pods):
        return [(p.pod_sandbox_id, sorted((m.name, tuple(m.label_values)) for m in p.metrics),
                 [(c.container_id, sorted((m.name, tuple(m.label_values)) for m in c.metrics))
                  for c in p.container_metrics]) for p in pods]

    assert shape(streamed) == shape(listed) and [p.pod_sandbox_id for p in listed] == [pod[0]]


def test_pressure_is_psi_some_as_waiting_and_full_as_stalled_in_whole_seconds() -> None:
    data = {"cpu_pressure": {"some": {"avg10": 0.0, "avg60": 0.0, "avg300": 0.0, "total_us": 2_500_000}},
            "io_pressure": {"some": {"avg10": 0.0, "avg60": 0.0, "avg300": 0.0, "total_us": 7},
                            "full": {"avg10": 0.0, "avg60": 0.0, "avg300": 0.0, "total_us": 3_000_000}}}
    doc = podmetrics.pod_metrics("p1", {"name": "p", "namespace": "n"}, 10**18, data, [])
    names = {m["name"]: m["value"]["value"] for m in doc["metrics"] if "pressure" in m["name"]}
    assert names == {"container_pressure_cpu_waiting_seconds_total": 2, "container_pressure_io_waiting_seconds_total": 0,
                     "container_pressure_io_stalled_seconds_total": 3}
    assert all(m["label_values"] == ["p", "n", "", "p1", ""] for m in doc["metrics"])


def test_block_io_is_per_device_and_operation() -> None:
    data = {"details": {"block_io": {"0:0": {"read_bytes": 4096, "write_bytes": 512, "reads": 2, "writes": 1}}}}
    doc = podmetrics.pod_metrics("p1", {"name": "p", "namespace": "n"}, 10**18, data, [])
    found = {(m["name"], tuple(m["label_values"][5:])): m["value"]["value"] for m in doc["metrics"]
             if m["name"].startswith(("container_fs", "container_blkio"))}
    assert found == {("container_fs_reads_bytes_total", ("0:0",)): 4096, ("container_fs_reads_total", ("0:0",)): 2,
                     ("container_fs_writes_bytes_total", ("0:0",)): 512, ("container_fs_writes_total", ("0:0",)): 1,
                     ("container_blkio_device_usage_total", ("0:0", "0", "0", "Read")): 4096,
                     ("container_blkio_device_usage_total", ("0:0", "0", "0", "Write")): 512}
