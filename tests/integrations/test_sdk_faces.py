"""What the SDK faces add to the SDKs: settings in stallproof's terms, one engine shared by
copies, the SDK's own retries off, errors with the stallproof error as their cause, and the
views (`inflight`, `pacer_state`, `circuits`). Over real loopback, asyncio and trio."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import anthropic
import anyio
import httpx2
import openai
import pytest

import stallproof
import stallproof.anthropic
import stallproof.openai

from ..support.clients import KEY, OPENAI_HTTP, OPENAI_MAJOR, sdk_pool_held
from ..support.sdk_catalogue import BUDGET
from ..support.timing import MARGIN, SentClock, stopwatch

pytestmark = pytest.mark.anyio

MSGS: Any = [{"role": "user", "content": "hi"}]
FAST = stallproof.Retry(attempts=3, backoff_base=0.01, backoff_max=0.02)


def face(base_url: str, **settings: Any) -> stallproof.openai.AsyncOpenAI:
    settings.setdefault("timeout", BUDGET)
    return stallproof.openai.AsyncOpenAI(api_key=KEY, base_url=base_url, **settings)


async def ask(client: openai.AsyncOpenAI, **kwargs: Any) -> Any:
    return await client.chat.completions.create(model="m", messages=MSGS, **kwargs)


@pytest.mark.slow
def test_importing_stallproof_imports_no_optional_sdk() -> None:
    # openai is a dependency (its types and errors are ours); anthropic is an extra,
    # imported only when its face is used.
    code = (
        "import sys, stallproof\n"
        "assert 'anthropic' not in sys.modules\n"
        "assert stallproof.openai.AsyncOpenAI.__module__ == 'stallproof.openai'\n"
        "assert 'anthropic' not in sys.modules\n"
        "assert stallproof.anthropic.AsyncAnthropic.__module__ == 'stallproof.anthropic'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_faces_are_the_sdks_clients() -> None:
    client = face("http://127.0.0.1:9/v1")
    assert isinstance(client, openai.AsyncOpenAI) and client.max_retries == 0
    # The library the installed SDK runs on: httpx2 on openai 3, httpx on openai 1.x/2.x.
    assert isinstance(client._client, OPENAI_HTTP.AsyncClient)
    assert client.timeouts == BUDGET
    claude = stallproof.anthropic.AsyncAnthropic(api_key=KEY, timeout=BUDGET)
    assert isinstance(claude, anthropic.AsyncAnthropic) and claude.max_retries == 0
    assert claude.engine is not client.engine


def test_the_sdks_timeout_kinds_map_to_bounds() -> None:
    assert face("http://x/v1", timeout=30).timeouts.total == 30
    phases = face("http://x/v1", timeout=httpx2.Timeout(5, connect=2)).timeouts
    assert (phases.connect, phases.read, phases.total) == (2, 5, stallproof.Timeouts().total)
    assert face("http://x/v1", timeout=None).timeouts == stallproof.Timeouts()
    with pytest.raises(stallproof.InvalidRequestError, match="timeout must be"):
        face("http://x/v1", timeout="30")


def test_max_retries_becomes_the_engines_retry() -> None:
    assert face("http://x/v1", max_retries=4)._stallproof.retry == stallproof.Retry(attempts=5)
    assert face("http://x/v1", max_retries=0)._stallproof.retry is None
    with pytest.raises(stallproof.InvalidRequestError, match="not both"):
        face("http://x/v1", max_retries=2, retry=stallproof.Retry())


def test_an_http_client_that_cannot_carry_the_engine_is_refused() -> None:
    # A caller's own httpx2 client is taken (tests/integrations/test_sdk_own_client.py).
    with pytest.raises(stallproof.InvalidRequestError, match="already has its engine"):
        face("http://x/v1", http_client=stallproof.http_client2(), breaker=stallproof.Breaker())
    with pytest.raises(stallproof.InvalidRequestError, match=r"httpx2\.AsyncClient"):
        stallproof.anthropic.AsyncAnthropic(api_key=KEY, http_client=stallproof.http_client())  # type: ignore[arg-type]


async def test_copies_share_the_engine_and_take_their_own_bounds(fault_server: Any) -> None:
    async with face(fault_server.url("half_open", hold=20), retry=None) as client:
        tight = client.with_options(timeout=0.3)
        assert tight.engine is client.engine and tight._client is client._client
        assert tight.timeouts == BUDGET.replace(total=0.3)
        clock = SentClock(tight)
        with pytest.raises(openai.APITimeoutError) as info:
            await ask(tight)
        assert isinstance(info.value.__cause__, stallproof.TotalTimeout)
        assert info.value.__cause__.limit == 0.3 and clock.elapsed() <= 0.3 + MARGIN
        # The parent keeps its own bounds: first_token fires at 0.6 s.
        with pytest.raises(openai.APITimeoutError) as info:
            await ask(client)
        assert isinstance(info.value.__cause__, stallproof.FirstTokenTimeout)
        assert sdk_pool_held(client) == {"requests": 0, "active": 0}


async def test_a_per_call_timeout_is_the_calls_total(fault_server: Any) -> None:
    async with face(fault_server.url("half_open", hold=20), retry=None) as client:
        clock = SentClock(client)
        with pytest.raises(openai.APITimeoutError) as info:
            await ask(client, timeout=0.25)
        cause = info.value.__cause__
        assert isinstance(cause, stallproof.TotalTimeout) and cause.limit == 0.25
        assert clock.elapsed() <= 0.25 + MARGIN


async def test_the_engine_retries_and_the_sdk_does_not(fault_server: Any, fault_key: str) -> None:
    base = fault_server.url("status", code=503, first=2, key=fault_key)
    async with face(base, retry=FAST) as client:
        r = await ask(client)  # two 503s, then healthy: retried inside the engine
        assert r.choices[0].message.content
    assert fault_server.key_stats(fault_key).requests == 3
    base = fault_server.url("status", code=503, key=fault_key + "-b")
    async with face(base, retry=FAST) as client, client.with_options(max_retries=1) as once:
        with pytest.raises(openai.InternalServerError):
            await ask(once)  # max_retries=1: two attempts in all, none by the SDK
    assert fault_server.key_stats(fault_key + "-b").requests == 2


async def test_retries_never_outlive_the_total(fault_server: Any) -> None:
    many = stallproof.Retry(attempts=10, backoff_base=0.01, backoff_max=0.02)
    async with face(fault_server.url("half_open", hold=20), retry=many) as client:
        clock = SentClock(client)
        with pytest.raises(openai.APITimeoutError) as info:
            await ask(client)
        assert isinstance(info.value.__cause__, stallproof.TotalTimeout)
        assert clock.elapsed() <= BUDGET.total + MARGIN
        assert sdk_pool_held(client) == {"requests": 0, "active": 0}


async def test_a_deadline_scope_bounds_sdk_calls(fault_server: Any) -> None:
    async with face(fault_server.url("half_open", hold=20), timeout=30, retry=None) as client:
        # The scope and the call's clipped deadline end at the same instant: whichever
        # wins, the caller learns which scope ran out.
        with (
            stopwatch() as elapsed,
            pytest.raises((openai.APITimeoutError, stallproof.DeadlineExceeded)) as info,
            stallproof.deadline(0.4, name="agent step"),
        ):
            await ask(client)
        error = info.value
        # DeadlineExceeded is an openai.APITimeoutError itself; the SDK's own wraps it.
        cause = error if isinstance(error, stallproof.StallproofError) else error.__cause__
        assert isinstance(cause, stallproof.DeadlineExceeded) and cause.name == "agent step"
        assert elapsed[0] <= 0.4 + MARGIN
        assert client.inflight() == ()


async def test_inflight_sees_a_stalled_sdk_call(fault_server: Any) -> None:
    async with face(fault_server.url("half_open", hold=20), retry=None) as client:
        seen: list[Any] = []

        async def watch() -> None:
            await anyio.sleep(0.2)
            seen.extend(client.inflight())

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            with pytest.raises(openai.APITimeoutError):
                await ask(client)
        assert len(seen) == 1 and seen[0].model == "m"
        assert client.inflight() == () and client.circuits() == {}
        assert client.pacer_state() is None


async def test_breaker_and_pacer_reach_the_engine(fault_server: Any) -> None:
    pacer = stallproof.Pacer(requests_per_minute=600)
    async with face(
        fault_server.url(), breaker=stallproof.Breaker(), pacer=pacer, retry=None
    ) as client:
        await ask(client)
        assert client.pacer_state() is not None
        assert [c.state for c in client.circuits().values()] == ["closed"]


async def test_the_stock_sdk_on_stallproofs_httpx2_client(fault_server: Any) -> None:
    http = stallproof.http_client2(timeout=BUDGET, retry=None)
    url = fault_server.url("sse_stall", after=1, hold=20)
    async with openai.AsyncOpenAI(api_key=KEY, base_url=url, max_retries=0, http_client=http) as c:
        clock = SentClock(c)
        with pytest.raises(openai.APITimeoutError) as info:
            async for _ in await ask(c, stream=True):
                pass
        # openai 2 lets the transport's error met mid-stream through raw (it is also an
        # openai.APITimeoutError); openai 3 wraps it, the stallproof error as its cause.
        raised = info.value.__cause__ if OPENAI_MAJOR >= 3 else info.value
        assert isinstance(raised, stallproof.IdleTimeout)
        assert clock.elapsed() <= BUDGET.total + MARGIN
        assert sdk_pool_held(c) == {"requests": 0, "active": 0}


async def test_a_face_takes_a_stallproof_http_client(fault_server: Any) -> None:
    http = stallproof.http_client2(timeout=BUDGET, retry=None)
    async with face(fault_server.url(), http_client=http) as client:
        assert isinstance(http._transport, stallproof.AsyncTransport2)
        assert client.engine is http._transport.engine
        assert (await ask(client)).choices


async def test_anthropic_copies_share_the_engine_and_stream_helpers_work(
    fault_server: Any,
) -> None:
    base_url = fault_server.url().removesuffix("/v1")  # the SDK adds /v1/messages
    async with stallproof.anthropic.AsyncAnthropic(
        api_key=KEY, base_url=base_url, timeout=BUDGET
    ) as client:
        copy = client.with_options(timeout=5)
        assert copy.engine is client.engine and copy.timeouts.total == 5
        async with copy.messages.stream(
            model="claude-test", max_tokens=16, messages=MSGS
        ) as stream:
            text = await stream.get_final_text()
        assert text.startswith("echo: hi")  # the fault server echoes the last message
        assert sdk_pool_held(client) == {"requests": 0, "active": 0}


async def test_caller_cancellation_mid_stream_releases_everything(fault_server: Any) -> None:
    url = fault_server.url("sse_stall", after=1, hold=20)
    async with face(url, timeout=30, retry=None) as client:
        with anyio.move_on_after(0.3) as scope:
            async for _ in await ask(client, stream=True):
                pass
        assert scope.cancelled_caught
        assert sdk_pool_held(client) == {"requests": 0, "active": 0}
        assert client.inflight() == ()


async def test_the_key_never_shows_in_the_error_or_its_cause(fault_server: Any) -> None:
    async with face(fault_server.url("half_open", hold=20), retry=None) as client:
        with pytest.raises(openai.APITimeoutError) as info:
            await ask(client)
        cause = info.value.__cause__
        for text in (str(info.value), repr(info.value), str(cause), repr(cause), repr(client)):
            assert KEY not in text
