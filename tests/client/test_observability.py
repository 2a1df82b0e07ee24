"""Spans, metrics, logs and the live in-flight view, against real faults."""

from __future__ import annotations

import io
import logging
import os
import signal
from typing import Any

import anyio
import pytest
from openai.types.chat import ChatCompletionMessageParam
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    HistogramDataPoint,
    InMemoryMetricReader,
    NumberDataPoint,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import stallproof

from ..support.clients import KEY, MakeClient, spying_client
from ..support.otel import attribute, metrics, number, points, seconds
from ..support.timing import wait_until

pytestmark = pytest.mark.anyio

MSGS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]
FAST = stallproof.Retry(attempts=3, backoff_base=0.05, backoff_max=0.1)


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _tree(exporter: InMemorySpanExporter) -> tuple[ReadableSpan, list[ReadableSpan]]:
    finished = exporter.get_finished_spans()
    (call,) = [s for s in finished if s.name.startswith("chat ")]
    attempts = [
        s for s in finished if s.parent is not None and s.parent.span_id == call.context.span_id
    ]
    return call, sorted(attempts, key=lambda s: s.start_time or 0)


async def test_healthy_call_span(fault_server: Any, make_client: MakeClient, spans: Any) -> None:
    provider, exporter = spans
    client = make_client(fault_server.url(), tracer_provider=provider)
    resp = await client.chat.completions.create(
        model="m-1",
        messages=MSGS,
        max_tokens=32,
        temperature=0.5,
        agent="planner",
        labels={"round": "2"},
    )
    call, attempts = _tree(exporter)
    a = call.attributes or {}
    assert call.name == "chat m-1" and call.kind == SpanKind.CLIENT
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == "openai"
    assert a["gen_ai.request.model"] == "m-1"
    assert a["gen_ai.request.stream"] is False
    assert a["gen_ai.request.max_tokens"] == 32 and a["gen_ai.request.temperature"] == 0.5
    assert a["gen_ai.response.id"] == resp.id
    assert a["gen_ai.response.finish_reasons"] == ("stop",)
    assert resp.usage is not None
    assert a["gen_ai.usage.input_tokens"] == resp.usage.prompt_tokens
    assert a["gen_ai.usage.output_tokens"] == resp.usage.completion_tokens
    assert a["server.address"] == "127.0.0.1" and isinstance(a["server.port"], int)
    assert a["gen_ai.agent.name"] == "planner" and a["stallproof.label.round"] == "2"
    assert attribute(call, "stallproof.request_id", str).startswith("sp-")
    assert "error.type" not in a
    assert "gen_ai.input.messages" not in a  # content is opt-in
    (attempt,) = attempts
    aa = attempt.attributes or {}
    assert attempt.name == "POST" and aa["http.request.method"] == "POST"
    assert aa["http.response.status_code"] == 200
    assert "http.request.resend_count" not in aa


async def test_stream_span_covers_the_whole_stream(
    fault_server: Any, make_client: MakeClient, spans: Any
) -> None:
    provider, exporter = spans
    client = make_client(
        fault_server.url("healthy", token_interval=0.05, tokens=4), tracer_provider=provider
    )
    stream = await client.chat.completions.create(
        model="m", messages=MSGS, stream=True, stream_options={"include_usage": True}
    )
    assert not exporter.get_finished_spans() or all(
        not s.name.startswith("chat") for s in exporter.get_finished_spans()
    )
    async for _ in stream:
        pass
    call, _ = _tree(exporter)
    a = call.attributes or {}
    assert a["gen_ai.request.stream"] is True
    assert a["gen_ai.response.finish_reasons"] == ("stop",)
    assert number(call, "gen_ai.usage.output_tokens") > 0
    assert number(call, "gen_ai.response.time_to_first_chunk") > 0
    assert seconds(call) >= 0.15  # all four tokens, not just headers


@pytest.mark.parametrize("context", ["none", "parent", "baggage"])
async def test_trace_context_without_a_provider(
    context: str, fault_server: Any, make_client: MakeClient
) -> None:
    """With no tracer or meter provider the call records nothing, but a span or baggage
    already in the caller's context is still propagated (the quiet path skips only what
    the API would have done nothing with)."""
    from opentelemetry import baggage, trace
    from opentelemetry import context as otel_context

    client, sent = spying_client(make_client, fault_server.url(), retry=None)
    parent = trace.SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
    )
    ctx = otel_context.get_current()
    if context == "parent":
        ctx = trace.set_span_in_context(trace.NonRecordingSpan(parent), ctx)
    elif context == "baggage":
        ctx = baggage.set_baggage("tenant", "t-1", ctx)
    token = otel_context.attach(ctx)
    try:
        await client.chat.completions.create(model="m", messages=MSGS)
    finally:
        otel_context.detach(token)
    (headers,) = sent.headers
    if context == "parent":
        assert headers["traceparent"] == f"00-{parent.trace_id:032x}-{parent.span_id:016x}-01"
    else:
        assert "traceparent" not in headers
    if context == "baggage":
        assert headers["baggage"] == "tenant=t-1"
    else:
        assert "baggage" not in headers


async def test_retried_call_has_one_span_per_attempt(
    fault_server: Any, fault_key: str, make_client: MakeClient, spans: Any
) -> None:
    provider, exporter = spans
    client, sent = spying_client(
        make_client, fault_server.url(), tracer_provider=provider, retry=FAST
    )
    seen = sent.headers
    await client.chat.completions.create(
        model="m",
        messages=MSGS,
        extra_headers={"X-Fault": f"status;code=503;first=2;key={fault_key}"},
    )
    call, attempts = _tree(exporter)
    assert [(s.attributes or {}).get("http.request.resend_count") for s in attempts] == [None, 1, 2]
    assert [(s.attributes or {})["http.response.status_code"] for s in attempts] == [503, 503, 200]
    assert attempts[0].status.status_code == StatusCode.ERROR
    events = [e for e in call.events if e.name == "stallproof.retry_scheduled"]
    assert len(events) == 2
    assert attribute(events[0], "stallproof.retry.reason", str) == "InternalServerError"
    assert "error.type" not in (call.attributes or {})
    # W3C trace context: each attempt's traceparent names that attempt's span.
    for headers, span in zip(seen, attempts, strict=True):
        trace_id, span_id = headers["traceparent"].split("-")[1:3]
        assert int(trace_id, 16) == span.context.trace_id
        assert int(span_id, 16) == span.context.span_id


@pytest.mark.parametrize(
    ("fault", "stream", "timeouts", "expect"),
    [
        ("half_open", False, {"connect": 5, "total": 0.5}, stallproof.TotalTimeout),
        ("half_open", True, {"first_token": 0.4}, stallproof.FirstTokenTimeout),
        ("half_open", False, {"read": 0.4}, stallproof.ReadTimeout),
        ("sse_stall", True, {"idle": 0.4}, stallproof.IdleTimeout),
    ],
)
async def test_timeout_spans_say_which_bound_and_phase(
    fault: str,
    stream: bool,
    timeouts: dict[str, float],
    expect: type[stallproof.TimeoutException],
    fault_server: Any,
    make_client: MakeClient,
    spans: Any,
) -> None:
    provider, exporter = spans
    client = make_client(fault_server.url(fault, hold=10), tracer_provider=provider)
    with pytest.raises(expect):
        s = await client.chat.completions.create(
            model="m",
            messages=MSGS,
            stream=stream,
            timeout=stallproof.Timeouts(total=5).replace(**timeouts),
        )
        assert isinstance(s, stallproof.AsyncStream)  # a plain answer raised above
        async for _ in s:
            pass
    call, _ = _tree(exporter)
    assert (call.attributes or {})["error.type"] == f"stallproof.{expect.__name__}"
    assert call.status.status_code == StatusCode.ERROR
    (event,) = [e for e in call.events if e.name == "stallproof.deadline_expired"]
    assert attribute(event, "stallproof.bound", str) == expect.bound
    assert attribute(event, "stallproof.phase", str) in ("awaiting headers", "streaming")


async def test_metrics_duration_and_inflight(fault_server: Any, make_client: MakeClient) -> None:
    reader = InMemoryMetricReader()
    client = make_client(fault_server.url(), meter_provider=MeterProvider(metric_readers=[reader]))
    await client.chat.completions.create(model="m", messages=MSGS)
    s = await client.chat.completions.create(model="m", messages=MSGS, stream=True)
    async for _ in s:
        pass
    collected = metrics(reader)
    duration = collected["gen_ai.client.operation.duration"]
    assert sum(p.count for p in points(duration, HistogramDataPoint)) == 2
    first_chunk = collected["gen_ai.client.operation.time_to_first_chunk"]
    assert sum(p.count for p in points(first_chunk, HistogramDataPoint)) == 1
    # Every phase counter is back to zero once nothing is in flight.
    inflight = collected["stallproof.client.inflight"]
    assert all(p.value == 0 for p in points(inflight, NumberDataPoint))


async def test_secrets_never_reach_spans_or_logs(
    fault_server: Any, make_client: MakeClient, spans: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="stallproof")
    provider, exporter = spans
    client = make_client(
        fault_server.url("status", code=401),
        tracer_provider=provider,
        record_content=True,
        api_key=KEY,
    )
    with pytest.raises(stallproof.AuthenticationError):
        await client.chat.completions.create(model="m", messages=MSGS)
    dumped = [str(s.to_json()) for s in exporter.get_finished_spans()]
    assert dumped and all(KEY not in d for d in dumped)
    assert KEY not in caplog.text
    assert "request_id=sp-" in caplog.text or all(
        getattr(r, "stallproof_request_id", "").startswith("sp-") for r in caplog.records
    )
    for record in caplog.records:
        assert getattr(record, "stallproof_request_id", None), record.getMessage()


@pytest.mark.slow
async def test_inflight_shows_where_each_call_is_stuck(
    fault_server: Any, make_client: MakeClient
) -> None:
    """20 calls: stuck before headers, stuck mid-stream, and slow-but-alive streams."""
    client = make_client(fault_server.url(), timeout=stallproof.Timeouts(total=10))
    kinds = {
        "half_open": ("half_open;hold=20", False),
        "stall_headers": ("stall_headers;hold=20", False),
        "sse_stall": ("sse_stall;after=2;hold=20", True),
        "slow": ("healthy;token_interval=0.1;tokens=60", True),
    }

    async def run(kind: str) -> None:
        spec, stream = kinds[kind]
        with anyio.move_on_after(8):
            if stream:
                s = await client.chat.completions.create(
                    model="m",
                    messages=MSGS,
                    stream=True,
                    agent=kind,
                    extra_headers={"X-Fault": spec},
                )
                async for _ in s:
                    pass
            else:
                await client.chat.completions.create(
                    model="m", messages=MSGS, agent=kind, extra_headers={"X-Fault": spec}
                )

    snapshot: tuple[stallproof.InflightCall, ...] = ()

    def settled() -> bool:
        # The stuck calls have been stuck for 0.8 s; the slow streams have made progress.
        nonlocal snapshot
        snapshot = client.inflight(stalled_after=0.8)
        slow = [c for c in snapshot if c.agent == "slow"]
        return (
            len(snapshot) == 20
            and sum(c.stalled for c in snapshot) == 15
            and all(c.content_chunks >= 5 for c in slow)
        )

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(run, list(kinds)[i % 4])
        await wait_until(settled, timeout=5, what="15 calls stalled, 5 streaming")
        text = stallproof.format_inflight(snapshot)
        tg.cancel_scope.cancel()
    assert len(snapshot) == 20
    by_agent: dict[str, set[tuple[str, bool]]] = {}
    for c in snapshot:
        by_agent.setdefault(c.agent or "", set()).add((c.phase, c.stalled))
        assert c.deadline_left > 8 and c.attempt == 1
    assert by_agent == {
        "half_open": {("awaiting headers", True)},
        "stall_headers": {("awaiting headers", True)},
        "sse_stall": {("streaming", True)},
        "slow": {("streaming", False)},
    }
    slow = [c for c in snapshot if c.agent == "slow"]
    assert all(c.content_chunks >= 5 and c.since_progress < 0.8 for c in slow)
    assert "20 calls in flight (15 stalled)" in text
    assert "awaiting headers 10" in text and "streaming 10" in text
    assert client.inflight() == ()  # everything ended: nothing left in the registry


async def test_tag_context_variable_flows_into_calls(
    fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url("healthy", delay=0.5))
    seen: list[stallproof.InflightCall] = []

    async def watch() -> None:
        await wait_until(lambda: bool(client.inflight()), what="a call in flight")
        seen.extend(client.inflight())

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        with stallproof.tag(agent="writer", team="a"), stallproof.tag(round="1"):
            await client.chat.completions.create(model="m", messages=MSGS)
    (c,) = seen
    assert c.agent == "writer" and dict(c.labels) == {"team": "a", "round": "1"}


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="needs SIGUSR1")
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_sigusr1_dumps_the_table(fault_server: Any, make_client: MakeClient) -> None:
    client = make_client(fault_server.url("half_open", hold=10))
    out = io.StringIO()
    restore = stallproof.dump_on_signal(client, file=out, stalled_after=0.1)
    try:
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                with anyio.move_on_after(8):
                    await client.chat.completions.create(model="m", messages=MSGS, agent="x")

            tg.start_soon(call)
            await wait_until(
                lambda: any(c.stalled for c in client.inflight(stalled_after=0.1)),
                what="the call stalled",
            )
            os.kill(os.getpid(), signal.SIGUSR1)
            await wait_until(lambda: "in flight" in out.getvalue(), what="the table dumped")
            tg.cancel_scope.cancel()
    finally:
        restore()
    text = out.getvalue()
    assert "1 calls in flight (1 stalled)" in text and "awaiting headers" in text
    assert "STALLED" in text and KEY not in text


async def test_breaker_changes_are_span_events(
    fault_server: Any, fault_key: str, make_client: MakeClient, spans: Any
) -> None:
    provider, exporter = spans
    client = make_client(
        fault_server.url(),
        tracer_provider=provider,
        breaker=stallproof.Breaker(fail_max=1, reset_timeout=0.2),
    )
    with pytest.raises(stallproof.InternalServerError):
        await client.chat.completions.create(
            model="m", messages=MSGS, extra_headers={"X-Fault": f"status;code=503;key={fault_key}"}
        )
    await anyio.sleep(0.25)
    await client.chat.completions.create(model="m", messages=MSGS)  # the probe, healthy
    changes = [
        (e.attributes["stallproof.breaker.from"], e.attributes["stallproof.breaker.to"])
        for s in exporter.get_finished_spans()
        for e in s.events
        if e.name == "stallproof.breaker_state_change"
    ]
    assert changes == [("closed", "open"), ("open", "closed")]
