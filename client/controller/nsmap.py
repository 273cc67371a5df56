"""NSMap: namespace -> sandbox id -> item, the Controller's index of its shims (containerd's NSMap).

Every method is synchronous and does no I/O, so on one event loop each call is atomic: two
tasks that ``add`` the same id cannot both succeed. Not for use from several threads.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator
from typing import Generic, TypeVar

from shim.rpc.status import AlreadyExists, NotFound

__all__ = ["NSMap"]

T = TypeVar("T")


class NSMap(Generic[T]):
    """A two-level map with containerd's errors: NotFound on a miss, AlreadyExists on a duplicate."""

    def __init__(self) -> None:
        self._spaces: dict[str, dict[str, T]] = {}

    def get(self, namespace: str, sandbox_id: str) -> T:
        """The item for ``namespace``/``sandbox_id``; raises NotFound."""
        try:
            return self._spaces[namespace][sandbox_id]
        except KeyError:
            raise NotFound(f"sandbox {sandbox_id} not found in namespace {namespace}") from None

    def find(self, namespace: str, sandbox_id: str) -> T | None:
        """The item, or None."""
        return self._spaces.get(namespace, {}).get(sandbox_id)

    def add(self, namespace: str, sandbox_id: str, item: T) -> None:
        """Add an item; raises AlreadyExists if the id is taken in that namespace."""
        space = self._spaces.setdefault(namespace, {})
        if sandbox_id in space:
            raise AlreadyExists(f"sandbox {sandbox_id} already exists in namespace {namespace}")
        space[sandbox_id] = item

    def delete(self, namespace: str, sandbox_id: str, item: T | None = None) -> None:
        """Remove an entry; silent when it is missing.

        With ``item``, remove only if the entry is that very item: a late cleanup of an old
        sandbox must not drop a new one created since under the same id.
        """
        space = self._spaces.get(namespace)
        if space is None or sandbox_id not in space:
            return
        if item is not None and space[sandbox_id] is not item:
            return
        del space[sandbox_id]
        if not space:
            del self._spaces[namespace]

    def list(self, namespace: str | None = None) -> list[T]:
        """The items of one namespace (empty if unknown), or of all when ``namespace`` is None,
        sorted by namespace then id."""
        if namespace is not None:
            space = self._spaces.get(namespace, {})
            return [space[k] for k in sorted(space)]
        return [self._spaces[ns][k] for ns in sorted(self._spaces) for k in sorted(self._spaces[ns])]

    def namespaces(self) -> builtins.list[str]:
        """The namespaces that hold at least one item, sorted."""
        return sorted(self._spaces)

    def __len__(self) -> int:
        return sum(len(space) for space in self._spaces.values())

    def __iter__(self) -> Iterator[T]:
        return iter(self.list())

    def is_empty(self) -> bool:
        return not self._spaces
