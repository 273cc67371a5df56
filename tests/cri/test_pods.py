"""Pods with CRI semantics, step by step like containerd's RunPodSandbox / Stop / Remove flows."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import subprocess
import sys
import time

import anyio
import pytest

from shim.rpc.status import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound

from client.cri.pod import PodEntry, open_pod_service

from support.looptools import loop_stalls
from support.podtools import (
    BUSYBOX_MOUNT,
    container_config,
    node_container,
    ns_inode,
    pod_config,
    pod_service,
    shows_notready,
)
from support.proctools import alive, wait_gone_async

# Every test here runs twice: shims exec'd by `podshim start`, and shims forked by a template.
pytestmark = pytest.mark.usefixtures("spawn_mode")


async def test_run_gives_a_ready_pod_whose_pause_is_in_its_namespaces(roots) -> None:
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        assert len(pod_id) == 64
        status = await pods.pod_sandbox_status(pod_id, verbose=True)
        assert status["state"] == "SANDBOX_READY"
        pid = status["info"]["pid"]
        netns = status["info"]["netns_path"]
        assert ns_inode(pid, "net") == os.stat(netns).st_ino != ns_inode(os.getpid(), "net")
        assert status["info"]["shim_address"].startswith("unix://")
        assert "loopback only" in status["info"]["network"]


async def test_container_shares_net_ipc_uts_with_the_pause(roots) -> None:
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        cid = await pods.create_container(pod_id, node_container(["sleep", "30"]))
        await pods.start_container(cid)
        info = (await pods.container_status(cid, verbose=True))["info"]
        pause = (await pods.pod_sandbox_status(pod_id, verbose=True))["info"]["pid"]
        for kind in ("net", "ipc", "uts"):
            assert ns_inode(info["pid"], kind) == ns_inode(pause, kind), kind
        assert ns_inode(info["pid"], "pid") != ns_inode(pause, "pid")  # CONTAINER pid mode


async def test_container_in_pod_pid_mode_shares_the_pause_pid_namespace(roots) -> None:
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        cid = await pods.create_container(pod_id, node_container(["sleep", "30"], pid=0))
        await pods.start_container(cid)
        info = (await pods.container_status(cid, verbose=True))["info"]
        pause = (await pods.pod_sandbox_status(pod_id, verbose=True))["info"]["pid"]
        assert ns_inode(info["pid"], "pid") == ns_inode(pause, "pid")


async def test_container_that_exits_on_its_own_shows_exited_with_its_code(roots) -> None:
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        cid = await pods.create_container(pod_id, node_container(["sh", "-c", "echo hi; exit 3"]))
        await pods.start_container(cid)
        deadline = time.monotonic() + 10
        while (status := await pods.container_status(cid))["state"] != "CONTAINER_EXITED":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)  # the shim records the exit it reaps; nothing here to wait on
        assert status["exit_code"] == 3 and status["finished_at"] >= status["started_at"] > 0
        with open(pods.container_log_path(cid)) as f:
            assert f.read().split(" ", 3)[1:] == ["stdout", "F", "hi\n"]


async def test_status_and_listings_answer_from_the_records_while_a_shim_is_frozen(roots) -> None:
    # The shims' exit events keep the records current: nothing asks a shim per request, so a
    # shim that does not answer holds up no status and no listing.
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        cid = await pods.create_container(pod_id, node_container(["sleep", "30"]))
        await pods.start_container(cid)
        shim_pid = int((await pods.pod_sandbox_status(pod_id, verbose=True))["info"]["shim"]["shim_pid"])
        os.kill(shim_pid, signal.SIGSTOP)
        try:
            with anyio.fail_after(10):  # asking the frozen shim would wait out its 30 s call timeout
                assert [(p["id"], p["state"]) for p in await pods.list_pod_sandbox()] == [(pod_id, "SANDBOX_READY")]
                assert (await pods.pod_sandbox_status(pod_id))["state"] == "SANDBOX_READY"
                assert [(c["id"], c["state"]) for c in await pods.list_containers()] == [(cid, "CONTAINER_RUNNING")]
                assert (await pods.container_status(cid))["state"] == "CONTAINER_RUNNING"
        finally:
            os.kill(shim_pid, signal.SIGCONT)


async def test_a_pod_whose_pause_exits_on_its_own_shows_notready_and_can_be_removed(roots) -> None:
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        cid = await pods.create_container(pod_id, node_container(["sleep", "30"]))  # its own pid namespace
        await pods.start_container(cid)
        pause = (await pods.pod_sandbox_status(pod_id, verbose=True))["info"]["pid"]
        sleeper = (await pods.container_status(cid, verbose=True))["info"]["pid"]
        os.kill(pause, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while [p["state"] for p in await pods.list_pod_sandbox()] != ["SANDBOX_NOTREADY"]:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)  # the shim's exit event reaches the record on its own
        assert (await pods.pod_sandbox_status(pod_id))["state"] == "SANDBOX_NOTREADY"
        await pods.remove_pod_sandbox(pod_id)  # its container still ran: it is stopped first
        assert await pods.list_pod_sandbox() == [] and await pods.list_containers() == []
        assert not await wait_gone_async(pause, sleeper)


async def test_stop_container_sends_term_then_kill(roots) -> None:
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        stubborn = await pods.create_container(pod_id, node_container(["sh", "-c", "trap '' TERM; sleep 30"]))
        await pods.start_container(stubborn)
        began = time.monotonic()
        await pods.stop_container(stubborn, timeout=1)
        assert time.monotonic() - began >= 1
        assert (await pods.container_status(stubborn))["exit_code"] == 137


async def test_stop_makes_the_pod_notready_and_stops_its_containers(roots) -> None:
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        cid = await pods.create_container(pod_id, node_container(["sleep", "30"]))
        await pods.start_container(cid)
        pause = (await pods.pod_sandbox_status(pod_id, verbose=True))["info"]["pid"]
        await pods.stop_pod_sandbox(pod_id)
        assert (await pods.pod_sandbox_status(pod_id))["state"] == "SANDBOX_NOTREADY"
        assert (await pods.container_status(cid))["state"] == "CONTAINER_EXITED"
        assert not await wait_gone_async(pause)
        await pods.stop_pod_sandbox(pod_id)  # twice is fine


async def test_remove_leaves_nothing_behind(roots) -> None:
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        cid = await pods.create_container(pod_id, node_container(["sleep", "30"]))
        await pods.start_container(cid)
        info = (await pods.pod_sandbox_status(pod_id, verbose=True))["info"]
        cgroups = [v for k, v in info["shim"].items() if k.startswith("cgroup.")]
        shim_pid = int(info["shim"]["shim_pid"])
        await pods.remove_pod_sandbox(pod_id)
        assert not os.path.exists(info["netns_path"])
        assert not await wait_gone_async(shim_pid, info["pid"])
        assert cgroups and not any(os.path.exists(c) for c in cgroups)
        assert await pods.list_pod_sandbox() == []
        assert await pods.list_containers() == []
        with pytest.raises(NotFound):
            await pods.pod_sandbox_status(pod_id)
        await pods.remove_pod_sandbox(pod_id)  # removing twice is fine
        await pods.remove_pod_sandbox("0" * 64)  # and so is removing an id never seen (CRI)


async def test_remove_while_ready_forces_a_stop(roots) -> None:
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        pause = (await pods.pod_sandbox_status(pod_id, verbose=True))["info"]["pid"]
        await pods.remove_pod_sandbox(pod_id)
        assert not await wait_gone_async(pause)


#: A CNI plugin that only says what it was asked to do (one line per call in the file CALLS).
RECORDING_PLUGIN = """#!/bin/sh
cat > /dev/null
echo "$CNI_COMMAND $(basename "$0")" >> "{calls}"
[ "$CNI_COMMAND" = ADD ] && printf '{{"cniVersion": "1.0.0", "ips": [{{"address": "10.1.0.5/24"}}]}}'
exit 0
"""


async def test_remove_after_a_finished_stop_runs_no_second_cni_del(roots, tmp_path) -> None:
    root, runtime_root = roots
    bin_dir, conf_dir, calls = tmp_path / "cni-bin", tmp_path / "net.d", tmp_path / "calls"
    bin_dir.mkdir()
    conf_dir.mkdir()
    for plugin in ("recorder",):  # no loopback: the pod layer's netns has lo up (its shim's)
        (bin_dir / plugin).write_text(RECORDING_PLUGIN.format(calls=calls))
        (bin_dir / plugin).chmod(0o755)
    (conf_dir / "10-fake.conflist").write_text(json.dumps(
        {"cniVersion": "1.0.0", "name": "fake", "plugins": [{"type": "recorder"}]}))
    async with open_pod_service(root, runtime_root, cni_conf_dir=str(conf_dir), cni_bin_dirs=(str(bin_dir),)) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        try:
            assert (await pods.pod_sandbox_status(pod_id))["network"]["ip"] == "10.1.0.5"
            await pods.stop_pod_sandbox(pod_id)
            await pods.stop_pod_sandbox(pod_id)  # nothing left to tear down the second time either
        finally:
            await pods.remove_pod_sandbox(pod_id)
    assert sorted(c for c in calls.read_text().splitlines() if c.startswith("DEL")) == ["DEL recorder"]


async def test_a_second_pod_with_the_same_metadata_is_refused(roots) -> None:
    async with pod_service(roots) as pods:
        cfg = pod_config()
        await pods.run_pod_sandbox(cfg)
        with pytest.raises(AlreadyExists):
            await pods.run_pod_sandbox(copy.deepcopy(cfg))
        cfg["metadata"]["attempt"] += 1
        await pods.run_pod_sandbox(cfg)  # the next attempt is another name


async def test_the_name_is_free_again_after_remove(roots) -> None:
    async with pod_service(roots) as pods:
        cfg = pod_config()
        pod_id = await pods.run_pod_sandbox(cfg)
        await pods.remove_pod_sandbox(pod_id)
        await pods.run_pod_sandbox(cfg)


async def test_bad_configs_and_handlers_are_refused_with_a_sentence(roots) -> None:
    async with pod_service(roots) as pods:
        with pytest.raises(InvalidArgument, match="metadata"):
            await pods.run_pod_sandbox({"metadata": {"name": 3}})
        with pytest.raises(InvalidArgument, match="runtime handler"):
            await pods.run_pod_sandbox(pod_config(), runtime_handler="kata")
        with pytest.raises(InvalidArgument, match="not namespaced"):
            cfg = pod_config()
            cfg["linux"]["sysctls"] = {"kernel.pid_max": "4096"}
            await pods.run_pod_sandbox(cfg)
        assert pods.store.list() == []  # nothing half-made


async def test_host_network_pod_uses_the_host_netns(roots) -> None:
    async with pod_service(roots) as pods:
        cfg = pod_config(network=2)
        cfg["linux"]["sysctls"] = {}  # net.* sysctls would change the host's settings: refused
        pod_id = await pods.run_pod_sandbox(cfg)
        status = await pods.pod_sandbox_status(pod_id, verbose=True)
        assert ns_inode(status["info"]["pid"], "net") == ns_inode(os.getpid(), "net")
        assert status["linux"]["namespaces"]["options"]["network"] == "NODE"
        assert status["info"]["netns_path"] == ""


async def test_creating_a_container_needs_a_ready_pod(roots) -> None:
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        await pods.stop_pod_sandbox(pod_id)
        with pytest.raises(FailedPrecondition):
            await pods.create_container(pod_id, node_container(["true"]))


async def test_a_container_whose_log_path_is_a_symlink_is_refused_at_create(roots, tmp_path) -> None:
    victim, logs = tmp_path / "victim", tmp_path / "pod-logs"
    victim.write_bytes(b"precious\n")
    logs.mkdir()
    (logs / "c_0.log").symlink_to(victim)  # where the container's log would go
    cfg = pod_config()
    cfg["log_directory"] = str(logs)
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(cfg)
        with pytest.raises(FailedPrecondition, match=f"{logs}/c_0.log: it is a symbolic link"):
            await pods.create_container(pod_id, node_container(["echo", "hello"]))
        assert await pods.list_containers() == []
    assert victim.read_bytes() == b"precious\n"


async def test_ids_may_be_given_by_unique_prefix(roots) -> None:
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        assert (await pods.pod_sandbox_status(pod_id[:8]))["id"] == pod_id


async def test_list_filters_by_state_and_label(roots) -> None:
    async with pod_service(roots) as pods:
        a = await pods.run_pod_sandbox(pod_config())
        b_cfg = pod_config()
        b_cfg["labels"] = {"tier": "b"}
        b = await pods.run_pod_sandbox(b_cfg)
        await pods.stop_pod_sandbox(a)
        assert [p["id"] for p in await pods.list_pod_sandbox({"state": "SANDBOX_READY"})] == [b]
        assert [p["id"] for p in await pods.list_pod_sandbox({"label_selector": {"tier": "b"}})] == [b]
        assert {p["id"] for p in await pods.list_pod_sandbox()} == {a, b}


async def test_a_listed_pod_is_read_only_and_as_it_is_now(roots) -> None:
    async with pod_service(roots) as pods:
        cfg = pod_config()
        cfg["labels"] = {"tier": "a"}
        pod_id = await pods.run_pod_sandbox(cfg)
        [entry] = await pods.list_pod_sandbox()
        assert type(entry) is PodEntry  # the mark of an entry only the pod layer makes
        with pytest.raises(TypeError):
            entry["state"] = "SANDBOX_NOTREADY"  # type: ignore[index]
        with pytest.raises(TypeError):
            entry.update(state="SANDBOX_NOTREADY")
        with pytest.raises(TypeError):
            entry["labels"]["tier"] = "b"
        await pods.stop_pod_sandbox(pod_id)
        [entry] = await pods.list_pod_sandbox()
        assert (entry["id"], entry["state"], dict(entry["labels"])) == (pod_id, "SANDBOX_NOTREADY", {"tier": "a"})


async def test_a_pod_listed_anew_pushes_out_no_other_pods_kept_entry(roots, monkeypatch) -> None:
    monkeypatch.setattr("client.cri.pod.base._CONFIGS_KEPT", 2)
    async with pod_service(roots) as pods:
        a = await pods.run_pod_sandbox(pod_config())
        b = await pods.run_pod_sandbox(pod_config())
        before = {entry["id"]: entry for entry in await pods.list_pod_sandbox()}
        await pods.stop_pod_sandbox(b)  # b's entry is made anew, in place of its old one
        after = {entry["id"]: entry for entry in await pods.list_pod_sandbox()}
        again = {entry["id"]: entry for entry in await pods.list_pod_sandbox()}
        assert after[b]["state"] == "SANDBOX_NOTREADY" and again[b] is after[b]
        assert again[a] is before[a]

async def test_a_pod_whose_shim_is_killed_shows_notready_and_can_be_removed(roots) -> None:
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        info = (await pods.pod_sandbox_status(pod_id, verbose=True))["info"]
        os.kill(int(info["shim"]["shim_pid"]), signal.SIGKILL)
        assert not await wait_gone_async(int(info["shim"]["shim_pid"]))
        await shows_notready(pods, pod_id, 10)  # the controller notices the death on its own
        await pods.stop_pod_sandbox(pod_id)
        await pods.remove_pod_sandbox(pod_id)
        assert not await wait_gone_async(info["pid"])
        assert not os.path.exists(info["netns_path"])


RESTART_SCRIPT = """
import anyio, json, sys
from client.cri.pod import PodEntry, open_pod_service
async def main(root, runtime_root, cfg_json, ccfg_json):
    async with open_pod_service(root, runtime_root, cni_conf_dir=root + "/no-cni") as pods:
        pod_id = await pods.run_pod_sandbox(json.loads(cfg_json))
        cid = await pods.create_container(pod_id, json.loads(ccfg_json))
        await pods.start_container(cid)
        print(json.dumps([pod_id, cid]), flush=True)
        await anyio.sleep(3600)  # killed -9 by the test
anyio.run(main, *sys.argv[1:])
"""


async def test_pods_and_containers_survive_a_controller_restart(roots):
    root, runtime_root = roots
    proc = subprocess.Popen([sys.executable, "-c", RESTART_SCRIPT, root, runtime_root, json.dumps(pod_config()),
                             json.dumps({**container_config(["/bin/busybox", "sleep", "60"]), "mounts": [BUSYBOX_MOUNT]})],
                            stdout=subprocess.PIPE, text=True)
    try:
        pod_id, cid = json.loads(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    async with pod_service(roots) as pods:
        status = await pods.pod_sandbox_status(pod_id, verbose=True)
        assert status["state"] == "SANDBOX_READY"
        container = await pods.container_status(cid, verbose=True)
        assert container["state"] == "CONTAINER_RUNNING" and alive(container["info"]["pid"])
        await pods.stop_container(cid, timeout=0)
        assert (await pods.container_status(cid))["exit_code"] == 137


async def test_other_calls_go_on_while_a_pod_change_waits_for_the_disk(roots, monkeypatch) -> None:
    # A change of the pod store is durable: it waits for the disk (fsync), which a busy disk
    # makes long. Meanwhile the pod layer serves every other call (kubelet's relists and
    # statuses of a hundred pods starting at once): its event loop never waits for the disk.
    slow = 2.0
    real = os.fsync
    waited: list[float] = []

    def slow_disk(fd: int) -> None:
        if not waited:  # the first write of the pod (its CREATING record) waits long
            time.sleep(slow)
            waited.append(slow)
        real(fd)

    async with pod_service(roots) as pods:
        monkeypatch.setattr(os, "fsync", slow_disk)
        async with loop_stalls() as stalls:
            pod_id = await pods.run_pod_sandbox(pod_config())
        assert waited and (await pods.pod_sandbox_status(pod_id))["state"] == "SANDBOX_READY"
        assert max(stalls) < slow / 2, f"the event loop stood still for {max(stalls):.2f} s"
