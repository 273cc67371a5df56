"""NSMap: containerd's namespace -> id -> item map, with its errors."""

from __future__ import annotations

import anyio
import pytest

from shim.rpc.status import AlreadyExists, NotFound

from client.controller.nsmap import NSMap


def test_get_returns_what_add_stored() -> None:
    m: NSMap[str] = NSMap()
    m.add("default", "sb1", "one")
    assert m.get("default", "sb1") == "one"


def test_get_of_a_missing_id_or_namespace_is_not_found() -> None:
    m: NSMap[str] = NSMap()
    m.add("default", "sb1", "one")
    with pytest.raises(NotFound):
        m.get("default", "sb2")
    with pytest.raises(NotFound):
        m.get("k8s.io", "sb1")


def test_find_returns_none_when_missing() -> None:
    m: NSMap[str] = NSMap()
    assert m.find("default", "sb1") is None


def test_add_of_a_taken_id_is_already_exists_and_keeps_the_first() -> None:
    m: NSMap[str] = NSMap()
    m.add("default", "sb1", "one")
    with pytest.raises(AlreadyExists):
        m.add("default", "sb1", "two")
    assert m.get("default", "sb1") == "one"


def test_the_same_id_may_live_in_two_namespaces() -> None:
    m: NSMap[str] = NSMap()
    m.add("default", "sb1", "one")
    m.add("k8s.io", "sb1", "two")
    assert (m.get("default", "sb1"), m.get("k8s.io", "sb1")) == ("one", "two")


def test_delete_is_silent_when_missing() -> None:
    m: NSMap[str] = NSMap()
    m.delete("default", "nothing")
    m.add("default", "sb1", "one")
    m.delete("default", "sb1")
    m.delete("default", "sb1")
    assert m.is_empty() and len(m) == 0


def test_delete_with_an_item_spares_a_newer_entry_under_the_same_id() -> None:
    m: NSMap[object] = NSMap()
    old, new = object(), object()
    m.add("default", "sb1", old)
    m.delete("default", "sb1", old)
    m.add("default", "sb1", new)
    m.delete("default", "sb1", old)  # a late cleanup of the old sandbox
    assert m.get("default", "sb1") is new


def test_list_of_one_namespace_all_namespaces_and_an_unknown_one() -> None:
    m: NSMap[str] = NSMap()
    for ns, sid in (("k8s.io", "b"), ("default", "z"), ("default", "a"), ("k8s.io", "a")):
        m.add(ns, sid, f"{ns}/{sid}")
    assert m.list("default") == ["default/a", "default/z"]
    assert m.list() == ["default/a", "default/z", "k8s.io/a", "k8s.io/b"]
    assert m.list("nope") == []
    assert m.namespaces() == ["default", "k8s.io"]
    assert len(m) == 4 and list(m) == m.list()


def test_an_emptied_namespace_disappears() -> None:
    m: NSMap[str] = NSMap()
    m.add("default", "sb1", "one")
    m.delete("default", "sb1")
    assert m.namespaces() == []


async def test_of_many_tasks_adding_one_id_exactly_one_wins() -> None:
    m: NSMap[int] = NSMap()
    outcomes: list[str] = []

    async def add(i: int) -> None:
        await anyio.sleep(0)
        try:
            m.add("default", "sb1", i)
            outcomes.append("added")
        except AlreadyExists:
            outcomes.append("exists")

    async with anyio.create_task_group() as tg:
        for i in range(100):
            tg.start_soon(add, i)
    assert outcomes.count("added") == 1 and outcomes.count("exists") == 99
