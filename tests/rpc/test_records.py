"""shim.rpc.records: a Record behaves as the frozen dataclass it replaces, and every record in
the shim keeps its schema in one place (``__init__`` takes exactly its ``__slots__``, in order)."""

from __future__ import annotations

import copy
import importlib
import inspect
import pickle
import pkgutil

import pytest

import shim
from shim.rpc.records import Record, set_field


class Point(Record):
    __slots__ = ("x", "y", "tags")
    x: int
    y: int
    tags: tuple[str, ...]

    def __init__(self, x: int, y: int = 0, tags: tuple[str, ...] = ()) -> None:
        set_field(self, "x", x)
        set_field(self, "y", y)
        set_field(self, "tags", tags)


class Other(Record):
    __slots__ = ("x", "y", "tags")

    def __init__(self, x: int, y: int = 0, tags: tuple[str, ...] = ()) -> None:
        set_field(self, "x", x)
        set_field(self, "y", y)
        set_field(self, "tags", tags)


class Counter(Record):
    __slots__ = ("name", "count")
    mutable = True

    def __init__(self, name: str, count: int = 0) -> None:
        self.name = name
        self.count = count


def test_repr_names_the_fields_in_order() -> None:
    assert repr(Point(1, 2, ("a",))) == "Point(x=1, y=2, tags=('a',))"


def test_equal_when_same_class_and_fields() -> None:
    assert Point(1, 2) == Point(1, y=2)
    assert Point(1, 2) != Point(2, 1)
    assert Point(1, 2) != Other(1, 2)
    assert Point(1) != (1, 0, ())


def test_frozen_record_is_hashable_by_its_fields() -> None:
    assert hash(Point(1, 2)) == hash(Point(1, 2))
    assert len({Point(1, 2), Point(1, 2), Point(3)}) == 2


def test_frozen_record_refuses_assignment_and_deletion() -> None:
    p = Point(1)
    with pytest.raises(AttributeError, match="cannot assign to field 'x'"):
        p.x = 2
    with pytest.raises(AttributeError, match="cannot delete field 'y'"):
        del p.y
    with pytest.raises(AttributeError):
        p.extra = 1  # no __dict__ either
    assert p == Point(1)


def test_mutable_record_allows_assignment_and_has_no_hash() -> None:
    c = Counter("a")
    c.count += 1
    assert c == Counter("a", 1)
    assert Counter.__hash__ is None
    with pytest.raises(TypeError):
        hash(c)


def test_replace_makes_a_copy_with_changes() -> None:
    p = Point(1, 2, ("a",))
    assert p.replace(y=5) == Point(1, 5, ("a",))
    assert p == Point(1, 2, ("a",))
    with pytest.raises(TypeError, match="Point has no field 'z'"):
        p.replace(z=1)


def test_asdict_is_shallow() -> None:
    tags = ("a",)
    assert Point(1, 2, tags).asdict() == {"x": 1, "y": 2, "tags": tags}
    assert Point(1, 2, tags).asdict()["tags"] is tags


@pytest.mark.parametrize("clone", [copy.copy, copy.deepcopy, lambda r: pickle.loads(pickle.dumps(r))],
                         ids=["copy", "deepcopy", "pickle"])
def test_copy_and_pickle_rebuild_through_init(clone) -> None:
    assert clone(Point(1, 2, ("a",))) == Point(1, 2, ("a",))
    assert clone(Counter("a", 3)) == Counter("a", 3)


def _all_records() -> list[type[Record]]:
    for info in pkgutil.walk_packages(shim.__path__, "shim."):
        if not info.name.endswith(".__main__"):  # that one runs the program
            importlib.import_module(info.name)
    found, todo = [], list(Record.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__.startswith("shim."):
            found.append(cls)
    return sorted(found, key=lambda c: f"{c.__module__}.{c.__qualname__}")


@pytest.mark.parametrize("cls", _all_records(), ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_every_record_takes_exactly_its_slots_in_order(cls) -> None:
    params = list(inspect.signature(cls.__init__).parameters)
    assert params[0] == "self"
    assert tuple(params[1:]) == cls.__slots__, f"{cls.__qualname__}.__init__ must take its __slots__, in order"
    assert "__dict__" not in dir(cls), f"{cls.__qualname__} must define __slots__"
