"""Immutable value objects without ``dataclasses``, for the delete path's start-up.

``import dataclasses`` pulls in ``inspect`` (~6 ms) and every decorated class
costs ~1 ms of generated code: together a third of a clean delete's time on
containerd's critical path. A ``Value`` is a frozen slots class whose typed
``__init__`` ends with ``self._init(locals())``; it compares, hashes, prints
and copies with changes (``replace``) like a frozen dataclass.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Self


class Value:
    __slots__: tuple[str, ...] = ()
    #: Slots that take part in ==, hash and repr (default: all of them).
    _compared: tuple[str, ...] | None = None

    def _init(self, values: Mapping[str, object]) -> None:
        for name in self.__slots__:
            object.__setattr__(self, name, values[name])

    def _key(self) -> tuple[object, ...]:
        return tuple(getattr(self, n) for n in self._compared or self.__slots__)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable: cannot set {name}")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(tuple(repr(v) if isinstance(v, dict | list) else v for v in self._key()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in self._compared or self.__slots__)
        return f"{type(self).__name__}({inner})"

    def as_dict(self) -> dict[str, object]:
        return {n: getattr(self, n) for n in self.__slots__}

    def replace(self, **changes: object) -> Self:
        """A copy with ``changes`` (dataclasses.replace)."""
        unknown = set(changes) - set(self.__slots__)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {sorted(unknown)[0]!r}")
        copy = object.__new__(type(self))
        for name in self.__slots__:
            object.__setattr__(copy, name, changes.get(name, getattr(self, name)))
        return copy
