"""Token buckets, the state behind the ``rate_limit`` fault (`_faults_status`).

A bucket starts full with ``limit`` tokens and gains ``rate`` tokens a second, up to
``limit``; drawing takes one token if there is a whole one. Buckets are kept by
(key, limit, rate), at most `_MAX_BUCKETS` of them, least recently used dropped first.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

__all__ = ["Buckets", "Draw"]

_MAX_BUCKETS = 10_000  # the oldest are dropped past this: a bucket is 100-odd bytes.


@dataclass(frozen=True, slots=True)
class Draw:
    """What one request got from its bucket.

    Attributes:
        granted: whether it took a token.
        remaining: whole tokens left after it.
        retry_after: seconds until the next token (0 when one is there).
        full_in: seconds until the bucket is full again.
    """

    granted: bool
    remaining: int
    retry_after: float
    full_in: float


class _Bucket:
    def __init__(self, limit: int, rate: float, now: float) -> None:
        self.limit = limit
        self.rate = rate
        self.tokens = float(limit)
        self.stamp = now

    def draw(self, now: float) -> Draw:
        self.tokens = min(self.limit, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        granted = self.tokens >= 1.0
        if granted:
            self.tokens -= 1.0
        missing = max(0.0, 1.0 - self.tokens)
        return Draw(
            granted=granted,
            remaining=int(self.tokens),
            retry_after=missing / self.rate,
            full_in=(self.limit - self.tokens) / self.rate,
        )


class Buckets:
    """The server's token buckets, by (key, limit, rate). Safe from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str | None, int, float], _Bucket] = {}

    def draw(self, key: str | None, limit: int, rate: float) -> Draw:
        """Take a token from the bucket of ``key`` if it has one."""
        now = time.monotonic()
        with self._lock:
            bucket = self._buckets.pop((key, limit, rate), None)
            if bucket is None:
                bucket = _Bucket(limit, rate, now)
                if len(self._buckets) >= _MAX_BUCKETS:
                    del self._buckets[next(iter(self._buckets))]
            self._buckets[(key, limit, rate)] = bucket  # most recently used last.
            return bucket.draw(now)

    def clear(self) -> None:
        """Refill everything: forget every bucket."""
        with self._lock:
            self._buckets.clear()
