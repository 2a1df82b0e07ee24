"""Retries over real sockets: what is retried, Retry-After, the deadline, the budget."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import anyio
import pytest
from openai.types.chat import ChatCompletionMessageParam

import stallproof

from ..support.clients import MakeClient, spying_client
from ..support.timing import MARGIN, stopwatch

pytestmark = pytest.mark.anyio

MSGS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]
FAST = stallproof.Retry(attempts=3, backoff_base=0.05, backoff_max=0.1)


def fault(spec: str, key: str, **params: Any) -> dict[str, str]:
    extra = "".join(f";{k}={v}" for k, v in params.items())
    return {"X-Fault": f"{spec};key={key}{extra}"}


async def test_503_twice_then_success_on_attempt_3(
    fault_server: Any, fault_key: str, make_client: MakeClient
) -> None:
    client, sent = spying_client(make_client, fault_server.url(), retry=FAST)
    seen = sent.headers
    resp = await client.chat.completions.create(
        model="m", messages=MSGS, extra_headers=fault("status;code=503", fault_key, first=2)
    )
    assert resp.choices[0].message.content
    assert fault_server.key_stats(fault_key).requests == 3
    assert [h["x-stallproof-attempt"] for h in seen] == ["1/3", "2/3", "3/3"]
    keys = {h["idempotency-key"] for h in seen}
    assert len(keys) == 1 and keys.pop().startswith("stallproof-sp-")
    assert len({h["x-request-id"] for h in seen}) == 1


async def test_retry_after_is_waited(
    fault_server: Any, fault_key: str, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url(), retry=FAST, timeout=5)
    with stopwatch() as elapsed:
        resp = await client.chat.completions.create(
            model="m",
            messages=MSGS,
            extra_headers=fault("status;code=429;retry_after=1", fault_key, first=1),
        )
    assert resp.choices
    assert elapsed[0] >= 1.0
    assert fault_server.key_stats(fault_key).requests == 2


async def test_retry_after_ms_is_preferred(
    fault_server: Any, fault_key: str, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url(), retry=FAST, timeout=5)
    with stopwatch() as elapsed:
        await client.chat.completions.create(
            model="m",
            messages=MSGS,
            extra_headers=fault(
                "status;code=503;retry_after=9;retry_after_ms=200", fault_key, first=1
            ),
        )
    assert 0.2 <= elapsed[0] < 1.0


async def test_retry_after_that_cannot_fit_fails_at_once(
    fault_server: Any, fault_key: str, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url(), retry=FAST, timeout=3)
    with stopwatch() as elapsed, pytest.raises(stallproof.RetryWouldExceedDeadline) as info:
        await client.chat.completions.create(
            model="m",
            messages=MSGS,
            extra_headers=fault("status;code=503;retry_after=100", fault_key),
        )
    assert elapsed[0] < 0.1
    err = info.value
    assert isinstance(err, stallproof.TotalTimeout)  # callers catching total catch this too
    assert isinstance(err.__cause__, stallproof.InternalServerError)
    assert err.retry_after == 60.0  # clamped to Retry.retry_after_max
    assert 2.5 < err.remaining <= 3.0
    assert "60.000s" in str(err) and "left" in str(err)
    assert fault_server.key_stats(fault_key).requests == 1


@pytest.mark.slow
@pytest.mark.parametrize("first_token", [0.5, 10.0])
async def test_stalled_server_ends_within_total_whatever_the_attempt_bounds(
    first_token: float, fault_server: Any, make_client: MakeClient
) -> None:
    # An attempt bound 0.7 s inside total (retried), or far past it. FAST's 3 attempts of
    # 0.5 s cannot all end before 1.5 s: total (1.2 s) ends the third.
    client = make_client(fault_server.url("half_open", hold=20), retry=FAST)
    timeouts = stallproof.Timeouts(total=1.2, first_token=first_token)
    with stopwatch() as elapsed, pytest.raises(stallproof.TotalTimeout):
        await client.chat.completions.create(model="m", messages=MSGS, timeout=timeouts)
    assert elapsed[0] <= 1.2 + MARGIN


async def test_stream_that_dies_after_content_is_not_retried(
    fault_server: Any, fault_key: str, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url(), retry=FAST)
    stream = await client.chat.completions.create(
        model="m",
        messages=MSGS,
        stream=True,
        timeout=stallproof.Timeouts(idle=0.3, total=5),
        extra_headers=fault("sse_stall;after=2;hold=10", fault_key),
    )
    got = []
    with pytest.raises(stallproof.IdleTimeout):
        async for chunk in stream:
            got.append(chunk)
    assert got
    assert fault_server.key_stats(fault_key).requests == 1

    reset_key = fault_key + "-reset"
    stream = await client.chat.completions.create(
        model="m",
        messages=MSGS,
        stream=True,
        extra_headers=fault("reset;when=mid;after=2", reset_key),
    )
    with pytest.raises(stallproof.ConnectionLost):
        async for _ in stream:
            pass
    assert fault_server.key_stats(reset_key).requests == 1


@pytest.mark.parametrize(
    "spec",
    [
        "reset;when=before",
        "half_open;hold=10",
        "sse_keepalive;interval=0.05;hold=10",
        "close_mid_body;after=0",
    ],
)
async def test_stream_that_dies_before_content_is_retried(
    spec: str, fault_server: Any, fault_key: str, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url(), retry=FAST)
    stream = await client.chat.completions.create(
        model="m",
        messages=MSGS,
        stream=True,
        # first_token 1 s: the retry's healthy answer comes within it even on a loaded box
        # (at 0.5 s, one took longer and was retried again).
        timeout=stallproof.Timeouts(first_token=1.0, total=5),
        extra_headers=fault(spec, fault_key, first=1),
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text
    assert fault_server.key_stats(fault_key).requests == 2


@pytest.mark.parametrize("code", [400, 401, 403, 404, 422])
async def test_caller_errors_are_never_retried(
    code: int, fault_server: Any, fault_key: str, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url(), retry=FAST)
    with pytest.raises(stallproof.APIStatusError) as info:
        await client.chat.completions.create(
            model="m",
            messages=MSGS,
            extra_headers=fault(f"status;code={code};should_retry=true", fault_key),
        )
    assert info.value.status_code == code
    assert fault_server.key_stats(fault_key).requests == 1


async def test_x_should_retry_overrides_the_status_rule(
    fault_server: Any, fault_key: str, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url(), retry=FAST)
    with pytest.raises(stallproof.InternalServerError):
        await client.chat.completions.create(
            model="m",
            messages=MSGS,
            extra_headers=fault("status;code=503;should_retry=false", fault_key),
        )
    assert fault_server.key_stats(fault_key).requests == 1
    key2 = fault_key + "-418"
    resp = await client.chat.completions.create(
        model="m",
        messages=MSGS,
        extra_headers=fault("status;code=418;should_retry=true", key2, first=1),
    )
    assert resp.choices
    assert fault_server.key_stats(key2).requests == 2


async def test_malformed_answers_are_not_retried(
    fault_server: Any, fault_key: str, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url(), retry=FAST)
    with pytest.raises(stallproof.MalformedResponse):
        await client.chat.completions.create(
            model="m", messages=MSGS, extra_headers=fault("malformed_json", fault_key)
        )
    assert fault_server.key_stats(fault_key).requests == 1


async def test_per_call_retry_overrides_the_client(
    fault_server: Any, fault_key: str, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url(), retry=FAST)
    with pytest.raises(stallproof.InternalServerError):
        await client.chat.completions.create(
            model="m", messages=MSGS, retry=None, extra_headers=fault("status;code=503", fault_key)
        )
    assert fault_server.key_stats(fault_key).requests == 1


async def test_budget_stops_a_retry_storm(
    fault_server: Any, fault_key: str, make_client: MakeClient
) -> None:
    """50 calls against an always-503 server: 50 first attempts plus the budget's 4 retries.

    The default RetryBudget (10 tokens, retries only above 5) allows 4 retries from a full
    bucket before the 5th failure brings it to the half mark. Without a budget this would
    be 150 requests.
    """
    client = make_client(fault_server.url(), retry=FAST, retry_budget=stallproof.RetryBudget())
    errors: list[BaseException] = []

    async def one() -> None:
        try:
            await client.chat.completions.create(
                model="m", messages=MSGS, extra_headers=fault("status;code=503", fault_key)
            )
        except stallproof.StallproofError as e:
            errors.append(e)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for _ in range(50):
                tg.start_soon(one)
    assert len(errors) == 50
    assert all(isinstance(e, stallproof.InternalServerError) for e in errors)
    assert fault_server.key_stats(fault_key).requests == 54
    assert client.retry_tokens is not None and client.retry_tokens <= 5


async def test_without_budget_every_call_retries(
    fault_server: Any, fault_key: str, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url(), retry=FAST, retry_budget=None)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(
                    _swallow,
                    client.chat.completions.create(
                        model="m", messages=MSGS, extra_headers=fault("status;code=503", fault_key)
                    ),
                )
    assert fault_server.key_stats(fault_key).requests == 30


async def _swallow(coro: Any) -> None:
    with contextlib.suppress(stallproof.StallproofError):
        await coro


async def test_request_body_is_identical_on_every_attempt(
    fault_server: Any, fault_key: str, make_client: MakeClient
) -> None:
    client, sent = spying_client(make_client, fault_server.url(), retry=FAST)
    bodies = sent.bodies
    await client.chat.completions.create(
        model="m", messages=MSGS, extra_headers=fault("reset;when=before", fault_key, first=2)
    )
    assert len(bodies) == 3 and len(set(bodies)) == 1
    assert json.loads(bodies[0])["messages"] == MSGS
