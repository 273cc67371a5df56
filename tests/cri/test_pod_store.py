"""client.cri.store: the state machines, durable pod records, names derived from them, prefix
lookup, and many tasks, threads and processes over one root."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time

import anyio
import pytest

from shim.cri.configs import PodSandboxConfig
from shim.rpc.status import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound

from client.cri import store as store_module
from client.cri.pod.base import parsed_once
from client.cri.store import (
    CONTAINER_TRANSITIONS,
    POD_TRANSITIONS,
    ContainerRecord,
    ContainerState,
    PodRecord,
    PodState,
    PodStore,
    check_container_transition,
    check_pod_transition,
)

from support.disktools import at_once, slow_fsyncs


def pod_config(name: str = "web", attempt: int = 0) -> dict:
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "attempt": attempt},
            "labels": {"app": name}}


def pod(pod_id: str, name: str = "web", attempt: int = 0, **fields) -> PodRecord:
    return PodRecord(pod_id=pod_id, config=pod_config(name, attempt), **fields)


def container(container_id: str, pod_id: str, name: str = "app", attempt: int = 0, **fields) -> ContainerRecord:
    config = {"metadata": {"name": name, "attempt": attempt}, "command": ["true"]}
    return ContainerRecord(container_id=container_id, pod_id=pod_id, config=config, **fields)


def made(store: PodStore, pod_id: str, name: str = "web", state: PodState = PodState.READY, **fields) -> PodRecord:
    """A pod as RunPodSandbox leaves it: created CREATING under its lock, then moved to ``state``."""
    lock = store.lock_pod(pod_id)
    assert lock.try_acquire()
    try:
        store.create(pod(pod_id, name, created_at=fields.pop("created_at", None) or pod(pod_id).created_at))
        for step in {PodState.CREATING: [], PodState.READY: [PodState.READY],
                     PodState.NOTREADY: [PodState.READY, PodState.NOTREADY]}[state]:
            store.update(pod_id, state=step)
        return store.update(pod_id, **fields) if fields else store.get(pod_id)
    finally:
        lock.release()


def key_of(record: PodRecord) -> str:
    return PodSandboxConfig.from_json(record.config).metadata.key


@pytest.fixture
def store(tmp_path):
    return PodStore(tmp_path / "state")


def reopen(store: PodStore) -> PodStore:
    """What another process (or the next one, after a crash) sees: a new store over the same files."""
    return PodStore(store.root)


def pods_dir(store: PodStore) -> str:
    return os.path.join(store.root, "pods")


def record_path(store: PodStore, pod_id: str) -> str:
    return os.path.join(pods_dir(store), f"{pod_id}.json")


def files_in(store: PodStore) -> list[str]:
    return sorted(os.listdir(pods_dir(store)))


# -- the state machines (pure) ----------------------------------------------------------------

def test_pod_transitions_follow_the_table() -> None:
    assert POD_TRANSITIONS[PodState.CREATING] == {PodState.READY}
    assert POD_TRANSITIONS[PodState.READY] == {PodState.NOTREADY}
    assert POD_TRANSITIONS[PodState.NOTREADY] == frozenset()
    for old in PodState:
        for new in PodState:
            if new == old or new in POD_TRANSITIONS[old]:
                check_pod_transition("p1", old, new)
            else:
                with pytest.raises(FailedPrecondition, match=f"pod p1 is {old} and cannot become {new}"):
                    check_pod_transition("p1", old, new)


def test_container_transitions_follow_the_table() -> None:
    assert CONTAINER_TRANSITIONS[ContainerState.CREATED] == {ContainerState.RUNNING, ContainerState.EXITED}
    for old in ContainerState:
        for new in ContainerState:
            if new == old or new in CONTAINER_TRANSITIONS[old]:
                check_container_transition("c1", old, new)
            else:
                with pytest.raises(FailedPrecondition, match=f"container c1 is {old} and cannot become {new}"):
                    check_container_transition("c1", old, new)


def test_a_wrong_transition_says_where_the_state_can_go() -> None:
    with pytest.raises(FailedPrecondition, match="is READY and cannot become CREATING: it can only become NOTREADY"):
        check_pod_transition("p1", PodState.READY, PodState.CREATING)
    with pytest.raises(FailedPrecondition, match="is NOTREADY and cannot become READY: it can only be removed"):
        check_pod_transition("p1", PodState.NOTREADY, PodState.READY)


def test_states_are_enums_given_as_strings_or_members() -> None:
    assert pod("p1", state="READY").state is PodState.READY
    assert container("c1", "p1", state=ContainerState.RUNNING).state is ContainerState.RUNNING
    with pytest.raises(InvalidArgument, match="pod state 'RUNNING' is not one of CREATING, READY, NOTREADY"):
        pod("p1", state="RUNNING")
    with pytest.raises(InvalidArgument, match="container state 'READY' is not one of CREATED, RUNNING, EXITED"):
        container("c1", "p1", state="READY")


# -- records on disk --------------------------------------------------------------------------

def test_create_writes_one_json_record_per_pod(store) -> None:
    made(store, "aaa1", ip="10.88.0.2", additional_ips=("fd00::2",), cni_result={"cniVersion": "1.0.0", "ips": []},
         netns_path="/run/netns/x")
    with open(record_path(store, "aaa1")) as f:
        doc = json.load(f)
    assert doc["version"] == 1 and doc["pod_id"] == "aaa1" and doc["state"] == "READY"
    assert doc["config"]["metadata"]["name"] == "web"
    assert store.get("aaa1").additional_ips == ("fd00::2",)
    assert oct(os.stat(pods_dir(store)).st_mode & 0o777) == "0o700"
    assert files_in(store) == ["aaa1.json"]  # the lock file went with its lock


def test_records_survive_a_restart_unchanged(store) -> None:
    made(store, "aaa1", ip="10.88.0.2", additional_ips=("fd00::2",), pid=42,
         cni_result={"ips": [{"address": "10.88.0.2/16"}]}, netns_path="/run/netns/p")
    store.add_container(container("c1", "aaa1", log_path="/var/log/pods/web/app/0.log"))
    store.update_container("aaa1", "c1", state=ContainerState.EXITED, pid=7, exit_code=137, started_at=5,
                           finished_at=9, reason="Error")
    again = reopen(store).get("aaa1")
    assert again == store.get("aaa1") and again.containers["c1"].state is ContainerState.EXITED


def test_stored_copy_is_not_changed_by_the_callers_dicts(store) -> None:
    record = pod("aaa1")
    store.create(record)
    record.config["labels"]["app"] = "changed"
    assert store.get("aaa1").labels == {"app": "web"}


def test_crash_between_tmp_write_and_rename_leaves_the_old_record(store, monkeypatch) -> None:
    made(store, "aaa1", state=PodState.CREATING)

    def crash(src, dst):
        raise OSError(5, "simulated crash before rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        store.update("aaa1", state=PodState.READY)
    monkeypatch.undo()
    assert files_in(store) == ["aaa1.json"]
    assert reopen(store).get("aaa1").state is PodState.CREATING


def test_leftover_tmp_file_from_a_killed_process_is_ignored_and_removed(store) -> None:
    made(store, "aaa1")
    leftover = os.path.join(pods_dir(store), ".aaa1.json.k2j3x")
    with open(leftover, "w") as f:
        f.write('{"pod_id": "aaa1", "sta')  # half a record: the process died mid-write
    again = reopen(store)
    assert again.get("aaa1").state is PodState.READY
    assert not os.path.exists(leftover)


def test_a_listing_reads_no_file_while_the_directory_is_unchanged_and_every_change_once_it_is(store, monkeypatch):
    made(store, "aaa1")
    before = time.time_ns() - 1_000_000_000  # the directory last changed a second ago
    os.utime(pods_dir(store), ns=(before, before))
    assert [r.pod_id for r in store.list()] == ["aaa1"]
    parsed: list[str] = []
    real_parse = store._parse
    monkeypatch.setattr(store, "_parse", lambda pod_id, path: parsed.append(pod_id) or real_parse(pod_id, path))
    assert [r.pod_id for r in store.list()] == ["aaa1"] and parsed == []
    other = reopen(store)  # another process's store
    made(other, "bbb2", name="db")
    other.update("aaa1", state=PodState.NOTREADY)
    assert [(r.pod_id, r.state) for r in store.list()] == [("aaa1", PodState.NOTREADY), ("bbb2", PodState.READY)]
    other.delete("bbb2")
    assert [r.pod_id for r in store.list()] == ["aaa1"]


def test_unreadable_record_is_moved_aside_and_does_not_stop_the_store(store, caplog) -> None:
    made(store, "aaa1")
    with open(record_path(store, "bbb2"), "w") as f:
        f.write("{not json")
    again = reopen(store)
    assert [r.pod_id for r in again.list()] == ["aaa1"]
    assert os.path.exists(record_path(store, "bbb2") + ".corrupt")
    assert "bbb2.json is not valid" in caplog.text


@pytest.mark.parametrize("content", [b"[" * 100_000 + b"]" * 100_000, b'{"pod_id": "\xff"}'], ids=["deep", "latin-1"])
def test_a_record_too_deep_or_not_utf8_is_moved_aside_too(store, caplog, content) -> None:
    made(store, "aaa1")
    with open(record_path(store, "bbb2"), "wb") as f:
        f.write(content)
    again = reopen(store)
    assert [r.pod_id for r in again.list()] == ["aaa1"]
    assert os.path.exists(record_path(store, "bbb2") + ".corrupt")
    assert "bbb2.json is not valid" in caplog.text


def test_record_of_a_newer_version_is_left_alone_and_not_used(store, caplog) -> None:
    made(store, "aaa1")
    with open(record_path(store, "aaa1")) as f:
        newer = {**json.load(f), "version": 2, "pod_id": "bbb2"}
    with open(record_path(store, "bbb2"), "w") as f:
        json.dump(newer, f)
    again = reopen(store)
    assert [r.pod_id for r in again.list()] == ["aaa1"]
    assert os.path.exists(record_path(store, "bbb2")) and "newer than this podshim's (1)" in caplog.text


def test_get_unknown_pod_is_not_found(store) -> None:
    with pytest.raises(NotFound):
        store.get("nope")


def test_delete_is_idempotent_and_durable(store) -> None:
    made(store, "aaa1")
    store.delete("aaa1")
    store.delete("aaa1")
    assert files_in(store) == []
    with pytest.raises(NotFound):
        reopen(store).get("aaa1")


def test_bad_records_are_refused(store) -> None:
    with pytest.raises(InvalidArgument, match="pod id"):
        store.create(pod("../x"))
    with pytest.raises(InvalidArgument, match="metadata.uid is required"):
        store.create(PodRecord(pod_id="aaa1", config={"metadata": {"name": "x", "namespace": "n"}}))
    with pytest.raises(InvalidArgument, match="not JSON-serialisable"):
        store.create(PodRecord(pod_id="aaa1", config={**pod_config(), "x": object()}))
    with pytest.raises(FailedPrecondition, match="a new pod record is CREATING with no containers, not READY"):
        store.create(pod("aaa1", state=PodState.READY))
    assert store.list() == []


def test_update_checks_the_transition_against_the_stored_state(store) -> None:
    made(store, "aaa1", state=PodState.NOTREADY)
    with pytest.raises(FailedPrecondition, match="pod aaa1 is NOTREADY and cannot become READY"):
        store.update("aaa1", state=PodState.READY)
    assert store.update("aaa1", state="NOTREADY", stopped_at=7).stopped_at == 7  # no move: fine


def test_update_replaces_fields_in_one_step(store) -> None:
    made(store, "aaa1", state=PodState.CREATING)
    updated = store.update("aaa1", state=PodState.READY, ip="10.88.0.9")
    assert (updated.state, updated.ip) == (PodState.READY, "10.88.0.9") and reopen(store).get("aaa1") == updated
    with pytest.raises(NotFound):
        store.update("nope", state=PodState.READY)
    with pytest.raises(InvalidArgument, match="pod_id cannot change"):
        store.update("aaa1", pod_id="other")
    with pytest.raises(InvalidArgument, match="config cannot change"):
        store.update("aaa1", config=pod_config("other"))
    with pytest.raises(InvalidArgument, match="colour"):
        store.update("aaa1", colour="blue")


# -- names ------------------------------------------------------------------------------------

def test_second_pod_with_the_same_metadata_is_already_exists(store) -> None:
    made(store, "aaa1", name="web")
    with pytest.raises(AlreadyExists, match="reserved for pod aaa1"):
        store.create(pod("bbb2", name="web"))
    store.create(pod("bbb2", name="web", attempt=1))  # another attempt is another name
    with pytest.raises(AlreadyExists, match="pod bbb2 already exists"):
        store.create(pod("bbb2", name="other"))


def test_reservation_comes_back_with_the_record_after_a_restart(store) -> None:
    made(store, "aaa1")
    with pytest.raises(AlreadyExists):
        reopen(store).create(pod("bbb2"))


def test_deleting_the_record_frees_the_name(store) -> None:
    made(store, "aaa1", state=PodState.NOTREADY)
    store.delete("aaa1")
    store.create(pod("bbb2"))


def test_creating_record_whose_lock_is_held_holds_its_name_and_is_not_incomplete(store) -> None:
    lock = store.lock_pod("aaa1")
    assert lock.try_acquire()
    try:
        store.create(pod("aaa1"))
        other = reopen(store)
        with pytest.raises(AlreadyExists, match="reserved for pod aaa1"):
            other.create(pod("bbb2"))
        assert other.claim_incomplete("aaa1") is None
    finally:
        lock.release()


def test_creating_record_whose_lock_is_free_is_incomplete_and_does_not_block_the_name(store) -> None:
    made(store, "aaa1", state=PodState.CREATING, netns_path="/run/netns/left-behind")  # its writer "died"
    again = reopen(store)
    again.create(pod("bbb2"))  # the new RunPodSandbox does not wait for the rollback
    lock = again.claim_incomplete("aaa1")
    assert lock is not None and lock.held
    assert again.claim_incomplete("aaa1") is None  # one claimant at a time
    again.update("aaa1", netns_path="")  # the rollback may still update and then delete it
    again.delete("aaa1")
    lock.release()
    assert [r.pod_id for r in again.list()] == ["bbb2"] and files_in(again) == ["bbb2.json"]


def test_a_ready_or_deleted_pod_is_never_incomplete(store) -> None:
    made(store, "aaa1")
    assert store.claim_incomplete("aaa1") is None and store.claim_incomplete("nope") is None
    assert files_in(store) == ["aaa1.json"]


# -- prefixes ---------------------------------------------------------------------------------

def test_get_by_prefix_finds_a_unique_prefix(store) -> None:
    made(store, "abc123", name="a")
    made(store, "abd456", name="b")
    assert store.get_by_prefix("abc").pod_id == "abc123"
    assert store.get_by_prefix("abd456").pod_id == "abd456"


def test_exact_id_wins_over_a_longer_id_it_prefixes(store) -> None:
    made(store, "abc", name="a")
    made(store, "abcdef", name="b")
    assert store.get_by_prefix("abc").pod_id == "abc"


def test_ambiguous_prefix_is_invalid_argument_listing_candidates(store) -> None:
    made(store, "abc123", name="a")
    made(store, "abd456", name="b")
    with pytest.raises(InvalidArgument, match="ambiguous: it matches abc123, abd456"):
        store.get_by_prefix("ab")


def test_unknown_or_empty_prefix(store) -> None:
    with pytest.raises(NotFound):
        store.get_by_prefix("zzz")
    with pytest.raises(InvalidArgument):
        store.get_by_prefix("")


# -- containers -------------------------------------------------------------------------------

def test_containers_are_kept_in_their_pods_record(store) -> None:
    made(store, "aaa1")
    store.add_container(container("c1", "aaa1"))
    store.update_container("aaa1", "c1", state=ContainerState.RUNNING, pid=99, started_at=1)
    again = reopen(store)
    stored = again.get_container("aaa1", "c1")
    assert (stored.state, stored.pid, stored.pod_id) == (ContainerState.RUNNING, 99, "aaa1")
    assert again.get("aaa1").containers == {"c1": stored}


def test_container_transitions_are_checked(store) -> None:
    made(store, "aaa1")
    with pytest.raises(FailedPrecondition, match="a new container is CREATED, not RUNNING"):
        store.add_container(container("c1", "aaa1", state=ContainerState.RUNNING))
    store.add_container(container("c1", "aaa1"))
    store.update_container("aaa1", "c1", state=ContainerState.EXITED, reason="NeverStarted")
    with pytest.raises(FailedPrecondition, match="container c1 is EXITED and cannot become RUNNING"):
        store.update_container("aaa1", "c1", state=ContainerState.RUNNING)
    with pytest.raises(InvalidArgument, match="pod_id cannot change"):
        store.update_container("aaa1", "c1", pod_id="bbb2")


def test_container_in_unknown_pod_is_not_found(store) -> None:
    with pytest.raises(NotFound):
        store.add_container(container("c1", "nope"))
    with pytest.raises(NotFound):
        store.get_container("nope", "c1")
    made(store, "aaa1")
    with pytest.raises(NotFound, match="container 'c1' in pod aaa1"):
        store.update_container("aaa1", "c1", state=ContainerState.RUNNING)


def test_container_name_is_unique_within_a_pod(store) -> None:
    made(store, "aaa1", name="a")
    made(store, "bbb2", name="b")
    store.add_container(container("c1", "aaa1", name="app"))
    with pytest.raises(AlreadyExists, match="named 'app_0'"):
        store.add_container(container("c2", "aaa1", name="app"))
    store.add_container(container("c3", "aaa1", name="app", attempt=1))
    store.add_container(container("c4", "bbb2", name="app"))


def test_container_id_is_unique_across_pods(store) -> None:
    made(store, "aaa1", name="a")
    made(store, "bbb2", name="b")
    store.add_container(container("c1", "aaa1"))
    with pytest.raises(AlreadyExists, match="belongs to pod aaa1"):
        store.add_container(container("c1", "bbb2"))


def test_find_container_by_prefix_across_pods(store) -> None:
    made(store, "aaa1", name="a")
    made(store, "bbb2", name="b")
    store.add_container(container("ff01", "aaa1"))
    store.add_container(container("ff02", "bbb2"))
    assert store.find_container("ff02").pod_id == "bbb2"
    with pytest.raises(InvalidArgument, match="ff01, ff02"):
        store.find_container("ff")
    with pytest.raises(NotFound):
        store.find_container("ee")


def test_a_container_found_by_its_whole_id_costs_one_record_read_not_every_pods(store, monkeypatch):
    # kubelet asks for each container by its whole id, while a hundred pods change around it
    # (every change makes a listing read every record again).
    for i in range(30):
        made(store, f"pod{i:02}", name=f"p{i}")
        store.add_container(container(f"c{i:02}", f"pod{i:02}"))
    made(store, "other", name="other")  # a change after the containers were added
    reads: list[str] = []
    parse = PodStore._parse
    monkeypatch.setattr(PodStore, "_parse", lambda self, pod_id, path: (reads.append(pod_id), parse(self, pod_id, path))[1])
    assert store.find_container("c17").pod_id == "pod17"
    assert reads == ["pod17"]


def test_a_pod_found_by_its_whole_id_is_one_record_read_not_a_listing(store, monkeypatch) -> None:
    # kubelet asks PodSandboxStatus by the whole id, several times per pod, while a hundred start.
    for i in range(30):
        made(store, f"pod{i:02}", name=f"p{i}")
    monkeypatch.setattr(PodStore, "_ids", lambda self: pytest.fail("the pods directory was listed"))
    assert store.get_by_prefix("pod17").pod_id == "pod17"
    monkeypatch.undo()
    with pytest.raises(NotFound):  # a path is no id: looked up as a prefix, never opened as a file
        store.get_by_prefix("../pods/pod17")


def test_a_listing_after_one_pod_changed_reads_that_pods_record_alone(store, monkeypatch) -> None:
    # kubelet lists every pod each second while a hundred of them start: each start changes
    # the directory, and a listing must not read every record again for one that changed.
    for i in range(30):
        made(store, f"pod{i:02}", name=f"p{i}")
    time.sleep(0.2)  # the records settle (a file changed in the tick it was read is read again)
    store.list()
    store.update("pod07", ip="10.0.0.7")
    opened: list[str] = []

    def counted(path, *args, **kwargs):
        opened.append(os.path.basename(path))
        return open(path, *args, **kwargs)

    monkeypatch.setattr(store_module, "open", counted, raising=False)
    assert [r.ip for r in store.list() if r.pod_id == "pod07"] == ["10.0.0.7"]
    assert opened == ["pod07.json"]


def test_a_container_is_found_by_its_whole_id_wherever_it_went_and_not_once_removed(store) -> None:
    made(store, "aaa1", name="a")
    made(store, "bbb2", name="b")
    store.add_container(container("c1", "aaa1"))
    assert store.find_container("c1").pod_id == "aaa1"
    store.delete_container("aaa1", "c1")
    with pytest.raises(NotFound):
        store.find_container("c1")
    other = reopen(store)  # another process adds it, to another pod (its id is free again)
    other.add_container(container("c1", "bbb2"))
    assert store.find_container("c1").pod_id == "bbb2"
    other.delete("bbb2")
    with pytest.raises(NotFound):
        store.find_container("c1")


def test_delete_container_is_idempotent(store) -> None:
    made(store, "aaa1")
    store.add_container(container("c1", "aaa1"))
    store.delete_container("aaa1", "c1")
    store.delete_container("aaa1", "c1")
    store.delete_container("nope", "c1")
    assert store.list_containers("aaa1") == [] and reopen(store).get("aaa1").containers == {}


def test_deleting_a_pod_deletes_its_containers(store) -> None:
    made(store, "aaa1")
    store.add_container(container("c1", "aaa1"))
    store.delete("aaa1")
    with pytest.raises(NotFound):
        store.find_container("c1")


def test_list_is_oldest_first_and_list_containers_filters_by_pod(store) -> None:
    made(store, "bbb2", name="b", created_at=2)
    made(store, "aaa1", name="a", created_at=1)
    store.add_container(container("c2", "bbb2", created_at=3))
    store.add_container(container("c1", "aaa1", created_at=4))
    assert [r.pod_id for r in store.list()] == ["aaa1", "bbb2"]
    assert [c.container_id for c in store.list_containers()] == ["c2", "c1"]
    assert [c.container_id for c in store.list_containers("aaa1")] == ["c1"]


def test_records_are_frozen(store) -> None:
    record = made(store, "aaa1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.state = PodState.NOTREADY  # type: ignore[misc]


# -- pod locks --------------------------------------------------------------------------------

def test_a_pod_lock_excludes_another_in_the_same_process_and_leaves_no_file(store) -> None:
    first, second = store.lock_pod("aaa1"), store.lock_pod("aaa1")
    assert first.try_acquire() and not second.try_acquire()
    assert files_in(store) == ["aaa1.lock"]
    first.release()
    first.release()  # no-op
    assert files_in(store) == []
    assert second.try_acquire()
    second.release()


async def test_acquire_waits_until_the_holder_lets_go(store) -> None:
    holder, waiter = store.lock_pod("aaa1"), store.lock_pod("aaa1")
    assert holder.try_acquire()
    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter.acquire)
        await anyio.wait_all_tasks_blocked()
        assert not waiter.held
        holder.release()
    assert waiter.held
    waiter.release()
    assert files_in(store) == []


async def test_a_cancelled_acquire_holds_nothing(store) -> None:
    holder, waiter = store.lock_pod("aaa1"), store.lock_pod("aaa1")
    assert holder.try_acquire()
    with anyio.move_on_after(0.05):
        await waiter.acquire()
    assert not waiter.held
    holder.release()
    assert files_in(store) == []


def test_lock_file_of_a_killed_holder_is_removed_when_the_store_opens(store):
    with child(store, "hold", "aaa1") as holder:
        assert holder.stdout.readline() == "held\n"
        holder.kill()
    assert files_in(store) == ["aaa1.json", "aaa1.lock"]
    reopen(store)
    assert files_in(store) == ["aaa1.json"]  # the record stays, for the rollback


# -- many tasks, threads and processes over one root -------------------------------------------

async def test_concurrent_tasks_see_whole_updates(store) -> None:
    made(store, "aaa1", name="shared")

    async def writer(i: int) -> None:
        await asyncio.sleep(0)
        made(store, f"p{i}", name=f"n{i}")
        await asyncio.sleep(0)
        store.add_container(container(f"c{i}", "aaa1", name=f"app{i}"))
        await asyncio.sleep(0)
        store.update("aaa1", ip=f"10.0.0.{i}")

    await asyncio.gather(*(writer(i) for i in range(40)))
    again = reopen(store)
    assert len(again.list()) == 41
    assert sorted(again.get("aaa1").containers) == sorted(f"c{i}" for i in range(40))
    assert again.get("aaa1") == store.get("aaa1")


def test_concurrent_threads_do_not_lose_containers(store) -> None:
    made(store, "aaa1")

    def add(i: int) -> None:
        store.add_container(container(f"c{i}", "aaa1", name=f"app{i}"))

    threads = [threading.Thread(target=add, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(reopen(store).get("aaa1").containers) == 16


def test_changes_of_different_pods_wait_for_the_disk_together_not_one_after_another(store, monkeypatch) -> None:
    # Each change is durable (its file and the directory fsynced). A hundred pods starting at
    # once change their records at once: their fsyncs are made together (the disk commits
    # them together), not one after another while the store lock is held.
    pods = 8
    for i in range(pods):
        made(store, f"pod{i}", name=f"p{i}")
    overlap = slow_fsyncs(monkeypatch, 0.2)
    at_once(pods, lambda i: store.update(f"pod{i}", ip=f"10.0.0.{i}"))
    monkeypatch.undo()
    assert [reopen(store).get(f"pod{i}").ip for i in range(pods)] == [f"10.0.0.{i}" for i in range(pods)]
    # Under the store lock, one fsync at a time would be waited for.
    assert overlap.most >= pods // 2, f"at most {overlap.most} of {pods} changes' fsyncs at once"


#: A process working on the store at ``argv[1]``; what it does is ``argv[2]``:
#:  create ID NAME  - wait for a line on stdin, then create the pod under its lock; print ok or exists
#:  hold ID         - take the pod's lock, create it CREATING, print "held", wait until stdin closes
#:  add ID FIRST N  - add N containers to pod ID, one change at a time
#:  stall ID        - update pod ID, freezing (SIGSTOP) between writing the tmp file and its rename
CHILD = r"""
import os, signal, sys
from client.cri.store import ContainerRecord, PodRecord, PodStore
from shim.rpc.status import AlreadyExists
root, action, pod_id, *rest = sys.argv[1:]
store = PodStore(root)
def config(name):
    return {"metadata": {"name": name, "namespace": "default", "uid": "uid-" + name, "attempt": 0}}
if action == "create":
    lock = store.lock_pod(pod_id)
    assert lock.try_acquire()
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        store.create(PodRecord(pod_id, config(rest[0])))
        print("ok", flush=True)
    except AlreadyExists:
        print("exists", flush=True)
    sys.stdin.read()  # keep the pod's lock (alive, as RunPodSandbox is) until the round is over
elif action == "hold":
    lock = store.lock_pod(pod_id)
    assert lock.try_acquire()
    store.create(PodRecord(pod_id, config(pod_id)))
    print("held", flush=True)
    sys.stdin.read()
elif action == "add":
    first, n = int(rest[0]), int(rest[1])
    for i in range(first, first + n):
        store.add_container(ContainerRecord(f"c{i}", pod_id, {"metadata": {"name": f"app{i}"}}))
elif action == "stall":
    real = os.replace
    def replace(src, dst):
        os.kill(os.getpid(), signal.SIGSTOP)
        return real(src, dst)
    os.replace = replace
    store.update(pod_id, ip="10.0.0.9")
"""


def child(store: PodStore, *argv: str) -> subprocess.Popen:
    """One process of CHILD; use it in ``with`` (or communicate) so its pipes are closed."""
    return subprocess.Popen([sys.executable, "-c", CHILD, store.root, *argv],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def test_processes_creating_one_pod_name_at_once_get_one_record(store):
    for round in range(6):
        racers = [child(store, "create", f"r{round}p{i}", f"name{round}") for i in range(4)]
        assert [p.stdout.readline() for p in racers] == ["ready\n"] * 4
        for p in racers:  # all four are past their imports: let them go at once
            p.stdin.write("go\n")
            p.stdin.flush()
        # Every outcome is read while all four are alive: a CREATING record whose creator
        # has exited is a crash leftover that holds no name, so a racer that ran after the
        # winner had exited would rightly take the name.
        outcomes = sorted(p.stdout.readline() for p in racers)
        for p in racers:
            p.communicate(timeout=30)
        assert outcomes == ["exists\n"] * 3 + ["ok\n"], f"round {round}"
    assert len(store.list()) == 6


def test_creating_record_of_a_live_process_is_left_alone_until_it_dies(store):
    with child(store, "hold", "aaa1") as owner:
        try:
            assert owner.stdout.readline() == "held\n"
            again = reopen(store)
            assert again.get("aaa1").state is PodState.CREATING
            assert again.claim_incomplete("aaa1") is None
            with pytest.raises(AlreadyExists, match="reserved for pod aaa1"):
                again.create(pod("bbb2", name="aaa1"))
        finally:
            owner.kill()  # kill -9: the kernel drops its lock
    lock = store.claim_incomplete("aaa1")
    assert lock is not None
    store.delete("aaa1")
    lock.release()
    store.create(pod("bbb2", name="aaa1"))


def test_containers_added_by_two_processes_are_all_kept(store) -> None:
    made(store, "aaa1")
    writers = [child(store, "add", "aaa1", str(first), "20") for first in (0, 100)]
    for writer in writers:
        writer.communicate(timeout=60)
    assert [p.returncode for p in writers] == [0, 0]
    assert len(store.get("aaa1").containers) == 40


def test_a_change_by_another_process_is_seen_at_once(store) -> None:
    reader = reopen(store)
    made(store, "aaa1")
    assert reader.get("aaa1").state is PodState.READY
    store.update("aaa1", state=PodState.NOTREADY)
    assert [r.state for r in reader.list()] == [PodState.NOTREADY]
    store.delete("aaa1")
    assert reader.list() == []


def test_a_record_is_decoded_again_only_when_its_bytes_change(store) -> None:
    reader = reopen(store)
    made(store, "aaa1", ip="10.88.0.2")
    assert reader.get("aaa1") is reader.get("aaa1")  # the same bytes: the same record
    store.update("aaa1", ip="10.88.0.3")  # as long as before, at once: still seen
    assert reader.get("aaa1").ip == "10.88.0.3"
    store.delete("aaa1")
    assert reader.list() == [] and reader._cache == {}


def test_what_the_store_wrote_is_what_its_next_read_gives_without_decoding_it(store, monkeypatch) -> None:
    written = store.update(made(store, "aaa1").pod_id, ip="10.88.0.2")
    decoded: list[str] = []
    monkeypatch.setattr(store_module, "decode_json", lambda data, path: decoded.append(path))
    assert store.get("aaa1") is written and [r.pod_id for r in store.list()] == ["aaa1"] and decoded == []
    monkeypatch.undo()
    reopen(store).update("aaa1", ip="10.88.0.3")  # another process's write: read and decoded
    assert store.get("aaa1").ip == "10.88.0.3"


def test_a_write_after_a_failed_read_is_the_next_reads_parse_too(store, monkeypatch) -> None:
    made(store, "aaa1")
    parse = PodStore._parse
    failures = [OSError(5, "Input/output error")]

    def flaky(self, pod_id: str, path: str):
        if failures:  # the read _commit starts with fails once: it writes under the store lock
            raise failures.pop()
        return parse(self, pod_id, path)

    monkeypatch.setattr(PodStore, "_parse", flaky)
    written = store.update("aaa1", ip="10.88.0.2")
    assert failures == [] and written.ip == "10.88.0.2"
    decoded: list[str] = []
    monkeypatch.setattr(store_module, "decode_json", lambda data, path: decoded.append(path))
    assert store.get("aaa1") is written and decoded == []


def test_a_config_is_parsed_once_however_often_its_pod_is_written(store) -> None:
    kept: dict = {}
    parses: list[dict] = []

    def parse(config: dict) -> object:
        parses.append(config)
        return object()

    first = made(store, "aaa1")
    parsed = parsed_once(kept, "aaa1", first, parse)
    again = store.update("aaa1", ip="10.88.0.2")
    assert again is not first and parsed_once(kept, "aaa1", again, parse) is parsed and len(parses) == 1
    other = made(store, "bbb2", name="db")  # another config: parsed
    assert parsed_once(kept, "aaa1", other, parse) is not parsed and len(parses) == 2


def test_opening_the_store_leaves_a_live_writers_tmp_file_alone(store) -> None:
    made(store, "aaa1")
    writer = child(store, "stall", "aaa1")
    try:
        _, status = os.waitpid(writer.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status)
        tmp_files = [e for e in files_in(store) if e.startswith(".aaa1.json.")]
        assert len(tmp_files) == 1
        again = reopen(store)  # the writer holds the store lock: nothing is cleaned up
        assert files_in(store) == [*tmp_files, "aaa1.json"] and again.get("aaa1").ip == ""
    finally:
        os.kill(writer.pid, signal.SIGCONT)
        writer.communicate(timeout=30)
    assert writer.returncode == 0
    assert again.get("aaa1").ip == "10.0.0.9" and files_in(store) == ["aaa1.json"]
