"""Caps on the per-key state a long-lived server accumulates, and how it is trimmed.

A shared server (the pytest plugin's session server, a CLI left running for days) sees
keys come and go: each test, each agent has its own. Everything kept per key is capped, and
past the cap the key seen least recently is dropped first: its counts (and so its
``first=N`` sequence) and its mix draws start over if it comes back. `FaultServer.forget`
drops one key's state at once, which the pytest plugin does after each test.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

__all__ = ["MAX_KEYS", "MAX_RULES", "SeenKeys", "touch"]

MAX_KEYS = 100_000  # keys with counts, and keys with mix draws (~200 bytes each).
MAX_RULES = 10_000  # armed scenario rules.

K = TypeVar("K")
V = TypeVar("V")


def touch(mapping: OrderedDict[K, V], key: K, default: V, cap: int = MAX_KEYS) -> V:
    """``mapping[key]``, set to ``default`` if absent, now the most recent; the oldest
    entries are dropped past ``cap``."""
    if key in mapping:
        mapping.move_to_end(key)
        return mapping[key]
    mapping[key] = default
    while len(mapping) > cap:
        mapping.popitem(last=False)
    return default


class SeenKeys:
    """The keys one connection has been counted under (for `KeyStats.connections`).

    Capped at `CAP`: a connection that carries more distinct keys forgets the oldest, and a
    forgotten key that comes back on it counts that connection a second time.
    """

    CAP = 1024
    __slots__ = ("_keys",)

    def __init__(self) -> None:
        # A plain dict, oldest first: an empty one costs the garbage collector nothing, and
        # most connections never carry a key.
        self._keys: dict[tuple[int, str], None] = {}

    def __contains__(self, item: tuple[int, str]) -> bool:
        return item in self._keys

    def add(self, item: tuple[int, str]) -> None:
        self._keys[item] = None
        if len(self._keys) > self.CAP:
            del self._keys[next(iter(self._keys))]

    def __len__(self) -> int:
        return len(self._keys)
