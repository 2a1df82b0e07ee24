"""The other wire formats: Anthropic Messages, OpenAI Responses, embeddings, models.

The real SDKs (openai, anthropic) must parse the healthy answers, streamed and not; the
faults of the catalogue must break these formats the way they break chat, checked on the
wire with a raw socket: which events come, and when the silence starts.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any
from urllib.parse import urlsplit

import anthropic
import httpx
import httpx2
import openai
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import FunctionToolParam, Response, ResponseStreamEvent
from pydantic import TypeAdapter
from typing_extensions import TypedDict

from fault_server import FAULTS, ServerThread

from ..support.wire import MessagesArgs, Raw, address, dechunk, request

pytestmark = pytest.mark.usefixtures("no_server_errors")

SAID = "hello brave new world"
ANSWER = "echo: hello brave new world lorem ipsum dolor"  # 8 tokens, the default.


class ResponsesArgs(TypedDict):
    """What every Responses call here sends."""

    model: str
    input: str


MESSAGES: MessagesArgs = {
    "model": "claude-test",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": SAID}],
}
RESPONSES: ResponsesArgs = {"model": "gpt-test", "input": SAID}
TOOL: anthropic.types.ToolParam = {
    "name": "lookup",
    "description": "Look up",
    "input_schema": {"type": "object"},
}


def anthropic_url(srv: ServerThread, fault: str | None = None, **params: Any) -> str:
    """The base URL for the anthropic SDK, which adds ``/v1`` itself."""
    return srv.url(fault, **params).removesuffix("/v1")


def api_path(srv: ServerThread, api: str, fault: str | None = None, **params: Any) -> str:
    return urlsplit(srv.url(fault, **params)).path + "/" + api


def sse(payload: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data JSON) of each event of a dechunked SSE body."""
    out = []
    for block in payload.decode().split("\n\n"):
        lines = block.split("\n")
        name = next((ln[len("event: ") :] for ln in lines if ln.startswith("event: ")), "")
        data = "\n".join(ln[len("data: ") :] for ln in lines if ln.startswith("data: "))
        if data:
            out.append((name, json.loads(data)))
    return out


def raw_stream(
    srv: ServerThread, api: str, payload: object, fault: str, seconds: float, **params: Any
) -> tuple[int, dict[str, str], bytes, bool, float]:
    """Status, headers, the dechunked body read within ``seconds``, whether it was
    terminated, and when the last byte came (seconds after the head)."""
    with Raw(srv) as raw:
        path = api_path(srv, api, fault, **params)
        raw.send(request(path, payload, headers=(("Connection", "close"),)))
        status, headers = raw.head()
        start = time.monotonic()
        data, last = raw.buffer, 0.0
        raw.buffer = b""
        while (left := seconds - (time.monotonic() - start)) > 0:
            more, eof = raw.recv_for(min(left, 0.05))
            if more:
                data, last = data + more, time.monotonic() - start
            if eof:
                break
    body, ended = dechunk(data) if headers.get("transfer-encoding") == "chunked" else (data, True)
    return status, headers, body, ended, last


# -- healthy answers, through the real SDKs ----------------------------------------------


@pytest.mark.anyio
async def test_anthropic_sdk_non_stream(srv: ServerThread) -> None:
    async with anthropic.AsyncAnthropic(
        base_url=anthropic_url(srv), api_key="x", max_retries=0
    ) as client:
        message = await client.messages.create(**MESSAGES)
        models = [model.id async for model in client.models.list()]
    assert models == ["fault-model", "gpt-4o-mini"]
    assert message.id.startswith("msg_")
    assert message.role == "assistant"
    assert message.model == "claude-test"
    assert [block.type for block in message.content] == ["text"]
    block = message.content[0]
    assert isinstance(block, anthropic.types.TextBlock)
    assert block.text == ANSWER
    assert message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (4, 8)


@pytest.mark.anyio
async def test_anthropic_sdk_stream_helper(srv: ServerThread) -> None:
    async with (
        anthropic.AsyncAnthropic(base_url=anthropic_url(srv), api_key="x", max_retries=0) as client,
        client.messages.stream(**MESSAGES) as stream,
    ):
        text = "".join([piece async for piece in stream.text_stream])
        final = await stream.get_final_message()
    assert text == ANSWER
    block = final.content[0]
    assert isinstance(block, anthropic.types.TextBlock)
    assert block.text == ANSWER
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 8


@pytest.mark.anyio
async def test_anthropic_sdk_raw_events_have_ping_and_typed_blocks(srv: ServerThread) -> None:
    async with anthropic.AsyncAnthropic(
        base_url=anthropic_url(srv), api_key="x", max_retries=0
    ) as client:
        stream = await client.messages.create(**MESSAGES, stream=True)
        kinds = [event.type async for event in stream]
    # The SDK drops the ping (test_anthropic_stream_on_the_wire sees it): typed events only.
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[2:-3] == ["content_block_delta"] * 8
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_anthropic_stream_on_the_wire(srv: ServerThread) -> None:
    status, headers, body, ended, _ = raw_stream(
        srv, "messages", {**MESSAGES, "stream": True}, "healthy", 3
    )
    assert status == 200
    assert headers["content-type"] == "text/event-stream"
    assert ended
    names = [name for name, _ in sse(body)]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-1] == "message_stop"
    for name, data in sse(body):
        assert data["type"] == name  # every event names its type twice, as Anthropic does.


@pytest.mark.anyio
async def test_anthropic_sdk_tool_use(srv: ServerThread) -> None:
    async with anthropic.AsyncAnthropic(
        base_url=anthropic_url(srv), api_key="x", max_retries=0
    ) as client:
        message = await client.messages.create(**MESSAGES, tools=[TOOL])
        async with client.messages.stream(**MESSAGES, tools=[TOOL]) as stream:
            final = await stream.get_final_message()
    for reply in (message, final):
        assert reply.stop_reason == "tool_use"
        block = reply.content[0]
        assert isinstance(block, anthropic.types.ToolUseBlock)
        assert block.name == "lookup"
        assert block.id.startswith("toolu_")
        assert block.input == {"text": ANSWER}


@pytest.mark.anyio
async def test_openai_sdk_responses(srv: ServerThread) -> None:
    async with openai.AsyncOpenAI(base_url=srv.url(), api_key="x", max_retries=0) as client:
        response = await client.responses.create(**RESPONSES)
        stream = await client.responses.create(**RESPONSES, stream=True)
        streamed = [event async for event in stream]
    assert response.id.startswith("resp_")
    assert response.status == "completed"
    assert response.output_text == ANSWER
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (4, 8)
    kinds = [event.type for event in streamed]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-1] == "response.completed"
    assert [event.sequence_number for event in streamed] == list(range(len(streamed)))
    deltas = [e.delta for e in streamed if e.type == "response.output_text.delta"]
    assert "".join(deltas) == ANSWER
    last = streamed[-1]
    assert last.type == "response.completed"
    assert last.response.output_text == ANSWER


@pytest.mark.anyio
async def test_openai_sdk_responses_function_call_and_length(srv: ServerThread) -> None:
    tool: FunctionToolParam = {
        "type": "function",
        "name": "lookup",
        "parameters": {"type": "object"},
        "strict": None,
    }
    async with openai.AsyncOpenAI(base_url=srv.url(), api_key="x", max_retries=0) as client:
        called = await client.responses.create(**RESPONSES, tools=[tool])
        short = await client.responses.create(**RESPONSES, max_output_tokens=3)
    item = called.output[0]
    assert item.type == "function_call"
    assert item.name == "lookup"
    assert json.loads(item.arguments) == {"text": ANSWER}
    assert short.status == "incomplete"
    assert short.incomplete_details is not None
    assert short.incomplete_details.reason == "max_output_tokens"
    assert short.output_text == "echo: hello brave"


@pytest.mark.anyio
async def test_openai_sdk_embeddings_and_models(srv: ServerThread) -> None:
    async with openai.AsyncOpenAI(base_url=srv.url(), api_key="x", max_retries=0) as client:
        packed = await client.embeddings.create(model="emb", input=["a b", "c"])  # base64
        plain = await client.embeddings.create(
            model="emb", input="a b", encoding_format="float", dimensions=16
        )
        models = [model.id async for model in client.models.list()]
    assert [e.index for e in packed.data] == [0, 1]
    assert len(packed.data[0].embedding) == 16
    assert packed.data[0].embedding != packed.data[1].embedding
    assert plain.data[0].embedding == packed.data[0].embedding  # deterministic, either encoding
    assert abs(sum(x * x for x in plain.data[0].embedding) - 1) < 1e-4  # a unit vector
    assert packed.usage.prompt_tokens == 3
    assert models == ["fault-model", "gpt-4o-mini"]


def test_bad_requests_get_a_400_that_names_the_field(srv: ServerThread) -> None:
    cases = [
        ("messages", {"model": "m", "messages": []}, "max_tokens"),
        ("responses", {"model": "m", "input": 3}, "input"),
        ("embeddings", {"model": "m", "input": []}, "input"),
        ("embeddings", {"model": "m", "input": "x", "dimensions": 0}, "dimensions"),
    ]
    for api, payload, field in cases:
        status, _, body, _, _ = raw_stream(srv, api, payload, "healthy", 2)
        assert status == 400, (api, body)
        error = json.loads(body)["error"]
        if api == "messages":  # Anthropic's shape has no param: the message names it.
            assert field in error["message"]
        else:
            assert error["param"] == field


# -- faults in these formats, on the wire -------------------------------------------------


def test_sse_stall_on_messages_stops_after_the_opening_and_two_deltas(srv: ServerThread) -> None:
    status, _, body, ended, _ = raw_stream(
        srv, "messages", {**MESSAGES, "stream": True}, "sse_stall", 1.0, hold=0.6
    )
    assert status == 200
    assert not ended
    names = [name for name, _ in sse(body)]
    assert names == ["message_start", "content_block_start", "ping"] + ["content_block_delta"] * 2


def test_sse_keepalive_on_messages_is_a_ping_flood(srv: ServerThread) -> None:
    status, _, body, _, _ = raw_stream(
        srv, "messages", {**MESSAGES, "stream": True}, "sse_keepalive", 1.0, interval=0.1, hold=0.8
    )
    assert status == 200
    events = sse(body)
    assert len(events) >= 4
    assert all(name == "ping" and data == {"type": "ping"} for name, data in events)


def test_sse_keepalive_on_responses_is_comments(srv: ServerThread) -> None:
    _, _, body, _, _ = raw_stream(
        srv, "responses", {**RESPONSES, "stream": True}, "sse_keepalive", 0.6, interval=0.1
    )
    assert body.startswith(b": keep-alive\n\n")
    assert not sse(body)


def test_no_done_on_messages_drops_message_stop(srv: ServerThread) -> None:
    _, _, body, ended, _ = raw_stream(srv, "messages", {**MESSAGES, "stream": True}, "no_done", 2)
    assert ended
    names = [name for name, _ in sse(body)]
    assert names[-1] == "message_delta"
    assert "message_stop" not in names


def test_error_event_on_messages_and_responses(srv: ServerThread) -> None:
    _, _, body, _, _ = raw_stream(srv, "messages", {**MESSAGES, "stream": True}, "error_event", 2)
    name, data = sse(body)[-1]
    assert name == "error"
    assert data["error"]["type"] == "overloaded_error"
    assert [n for n, _ in sse(body)][:4] == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
    ]
    _, _, body, _, _ = raw_stream(srv, "responses", {**RESPONSES, "stream": True}, "error_event", 2)
    name, data = sse(body)[-1]
    assert (name, data["type"]) == ("error", "error")


@pytest.mark.anyio
async def test_status_on_messages_is_anthropic_shaped(srv: ServerThread) -> None:
    url = anthropic_url(srv, "status", code=429, retry_after="0")
    async with anthropic.AsyncAnthropic(base_url=url, api_key="x", max_retries=0) as client:
        with pytest.raises(anthropic.RateLimitError) as caught:
            await client.messages.create(**MESSAGES)
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["type"] == "error"
    assert body["error"]["type"] == "rate_limit_error"


def test_endless_line_on_responses_grows_one_delta(srv: ServerThread) -> None:
    _, _, body, ended, last = raw_stream(
        srv, "responses", {**RESPONSES, "stream": True}, "endless_line", 0.8, interval=0.05
    )
    assert not ended
    assert last > 0.5  # bytes kept coming...
    complete, _, tail = body.rpartition(b"\n\n")
    assert len(sse(complete + b"\n\n")) == 4  # ...but no event after the opening completes.
    assert tail.startswith(b"event: response.output_text.delta")
    assert tail.endswith(b" lorem")


def test_trickle_body_on_embeddings(srv: ServerThread) -> None:
    payload = {"model": "emb", "input": "x", "dimensions": 1}
    status, headers, body, _, last = raw_stream(
        srv, "embeddings", payload, "trickle_body", 3, interval=0.002, chunk=4
    )
    assert status == 200
    assert len(body) == int(headers["content-length"])
    assert json.loads(body)["data"][0]["object"] == "embedding"
    assert last > 0.05


def test_chat_only_faults_refuse_other_apis(srv: ServerThread) -> None:
    for fault in ("tool_split", "index_gap", "tool_args_unclosed", "bad_usage"):
        status, _, body, _, _ = raw_stream(srv, "messages", MESSAGES, fault, 2)
        assert status == 400
        data = json.loads(body)
        assert data["type"] == "error"
        assert "chat completions only" in data["error"]["message"]


@pytest.mark.anyio
async def test_anthropic_sdk_times_out_on_a_stalled_stream(srv: ServerThread) -> None:
    url = anthropic_url(srv, "sse_stall", hold=3)
    async with anthropic.AsyncAnthropic(
        base_url=url, api_key="x", max_retries=0, timeout=anthropic.Timeout(5, read=0.3)
    ) as client:
        start = time.monotonic()
        # Mid-stream the SDK lets its HTTP client's own ReadTimeout through.
        with pytest.raises((anthropic.APITimeoutError, httpx2.ReadTimeout)):
            async with client.messages.stream(**MESSAGES) as stream:
                async for _ in stream.text_stream:
                    pass
        elapsed = time.monotonic() - start
    assert 0.3 <= elapsed < 1.5


# -- every fault, every format: ends within its hold, no server error ---------------------

EMBEDDINGS = {"model": "emb", "input": ["a b", "c"]}
PAYLOADS = [
    ("messages", MESSAGES),
    ("messages", {**MESSAGES, "stream": True}),
    ("messages", {**MESSAGES, "tools": [TOOL], "stream": True}),
    ("responses", RESPONSES),
    ("responses", {**RESPONSES, "stream": True}),
    ("embeddings", EMBEDDINGS),
]
SMALL = {"size": 4096, "interval": 0.01, "wait": 0.01, "tps": 200, "bytes": 300}


def every_fault_ends(server: ServerThread) -> None:
    """Every request-level fault on every format, at once: each ends (the server closes)
    within its hold, and the autouse fixture sees no server error."""
    host, port = address(server.base_url)

    async def one(fault: str, api: str, payload: object) -> None:
        params = {p.name: SMALL[p.name] for p in FAULTS[fault].params if p.name in SMALL}
        reader, writer = await asyncio.open_connection(host, port)
        try:
            path = api_path(server, api, fault, hold=0.3, **params)
            writer.write(request(path, payload, headers=(("Connection", "close"),)))
            with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
                await asyncio.wait_for(reader.readexactly(1 << 24), 3)
        finally:
            writer.close()

    async def main() -> None:
        await asyncio.gather(
            *(
                one(name, api, payload)
                for name, info in FAULTS.items()
                if info.scope == "request"
                for api, payload in PAYLOADS
            )
        )

    start = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - start < 4


def test_every_fault_on_every_format_ends_cleanly(srv: ServerThread) -> None:
    every_fault_ends(srv)


def test_every_fault_on_every_format_through_the_proxy(proxy: ServerThread) -> None:
    every_fault_ends(proxy)


def test_proxy_keeps_the_opening_of_a_real_anthropic_stream(proxy: ServerThread) -> None:
    status, _, body, ended, _ = raw_stream(
        proxy, "messages", {**MESSAGES, "stream": True}, "sse_stall", 1.0, after=1, hold=0.5
    )
    assert status == 200
    assert not ended
    names = [name for name, _ in sse(body)]
    assert names == ["message_start", "content_block_start", "ping", "content_block_delta"]
    _, _, body, ended, _ = raw_stream(proxy, "messages", {**MESSAGES, "stream": True}, "no_done", 2)
    assert ended
    assert [name for name, _ in sse(body)][-1] == "message_delta"


def test_deeply_nested_json_gets_a_400(srv: ServerThread) -> None:
    body = b"[" * 100_000
    for api in ("messages", "responses", "embeddings"):
        head = (
            f"POST {api_path(srv, api)} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        with Raw(srv) as raw:
            raw.send(head.encode() + body)
            status, _ = raw.head()
        assert status == 400, api


# -- exact to each SDK's own types, validated strictly (pydantic's model_validate, which
# the SDKs skip when they build their objects), and every error in its API's own shape ----

CHAT = {"model": "m", "messages": [{"role": "user", "content": SAID}]}


def post(srv: ServerThread, api: str, payload: object, fault: str | None = None) -> Any:
    url = srv.base_url + api_path(srv, api, fault)
    return httpx.post(url, json=payload, timeout=10)


def test_healthy_answers_validate_strictly(srv: ServerThread) -> None:
    ChatCompletion.model_validate(post(srv, "chat/completions", CHAT).json())
    Response.model_validate(post(srv, "responses", RESPONSES).json())
    Message.model_validate(post(srv, "messages", MESSAGES).json())


def test_streamed_events_validate_strictly(srv: ServerThread) -> None:
    _, _, body, _, _ = raw_stream(srv, "chat/completions", {**CHAT, "stream": True}, "healthy", 5)
    for _, data in sse(body.replace(b"data: [DONE]\n\n", b"")):
        ChatCompletionChunk.model_validate(data)
    _, _, body, _, _ = raw_stream(srv, "responses", {**RESPONSES, "stream": True}, "healthy", 5)
    events = TypeAdapter(ResponseStreamEvent)
    numbers = [events.validate_python(data).sequence_number for _, data in sse(body)]
    assert numbers == list(range(len(numbers)))
    _, _, body, _, _ = raw_stream(srv, "messages", {**MESSAGES, "stream": True}, "healthy", 5)
    adapter = TypeAdapter(RawMessageStreamEvent)
    for name, data in sse(body):
        if name != "ping":  # a ping is not a message event: the SDK skips it.
            assert adapter.validate_python(data).type == name


def test_the_responses_error_event_continues_the_numbering(srv: ServerThread) -> None:
    payload = {**RESPONSES, "stream": True}
    _, _, body, _, _ = raw_stream(srv, "responses", payload, "error_event", 5, after=2)
    events = sse(body)
    assert events[-1][0] == "error"
    numbers = [data["sequence_number"] for _, data in events]
    assert numbers == list(range(len(events)))  # 0..5, then the error as 6.
    TypeAdapter(ResponseStreamEvent).validate_python(events[-1][1])


def test_malformed_json_on_messages_is_a_named_event_the_sdk_fails_on(srv: ServerThread) -> None:
    payload = {**MESSAGES, "stream": True}
    _, _, body, _, _ = raw_stream(srv, "messages", payload, "malformed_json", 5)
    assert b"event: content_block_delta\ndata: {not json" in body
    client = anthropic.Anthropic(base_url=anthropic_url(srv, "malformed_json"), api_key="x")
    with pytest.raises(json.JSONDecodeError), client.messages.stream(**MESSAGES) as stream:
        for _ in stream:
            pass
    client.close()


def test_malformed_json_on_responses_is_a_named_event(srv: ServerThread) -> None:
    payload = {**RESPONSES, "stream": True}
    _, _, body, _, _ = raw_stream(srv, "responses", payload, "malformed_json", 5)
    assert b"event: response.output_text.delta\ndata: {not json" in body


@pytest.mark.parametrize(
    ("fault", "payload"),
    [
        (None, {"model": "claude", "messages": []}),  # no max_tokens: a bad request.
        ("no_such_fault", MESSAGES),  # an unknown fault: a bad request too.
    ],
)
def test_messages_400s_are_anthropic_shaped(
    srv: ServerThread, fault: str | None, payload: object
) -> None:
    url = srv.base_url + api_path(srv, "messages")
    headers = {} if fault is None else {"X-Fault": fault}
    response = httpx.post(url, json=payload, headers=headers, timeout=10)
    assert response.status_code == 400
    body = response.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"]
    client = anthropic.Anthropic(base_url=anthropic_url(srv), api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.create(
            model="claude",
            max_tokens=0 if fault is None else 8,
            messages=[],
            extra_headers=headers,
        )
    assert raised.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    client.close()


def test_chat_400s_stay_openai_shaped(srv: ServerThread) -> None:
    response = post(srv, "chat/completions", {"model": "m"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages"
    client = openai.OpenAI(base_url=srv.url(), api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=[], extra_headers={"X-Fault": "nope"})
    client.close()
