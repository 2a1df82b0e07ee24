"""`stallproof.deadline()`: one budget over several calls and whatever else the block does."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest
from openai.types.chat import ChatCompletionMessageParam

import stallproof

from ..support.clients import MakeClient
from ..support.timing import MARGIN, stopwatch

pytestmark = pytest.mark.anyio

MSGS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]
HOLD = 20


async def test_a_scope_clips_every_call_inside_it(
    fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url(), timeout=30)
    slow = fault_server.url("half_open", hold=HOLD)
    stalled = make_client(slow, timeout=30)
    with (
        stopwatch() as elapsed,
        pytest.raises(stallproof.DeadlineExceeded) as info,
        stallproof.deadline(1.0, name="plan step"),
    ):
        # A healthy call first: it fits, and the deadline keeps running.
        await client.chat.completions.create(model="m", messages=MSGS)
        await stalled.chat.completions.create(model="m", messages=MSGS)
    assert elapsed[0] < 1.0 + MARGIN
    error = info.value
    assert isinstance(error, stallproof.TotalTimeout)
    assert error.name == "plan step" and error.bound == "deadline" and error.limit == 1.0
    assert "plan step" in str(error)
    assert stalled.inflight() == ()


async def test_the_block_cancels_what_is_not_a_call() -> None:
    with (
        stopwatch() as elapsed,
        pytest.raises(stallproof.DeadlineExceeded) as info,
        stallproof.deadline(0.3),
    ):
        await anyio.sleep(10)  # an SDK's retry sleep, a tool...
    assert elapsed[0] < 0.3 + MARGIN
    assert info.value.name == "deadline(0.3s)"


async def test_nested_scopes_take_the_earliest(fault_server: Any, make_client: MakeClient) -> None:
    stalled = make_client(fault_server.url("half_open", hold=HOLD), timeout=30)
    with (
        pytest.raises(stallproof.DeadlineExceeded) as info,
        stallproof.deadline(0.4, name="outer"),
        stallproof.deadline(5, name="inner"),
    ):
        await stalled.chat.completions.create(model="m", messages=MSGS)
    assert info.value.name == "outer"
    with (
        pytest.raises(stallproof.DeadlineExceeded) as info,
        stallproof.deadline(5, name="outer"),
        stallproof.deadline(0.4, name="inner"),
    ):
        await stalled.chat.completions.create(model="m", messages=MSGS)
    assert info.value.name == "inner"


async def test_a_calls_own_total_still_applies_inside(
    fault_server: Any, make_client: MakeClient
) -> None:
    stalled = make_client(fault_server.url("half_open", hold=HOLD), timeout=0.3)
    with stallproof.deadline(10), pytest.raises(stallproof.TotalTimeout) as info:
        await stalled.chat.completions.create(model="m", messages=MSGS)
    assert not isinstance(info.value, stallproof.DeadlineExceeded)


async def test_an_expired_scope_fails_a_call_before_it_is_sent(
    fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url(), timeout=30)
    with pytest.raises(stallproof.DeadlineExceeded), stallproof.deadline(0.2):
        with anyio.CancelScope(shield=True):
            await anyio.sleep(0.3)
        await client.chat.completions.create(model="m", messages=MSGS)
    assert client.inflight() == ()


async def test_the_scope_bounds_a_transport(fault_server: Any) -> None:
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    async with stallproof.http_client2(timeout=30, retry=None) as client:
        with (
            stopwatch() as elapsed,
            pytest.raises(stallproof.DeadlineExceeded),
            stallproof.deadline(0.5),
        ):
            await client.post(
                fault_server.url("half_open", hold=HOLD) + "/chat/completions", content=body
            )
    assert elapsed[0] < 0.5 + MARGIN


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), "3", True])
def test_bad_budgets_are_refused(bad: Any) -> None:
    with pytest.raises(stallproof.InvalidRequestError, match="deadline"), stallproof.deadline(bad):
        pass


# -- the sync form, and the two forms nested -----------------------------------------------


def test_the_sync_form_needs_no_event_loop_and_nests() -> None:
    from stallproof._deadline import current_deadline

    assert current_deadline() is None
    with stallproof.deadline(5, name="outer") as outer:
        assert current_deadline() is outer
        with stallproof.deadline(10, name="later"):
            active = current_deadline()
            assert active is not None and active.name == "outer"  # the earliest wins
        with stallproof.deadline(0.5, name="sooner") as sooner:
            assert current_deadline() is sooner
        assert current_deadline() is outer
    assert current_deadline() is None


def test_the_sync_form_raises_nothing_of_its_own_when_its_block_ends_late() -> None:
    # Nothing in sync code can be interrupted: the calls inside raise, the block does not.
    with stallproof.deadline(0.01):
        time.sleep(0.05)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_sync_deadline_reaches_async_code_on_its_clock(backend: str) -> None:
    from stallproof._clock import loop_clock
    from stallproof._deadline import current_deadline

    async def inside() -> None:
        active = current_deadline()
        assert active is not None and active.name == "sync"
        clock = loop_clock()
        # On another clock (trio's starts anywhere): the same instant, by the time left.
        assert abs(active.when_on(clock) - (clock() + 2.0)) < 0.2
        with stallproof.deadline(30) as later:
            assert later is active  # the sync one is earlier: it stays in force
        with stallproof.deadline(0.5, name="async") as sooner:
            assert sooner is not active and current_deadline() is sooner

    with stallproof.deadline(2.0, name="sync"):
        anyio.run(inside, backend=backend)


async def test_an_async_deadline_keeps_its_own_clock(fault_server: Any) -> None:
    from stallproof._clock import loop_clock

    with stallproof.deadline(3) as scope:
        # On its own loop's clock it is read as set (a MockClock's virtual time included).
        assert scope.when_on(loop_clock()) == scope.when


def test_the_old_name_of_the_deadlines_name_still_reads_with_a_warning() -> None:
    error = stallproof.DeadlineExceeded(limit=1.0, elapsed=1.0, name="plan step")
    with pytest.warns(DeprecationWarning, match="DeadlineExceeded.name"):
        assert error.scope == "plan step"
