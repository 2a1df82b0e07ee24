"""`NativeCancelScope`, an attempt's bound on asyncio's own cancellation: it fires on time, moves
with its deadline, and lets every other cancellation (native or anyio's) through untouched,
even one that lands in the same loop turn as its own."""

from __future__ import annotations

import asyncio
import sys

import anyio
import pytest

from stallproof._native_scope import NativeCancelScope

from ..support.timing import MARGIN, stopwatch

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),
    pytest.mark.skipif(sys.version_info < (3, 11), reason="tasks count cancels from 3.11"),
]


def _now() -> float:
    return asyncio.get_running_loop().time()


async def test_it_fires_at_its_deadline_and_swallows_its_own_cancellation() -> None:
    with stopwatch() as t, NativeCancelScope(_now() + 0.2) as scope:
        await asyncio.sleep(5)
    assert scope.cancelled_caught and scope.cancel_called
    assert 0.2 <= t[0] < 0.2 + MARGIN
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # type: ignore[attr-defined]
    await asyncio.sleep(0)  # nothing left pending for the task


async def test_a_deadline_already_passed_fires_at_the_first_await() -> None:
    with NativeCancelScope(_now() - 1) as scope:
        await asyncio.sleep(5)
    assert scope.cancelled_caught


async def test_the_deadline_moves_both_ways() -> None:
    with stopwatch() as t, NativeCancelScope(_now() + 5) as scope:
        scope.deadline = _now() + 0.2  # earlier: re-armed
        await asyncio.sleep(5)
    assert scope.cancelled_caught and 0.2 <= t[0] < 0.2 + MARGIN
    with stopwatch() as t, NativeCancelScope(_now() + 0.1) as scope:
        scope.deadline = _now() + 0.4  # later: the timer fires early and moves on
        await asyncio.sleep(5)
    assert scope.cancelled_caught and 0.4 <= t[0] < 0.4 + MARGIN


async def test_a_block_that_ends_first_leaves_nothing_armed() -> None:
    with NativeCancelScope(_now() + 0.1) as scope:
        await asyncio.sleep(0)
    await asyncio.sleep(0.2)  # past the deadline: nothing fires at the task
    assert not scope.cancel_called and not scope.cancelled_caught


async def test_a_native_cancellation_from_outside_passes_through() -> None:
    async def victim() -> None:
        with NativeCancelScope(_now() + 5):
            await asyncio.sleep(5)

    task = asyncio.create_task(victim())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("lead", [-0.002, 0.0, 0.002])
async def test_an_anyio_scope_firing_with_it_still_catches_its_own(lead: float) -> None:
    """An enclosing anyio scope whose deadline falls in the same instant (or just before
    or after): the block ends on time, exactly one of the two catches the cancellation
    (the one whose cancellation reached the task first), none escapes, none is left
    pending on the task."""
    for _ in range(20):
        start = _now()
        with anyio.CancelScope(deadline=start + 0.05 + lead) as outer:
            with NativeCancelScope(start + 0.05) as inner:
                await asyncio.sleep(1)
        assert outer.cancelled_caught != inner.cancelled_caught
        assert _now() - start < 0.05 + MARGIN
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0  # type: ignore[attr-defined]
        await asyncio.sleep(0)
