"""`NativeCancelScope`: an attempt's bound on asyncio's own cancellation, where anyio's costs more.

An attempt runs under one cancel scope whose deadline is the call's armed bound
(`_call.Call.bounded`). On asyncio (Python 3.11+, where a task counts the cancellations
asked of it), when nothing inside the attempt awaits in a shielded region (the engine's
own pool on its asyncio wire: `_wire._h1`), this scope does that job with one loop timer
and ``Task.cancel``/``Task.uncancel``, as ``asyncio.timeout`` does. anyio's cancel scope,
for the same job, keeps per-task state, sets of child scopes and tasks, and remakes its
timer on every change of deadline: about four times the instructions of a whole attempt's
bookkeeping here.

What it guarantees, as the anyio scope it stands in for:

- when its deadline passes it cancels its task, once; on exit it swallows that
  cancellation (`cancelled_caught`), and the caller raises the bound's timeout;
- a cancellation asked by anyone else passes through untouched: on exit, if more
  cancellations are pending than when it was entered, the one in flight is theirs. While
  one is pending its own is held back (looked at again every `_HELD_BACK` s) rather than
  asked on top, so the task never carries two at once (defensive: asyncio keeps the
  first one's message when two land in one turn, which is what an anyio scope checks);
- its deadline may move (`Call.rearm`): earlier re-arms the timer; later leaves it, and a
  timer that fires before the deadline moves on to it.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from types import TracebackType
from typing import Any

__all__ = ["NativeCancelScope"]

# While another cancellation of the task is pending, how often a passed deadline looks
# again (the task is unwinding: this lasts as long as its cleanup).
_HELD_BACK = 0.005

# The context the scope's timer runs its callback in: one empty one per thread (a loop's
# callbacks run one at a time on its thread, so never two in it at once), rather than the
# copy of the caller's context a loop timer makes by default: one object less per call
# in flight, for the garbage collector to walk (thousands may be). The callback reads no
# context variable.
_timer_context = threading.local()


def _empty_context() -> contextvars.Context:
    context: contextvars.Context | None = getattr(_timer_context, "context", None)
    if context is None:
        context = _timer_context.context = contextvars.Context()
    return context


class NativeCancelScope:
    """A cancel scope with a deadline on the loop's clock, for the running asyncio task.

    The subset of ``anyio.CancelScope`` that `_call._Bounded` uses: ``deadline``
    (settable), ``cancel_called``, ``cancelled_caught``, and the ``with`` protocol.
    """

    __slots__ = (
        "_armed_at",
        "_cancelling",
        "_deadline",
        "_fired",
        "_handle",
        "_loop",
        "_task",
        "cancelled_caught",
    )

    def __init__(self, deadline: float) -> None:
        self._deadline = deadline
        self._armed_at = deadline
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._cancelling = 0
        self._fired = False
        self.cancelled_caught = False

    @property
    def deadline(self) -> float:
        return self._deadline

    @deadline.setter
    def deadline(self, value: float) -> None:
        self._deadline = value
        if self._task is not None and not self._fired and value < self._armed_at:
            self._arm(value)  # (a later deadline: the armed timer moves on when it fires)

    @property
    def cancel_called(self) -> bool:
        """Whether the deadline passed and the task was cancelled for it."""
        return self._fired

    def __enter__(self) -> NativeCancelScope:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        if task is None:  # pragma: no cover - the engine always runs in a task
            raise RuntimeError("NativeCancelScope must be entered in a task")
        self._loop = loop
        self._task = task
        self._cancelling = task.cancelling()  # type: ignore[attr-defined]  # (3.11+)
        self._arm(self._deadline)
        return self

    def _arm(self, when: float) -> None:
        assert self._loop is not None
        if self._handle is not None:
            self._handle.cancel()
        # The scope itself is the callback (`__call__`): no bound method per call in flight.
        self._handle = self._loop.call_at(when, self, context=_empty_context())
        self._armed_at = when

    def __call__(self) -> None:
        """The timer's callback: the deadline passed (or the timer moves on to it)."""
        self._handle = None
        task = self._task
        if task is None or self._fired:
            return
        if self._armed_at < self._deadline:
            self._arm(self._deadline)  # the deadline moved on since the timer was set
            return
        if task.cancelling() > self._cancelling:  # type: ignore[attr-defined]
            # Someone else's cancellation is in flight: it unwinds this scope anyway.
            assert self._loop is not None
            self._handle = self._loop.call_later(_HELD_BACK, self, context=_empty_context())
            return
        self._fired = True
        task.cancel()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        task = self._task
        self._task = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if not self._fired or task is None:
            return False
        if task.uncancel() > self._cancelling:  # type: ignore[attr-defined]
            return False  # another cancellation is pending: what unwinds is theirs
        if exc_type is not None and issubclass(exc_type, asyncio.CancelledError):
            self.cancelled_caught = True
            return True
        return False
