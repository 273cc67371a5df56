"""The pod layer's operations on running pods: stats shaped as CRI's (figures left out, never
invented), LinuxContainerResources as the shim's Update keys, the container event feed, log lines
that name their pod; and exec, stats, update and log reopening through a real shim."""

from __future__ import annotations

import json
import logging
import os
from contextlib import AsyncExitStack

import anyio
import pytest

from shim.api.topics import TOPIC_EXIT, TOPIC_TASK_EXIT
from shim.cri.resources import shim_resources
from shim.rpc.status import DeadlineExceeded, FailedPrecondition, InvalidArgument, ResourceExhausted

from client.cri import stats
from client.cri.events import CONTAINER_CREATED, CONTAINER_STOPPED, EVENT_QUEUE_LIMIT, EventFeed
from client.cri.logcontext import IdsFilter, about, current

from support.podtools import node_container, pod_config, pod_service

# -- stats ---------------------------------------------------------------------------------------------

FIGURES = {"cpu_usage_ns": 5_000_000, "memory_usage_bytes": 300, "memory_working_set_bytes": 200,
           "memory_rss_bytes": 100, "memory_page_faults": 7, "memory_major_page_faults": 1,
           "memory_limit_bytes": 1000, "pids_current": 2, "unavailable": []}


def test_figures_become_cri_values_and_available_is_the_limit_less_the_working_set() -> None:
    memory = stats.memory_usage(42, FIGURES)
    assert memory == {"timestamp": 42, "working_set_bytes": {"value": 200}, "available_bytes": {"value": 800},
                      "usage_bytes": {"value": 300}, "rss_bytes": {"value": 100}, "page_faults": {"value": 7},
                      "major_page_faults": {"value": 1}}
    assert stats.process_usage(42, FIGURES) == {"timestamp": 42, "process_count": {"value": 2}}


def test_a_figure_the_shim_could_not_read_is_left_out_not_zero():
    data = {**FIGURES, "memory_rss_bytes": None, "memory_limit_bytes": None, "pids_current": None,
            "unavailable": ["memory_rss_bytes", "memory_limit_bytes", "pids_current"]}
    memory = stats.memory_usage(42, data)
    assert "rss_bytes" not in memory and "available_bytes" not in memory
    assert stats.process_usage(42, data) is None
    nothing = dict.fromkeys(FIGURES)
    assert stats.memory_usage(42, nothing) is None and stats.cpu_usage("c", 42, nothing, stats.CpuRates()) is None


PRESSURE = {"some": {"avg10": 1.5, "avg60": 0.25, "avg300": 0.0, "total_us": 1234},
            "full": {"avg10": 0.5, "avg60": 0.0, "avg300": 0.0, "total_us": 56}}


def test_pressure_becomes_cris_psi_with_its_total_in_nanoseconds():
    data = {**FIGURES, "cpu_pressure": {"some": PRESSURE["some"]}, "memory_pressure": PRESSURE,
            "io_pressure": PRESSURE}
    assert stats.cpu_usage("p", 42, data, stats.CpuRates())["psi"] == {
        "Some": {"Total": 1_234_000, "Avg10": 1.5, "Avg60": 0.25, "Avg300": 0.0}}
    psi = {"Some": {"Total": 1_234_000, "Avg10": 1.5, "Avg60": 0.25, "Avg300": 0.0},
           "Full": {"Total": 56_000, "Avg10": 0.5, "Avg60": 0.0, "Avg300": 0.0}}
    assert stats.memory_usage(42, data)["psi"] == psi
    assert stats.io_usage(42, data) == {"timestamp": 42, "psi": psi}
    assert "psi" not in stats.memory_usage(42, FIGURES) and stats.io_usage(42, FIGURES) is None


def test_swap_available_is_the_swap_limit_less_the_swap_in_use() -> None:
    assert stats.swap_usage(42, {"memory_swap_bytes": 30, "memory_swap_limit_bytes": 100}) == {
        "timestamp": 42, "swap_usage_bytes": {"value": 30}, "swap_available_bytes": {"value": 70}}
    assert stats.swap_usage(42, {"memory_swap_bytes": 30, "memory_swap_limit_bytes": None}) == {
        "timestamp": 42, "swap_usage_bytes": {"value": 30}}
    assert stats.swap_usage(42, {"memory_swap_bytes": None}) is None


def counters(rx: int, tx: int) -> dict[str, int]:
    return {"rx_bytes": rx, "rx_packets": 1, "rx_errors": 0, "rx_dropped": 0,
            "tx_bytes": tx, "tx_packets": 1, "tx_errors": 2, "tx_dropped": 0}


def test_a_pods_network_is_each_interface_eth0_its_default_else_the_first() -> None:
    usage = stats.network_usage(42, {"network": {"net1": counters(5, 6), "eth0": counters(10, 20)}})
    eth0 = {"name": "eth0", "rx_bytes": {"value": 10}, "rx_errors": {"value": 0}, "tx_bytes": {"value": 20},
            "tx_errors": {"value": 2}}
    assert usage == {"timestamp": 42, "default_interface": eth0, "interfaces": [
        eth0, {"name": "net1", "rx_bytes": {"value": 5}, "rx_errors": {"value": 0}, "tx_bytes": {"value": 6},
               "tx_errors": {"value": 2}}]}
    without_eth0 = stats.network_usage(42, {"network": {"veth9": counters(1, 2), "net1": counters(5, 6)}})
    assert without_eth0 is not None and without_eth0["default_interface"]["name"] == "net1"
    # The host's network (the shim reads none), or no interface but loopback: no figure, not zeros.
    assert stats.network_usage(42, FIGURES) is None and stats.network_usage(42, {"network": {}}) is None


def test_the_cpu_rate_needs_a_previous_sample_of_the_same_container():
    rates = stats.CpuRates()
    first = stats.cpu_usage("c", 1_000_000_000, {"cpu_usage_ns": 100}, rates)
    assert first == {"timestamp": 1_000_000_000, "usage_core_nano_seconds": {"value": 100}}
    second = stats.cpu_usage("c", 3_000_000_000, {"cpu_usage_ns": 1_000_000_100}, rates)
    assert second["usage_nano_cores"] == {"value": 500_000_000}  # half a core over two seconds
    assert "usage_nano_cores" not in stats.cpu_usage("other", 3_000_000_000, {"cpu_usage_ns": 5}, rates)
    # A counter that went back (a new cgroup under the same id) gives no rate rather than a wrong one.
    assert "usage_nano_cores" not in stats.cpu_usage("c", 4_000_000_000, {"cpu_usage_ns": 10}, rates)


# -- resources -----------------------------------------------------------------------------------------

def test_cri_resources_become_the_shims_keys_and_zero_values_mean_unset() -> None:
    doc = {"cpu_period": "100000", "cpu_quota": 50000, "cpu_shares": 0, "memory_limit_in_bytes": "134217728",
           "oom_score_adj": 0, "cpuset_cpus": "0", "cpuset_mems": "", "memory_swap_limit_in_bytes": 0,
           "hugepage_limits": [{"page_size": "2MB", "limit": "2097152"}], "unified": {}}
    assert shim_resources(doc) == {"cpu_period_us": 100000, "cpu_quota_us": 50000,
                                   "memory_limit_bytes": 134217728, "cpuset_cpus": "0",
                                   "hugepage_limits": {"2MB": 2097152}}
    assert shim_resources(None) == {} and shim_resources({}) == {}


@pytest.mark.parametrize("doc,message", [
    ({"cpu_shares": "many"}, "linux.cpu_shares must be an integer, got 'many'"),
    ({"cpuset_cpus": 3}, "linux.cpuset_cpus must be a string"),
    ({"blkio_weight": 10}, "linux.blkio_weight is not a field of CRI's LinuxContainerResources"),
    ({"hugepage_limits": [{"limit": 1}]}, r"linux.hugepage_limits\[0\] must be an object with a page_size"),
])
def test_a_field_that_is_not_crs_or_of_the_wrong_type_is_refused_by_name(doc, message) -> None:
    with pytest.raises(InvalidArgument, match=message):
        shim_resources(doc)


# -- log lines -----------------------------------------------------------------------------------------

def test_lines_logged_about_a_pod_carry_its_ids_even_from_tasks_started_inside() -> None:
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Keep()
    handler.addFilter(IdsFilter())
    logger = logging.getLogger("test.logcontext")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        async def main():
            async with about("pod1"):
                with about(container_id="ctr1"):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(lambda: _log(logger, "inside"))
                logger.warning("pod only")
            logger.warning("nothing")
            assert current() == ("", "")

        anyio.run(main)
        logger.warning("named", extra={"pod_id": "pod2"})
    finally:
        logger.removeHandler(handler)
    assert [(r.getMessage(), r.ids) for r in records] == [
        ("inside", " pod_id=pod1 container_id=ctr1"), ("pod only", " pod_id=pod1"), ("nothing", ""),
        ("named", " pod_id=pod2")]


async def _log(logger: logging.Logger, message: str) -> None:
    logger.warning(message)


# -- the event feed ------------------------------------------------------------------------------------

async def test_every_subscriber_gets_every_event_published_after_it_subscribed() -> None:
    feed = EventFeed()
    feed.publish(CONTAINER_CREATED, "early", "pod")
    async with feed.subscribe() as first, feed.subscribe() as second:
        feed.publish(CONTAINER_CREATED, "c1", "pod")
        feed.publish(CONTAINER_STOPPED, "pod", "pod", created_at=7)
        for events in (first, second):
            got = [await events.__anext__(), await events.__anext__()]
            assert [(e.container_id, e.kind) for e in got] == [("c1", CONTAINER_CREATED), ("pod", CONTAINER_STOPPED)]
            assert got[1].created_at == 7 and got[1].about_pod


async def test_a_subscriber_that_falls_behind_is_dropped_with_resource_exhausted() -> None:
    feed = EventFeed()
    async with feed.subscribe() as events:
        for i in range(EVENT_QUEUE_LIMIT + 1):
            feed.publish(CONTAINER_CREATED, f"c{i}", "pod")
        drained = 0
        with pytest.raises(ResourceExhausted, match="fell 1024 events behind"):
            async for _ in events:
                drained += 1
        assert drained == EVENT_QUEUE_LIMIT


async def test_a_shim_exit_goes_out_as_stopped_and_its_other_events_do_not() -> None:
    feed = EventFeed()
    async with feed.subscribe() as events:
        feed.shim_event("pod", {"topic": "/sandbox/create", "event": {}})
        feed.shim_event("pod", {"topic": TOPIC_TASK_EXIT, "event": {"task_id": "c1", "exit_status": 3}})
        feed.shim_event("pod", {"topic": TOPIC_EXIT, "event": {}})
        got = [await events.__anext__(), await events.__anext__()]
        assert [(e.container_id, e.pod_id, e.kind) for e in got] == [("c1", "pod", CONTAINER_STOPPED),
                                                                    ("pod", "pod", CONTAINER_STOPPED)]


# -- through a real shim -------------------------------------------------------------------------------

async def run_container(pods, command: list[str]) -> tuple[str, str]:
    pod_id = await pods.run_pod_sandbox(pod_config())
    container_id = await pods.create_container(pod_id, node_container(command))
    await pods.start_container(container_id)
    return pod_id, container_id


async def test_exec_sync_through_the_pod_layer(roots) -> None:
    async with pod_service(roots) as pods:
        _, container_id = await run_container(pods, ["sleep", "600"])
        result = await pods.exec_sync(container_id, ["sh", "-c", "echo $PATH; pwd; echo oops >&2; exit 4"])
        assert result == {"exit_code": 4, "stdout": b"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n/\n",
                          "stderr": b"oops\n"}
        with pytest.raises(DeadlineExceeded, match="command 'sleep 30' timed out after 1 s and was killed"):
            await pods.exec_sync(container_id, ["sleep", "30"], timeout=1)
        with pytest.raises(InvalidArgument, match="cmd must be a non-empty array of strings"):
            await pods.exec_sync(container_id, [])


async def test_stats_update_and_reopen_through_the_pod_layer(roots, tmp_path) -> None:
    async with pod_service(roots) as pods:
        pod_id, container_id = await run_container(pods, ["sleep", "600"])
        found = await pods.container_stats(container_id)
        assert found["attributes"]["id"] == container_id and found["memory"]["usage_bytes"]["value"] > 0
        assert found["cpu"]["usage_core_nano_seconds"]["value"] > 0
        pod = await pods.pod_stats(pod_id)
        assert [c["attributes"]["id"] for c in pod["linux"]["containers"]] == [container_id]
        assert pod["linux"]["process"]["process_count"]["value"] >= 2
        await pods.update_container_resources(container_id, {"cpu_shares": "512"})
        pid = (await pods.container_status(container_id, verbose=True))["info"]["pid"]
        with open(f"/proc/{pid}/cgroup") as f:
            cpu = next(line.split(":", 2)[2].strip() for line in f if ":cpu," in line or ":cpu:" in line)
        with open(os.path.join("/sys/fs/cgroup/cpu", cpu.lstrip("/"), "cpu.shares")) as f:
            assert f.read().strip() == "512"
        log_path = pods.container_log_path(container_id)
        os.rename(log_path, log_path + ".1")
        await pods.reopen_container_log(container_id)
        assert os.path.isfile(log_path)
        await pods.stop_container(container_id, timeout=0)
        with pytest.raises(FailedPrecondition, match="is not running"):
            await pods.reopen_container_log(container_id)
        assert [s["attributes"]["id"] for s in await pods.list_container_stats()] == []


async def test_events_through_the_pod_layer_see_a_container_exit(roots) -> None:
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        async with pods.events() as events:
            container_id = await pods.create_container(pod_id, node_container(["sh", "-c", "exit 2"]))
            await pods.start_container(container_id)
            kinds = []
            async for event in events:
                kinds.append(event.kind)
                if event.kind == CONTAINER_STOPPED:
                    break
        assert kinds == ["CONTAINER_CREATED_EVENT", "CONTAINER_STARTED_EVENT", "CONTAINER_STOPPED_EVENT"]


async def test_every_event_subscriber_is_served_from_one_stream_per_shim(roots) -> None:
    """Subscribers cost the shim nothing: 50 of them add no connection to it, and each sees the exit."""
    def shim_sockets(pid: int) -> int:
        fds = os.listdir(f"/proc/{pid}/fd")
        return sum(1 for fd in fds if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"))

    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        shim = int((await pods.pod_sandbox_status(pod_id, verbose=True))["info"]["shim"]["shim_pid"])
        before = shim_sockets(shim)
        async with AsyncExitStack() as stack:
            streams = [await stack.enter_async_context(pods.events()) for _ in range(50)]
            assert shim_sockets(shim) == before
            container_id = await pods.create_container(pod_id, node_container(["sh", "-c", "exit 2"]))
            await pods.start_container(container_id)
            for events in streams:
                with anyio.fail_after(30):
                    async for event in events:
                        if event.kind == CONTAINER_STOPPED:
                            assert event.container_id == container_id
                            break


async def test_update_runtime_config_keeps_the_pod_cidr_across_reopening(roots) -> None:
    async with pod_service(roots) as pods:
        assert pods.pod_cidr == ""
        pods.update_runtime_config("10.244.1.0/24, fd00:10:244:1::/64")
        with pytest.raises(InvalidArgument, match="'10.244.1.0/40' is not a network"):
            pods.update_runtime_config("10.244.1.0/40")
    async with pod_service(roots) as pods:
        assert pods.pod_cidr == "10.244.1.0/24,fd00:10:244:1::/64"
    with open(os.path.join(roots[0], "runtime-config.json")) as f:
        assert json.load(f) == {"pod_cidr": "10.244.1.0/24,fd00:10:244:1::/64"}
