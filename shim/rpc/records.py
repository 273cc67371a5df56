"""Frozen records without ``@dataclass``: the base of the small value classes a shim loads to start.

``@dataclass`` writes each class's ``__init__``, ``__repr__``, ``__eq__``, ``__hash__`` and frozen
``__setattr__``/``__delattr__`` as source text and compiles it, in every process that imports the
class, a cost paid again for each of the records a shim loads to start, which must be quick
(``podshim start`` answers within a bound: docs/benchmarks.md). A :class:`Record`
subclass names its fields once in ``__slots__`` and writes its ``__init__`` out; everything else
comes from here, generic over ``__slots__``, so nothing is compiled at import. It behaves as the
frozen dataclass it replaces: fields in ``__slots__`` order are its repr (``Name(a=1, b='x')``), its
equality (same class, equal fields) and its hash; assigning or deleting a field raises
AttributeError (dataclasses' FrozenInstanceError is one); :meth:`replace` is
``dataclasses.replace``, :meth:`asdict` a shallow ``dataclasses.asdict``; copy and pickle rebuild
it through ``__init__``.

The rule that keeps the schema in one place: ``__init__`` takes exactly the fields of
``__slots__``, in that order, and stores each (tests/rpc/test_records.py checks every subclass's
signature): with :data:`set_field` in a frozen record, by plain assignment in a mutable one. A
mutable record sets ``mutable = True``: assignment is then allowed and it has no hash (as a
dataclass with ``eq`` and without ``frozen``).
"""

from __future__ import annotations

from typing import Any, TypeVar

__all__ = ["Record", "set_field"]

R = TypeVar("R", bound="Record")

#: How a record's ``__init__`` stores a field (``setattr`` refuses on a frozen record).
set_field = object.__setattr__


class Record:
    """Base of a value class whose fields are its ``__slots__`` (see the module's docstring)."""

    __slots__: tuple[str, ...] = ()
    #: Whether fields may be assigned after ``__init__`` (False: a frozen record, hashable).
    mutable = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.mutable:
            cls.__setattr__ = object.__setattr__  # type: ignore[assignment,method-assign]
            cls.__delattr__ = object.__delattr__  # type: ignore[method-assign]
            cls.__hash__ = None  # type: ignore[assignment]

    def __init__(self) -> None:  # a record without fields
        pass

    def _values(self) -> tuple[Any, ...]:
        return tuple([getattr(self, name) for name in self.__slots__])

    def __repr__(self) -> str:
        fields = ", ".join([f"{name}={getattr(self, name)!r}" for name in self.__slots__])
        return f"{type(self).__qualname__}({fields})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), self._values()

    def replace(self: R, **changes: Any) -> R:
        """A copy with ``changes`` (field name to value); TypeError naming an unknown field."""
        for name in changes:
            if name not in self.__slots__:
                raise TypeError(f"{type(self).__qualname__} has no field {name!r}")
        return type(self)(*[changes[name] if name in changes else getattr(self, name) for name in self.__slots__])

    def asdict(self) -> dict[str, Any]:
        """The fields as a dict (shallow: a field's value is not converted or copied)."""
        return {name: getattr(self, name) for name in self.__slots__}
