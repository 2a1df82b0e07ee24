"""Every failure through the SDK faces is typed, whatever the body holds.

The SDKs parse bodies and events with their own code; before, a body that was not JSON
or not UTF-8 reached the caller as a raw ``JSONDecodeError`` / ``UnicodeDecodeError`` /
``RecursionError``, and a body with parts missing came back as a result of Nones. Here
each malformed answer is put on a real socket (RawServer) and the face must raise ours
or the SDK's own class, hold no connection afterwards, and quote no secret.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

import stallproof
import stallproof.anthropic
import stallproof.openai

from ..support.clients import KEY, chain, sdk_pool_held
from ..support.rawserver import RawServer, response

pytestmark = pytest.mark.anyio

TYPED = (stallproof.StallproofError, openai.APIError, anthropic.APIError)
J = {"content-type": "application/json"}
SSE = {"content-type": "text/event-stream"}
CHUNK = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}

# 200 answers to a non-stream call, each malformed in its own way.
BODIES: dict[str, tuple[bytes, dict[str, str]]] = {
    "not_json": (b"{not json", J),
    "not_utf8": (b'{"a": "\xff\xfe"}', J),
    "only_latin1": (b"\xff", J),
    "empty_with_json_type": (b" ", J),
    "truncated": (b'{"id": "x", "choices": [', J),
    "too_deep": (b"[" * 5000 + b"]" * 5000, J),
    "huge_integer": (b'{"id": 1' + b"0" * 5000 + b"}", J),
    "empty_object": (b"{}", J),
    "a_list": (b"[]", J),
    "null": (b"null", J),
    "a_number": (b"3", J),
    "choices_null": (b'{"id": "x", "choices": null}', J),
    "choice_empty": (b'{"id": "x", "choices": [{}]}', J),
    "choices_a_string": (b'{"choices": "x"}', J),
    "message_null": (
        b'{"id":"x","object":"chat.completion","created":0,"model":"m",'
        b'"choices":[{"index":0,"message":null,"finish_reason":"stop"}]}',
        J,
    ),
    "content_null": (b'{"id":"x","type":"message","content":null,"usage":null}', J),
    "html": (b"<html>login</html>", {"content-type": "text/html"}),
    "html_labelled_json": (b"<html>login</html>", J),
    "events_for_plain": (b'data: {"a": 1}\n\n', SSE),
}


def _event(data: bytes, name: bytes | None = None) -> bytes:
    head = b"event: " + name + b"\n" if name is not None else b""
    return head + b"data: " + data + b"\n\n"


# 200 streams whose first event is malformed; openai's events are unnamed, anthropic's
# named (it skips unnamed ones).
STREAMS: dict[str, tuple[bytes, bytes]] = {
    "not_json": (_event(b"{not json"), _event(b"{not json", b"message_start")),
    "not_utf8": (
        _event(b'{"choices":[{"index":0,"delta":{"content":"\xff"}}]}'),
        _event(b'{"type":"message_start","message":"\xff"}', b"message_start"),
    ),
    "null": (_event(b"null"), _event(b"null", b"message_start")),
    "a_list": (_event(b"[]"), _event(b"[]", b"content_block_delta")),
    "a_string": (_event(b'"x"'), _event(b'"x"', b"message_delta")),
    "parts_null": (
        _event(json.dumps({**CHUNK, "choices": None}).encode()),
        _event(b'{"type":"message_start","message":null}', b"message_start"),
    ),
    "delta_null": (
        _event(json.dumps({**CHUNK, "choices": [{"index": 0, "delta": None}]}).encode()),
        _event(b'{"type":"content_block_delta","index":0,"delta":null}', b"content_block_delta"),
    ),
    "too_deep": (
        _event(b"[" * 300 + b"]" * 300),
        _event(b"[" * 300 + b"]" * 300, b"message_start"),
    ),
}


def _assert_typed_and_quiet(error: BaseException) -> None:
    assert isinstance(error, TYPED), repr(error)
    for e in chain(error):
        assert KEY not in repr(e) and KEY not in str(e)
        assert not isinstance(e, (json.JSONDecodeError, UnicodeDecodeError, RecursionError))


def _face(face: str, srv: RawServer) -> Any:
    base = f"http://127.0.0.1:{srv.port}"
    if face == "openai":
        return stallproof.openai.AsyncOpenAI(api_key=KEY, base_url=f"{base}/v1", timeout=5)
    return stallproof.anthropic.AsyncAnthropic(api_key=KEY, base_url=base, timeout=5)


async def _call(client: Any, *, stream: bool) -> None:
    msgs: Any = [{"role": "user", "content": "hi"}]
    r: Any
    if isinstance(client, anthropic.AsyncAnthropic):
        r = await client.messages.create(model="m", max_tokens=5, messages=msgs, stream=stream)
    else:
        r = await client.chat.completions.create(model="m", messages=msgs, stream=stream)
    if stream:
        async for _ in r:
            pass


async def _expect_typed(face: str, answer: bytes, *, stream: bool) -> None:
    """One call through ``face`` to a server that sends ``answer``: a typed error, quiet
    about the key, and no connection held after it."""
    with RawServer(lambda request: answer) as srv:
        client = _face(face, srv)
        async with client:
            with pytest.raises(Exception) as e:  # noqa: PT011 - what it is, is the test
                await _call(client, stream=stream)
            _assert_typed_and_quiet(e.value)
            assert sdk_pool_held(client) == {"requests": 0, "active": 0}


@pytest.mark.parametrize("face", ["openai", "anthropic"])
@pytest.mark.parametrize("name", sorted(BODIES))
async def test_a_malformed_body_is_a_typed_error(face: str, name: str) -> None:
    body, headers = BODIES[name]
    await _expect_typed(face, response(200, body, headers), stream=False)


@pytest.mark.parametrize("face", ["openai", "anthropic"])
@pytest.mark.parametrize("name", sorted(STREAMS))
async def test_a_malformed_stream_event_is_a_typed_error(face: str, name: str) -> None:
    event = STREAMS[name][0 if face == "openai" else 1]
    await _expect_typed(face, response(200, event, SSE), stream=True)


def test_a_result_with_its_parts_missing_names_the_path() -> None:
    from stallproof._faces._typed import check_result

    chat = openai.types.chat.ChatCompletion.construct(
        id="x", choices=[openai.types.chat.chat_completion.Choice.construct(message=None)]
    )
    assert check_result(chat, openai.types.chat.ChatCompletion) == "choices[0].message"
    whole = openai.types.chat.ChatCompletion.construct(
        id="x",
        choices=[
            openai.types.chat.chat_completion.Choice.construct(
                index=0,
                finish_reason=None,  # a scalar left None: passed on, as the SDK does
                message=openai.types.chat.ChatCompletionMessage.construct(role="assistant"),
            )
        ],
    )
    assert check_result(whole, openai.types.chat.ChatCompletion) is None
    assert check_result(None, openai.types.chat.ChatCompletion) is not None


# (anthropic's SDK sends its headers' values as UTF-8 bytes; its face refuses them when it
# is built: tests/integrations/test_face_arguments.py.)
@pytest.mark.parametrize("where", ["api_key", "default_headers"])
@pytest.mark.parametrize("face", ["openai", "client"])
async def test_a_non_ascii_key_is_refused_by_name_without_the_key(face: str, where: str) -> None:
    secret = "sk-ключ-" + KEY
    settings: dict[str, Any] = (
        {"api_key": secret}
        if where == "api_key"
        else {"api_key": KEY, "default_headers": {"x-secret": secret}}
    )
    with RawServer(lambda request: response(500, b"")) as srv:
        base = f"http://127.0.0.1:{srv.port}"
        with pytest.raises(stallproof.InvalidRequestError) as e:
            if face == "openai":
                async with stallproof.openai.AsyncOpenAI(base_url=f"{base}/v1", **settings) as c:
                    await _call(c, stream=False)
            else:
                # stallproof's own client refuses the header when it is built.
                stallproof.Client(base_url=f"{base}/v1", **settings)
    assert "value not shown" in str(e.value)
    # The face refuses the argument by its name when it is built; the Client, the header.
    named = "x-secret" if where == "default_headers" else "api_key" if face == "openai" else ""
    assert (named or "authorization") in str(e.value)
    for error in chain(e.value):
        assert "ключ" not in repr(error) and KEY not in repr(error)
        assert not isinstance(error, UnicodeEncodeError)
    assert srv.requests == []
