"""A read-only mapping for frozen specs.

A frozen dataclass that holds a dict is frozen only on the surface: its dict
can still be changed in place, and it cannot be hashed. `FrozenMap` is the
mapping frozen specs hold instead (a plan's parallelism by role, a workload's
models by role, a profile entry's parameters): no item assignment, hashable
when its values are, equal to any mapping with the same items, and picklable
(Ray ships specs to its workers).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class FrozenMap(Mapping[K, V]):
    """An immutable mapping; `FrozenMap(m)` copies `m` (a mapping or key-value pairs)."""

    __slots__ = ("_data", "_hash")
    _data: dict[K, V]
    _hash: int | None

    def __init__(self, items: Mapping[K, V] | Any = ()) -> None:
        object.__setattr__(self, "_data", dict(items))
        object.__setattr__(self, "_hash", None)

    def __getitem__(self, key: K) -> V:
        return self._data[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __hash__(self) -> int:
        if self._hash is None:
            object.__setattr__(self, "_hash", hash(frozenset(self._data.items())))
        assert self._hash is not None
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self._data == dict(other.items())
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"

    def __reduce__(self) -> tuple[type[FrozenMap[K, V]], tuple[dict[K, V]]]:
        return (type(self), (self._data,))


def frozen(items: Mapping[K, V]) -> FrozenMap[K, V]:
    """`items` as a FrozenMap (itself when it already is one)."""
    return items if isinstance(items, FrozenMap) else FrozenMap(items)
