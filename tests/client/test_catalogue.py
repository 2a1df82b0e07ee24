"""stallproof against the whole fault catalogue: every fault, stream and non-stream.

Each call must end within its bound + MARGIN with the outcome pinned below: a success, or
the typed error that names what went wrong. Never an untyped error, never a hang, never a
leaked connection. (Per-bound timing on both backends is in test_bounds.py; this is the
breadth test, on asyncio.)
"""

from __future__ import annotations

from typing import Any

import pytest

import fault_server
import stallproof

from ..support.clients import MakeClient, assert_pool_clean, warm
from ..support.sdk_catalogue import LIMITS, OK, PARAMS, TOOL_FAULTS, TOOLS, budget_for
from ..support.timing import MARGIN, SentClock

# Breadth over the whole catalogue: `make test` runs it, the quick loop leaves it out.
pytestmark = [pytest.mark.anyio, pytest.mark.slow]


# (fault, stream) -> outcome. Both modes unless a mode is named.
EXPECTED: dict[str, tuple[str, str]] = {
    # fault: (non-stream, stream)
    "healthy": (OK, OK),
    "half_open": ("FirstTokenTimeout", "FirstTokenTimeout"),
    "reset": ("ConnectionLost", "ConnectionLost"),
    "close_mid_body": ("TruncatedResponse", "TruncatedResponse"),
    "half_close": ("TruncatedResponse", "TruncatedResponse"),
    "cut_after": ("ConnectionLost", "ConnectionLost"),
    "stall_headers": ("FirstTokenTimeout", "FirstTokenTimeout"),
    "stall_in_headers": ("FirstTokenTimeout", "FirstTokenTimeout"),
    "trickle_headers": ("FirstTokenTimeout", "FirstTokenTimeout"),
    "trickle_body": ("FirstTokenTimeout", "FirstTokenTimeout"),
    # The stream gets [DONE] and does not wait for the missing bytes.
    "content_length_lie": ("ReadTimeout", OK),
    "chunked_no_end": ("ReadTimeout", "IdleTimeout"),
    "endless_body": ("TotalTimeout", "TotalTimeout"),
    "huge_body": ("ResponseTooLarge", "ResponseTooLarge"),
    "sse_keepalive": ("TotalTimeout", "FirstTokenTimeout"),
    "sse_pings": ("TotalTimeout", "FirstTokenTimeout"),
    "sse_empty_deltas": ("TotalTimeout", "FirstTokenTimeout"),
    "sse_stall": ("ReadTimeout", "IdleTimeout"),
    "no_done": (OK, OK),
    # Non-stream: the JSON is complete but its chunked body never ends.
    "done_then_hold": ("ReadTimeout", OK),
    "data_after_done": (OK, OK),
    "malformed_json": ("MalformedResponse", "MalformedResponse"),
    "error_event": ("StreamErrorEvent", "StreamErrorEvent"),
    "sse_crlf": (OK, OK),
    "sse_multiline": (OK, OK),
    "sse_long_line": (OK, "ResponseTooLarge"),
    "endless_line": ("TotalTimeout", "FirstTokenTimeout"),
    "bad_usage": (OK, OK),
    "tool_split": (OK, OK),
    "index_gap": (OK, OK),
    "tool_args_unclosed": (OK, OK),
    "json_for_stream": (OK, "MalformedResponse"),
    "status": ("InternalServerError", "InternalServerError"),
    # A full bucket (3 tokens): served, with x-ratelimit-* headers.
    "rate_limit": (OK, OK),
    # Sliced into 8-byte writes, a millisecond apart: slow, whole.
    "slicer": (OK, OK),
    "slow_first_token": ("FirstTokenTimeout", "FirstTokenTimeout"),
    "token_rate": (OK, OK),
}


def test_every_request_fault_has_a_pinned_outcome() -> None:
    request_faults = {n for n, f in fault_server.FAULTS.items() if f.scope == "request"}
    assert request_faults == set(EXPECTED)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("fault", sorted(EXPECTED))
async def test_client_against_the_catalogue(
    fault: str, stream: bool, fault_server: Any, fault_scope: Any, make_client: MakeClient
) -> None:
    budget = budget_for(EXPECTED[fault][stream])
    client = make_client(fault_server.url(), timeout=budget, limits=LIMITS)
    # On a warm connection the request goes out as the engine takes the call: first_token,
    # which starts when the request is sent, is then measured from its start too.
    await warm(client)
    extra: dict[str, Any] = {"tools": TOOLS} if fault in TOOL_FAULTS else {}
    extra["extra_headers"] = fault_scope.headers(fault, hold=10, **PARAMS.get(fault, {}))
    outcome = OK
    limit = budget.total
    clock = SentClock(client)
    try:
        r = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=stream, **extra
        )
        if stream:
            assert isinstance(r, stallproof.AsyncStream)
            async for _ in r:
                clock.saw()
    except stallproof.StallproofError as e:
        outcome = type(e).__name__
        if isinstance(e, stallproof.TimeoutException):
            limit = e.limit
    elapsed = clock.in_bound(outcome)
    assert outcome == EXPECTED[fault][stream]
    assert elapsed <= limit + MARGIN
    assert_pool_clean(client)
