"""client.cri.store: durable pod records, reservations derived from them, prefix lookup, concurrency."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import threading

import pytest

from client.cri.configs import PodSandboxConfig
from client.cri.store import ContainerRecord, PodRecord, PodStore
from shim.rpc.status import AlreadyExists, InvalidArgument, NotFound


def pod_config(name: str = "web", attempt: int = 0) -> dict:
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "attempt": attempt},
            "labels": {"app": name}}


def pod(pod_id: str, name: str = "web", attempt: int = 0, **fields) -> PodRecord:
    return PodRecord(pod_id=pod_id, config=pod_config(name, attempt), **fields)


def container(container_id: str, pod_id: str, name: str = "app", attempt: int = 0, **fields) -> ContainerRecord:
    config = {"metadata": {"name": name, "attempt": attempt}, "command": ["true"]}
    return ContainerRecord(container_id=container_id, pod_id=pod_id, config=config, **fields)


def key_of(record: PodRecord) -> str:
    return PodSandboxConfig.from_json(record.config).metadata.key


@pytest.fixture
def store(tmp_path):
    return PodStore(tmp_path / "state")


def reopen(store: PodStore) -> PodStore:
    """What the next process sees after this one crashed: a new store over the same files."""
    return PodStore(store.root)


def record_path(store: PodStore, pod_id: str) -> str:
    return os.path.join(store.root, "pods", f"{pod_id}.json")


def test_put_writes_one_json_record_per_pod(store):
    stored = store.put(pod("aaa1", state="READY", ip="10.88.0.2", additional_ips=("fd00::2",),
                           cni_result={"cniVersion": "1.0.0", "ips": []}, netns_path="/run/netns/x"))
    with open(record_path(store, "aaa1")) as f:
        doc = json.load(f)
    assert doc["version"] == 1 and doc["pod_id"] == "aaa1" and doc["state"] == "READY"
    assert doc["config"]["metadata"]["name"] == "web"
    assert stored.additional_ips == ("fd00::2",)
    assert oct(os.stat(os.path.dirname(record_path(store, "aaa1"))).st_mode & 0o777) == "0o700"


def test_records_survive_a_restart_unchanged(store):
    store.put(pod("aaa1", state="READY", ip="10.88.0.2", additional_ips=("fd00::2",), pid=42,
                  cni_result={"ips": [{"address": "10.88.0.2/16"}]}, netns_path="/run/netns/p"))
    store.put_container(container("c1", "aaa1", state="EXITED", pid=7, exit_code=137, started_at=5, finished_at=9,
                                  reason="Error", log_path="/var/log/pods/web/app/0.log"))
    assert reopen(store).get("aaa1") == store.get("aaa1")


def test_stored_copy_is_not_changed_by_the_callers_dicts(store):
    record = pod("aaa1")
    store.put(record)
    record.config["labels"]["app"] = "changed"
    assert store.get("aaa1").labels == {"app": "web"}


def test_crash_between_tmp_write_and_rename_leaves_the_old_record(store, monkeypatch):
    store.put(pod("aaa1", state="CREATING"))

    def crash(src, dst):
        raise OSError(5, "simulated crash before rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        store.put(pod("aaa1", state="READY"))
    monkeypatch.undo()
    assert os.listdir(os.path.dirname(record_path(store, "aaa1"))) == ["aaa1.json"]
    assert reopen(store).get("aaa1").state == "CREATING"


def test_leftover_tmp_file_from_a_killed_process_is_ignored_and_removed(store):
    store.put(pod("aaa1", state="READY"))
    leftover = os.path.join(os.path.dirname(record_path(store, "aaa1")), ".aaa1.json.k2j3x")
    with open(leftover, "w") as f:
        f.write('{"pod_id": "aaa1", "sta')  # half a record: the process died mid-write
    again = reopen(store)
    assert again.get("aaa1").state == "READY"
    assert not os.path.exists(leftover)


def test_unreadable_record_is_moved_aside_and_does_not_stop_the_store(store, caplog):
    store.put(pod("aaa1", state="READY"))
    with open(record_path(store, "bbb2"), "w") as f:
        f.write("{not json")
    again = reopen(store)
    assert [r.pod_id for r in again.list()] == ["aaa1"]
    assert os.path.exists(record_path(store, "bbb2") + ".corrupt")
    assert "bbb2.json is not valid" in caplog.text


@pytest.mark.parametrize("content", [b"[" * 100_000 + b"]" * 100_000, b'{"pod_id": "\xff"}'], ids=["deep", "latin-1"])
def test_a_record_too_deep_or_not_utf8_is_moved_aside_too(store, caplog, content):
    store.put(pod("aaa1", state="READY"))
    with open(record_path(store, "bbb2"), "wb") as f:
        f.write(content)
    again = reopen(store)
    assert [r.pod_id for r in again.list()] == ["aaa1"]
    assert os.path.exists(record_path(store, "bbb2") + ".corrupt")
    assert "bbb2.json is not valid" in caplog.text


def test_get_unknown_pod_is_not_found(store):
    with pytest.raises(NotFound):
        store.get("nope")


def test_delete_is_idempotent_and_durable(store):
    store.put(pod("aaa1"))
    store.delete("aaa1")
    store.delete("aaa1")
    assert not os.path.exists(record_path(store, "aaa1"))
    with pytest.raises(NotFound):
        reopen(store).get("aaa1")


def test_bad_records_are_refused(store):
    with pytest.raises(InvalidArgument, match="pod id"):
        store.put(pod("../x"))
    with pytest.raises(InvalidArgument, match="pod state 'RUNNING'"):
        store.put(pod("aaa1", state="RUNNING"))
    with pytest.raises(InvalidArgument, match="metadata.uid is required"):
        store.put(PodRecord(pod_id="aaa1", config={"metadata": {"name": "x", "namespace": "n"}}))
    with pytest.raises(InvalidArgument, match="not JSON-serialisable"):
        store.put(PodRecord(pod_id="aaa1", config={**pod_config(), "x": object()}))
    assert store.list() == []


def test_second_pod_with_the_same_metadata_is_already_exists(store):
    store.put(pod("aaa1", name="web"))
    with pytest.raises(AlreadyExists, match="reserved for pod aaa1"):
        store.put(pod("bbb2", name="web"))
    store.put(pod("bbb2", name="web", attempt=1))  # another attempt is another name


def test_reserve_name_holds_until_the_record_is_put(store):
    key = key_of(pod("aaa1"))
    store.reserve_name(key, "aaa1")
    store.reserve_name(key, "aaa1")  # idempotent
    with pytest.raises(AlreadyExists):
        store.reserve_name(key, "bbb2")
    with pytest.raises(AlreadyExists):
        store.put(pod("bbb2"))
    store.put(pod("aaa1"))
    with pytest.raises(AlreadyExists):
        store.reserve_name(key, "bbb2")


def test_released_name_can_be_reserved_again(store):
    key = key_of(pod("aaa1"))
    store.reserve_name(key, "aaa1")
    store.release_name(key, "bbb2")  # not the holder: no effect
    with pytest.raises(AlreadyExists):
        store.reserve_name(key, "bbb2")
    store.release_name(key, "aaa1")
    store.reserve_name(key, "bbb2")


def test_a_reservation_without_a_record_does_not_survive_a_crash(store):
    store.reserve_name(key_of(pod("aaa1")), "aaa1")
    again = reopen(store)
    again.put(pod("bbb2"))  # the name is free: only records hold names across restarts


def test_reservation_comes_back_with_the_record_after_a_restart(store):
    store.put(pod("aaa1", state="READY"))
    with pytest.raises(AlreadyExists):
        reopen(store).put(pod("bbb2"))


def test_deleting_the_record_frees_the_name(store):
    store.put(pod("aaa1", state="NOTREADY"))
    store.delete("aaa1")
    store.put(pod("bbb2"))


def test_creating_record_of_this_process_holds_its_name(store):
    store.put(pod("aaa1", state="CREATING"))
    with pytest.raises(AlreadyExists):
        store.put(pod("bbb2"))
    assert store.list_incomplete() == []


def test_creating_record_left_by_a_crash_is_incomplete_and_does_not_block_the_name(store):
    store.put(pod("aaa1", state="CREATING", netns_path="/run/netns/left-behind"))
    again = reopen(store)
    assert [r.pod_id for r in again.list_incomplete()] == ["aaa1"]
    assert again.is_incomplete("aaa1")
    again.put(pod("bbb2", state="READY"))  # the new RunPodSandbox does not wait for the rollback
    # The rollback may still update and then delete the incomplete record.
    again.update("aaa1", netns_path="")
    again.delete("aaa1")
    assert again.list_incomplete() == [] and [r.pod_id for r in again.list()] == ["bbb2"]


def test_get_by_prefix_finds_a_unique_prefix(store):
    store.put(pod("abc123", name="a"))
    store.put(pod("abd456", name="b"))
    assert store.get_by_prefix("abc").pod_id == "abc123"
    assert store.get_by_prefix("abd456").pod_id == "abd456"


def test_exact_id_wins_over_a_longer_id_it_prefixes(store):
    store.put(pod("abc", name="a"))
    store.put(pod("abcdef", name="b"))
    assert store.get_by_prefix("abc").pod_id == "abc"


def test_ambiguous_prefix_is_invalid_argument_listing_candidates(store):
    store.put(pod("abc123", name="a"))
    store.put(pod("abd456", name="b"))
    with pytest.raises(InvalidArgument, match="ambiguous: it matches abc123, abd456"):
        store.get_by_prefix("ab")


def test_unknown_or_empty_prefix(store):
    with pytest.raises(NotFound):
        store.get_by_prefix("zzz")
    with pytest.raises(InvalidArgument):
        store.get_by_prefix("")


def test_update_replaces_fields_in_one_step(store):
    store.put(pod("aaa1"))
    updated = store.update("aaa1", state="READY", ip="10.88.0.9")
    assert (updated.state, updated.ip) == ("READY", "10.88.0.9") and reopen(store).get("aaa1") == updated
    with pytest.raises(NotFound):
        store.update("nope", state="READY")
    with pytest.raises(InvalidArgument):
        store.update("aaa1", pod_id="other")


def test_metadata_of_a_pod_cannot_change(store):
    store.put(pod("aaa1", name="web"))
    with pytest.raises(InvalidArgument, match="metadata cannot change"):
        store.put(pod("aaa1", name="other"))


def test_containers_are_kept_in_their_pods_record(store):
    store.put(pod("aaa1"))
    store.put_container(container("c1", "aaa1"))
    store.update_container("c1", state="RUNNING", pid=99, started_at=1)
    again = reopen(store)
    stored = again.get_container("c1")
    assert (stored.state, stored.pid, stored.pod_id) == ("RUNNING", 99, "aaa1")
    assert again.get("aaa1").containers == {"c1": stored}


def test_container_in_unknown_pod_is_not_found(store):
    with pytest.raises(NotFound):
        store.put_container(container("c1", "nope"))
    with pytest.raises(NotFound):
        store.get_container("c1")


def test_container_name_is_unique_within_a_pod(store):
    store.put(pod("aaa1", name="a"))
    store.put(pod("bbb2", name="b"))
    store.put_container(container("c1", "aaa1", name="app"))
    with pytest.raises(AlreadyExists, match="named 'app_0'"):
        store.put_container(container("c2", "aaa1", name="app"))
    store.put_container(container("c3", "aaa1", name="app", attempt=1))
    store.put_container(container("c4", "bbb2", name="app"))


def test_container_id_is_unique_across_pods(store):
    store.put(pod("aaa1", name="a"))
    store.put(pod("bbb2", name="b"))
    store.put_container(container("c1", "aaa1"))
    with pytest.raises(AlreadyExists, match="belongs to pod aaa1"):
        store.put_container(container("c1", "bbb2"))


def test_find_container_by_prefix_across_pods(store):
    store.put(pod("aaa1", name="a"))
    store.put(pod("bbb2", name="b"))
    store.put_container(container("ff01", "aaa1"))
    store.put_container(container("ff02", "bbb2"))
    assert store.find_container("ff02").pod_id == "bbb2"
    with pytest.raises(InvalidArgument, match="ff01, ff02"):
        store.find_container("ff")
    with pytest.raises(NotFound):
        store.find_container("ee")


def test_delete_container_is_idempotent(store):
    store.put(pod("aaa1"))
    store.put_container(container("c1", "aaa1"))
    store.delete_container("c1")
    store.delete_container("c1")
    assert store.list_containers("aaa1") == [] and reopen(store).get("aaa1").containers == {}


def test_deleting_a_pod_deletes_its_containers(store):
    store.put(pod("aaa1"))
    store.put_container(container("c1", "aaa1"))
    store.delete("aaa1")
    with pytest.raises(NotFound):
        store.get_container("c1")


def test_list_is_oldest_first_and_list_containers_filters_by_pod(store):
    store.put(pod("bbb2", name="b", created_at=2))
    store.put(pod("aaa1", name="a", created_at=1))
    store.put_container(container("c2", "bbb2", created_at=3))
    store.put_container(container("c1", "aaa1", created_at=4))
    assert [r.pod_id for r in store.list()] == ["aaa1", "bbb2"]
    assert [c.container_id for c in store.list_containers()] == ["c2", "c1"]
    assert [c.container_id for c in store.list_containers("aaa1")] == ["c1"]


async def test_concurrent_tasks_see_whole_updates(store):
    store.put(pod("aaa1", name="shared"))

    async def writer(i: int) -> None:
        await asyncio.sleep(0)
        store.put(pod(f"p{i}", name=f"n{i}", state="READY"))
        await asyncio.sleep(0)
        store.put_container(container(f"c{i}", "aaa1", name=f"app{i}"))
        await asyncio.sleep(0)
        store.update("aaa1", ip=f"10.0.0.{i}")

    await asyncio.gather(*(writer(i) for i in range(40)))
    again = reopen(store)
    assert len(again.list()) == 41
    assert sorted(again.get("aaa1").containers) == sorted(f"c{i}" for i in range(40))
    assert again.get("aaa1") == store.get("aaa1")


async def test_racing_pods_with_one_name_get_exactly_one_winner(store):
    async def run_pod(i: int) -> str:
        await asyncio.sleep(0)
        store.reserve_name(key_of(pod("x")), f"p{i}")
        await asyncio.sleep(0)  # the pod service awaits between reserving and writing
        store.put(pod(f"p{i}", state="CREATING"))
        return f"p{i}"

    results = await asyncio.gather(*(run_pod(i) for i in range(10)), return_exceptions=True)
    winners = [r for r in results if isinstance(r, str)]
    assert len(winners) == 1 and all(isinstance(r, AlreadyExists) for r in results if r not in winners)
    assert [r.pod_id for r in reopen(store).list()] == winners


def test_concurrent_threads_do_not_lose_containers(store):
    store.put(pod("aaa1"))

    def add(i: int) -> None:
        store.put_container(container(f"c{i}", "aaa1", name=f"app{i}"))

    threads = [threading.Thread(target=add, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(reopen(store).get("aaa1").containers) == 16


def test_records_are_frozen(store):
    record = store.put(pod("aaa1"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.state = "READY"  # type: ignore[misc]
