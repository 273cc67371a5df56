"""The Controller's proof-of-ownership rule (docs/roots.md): it removes only directories it can
prove a Controller made, refuses a root marked as podshimd's state root, and a read-only
Controller changes nothing at all.

No shim runs here: a spawner that records what it is asked stands in for podshim, and dead
shims are bundles whose bootstrap names a process that is not there (our pid with another start
time).
"""

from __future__ import annotations

import json
import os
import time

import pytest

from shim.rpc.status import FailedPrecondition

from client import layouts
from client.controller import Controller
from client.controller.bundles import make_bundle
from client.controller.results import UNKNOWN_EXIT_STATUS, ExitStatus
from client.controller.spawners import Spawner

NS = "k8s.io"


class Recording(Spawner):
    """Spawns nothing; notes every cleanup it is asked for."""

    def __init__(self) -> None:
        self.deleted: list[str] = []

    async def spawn(self, namespace, sandbox_id, bundle):
        raise AssertionError("these tests spawn no shim")

    async def delete(self, namespace, sandbox_id, bundle):
        self.deleted.append(f"{namespace}/{sandbox_id}")
        return ExitStatus(UNKNOWN_EXIT_STATUS, time.time_ns())


def dead_shims_bootstrap(bundle: str) -> None:
    """The bootstrap.json a shim wrote, naming a process that is gone."""
    with open(os.path.join(bundle, "bootstrap.json"), "w") as f:
        json.dump({"version": 3, "address": f"unix://{bundle}/gone.sock", "protocol": "ttrpc+msgpack",
                   "pid": os.getpid(), "start_time": 1}, f)


def tree(root: str) -> list[str]:
    """Every path under ``root``, relative, sorted."""
    found = []
    for directory, dirs, files in os.walk(root):
        found += [os.path.relpath(os.path.join(directory, n), root) for n in dirs + files]
    return sorted(found)


def podshimd_layout(root: str) -> None:
    """What podshimd keeps in its state root, with one pod whose shim died and one pulled image."""
    for d in ("images/content/blobs/sha256", "images/snapshots/1/fs", "images/.tmp.0a1b2c3d",
              "pod-files/p1", "logs/p1", "pods", "sandboxes/k8s.io/p1"):
        os.makedirs(os.path.join(root, d))
    for f in ("images/content/blobs/sha256/ab12", "images/snapshots/1/fs/bin", "pod-files/p1/hosts", "pods/p1.json"):
        with open(os.path.join(root, f), "w") as out:
            out.write("data")
    dead_shims_bootstrap(os.path.join(root, "sandboxes/k8s.io/p1"))


async def test_a_controller_over_an_unmarked_podshimd_state_root_removes_nothing_and_says_what_it_left(tmp_path,
                                                                                                       caplog) -> None:
    root = str(tmp_path / "state")
    podshimd_layout(root)
    before = tree(root)
    spawner = Recording()
    async with Controller(root, str(tmp_path / "run"), spawner=spawner) as c:
        assert await c.list() == []
        assert sorted(os.path.relpath(p, root) for p in c.unknown) == [
            "images/content", "images/snapshots", "logs/p1", "pod-files/p1", "sandboxes/k8s.io"]
    assert tree(root) == before
    assert spawner.deleted == []
    assert f"leaving {os.path.join(root, 'images', 'content')} alone, unknown" in caplog.text


async def test_a_controller_refuses_a_root_marked_as_podshimds_state_root(tmp_path) -> None:
    root = str(tmp_path / "state")
    podshimd_layout(root)
    layouts.mark(root, layouts.POD_ROOT)
    before = tree(root)
    with pytest.raises(FailedPrecondition) as refused:
        async with Controller(root, str(tmp_path / "run"), spawner=Recording()):
            pass
    assert refused.value.message == (
        f"{root} is podshimd's state root, not a Controller's bundle root ({root}/{layouts.MARKER} says so); it is "
        f"left alone; a Controller opened on it would take podshimd's images and pods for sandboxes. podshimd's "
        f"sandboxes are in {root}/sandboxes (podshimctl --root {root}/sandboxes -n k8s.io)")
    assert tree(root) == before


async def test_a_dead_shims_bundle_a_controller_made_is_cleaned_up_on_load(tmp_path) -> None:
    root = str(tmp_path / "bundles")
    bundle = make_bundle(root, NS, "sb1")
    dead_shims_bootstrap(bundle)
    spawner = Recording()
    async with Controller(root, str(tmp_path / "run"), spawner=spawner) as c:
        [status] = await c.list()
        assert (status.sandbox_id, status.state, c.unknown) == ("sb1", "stopped", {})
        assert spawner.deleted == [f"{NS}/sb1"] and not os.path.exists(bundle)
        await c.shutdown(NS, "sb1")


async def test_an_older_controllers_bundle_without_a_marker_is_still_ours_by_its_bootstrap(tmp_path) -> None:
    root = str(tmp_path / "bundles")
    older = os.path.join(root, NS, "sb1")
    os.makedirs(older)
    dead_shims_bootstrap(older)
    spawner = Recording()
    async with Controller(root, str(tmp_path / "run"), spawner=spawner) as c:
        assert [s.state for s in await c.list()] == ["stopped"]
        assert spawner.deleted == [f"{NS}/sb1"] and not os.path.exists(older)


async def test_a_read_only_controller_reports_a_dead_shim_and_changes_nothing(tmp_path) -> None:
    root = str(tmp_path / "bundles")
    bundle = make_bundle(root, NS, "sb1")
    dead_shims_bootstrap(bundle)
    leftover = os.path.join(root, NS, ".sb2.0a1b2c3d")
    os.makedirs(leftover)
    before = tree(root)
    spawner = Recording()
    async with Controller(root, str(tmp_path / "run"), spawner=spawner, read_only=True) as c:
        [status] = await c.list()
        assert (status.sandbox_id, status.state, status.exit_status) == ("sb1", "stopped", UNKNOWN_EXIT_STATUS)
        assert "read-only" in status.info["cleanup"]
        with pytest.raises(FailedPrecondition, match="opened read-only: it cannot shut a sandbox down"):
            await c.shutdown(NS, "sb1")
        with pytest.raises(FailedPrecondition, match="opened read-only: it cannot create a sandbox"):
            await c.create(NS, "sb3")
    assert tree(root) == before and spawner.deleted == []
