"""Pure units: configuration, SSE decoding, response models, Retry-After, exports."""

from __future__ import annotations

import dataclasses
import email.utils
from typing import Any

import httpx
import openai
import pytest
from openai.types import CreateEmbeddingResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk

import stallproof
from stallproof._results import to_result
from stallproof._sse import LineTooLong, SSEDecoder
from stallproof._status import parse_retry_after

# -- Timeouts / Limits -------------------------------------------------------------------


def test_timeouts_defaults_are_all_finite() -> None:
    t = stallproof.Timeouts()
    for field in dataclasses.fields(t):
        value = getattr(t, field.name)
        assert 0 < value < float("inf"), field.name


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"total": 0}, r"Timeouts.total must be > 0"),
        ({"read": -1}, r"Timeouts.read must be > 0"),
        ({"idle": float("nan")}, r"Timeouts.idle must be finite"),
        ({"connect": float("inf")}, r"Timeouts.connect must be finite"),
        ({"pool": None}, r"Timeouts.pool must be a number.*None"),
        ({"first_token": True}, r"Timeouts.first_token must be a number"),
        ({"write": "3"}, r"Timeouts.write must be a number.*'3'"),
    ],
)
def test_timeouts_validate_with_a_message_naming_the_field(
    kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(stallproof.InvalidRequestError, match=match):
        stallproof.Timeouts(**kwargs)


def test_timeouts_are_frozen_and_coerce_floats_into_total() -> None:
    t = stallproof.Timeouts(connect=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.connect = 2  # type: ignore[misc]
    assert stallproof.Timeouts.coerce(3, base=t) == t.replace(total=3.0)
    assert stallproof.Timeouts.coerce(t) is t
    assert isinstance(stallproof.Timeouts(total=2).total, float)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_response_bytes": 0},
        {"max_line_bytes": -5},
        {"max_connections": 1.5},
        {"max_connections": 2, "max_keepalive_connections": 3},
        {"keepalive_expiry": float("inf")},
    ],
)
def test_limits_validate(kwargs: dict[str, Any]) -> None:
    with pytest.raises(stallproof.InvalidRequestError, match="Limits"):
        stallproof.Limits(**kwargs)


# -- SSE -------------------------------------------------------------------------------


def _feed_all(decoder: SSEDecoder, *parts: bytes) -> list[stallproof._sse.ServerSentEvent]:
    return [event for part in parts for event in decoder.feed(part)]


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_sse_line_endings(newline: bytes) -> None:
    raw = b"data: a" + newline + b"data: b" + newline + newline + b": c" + newline + newline
    events = _feed_all(SSEDecoder(1000), raw)
    assert [e.data for e in events] == ["a\nb"]


def test_sse_split_anywhere_gives_the_same_events() -> None:
    raw = b': ka\r\n\r\nevent: error\r\ndata: {"x": 1}\r\n\r\ndata: [DONE]\r\n\r\n'
    whole = _feed_all(SSEDecoder(1000), raw)
    for cut in range(1, len(raw)):
        assert _feed_all(SSEDecoder(1000), raw[:cut], raw[cut:]) == whole
    assert [(e.event, e.data) for e in whole] == [("error", '{"x": 1}'), ("message", "[DONE]")]
    bytewise = _feed_all(SSEDecoder(1000), *[raw[i : i + 1] for i in range(len(raw))])
    assert bytewise == whole


def test_sse_comments_are_counted_not_returned() -> None:
    d = SSEDecoder(1000)
    assert _feed_all(d, b": keep-alive\n\n" * 5) == []
    assert d.comments == 5


def test_sse_line_cap_holds_without_a_newline() -> None:
    d = SSEDecoder(100)
    with pytest.raises(LineTooLong):
        for _ in range(10):
            list(d.feed(b"x" * 20))
    d = SSEDecoder(100)
    with pytest.raises(LineTooLong):
        _feed_all(d, b"data: " + b"y" * 200 + b"\n")
    d = SSEDecoder(100)
    with pytest.raises(LineTooLong):  # many short data lines never dispatched
        _feed_all(d, b"data: 0123456789\n" * 20)


# -- Models ----------------------------------------------------------------------------


def test_results_are_openai_types_and_keep_extras() -> None:
    chunk = to_result(
        ChatCompletionChunk,
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}}],
            "x_extra": 1,
        },
    )
    assert type(chunk) is ChatCompletionChunk
    assert chunk.choices[0].delta.content is None
    assert chunk.choices[0].delta.reasoning_content == "hmm"  # type: ignore[attr-defined]
    assert chunk.model_extra == {"x_extra": 1}
    assert chunk.model_dump(exclude_none=True)["x_extra"] == 1
    with pytest.raises(AttributeError):
        _ = chunk.nope  # type: ignore[attr-defined]


def test_results_tolerate_what_the_sdk_tolerates() -> None:
    # No created, no object, an index missing, a finish_reason outside openai's Literal.
    resp = to_result(
        ChatCompletion,
        {
            "id": "x",
            "model": "m",
            "choices": [
                {"message": {"role": "assistant", "content": "hi"}, "finish_reason": "eos"}
            ],
        },
    )
    assert isinstance(resp, ChatCompletion)
    assert resp.object == "chat.completion" and resp.created == 0
    assert resp.choices[0].message.content == "hi"
    assert resp.choices[0].finish_reason == "eos"  # type: ignore[comparison-overlap]


def test_only_fields_a_type_has_are_filled_in() -> None:
    page = to_result(CreateEmbeddingResponse, {"data": [], "model": "e"})  # no usage, no object
    assert page.object == "list" and page.model_extra == {}


OK_COMPLETION = {
    "id": "x",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    ],
}


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"choices": "x"}, "choices"),
        (
            {"choices": [{"index": 0, "message": {"role": "assistant", "content": 5}}]},
            "choices[0].message.content",
        ),
        (
            {"usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": "9"}},
            "usage.total_tokens",
        ),
        ({"created": "yesterday"}, "created"),
        (
            {
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "tool_calls",
                        "message": {
                            "role": "assistant",
                            "tool_calls": [
                                {
                                    "id": "t",
                                    "type": "function",
                                    "function": {"name": "f", "arguments": 7},
                                }
                            ],
                        },
                    }
                ]
            },
            "choices[0].message.tool_calls[0].function.arguments",
        ),
    ],
)
def test_malformed_fields_name_their_path(change: dict[str, Any], path: str) -> None:
    with pytest.raises(stallproof.MalformedResponse) as info:
        to_result(ChatCompletion, {**OK_COMPLETION, **change})
    assert info.value.path is not None and info.value.path.startswith(path)
    assert path in str(info.value)
    assert isinstance(info.value, openai.APIError)


def test_a_non_object_is_malformed() -> None:
    with pytest.raises(stallproof.MalformedResponse, match="expected a JSON object, got list"):
        to_result(ChatCompletion, [])


# -- Retry-After -------------------------------------------------------------------------


def test_retry_after_forms() -> None:
    h = httpx.Headers
    assert parse_retry_after(h({"retry-after": "3"})) == 3.0
    assert parse_retry_after(h({"retry-after-ms": "1500", "retry-after": "9"})) == 1.5
    assert parse_retry_after(h({"retry-after": "soon"})) is None
    assert parse_retry_after(h({"retry-after": "-4"})) == 0.0
    assert parse_retry_after(h({})) is None
    date = email.utils.formatdate(1_000_030, usegmt=True)
    assert parse_retry_after(h({"retry-after": date}), now=1_000_000) == pytest.approx(30)


# -- Public surface ----------------------------------------------------------------------


def test_exports_are_pinned_and_public() -> None:
    names = stallproof.__all__
    assert sorted(names, key=str.lower) == names
    for name in names:
        obj = getattr(stallproof, name)
        if isinstance(obj, type):
            assert obj.__module__ == "stallproof", name
    assert issubclass(stallproof.TotalTimeout, stallproof.TimeoutException)
    assert issubclass(stallproof.TimeoutException, stallproof.StallproofError)
    assert issubclass(stallproof.InvalidRequestError, ValueError)
    bounds = {
        cls.bound
        for cls in vars(stallproof).values()
        if isinstance(cls, type)
        and issubclass(cls, stallproof.TimeoutException)
        and cls is not stallproof.TimeoutException
    }
    # One class per bound of `Timeouts`, and one for a `deadline()` block around the call.
    assert bounds == {f.name for f in dataclasses.fields(stallproof.Timeouts)} | {"deadline"}
