"""The client as openai users call it: healthy round trips, arguments, results, secrets."""

from __future__ import annotations

import json
import logging
from typing import Any

import openai
import pytest
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageParam,
)

import stallproof

from ..support.clients import MakeClient, spying_client

pytestmark = pytest.mark.anyio

MSGS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]
KEY = "sk-test-SECRET-0123456789"
TOOLS: list[ChatCompletionFunctionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "save_file",
            "description": "Save a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


async def test_non_stream_round_trip(fault_server: Any, make_client: MakeClient) -> None:
    client = make_client(fault_server.url())
    resp = await client.chat.completions.create(model="m-1", messages=MSGS, temperature=0.2)
    assert type(resp) is ChatCompletion
    assert resp.id and resp.model == "m-1"
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason == "stop"
    assert resp.usage is not None
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    assert resp.model_dump(exclude_none=True)["id"] == resp.id


async def test_stream_round_trip_with_usage(fault_server: Any, make_client: MakeClient) -> None:
    client = make_client(fault_server.url())
    stream = await client.chat.completions.create(
        model="m", messages=MSGS, stream=True, stream_options={"include_usage": True}
    )
    assert isinstance(stream, stallproof.AsyncStream)
    text, finish, usage = "", None, None
    async for chunk in stream:
        assert type(chunk) is ChatCompletionChunk
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
        usage = chunk.usage or usage
    assert text and finish == "stop"
    assert usage is not None and usage.total_tokens > 0
    assert stream.server_request_id


async def test_tool_calls_non_stream_and_stream(fault_server: Any, make_client: MakeClient) -> None:
    client = make_client(fault_server.url())
    resp = await client.chat.completions.create(
        model="m", messages=MSGS, tools=TOOLS, tool_choice="auto"
    )
    assert resp.choices[0].message.tool_calls
    call = resp.choices[0].message.tool_calls[0]
    assert call.type == "function"
    assert call.function.name == "save_file"
    json.loads(call.function.arguments)
    assert resp.choices[0].finish_reason == "tool_calls"

    stream = await client.chat.completions.create(
        model="m", messages=MSGS, tools=TOOLS, stream=True
    )
    name, args = "", ""
    async for chunk in stream:
        for c in chunk.choices:
            for tc in c.delta.tool_calls or ():
                assert tc.function is not None
                name += tc.function.name or ""
                args += tc.function.arguments or ""
    assert name == "save_file"
    json.loads(args)


async def test_client_reads_openai_environment(
    fault_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", fault_server.url())
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    async with stallproof.Client() as client:
        assert str(client.base_url).startswith(fault_server.url())
        assert client.api_key == KEY
        resp = await client.chat.completions.create(model="m", messages=MSGS)
        assert resp.choices


async def test_arguments_and_extra_body_reach_the_wire(
    fault_server: Any, make_client: MakeClient
) -> None:
    # The fault server echoes nothing of the body, so look at what goes on the wire.
    client, sent = spying_client(make_client, fault_server.url())
    # NOT_GIVEN / omit for temperature and top_p: accepted at run time only (docs/migrating.md).
    await client.chat.completions.create(  # type: ignore[call-overload]
        model="m",
        messages=MSGS,
        max_tokens=16,
        stop=["\n"],
        temperature=openai.NOT_GIVEN,  # what frameworks pass by default: left out
        top_p=openai.omit,
        stream=openai.NOT_GIVEN,
        timeout=openai.NOT_GIVEN,
        response_format={"type": "json_object"},
        extra_body={"top_k": 5, "chat_template_kwargs": {"enable_thinking": False}},
    )
    body = json.loads(sent.bodies[0])
    assert body["max_tokens"] == 16 and body["top_k"] == 5 and body["stop"] == ["\n"]
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert "stream" not in body and "temperature" not in body and "top_p" not in body


async def test_a_typo_is_a_type_error_as_in_openai(
    fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url())
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_token'"):
        await client.chat.completions.create(model="m", messages=MSGS, max_token=2)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="missing required keyword argument: 'model'"):
        await client.chat.completions.create(messages=MSGS)  # type: ignore[call-overload]
    oa = openai.AsyncOpenAI(base_url=fault_server.url(), api_key="k")
    try:
        with pytest.raises(TypeError):  # what openai does with the same typo
            await oa.chat.completions.create(model="m", messages=MSGS, max_token=2)  # type: ignore[call-overload]
    finally:
        await oa.close()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model": "", "messages": MSGS}, "model"),
        ({"model": 3, "messages": MSGS}, "model"),
        ({"model": "m", "messages": []}, "empty"),
        ({"model": "m", "messages": "hi"}, "list"),
        ({"model": "m", "messages": [{"content": "x"}]}, "role"),
        ({"model": "m", "messages": ["x"]}, "mapping"),
        ({"model": "m", "messages": MSGS, "stream": "yes"}, "stream"),
        ({"model": "m", "messages": MSGS, "timeout": -1}, "timeout"),
        ({"model": "m", "messages": MSGS, "timeout": float("inf")}, "finite"),
        ({"model": "m", "messages": MSGS, "timeout": "5"}, "seconds"),
        ({"model": "m", "messages": MSGS, "extra_body": {"x": object()}}, "JSON"),
        ({"model": "m", "messages": MSGS, "temperature": float("nan")}, "JSON"),
        ({"model": "m", "messages": MSGS, "agent": 7}, "agent"),
        ({"model": "m", "messages": MSGS, "labels": {"k": 1}}, "labels"),
        ({"model": "m", "messages": MSGS, "retry": 3}, "retry"),
    ],
)
async def test_bad_input_is_a_clear_typed_error(
    kwargs: dict[str, Any], match: str, fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url())
    with pytest.raises(stallproof.InvalidRequestError, match=match):
        await client.chat.completions.create(**kwargs)


@pytest.mark.parametrize("base_url", ["not a url", "ftp://127.0.0.1/v1", "/v1", "http://"])
def test_bad_base_url_is_rejected(base_url: str) -> None:
    with pytest.raises(stallproof.InvalidRequestError, match="base_url"):
        stallproof.Client(base_url=base_url)


async def test_api_key_never_appears_in_repr_errors_or_logs(
    fault_server: Any, make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    client = make_client(fault_server.url("status", code=401), api_key=KEY)
    assert KEY not in repr(client)
    with pytest.raises(stallproof.AuthenticationError) as info:
        await client.chat.completions.create(model="m", messages=MSGS)
    err = info.value
    texts = [str(err), repr(err), repr(err.args), repr(err.headers), caplog.text]
    slow = make_client(fault_server.url("half_open", hold=10), api_key=KEY)
    with pytest.raises(stallproof.TotalTimeout) as info2:
        await slow.chat.completions.create(model="m", messages=MSGS, timeout=0.3)
    texts += [str(info2.value), repr(info2.value), caplog.text]
    for text in texts:
        assert KEY not in text
        assert "SECRET" not in text


async def test_openai_not_given_sentinels_are_dropped(
    fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url())
    # openai's params type takes no NotGiven (docs/migrating.md): accepted at run time only.
    resp = await client.chat.completions.create(  # type: ignore[call-overload]
        model="m", messages=MSGS, temperature=openai.NOT_GIVEN
    )
    assert resp.choices


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the SDK is not ours to test on trio
async def test_openai_sdk_and_stallproof_read_the_same_answer(fault_server: Any) -> None:
    async with openai.AsyncOpenAI(base_url=fault_server.url(), api_key="x", max_retries=0) as oa:
        theirs = await oa.chat.completions.create(model="m", messages=MSGS)
        their_stream = await oa.chat.completions.create(
            model="m",
            messages=MSGS,
            stream=True,
        )
        their_text = "".join(
            [c.choices[0].delta.content or "" async for c in their_stream if c.choices]
        )
    async with stallproof.Client(base_url=fault_server.url(), api_key="x") as sp:
        ours = await sp.chat.completions.create(model="m", messages=MSGS)
        our_stream = await sp.chat.completions.create(model="m", messages=MSGS, stream=True)
        our_text = "".join(
            [c.choices[0].delta.content or "" async for c in our_stream if c.choices]
        )
    assert ours.choices[0].message.content == theirs.choices[0].message.content
    assert ours.usage is not None and theirs.usage is not None
    assert ours.usage.total_tokens == theirs.usage.total_tokens
    assert our_text == their_text and our_text
