"""state.json's one schema: what the shim writes, what older shims wrote, and what ``podshim
delete`` makes of both. Plain files in a temporary bundle; no process is harmed."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from shim import cli
from shim.api.names import UNKNOWN_EXIT_STATUS
from shim.api.paths import STATE_FILE
from shim.cleanup import delete_sandbox
from shim.sandbox.record import (
    STATE_VERSION,
    ExitRecord,
    MalformedRecord,
    PauseRecord,
    SandboxRecord,
    TaskRecord,
    read_state,
    write_state,
)
from shim.sandbox.sandbox import State

CGROUP = {"name": "sb1", "paths": {"memory": "/sys/fs/cgroup/memory/podshim/ns/sb1"}, "skipped": {},
          "owned_parents": {}}
#: What a shim wrote before state.json had a version (taken from the code of the time).
SPAWNER_FIRST_RECORD = {"namespace": "ns", "sandbox_id": "sb1", "state": "new", "shim_pid": 4242,
                        "shim_start_time": 1234, "socket_path": "/run/podshim/s/0123"}
BEFORE_TASKS = {**SPAWNER_FIRST_RECORD, "state": "running", "netns_path": "/var/run/netns/podshim-x",
                "netns_owned": True, "cgroup": CGROUP, "pause": {"pid": 4343, "start_time": 1240, "binary": "builtin"},
                "created_at": 1_700_000_000_000_000_000, "exit": None}
BEFORE_OCI = {**BEFORE_TASKS, "tasks": {"app": {"status": "running", "pid": 4444, "start_time": 1250,
                                                "cgroup": {**CGROUP, "name": "app"}, "pid_mode": "CONTAINER",
                                                "log_path": "/var/log/app.log", "exit": None}}}


def a_record(**changes) -> SandboxRecord:
    fields = dict(namespace="ns", sandbox_id="sb1", state="running", shim_pid=4242, shim_start_time=1234,
                  socket_path="/run/podshim/s/0123", netns_path="/var/run/netns/podshim-x", netns_owned=True,
                  cgroup=CGROUP, pause=PauseRecord(4343, 1240, "/usr/bin/catatonit"), created_at=5,
                  exit=ExitRecord(137, 6),
                  tasks={"app": TaskRecord("stopped", 4444, 1250, None, "POD", "/l", ExitRecord(0, 7))},
                  runtime_handler="runc", oci={"runtime": {"name": "runc"}, "containers": []})
    return SandboxRecord(**{**fields, **changes})


def write_doc(bundle, doc) -> None:
    with open(os.path.join(bundle, STATE_FILE), "w") as f:
        json.dump(doc, f)


def read_doc(bundle) -> dict:
    with open(os.path.join(bundle, STATE_FILE)) as f:
        return json.load(f)


def test_a_record_reads_back_as_it_was_written(tmp_path) -> None:
    record = a_record()
    write_state(str(tmp_path), record)
    assert read_state(str(tmp_path)) == record


def test_the_file_is_a_sorted_json_map_with_every_key_and_the_version(tmp_path) -> None:
    write_state(str(tmp_path), a_record())
    with open(tmp_path / STATE_FILE) as f:
        text = f.read()
    doc = json.loads(text)
    assert doc["version"] == STATE_VERSION == 1
    assert set(BEFORE_OCI) | {"runtime_handler", "oci", "rootfs", "version"} == set(doc)
    assert text == json.dumps(doc, sort_keys=True) + "\n"
    assert doc["tasks"]["app"] == {"status": "stopped", "pid": 4444, "start_time": 1250, "cgroup": None,
                                   "pid_mode": "POD", "log_path": "/l", "exit": {"exit_status": 0, "exited_at": 7},
                                   "rootfs": ""}


def test_no_bundle_record_is_none(tmp_path) -> None:
    assert read_state(str(tmp_path)) is None


@pytest.mark.parametrize("doc", [SPAWNER_FIRST_RECORD, BEFORE_TASKS, BEFORE_OCI], ids=["spawner", "pre-tasks", "pre-oci"])
def test_a_record_from_before_the_version_reads_with_what_is_missing_left_empty(tmp_path, doc) -> None:
    write_doc(tmp_path, doc)
    record = read_state(str(tmp_path))
    assert record is not None
    assert record.version == 0
    assert (record.namespace, record.sandbox_id, record.shim_pid, record.shim_start_time) == ("ns", "sb1", 4242, 1234)
    assert record.runtime_handler is None and record.oci is None
    assert record.tasks == ({} if "tasks" not in doc else {"app": TaskRecord(
        "running", 4444, 1250, {**CGROUP, "name": "app"}, "CONTAINER", "/var/log/app.log", None)})
    if doc is SPAWNER_FIRST_RECORD:
        assert (record.pause, record.cgroup, record.netns_path, record.netns_owned) == (None, None, None, False)
    else:
        assert record.pause == PauseRecord(4343, 1240, "builtin") and record.cgroup == CGROUP


def test_keys_a_newer_shim_added_are_ignored(tmp_path) -> None:
    write_doc(tmp_path, {**SPAWNER_FIRST_RECORD, "version": 7, "something_new": {"x": 1}})
    record = read_state(str(tmp_path))
    assert record is not None and record.version == 7 and record.sandbox_id == "sb1"


@pytest.mark.parametrize("change, sentence", [
    ({"shim_pid": "4242"}, "state.json: shim_pid is '4242', not an integer"),
    ({"netns_owned": 1}, "state.json: netns_owned is 1, not true or false"),
    ({"tasks": []}, "state.json: tasks is [], not a map"),
    ({"tasks": {"app": {"pid": True}}}, "state.json task app: pid is True, not an integer"),
    ({"pause": {"start_time": 1}}, "state.json pause: pid is missing"),
])
def test_a_field_of_the_wrong_type_is_refused_naming_it(tmp_path, change, sentence) -> None:
    write_doc(tmp_path, {**BEFORE_OCI, **change})
    with pytest.raises(MalformedRecord) as raised:
        read_state(str(tmp_path))
    assert str(raised.value) == f"{tmp_path / STATE_FILE}: {sentence}"


def test_a_file_that_is_not_a_map_is_not_a_record(tmp_path) -> None:
    write_doc(tmp_path, ["not", "a", "map"])
    with pytest.raises(ValueError, match="does not hold a map"):
        read_state(str(tmp_path))


def test_the_sandbox_new_state_is_the_records() -> None:
    from shim.sandbox.record import STATE_NEW

    assert State.NEW.value == STATE_NEW


# -- podshim delete over records old and new ---------------------------------------------------


@pytest.fixture
def gone_pid() -> int:
    """The pid of a process that has exited and been reaped (recorded with a start time no
    process has, so even a reuse of the pid is never taken for it)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_delete_acts_on_a_record_from_before_the_version_and_rewrites_it_in_this_one(tmp_path, gone_pid) -> None:
    sock = tmp_path / "sock"
    sock.touch()
    doc = {**BEFORE_TASKS, "shim_pid": gone_pid, "shim_start_time": 1, "socket_path": str(sock), "netns_path": None,
           "netns_owned": False, "cgroup": None, "pause": {"pid": gone_pid, "start_time": 1, "binary": "builtin"},
           "exit": {"exit_status": 143, "exited_at": 9}}
    write_doc(tmp_path, doc)
    result = delete_sandbox(str(tmp_path), "ns", "sb1", str(tmp_path))
    assert result == {"exit_status": 143, "exited_at": 9, "pid": gone_pid}
    assert not sock.exists()
    after = read_doc(tmp_path)
    assert after["state"] == "deleted" and after["version"] == STATE_VERSION and after["tasks"] == {}
    assert {k: after[k] for k in doc if k != "state"} == {k: v for k, v in doc.items() if k != "state"}


def test_delete_without_a_record_reports_an_unknown_exit(tmp_path) -> None:
    result = delete_sandbox(str(tmp_path), "ns", "sb1", str(tmp_path))
    assert (result["exit_status"], result["pid"]) == (UNKNOWN_EXIT_STATUS, 0)
    assert not os.path.exists(tmp_path / STATE_FILE)


def test_delete_of_a_malformed_record_exits_1_naming_the_field_and_touches_nothing(tmp_path, capsys) -> None:
    doc = {**BEFORE_OCI, "tasks": {"app": {"status": "running", "pid": "4444"}}}
    write_doc(tmp_path, doc)
    code = cli.main(["delete", "--namespace", "ns", "--id", "sb1", "--bundle", str(tmp_path),
                     "--runtime-root", str(tmp_path)])
    assert code == 1
    assert capsys.readouterr().err == (f"podshim delete: {tmp_path / STATE_FILE}: state.json task app: "
                                       "pid is '4444', not an integer\n")
    assert read_doc(tmp_path) == doc
