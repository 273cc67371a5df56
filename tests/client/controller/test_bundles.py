"""client.controller.bundles: bundles are made under the state root, never through a symbolic link, and a
Controller removes only what it can prove it made (the proof-of-ownership rule, docs/roots.md)."""

from __future__ import annotations

import os
import stat

import pytest

from client import layouts
from client.controller.bundles import made_here, make_bundle, scan


@pytest.fixture
def roots(tmp_path):
    """(state root, a directory outside it), both empty."""
    state_root, outside = tmp_path / "state", tmp_path / "outside"
    state_root.mkdir()
    outside.mkdir(mode=0o755)
    os.chmod(outside, 0o755)
    return str(state_root), str(outside)


def test_a_bundle_is_0700_under_0711_parents(roots) -> None:
    state_root, _ = roots
    path = make_bundle(state_root, "k8s.io", "sb1")
    assert path == os.path.join(state_root, "k8s.io", "sb1")
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(os.path.dirname(path)).st_mode) == 0o711
    assert scan(state_root) == [("k8s.io", "sb1", path)]


def test_a_symlinked_namespace_directory_is_refused_and_nothing_is_made_outside_the_root(roots):
    state_root, outside = roots
    os.symlink(outside, os.path.join(state_root, "k8s.io"))
    with pytest.raises(OSError, match="symbolic link") as caught:
        make_bundle(state_root, "k8s.io", "sb1")
    assert os.path.join(state_root, "k8s.io") in caught.value.strerror
    assert os.listdir(outside) == [] and stat.S_IMODE(os.stat(outside).st_mode) == 0o755


def test_a_bundle_behind_a_symlinked_namespace_directory_is_not_listed(roots, caplog) -> None:
    state_root, outside = roots
    os.mkdir(os.path.join(outside, "sb1"))
    os.symlink(outside, os.path.join(state_root, "k8s.io"))
    assert scan(state_root) == []
    assert scan(state_root, "k8s.io") == []
    assert "symbolic link" in caplog.text


def test_a_bundle_is_born_locked_and_a_second_of_the_same_id_already_exists(roots) -> None:
    from shim.rpc.status import AlreadyExists

    from client.controller.bundles import BundleLock

    state_root, _ = roots
    path = os.path.join(state_root, "k8s.io", "sb1")
    ours = BundleLock(path)
    assert make_bundle(state_root, "k8s.io", "sb1", lock=ours) == path
    try:
        assert ours.held and not BundleLock(path).try_acquire()  # another process sees it being made
        with pytest.raises(AlreadyExists):
            make_bundle(state_root, "k8s.io", "sb1")
    finally:
        ours.release()
    assert os.listdir(os.path.dirname(path)) == ["sb1"]  # no hidden name left behind


def test_a_scan_removes_a_hidden_leftover_but_not_one_being_made(roots) -> None:
    from client.controller.bundles import BundleLock

    state_root, _ = roots
    layouts.mark(state_root, layouts.BUNDLE_ROOT)
    namespace = os.path.join(state_root, "k8s.io")
    os.makedirs(os.path.join(namespace, ".sb1.0a1b2c3d"))
    os.makedirs(os.path.join(namespace, ".sb2.4e5f6071"))
    busy = BundleLock(os.path.join(namespace, ".sb2.4e5f6071"))
    assert busy.try_acquire()
    try:
        assert scan(state_root) == []
        assert os.listdir(namespace) == [".sb2.4e5f6071"]
    finally:
        busy.release()


def test_a_bundle_made_here_carries_its_marker_and_marks_the_root(roots) -> None:
    state_root, _ = roots
    path = make_bundle(state_root, "k8s.io", "sb1")
    assert layouts.marked_as(state_root) == layouts.BUNDLE_ROOT
    assert layouts.marked_as(path) == layouts.BUNDLE
    assert made_here(path)


def test_a_bundle_of_an_older_controller_is_proved_by_its_shims_bootstrap(roots) -> None:
    state_root, _ = roots
    older = os.path.join(state_root, "k8s.io", "sb1")
    os.makedirs(older)
    _write_json(os.path.join(older, "bootstrap.json"),
                {"version": 3, "address": "unix:///run/podshim/s/ab", "protocol": "ttrpc+msgpack", "pid": 1})
    assert made_here(older)


@pytest.mark.parametrize("content", [
    None,                                                           # nothing at all
    {"version": 3, "address": "unix:///x", "protocol": "grpc"},    # another program's bootstrap.json
    "{not json",
    {"layers": []},
])
def test_a_directory_nothing_proves_a_controller_made_is_not_ours(roots, content) -> None:
    state_root, _ = roots
    foreign = os.path.join(state_root, "images", "content")
    os.makedirs(foreign)
    if isinstance(content, str):
        with open(os.path.join(foreign, "bootstrap.json"), "w") as f:
            f.write(content)
    elif content is not None:
        _write_json(os.path.join(foreign, "bootstrap.json"), content)
    assert not made_here(foreign)


def test_a_marker_of_another_layout_proves_nothing(roots) -> None:
    state_root, _ = roots
    other = os.path.join(state_root, "ns", "sb1")
    os.makedirs(other)
    layouts.mark(other, layouts.POD_ROOT)
    assert not made_here(other)
    os.symlink(os.path.join(other, layouts.MARKER), os.path.join(state_root, "ns", layouts.MARKER))
    assert not made_here(os.path.join(state_root, "ns"))  # a link is never followed


def test_a_scan_of_an_unmarked_root_removes_no_hidden_directory_that_proves_nothing(roots, caplog) -> None:
    state_root, _ = roots
    namespace = os.path.join(state_root, "images")
    theirs = os.path.join(namespace, ".tmp.0a1b2c3d")  # named like our leftover, made by someone else
    os.makedirs(os.path.join(theirs, "blob"))
    ours = os.path.join(namespace, ".sb1.4e5f6071")
    os.makedirs(ours)
    layouts.mark(ours, layouts.BUNDLE)
    assert scan(state_root) == []
    assert os.listdir(namespace) == [".tmp.0a1b2c3d"]
    assert "leaving" in caplog.text and theirs in caplog.text
    assert scan(state_root, clean=False) == [] and os.path.isdir(theirs)


def test_a_scan_that_does_not_clean_removes_nothing(roots) -> None:
    state_root, _ = roots
    layouts.mark(state_root, layouts.BUNDLE_ROOT)
    leftover = os.path.join(state_root, "k8s.io", ".sb1.0a1b2c3d")
    os.makedirs(leftover)
    assert scan(state_root, clean=False) == []
    assert os.path.isdir(leftover)


def test_a_bundle_root_marked_as_podshimds_state_root_is_refused_and_left_as_it_is(roots) -> None:
    from shim.rpc.status import FailedPrecondition

    state_root, _ = roots
    layouts.mark(state_root, layouts.POD_ROOT)
    with pytest.raises(FailedPrecondition, match="podshimd's state root") as caught:
        make_bundle(state_root, "k8s.io", "sb1")
    assert os.path.join(state_root, "sandboxes") in caught.value.message
    assert os.listdir(state_root) == [layouts.MARKER]


def _write_json(path, doc) -> None:
    import json

    with open(path, "w") as f:
        json.dump(doc, f)


def test_the_shims_process_comes_from_the_bootstrap_or_an_older_ones_state_json(tmp_path, sleeper):
    from shim.lib.processes import proc_start_time

    from client.controller.bundles import ShimProcess, read_bootstrap, read_shim_process

    pid, start = sleeper.pid, proc_start_time(sleeper.pid)
    boot = {"version": 3, "address": "unix:///run/x.sock", "protocol": "ttrpc+msgpack", "pid": pid}
    _write_json(tmp_path / "bootstrap.json", {**boot, "start_time": start})
    assert read_shim_process(str(tmp_path), read_bootstrap(str(tmp_path))) == ShimProcess(pid, start)
    # An older shim wrote no start_time: state.json's, when it names the same pid...
    _write_json(tmp_path / "bootstrap.json", boot)
    _write_json(tmp_path / "state.json", {"shim_pid": pid, "shim_start_time": start})
    old = read_bootstrap(str(tmp_path))
    assert old.start_time is None and read_shim_process(str(tmp_path), old) == ShimProcess(pid, start)
    assert read_shim_process(str(tmp_path), old).alive()
    # ...else the pid alone; and with no pid in the bootstrap (a socket unit's), state.json's.
    _write_json(tmp_path / "state.json", {"shim_pid": pid + 1, "shim_start_time": start})
    assert read_shim_process(str(tmp_path), old) == ShimProcess(pid, None)
    _write_json(tmp_path / "bootstrap.json", {**boot, "pid": 0})
    assert read_shim_process(str(tmp_path), read_bootstrap(str(tmp_path))) == ShimProcess(pid + 1, start)
    os.unlink(tmp_path / "state.json")
    assert read_shim_process(str(tmp_path), read_bootstrap(str(tmp_path))) is None


def test_a_process_with_another_start_time_is_not_the_shim(sleeper):
    from shim.lib.processes import proc_start_time

    from client.controller.bundles import ShimProcess

    assert not ShimProcess(sleeper.pid, proc_start_time(sleeper.pid) + 1).alive()
    assert ShimProcess(sleeper.pid, proc_start_time(sleeper.pid) + 1).open_pidfd() is None
