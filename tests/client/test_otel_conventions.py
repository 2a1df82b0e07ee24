"""Telemetry against the OpenTelemetry GenAI conventions and the instrumentation people run.

Names are checked against the constants of `opentelemetry-semantic-conventions`, not
strings copied by hand, so a rename upstream fails here first.
"""

from __future__ import annotations

import http.server
import json
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai.types.chat import ChatCompletionMessageParam
from opentelemetry import trace
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as GA
from opentelemetry.semconv._incubating.attributes import openai_attributes as OA
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics as GM
from opentelemetry.semconv.attributes import error_attributes as EA
from opentelemetry.semconv.attributes import server_attributes as SA

import stallproof
from stallproof._telemetry import infer_provider

from ..support.clients import KEY, MakeClient
from ..support.timing import MARGIN

pytestmark = pytest.mark.anyio

MSGS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]
# The conventions' advice for gen_ai.client.operation.duration (seconds) and for
# gen_ai.client.token.usage: values, not names, so written out as the spec gives them.
DURATION_ADVICE = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)
TOKEN_ADVICE = (
    1,
    4,
    16,
    64,
    256,
    1024,
    4096,
    16384,
    65536,
    262144,
    1048576,
    4194304,
    16777216,
    67108864,
)


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _metrics(reader: InMemoryMetricReader) -> dict[str, Any]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }


async def test_span_attributes_use_the_conventions_names(
    fault_server: Any, make_client: MakeClient, spans: Any
) -> None:
    provider, exporter = spans
    client = make_client(fault_server.url(), tracer_provider=provider)
    resp = await client.chat.completions.create(
        model="m-1",
        messages=MSGS,
        max_tokens=16,
        n=2,
        stop=["\n\n"],
        response_format={"type": "json_object"},
        agent="planner",
    )
    (call,) = [s for s in exporter.get_finished_spans() if s.name == "chat m-1"]
    a = dict(call.attributes or {})
    assert a[GA.GEN_AI_OPERATION_NAME] == GA.GenAiOperationNameValues.CHAT.value
    assert a[GA.GEN_AI_PROVIDER_NAME] == GA.GenAiProviderNameValues.OPENAI.value
    assert a[GA.GEN_AI_REQUEST_MODEL] == "m-1"
    assert a[GA.GEN_AI_REQUEST_MAX_TOKENS] == 16
    assert a[GA.GEN_AI_REQUEST_CHOICE_COUNT] == 2
    assert a[GA.GEN_AI_REQUEST_STOP_SEQUENCES] == ("\n\n",)
    assert a[GA.GEN_AI_OUTPUT_TYPE] == GA.GenAiOutputTypeValues.JSON.value
    assert a[GA.GEN_AI_AGENT_NAME] == "planner"
    assert "stallproof.agent" not in a
    assert a[GA.GEN_AI_RESPONSE_ID] == resp.id
    assert a[GA.GEN_AI_RESPONSE_MODEL] == resp.model
    assert resp.usage is not None
    assert a[GA.GEN_AI_USAGE_INPUT_TOKENS] == resp.usage.prompt_tokens
    assert a[GA.GEN_AI_USAGE_OUTPUT_TOKENS] == resp.usage.completion_tokens
    # The fault server answers as OpenAI does: details objects, tier and fingerprint.
    assert a[GA.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 0
    assert a[GA.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS] == 0
    assert a[OA.OPENAI_RESPONSE_SERVICE_TIER] == "default"
    assert a[OA.OPENAI_RESPONSE_SYSTEM_FINGERPRINT] == "fp_fault_server"
    assert a[SA.SERVER_ADDRESS] == "127.0.0.1" and isinstance(a[SA.SERVER_PORT], int)


async def test_metrics_names_buckets_and_attributes(
    fault_server: Any, make_client: MakeClient
) -> None:
    reader = InMemoryMetricReader()
    client = make_client(
        fault_server.url("healthy", tokens=5), meter_provider=MeterProvider(metric_readers=[reader])
    )
    resp = await client.chat.completions.create(model="m", messages=MSGS)
    stream = await client.chat.completions.create(model="m", messages=MSGS, stream=True)
    chunks = 0
    async for chunk in stream:
        chunks += bool(chunk.choices and chunk.choices[0].delta.content)
    m = _metrics(reader)

    duration = m[GM.GEN_AI_CLIENT_OPERATION_DURATION]
    points = list(duration.data.data_points)
    assert sum(p.count for p in points) == 2
    assert all(tuple(p.explicit_bounds) == DURATION_ADVICE for p in points)
    for p in points:
        attrs = dict(p.attributes)
        assert attrs[GA.GEN_AI_OPERATION_NAME] == "chat"
        assert attrs[GA.GEN_AI_PROVIDER_NAME] == "openai"
        assert attrs[GA.GEN_AI_REQUEST_MODEL] == "m"
        assert attrs[GA.GEN_AI_RESPONSE_MODEL] == resp.model
        assert attrs[SA.SERVER_ADDRESS] == "127.0.0.1"
        assert isinstance(attrs[SA.SERVER_PORT], int)
        assert EA.ERROR_TYPE not in attrs

    usage = m[GM.GEN_AI_CLIENT_TOKEN_USAGE]
    by_type = {dict(p.attributes)[GA.GEN_AI_TOKEN_TYPE]: p for p in usage.data.data_points}
    assert set(by_type) == {"input", "output"}
    assert resp.usage is not None
    assert by_type["input"].sum == resp.usage.prompt_tokens  # only the non-stream call reports
    assert by_type["output"].sum == resp.usage.completion_tokens
    assert all(tuple(p.explicit_bounds) == TOKEN_ADVICE for p in by_type.values())

    assert (
        sum(p.count for p in m[GM.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK].data.data_points)
        == 1
    )
    per_chunk = m[GM.GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK]
    # One point per content chunk after the first (the finish chunk counts: it is content).
    assert sum(p.count for p in per_chunk.data.data_points) == chunks


async def test_error_type_names_the_bound_even_for_a_cancelled_attempt(
    fault_server: Any, fault_key: str, make_client: MakeClient, spans: Any
) -> None:
    """An attempt cut off by the total deadline reports the timeout, not CancelledError."""
    provider, exporter = spans
    reader = InMemoryMetricReader()
    client = make_client(
        fault_server.url("half_open"),
        tracer_provider=provider,
        meter_provider=MeterProvider(metric_readers=[reader]),
        timeout=stallproof.Timeouts(total=0.5, read=10, connect=5),
    )
    with pytest.raises(stallproof.TotalTimeout):
        await client.chat.completions.create(model="m", messages=MSGS)
    finished = exporter.get_finished_spans()
    (attempt,) = [s for s in finished if s.name == "POST"]
    (call,) = [s for s in finished if s.name == "chat m"]
    assert (attempt.attributes or {})[EA.ERROR_TYPE] == "stallproof.TotalTimeout"
    assert (call.attributes or {})[EA.ERROR_TYPE] == "stallproof.TotalTimeout"
    assert [e.name for e in attempt.events] == ["stallproof.deadline_expired"]
    m = _metrics(reader)
    outcomes = {
        dict(p.attributes)["stallproof.outcome"]
        for p in m["stallproof.client.attempts"].data.data_points
    }
    assert outcomes == {"stallproof.TotalTimeout"}
    (point,) = m[GM.GEN_AI_CLIENT_OPERATION_DURATION].data.data_points
    assert dict(point.attributes)[EA.ERROR_TYPE] == "stallproof.TotalTimeout"
    assert point.sum < 0.5 + MARGIN


async def test_deadline_scope_names_itself_in_error_type(
    fault_server: Any, make_client: MakeClient, spans: Any
) -> None:
    provider, exporter = spans
    client = make_client(fault_server.url("half_open"), tracer_provider=provider)
    with pytest.raises(stallproof.DeadlineExceeded), stallproof.deadline(0.3, name="step"):
        await client.chat.completions.create(model="m", messages=MSGS)
    (attempt,) = [s for s in exporter.get_finished_spans() if s.name == "POST"]
    assert (attempt.attributes or {})[EA.ERROR_TYPE] == "stallproof.DeadlineExceeded"


def test_provider_is_inferred_only_from_well_known_hosts() -> None:
    P = GA.GenAiProviderNameValues
    assert infer_provider("api.openai.com") == P.OPENAI.value
    assert infer_provider("my-rg.openai.azure.com") == P.AZURE_AI_OPENAI.value
    assert infer_provider("api.anthropic.com", "/v1/messages") == P.ANTHROPIC.value
    assert infer_provider("generativelanguage.googleapis.com") == P.GCP_GEMINI.value
    assert infer_provider("api.mistral.ai") == P.MISTRAL_AI.value
    assert infer_provider("API.GROQ.COM.") == P.GROQ.value
    assert infer_provider("api.deepseek.com") == P.DEEPSEEK.value
    assert infer_provider("api.x.ai") == P.X_AI.value
    assert infer_provider("bedrock-runtime.us-east-1.amazonaws.com") == P.AWS_BEDROCK.value
    # Anything else is named by the API it speaks, like the official instrumentation.
    assert infer_provider("s3.amazonaws.com") == "openai"
    assert infer_provider("127.0.0.1", "/v1/chat/completions") == "openai"
    assert infer_provider("vllm.internal", "/v1/messages") == "anthropic"
    assert infer_provider("evil-api.openai.com.attacker.net") == "openai"  # by API, not host


async def test_explicit_provider_name_wins(
    fault_server: Any, make_client: MakeClient, spans: Any
) -> None:
    provider, exporter = spans
    client = make_client(fault_server.url(), tracer_provider=provider, provider_name="vllm")
    await client.chat.completions.create(model="m", messages=MSGS)
    (call,) = [s for s in exporter.get_finished_spans() if s.name == "chat m"]
    assert (call.attributes or {})[GA.GEN_AI_PROVIDER_NAME] == "vllm"


# -- one trace with httpx instrumentation on ------------------------------------------------


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Answers every POST with one chat completion and remembers its traceparent."""

    seen: list[str | None]

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append(self.headers.get("traceparent"))  # type: ignore[attr-defined]
        body = json.dumps(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 1,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "hi"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[str | None]]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", server.seen  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def httpx_instrumented(spans: Any) -> Iterator[None]:
    provider, _ = spans
    instrumentor = HTTPXClientInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        yield
    finally:
        instrumentor.uninstrument()


def _check_one_trace(
    exporter: InMemorySpanExporter, root: ReadableSpan, seen: list[str | None], calls: int
) -> None:
    finished = exporter.get_finished_spans()
    assert {s.context.trace_id for s in finished} == {root.context.trace_id}, [
        (s.name, s.parent) for s in finished
    ]
    chats = [s for s in finished if s.name == "chat m"]
    posts = [s for s in finished if s.kind == trace.SpanKind.CLIENT and s.name.startswith("POST")]
    assert len(chats) == calls and len(posts) == calls  # one client span per attempt, no more
    for chat in chats:
        assert chat.parent is not None and chat.parent.span_id == root.context.span_id
    chat_ids = {c.context.span_id for c in chats}
    assert all(p.parent is not None and p.parent.span_id in chat_ids for p in posts)
    # What reached the server names our attempt spans, in the caller's trace.
    assert len(seen) == calls
    wire = {tuple(int(x, 16) for x in str(tp).split("-")[1:3]) for tp in seen}
    assert wire == {(p.context.trace_id, p.context.span_id) for p in posts}


async def test_one_trace_with_httpx_instrumentation(
    recorder: Any, spans: Any, httpx_instrumented: None, make_client: MakeClient
) -> None:
    """Native client, a caller's httpx client under it, and the bare transport: each
    call one chat span and one POST span, in the caller's trace, the wire naming ours."""
    url, seen = recorder
    provider, exporter = spans
    tracer = provider.get_tracer("harness")
    native = make_client(url, tracer_provider=provider, retry=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the once-only "not our pool" note
        theirs = make_client(
            url, tracer_provider=provider, retry=None, http_client=httpx.AsyncClient()
        )
    transport = stallproof.AsyncTransport(tracer_provider=provider, retry=None)
    with tracer.start_as_current_span("agent step") as root:
        await native.chat.completions.create(model="m", messages=MSGS)
        await theirs.chat.completions.create(model="m", messages=MSGS)
        async with httpx.AsyncClient(transport=transport, base_url=url) as bare:
            r = await bare.post(
                "/chat/completions",
                json={"model": "m", "messages": MSGS},
                headers={"Authorization": f"Bearer {KEY}"},
            )
            assert r.status_code == 200
    (root_span,) = [s for s in exporter.get_finished_spans() if s.name == "agent step"]
    assert root_span.context.span_id == root.get_span_context().span_id
    _check_one_trace(exporter, root_span, seen, calls=3)
