"""Clocks: the running event loop's, and how a deadline set on one clock reads on another.

A call's bounds are absolute times on its event loop's clock (asyncio's ``loop.time``,
trio's ``current_time``, which a test's ``MockClock`` may drive). A `deadline()` set in
sync code has no loop: it is kept on ``time.monotonic``. `on_clock` turns one into the
other, through the time left, so a deadline set by either form bounds calls on any loop.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable

import anyio
import sniffio

__all__ = ["Clock", "is_asyncio_clock", "is_trio_clock", "loop_clock", "on_clock", "running_clock"]

Clock = Callable[[], float]

_last_clock: tuple[asyncio.AbstractEventLoop, Clock] | None = None
_last_trio_clock: tuple[object, Clock] | None = None


def running_clock() -> Clock | None:
    """The clock of the event loop running in this thread (asyncio's or trio's), or None
    in sync code.

    Asks the loops themselves, not sniffio: a worker thread started by
    ``asyncio.to_thread`` runs in a copy of its task's context, where sniffio's context
    variable still says "asyncio" although no loop runs in that thread.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        return loop_clock()
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            trio.lowlevel.current_task()
        except RuntimeError:
            return None
        return trio.lowlevel.current_clock().current_time  # type: ignore[no-any-return]
    return None


def loop_clock() -> Clock:
    """The running event loop's clock: what `anyio.current_time` returns, looked up once.

    `anyio.current_time` finds the backend through sniffio on every call; a call reads
    the clock a dozen times, so it keeps the function it resolves to (asyncio's
    ``loop.time``, the trio run's clock's ``current_time``, a test's ``MockClock`` too).
    Either answers from any thread: the process registry reads calls from other threads.
    """
    global _last_clock
    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return anyio.current_time  # not in an event loop: anyio raises its own error
    if library == "asyncio":
        loop = asyncio.get_running_loop()
        last = _last_clock
        if last is not None and last[0] is loop:
            return last[1]  # the same bound method for every call on this loop
        clock = loop.time
        if getattr(clock, "__func__", None) is asyncio.BaseEventLoop.time:
            # The stock loop's clock is time.monotonic: read it without a Python frame
            # around it (a call reads the clock a dozen times, a stream once per event).
            clock = time.monotonic
        _last_clock = (loop, clock)
        return clock
    if library == "trio":
        import trio

        global _last_trio_clock
        # The run's clock object (a test's MockClock too): its method, unlike
        # `trio.current_time`, answers from any thread (`stallproof.inflight()` reads it).
        # One bound method per run's clock, not one per call (thousands may be in flight).
        run_clock = trio.lowlevel.current_clock()
        last_trio = _last_trio_clock
        if last_trio is not None and last_trio[0] is run_clock:
            return last_trio[1]
        clock = run_clock.current_time
        _last_trio_clock = (run_clock, clock)
        return clock
    return anyio.current_time  # pragma: no cover - another anyio backend


def is_trio_clock(clock: Clock) -> bool:
    """Whether ``clock`` (from `loop_clock`) is a trio run's."""
    trio = sys.modules.get("trio")
    return trio is not None and isinstance(getattr(clock, "__self__", None), trio.abc.Clock)


def is_asyncio_clock(clock: Clock) -> bool:
    """Whether ``clock`` (from `loop_clock`) is an asyncio loop's."""
    return clock is time.monotonic or isinstance(
        getattr(clock, "__self__", None), asyncio.AbstractEventLoop
    )


def on_clock(when: float, clock: Clock, expires: float, other: Clock) -> float:
    """``when`` (a time on ``clock``, which is ``expires`` on ``time.monotonic``) as a
    time on ``other``: itself on the same clock, else ``other``'s now plus the time left."""
    if other == clock:  # bound methods of one loop compare equal (and stock loops share one)
        return when
    return other() + (expires - time.monotonic())
