"""Registries of policies by name, one per axis (ordering, placement, admission, backfill, preemption).

A registry maps a name to a factory; an unknown name raises ``UnknownNameError`` listing the known ones. The core
looks policies up here and never branches on a policy's name.
"""
from __future__ import annotations

from typing import Callable, Dict, Generic, List, TypeVar

from raylane.errors import UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, default: str):
        self.kind = kind
        self.default = default
        self._factories: Dict[str, Callable[[], T]] = {}
        self._instances: Dict[str, T] = {}

    def register(self, name: str):
        def deco(factory):
            if name in self._factories:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._factories[name] = factory
            return factory

        return deco

    def get(self, name: str | None = None) -> T:
        name = name or self.default
        inst = self._instances.get(name)
        if inst is None:
            if name not in self._factories:
                raise UnknownNameError(f"{self.kind} policy", name, list(self._factories))
            inst = self._instances[name] = self._factories[name]()
        return inst

    def names(self) -> List[str]:
        return sorted(self._factories)

    def __contains__(self, name: str) -> bool:
        return name in self._factories
