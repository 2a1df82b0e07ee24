"""The anthropic SDK, hardened, against every request fault of the catalogue.

`stallproof.anthropic.AsyncAnthropic` against the fault server's ``/v1/messages``
(Anthropic's Messages API: named SSE events, ``ping`` keep-alives), stream and non-stream,
on asyncio and trio. Each call must end within its bound + MARGIN with anthropic's own
error class — whose ``__cause__`` is the stallproof error that names the bound — or succeed
where the fault is survivable, and leave no connection held.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import pytest

import fault_server
import stallproof
import stallproof.anthropic

from ..support.clients import KEY, sdk_pool_held
from ..support.sdk_catalogue import (
    BUDGET,
    LIMITS,
    OK,
    PARAMS,
    TOOL_FAULTS,
    C,
    T,
    budget_for,
    named_error,
)
from ..support.timing import MARGIN, SentClock

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,  # breadth over the whole catalogue: the quick loop leaves it out
    # On an error event, anthropic's stream raises from inside its own async generator and
    # drops the chain under it unfinished (its decoder, httpx2's and our body iterators):
    # trio reports each one when the GC collects it. The connection is released all the
    # same (the `claude` fixture checks the pool).
    pytest.mark.filterwarnings("ignore:Async generator 'anthropic\\.:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:Async generator 'httpx2\\.:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:Async generator 'stallproof\\.:ResourceWarning"),
]

# The keep-alive faults send their events faster than `idle`, so that only a bound that
# counts content can end them.
FAULT_PARAMS: dict[str, dict[str, Any]] = {**PARAMS, "sse_empty_deltas": {"interval": 0.2}}

# fault: (non-stream, stream) -> anthropic's error class / the stallproof error as its cause.
EXPECTED: dict[str, tuple[str, str]] = {
    # bad_usage and the tool faults break chat completions only: the server refuses them
    # on /v1/messages, and the SDK raises its own error for the 400.
    "bad_usage": ("BadRequestError/", "BadRequestError/"),
    "chunked_no_end": (T + "ReadTimeout", T + "IdleTimeout"),
    "close_mid_body": (C + "TruncatedResponse", C + "TruncatedResponse"),
    # The whole stream, then bytes the Content-Length promised and never sent: the stream is
    # complete at message_stop, so the engine ends the body after a brief drain (as chat).
    "content_length_lie": (T + "ReadTimeout", OK),
    "cut_after": (C + "ConnectionLost", C + "ConnectionLost"),
    "data_after_done": (OK, OK),
    # Held open after message_stop: the engine ends the body after a brief drain.
    "done_then_hold": (T + "ReadTimeout", OK),
    "endless_body": (T + "TotalTimeout", T + "TotalTimeout"),
    "endless_line": (T + "TotalTimeout", T + "IdleTimeout"),
    # A 200 whose body is an error object holds no message: the face raises the SDK's
    # validation error; a stream's error event is anthropic's APIStatusError.
    "error_event": ("APIResponseValidationError/", "APIStatusError/"),
    "half_close": (C + "TruncatedResponse", C + "TruncatedResponse"),
    "half_open": (T + "FirstTokenTimeout", T + "FirstTokenTimeout"),
    "healthy": (OK, OK),
    "huge_body": (C + "ResponseTooLarge", C + "ResponseTooLarge"),
    "index_gap": ("BadRequestError/", "BadRequestError/"),
    "json_for_stream": (OK, OK),
    # The SDK parses a whole body, and a named stream event (fault_server issue 23: the
    # broken event now carries its event: line), through the transport's typed json():
    # a body or event that is not JSON is a typed MalformedResponse.
    "malformed_json": ("MalformedResponse/", "MalformedResponse/"),
    "no_done": (OK, OK),
    "rate_limit": (OK, OK),
    "reset": (C + "ConnectionLost", C + "ConnectionLost"),
    "slicer": (OK, OK),
    "slow_first_token": (T + "FirstTokenTimeout", T + "IdleTimeout"),
    "sse_crlf": (OK, OK),
    "sse_empty_deltas": (T + "TotalTimeout", T + "IdleTimeout"),
    "sse_keepalive": (T + "TotalTimeout", T + "FirstTokenTimeout"),
    "sse_long_line": (OK, C + "ResponseTooLarge"),
    "sse_multiline": (OK, OK),
    "sse_pings": (T + "TotalTimeout", T + "IdleTimeout"),
    "sse_stall": (T + "ReadTimeout", T + "IdleTimeout"),
    "stall_headers": (T + "FirstTokenTimeout", T + "FirstTokenTimeout"),
    "stall_in_headers": (T + "FirstTokenTimeout", T + "FirstTokenTimeout"),
    "status": ("InternalServerError/", "InternalServerError/"),
    "token_rate": (OK, OK),
    "tool_args_unclosed": ("BadRequestError/", "BadRequestError/"),
    "tool_split": ("BadRequestError/", "BadRequestError/"),
    "trickle_body": (T + "FirstTokenTimeout", T + "FirstTokenTimeout"),
    "trickle_headers": (T + "FirstTokenTimeout", T + "FirstTokenTimeout"),
}


def outcome_of(error: BaseException) -> str:
    cause = error.__cause__
    named = type(cause).__name__ if isinstance(cause, stallproof.StallproofError) else ""
    return f"{type(error).__name__}/{named}"


def limit_of(error: BaseException, default: float) -> float:
    cause = error.__cause__
    return cause.limit if isinstance(cause, stallproof.TimeoutException) else default


def messages_url(url: str) -> str:
    """The SDK adds ``/v1/messages`` to its ``base_url``: the fault server's URL without
    its ``/v1``."""
    return url.removesuffix("/v1")


@pytest.fixture
async def claude() -> AsyncIterator[Any]:
    clients: list[stallproof.anthropic.AsyncAnthropic] = []

    def factory(url: str, **settings: Any) -> stallproof.anthropic.AsyncAnthropic:
        settings.setdefault("timeout", BUDGET)
        settings.setdefault("limits", LIMITS)
        settings.setdefault("retry", None)
        client = stallproof.anthropic.AsyncAnthropic(
            api_key=KEY, base_url=messages_url(url), **settings
        )
        clients.append(client)
        return client

    yield factory
    for client in clients:
        assert sdk_pool_held(client) == {"requests": 0, "active": 0}
        await client.close()


async def ask_claude(
    client: anthropic.AsyncAnthropic, *, stream: bool, tools: bool, clock: SentClock | None = None
) -> None:
    extra: dict[str, Any] = {}
    if tools:
        extra["tools"] = [{"name": "save", "input_schema": {"type": "object"}}]
    messages: Any = [{"role": "user", "content": "hi"}]
    if stream:
        events = await client.messages.create(
            model="claude-test", max_tokens=64, messages=messages, stream=True, **extra
        )
        async for _ in events:
            if clock is not None:
                clock.saw()
    else:
        await client.messages.create(model="claude-test", max_tokens=64, messages=messages, **extra)


def test_every_request_fault_has_a_pinned_outcome() -> None:
    request_faults = {n for n, f in fault_server.FAULTS.items() if f.scope == "request"}
    assert request_faults == set(EXPECTED)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("fault", sorted(EXPECTED))
async def test_anthropic_sdk_against_the_catalogue(
    fault: str, stream: bool, fault_server: Any, claude: Any
) -> None:
    budget = budget_for(EXPECTED[fault][stream])
    url = fault_server.url(fault, hold=10, **FAULT_PARAMS.get(fault, {}))
    client = claude(url, timeout=budget)
    outcome, limit, error = OK, budget.total, None
    clock = SentClock(client)
    try:
        await ask_claude(client, stream=stream, tools=fault in TOOL_FAULTS, clock=clock)
    except Exception as e:
        outcome, limit, error = outcome_of(e), limit_of(e, budget.total), e
    elapsed = clock.in_bound(outcome)
    assert outcome == EXPECTED[fault][stream]
    assert elapsed <= limit + MARGIN, (elapsed, repr(named_error(error)))


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_an_overloaded_answer_is_anthropics_overloaded_error(
    stream: bool, fault_server: Any, claude: Any
) -> None:
    client = claude(fault_server.url("status", code=529))
    with pytest.raises(anthropic.OverloadedError):
        await ask_claude(client, stream=stream, tools=False)
