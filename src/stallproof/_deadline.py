"""`deadline()`: one budget over a whole agent step, whatever it calls.

A call's own ``total`` bounds one call. An agent step is often several: a tool loop, a
retry the SDK makes on its own, a stream then a follow-up. ``with stallproof.deadline(30):``
puts an absolute deadline on everything inside the block:

- every call made through a stallproof client, transport or SDK face inside the block
  ends by the earliest enclosing deadline (its total is clipped to it), with
  `DeadlineExceeded` naming the block;
- anything else in the block that awaits (an SDK's own retry sleep, a tool) is cancelled
  when the deadline passes, like ``anyio.fail_after``, and the block raises
  `DeadlineExceeded` too.

Nested blocks take the earliest deadline. The deadline is carried in a context variable, so
it follows the task and what the task awaits, on asyncio and trio alike (tasks spawned
inside the block inherit it, as they inherit any contextvar).

In sync code (no event loop in the thread) the same ``with stallproof.deadline(30):``
bounds every sync call of stallproof inside it (`stallproof.sync_http_client()`, the
transports, the sync SDK faces): each gets at most the time left and raises
`DeadlineExceeded` when it runs out. What it cannot do there is interrupt the caller's own
code: Python cannot cancel a running thread, so a ``time.sleep`` or a computation in the
block runs to its end (the next call then fails at once). The two forms nest, whichever
set the outer one: the deadline is kept on its own clock and on ``time.monotonic``, and
read on a call's loop clock through the time left (`stallproof._clock.on_clock`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import time
from collections.abc import Iterator

import anyio

from . import _exceptions as exc
from ._clock import Clock, on_clock, running_clock

__all__ = ["ActiveDeadline", "current_deadline", "deadline"]


@dataclasses.dataclass(frozen=True, slots=True)
class ActiveDeadline:
    """The earliest deadline in force: when (on the clock of the code that set it: its event
    loop's, or ``time.monotonic`` in sync code) and whose."""

    when: float
    name: str
    seconds: float
    started: float
    clock: Clock = time.monotonic
    #: ``when`` on ``time.monotonic``: how any other clock reads it.
    expires: float = 0.0

    def when_on(self, clock: Clock) -> float:
        """This deadline as a time on ``clock``."""
        return on_clock(self.when, self.clock, self.expires, clock)


_current: contextvars.ContextVar[ActiveDeadline | None] = contextvars.ContextVar(
    "stallproof_deadline", default=None
)


def current_deadline() -> ActiveDeadline | None:
    """The earliest `deadline()` block around the caller, or None."""
    return _current.get()


@contextlib.contextmanager
def deadline(seconds: float, *, name: str | None = None) -> Iterator[ActiveDeadline]:
    """Bound everything inside the block to ``seconds`` from now.

    Args:
        seconds: the budget of the block, > 0.
        name: what the block is called in errors, spans and ``inflight()``
            (default ``"deadline(<seconds>s)"``).

    Raises:
        DeadlineExceeded: the budget ran out inside the block (a `TotalTimeout`, so code
            that catches timeouts catches it). In sync code, the call that ran out raises
            it (through an SDK face, as the SDK's ``APITimeoutError`` whose cause it is);
            the block itself raises nothing more when it ends.

    Example:
        >>> with stallproof.deadline(30, name="plan step"):
        ...     plan = await agent.run(task)  # or, in sync code, agent.run(task)
    """
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise exc.InvalidRequestError(f"deadline seconds must be a number, got {seconds!r}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise exc.InvalidRequestError(f"deadline seconds must be > 0 and finite, got {seconds!r}")
    if name is not None and not isinstance(name, str):
        raise exc.InvalidRequestError(f"deadline name must be a str, got {name!r}")
    loop_time = running_clock()
    is_async = loop_time is not None
    clock = loop_time if loop_time is not None else time.monotonic
    now = clock()
    mine = ActiveDeadline(
        when=now + seconds,
        name=name or f"deadline({seconds:g}s)",
        seconds=float(seconds),
        started=now,
        clock=clock,
        expires=time.monotonic() + seconds,
    )
    outer = _current.get()
    active = outer if outer is not None and outer.when_on(clock) <= mine.when else mine
    token = _current.set(active)
    if not is_async:
        # Sync code: nothing to cancel; every call inside reads the deadline.
        try:
            yield active
        finally:
            _current.reset(token)
        return
    try:
        with anyio.CancelScope(deadline=mine.when) as cancel_scope:
            yield active
    finally:
        _current.reset(token)
    if cancel_scope.cancelled_caught:
        raise exc.DeadlineExceeded(
            limit=mine.seconds,
            elapsed=anyio.current_time() - mine.started,
            phase="in the block",
            name=mine.name,
        )
