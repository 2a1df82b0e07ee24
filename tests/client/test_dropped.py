"""A stream created and dropped without being read or closed gives back what it holds.

An exception between ``create()`` and ``async with`` drops the stream object: its pacer
permit and its ``inflight()`` entry must come back when it is garbage-collected, with a
`ResourceWarning` (like asyncio's "coroutine was never awaited"), and later calls go on.
"""

from __future__ import annotations

import gc
import json
from typing import Any

import anyio
import pytest
from openai.types.chat import ChatCompletionMessageParam

import stallproof

from ..support.clients import MakeClient, assert_pool_clean

pytestmark = pytest.mark.anyio

MSGS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]
HOLD = 20


async def _create(make: Any) -> None:
    await make()  # the stream dies with this frame, unread and unclosed


async def _drop(make: Any) -> None:
    """Create a stream in a frame of its own, drop it, and collect the garbage."""
    await _create(make)
    gc.collect()


async def test_a_dropped_client_stream_returns_its_permit_and_entry(
    fault_server: Any, make_client: MakeClient
) -> None:
    pacer = stallproof.Pacer(max_concurrent=1)
    client = make_client(fault_server.url("sse_stall", after=1, hold=HOLD), pacer=pacer)
    with pytest.warns(ResourceWarning, match="never closed"):
        await _drop(lambda: client.chat.completions.create(model="m", messages=MSGS, stream=True))
    assert client.inflight() == ()
    state = client.pacer_state()
    assert state is not None and state.in_use == 0, state
    # The only permit came back: the next call is not a PacerTimeout.
    s = await client.chat.completions.create(model="m", messages=MSGS, stream=True, timeout=5)
    await s.aclose()
    await anyio.sleep(0.2)  # the connection is closed on the loop, after the finaliser
    assert_pool_clean(client)


async def test_a_dropped_transport_stream_returns_its_entry(fault_server: Any) -> None:
    body = json.dumps({"model": "m", "stream": True, "messages": MSGS})
    url = fault_server.url("sse_stall", after=1, hold=HOLD) + "/chat/completions"
    async with stallproof.http_client(timeout=30, retry=None) as client:

        async def make() -> Any:
            request = client.build_request("POST", url, content=body)
            return await client.send(request, stream=True)

        with pytest.warns(ResourceWarning, match="never closed"):
            await _drop(make)
        transport = client._transport
        assert isinstance(transport, stallproof.AsyncTransport)
        assert transport.inflight() == ()
        await anyio.sleep(0.2)  # the connection is closed on the loop, after the finaliser
        assert transport.engine.pool.stats().nothing_held
