"""What a reconciler remembers of each cluster from one reconcile to the next (the Warning last posted, a
request already put to Patroni, a reader in flight …), held in one kind of store so the framework can
drop all of it when the cluster goes.

A reconciler declares each piece of per-cluster memory as a `ClusterMemory` attribute (never a plain
dict keyed by cluster). `RemembersClusters.forget(key)` drops the cluster's value from every such
attribute, and from those of the `RemembersClusters` objects it holds (a shared helper such as
`events.OncePerMessage`), running each store's `on_forget` (cancel a task, remove a metric series).
The cluster reconciler calls it for every sub-reconciler when a cluster is gone or going; no
sub-reconciler writes a `forget` of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")
ClusterKey = tuple[str, str]  # (namespace, name)


class ClusterMemory(Generic[T]):
    """One value per cluster. `default` makes the value on first use (`of`); `on_forget` runs with the
    value when the framework drops it because the cluster is gone."""

    def __init__(
        self,
        default: Callable[[], T] | None = None,
        *,
        on_forget: Callable[[ClusterKey, T], None] | None = None,
    ) -> None:
        self._default = default
        self._on_forget = on_forget
        self._values: dict[ClusterKey, T] = {}

    def of(self, key: ClusterKey) -> T:
        """The cluster's value, made by `default` when there is none yet."""
        if key not in self._values:
            if self._default is None:
                raise KeyError(key)
            self._values[key] = self._default()
        return self._values[key]

    def get(self, key: ClusterKey) -> T | None:
        return self._values.get(key)

    def set(self, key: ClusterKey, value: T) -> None:
        self._values[key] = value

    def drop(self, key: ClusterKey) -> T | None:
        """Drop the cluster's value while the cluster lives on (a problem cleared): no `on_forget`."""
        return self._values.pop(key, None)

    def forget(self, key: ClusterKey) -> None:
        """The cluster is gone: drop its value and let `on_forget` release what it held."""
        value = self._values.pop(key, None)
        if value is not None and self._on_forget is not None:
            self._on_forget(key, value)

    def keys(self) -> list[ClusterKey]:
        return list(self._values)

    def values(self) -> list[T]:
        return list(self._values.values())

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def __len__(self) -> int:
        return len(self._values)


class RemembersClusters:
    """Base of a reconciler (or a helper it holds) with per-cluster memory in `ClusterMemory` attributes.
    `forget` is the framework's; subclasses declare stores, they do not override it (a unit test checks
    the sub-reconcilers)."""

    def memories(self) -> Iterator[ClusterMemory[Any]]:
        """Every store this object holds, and those of the `RemembersClusters` objects it holds."""
        seen: set[int] = set()
        todo: list[object] = [self]
        while todo:
            holder = todo.pop()
            if id(holder) in seen:
                continue
            seen.add(id(holder))
            for value in vars(holder).values():
                if isinstance(value, ClusterMemory):
                    if id(value) not in seen:
                        seen.add(id(value))
                        yield value
                elif isinstance(value, RemembersClusters):
                    todo.append(value)

    def forget(self, key: ClusterKey) -> None:
        """The cluster is gone: drop what is remembered of it, everywhere in this object."""
        for memory in self.memories():
            memory.forget(key)
