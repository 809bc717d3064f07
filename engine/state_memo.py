"""Values computed from a state dict, remembered per dict object (its prepared copy for the engine, an fp32
copy, the text the model wrote). Keyed by the dict's id and held with the dict itself, so a new dict can never
be handed a dead dict's value through a reused id."""
from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class StateDictMemo(Generic[V]):
    def __init__(self) -> None:
        self._entries: dict[tuple, tuple[dict, V]] = {}

    def get(self, state_dict: dict, build: Callable[[], V], *key: Hashable) -> V:
        """The value for `state_dict` (and `key`), built the first time."""
        k = (id(state_dict), *key)
        hit = self._entries.get(k)
        if hit is not None and hit[0] is state_dict:
            return hit[1]
        value = build()
        self._entries[k] = (state_dict, value)  # holding the dict keeps its id from being reused
        return value

    def forget(self, state_dict: dict) -> None:
        """Drop every value of `state_dict` (weights that will not run again)."""
        for k in [k for k, (sd, _) in self._entries.items() if sd is state_dict]:
            del self._entries[k]
