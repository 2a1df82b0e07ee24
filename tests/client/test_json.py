"""Costly but valid JSON: depth refused before parsing, large bodies parsed off the loop.

Served over real sockets (tests/support/rawserver.py) through `Client`, on asyncio and trio.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from openai.types.chat import ChatCompletionMessageParam

import stallproof
from stallproof._json import MAX_DEPTH, loads, too_deep

from ..support.clients import MakeClient, assert_pool_clean
from ..support.rawserver import always, response
from ..support.timing import stopwatch

pytestmark = pytest.mark.anyio

MSGS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]
HEAD = {"id": "x", "object": "chat.completion", "created": 1, "model": "m"}
# Worst case between the deadline and the call ending: the GIL-holding C part of a parse
# still running in the worker thread (0.25 s for these bodies on an idle machine).
PARSE_MARGIN = 0.6


def _completion(**extra: Any) -> bytes:
    choice = {"index": 0, "message": {"role": "assistant", "content": "hi"}}
    return json.dumps({**HEAD, "choices": [choice], **extra}).encode()


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 100_000])
async def test_deep_nesting_is_malformed_not_recursion_error(
    depth: int, raw_server: Any, make_client: MakeClient
) -> None:
    body = (
        _completion(extra=_nested(depth))
        if depth < 1000
        else b"[" * depth + b"]" * depth  # too deep for json.dumps to write
    )
    srv = raw_server(always(response(200, body, {"content-type": "application/json"})))
    client = make_client(srv.url)
    with pytest.raises(stallproof.MalformedResponse) as e:
        await client.chat.completions.create(model="m", messages=MSGS)
    assert f"deeper than {MAX_DEPTH}" in str(e.value) and e.value.stallproof_request_id
    assert_pool_clean(client)


@pytest.mark.parametrize(
    "doc",
    [
        '{"a": 1, "b": [true, null, -0.0, 1e400, 12345678901234567890123], "a": 3}',
        '"\\ud800"',  # a lone surrogate escape: json takes it, pydantic-core does not
        '"\\ud83d\\ude00 \\u00e9 \\/"',
        "NaN",
        "[Infinity, -Infinity]",
        '\ufeff{"a": 1}',
        '{"a": 1,}',
        '"a\x01b"',
        "1 2",
        "",
        "[" * MAX_DEPTH + "]" * MAX_DEPTH,
    ],
)
@pytest.mark.parametrize("encoding", [None, "utf-8", "utf-8-sig", "utf-16", "utf-32-le"])
def test_loads_accepts_and_refuses_what_json_does(doc: str, encoding: str | None) -> None:
    """`loads` parses with pydantic-core and falls back to json: whatever the input, the
    result is json's (objects, or an error that is a ValueError)."""
    data: str | bytes = doc if encoding is None else doc.encode(encoding, "surrogatepass")

    def outcome(parse: Any) -> object:
        try:
            value = parse(data)
        except ValueError as e:
            return type(e)
        return repr(value)  # (NaN != NaN, but its repr is the same)

    assert outcome(loads) == outcome(json.loads)


def test_depth_is_measured_outside_strings() -> None:
    assert not too_deep(json.dumps({"s": "[" * 1000, "t": '\\"[[[' * 300}).encode())
    assert not too_deep(json.dumps(_nested(MAX_DEPTH)).encode())
    assert too_deep(json.dumps(_nested(MAX_DEPTH + 1)).encode())
    assert too_deep(json.dumps({"a": _nested(MAX_DEPTH)}).encode())
    with pytest.raises(ValueError, match="deeper"):
        loads(b"[" * 100_000)  # unclosed: the parser's own recursion, typed all the same


async def test_a_costly_body_cannot_hold_the_deadline_or_the_loop(
    raw_server: Any, make_client: MakeClient
) -> None:
    """300k empty choices (900 KB) would take seconds to turn into objects: the body is
    refused by its density (an object per 3 bytes) before it is parsed, well inside the
    call's total, and another task on the loop keeps running meanwhile."""
    body = json.dumps({**HEAD, "choices": [{}] * 300_000}).encode()
    srv = raw_server(always(response(200, body, {"content-type": "application/json"})))
    client = make_client(srv.url)
    gaps: list[float] = []

    async def ticker() -> None:
        last = anyio.current_time()
        while True:
            await anyio.sleep(0.01)
            now = anyio.current_time()
            gaps.append(now - last)
            last = now

    total = 2.0
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        with stopwatch() as elapsed, pytest.raises(stallproof.MalformedResponse) as e:
            await client.chat.completions.create(model="m", messages=MSGS, timeout=total)
        tg.cancel_scope.cancel()
    assert "objects and arrays" in str(e.value)
    assert elapsed[0] < total, elapsed[0]
    # (A call over before the ticker's first tick held the loop at most its own length.)
    longest = max(gaps, default=elapsed[0])
    assert longest < PARSE_MARGIN, longest
    assert client.inflight() == ()
    assert_pool_clean(client)
