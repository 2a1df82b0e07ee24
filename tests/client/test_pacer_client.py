"""The pacer inside the client, over real sockets: limits seen by the server, deadlines."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from openai.types.chat import ChatCompletionMessageParam

import stallproof

from ..support.clients import MakeClient, pacer_state
from ..support.timing import MARGIN, stopwatch

pytestmark = pytest.mark.anyio

MSGS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]


async def test_concurrency_limit_holds_at_the_server(
    fault_server: Any, fault_key: str, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url(), pacer=stallproof.Pacer(max_concurrent=3))
    peak = 0

    async def one(i: int) -> None:
        nonlocal peak
        await client.chat.completions.create(
            model="m",
            messages=MSGS,
            agent=f"a{i % 4}",
            extra_headers={"X-Fault": f"healthy;delay=0.1;key={fault_key}"},
        )

    async def watch() -> None:
        nonlocal peak
        while True:
            state = pacer_state(client)
            peak = max(peak, state.in_use)
            await anyio.sleep(0.01)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            async with anyio.create_task_group() as calls:
                for i in range(12):
                    calls.start_soon(one, i)
            tg.cancel_scope.cancel()
    stats = fault_server.key_stats(fault_key)
    assert stats.requests == 12
    # Never more than 3 requests at once means the pool never needed a 4th connection.
    assert stats.connections <= 3
    assert peak == 3
    state = pacer_state(client)
    assert state.in_use == 0 and not any(state.queued.values())


async def test_a_queued_call_fails_at_its_deadline_without_being_sent(
    fault_server: Any, fault_key: str, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url(), pacer=stallproof.Pacer(max_concurrent=1))
    async with anyio.create_task_group() as tg:

        async def holder() -> None:
            with anyio.move_on_after(3):
                await client.chat.completions.create(
                    model="m", messages=MSGS, extra_headers={"X-Fault": "half_open;hold=10"}
                )

        tg.start_soon(holder)
        await anyio.sleep(0.2)
        seen: list[stallproof.InflightCall] = []

        async def look() -> None:
            await anyio.sleep(0.3)
            seen.extend(c for c in client.inflight() if c.agent == "late")

        tg.start_soon(look)
        with stopwatch() as elapsed, pytest.raises(stallproof.PacerTimeout) as info:
            await client.chat.completions.create(
                model="m",
                messages=MSGS,
                timeout=1.0,
                agent="late",
                extra_headers={"X-Fault": f"healthy;key={fault_key}"},
            )
        tg.cancel_scope.cancel()
    assert 0.95 <= elapsed[0] <= 1.0 + MARGIN
    err = info.value
    assert isinstance(err, stallproof.TotalTimeout)
    assert err.phase == "pacer queue" and err.stallproof_request_id
    assert "pacer" in str(err)
    assert fault_server.key_stats(fault_key).requests == 0
    assert [c.phase for c in seen] == ["pacer queue"]
    assert pacer_state(client).in_use == 0


async def test_rate_limits_shrink_the_limit_and_successes_restore_it(
    fault_server: Any, fault_key: str, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url(), pacer=stallproof.Pacer(max_concurrent=8))
    assert pacer_state(client).limit == 8
    with pytest.raises(stallproof.RateLimitError):
        await client.chat.completions.create(
            model="m", messages=MSGS, extra_headers={"X-Fault": "status;code=429"}
        )
    assert pacer_state(client).limit == 4
    for _ in range(4):  # one run of successes as long as the limit adds one
        await client.chat.completions.create(model="m", messages=MSGS)
    assert pacer_state(client).limit == 5


async def test_streams_hold_their_permit_until_they_end(
    fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url(), pacer=stallproof.Pacer(max_concurrent=2))
    stream = await client.chat.completions.create(model="m", messages=MSGS, stream=True)
    assert pacer_state(client).in_use == 1
    async for _ in stream:
        pass
    assert pacer_state(client).in_use == 0
    stream = await client.chat.completions.create(model="m", messages=MSGS, stream=True)
    await stream.aclose()
    assert pacer_state(client).in_use == 0


async def test_cancelled_calls_give_their_permits_back(
    fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url(), pacer=stallproof.Pacer(max_concurrent=2))

    async def stuck() -> None:
        with anyio.move_on_after(0.3):
            await client.chat.completions.create(
                model="m", messages=MSGS, extra_headers={"X-Fault": "half_open;hold=10"}
            )

    async with anyio.create_task_group() as tg:
        for _ in range(6):  # two hold permits, four wait in the queue; all are cancelled
            tg.start_soon(stuck)
    state = pacer_state(client)
    assert state.in_use == 0 and not any(state.queued.values())
    resp = await client.chat.completions.create(model="m", messages=MSGS)
    assert resp.choices
