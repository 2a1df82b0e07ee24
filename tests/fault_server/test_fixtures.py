"""Fixtures: canned replies, tool calls and faults for the requests that match, loaded from
a file or the control API, to script a whole conversation through a real SDK."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pydantic
import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

import fault_server
from fault_server import FaultScope, FaultSpecError, ServerThread

pytestmark = pytest.mark.usefixtures("no_server_errors")

CONVERSATION = Path(__file__).parent / "data" / "weather_conversation.json"
JSON = {"Content-Type": "application/json"}


class GetWeather(pydantic.BaseModel):
    """The weather now in a city."""

    city: str
    unit: str


def test_a_fixture_file_drives_a_three_turn_tool_conversation() -> None:
    tools = [openai.pydantic_function_tool(GetWeather, name="get_weather")]
    with fault_server.running(port=0, max_hold=5.0, fixtures=CONVERSATION) as srv:
        client = openai.OpenAI(base_url=srv.url(), api_key="x", max_retries=1)
        messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
        # Turn 1: the model calls the tool, with arguments the pydantic tool parses strictly.
        first = client.chat.completions.parse(model="gpt-4o", messages=messages, tools=tools)
        message = first.choices[0].message
        (call,) = message.tool_calls or []
        assert first.choices[0].finish_reason == "tool_calls"
        assert call.function.parsed_arguments == GetWeather(city="Paris", unit="c")
        messages.append(message.model_dump(exclude_none=True, exclude={"parsed"}))
        result = {"temperature": 21, "sky": "sunny"}
        messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
        # Turn 2: the tool's result gets the model's answer, streamed.
        with client.chat.completions.stream(
            model="gpt-4o", messages=messages, tools=tools
        ) as stream:
            second = stream.get_final_completion()
        assert second.choices[0].message.content == "It is 21 degrees and sunny in Paris."
        messages.append({"role": "assistant", "content": second.choices[0].message.content})
        # Turn 3: the server is overloaded once (a 503 the SDK retries), then answers.
        messages.append({"role": "user", "content": "Do I need an umbrella?"})
        third = client.chat.completions.create(model="gpt-4o", messages=messages)
        assert third.choices[0].message.content == "No umbrella needed: no rain is forecast."
        client.close()
        used = {f.id: f.used for f in srv.fixtures()}
        assert used == {
            "ask-weather": 1,
            "weather-result": 1,
            "umbrella-overloaded-once": 1,
            "umbrella": 1,
        }
        statuses = [r.status for c in srv.journal() for r in c.requests]
        assert statuses == [200, 200, 503, 200]
        assert [r.source for c in srv.journal() for r in c.requests][2] == "fixture"


def test_fixtures_answer_every_api(own: ServerThread) -> None:
    own.fixture(contains="hello", reply="Canned hello.")
    own.fixture(tools=["lookup"], tool_call={"name": "lookup", "arguments": {"q": "x"}})
    anthropic_body = {
        "model": "c",
        "max_tokens": 50,
        "messages": [{"role": "user", "content": "hello"}],
    }
    message = httpx.post(own.url() + "/messages", json=anthropic_body).json()
    assert message["content"] == [{"type": "text", "text": "Canned hello."}]
    response = httpx.post(own.url() + "/responses", json={"model": "m", "input": "hello"}).json()
    assert response["output"][0]["content"][0]["text"] == "Canned hello."
    tool = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
    body = {"model": "m", "input": "anything", "tools": [tool]}
    called = httpx.post(own.url() + "/responses", json=body).json()["output"][0]
    assert (called["name"], json.loads(called["arguments"])) == ("lookup", {"q": "x"})
    chat = {"model": "m", "messages": [{"role": "user", "content": "no match"}]}
    plain = httpx.post(own.url() + "/chat/completions", json=chat).json()
    assert plain["choices"][0]["message"]["content"].startswith("echo: no match")


def test_fixtures_over_the_control_api(own: ServerThread) -> None:
    url = own.base_url + "/_fault/fixtures"
    fixtures = [{"match": {"headers": {"X-Agent": "a1"}}, "reply": "for a1", "times": 1}]
    put = httpx.put(url, json={"fixtures": fixtures}, headers=JSON)
    assert put.status_code == 200, put.text
    (listed,) = put.json()["fixtures"]
    assert listed["id"] == "put-1"
    assert listed["match"] == {"headers": {"x-agent": "a1"}}
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    answered = httpx.post(own.url() + "/chat/completions", json=chat, headers={"X-Agent": "a1"})
    assert answered.json()["choices"][0]["message"]["content"] == "for a1"
    again = httpx.post(own.url() + "/chat/completions", json=chat, headers={"X-Agent": "a1"})
    assert again.json()["choices"][0]["message"]["content"].startswith("echo:")  # used up.
    assert httpx.get(url).json()["fixtures"][0]["remaining"] == 0
    assert httpx.delete(url, headers=JSON).json() == {"cleared": 1}


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        ({"fixtures": [{"reply": 5}]}, "'reply' must be a string"),
        ({"fixtures": [{"match": {"regex": "("}, "reply": "x"}]}, "does not compile"),
        ({"fixtures": [{"match": {"regex": "(a+)+$"}, "reply": "x"}]}, "exponential"),
        ({"fixtures": [{"match": {"nope": 1}, "reply": "x"}]}, "unknown match field"),
        ({"fixtures": [{"reply": "x", "tool_call": {"name": "f"}}]}, "not both"),
        ({"fixtures": [{"match": {}}]}, "needs a 'reply'"),
        ({"fixtures": [{"fault": "slow_accept", "reply": "x"}]}, "acts on a connection"),
        ({"fixtures": [{"tool_call": {"name": "f", "arguments": []}}]}, "must be an object"),
        ({"fixtures": "x"}, 'must be {"fixtures"'),
        (None, 'the body must be {"fixtures"'),
    ],
)
def test_a_bad_fixture_is_a_clear_400_and_changes_nothing(
    own: ServerThread, payload: object, says: str
) -> None:
    own.fixture(contains="kept", reply="kept")
    content = b"" if payload is None else json.dumps(payload).encode()
    answer = httpx.put(own.base_url + "/_fault/fixtures", content=content, headers=JSON)
    assert answer.status_code == 400
    assert says in answer.json()["error"]["message"]
    assert [f.reply for f in own.fixtures()] == ["kept"]


def test_a_bad_fixtures_file_refuses_to_start(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"fixtures": [{"reply": "x", "times": 0}]}')
    with pytest.raises(FaultSpecError, match="fixture 0: 'times' must be a positive integer"):
        fault_server.FaultServer(fixtures=bad)
    with pytest.raises(FaultSpecError, match="cannot read the fixtures file"):
        fault_server.FaultServer(fixtures=tmp_path / "missing.json")
    bad.write_text("{not json")
    with pytest.raises(FaultSpecError, match="not valid JSON"):
        fault_server.FaultServer(fixtures=bad)
    yaml = tmp_path / "fixtures.yaml"
    yaml.write_text("fixtures:\n  - reply: hi\n")
    with pytest.raises(FaultSpecError, match="fixtures files are JSON"):
        fault_server.FaultServer(fixtures=yaml)
    huge = tmp_path / "huge.json"
    huge.write_bytes(b" " * (8 * 1024 * 1024 + 1))
    with pytest.raises(FaultSpecError, match="larger than"):
        fault_server.FaultServer(fixtures=huge)


def test_a_scopes_fixtures_answer_only_its_key_and_go_with_it(
    fault_server: ServerThread, fault_scope: FaultScope
) -> None:
    fault_scope.fixture(contains="hi", reply="for this test only")
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    mine = httpx.post(fault_scope.url() + "/chat/completions", json=chat).json()
    other = httpx.post(fault_server.url() + "/chat/completions", json=chat).json()
    assert mine["choices"][0]["message"]["content"] == "for this test only"
    assert other["choices"][0]["message"]["content"].startswith("echo: hi")
    (loaded,) = fault_scope.fixtures()
    assert loaded.match.key == fault_scope.key and loaded.used == 1
    with pytest.raises(FaultSpecError, match="sets 'key' itself"):
        fault_scope.fixture(key="other", reply="x")
    fault_scope.forget()
    assert fault_scope.fixtures() == ()


class Lookup(pydantic.BaseModel):
    """Look a word up."""

    word: str


def test_parallel_tool_calls_through_every_sdk(own: ServerThread) -> None:
    calls = [
        {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}},
        {"name": "lookup", "arguments": {"word": "umbrella"}},
    ]
    own.fixture(contains="two things", tool_calls=calls)
    said: Any = [{"role": "user", "content": "two things, please"}]
    tools = [
        openai.pydantic_function_tool(GetWeather, name="get_weather"),
        openai.pydantic_function_tool(Lookup, name="lookup"),
    ]
    expected = [GetWeather(city="Paris", unit="c"), Lookup(word="umbrella")]
    with openai.OpenAI(base_url=own.url(), api_key="x", max_retries=0) as client:
        parsed = client.chat.completions.parse(model="m", messages=said, tools=tools)
        with client.chat.completions.stream(model="m", messages=said, tools=tools) as stream:
            streamed = stream.get_final_completion()
        for completion in (parsed, streamed):
            made = completion.choices[0].message.tool_calls or []
            assert [c.function.parsed_arguments for c in made] == expected
            assert len({c.id for c in made}) == 2
        response = client.responses.parse(model="m", input="two things", tools=tools)
        with client.responses.stream(model="m", input="two things", tools=tools) as events:
            final = events.get_final_response()
        for answer in (response, final):
            assert [item.parsed_arguments for item in answer.output] == expected  # type: ignore[union-attr]
    with anthropic.Anthropic(base_url=own.base_url, api_key="x", max_retries=0) as claude:
        message = claude.messages.create(model="c", max_tokens=50, messages=said)
        with claude.messages.stream(model="c", max_tokens=50, messages=said) as stream:
            final_message = stream.get_final_message()
    for reply in (message, final_message):
        assert [(b.type, b.name, b.input) for b in reply.content] == [  # type: ignore[union-attr]
            ("tool_use", c["name"], c["arguments"]) for c in calls
        ]
        assert reply.stop_reason == "tool_use"
    # Every streamed Responses event validates strictly, numbered on across the calls.
    body = {"model": "m", "input": "two things", "stream": True}
    raw = httpx.post(own.url() + "/responses", json=body).text
    sent = [
        json.loads(line[len("data: ") :]) for line in raw.splitlines() if line.startswith("data: ")
    ]
    adapter = TypeAdapter(ResponseStreamEvent)
    assert [adapter.validate_python(e).sequence_number for e in sent] == list(range(len(sent)))
