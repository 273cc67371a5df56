"""Pod starts take turns (``max_parallel_pod_starts``): at most that many RunPodSandbox calls are
carried out at once, the others wait in the order they came; a call cancelled while it waits
starts nothing; a change whose caller went away keeps its turn until it has ended. First the
turns themselves (client.podshimd.handlers.Changes), then through podshimd, with a CNI plugin
that holds every ADD until the test lets it go."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest
from google.protobuf import json_format

from shim.cri.api import api_pb2

from client.podshimd.config import DEFAULT_PARALLEL_POD_STARTS, ConfigError, load
from client.podshimd.handlers import Changes

from support.critools import Podshimd, running_podshimd, scrape_metrics
from support.kubetools import wait_until
from support.podtools import pod_config

# -- the turns ---------------------------------------------------------------------------------------


class Gate:
    """Changes that record when they start and end only when the test opens their gate."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.gates: dict[str, asyncio.Event] = {}

    async def change(self, name: str) -> str:
        self.started.append(name)
        await self.gates.setdefault(name, asyncio.Event()).wait()
        return name

    def open(self, name: str) -> None:
        self.gates.setdefault(name, asyncio.Event()).set()


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def test_pod_starts_beyond_the_limit_wait_and_go_in_the_order_they_came() -> None:
    changes, gate = Changes(2), Gate()
    calls = [asyncio.ensure_future(changes.finish(gate.change(name), pod_start=True)) for name in "abcd"]
    await settle()
    assert gate.started == ["a", "b"] and (changes.starts_running, changes.starts_waiting) == (2, 2)
    gate.open("b")
    await settle()
    assert gate.started == ["a", "b", "c"] and (changes.starts_running, changes.starts_waiting) == (2, 1)
    for name in "acd":
        gate.open(name)
    assert await asyncio.gather(*calls) == list("abcd")
    assert (changes.starts_running, changes.starts_waiting) == (0, 0)


async def test_a_start_cancelled_while_it_waits_starts_nothing_and_takes_no_turn() -> None:
    changes, gate = Changes(1), Gate()
    first = asyncio.ensure_future(changes.finish(gate.change("a"), pod_start=True))
    second = asyncio.ensure_future(changes.finish(gate.change("b"), pod_start=True))
    await settle()
    second.cancel()  # its client went away while it waited (pytest turns "never awaited" into an error)
    await settle()
    assert second.cancelled() and changes.starts_waiting == 0
    gate.open("a")
    assert await first == "a"
    third = asyncio.ensure_future(changes.finish(gate.change("c"), pod_start=True))
    await settle()
    assert gate.started == ["a", "c"]  # b never ran; its turn went to c
    gate.open("c")
    assert await third == "c"


async def test_a_start_whose_caller_went_away_keeps_its_turn_until_it_has_ended() -> None:
    changes, gate = Changes(1), Gate()
    first = asyncio.ensure_future(changes.finish(gate.change("a"), pod_start=True))
    await settle()
    first.cancel()  # the change goes on (it never leaves a half-made pod), and so does its turn
    second = asyncio.ensure_future(changes.finish(gate.change("b"), pod_start=True))
    await settle()
    assert first.cancelled() and gate.started == ["a"] and len(changes) == 1 and changes.starts_running == 1
    gate.open("a")
    await settle()
    assert gate.started == ["a", "b"]
    gate.open("b")
    assert await second == "b"


async def test_other_changes_and_a_limit_of_zero_never_wait() -> None:
    limited, unlimited, gate = Changes(1), Changes(0), Gate()
    calls = [asyncio.ensure_future(limited.finish(gate.change("start"), pod_start=True)),
             *(asyncio.ensure_future(limited.finish(gate.change(f"stop{i}"))) for i in range(3)),
             *(asyncio.ensure_future(unlimited.finish(gate.change(f"start{i}"), pod_start=True)) for i in range(20))]
    await settle()
    assert len(gate.started) == 24 and unlimited.starts_waiting == 0 and unlimited.starts_running == 20
    for name in list(gate.gates):
        gate.open(name)
    await asyncio.gather(*calls)


def test_the_limit_is_a_config_key_with_a_default_and_zero_for_none(tmp_path) -> None:
    assert load(None, default_path=str(tmp_path / "absent.toml")).max_parallel_pod_starts == \
        DEFAULT_PARALLEL_POD_STARTS
    path = tmp_path / "config.toml"
    path.write_text("max_parallel_pod_starts = 0\n")
    assert load(str(path)).max_parallel_pod_starts == 0
    for bad in ("-1", "true", '"4"', "2.5"):
        path.write_text(f"max_parallel_pod_starts = {bad}\n")
        with pytest.raises(ConfigError, match="max_parallel_pod_starts: must be a whole number of pod starts, 0 "
                                              "for no limit"):
            load(str(path))


# -- through podshimd ----------------------------------------------------------------------------------

# A CNI plugin whose ADD waits for the file "open" beside its log, then gives the pod an address.
GATE_PLUGIN = """#!/bin/sh
cat > /dev/null
[ "$CNI_COMMAND" = ADD ] || exit 0
echo "$CNI_CONTAINERID" >> "{log}/adds"
while [ ! -e "{log}/open" ]; do sleep 0.05; done
printf '{{"cniVersion": "1.0.0", "ips": [{{"address": "10.1.0.5/24"}}]}}'
"""
WAIT = 30.0


@contextmanager
def gated_podshimd(limit: int) -> Iterator[tuple[Podshimd, str]]:
    """podshimd with ``max_parallel_pod_starts = limit``, its metrics on, and the gate as its CNI
    network; the directory of the gate's log."""
    directory = tempfile.mkdtemp(prefix="psd-turns-")
    try:
        gate = os.path.join(directory, "gate")
        os.makedirs(os.path.join(gate, "bin"))
        plugin = os.path.join(gate, "bin", "gate")
        with open(plugin, "w") as f:
            f.write(GATE_PLUGIN.format(log=gate))
        os.chmod(plugin, 0o755)
        os.makedirs(os.path.join(directory, "net.d"))
        with open(os.path.join(directory, "net.d", "10-gate.conflist"), "w") as f:
            json.dump({"cniVersion": "1.0.0", "name": "gate", "plugins": [{"type": "gate"}]}, f)
        config = (f'max_parallel_pod_starts = {limit}\nmetrics_address = "127.0.0.1:0"\n'
                  f'cni_bin_dirs = [{json.dumps(os.path.join(gate, "bin"))}, "/usr/lib/cni"]\n')
        with running_podshimd(directory, config=config) as daemon:
            try:
                yield daemon, gate
            finally:
                open(os.path.join(gate, "open"), "w").close()
                runtime = daemon.runtime()
                for pod in runtime.ListPodSandbox(api_pb2.ListPodSandboxRequest()).items:
                    runtime.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=pod.id))
                    runtime.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=pod.id))
    finally:
        shutil.rmtree(directory)


def adds(gate: str) -> int:
    try:
        with open(os.path.join(gate, "adds")) as f:
            return len(f.read().split())
    except FileNotFoundError:
        return 0


def starts(daemon: Podshimd) -> tuple[float, float]:
    """podshimd_pod_starts: (running, waiting)."""
    found = scrape_metrics(daemon)
    return found['podshimd_pod_starts{state="running"}'], found['podshimd_pod_starts{state="waiting"}']


def runp(daemon: Podshimd, name: str, timeout: float = 120) -> grpc.Future:
    request = api_pb2.RunPodSandboxRequest()
    json_format.ParseDict({"config": pod_config(name)}, request)
    return daemon.runtime().RunPodSandbox.future(request, timeout=timeout)


def test_runp_beyond_the_limit_waits_for_a_turn_and_the_metrics_say_so() -> None:
    with gated_podshimd(1) as (daemon, gate):
        first = runp(daemon, "first")
        wait_until("the first pod's CNI ADD", lambda: adds(gate), lambda n: n == 1, WAIT, 0.05)
        second = runp(daemon, "second")
        wait_until("the second RunPodSandbox waiting", lambda: starts(daemon), lambda s: s == (1, 1), WAIT, 0.05)
        assert adds(gate) == 1 and not second.done()  # its network is not being made: it has not started
        open(os.path.join(gate, "open"), "w").close()
        ids = [first.result(timeout=WAIT).pod_sandbox_id, second.result(timeout=WAIT).pod_sandbox_id]
        assert adds(gate) == 2 and starts(daemon) == (0, 0)
        listed = daemon.runtime().ListPodSandbox(api_pb2.ListPodSandboxRequest()).items
        assert sorted(p.id for p in listed if p.state == api_pb2.SANDBOX_READY) == sorted(ids)


def test_a_runp_whose_client_gives_up_while_it_waits_makes_no_pod() -> None:
    with gated_podshimd(1) as (daemon, gate):
        first = runp(daemon, "first")
        wait_until("the first pod's CNI ADD", lambda: adds(gate), lambda n: n == 1, WAIT, 0.05)
        late = runp(daemon, "late", timeout=1.0)
        with pytest.raises(grpc.RpcError) as caught:
            late.result(timeout=WAIT)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        wait_until("no RunPodSandbox waiting", lambda: starts(daemon), lambda s: s == (1, 0), WAIT, 0.05)
        open(os.path.join(gate, "open"), "w").close()
        first_id = first.result(timeout=WAIT).pod_sandbox_id
        assert adds(gate) == 1  # the late pod's network was never made
        assert [p.id for p in daemon.runtime().ListPodSandbox(api_pb2.ListPodSandboxRequest()).items] == [first_id]
        assert daemon.pod_records() == [f"{first_id}.json"] and len(daemon.sandbox_bundles()) == 1
