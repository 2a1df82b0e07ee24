"""The same agent code, written for ``openai.AsyncOpenAI``, run against the SDK and against
``stallproof.Client`` on the fault server: everything it observes must be the same.

`agent_run` is realistic harness code: a tool loop that appends the assistant message
object, a stream with usage, structured outputs, the stream helper, raw responses, the
model list, embeddings, ``with_options`` and ``except openai.XxxError`` handlers. It returns
what it saw with the parts that differ per call (ids, timestamps) left out.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pydantic
import pytest
from openai.types import CreateEmbeddingResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ParsedChatCompletion

import stallproof

from ..support.clients import KEY, MakeClient, assert_pool_clean
from ..support.timing import MARGIN, stopwatch

pytestmark = [
    pytest.mark.anyio,
    # On trio, the SDK's own nested body and SSE generators (openai's, httpx2's, its
    # httpcore2 pool's) are finalised by the GC after its streams end: the SDK never closes
    # them with aclosing. stallproof.Client alone runs this code without any such warning.
    pytest.mark.filterwarnings("ignore:Async generator 'openai\\.:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:Async generator 'httpx2\\.:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:Async generator 'httpcore2\\.:ResourceWarning"),
]

MODEL = "fault-model"
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "save_note",
            "description": "Save a note",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
        },
    }
]


class Note(pydantic.BaseModel):
    """Arguments of a strict tool, parsed by ``chat.completions.parse``."""

    text: str


class Answer(pydantic.BaseModel):
    answer: str


class Transcript(pydantic.BaseModel):
    """A harness's own record: a pydantic field typed with openai's ChatCompletion."""

    completion: ChatCompletion


def _shape(completion: ChatCompletion) -> dict[str, Any]:
    data = completion.model_dump(exclude_none=True)
    data.pop("id"), data.pop("created")
    for choice in data["choices"]:
        for call in choice["message"].get("tool_calls", []):
            call.pop("id")
    return data


async def agent_run(client: Any, urls: dict[str, str]) -> dict[str, Any]:
    """Harness code as it is written for openai.AsyncOpenAI; ``client`` is either."""
    seen: dict[str, Any] = {}
    create = client.chat.completions.create

    # 1. A tool loop: append the assistant message object itself, then the tool results.
    messages: list[Any] = [
        {"role": "system", "content": "You save notes."},
        {"role": "user", "content": "remember the milk"},
    ]
    first = await create(model=MODEL, messages=messages, tools=TOOLS, temperature=openai.NOT_GIVEN)
    assert isinstance(first, ChatCompletion)
    message = first.choices[0].message
    messages.append(message)
    for call in message.tool_calls or []:
        assert call.type == "function"
        args = json.loads(call.function.arguments)
        messages.append({"role": "tool", "tool_call_id": call.id, "content": f"saved {args}"})
    final = await create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="none")
    seen["tool_loop"] = [_shape(first), _shape(final)]
    seen["transcript"] = Transcript(completion=final).completion.choices[0].message.content
    seen["dump"] = sorted(message.model_dump(exclude_none=True))

    # 2. A stream with usage, assembling streamed tool-call deltas.
    stream = await create(
        model=MODEL,
        messages=messages[:2],
        tools=TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    )
    arguments, finish, usage, types = "", None, None, set()
    async for chunk in stream:
        types.add(type(chunk).__name__)
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                arguments += (delta.function and delta.function.arguments) or ""
            finish = choice.finish_reason or finish
        usage = chunk.usage or usage
    assert usage is not None
    seen["stream"] = (types, json.loads(arguments), finish, usage.model_dump())

    # 3. Structured outputs: a strict pydantic tool and a pydantic response_format.
    parsed = await client.chat.completions.parse(
        model=MODEL,
        messages=messages[:2],
        tools=[openai.pydantic_function_tool(Note)],
        response_format=Answer,
    )
    assert isinstance(parsed, ParsedChatCompletion)
    assert parsed.choices[0].message.tool_calls
    tool_call = parsed.choices[0].message.tool_calls[0]
    seen["parse"] = (parsed.choices[0].message.parsed, tool_call.function.parsed_arguments)

    # 4. The stream helper and its final completion.
    async with client.chat.completions.stream(model=MODEL, messages=messages[:2]) as events:
        kinds = [event.type async for event in events]
        done = await events.get_final_completion()
    seen["stream_helper"] = (sorted(set(kinds)), done.choices[0].message.content)

    # 4b. openai's beta namespace holds the same helpers (autogen-ext calls it for parse).
    beta = await client.beta.chat.completions.parse(
        model=MODEL, messages=messages[:2], response_format=Answer
    )
    seen["beta_parse"] = beta.choices[0].message.parsed

    # 5. Raw and streaming responses: headers, then the typed result.
    raw = await client.chat.completions.with_raw_response.create(model=MODEL, messages=messages[:2])
    seen["raw"] = (raw.headers.get("content-type"), _shape(raw.parse()))
    async with client.chat.completions.with_streaming_response.create(
        model=MODEL, messages=messages[:2]
    ) as response:
        seen["streaming_response"] = (response.status_code, _shape(await response.parse()))

    # 6. Models and embeddings through the same client.
    seen["models"] = [m.id async for m in client.models.list()]
    page = await client.models.list()
    seen["models_page"] = [m.id for m in page.data]
    vectors = await client.embeddings.create(model="embed", input=["a", "b"])
    assert isinstance(vectors, CreateEmbeddingResponse)
    seen["embeddings"] = [(e.index, len(e.embedding)) for e in vectors.data]

    # 7. Errors, caught as openai's classes.
    limited = client.with_options(base_url=urls["429"], max_retries=0)
    try:
        await limited.chat.completions.create(model=MODEL, messages=messages[:2])
    except openai.RateLimitError as e:
        seen["429"] = (
            e.status_code,
            e.code,
            e.type,
            e.param,
            sorted(e.body) if isinstance(e.body, dict) else e.body,
            e.response.status_code,
            e.request_id is not None,
            isinstance(e, openai.APIStatusError),
        )
    try:
        await client.with_options(base_url=urls["404"]).models.list()
    except openai.NotFoundError as e:
        seen["404"] = (e.status_code, e.type)
    slow = client.with_options(base_url=urls["stall"], timeout=0.5, max_retries=0)
    with stopwatch() as elapsed:
        try:
            await slow.chat.completions.create(model=MODEL, messages=messages[:2])
        except openai.APITimeoutError as e:
            seen["timeout"] = isinstance(e, openai.APIConnectionError)
    assert elapsed[0] < 0.5 + MARGIN + 0.5
    refused = client.with_options(base_url=urls["refused"], max_retries=0)
    try:
        await refused.chat.completions.create(model=MODEL, messages=messages[:2])
    except openai.APIConnectionError as e:
        seen["refused"] = type(e).__mro__.index(openai.APIError) > 0
    try:
        await create(model=MODEL, messages=messages[:2], max_token=2)
    except TypeError:
        seen["typo"] = "TypeError"
    return seen


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
async def test_agent_code_sees_the_same_with_openai_and_stallproof(fault_server: Any) -> None:
    base = fault_server.url()
    urls = {
        "429": fault_server.url("status", code=429),
        "404": base.rsplit("/v1", 1)[0] + "/nothing/v1",
        "stall": fault_server.url("stall_headers", hold=5),
        "refused": f"http://127.0.0.1:{_closed_port()}/v1",
    }
    sdk = openai.AsyncOpenAI(base_url=base, api_key=KEY, max_retries=0)
    ours = stallproof.Client(base_url=base, api_key=KEY, max_retries=0)
    try:
        expected = await agent_run(sdk, urls)
        got = await agent_run(ours, urls)
        assert_pool_clean(ours)
    finally:
        await sdk.close()
        await ours.close()
    assert set(expected) == set(got)
    for step, value in expected.items():
        assert got[step] == value, step
    assert got["stream"][0] == {"ChatCompletionChunk"}


async def test_results_are_openai_types_and_fit_pydantic_fields(
    fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url())
    resp = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}]
    )
    assert type(resp) is ChatCompletion
    assert Transcript(completion=resp).completion is resp
    assert Transcript.model_validate_json(Transcript(completion=resp).model_dump_json())
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    async with stream:
        chunks = [chunk async for chunk in stream]
    assert chunks and all(type(c) is ChatCompletionChunk for c in chunks)
