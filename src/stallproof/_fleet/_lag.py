"""`LoopLag`: how late this event loop has been, so a bound on Redis does not count it.

``op_timeout`` bounds how long Redis may stay silent. On a busy loop (hundreds of calls
in flight, a callback that holds the loop for 100 ms) a plain timer also counts the time
the loop was not running: Redis's answer sits in the socket while the loop is elsewhere,
the timer fires first, and a healthy Redis is declared down. That is the loop's fault,
not Redis's.

While anyone holds it, `LoopLag` runs one timer every ``tick`` seconds and adds up how
late each one fired (beyond a small tolerance). A wait that started when `stalled` read
``s0`` has been kept from running for ``stalled(now) - s0`` of its elapsed time; a bound
on Redis's silence moves out by that much. Time is the loop's own clock.
"""

from __future__ import annotations

import asyncio

__all__ = ["LoopLag"]

# Lateness below this is scheduling noise, not a stall.
_TOLERANCE = 0.0005


class LoopLag:
    """Summed lateness of one asyncio loop, measured only while held (`hold`/`release`)."""

    def __init__(self, tick: float) -> None:
        self.tick = tick
        self._total = 0.0
        self._holders = 0
        self._expected = 0.0  # when the running timer should fire
        self._handle: asyncio.TimerHandle | None = None

    def hold(self) -> None:
        """Start measuring (if not already): a wait that a stall must not shorten began."""
        self._holders += 1
        if self._handle is None:
            loop = asyncio.get_running_loop()
            self._expected = loop.time() + self.tick
            self._handle = loop.call_at(self._expected, self._beat)

    def release(self) -> None:
        self._holders -= 1
        if self._holders <= 0:
            self._holders = 0
            if self._handle is not None:
                self._handle.cancel()
                self._handle = None

    def stalled(self, now: float) -> float:
        """Seconds this loop has been late so far, including a stall still going on."""
        late = now - self._expected if self._handle is not None else 0.0
        return self._total + (late if late > _TOLERANCE else 0.0)

    def _beat(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        late = now - self._expected
        if late > _TOLERANCE:
            self._total += late
        self._expected = now + self.tick
        self._handle = loop.call_at(self._expected, self._beat)
