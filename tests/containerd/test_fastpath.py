"""The fast path of ``containerd-shim-podshim-v1`` (shim.containerd.fastpath) on its own: the few
msgpack types of its one template call read and written as msgpack itself does, and ``delete``
acting only on the record of a clean ShutdownSandbox, leaving any other to the full path."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading

import msgpack
import pytest

from shim.api.defaults import TEMPLATE_SPAWN_TIMEOUT
from shim.containerd import fastpath
from shim.containerd.api import load
from shim.containerd.bootstrap import bootstrap_params
from shim.lib.processes import proc_start_time

from support.shimtools import new_id

task_v2_pb2 = load("runtime.task.v2.shim_pb2")


@pytest.mark.parametrize("value", [
    None, True, False, 0, 1, 127, 128, 255, 256, 65535, 65536, 1 << 40, -1, -32, -33, -200, -(1 << 40), "", "a",
    "é" * 40, "x" * 300, "y" * 70000, b"", b"\x00" * 300, [], [1, "two", None], list(range(20)), {},
    {"address": "unix:///run/podshim/s/ab", "pid": 4242, "start_time": 1 << 33, "protocol": "ttrpc+msgpack"},
    {f"k{i}": {"nested": [i]} for i in range(20)},
])
def test_what_msgpack_packs_unpacks_to_the_same_value(value) -> None:
    data = msgpack.packb(value, use_bin_type=True)
    assert fastpath._unpack(data, 0) == (value, len(data))


@pytest.mark.parametrize("value", [
    {"service": "podshim.template.v1.Template", "method": "Spawn", "timeout_nano": 9_000_000_000,
     "payload": {"namespace": "k8s.io", "debug": False, "sandbox_id": "é" * 10}}, {}, {"small": 5, "flag": True},
])
def test_what_it_packs_msgpack_unpacks_to_the_same_value(value) -> None:
    assert msgpack.unpackb(fastpath._pack(value), raw=False) == value


@pytest.mark.parametrize("data", [b"", b"\x92\x01", b"\xa5abc", b"\xcb" + b"\x00" * 8, b"\xd4\x01\x02", b"\xc1"])
def test_msgpack_it_cannot_read_is_a_value_error(data) -> None:
    with pytest.raises(ValueError):
        fastpath._unpack(data, 0)


@pytest.mark.parametrize("data", [b"\x0a\x05ab", b"\x0a", b"\x08\x80", b"\x0b", b"\x0a\x02\xff\xfe", b"\x08\x01"])
def test_bootstrap_params_that_are_not_protobuf_strings_are_a_value_error(data) -> None:
    with pytest.raises(ValueError):
        bootstrap_params(data)


def shutdown_record(bundle, **changes) -> dict:
    """The state.json of a shim that finished a ShutdownSandbox (as tests/containerd saw one), whose
    shim is this test's own process recorded with another start time (so never signalled)."""
    socket = bundle / "sock"
    socket.write_bytes(b"")
    record = {"cgroup": None, "created_at": 1, "exit": {"exit_status": 137, "exited_at": 1_700_000_000_123_456_789},
              "namespace": "k8s.io", "netns_owned": False, "netns_path": None, "oci": None,
              "pause": {"binary": "/usr/bin/catatonit", "pid": 4321, "start_time": 7}, "rootfs": "",
              "runtime_handler": "native", "sandbox_id": "sb1", "shim_pid": os.getpid(),
              "shim_start_time": (proc_start_time(os.getpid()) or 0) + 1, "socket_path": str(socket), "state": "shutdown",
              "tasks": {}, "version": 1, **changes}
    (bundle / "state.json").write_text(json.dumps(record, sort_keys=True) + "\n")
    return record


def test_delete_after_a_clean_shutdown_reports_the_pause_exit_and_removes_the_socket(tmp_path) -> None:
    shutdown_record(tmp_path)
    response = task_v2_pb2.DeleteResponse.FromString(fastpath.delete("k8s.io", "sb1", str(tmp_path)))
    assert (response.pid, response.exit_status) == (4321, 137)
    assert (response.exited_at.seconds, response.exited_at.nanos) == (1_700_000_000, 123_456_789)
    assert not (tmp_path / "sock").exists()
    assert json.loads((tmp_path / "state.json").read_text())["state"] == "deleted"
    assert sorted(os.listdir(tmp_path)) == ["delete.lock", "state.json"]  # no temporary file left


@pytest.mark.parametrize("changes", [
    {"state": "stopped"}, {"state": "deleted"}, {"tasks": {"c1": {}}}, {"cgroup": {"path": "/sys/fs/cgroup/x"}},
    {"netns_owned": True, "netns_path": "/run/netns/x"}, {"oci": {"runtime": "runc"}}, {"rootfs": "/b/rootfs"},
    {"exit": None}, {"version": 2}, {"sandbox_id": "sb2"}, {"namespace": "default"}, {"shim_pid": "1"},
])
def test_delete_leaves_any_other_record_to_the_full_path_untouched(tmp_path, changes) -> None:
    record = shutdown_record(tmp_path, **changes)
    before = (tmp_path / "state.json").read_bytes()
    assert fastpath.delete("k8s.io", "sb1", str(tmp_path)) is None
    assert (tmp_path / "state.json").read_bytes() == before and json.loads(before) == record
    assert (tmp_path / "sock").exists()


def test_delete_kills_the_shim_it_names_by_pid_and_start_time(tmp_path) -> None:
    shim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        shutdown_record(tmp_path, shim_pid=shim.pid, shim_start_time=proc_start_time(shim.pid))
        assert fastpath.delete("k8s.io", "sb1", str(tmp_path)) is not None
        assert shim.wait(5) == -9
    finally:
        shim.kill()
        shim.wait()


def test_start_without_a_template_is_left_to_the_full_path(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PODSHIM_RUNTIME_ROOT", str(tmp_path))
    monkeypatch.setenv("TTRPC_ADDRESS", str(tmp_path / "ttrpc.sock"))
    assert fastpath.start({"namespace": "k8s.io", "id": new_id()}, b"", str(tmp_path / "podshim")) is None


def test_warming_makes_every_request_class_the_shims_serve_and_leaves_no_file(tmp_path, monkeypatch):
    # A shim template warms containerd's services before it forks shims for containerd, so that the
    # descriptors and classes the shims' services use are the template's, shared, not each shim's own.
    from shim.containerd import services

    monkeypatch.setattr(services, "_REQUEST_TYPES", {})
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    made_files = []
    real_mkdtemp = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *a, **k: made_files.append(real_mkdtemp(*a, **k)) or made_files[-1])
    services.warm()
    assert made_files and all(path.startswith(str(tmp_path)) for path in made_files)  # the pod files were written
    assert os.listdir(tmp_path) == []
    made = services._REQUEST_TYPES
    assert {name for name, _ in made[services.SANDBOX_SERVICE]} >= {"CreateSandbox", "StartSandbox", "SandboxStatus"}
    assert dict(made[services.TASK_SERVICE])["Create"] is services.task_pb2.CreateTaskRequest
    assert services._request_types(services.TASK_SERVICE, services.task_pb2) is made[services.TASK_SERVICE]


@contextlib.contextmanager
def template_answering(path: str, spawn):
    """A server of the template's service at ``path`` (shim.rpc.blocking, as the template serves it),
    whose Spawn is ``spawn``; the requests it got."""
    from shim.api.names import TEMPLATE_SERVICE
    from shim.rpc.blocking import serve_connection

    got: list = []

    def handler(request):
        got.append(request)
        return spawn(request)

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()

    def serve() -> None:
        conn, _ = listener.accept()
        serve_connection(conn, {(TEMPLATE_SERVICE, "Spawn"): handler}, allowed_uids={os.getuid()})

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield got
    finally:
        thread.join(10)
        listener.close()


def test_start_asks_the_template_in_its_own_protocol_and_prints_the_address_it_answers(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PODSHIM_RUNTIME_ROOT", str(tmp_path))
    monkeypatch.delenv("PODSHIM_TEMPLATE_SOCKET", raising=False)
    monkeypatch.setenv("PODSHIM_PAUSE_BINARY", "/usr/bin/catatonit")
    params = load("runtime.bootstrap.v1.bootstrap_pb2").BootstrapParams(
        instance_id="sb1", namespace="k8s.io", containerd_ttrpc_address="/run/c.sock.ttrpc")
    address = "unix://" + "/run/podshim/s/" + "é" * 40
    with template_answering(str(tmp_path / "template.sock"),
                            lambda request: {"version": 3, "address": address, "protocol": "ttrpc+msgpack",
                                             "pid": 1 << 22, "start_time": 1 << 40}) as got:
        out = fastpath.start({"debug": True}, params.SerializeToString(), "/b/podshim")
    result = load("runtime.bootstrap.v1.bootstrap_pb2").BootstrapResult.FromString(out)
    assert (result.version, result.address, result.protocol) == (3, address, "ttrpc")
    (request,) = got
    assert request.payload == {"namespace": "k8s.io", "sandbox_id": "sb1", "bundle": "/b/podshim",
                               "runtime_root": str(tmp_path), "debug": True, "containerd_address": "/run/c.sock.ttrpc",
                               "pause_binary": "/usr/bin/catatonit"}
    assert 0 < request.timeout_nano <= TEMPLATE_SPAWN_TIMEOUT * 1e9


def test_start_leaves_a_template_that_refuses_to_the_full_path(tmp_path, monkeypatch) -> None:
    from shim.rpc.status import FailedPrecondition

    def refuse(request):
        raise FailedPrecondition("the installed podshim changed since this template started")

    monkeypatch.setenv("PODSHIM_RUNTIME_ROOT", str(tmp_path))
    monkeypatch.setenv("TTRPC_ADDRESS", "/run/c.sock.ttrpc")
    monkeypatch.delenv("PODSHIM_TEMPLATE_SOCKET", raising=False)
    with template_answering(str(tmp_path / "template.sock"), refuse) as got:
        assert fastpath.start({"namespace": "k8s.io", "id": "sb1"}, b"", "/b/podshim") is None
    assert len(got) == 1
