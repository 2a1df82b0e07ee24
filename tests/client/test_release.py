"""On every exit, the connection goes back to the pool (or is closed) and no task remains.

httpcore has leaked pool slots when a request was cancelled mid-flight (encode/httpcore#830,
#1093). Like httpcore's own test_cancellations, we cancel in each phase and then look
inside the pool.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import anyio
import pytest
import sniffio
from openai.types.chat import ChatCompletionMessageParam

import stallproof

from ..support.clients import MakeClient, assert_pool_clean, hold_the_only_connection, pool_state

pytestmark = pytest.mark.anyio

MSGS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]
HOLD = 20


def _tasks() -> int:
    """Live tasks on asyncio (trio's nurseries make a stray task impossible to leave)."""
    if sniffio.current_async_library() == "asyncio":
        return len(asyncio.all_tasks())
    return 0


@pytest.mark.parametrize(
    ("fault", "params", "stream"),
    [
        ("half_open", {}, False),  # cancelled while awaiting headers
        ("half_open", {}, True),
        ("trickle_body", {"interval": 0.05}, False),  # cancelled mid-body
        ("sse_stall", {"after": 1}, True),  # cancelled mid-stream
        ("healthy", {"delay": 5}, False),  # cancelled before headers of a live server
    ],
)
async def test_caller_cancellation_releases_the_connection(
    fault: str, params: dict[str, Any], stream: bool, fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url(fault, hold=HOLD, **params), timeout=30)
    before = _tasks()
    with anyio.move_on_after(0.4) as scope:
        if stream:
            s = await client.chat.completions.create(model="m", messages=MSGS, stream=True)
            async for _ in s:
                pass
        else:
            await client.chat.completions.create(model="m", messages=MSGS)
    # The caller's own cancellation is not turned into one of our errors.
    assert scope.cancelled_caught
    assert_pool_clean(client)
    assert _tasks() == before
    # And the client still works afterwards.
    healthy = make_client(fault_server.url())
    resp = await healthy.chat.completions.create(model="m", messages=MSGS)
    assert resp.choices and resp.choices[0].message


async def test_cancelled_while_waiting_for_the_pool(
    fault_server: Any, make_client: MakeClient
) -> None:
    client, holder = await hold_the_only_connection(make_client, fault_server)
    with anyio.move_on_after(0.3):
        await client.chat.completions.create(model="m", messages=MSGS)
    state = pool_state(client)
    assert (state.in_use, state.waiting) == (1, 0), state  # only the holder's
    await holder.aclose()
    assert_pool_clean(client)


# trio finalises an abandoned generator for us but warns that `async with` would be tidier.
@pytest.mark.filterwarnings("ignore:Async generator 'stallproof.:ResourceWarning")
async def test_break_out_of_a_stream_releases_the_connection(
    fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url("sse_stall", after=3, hold=HOLD))
    stream = await client.chat.completions.create(model="m", messages=MSGS, stream=True)
    async for _ in stream:
        break
    # The loop's generator is finalised when the loop drops it; give the finaliser a turn.
    gc.collect()
    for _ in range(20):
        if pool_state(client).nothing_held:
            break
        await anyio.sleep(0.01)
    assert_pool_clean(client)


async def test_aclose_and_async_with_release_the_connection(
    fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url("sse_stall", after=3, hold=HOLD))
    stream = await client.chat.completions.create(model="m", messages=MSGS, stream=True)
    await stream.__anext__()
    await stream.aclose()
    await stream.aclose()  # idempotent
    assert_pool_clean(client)
    async with await client.chat.completions.create(model="m", messages=MSGS, stream=True) as s:
        await s.__anext__()
    assert_pool_clean(client)
    with pytest.raises(StopAsyncIteration):
        await s.__anext__()


async def test_healthy_connections_are_reused(fault_server: Any, make_client: MakeClient) -> None:
    client = make_client(fault_server.url())
    for stream in (False, True, False, True):
        if stream:
            s = await client.chat.completions.create(model="m", messages=MSGS, stream=True)
            async for _ in s:
                pass
        else:
            await client.chat.completions.create(model="m", messages=MSGS)
    state = pool_state(client)
    assert (state.idle, state.connections) == (1, 1), state


@pytest.mark.slow
async def test_errors_after_faults_leave_the_pool_usable(
    fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(
        fault_server.url(),
        limits=stallproof.Limits(max_connections=1, max_keepalive_connections=1),
        timeout=stallproof.Timeouts(total=0.5),
    )
    faults = ["half_open", "reset", "close_mid_body", "sse_stall", "stall_headers"]
    for name in faults:
        with pytest.raises(stallproof.StallproofError):
            s = await client.chat.completions.create(
                model="m",
                messages=MSGS,
                stream=True,
                extra_headers={"X-Fault": f"{name};hold={HOLD}"},
            )
            async for _ in s:
                pass
    # Five failed calls on a pool of one: if any had leaked the slot, each call after it
    # (this one too) would wait for it in "pool wait" until its total ran out.
    resp = await client.chat.completions.create(model="m", messages=MSGS)
    assert resp.choices
