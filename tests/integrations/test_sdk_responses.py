"""The openai face on the Responses API (``responses.create``) against the stall faults.

openai-agents and other new code call ``client.responses.create`` rather than chat
completions. The fault server's ``/v1/responses`` speaks the Responses API (typed
``response.*`` events numbered by ``sequence_number``); its keep-alive faults send
comments and events that carry no output text. Each call must end within its bound +
MARGIN with ``openai.APITimeoutError`` — whose ``__cause__`` is the stallproof error that
names the bound — or succeed, on asyncio and trio, and leave no connection held.
"""

from __future__ import annotations

import time
from typing import Any

import openai
import pytest

import stallproof
import stallproof.anthropic
import stallproof.openai

from ..support.clients import KEY, sdk_pool_held
from ..support.sdk_catalogue import (
    LIMITS,
    OK,
    PARAMS,
    T,
    budget_for,
    limit_of,
    named_error,
    outcome_of,
)
from ..support.timing import MARGIN, SentClock

# Breadth over the whole catalogue: `make test` runs it, the quick loop leaves it out.
pytestmark = [pytest.mark.anyio, pytest.mark.slow]

# fault: (non-stream, stream) -> the SDK's error class / the stallproof error as its cause.
EXPECTED: dict[str, tuple[str, str]] = {
    "healthy": (OK, OK),
    "no_done": (OK, OK),
    "half_open": (T + "FirstTokenTimeout", T + "FirstTokenTimeout"),
    "stall_headers": (T + "FirstTokenTimeout", T + "FirstTokenTimeout"),
    "stall_in_headers": (T + "FirstTokenTimeout", T + "FirstTokenTimeout"),
    "trickle_headers": (T + "FirstTokenTimeout", T + "FirstTokenTimeout"),
    "trickle_body": (T + "FirstTokenTimeout", T + "FirstTokenTimeout"),
    "slow_first_token": (T + "FirstTokenTimeout", T + "IdleTimeout"),
    # Keep-alives: comments, ping events, empty ``response.output_text.delta`` events.
    "sse_keepalive": (T + "TotalTimeout", T + "FirstTokenTimeout"),
    "sse_pings": (T + "TotalTimeout", T + "IdleTimeout"),
    "sse_empty_deltas": (T + "TotalTimeout", T + "IdleTimeout"),
    "sse_stall": (T + "ReadTimeout", T + "IdleTimeout"),
    "chunked_no_end": (T + "ReadTimeout", T + "IdleTimeout"),
    # Held open after response.completed: the engine ends the body after a brief drain.
    "done_then_hold": (T + "ReadTimeout", OK),
    "endless_body": (T + "TotalTimeout", T + "TotalTimeout"),
    "endless_line": (T + "TotalTimeout", T + "IdleTimeout"),
}
# sse_empty_deltas faster than idle, so that only a bound that counts content can end it;
# a short answer before a stall, so that idle (not total) ends it on a busy machine.
FAULT_PARAMS: dict[str, dict[str, Any]] = {
    "sse_empty_deltas": {"interval": 0.2},
    "sse_keepalive": PARAMS["sse_keepalive"],  # (its first byte well before first_token)
    **{f: {"tokens": 2} for f in ("done_then_hold", "chunked_no_end")},
}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("fault", sorted(EXPECTED))
async def test_responses_against_the_stall_faults(
    fault: str, stream: bool, fault_server: Any
) -> None:
    url = fault_server.url(fault, hold=10, **FAULT_PARAMS.get(fault, {}))
    budget = budget_for(EXPECTED[fault][stream])
    client = stallproof.openai.AsyncOpenAI(
        api_key=KEY, base_url=url, timeout=budget, limits=LIMITS, retry=None
    )
    outcome, limit, error = OK, budget.total, None
    clock = SentClock(client)
    async with client:
        try:
            r = await client.responses.create(model="m", input="hi", stream=stream)
            if stream:
                assert isinstance(r, openai.AsyncStream)
                async for _ in r:
                    clock.saw()
        except Exception as e:
            outcome, limit, error = outcome_of(e), limit_of(e, budget.total), e
        in_bound, elapsed = clock.in_bound(outcome), clock.elapsed()
        assert outcome == EXPECTED[fault][stream]
        assert elapsed <= budget.total + MARGIN
        # idle from the last event the caller got (it starts at the last content event, at
        # the latest that one); first_token and read from the engine taking the call.
        assert in_bound <= limit + MARGIN, (in_bound, repr(named_error(error)))
        assert sdk_pool_held(client) == {"requests": 0, "active": 0}


@pytest.mark.parametrize("face", ["openai", "anthropic"])
async def test_a_complete_stream_held_open_ends_soon_after_its_last_event(
    face: str, fault_server: Any
) -> None:
    # The SDKs read a Responses or Messages stream to the end of the body. After the last
    # event (response.completed, message_stop) the engine drains briefly (0.25 s) and ends
    # the body, rather than letting idle turn a complete answer into an error.
    url = fault_server.url("done_then_hold", hold=10, tokens=2)
    timeout = stallproof.Timeouts(idle=2, total=5)
    client: Any
    if face == "openai":
        client = stallproof.openai.AsyncOpenAI(
            api_key=KEY, base_url=url, timeout=timeout, retry=None
        )
    else:
        client = stallproof.anthropic.AsyncAnthropic(
            api_key=KEY, base_url=url.removesuffix("/v1"), timeout=timeout, retry=None
        )
    async with client:
        if face == "openai":
            stream = await client.responses.create(model="m", input="hi", stream=True)
        else:
            stream = await client.messages.create(
                model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}], stream=True
            )
        kinds = []
        async for event in stream:
            kinds.append(event.type)
            last_event = time.monotonic()
        ended = time.monotonic()
        assert kinds[-1] == ("response.completed" if face == "openai" else "message_stop")
        assert ended - last_event <= 0.25 + MARGIN
        assert sdk_pool_held(client) == {"requests": 0, "active": 0}
