"""One tiny registry helper used by every pluggable family in hybridflow.

Advantage estimators, policy losses, reward managers, rollout engines, tools and agent
loops all need the same three things: register a callable under a name with a decorator,
look it up by name, and fail with a message that lists what *is* available (and the
closest spelling) when the name is wrong.  verl hand-rolls ~13 variants of this; we keep one.
"""

from __future__ import annotations

import difflib
from typing import Any, Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A named mapping ``name -> object`` filled by decorators.

    ``kind`` is the human name used in error messages ("advantage estimator", "policy loss").
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str | Any, obj: T | None = None, *, override: bool = False):
        """Register ``obj`` under ``name``; usable as ``@reg.register("x")`` or ``reg.register("x", f)``.

        Enum members are accepted as names (their ``.value`` is used), as verl allows.
        Re-registering the same name with a different object is an error unless ``override``.
        """
        key = getattr(name, "value", name)
        if not isinstance(key, str):
            raise TypeError(f"{self.kind} name must be a string, got {type(name).__name__}")

        def deco(fn: T) -> T:
            existing = self._items.get(key)
            if existing is not None and existing is not fn and not override:
                raise ValueError(
                    f"{self.kind} '{key}' is already registered ({_describe(existing)}); "
                    f"pass override=True to replace it"
                )
            self._items[key] = fn
            return fn

        return deco(obj) if obj is not None else deco

    def get(self, name: str | Any) -> T:
        key = getattr(name, "value", name)
        try:
            return self._items[key]
        except KeyError:
            raise KeyError(self.unknown_message(key)) from None

    def unknown_message(self, key: Any) -> str:
        known = sorted(self._items)
        close = difflib.get_close_matches(str(key), known, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        return f"Unknown {self.kind} '{key}'.{hint} Available: {', '.join(known)}."

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return getattr(name, "value", name) in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def items(self):
        return self._items.items()


def _describe(obj: Any) -> str:
    mod = getattr(obj, "__module__", "?")
    name = getattr(obj, "__qualname__", repr(obj))
    return f"{mod}.{name}"


def closest(name: str, candidates: list[str] | tuple[str, ...]) -> str | None:
    """Closest spelling of ``name`` among ``candidates`` (None when nothing is close)."""
    found = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.5)
    return found[0] if found else None


class MissingAttributeError(AttributeError, ValueError):
    """A ``package.module.Name`` path whose module has no ``Name`` (an ``AttributeError``, as verl's loaders
    raise, and a ``ValueError`` as hybridflow's config errors)."""


__all__ = ["MissingAttributeError", "Registry", "closest"]
