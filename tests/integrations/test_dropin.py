"""`stallproof.Client` as a drop-in for ``openai.AsyncOpenAI``: its arguments, its error
classes and attributes, its message objects, and every extra surface bounded like chat."""

from __future__ import annotations

import json
from typing import Any

import httpx
import httpx2
import openai
import pytest
from openai.types.chat import ChatCompletionMessage

import stallproof

from ..support.clients import KEY, MakeClient, assert_pool_clean, spying_client
from ..support.timing import MARGIN, SentClock

pytestmark = pytest.mark.anyio

MSGS: list[Any] = [{"role": "user", "content": "hello there"}]


# -- errors ----------------------------------------------------------------------------


async def test_status_error_is_openais_with_its_attributes(
    fault_server: Any, make_client: MakeClient
) -> None:
    url = fault_server.url("status", code=429, retry_after=3)
    client = make_client(url)
    with pytest.raises(openai.RateLimitError) as info:
        await client.chat.completions.create(model="m", messages=MSGS)
    e = info.value
    assert isinstance(e, stallproof.RateLimitError) and isinstance(e, openai.APIStatusError)
    assert e.status_code == 429 and e.retry_after == 3.0
    assert isinstance(e.body, dict) and e.body["type"] == "rate_limit_error"  # the inner object
    assert e.code == "rate_limit_exceeded" and e.type == "rate_limit_error" and e.param is None
    assert isinstance(e.response, httpx2.Response) and e.response.status_code == 429
    assert e.response.headers["retry-after"] == "3"
    assert json.loads(e.response.content)["error"] == e.body
    assert isinstance(e.request, httpx2.Request)
    assert str(e.request.url).endswith("/chat/completions") and e.request.method == "POST"
    assert "authorization" not in e.request.headers  # never the key
    assert e.request_id is not None and e.request_id == e.response.headers["x-request-id"]
    assert e.stallproof_request_id is not None and e.stallproof_request_id.startswith("sp-")
    assert KEY not in str(e) and KEY not in repr(e)


async def test_a_bound_is_openais_timeout_not_a_builtin_one(
    fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url("stall_headers", hold=5))
    clock = SentClock(client)
    with pytest.raises(openai.APITimeoutError) as info:
        await client.chat.completions.create(model="m", messages=MSGS, timeout=0.5)
    assert clock.elapsed() <= 0.5 + MARGIN
    assert isinstance(info.value, stallproof.TotalTimeout)
    assert isinstance(info.value, openai.APIConnectionError)
    # Not asyncio's: `asyncio.wait_for` callers would take it for their own timer.
    assert not isinstance(info.value, TimeoutError)
    assert info.value.request.url.path.endswith("/chat/completions")


async def test_a_refused_connection_is_openais_connection_error(make_client: MakeClient) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = make_client(f"http://127.0.0.1:{port}/v1")
    with pytest.raises(openai.APIConnectionError) as info:
        await client.chat.completions.create(model="m", messages=MSGS)
    assert isinstance(info.value, stallproof.ConnectError)
    assert not isinstance(info.value, openai.APITimeoutError)


async def test_a_404_names_the_url_and_the_missing_v1(
    fault_server: Any, make_client: MakeClient
) -> None:
    root = fault_server.url().rsplit("/v1", 1)[0]
    client = make_client(root)  # the usual mistake: no /v1
    with pytest.raises(openai.NotFoundError) as info:
        await client.chat.completions.create(model="m", messages=MSGS)
    message = str(info.value)
    assert f"{root}/chat/completions was not found" in message
    assert "does not end in /v1" in message
    with_v1 = make_client(f"{root}/nothing/v1")
    with pytest.raises(openai.NotFoundError) as info:
        await with_v1.chat.completions.create(model="m", messages=MSGS, extra_query={"k": "v"})
    message = str(info.value)
    assert f"{root}/nothing/v1/chat/completions was not found" in message
    assert "does not end in /v1" not in message
    assert "k=v" not in message  # a query may carry a key: never in a message


# -- messages --------------------------------------------------------------------------


async def test_message_objects_are_sent_as_openai_sends_them(
    fault_server: Any, make_client: MakeClient
) -> None:
    client, sent = spying_client(make_client, fault_server.url())
    tools: Any = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    first = await client.chat.completions.create(model="m", messages=MSGS, tools=tools)
    message = first.choices[0].message
    assert message.tool_calls
    call = message.tool_calls[0]
    mine = ChatCompletionMessage(role="assistant", content="from openai's own type")
    messages: list[Any] = [
        *MSGS,
        message,  # the standard tool loop: the result's message object itself
        {"role": "tool", "tool_call_id": call.id, "content": "done"},
        {"role": "assistant", "content": None, "tool_calls": [call]},  # models nested in a dict
        {"role": "tool", "tool_call_id": call.id, "content": "done"},
        mine,
    ]
    await client.chat.completions.create(model="m", messages=messages)
    wire = json.loads(sent.bodies[1])["messages"]
    assert wire[1] == message.model_dump(mode="json", exclude_none=True)
    assert wire[1]["tool_calls"][0]["id"] == call.id and "refusal" not in wire[1]
    assert wire[3]["tool_calls"][0]["function"]["name"] == "f"
    assert wire[5] == {"role": "assistant", "content": "from openai's own type"}


async def test_a_message_that_is_neither_is_a_clear_error(
    fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url())
    with pytest.raises(stallproof.InvalidRequestError, match=r"messages\[1\] must be a mapping"):
        await client.chat.completions.create(model="m", messages=[*MSGS, object()])  # type: ignore[list-item]


# -- client arguments ------------------------------------------------------------------


async def test_openai_client_arguments(
    fault_server: Any, make_client: MakeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_ORG_ID", "org-env")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-env")
    client, sent = spying_client(
        make_client,
        fault_server.url(),
        retry=openai.NOT_GIVEN,
        max_retries=4,
        timeout=httpx.Timeout(7.0, connect=2.0),
        default_query={"api-version": "2024-10-21"},
    )
    assert client.retry.attempts == 5 and client.max_retries == 4
    assert client.timeout.connect == 2.0 and client.timeout.read == 7.0
    assert client.timeout.total == stallproof.Timeouts().total  # an httpx.Timeout has none
    assert client.organization == "org-env" and client.project == "proj-env"
    await client.chat.completions.create(model="m", messages=MSGS, extra_query={"x": "1"})
    assert sent.headers[0]["openai-organization"] == "org-env"
    assert sent.headers[0]["openai-project"] == "proj-env"
    copy = client.with_options(organization="org-2", max_retries=0, timeout=3)
    assert copy.retry.attempts == 1 and copy.timeout.total == 3.0 and copy.timeout.connect == 2.0
    assert copy._engine is client._engine  # one pool, one budget, as openai shares its client
    await copy.chat.completions.create(model="m", messages=MSGS)
    assert sent.headers[1]["openai-organization"] == "org-2"
    assert client.organization == "org-env"  # the original is unchanged


async def test_the_query_goes_on_every_request(fault_server: Any, make_client: MakeClient) -> None:
    client, sent = spying_client(
        make_client, fault_server.url(), default_query={"api-version": "v9"}
    )
    await client.chat.completions.create(model="m", messages=MSGS, extra_query={"x": "1"})
    await client.models.list()
    assert sent.urls[0].params == httpx.QueryParams({"api-version": "v9", "x": "1"})
    assert sent.urls[0].path.endswith("/v1/chat/completions")
    assert sent.urls[1].params == httpx.QueryParams({"api-version": "v9"})
    assert sent.urls[1].path.endswith("/v1/models")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"timeout": None}, "timeout=None would let a call run forever"),
        ({"max_retries": 2, "retry": None}, "pass retry= or max_retries=, not both"),
        ({"max_retries": -1}, "max_retries must be an int >= 0"),
        ({"organization": 3}, "organization must be a str"),
    ],
)
def test_bad_client_arguments_are_clear(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(stallproof.InvalidRequestError, match=match):
        stallproof.Client(base_url="http://127.0.0.1:9/v1", **kwargs)


def test_with_options_refuses_what_belongs_to_the_engine() -> None:
    client = stallproof.Client(base_url="http://127.0.0.1:9/v1")
    with pytest.raises(TypeError, match="limits"):
        client.with_options(limits=stallproof.Limits())


# -- every surface is bounded and releases its connection ------------------------------


async def test_models_and_embeddings_are_bounded(
    fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url("stall_headers", hold=5))
    clock = SentClock(client)
    with pytest.raises(stallproof.TotalTimeout):
        await client.models.list(timeout=0.3)
    assert clock.elapsed() <= 0.3 + MARGIN
    with pytest.raises(stallproof.TotalTimeout):
        await client.embeddings.create(model="e", input="x", timeout=0.3)
    assert clock.elapsed() <= 0.3 + MARGIN
    assert_pool_clean(client)


# Breaking out of openai's stream helper leaves *its* async generator to the GC (on trio).
@pytest.mark.filterwarnings("ignore:Async generator 'openai\\.:ResourceWarning")
async def test_the_stream_helper_is_bounded_and_released(
    fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url("sse_stall", after=2, hold=5))
    clock = SentClock(client)
    with pytest.raises(stallproof.IdleTimeout):
        async with client.chat.completions.stream(
            model="m", messages=MSGS, timeout=stallproof.Timeouts(idle=0.3, total=5)
        ) as events:
            async for _ in events:
                clock.saw()
    # idle from the last event the helper handed over (from the call's start, it counted
    # the connect and the events before: 0.2 s more was allowed for them).
    assert clock.in_bound("IdleTimeout") <= 0.3 + MARGIN
    assert_pool_clean(client)
    healthy = make_client(fault_server.url(tokens=50))
    async with healthy.chat.completions.stream(model="m", messages=MSGS) as events:
        async for event in events:
            if event.type == "content.delta":
                break  # leaving early releases the connection
    assert_pool_clean(healthy)


async def test_responses_raw_and_streaming_release_the_connection(
    fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url(tokens=50))
    raw = await client.chat.completions.with_raw_response.create(model="m", messages=MSGS)
    assert raw.status_code == 200 and raw.request_id == raw.headers["x-request-id"]
    assert raw.parse().choices[0].message.content
    for streaming in (False, True):
        async with client.chat.completions.with_streaming_response.create(
            model="m", messages=MSGS, stream=streaming
        ) as response:
            assert response.status_code == 200  # the body is left unread
    assert_pool_clean(client)
    stream = await client.chat.completions.create(model="m", messages=MSGS, stream=True)
    assert stream.response.status_code == 200
    await stream.response.aclose()  # what openai's helpers call: closes the stream
    assert_pool_clean(client)
    vectors = await client.embeddings.with_raw_response.create(model="e", input="hi")
    assert len(vectors.parse().data[0].embedding) == 16


def test_settings_never_show_secrets() -> None:
    client = stallproof.Client(
        base_url="http://127.0.0.1:9/v1",
        api_key=KEY,
        default_headers={"api-key": KEY},
        default_query={"key": KEY},
    )
    for text in (repr(client), repr(client._settings), repr(client.with_options(timeout=3))):
        assert KEY not in text


async def test_unknown_arguments_are_type_errors_everywhere(make_client: MakeClient) -> None:
    client = make_client("http://127.0.0.1:9/v1")
    with pytest.raises(TypeError, match="'max_token'"):
        await client.chat.completions.with_raw_response.create(
            model="m",
            messages=MSGS,
            max_token=2,  # type: ignore[call-arg]
        )
    with pytest.raises(TypeError, match="'page_size'"):
        client.models.list(page_size=2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="'dims'"):
        await client.embeddings.create(model="e", input="x", dims=3)  # type: ignore[call-arg]
