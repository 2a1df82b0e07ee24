"""Counters of what the server saw, and the frozen snapshots that tests read.

The counters are written on the server's event loop and read from any thread (the thread
runner's callers), so one lock guards them; it is held only for a few integer updates.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from ._bounded import SeenKeys, touch

__all__ = ["Counters", "KeyStats", "ServerStats"]

_ZERO = (0, 0, 0)


@dataclass(frozen=True, slots=True)
class KeyStats:
    """What the server saw for one ``key``.

    Attributes:
        requests: requests that carried the key (this is the count ``first=N`` compares to).
        connections: distinct connections that carried at least one such request.
        faulted: those requests that got the fault rather than the healthy fallback.
    """

    requests: int = 0
    connections: int = 0
    faulted: int = 0


@dataclass(frozen=True, slots=True)
class ServerStats:
    """What the server saw since it started or was last reset.

    Attributes:
        connections_accepted: connections accepted on the main listener.
        connections_open: of those, the ones not yet closed.
        requests: request heads read, not counting the ``/_fault/`` control endpoints.
    """

    connections_accepted: int = 0
    connections_open: int = 0
    requests: int = 0


class Counters:
    """Mutable, thread-safe counters behind `ServerStats` and `KeyStats`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._accepted = 0
        self._open = 0
        self._requests = 0
        # key -> (requests, connections, faulted); the least recently seen go past MAX_KEYS.
        # Tuples, replaced whole: `keys` copies the references under the lock, not the counts.
        self._keys: OrderedDict[str, tuple[int, int, int]] = OrderedDict()
        self._epoch = 0  # bumped by reset(), so connections re-count their keys.

    def connection_opened(self) -> None:
        with self._lock:
            self._accepted += 1
            self._open += 1

    def connection_closed(self) -> None:
        with self._lock:
            self._open -= 1

    def request(self) -> None:
        with self._lock:
            self._requests += 1

    def key_request(self, key: str, seen: SeenKeys) -> int:
        """Count one request carrying ``key`` and return its ordinal (1 for the first).

        ``seen`` is the connection's own memory of the keys it already counted.
        """
        with self._lock:
            requests, connections, faulted = touch(self._keys, key, _ZERO)
            if (self._epoch, key) not in seen:
                seen.add((self._epoch, key))
                connections += 1
            self._keys[key] = (requests + 1, connections, faulted)
            return requests + 1

    def key_faulted(self, key: str) -> None:
        with self._lock:
            requests, connections, faulted = touch(self._keys, key, _ZERO)
            self._keys[key] = (requests, connections, faulted + 1)

    def reset(self) -> None:
        """Zero every count but ``connections_open``, which stays a true gauge."""
        with self._lock:
            self._accepted = 0
            self._requests = 0
            self._keys.clear()
            self._epoch += 1

    def forget(self, key: str) -> bool:
        """Drop ``key``'s counts (its ``first=N`` sequence starts over); whether it had any."""
        with self._lock:
            return self._keys.pop(key, None) is not None

    def snapshot(self) -> ServerStats:
        with self._lock:
            return ServerStats(self._accepted, self._open, self._requests)

    def key(self, key: str) -> KeyStats:
        with self._lock:
            return KeyStats(*self._keys.get(key, _ZERO))

    def keys(self) -> dict[str, KeyStats]:
        return {k: KeyStats(*v) for k, v in self.counts()}

    def counts(self) -> list[tuple[str, tuple[int, int, int]]]:
        """Every key's (requests, connections, faulted), least recently seen first; the lock
        is held only to copy the references (100,000 at most)."""
        with self._lock:
            return list(self._keys.items())
