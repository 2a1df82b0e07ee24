"""Structured outputs: a request with a JSON ``response_format`` (chat) or ``text.format``
(Responses) is answered with JSON content that fits its schema, so the SDKs' ``parse()``
helpers (and the frameworks built on them) work against the fault server; a hostile schema
costs a bounded answer."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx2
import openai
import pydantic
import pytest
from openai.types.chat import ChatCompletionMessageParam

from fault_server import ServerThread
from fault_server._structured import MAX_NODES, MAX_TEXT, json_answer, tool_arguments

pytestmark = [
    pytest.mark.usefixtures("no_server_errors"),
    # On trio, the SDK's own nested body and SSE generators of its stream helper are
    # finalised by the GC after the stream ends (the SDK does not close them with aclosing).
    pytest.mark.filterwarnings("ignore:Async generator 'openai\\.:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:Async generator 'httpx2\\.:ResourceWarning"),
]

SAID: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]


class Inner(pydantic.BaseModel):
    count: int
    ratio: float
    ok: bool


class Answer(pydantic.BaseModel):
    answer: str
    mood: str | None
    kind: str = pydantic.Field(json_schema_extra={"enum": ["a", "b"]})
    inner: Inner
    items: list[Inner]


class Node(pydantic.BaseModel):
    name: str
    parent: Node | None


@pytest.mark.anyio
async def test_the_sdks_parse_helpers_get_an_instance_of_their_schema(srv: ServerThread) -> None:
    async with openai.AsyncOpenAI(base_url=srv.url(), api_key="x", max_retries=0) as client:
        chat = await client.chat.completions.parse(model="m", messages=SAID, response_format=Answer)
        async with client.chat.completions.stream(
            model="m", messages=SAID, response_format=Answer
        ) as events:
            streamed = await events.get_final_completion()
        responses = await client.responses.parse(model="m", input="hello there", text_format=Answer)
        recursive = await client.chat.completions.parse(
            model="m", messages=SAID, response_format=Node
        )
    for parsed in (chat.choices[0].message.parsed, streamed.choices[0].message.parsed):
        assert parsed == Answer(
            answer="echo: hello there",
            mood="echo: hello there",
            kind="a",
            inner=Inner(count=0, ratio=0, ok=False),
            items=[],
        )
    assert responses.output_parsed == chat.choices[0].message.parsed
    node = recursive.choices[0].message.parsed
    assert node is not None and node.name == "echo: hello there"


@pytest.mark.anyio
async def test_json_object_and_a_cut_off_answer(srv: ServerThread) -> None:
    async with openai.AsyncOpenAI(base_url=srv.url(), api_key="x", max_retries=0) as client:
        plain = await client.chat.completions.create(
            model="m", messages=SAID, response_format={"type": "json_object"}
        )
        assert json.loads(plain.choices[0].message.content or "") == {"text": "echo: hello there"}
        # Cut by max_tokens, the document is cut too: openai raises as it would for a model.
        with pytest.raises(openai.LengthFinishReasonError):
            await client.chat.completions.parse(
                model="m", messages=SAID, response_format=Answer, max_tokens=2
            )


def _content(srv: ServerThread, response_format: Any) -> str:
    body = {"model": "m", "messages": SAID, "response_format": response_format}
    answer = httpx2.post(srv.url() + "/chat/completions", json=body, timeout=10)
    assert answer.status_code == 200, answer.text
    content = answer.json()["choices"][0]["message"]["content"]
    assert isinstance(content, str)
    return content


def _self_referring(breadth: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"$ref": "#"} for i in range(breadth)}}


@pytest.mark.parametrize(
    "response_format",
    [
        "json_schema",
        {"type": "json_schema", "json_schema": 5},
        {"type": "json_schema", "json_schema": {"schema": {"$ref": "https://example.com/x"}}},
        {"type": "json_schema", "json_schema": {"schema": {"$ref": "#/$defs/missing"}}},
        {"type": "json_schema", "json_schema": {"schema": {"type": ["null"]}}},
        {"type": "json_schema", "json_schema": {"schema": _self_referring(10)}},
    ],
    ids=["not-an-object", "schema-not-an-object", "remote-ref", "missing-ref", "null", "bomb"],
)
def test_a_hostile_or_broken_format_gets_a_bounded_answer(
    srv: ServerThread, response_format: Any
) -> None:
    content = _content(srv, response_format)
    if isinstance(response_format, dict):
        json.loads(content)  # JSON, whatever the schema
    else:
        assert content.startswith("echo:")  # not a JSON request: the plain answer
    assert len(content) < 64 * MAX_NODES


def test_the_work_per_answer_is_bounded_by_nodes() -> None:
    nodes = 0

    def count(value: Any) -> None:
        nonlocal nodes
        nodes += 1
        for child in value.values() if isinstance(value, dict) else ():
            count(child)

    spec = {"type": "json_schema", "schema": _self_referring(10)}
    count(json.loads(json_answer(spec, "x") or "null"))
    assert nodes <= MAX_NODES
    assert json_answer({"type": "text"}, "x") is None
    assert json_answer(None, "x") is None


def test_a_long_message_in_many_strings_stays_small(srv: ServerThread) -> None:
    """1,000 string properties and a 100 KB message: not 100 MB of answer."""
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(1000)}}
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x" * 100_000}],
        "response_format": {"type": "json_schema", "json_schema": {"schema": wide}},
    }
    answer = httpx2.post(srv.url() + "/chat/completions", json=body, timeout=10)
    assert answer.status_code == 200
    assert len(answer.content) < 2 * MAX_NODES * (MAX_TEXT + 16)


# -- tool calls whose arguments fit each tool's schema -------------------------------------


class Weather(pydantic.BaseModel):
    """Look up the weather."""

    model_config = pydantic.ConfigDict(extra="forbid", strict=True)
    city: str
    days: int
    metric: bool
    unit: str = pydantic.Field(json_schema_extra={"enum": ["c", "f"]})
    inner: Inner
    tags: list[str]


class Search(pydantic.BaseModel):
    """Search the web."""

    query: str


WEATHER = Weather(
    city="echo: hello there lorem ipsum dolor sit amet",  # 8 words: the default tokens.
    days=0,
    metric=False,
    unit="c",
    inner=Inner(count=0, ratio=0, ok=False),
    tags=[],
)


@pytest.mark.anyio
async def test_openai_parse_and_stream_with_pydantic_tools(srv: ServerThread) -> None:
    tools = [openai.pydantic_function_tool(Weather), openai.pydantic_function_tool(Search)]
    async with openai.AsyncOpenAI(base_url=srv.url(), api_key="x", max_retries=0) as client:
        parsed = await client.chat.completions.parse(model="m", messages=SAID, tools=tools)
        async with client.chat.completions.stream(model="m", messages=SAID, tools=tools) as events:
            streamed = await events.get_final_completion()
        forced = await client.chat.completions.parse(
            model="m",
            messages=SAID,
            tools=tools,
            tool_choice={"type": "function", "function": {"name": "Search"}},
        )
    for completion in (parsed, streamed):
        (call,) = completion.choices[0].message.tool_calls or []
        assert call.function.name == "Weather"
        assert call.function.parsed_arguments == WEATHER
        Weather.model_validate_json(call.function.arguments, strict=True)
    (call,) = forced.choices[0].message.tool_calls or []
    assert call.function.parsed_arguments == Search(query=WEATHER.city)


@pytest.mark.anyio
async def test_openai_responses_parse_and_stream_with_pydantic_tools(srv: ServerThread) -> None:
    tools = [openai.pydantic_function_tool(Weather)]
    async with openai.AsyncOpenAI(base_url=srv.url(), api_key="x", max_retries=0) as client:
        parsed = await client.responses.parse(model="m", input="hello there", tools=tools)
        async with client.responses.stream(model="m", input="hello there", tools=tools) as events:
            streamed = await events.get_final_response()
        async with client.responses.stream(
            model="m", input="hello there", text_format=Answer
        ) as formatted:
            structured = await formatted.get_final_response()
    assert structured.output_parsed is not None
    assert structured.output_parsed.inner == Inner(count=0, ratio=0, ok=False)
    for response in (parsed, streamed):
        (item,) = response.output
        assert item.type == "function_call"
        assert item.parsed_arguments == WEATHER
        Weather.model_validate_json(item.arguments, strict=True)


@pytest.mark.anyio
async def test_anthropic_tool_use_and_parse_fit_their_schemas(srv: ServerThread) -> None:
    tool: anthropic.types.ToolParam = {
        "name": "weather",
        "input_schema": Weather.model_json_schema(),
    }
    said: Any = SAID
    async with anthropic.AsyncAnthropic(
        base_url=srv.url().removesuffix("/v1"), api_key="x", max_retries=0
    ) as client:
        created = await client.messages.create(
            model="c", max_tokens=64, messages=said, tools=[tool]
        )
        async with client.messages.stream(
            model="c", max_tokens=64, messages=said, tools=[tool]
        ) as events:
            streamed = await events.get_final_message()
        parsed = await client.messages.parse(
            model="c", max_tokens=64, messages=said, output_format=Answer
        )
        async with client.messages.stream(
            model="c", max_tokens=64, messages=said, output_format=Answer
        ) as structured:
            streamed_parsed = await structured.get_final_message()
    for message in (created, streamed):
        block = message.content[0]
        assert block.type == "tool_use"
        assert Weather.model_validate(block.input, strict=True) == WEATHER
    assert streamed_parsed.parsed_output == parsed.parsed_output
    assert parsed.parsed_output == Answer(
        answer="echo: hello there",
        mood="echo: hello there",
        kind="a",
        inner=Inner(count=0, ratio=0, ok=False),
        items=[],
    )


def test_tool_arguments_fit_the_schema_or_fall_back_to_text() -> None:
    assert json.loads(tool_arguments(Weather.model_json_schema(), "x"))["city"] == "x"
    assert json.loads(tool_arguments({"type": "object"}, "x")) == {"text": "x"}
    assert json.loads(tool_arguments(None, "x")) == {"text": "x"}
    assert json.loads(tool_arguments({"properties": 5}, "x")) == {"text": "x"}
