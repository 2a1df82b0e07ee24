"""The openai SDK, hardened, against every fault: stream and non-stream.

Two ways a caller runs the openai SDK over stallproof's engine:

- ``face``: `stallproof.openai.AsyncOpenAI` (httpx2 under the SDK);
- ``legacy``: plain ``openai.AsyncOpenAI(http_client=stallproof.http_client(...))`` (the
  SDK on the old httpx);

The anthropic SDK's catalogue is in test_sdk_catalogue_anthropic.py, the Responses API's
in test_sdk_responses.py.

Each call must end within its bound + MARGIN with the SDK's own error class — whose
``__cause__`` is the stallproof error that names the bound — or succeed where the fault is
survivable, and leave no connection held. The catalogue runs on asyncio; the bounds that
matter most run on asyncio and trio below (both SDKs run on trio through anyio).
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

import fault_server
import stallproof
import stallproof.anthropic
import stallproof.openai

from ..support.clients import KEY, sdk_pool_held
from ..support.sdk_catalogue import (
    BUDGET,
    LIMITS,
    OK,
    PARAMS,
    TOOL_FAULTS,
    TOOLS,
    C,
    T,
    budget_for,
    limit_of,
    named_error,
    outcome_of,
)
from ..support.timing import MARGIN, SentClock

# Breadth over the whole catalogue: `make test` runs it, the quick loop leaves it out.
pytestmark = [pytest.mark.anyio, pytest.mark.slow]

EXPECTED: dict[str, tuple[str, str]] = {
    "healthy": (OK, OK),
    "half_open": (T + "FirstTokenTimeout", T + "FirstTokenTimeout"),
    "reset": (C + "ConnectionLost", C + "ConnectionLost"),
    "close_mid_body": (C + "TruncatedResponse", C + "TruncatedResponse"),
    "half_close": (C + "TruncatedResponse", C + "TruncatedResponse"),
    "cut_after": (C + "ConnectionLost", C + "ConnectionLost"),
    "stall_headers": (T + "FirstTokenTimeout", T + "FirstTokenTimeout"),
    "stall_in_headers": (T + "FirstTokenTimeout", T + "FirstTokenTimeout"),
    "trickle_headers": (T + "FirstTokenTimeout", T + "FirstTokenTimeout"),
    "trickle_body": (T + "FirstTokenTimeout", T + "FirstTokenTimeout"),
    "content_length_lie": (T + "ReadTimeout", OK),
    "chunked_no_end": (T + "ReadTimeout", T + "IdleTimeout"),
    "endless_body": (T + "TotalTimeout", T + "TotalTimeout"),
    "huge_body": (C + "ResponseTooLarge", C + "ResponseTooLarge"),
    "sse_keepalive": (T + "TotalTimeout", T + "FirstTokenTimeout"),
    "sse_pings": (T + "TotalTimeout", T + "FirstTokenTimeout"),
    "sse_empty_deltas": (T + "TotalTimeout", T + "FirstTokenTimeout"),
    "sse_stall": (T + "ReadTimeout", T + "IdleTimeout"),
    "no_done": (OK, OK),
    "done_then_hold": (T + "ReadTimeout", OK),
    "data_after_done": (OK, OK),
    # The SDK parses the body itself; the transport's response (its json()) and the
    # face's events make a body that is not JSON a typed MalformedResponse (see LEGACY).
    "malformed_json": ("APIError/MalformedResponse", "APIError/MalformedResponse"),
    # A 200 whose body is an error object: no completion in it, so the face raises the
    # SDK's validation error (the stock SDK returns a completion of Nones); a stream's
    # error event is the SDK's APIError.
    "error_event": ("APIResponseValidationError/", "APIError/"),
    "sse_crlf": (OK, OK),
    "sse_multiline": (OK, OK),
    "sse_long_line": (OK, C + "ResponseTooLarge"),
    "endless_line": (T + "TotalTimeout", T + "FirstTokenTimeout"),
    "bad_usage": (OK, OK),
    "tool_split": (OK, OK),
    "index_gap": (OK, OK),
    "tool_args_unclosed": (OK, OK),
    "json_for_stream": (OK, OK),
    "status": ("InternalServerError/", "InternalServerError/"),
    "slow_first_token": (T + "FirstTokenTimeout", T + "FirstTokenTimeout"),
    "token_rate": (OK, OK),
    "rate_limit": (OK, OK),  # a full bucket: the first request passes, with its headers
    "slicer": (OK, OK),
}


# The stock SDK on `stallproof.http_client()`: its own SSE decoder parses the events,
# with json's own error; and it has no result checks.
LEGACY: dict[str, tuple[str, str]] = {
    "malformed_json": ("APIError/MalformedResponse", "JSONDecodeError/"),
    "error_event": (OK, "APIError/"),
}


def openai_client(kind: str, base_url: str, **settings: Any) -> openai.AsyncOpenAI:
    settings.setdefault("timeout", BUDGET)
    settings.setdefault("limits", LIMITS)
    settings.setdefault("retry", None)
    if kind == "face":
        return stallproof.openai.AsyncOpenAI(api_key=KEY, base_url=base_url, **settings)
    # The legacy path: the stock SDK on the old httpx, with its own retries off.
    return openai.AsyncOpenAI(
        api_key=KEY,
        base_url=base_url,
        max_retries=0,
        # openai types http_client as httpx2's; it still takes an httpx one (this path).
        http_client=stallproof.http_client(**settings),  # type: ignore[arg-type]
    )


def test_every_request_fault_has_a_pinned_outcome() -> None:
    request_faults = {n for n, f in fault_server.FAULTS.items() if f.scope == "request"}
    assert request_faults == set(EXPECTED)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("kind", ["face", "legacy"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("fault", sorted(EXPECTED))
async def test_openai_sdk_against_the_catalogue(
    fault: str, stream: bool, kind: str, fault_server: Any
) -> None:
    url = fault_server.url(fault, hold=10, **PARAMS.get(fault, {}))
    expected = LEGACY.get(fault, EXPECTED[fault]) if kind == "legacy" else EXPECTED[fault]
    budget = budget_for(expected[stream])
    client = openai_client(kind, url, timeout=budget)
    extra: dict[str, Any] = {"tools": TOOLS} if fault in TOOL_FAULTS else {}
    outcome, limit, error = OK, budget.total, None
    clock = SentClock(client)
    async with client:
        try:
            r = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=stream, **extra
            )
            if stream:
                assert isinstance(r, openai.AsyncStream)
                async for _ in r:
                    clock.saw()
        except Exception as e:
            outcome, limit, error = outcome_of(e), limit_of(e, budget.total), e
        in_bound = clock.in_bound(outcome)
        assert outcome == expected[stream]
        assert in_bound <= limit + MARGIN, (in_bound, repr(named_error(error)))
        assert sdk_pool_held(client) == {"requests": 0, "active": 0}
