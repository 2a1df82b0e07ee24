"""`stallproof.Client` on the Responses API (``client.responses``), and the body of a
``with_streaming_response`` call read as openai's streaming response reads it
(``iter_bytes``, ``iter_text``, ``iter_lines``, ``read``, ``json``).

The native client's Responses calls meet the stall faults as the openai face's do
(tests/integrations/test_sdk_responses.py): each ends within its bound + MARGIN with the
error that names the bound, or succeeds with openai's own types, on asyncio and trio, and
leaves no connection held. The clock starts when the request is sent: the client is warmed
first, so the request goes out at once on a pooled connection.
"""

from __future__ import annotations

import json
import time
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from openai.types.responses import Response, ResponseCompletedEvent, ResponseTextDeltaEvent

import stallproof

from ..support.clients import MakeClient, assert_pool_clean, warm
from ..support.sdk_catalogue import LIMITS, OK, PARAMS, budget_for, limit_of, outcome_of
from ..support.timing import MARGIN, SentClock

pytestmark = pytest.mark.anyio

T = "APITimeoutError/"
# fault: (non-stream, stream) -> the openai class / stallproof's class (ours are both).
EXPECTED: dict[str, tuple[str, str]] = {
    "healthy": (OK, OK),
    "stall_headers": (T + "FirstTokenTimeout", T + "FirstTokenTimeout"),
    "trickle_body": (T + "FirstTokenTimeout", T + "FirstTokenTimeout"),
    "slow_first_token": (T + "FirstTokenTimeout", T + "IdleTimeout"),
    "sse_keepalive": (T + "TotalTimeout", T + "FirstTokenTimeout"),
    "sse_pings": (T + "TotalTimeout", T + "IdleTimeout"),
    "sse_empty_deltas": (T + "TotalTimeout", T + "IdleTimeout"),
    "sse_stall": (T + "ReadTimeout", T + "IdleTimeout"),
    # Held open after response.completed: the stream ends at that event.
    "done_then_hold": (T + "ReadTimeout", OK),
}
FAULT_PARAMS: dict[str, dict[str, Any]] = {
    "sse_empty_deltas": {"interval": 0.2},
    "sse_keepalive": PARAMS["sse_keepalive"],  # (its first byte well before first_token)
    "done_then_hold": {"tokens": 2},
}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("fault", sorted(EXPECTED))
async def test_responses_against_the_stall_faults(
    fault: str, stream: bool, make_client: MakeClient, fault_server: Any
) -> None:
    budget = budget_for(EXPECTED[fault][stream])
    client = make_client(fault_server.url(), timeout=budget, limits=LIMITS, retry=None)
    await warm(client)
    url_path = fault_server.url(fault, hold=10, **FAULT_PARAMS.get(fault, {}))
    extra: dict[str, Any] = {
        "extra_headers": {"x-fault": url_path.split("/fault/")[1].split("/v1")[0]}
    }
    outcome, limit = OK, budget.total
    texts: list[str] = []
    clock = SentClock(client)
    try:
        r = await client.responses.create(model="m", input="hi", stream=stream, **extra)
        if stream:
            assert isinstance(r, stallproof.ResponseStream)
            async for event in r:
                clock.saw()
                if isinstance(event, ResponseTextDeltaEvent):
                    texts.append(event.delta)
        else:
            assert isinstance(r, Response)
            texts.append(r.output_text)
    except Exception as e:
        outcome, limit = outcome_of(e), limit_of(e, budget.total)
    in_bound, elapsed = clock.in_bound(outcome), clock.elapsed()
    assert outcome == EXPECTED[fault][stream]
    assert elapsed <= budget.total + MARGIN
    # idle from the last event the caller got, any other bound from the engine taking the call.
    assert in_bound <= limit + MARGIN
    if outcome == OK:
        assert "".join(texts)
    assert_pool_clean(client)


async def test_a_healthy_stream_is_typed_and_ends_at_its_last_event(
    make_client: MakeClient, fault_server: Any
) -> None:
    client = make_client(fault_server.url(), timeout=5, retry=None)
    stream = await client.responses.create(model="m", input="hello there", stream=True)
    assert isinstance(stream, stallproof.ResponseStream)
    events = [event async for event in stream]
    assert isinstance(events[-1], ResponseCompletedEvent)
    assert all(isinstance(e.sequence_number, int) for e in events)
    assert events[-1].response.output_text == "".join(
        e.delta for e in events if isinstance(e, ResponseTextDeltaEvent)
    )
    assert_pool_clean(client)


async def test_an_error_event_raises_stream_error_event(
    make_client: MakeClient, fault_server: Any
) -> None:
    client = make_client(fault_server.url("error_event"), timeout=5, retry=None)
    stream = await client.responses.create(model="m", input="hi", stream=True)
    with pytest.raises(stallproof.StreamErrorEvent):
        async for _ in stream:
            pass
    assert_pool_clean(client)


async def test_bad_arguments_are_refused_before_anything_is_sent(make_client: MakeClient) -> None:
    client: stallproof.Client = make_client("http://127.0.0.1:9/v1")
    with pytest.raises(TypeError, match="max_token"):
        await client.responses.create(model="m", input="hi", max_token=5)  # type: ignore[call-overload]
    with pytest.raises(stallproof.InvalidRequestError, match="model"):
        await client.responses.create(model="", input="hi")
    with pytest.raises(stallproof.InvalidRequestError, match="stream"):
        await client.responses.create(model="m", input="hi", stream="yes")  # type: ignore[call-overload]


async def test_raw_and_streaming_responses(make_client: MakeClient, fault_server: Any) -> None:
    client = make_client(fault_server.url(), timeout=5, retry=None)
    raw = await client.responses.with_raw_response.create(model="m", input="hi")
    assert raw.status_code == 200 and isinstance(raw.parse(), Response)
    async with client.responses.with_streaming_response.create(model="m", input="hi") as r:
        assert r.status_code == 200
        assert isinstance(await r.parse(), Response)
    assert_pool_clean(client)


# -- with_streaming_response: the body as openai's streaming response reads it -------------


async def test_iter_lines_reads_a_stream_line_by_line_under_the_bounds(
    make_client: MakeClient, fault_server: Any
) -> None:
    client = make_client(fault_server.url(), timeout=5, retry=None)
    msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]
    async with client.chat.completions.with_streaming_response.create(
        model="m", messages=msgs, stream=True
    ) as r:
        lines = [line async for line in r.iter_lines()]
    data = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "" in lines  # the blank line that ends each event is a line too
    assert_pool_clean(client)


async def test_iter_bytes_in_pieces_read_and_json(
    make_client: MakeClient, fault_server: Any
) -> None:
    client = make_client(fault_server.url(), timeout=5, retry=None)
    msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]
    async with client.chat.completions.with_streaming_response.create(
        model="m", messages=msgs
    ) as r:
        pieces = [piece async for piece in r.iter_bytes(chunk_size=7)]
    assert all(len(p) == 7 for p in pieces[:-1]) and 0 < len(pieces[-1]) <= 7
    whole = json.loads(b"".join(pieces))
    assert whole["object"] == "chat.completion"
    async with client.chat.completions.with_streaming_response.create(
        model="m", messages=msgs
    ) as r:
        assert (await r.json())["object"] == "chat.completion"
        with pytest.raises(RuntimeError, match="already read"):
            await r.read()
    with pytest.raises(stallproof.InvalidRequestError, match="chunk_size"):
        async with client.chat.completions.with_streaming_response.create(
            model="m", messages=msgs
        ) as r:
            async for _ in r.iter_bytes(chunk_size=0):
                pass
    assert_pool_clean(client)


async def test_iter_lines_of_a_trickled_stream_ends_at_idle(
    make_client: MakeClient, fault_server: Any
) -> None:
    client = make_client(
        fault_server.url("sse_stall", hold=10, tokens=2),
        timeout=stallproof.Timeouts(idle=0.5, total=5),
        retry=None,
    )
    msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
    last = time.monotonic()
    with pytest.raises(stallproof.IdleTimeout):
        async with client.chat.completions.with_streaming_response.create(
            model="m", messages=msgs, stream=True
        ) as r:
            async for _ in r.iter_lines():
                last = time.monotonic()
    assert time.monotonic() - last <= 0.5 + MARGIN
    assert_pool_clean(client)


async def test_leaving_the_block_unread_releases_the_connection(
    make_client: MakeClient, fault_server: Any
) -> None:
    client = make_client(fault_server.url("sse_keepalive", hold=10), timeout=5, retry=None)
    msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.APITimeoutError):  # first_token: keep-alives are not content
        async with client.chat.completions.with_streaming_response.create(
            model="m", messages=msgs, stream=True, timeout=stallproof.Timeouts(first_token=0.3)
        ):
            pass
    assert_pool_clean(client)
