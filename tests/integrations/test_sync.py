"""Sync callers get the same guarantee: the sync SDK faces (`stallproof.openai.OpenAI`,
`stallproof.anthropic.Anthropic`), the plain SDKs on `sync_http_client2()` /
`sync_http_client()`, raw httpx on `Transport` / `Transport2`, and `deadline()` in sync
code. Every fault ends within its bound with the SDK's own error (a stallproof error in its
chain), the calling thread is released, and nothing stays held: no connection in the pool,
no registry entry, no socket open at the server, no thread left waiting."""

from __future__ import annotations

import concurrent.futures
import gc
import json
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest

import stallproof
import stallproof.anthropic
import stallproof.openai
from stallproof._faces._engine_loop import home_of

from ..support.clients import KEY, OPENAI_HTTP
from ..support.memory import freeze_heap
from ..support.sdk_catalogue import BUDGET, limit_of
from ..support.timing import MARGIN, SentClock, stopwatch, wait_until_sync

MSGS: Any = [{"role": "user", "content": "hi"}]
HOLD = 20
FAULTS = ["stall_headers", "trickle_body", "sse_keepalive"]
BODY = json.dumps({"model": "m", "messages": MSGS})


def pool_held(engine: stallproof.Engine) -> Any:
    """The engine's pool, read on its own loop: (in use, waiting)."""
    stats = home_of(engine).run_sync(engine.pool.stats)
    return (stats.in_use, stats.waiting)


def server_closed_all(fault_server: Any, key: str) -> Callable[[], bool]:
    """Every connection that carried ``key`` is closed (the journal of the fault server)."""

    def check() -> bool:
        records = fault_server.journal(key)
        return bool(records) and all(r.closed is not None for r in records)

    return check


@pytest.fixture
def face() -> Iterator[Callable[..., stallproof.openai.OpenAI]]:
    """Factory of sync openai faces, closed at the end of the test."""
    made: list[stallproof.openai.OpenAI] = []

    def factory(base_url: str, **settings: Any) -> stallproof.openai.OpenAI:
        settings.setdefault("timeout", BUDGET)
        settings.setdefault("retry", None)
        client = stallproof.openai.OpenAI(api_key=KEY, base_url=base_url, **settings)
        made.append(client)
        return client

    yield factory
    for client in made:
        assert pool_held(client.engine) == (0, 0)
        assert client.inflight() == ()
        client.close()


def ask(client: Any, *, stream: bool, **kwargs: Any) -> Any:
    if not stream:
        return client.chat.completions.create(model="m", messages=MSGS, **kwargs)
    for _ in client.chat.completions.create(model="m", messages=MSGS, stream=True, **kwargs):
        pass
    return None


def assert_bounded(error: BaseException, elapsed: float, sdk_error: type[Exception]) -> None:
    """The SDK's error, with the stallproof error that ended the call as its cause, within
    that bound (plus MARGIN) of the call's start."""
    assert isinstance(error, sdk_error), repr(error)
    cause = error if isinstance(error, stallproof.StallproofError) else error.__cause__
    assert isinstance(cause, stallproof.TimeoutException), repr(cause)
    assert elapsed <= limit_of(error, BUDGET.total) + MARGIN, (elapsed, repr(cause))


# -- the public names ----------------------------------------------------------------------


def test_the_sync_faces_are_the_sdks_sync_clients() -> None:
    client = stallproof.openai.OpenAI(api_key=KEY, base_url="http://127.0.0.1:9/v1")
    assert isinstance(client, openai.OpenAI) and client.max_retries == 0
    # The library the installed SDK runs on: httpx2 on openai 3, httpx on openai 1.x/2.x.
    assert isinstance(client._client, OPENAI_HTTP.Client)
    transport = stallproof.Transport2 if OPENAI_HTTP is httpx2 else stallproof.Transport
    assert isinstance(client._client._transport, transport)
    claude = stallproof.anthropic.Anthropic(api_key=KEY)
    assert isinstance(claude, anthropic.Anthropic) and claude.max_retries == 0
    assert isinstance(stallproof.sync_http_client(), httpx.Client)
    assert isinstance(stallproof.sync_http_client2(), httpx2.Client)
    assert isinstance(stallproof.Transport(), httpx.BaseTransport)
    assert isinstance(stallproof.Transport2(), httpx2.BaseTransport)


def test_a_sync_face_refuses_an_http_client_it_cannot_carry() -> None:
    with pytest.raises(stallproof.InvalidRequestError, match="sync_http_client2"):
        stallproof.openai.OpenAI(api_key=KEY, http_client=httpx2.Client())
    with pytest.raises(stallproof.InvalidRequestError, match=r"httpx2\.Client"):
        stallproof.openai.OpenAI(api_key=KEY, http_client=stallproof.http_client2())
    with pytest.raises(stallproof.InvalidRequestError, match=r"httpx2\.AsyncClient"):
        stallproof.openai.AsyncOpenAI(api_key=KEY, http_client=stallproof.sync_http_client2())


def test_a_sync_face_takes_a_sync_http_client(fault_server: Any, face: Any) -> None:
    http = stallproof.sync_http_client2(timeout=BUDGET, retry=None)
    client = face(fault_server.url(), http_client=http)
    assert client.engine is http._transport.engine  # type: ignore[attr-defined]
    assert ask(client, stream=False).choices[0].message.content.startswith("echo: hi")
    copy = client.with_options(timeout=5)
    assert copy.engine is client.engine and copy.timeouts.total == 5


# -- every fault, every sync path ------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("fault", FAULTS)
def test_the_sync_face_ends_every_fault_on_time(
    fault_server: Any, fault_key: str, face: Any, fault: str, stream: bool
) -> None:
    client = face(fault_server.url(fault, hold=HOLD, key=fault_key))
    clock = SentClock(client)
    with pytest.raises(openai.APITimeoutError) as info:
        ask(client, stream=stream)
    assert_bounded(info.value, clock.elapsed(), openai.APITimeoutError)
    wait_until_sync(server_closed_all(fault_server, fault_key), what="the socket closed")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("lib", ["httpx2", "httpx"])
def test_the_plain_sdk_on_a_sync_http_client(
    fault_server: Any, fault_key: str, fault: str, stream: bool, lib: str
) -> None:
    make = stallproof.sync_http_client2 if lib == "httpx2" else stallproof.sync_http_client
    http: Any = make(timeout=BUDGET, retry=None)
    url = fault_server.url(fault, hold=HOLD, key=fault_key)
    with openai.OpenAI(api_key=KEY, base_url=url, max_retries=0, http_client=http) as client:
        clock = SentClock(client)
        with pytest.raises(openai.APITimeoutError) as info:
            ask(client, stream=stream)
        assert_bounded(info.value, clock.elapsed(), openai.APITimeoutError)
        assert pool_held(http._transport.engine) == (0, 0)
    wait_until_sync(server_closed_all(fault_server, fault_key), what="the socket closed")


@pytest.mark.parametrize("transport", [stallproof.Transport, stallproof.Transport2])
def test_raw_httpx_errors_are_both_families(fault_server: Any, transport: Any) -> None:
    lib = httpx if transport is stallproof.Transport else httpx2
    t = transport(timeout=BUDGET, retry=None)
    with lib.Client(transport=t) as client:
        r = client.post(fault_server.url() + "/chat/completions", content=BODY)
        assert r.status_code == 200 and r.json()["choices"]
        url = fault_server.url("stall_headers", hold=HOLD) + "/chat/completions"
        clock = SentClock(client)
        with pytest.raises(lib.TimeoutException) as info:
            client.post(url, content=BODY)
        assert isinstance(info.value, stallproof.FirstTokenTimeout)
        assert clock.elapsed() <= BUDGET.first_token + MARGIN
        assert pool_held(t.engine) == (0, 0) and t.inflight() == ()


def test_anthropic_sync_face_streams_and_ends_a_stall(fault_server: Any, fault_key: str) -> None:
    base = fault_server.url().removesuffix("/v1")
    with stallproof.anthropic.Anthropic(api_key=KEY, base_url=base, timeout=BUDGET) as claude:
        with claude.messages.stream(model="c", max_tokens=16, messages=MSGS) as stream:
            assert stream.get_final_text().startswith("echo: hi")
        stalled = claude.with_options(
            base_url=fault_server.url("sse_keepalive", hold=HOLD, key=fault_key).removesuffix("/v1")
        )
        clock = SentClock(stalled)
        with pytest.raises(anthropic.APITimeoutError) as info:
            for _ in stalled.messages.create(model="c", max_tokens=16, messages=MSGS, stream=True):
                pass
        assert_bounded(info.value, clock.elapsed(), anthropic.APITimeoutError)
        assert pool_held(claude.engine) == (0, 0) and claude.inflight() == ()


# -- deadline() in sync code ---------------------------------------------------------------


def test_a_sync_deadline_covers_two_calls(fault_server: Any, face: Any) -> None:
    healthy = face(fault_server.url(), timeout=30)
    stalled = face(fault_server.url("stall_headers", hold=HOLD), timeout=30)
    with (
        stopwatch() as elapsed,
        pytest.raises(openai.APITimeoutError) as info,
        stallproof.deadline(1.0, name="turn"),
    ):
        assert ask(healthy, stream=False).choices  # fits, and the deadline keeps running
        ask(stalled, stream=False)
    assert elapsed[0] <= 1.0 + MARGIN
    cause = info.value.__cause__
    assert isinstance(cause, stallproof.DeadlineExceeded) and cause.name == "turn"


def test_the_engine_retries_sync_calls_and_the_sdk_does_not(
    fault_server: Any, fault_key: str, face: Any
) -> None:
    fast = stallproof.Retry(attempts=3, backoff_base=0.01, backoff_max=0.02)
    client = face(fault_server.url("status", code=503, first=2, key=fault_key), retry=fast)
    assert ask(client, stream=False).choices  # two 503s, then healthy: inside the engine
    assert fault_server.key_stats(fault_key).requests == 3


def test_engine_retries_stay_inside_a_sync_deadline(
    fault_server: Any, fault_key: str, face: Any
) -> None:
    many = stallproof.Retry(attempts=10, backoff_base=0.05, backoff_max=0.1)
    url = fault_server.url("stall_headers", hold=HOLD, key=fault_key)
    # first_token (0.6 s) fails the first attempt; the retry runs into the deadline.
    client = face(url, timeout=BUDGET.replace(total=30), retry=many)
    with (
        stopwatch() as elapsed,
        pytest.raises(openai.APITimeoutError) as info,
        stallproof.deadline(1.0),
    ):
        ask(client, stream=False)
    assert isinstance(info.value.__cause__, stallproof.DeadlineExceeded)
    assert elapsed[0] <= 1.0 + MARGIN
    assert fault_server.key_stats(fault_key).requests == 2


def test_a_spent_sync_deadline_fails_the_next_call_at_once(fault_server: Any, face: Any) -> None:
    client = face(fault_server.url(), timeout=30)
    with stallproof.deadline(0.2):
        threading.Event().wait(0.3)  # the caller's own work: nothing can interrupt it
        with stopwatch() as elapsed, pytest.raises(openai.APITimeoutError) as info:
            ask(client, stream=False)
    assert isinstance(info.value.__cause__, stallproof.DeadlineExceeded)
    assert elapsed[0] < MARGIN


def test_sync_and_async_deadlines_nest(fault_server: Any, face: Any) -> None:
    import anyio

    stalled = face(fault_server.url("stall_headers", hold=HOLD), timeout=30)
    # A sync deadline outside, a longer async one inside: the sync one wins.
    async_client = stallproof.openai.AsyncOpenAI(
        api_key=KEY, base_url=fault_server.url("stall_headers", hold=HOLD), timeout=30, retry=None
    )

    async def inner() -> None:
        with stallproof.deadline(10, name="inner"):
            await async_client.chat.completions.create(model="m", messages=MSGS)

    with (
        stopwatch() as elapsed,
        pytest.raises(openai.APITimeoutError) as info,
        stallproof.deadline(0.5, name="outer"),
    ):
        anyio.run(inner)
    assert elapsed[0] <= 0.5 + MARGIN
    cause = info.value.__cause__
    assert isinstance(cause, stallproof.DeadlineExceeded) and cause.name == "outer"

    # An async deadline outside, a sync call in a worker thread inside: the async one wins.
    async def outer() -> None:
        with stallproof.deadline(0.5, name="async outer"):
            await anyio.to_thread.run_sync(lambda: ask(stalled, stream=False))

    with stopwatch() as elapsed, pytest.raises(openai.APITimeoutError) as info:
        anyio.run(outer)
    # The worker thread cannot be cancelled: its call ends itself, at the async deadline.
    cause = info.value.__cause__
    assert isinstance(cause, stallproof.DeadlineExceeded) and cause.name == "async outer"
    assert elapsed[0] <= 0.5 + MARGIN


def test_deadlines_in_and_around_asyncio_to_thread(fault_server: Any, face: Any) -> None:
    import asyncio

    stalled = face(fault_server.url("stall_headers", hold=HOLD), timeout=30)

    def step(budget: float | None) -> None:
        if budget is None:
            ask(stalled, stream=False)
            return
        # The worker thread runs in a copy of the task's context (sniffio's "asyncio"
        # included), but no loop runs in it: this is the sync form.
        with stallproof.deadline(budget, name="in the thread"):
            ask(stalled, stream=False)

    async def main(inner: float | None) -> None:
        with stallproof.deadline(0.5, name="around"):
            await asyncio.to_thread(step, inner)

    for inner, scope in ((None, "around"), (0.3, "in the thread")):
        with stopwatch() as elapsed, pytest.raises(openai.APITimeoutError) as info:
            asyncio.run(main(inner))
        # The scope cancels the task's wait and clips the thread's call: both end at the
        # same instant, and either way the caller learns which scope ran out.
        error = info.value
        cause = error if isinstance(error, stallproof.StallproofError) else error.__cause__
        assert isinstance(cause, stallproof.DeadlineExceeded) and cause.name == scope
        assert elapsed[0] <= 0.5 + MARGIN
        wait_until_sync(lambda: stalled.inflight() == (), what="the thread's call ended")


def test_sync_calls_from_a_thread_anyio_runs_trio_in(fault_server: Any) -> None:
    """``anyio.run(..., backend="trio")`` (and pytest's anyio plugin) marks its context
    with sniffio's variable; the engine loop's task ran in a copy of it and anyio took
    the loop for trio: every sync call and close made from that thread raised a raw
    RuntimeError (found by the chaos soak)."""
    import anyio

    client = stallproof.openai.OpenAI(api_key=KEY, base_url=fault_server.url(), timeout=5)

    async def main() -> None:
        reply = client.chat.completions.create(model="m", messages=MSGS)
        assert reply.choices[0].message.content
        with client.chat.completions.create(model="m", messages=MSGS, stream=True) as chunks:
            assert list(chunks)
        client.close()

    anyio.run(main, backend="trio")
    assert pool_held(client.engine) == (0, 0)


# -- many threads --------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_32_threads_stalled_at_once_each_end_on_time(
    fault_server: Any, fault_key: str, face: Any, stream: bool
) -> None:
    # What is proven is how late 32 threads end, which MARGIN bounds whatever total is.
    total = 0.5
    client = face(fault_server.url("sse_keepalive", hold=HOLD, key=fault_key), timeout=30)
    before = set(threading.enumerate())

    def one() -> tuple[float, BaseException | None]:
        # Each thread's bound starts as its step does, the SDK's own work before the
        # request included (32 threads share one GIL for it).
        with stopwatch() as elapsed, stallproof.deadline(total):
            try:
                ask(client, stream=stream)
            except openai.APITimeoutError as e:
                error: BaseException | None = e
            else:
                error = None
        return elapsed[0], error

    # The test process's heap (pytest, every test module, both SDKs' types) is many times a
    # service's: a full GC pass over it (0.16 s of CPU, ~1 s of wall time on a loaded
    # runner, every thread stopped) lands in the storm. Frozen, as a latency-minded
    # service does after start-up (docs/concurrency.md; the session froze it after
    # collection, this freezes what earlier tests left); what the calls allocate is still
    # collected.
    freeze_heap()
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        futures = [pool.submit(one) for _ in range(32)]
        done, pending = concurrent.futures.wait(futures, timeout=total + 5)
    assert not pending
    results = [f.result() for f in done]
    for elapsed, error in results:
        assert error is not None and isinstance(error.__cause__, stallproof.DeadlineExceeded)
        assert elapsed <= total + MARGIN, sorted(round(e, 3) for e, _ in results)[-5:]
    # No thread of ours left behind (the engine loop is one daemon thread, started once).
    left = {t for t in threading.enumerate() if t not in before and t.is_alive()}
    assert {t.name for t in left} <= {"stallproof-engine-loop"}
    assert client.inflight() == ()
    wait_until_sync(server_closed_all(fault_server, fault_key), what="every socket closed")


# -- what the engine brings: registry, breaker, pacer ----------------------------------------


def test_inflight_sees_a_stalled_sync_call_from_another_thread(
    fault_server: Any, face: Any
) -> None:
    client = face(fault_server.url("stall_headers", hold=HOLD))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(ask, client, stream=False)
        wait_until_sync(
            lambda: [c.phase for c in client.inflight()] == ["awaiting headers"],
            what="the call in flight, awaiting headers",
        )
        assert client.inflight()[0].model == "m"
        with pytest.raises(openai.APITimeoutError):
            future.result(timeout=5)
    assert client.inflight() == ()


def test_tags_reach_the_engine_from_the_calling_thread(fault_server: Any, face: Any) -> None:
    client = face(fault_server.url("stall_headers", hold=HOLD))
    seen: list[Any] = []

    def call() -> None:
        with stallproof.tag(agent="planner", run="7"), pytest.raises(openai.APITimeoutError):
            ask(client, stream=False)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(call)

        def in_flight() -> bool:
            seen.extend(client.inflight())
            return bool(seen)

        wait_until_sync(in_flight, what="in flight")
        future.result(timeout=5)
    assert seen[0].agent == "planner" and seen[0].labels["run"] == "7"


def test_the_breaker_opens_on_sync_calls(fault_server: Any, fault_key: str, face: Any) -> None:
    breaker = stallproof.Breaker(fail_max=2, reset_timeout=30)
    client = face(fault_server.url("status", code=500, key=fault_key), breaker=breaker)
    for _ in range(2):
        with pytest.raises(openai.InternalServerError):
            ask(client, stream=False)
    with pytest.raises(openai.APIConnectionError) as info:
        ask(client, stream=False)
    # stallproof's errors are openai's classes too: the SDK lets this one through as is.
    assert isinstance(info.value, stallproof.CircuitOpen)
    assert [c.state for c in client.circuits().values()] == ["open"]
    assert fault_server.key_stats(fault_key).requests == 2  # the open circuit sent nothing


def test_the_pacer_queues_sync_calls_from_other_threads_inside_their_deadline(
    fault_server: Any, face: Any
) -> None:
    total = 1.0
    client = face(
        fault_server.url("stall_headers", hold=HOLD),
        timeout=total,
        pacer=stallproof.Pacer(max_concurrent=1, adaptive=False),
    )
    clock = SentClock(client)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(ask, client, stream=False)
        wait_until_sync(lambda: client.pacer_state().in_use == 1, what="the permit held")
        second = pool.submit(ask, client, stream=False)  # the clock's mark is now its own
        wait_until_sync(lambda: client.pacer_state().queued == {None: 1}, what="queued")
        with pytest.raises(openai.APITimeoutError) as info:
            second.result(timeout=total + 5)
        elapsed = clock.elapsed()
        with pytest.raises(openai.APITimeoutError):
            first.result(timeout=total + 5)
    # The queued call waited for a permit inside its own deadline, and no longer.
    assert isinstance(info.value.__cause__, stallproof.TotalTimeout)
    assert elapsed <= total + MARGIN
    state = client.pacer_state()
    assert state is not None and state.in_use == 0 and state.queued == {}


def test_sync_calls_span_under_the_callers_current_span(fault_server: Any) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    http = stallproof.sync_http_client2(timeout=BUDGET, retry=None, tracer_provider=provider)
    with (
        openai.OpenAI(
            api_key=KEY, base_url=fault_server.url(), max_retries=0, http_client=http
        ) as c,
        provider.get_tracer("test").start_as_current_span("agent step") as step,
    ):
        ask(c, stream=True)
        ask(c, stream=False)
    calls = [s for s in exporter.get_finished_spans() if s.name == "chat m"]
    assert len(calls) == 2  # both ended: the stream's when it was read to its end
    for call in calls:
        assert call.parent is not None and call.parent.span_id == step.get_span_context().span_id


# -- mid-stream, and every way of leaving a stream early -------------------------------------


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_a_stall_mid_stream_is_the_sdks_error_with_the_bound_as_cause(
    fault_server: Any, fault_key: str, face: Any, sdk: str
) -> None:
    url = fault_server.url("sse_stall", after=1, hold=HOLD, key=fault_key)
    client: Any
    if sdk == "openai":
        client = face(url)
        stream = client.chat.completions.create(model="m", messages=MSGS, stream=True)
        sdk_error: type[Exception] = openai.APITimeoutError
    else:
        client = stallproof.anthropic.Anthropic(
            api_key=KEY, base_url=url.removesuffix("/v1"), timeout=BUDGET, retry=None
        )
        stream = client.messages.create(model="c", max_tokens=16, messages=MSGS, stream=True)
        sdk_error = anthropic.APITimeoutError
    chunks = 0
    with stopwatch() as elapsed, pytest.raises(sdk_error) as info:
        for _ in stream:
            chunks += 1
    assert chunks >= 1
    # The SDK's own class (anthropic lets a transport error met mid-stream through raw:
    # the face translates it), the bound as its cause.
    assert not isinstance(info.value, stallproof.StallproofError)
    assert isinstance(info.value.__cause__, stallproof.IdleTimeout)
    assert elapsed[0] <= BUDGET.idle + MARGIN
    assert pool_held(client.engine) == (0, 0) and client.inflight() == ()
    client.close()
    wait_until_sync(server_closed_all(fault_server, fault_key), what="the socket closed")


class _Stop(Exception):
    pass


def _leave_by_close(stream: Any) -> None:
    next(iter(stream))
    stream.close()


def _leave_by_break(stream: Any) -> None:
    with stream:
        for _ in stream:
            break


def _leave_by_error_in_the_loop_body(stream: Any) -> None:
    with pytest.raises(_Stop), stream:
        for _ in stream:
            raise _Stop


def _leave_by_response_close(stream: Any) -> None:
    next(iter(stream))
    stream.response.close()


@pytest.mark.parametrize(
    "leave",
    [_leave_by_close, _leave_by_break, _leave_by_error_in_the_loop_body, _leave_by_response_close],
    ids=["close", "break", "error-in-body", "response-close"],
)
def test_leaving_a_sync_stream_early_releases_it_at_once(
    fault_server: Any, fault_key: str, face: Any, leave: Callable[[Any], None]
) -> None:
    # A stream that would stall for 20 s after its first chunk: leaving it must not wait.
    client = face(fault_server.url("sse_stall", after=1, hold=HOLD, key=fault_key), timeout=30)
    with stopwatch() as elapsed:
        leave(client.chat.completions.create(model="m", messages=MSGS, stream=True))
    assert elapsed[0] < 1.0
    assert pool_held(client.engine) == (0, 0) and client.inflight() == ()
    wait_until_sync(server_closed_all(fault_server, fault_key), what="the socket closed")


def test_a_sync_stream_dropped_unclosed_is_released(
    fault_server: Any, fault_key: str, face: Any
) -> None:
    client = face(fault_server.url("sse_stall", after=1, hold=HOLD, key=fault_key), timeout=30)

    def read_one_chunk_and_drop_the_stream() -> None:
        stream = client.chat.completions.create(model="m", messages=MSGS, stream=True)
        next(iter(stream))
        del stream
        gc.collect()

    # The SDK's stream holds no cycle (`_faces._streams`): dropping it finalises its
    # generator, which closes the response; a ResourceWarning may say so, or not.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        read_one_chunk_and_drop_the_stream()
    wait_until_sync(lambda: client.inflight() == (), what="the call ended")
    wait_until_sync(lambda: pool_held(client.engine) == (0, 0), what="the connection back")
    wait_until_sync(server_closed_all(fault_server, fault_key), what="the socket closed")


class _Interrupt(BaseException):
    """What a signal handler raises in the waiting thread (as KeyboardInterrupt does)."""


@pytest.mark.parametrize("where", ["headers", "mid-stream"])
def test_an_interrupt_in_the_waiting_thread_ends_the_call_on_the_loop(
    fault_server: Any, fault_key: str, face: Any, where: str
) -> None:
    import signal

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    params: dict[str, Any] = {} if where == "headers" else {"after": 1}
    fault = "stall_headers" if where == "headers" else "sse_stall"
    client = face(fault_server.url(fault, hold=HOLD, key=fault_key, **params), timeout=30)

    def interrupt(signum: int, frame: Any) -> None:
        raise _Interrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        with stopwatch() as elapsed, pytest.raises(_Interrupt):
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            stream = client.chat.completions.create(model="m", messages=MSGS, stream=True)
            for _ in stream:
                pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert elapsed[0] < 0.3 + MARGIN + 0.5
    # The call was cancelled on the loop: its connection and its registry entry are gone.
    assert client.inflight() == () and pool_held(client.engine) == (0, 0)
    wait_until_sync(server_closed_all(fault_server, fault_key), what="the socket closed")


# -- the process: exit and fork ----------------------------------------------------------------

_EXIT_WITH_A_STALLED_CALL = """
import sys, threading, time
import stallproof.openai
client = stallproof.openai.OpenAI(api_key="k", base_url=sys.argv[1], timeout=30, retry=None)
messages = [{"role": "user", "content": "hi"}]
call = lambda: client.chat.completions.create(model="m", messages=messages)
threading.Thread(target=call, daemon=True).start()
# Stalled at the server: sent, no headers (before that, the server may not have seen it).
while [c.phase for c in client.inflight()] != ["awaiting headers"]:
    time.sleep(0.01)
print("stalled", flush=True)
"""


@pytest.mark.slow
def test_the_process_exits_at_once_with_a_sync_call_stalled(
    fault_server: Any, fault_key: str
) -> None:
    import subprocess
    import sys

    url = fault_server.url("stall_headers", hold=HOLD, key=fault_key)
    run = subprocess.run(
        [sys.executable, "-c", _EXIT_WITH_A_STALLED_CALL, url],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 0 and run.stdout == "stalled\n", run.stderr
    # The engine loop was stopped at exit: its call cancelled, its socket closed.
    wait_until_sync(server_closed_all(fault_server, fault_key), what="the socket closed")
    assert all(r.closed_by == "client" for r in fault_server.journal(fault_key))


_FORK_AFTER_THE_LOOP_STARTED = """
import os, sys
import openai, stallproof, stallproof.openai
messages = [{"role": "user", "content": "hi"}]
parent = stallproof.openai.OpenAI(api_key="k", base_url=sys.argv[1], timeout=5, retry=None)
parent.chat.completions.create(model="m", messages=messages)  # the loop runs; engine used
unused = stallproof.openai.OpenAI(api_key="k", base_url=sys.argv[1], timeout=5, retry=None)
pid = os.fork()
if pid == 0:
    code = 0
    try:
        child = stallproof.openai.OpenAI(api_key="k", base_url=sys.argv[1], timeout=5)
        child.chat.completions.create(model="m", messages=messages)
        unused.chat.completions.create(model="m", messages=messages)
        try:
            parent.chat.completions.create(model="m", messages=messages)
            code = 3
        except (stallproof.InvalidRequestError, openai.APIConnectionError) as e:
            # Refused, clearly, before anything: openai 3 lets the error through, openai 2
            # wraps it in APIConnectionError (as it wraps any error its transport raises).
            if "os.fork()" not in str(e) + str(e.__cause__):
                code = 4
        parent.close()  # the parent's connections: left alone, no error
    except BaseException as e:
        print(repr(e), flush=True)
        code = 2
    os._exit(code)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), flush=True)
parent.chat.completions.create(model="m", messages=messages)  # the parent's loop still runs
"""


@pytest.mark.slow
def test_a_fork_after_the_loop_started_gets_a_loop_of_its_own(fault_server: Any) -> None:
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", _FORK_AFTER_THE_LOOP_STARTED, fault_server.url()],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0 and run.stdout == "0\n", (run.stdout, run.stderr)


# -- the engine loop itself --------------------------------------------------------------------


def test_a_held_up_loop_still_releases_the_waiting_thread() -> None:
    import time

    from stallproof._faces._engine_loop import engine_loop

    async def hog() -> None:
        # Holds the loop's thread: what stallproof's code never does.
        time.sleep(0.6)  # noqa: ASYNC251

    with stopwatch() as elapsed, pytest.raises(stallproof.TotalTimeout, match="held up"):
        engine_loop().call(hog, limit=0.2)
    # Released at its own bound (and the short wait for the cancelled task to release).
    assert elapsed[0] < 0.2 + 0.25 + MARGIN


def test_the_engine_loop_refuses_a_sync_call_from_its_own_thread() -> None:
    from stallproof._faces._engine_loop import engine_loop

    loop = engine_loop()

    async def nested() -> None:
        async def inner() -> None:
            return None

        loop.call(inner, limit=1)

    with pytest.raises(stallproof.InvalidRequestError, match="engine loop thread"):
        loop.call(nested, limit=5)
