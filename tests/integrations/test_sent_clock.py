"""`SentClock` (tests/support/timing.py), the clock the SDK and face timing tests read.

Its mark must be where stallproof's bounds start, as near as an outside observer can put
it: after whatever the SDK and httpx do with the request first (a starved test process
was seen to spend ~0.5 s between the SDK's ``request`` hook and the transport), and never
after the engine starts the call (a later mark would hide lateness). Here the SDK side
holds every request in a ``request`` event hook of its own for `HOLD` before the
transport gets it, through each SDK call the timing tests make (openai chat and
Responses, anthropic Messages; async on asyncio and trio, and sync), and:

- the mark comes after the hook's hold, and no later than the engine's own record of the
  call's start (`Call.started`, read from the engine's table of calls in flight; a mark
  taken where the engine hands the request to its pool, ~0.1 ms later, fails this);
- a first_token stall measured on the clock reads its bound: at least the bound, at most
  the bound + MARGIN, the hold not counted.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import anthropic
import anyio
import openai
import pytest

import stallproof
import stallproof.anthropic
import stallproof.openai
from stallproof._call import Call

from ..support.clients import KEY
from ..support.sdk_catalogue import BUDGET
from ..support.timing import MARGIN, SentClock, engine_of, wait_until, wait_until_sync

pytestmark = pytest.mark.anyio

# What the SDK side holds each request for before the transport gets it: longer than
# MARGIN, so a clock that counted it would read past the bound + MARGIN.
HOLD = 0.5
MSGS: Any = [{"role": "user", "content": "hi"}]
CALLS = ["chat", "responses", "messages"]


def sdk_client(call: str, url: str, *, sync: bool) -> Any:
    """The face the timing tests use for ``call``: openai's for chat and Responses,
    anthropic's for Messages; a `first_token` of 0.6 s (`BUDGET`), no retries."""
    settings: dict[str, Any] = {"api_key": KEY, "timeout": BUDGET, "retry": None}
    if call == "messages":
        face = stallproof.anthropic.Anthropic if sync else stallproof.anthropic.AsyncAnthropic
        return face(base_url=url.removesuffix("/v1"), **settings)
    openai_face = stallproof.openai.OpenAI if sync else stallproof.openai.AsyncOpenAI
    return openai_face(base_url=url, **settings)


def request_of(call: str, client: Any) -> Any:
    """The SDK call (a coroutine for an async client): non-stream, one request."""
    if call == "chat":
        return client.chat.completions.create(model="m", messages=MSGS)
    if call == "responses":
        return client.responses.create(model="m", input="hi")
    return client.messages.create(model="m", max_tokens=16, messages=MSGS)


def held_in_a_hook(client: Any) -> list[float]:
    """Hold every request of the SDK client for `HOLD` in a ``request`` event hook of its
    http client (after the SDK built the request, before the transport gets it); the list
    returned gets the time each hold began."""
    held: list[float] = []

    async def hold(request: Any) -> None:
        held.append(time.monotonic())
        await anyio.sleep(HOLD)

    def hold_sync(request: Any) -> None:
        held.append(time.monotonic())
        time.sleep(HOLD)

    http = client._client
    hook = hold if hasattr(http, "aclose") else hold_sync  # a sync client's hooks are sync
    hooks = http.event_hooks
    http.event_hooks = {"request": [*hooks["request"], hook], "response": hooks["response"]}
    return held


def check(clock: SentClock, held: list[float], started: list[float], error: Any) -> None:
    assert isinstance(error, (openai.APITimeoutError, anthropic.APITimeoutError)), repr(error)
    cause = error.__cause__
    assert isinstance(cause, stallproof.FirstTokenTimeout), repr(cause)
    elapsed = clock.elapsed()
    assert clock.sent is not None and len(held) == 1 and len(started) == 1
    # After the SDK side's hold; no later than the engine's start of the call.
    assert held[0] + HOLD <= clock.sent <= started[0]
    # The bound read on the clock: all of it (first_token starts after the call does,
    # when the request is sent), and the hold not in it. (asyncio's timers may fire up to
    # the clock's resolution early: 10 ms covers it.)
    assert cause.limit - 0.01 <= elapsed <= cause.limit + MARGIN, elapsed


def the_call_start(engine: Any) -> float:
    """`Call.started` of the one call in ``engine``'s table, on `time.monotonic`.

    On a stock asyncio loop (the sync faces' engine loop runs one) the engine's clock is
    `time.monotonic` itself. Trio's is offset from it: the offset is read as the call's
    clock minus `time.monotonic` read just before, which can only overstate it, so the
    start it gives is at or before the real one (a check against it is the stricter).
    """
    (call,) = engine._calls.copy().values()  # (from another thread, too)
    assert isinstance(call, Call)
    if call.now is time.monotonic:
        return call.started
    before = time.monotonic()
    return call.started - (call.now() - before)


@pytest.mark.parametrize("call", CALLS)
async def test_the_clock_starts_after_the_sdk_and_no_later_than_the_engine(
    call: str, fault_server: Any
) -> None:
    client = sdk_client(call, fault_server.url("stall_headers", hold=10), sync=False)
    clock = SentClock(client)
    engine = engine_of(client)
    held = held_in_a_hook(client)
    started: list[float] = []

    async def watch() -> None:
        await wait_until(lambda: bool(engine._calls), what="the call in the engine's table")
        started.append(the_call_start(engine))

    async with client, anyio.create_task_group() as tg:
        tg.start_soon(watch)
        with pytest.raises(Exception) as info:  # noqa: PT011 - `check` names it
            await request_of(call, client)
    check(clock, held, started, info.value)


@pytest.mark.parametrize("call", CALLS)
def test_a_sync_clients_clock_too(call: str, fault_server: Any) -> None:
    # A sync transport hands the call to the engine loop's thread: the mark is on that
    # thread, when the engine takes it.
    client = sdk_client(call, fault_server.url("stall_headers", hold=10), sync=True)
    clock = SentClock(client)
    engine = engine_of(client)
    held = held_in_a_hook(client)
    started: list[float] = []

    def watch() -> None:
        wait_until_sync(lambda: bool(engine._calls), what="the call in the engine's table")
        started.append(the_call_start(engine))

    watcher = threading.Thread(target=watch)
    watcher.start()
    with client, pytest.raises(Exception) as info:  # noqa: PT011 - `check` names it
        request_of(call, client)
    watcher.join(timeout=5)
    check(clock, held, started, info.value)


def test_the_clock_refuses_a_client_without_an_engine() -> None:
    import httpx2

    with pytest.raises(AssertionError, match="stallproof engine"):
        SentClock(openai.AsyncOpenAI(api_key=KEY, http_client=httpx2.AsyncClient()))
