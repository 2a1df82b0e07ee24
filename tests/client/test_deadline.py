"""`stallproof.deadline()`: one budget over several calls and whatever else the block does."""

from __future__ import annotations

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
    assert error.scope == "plan step" and error.bound == "deadline" and error.limit == 1.0
    assert "plan step" in str(error)
    assert stalled.inflight() == ()


async def test_the_scope_cancels_what_is_not_a_call() -> None:
    with (
        stopwatch() as elapsed,
        pytest.raises(stallproof.DeadlineExceeded) as info,
        stallproof.deadline(0.3),
    ):
        await anyio.sleep(10)  # an SDK's retry sleep, a tool...
    assert elapsed[0] < 0.3 + MARGIN
    assert info.value.scope == "deadline(0.3s)"


async def test_nested_scopes_take_the_earliest(fault_server: Any, make_client: MakeClient) -> None:
    stalled = make_client(fault_server.url("half_open", hold=HOLD), timeout=30)
    with (
        pytest.raises(stallproof.DeadlineExceeded) as info,
        stallproof.deadline(0.4, name="outer"),
        stallproof.deadline(5, name="inner"),
    ):
        await stalled.chat.completions.create(model="m", messages=MSGS)
    assert info.value.scope == "outer"
    with (
        pytest.raises(stallproof.DeadlineExceeded) as info,
        stallproof.deadline(5, name="outer"),
        stallproof.deadline(0.4, name="inner"),
    ):
        await stalled.chat.completions.create(model="m", messages=MSGS)
    assert info.value.scope == "inner"


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
