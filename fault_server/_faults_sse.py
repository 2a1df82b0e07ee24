"""Faults of the event stream and of OpenAI's chunk format: pings, [DONE] misplaced, error
events, unusual but valid SSE framing, long or endless lines, broken usage, tool calls split
in awkward places.

Faults that rewrite the healthy stream (``sse_crlf``, ``bad_usage``...) work on whatever the
answer is, so in proxy mode they rewrite the upstream's real stream; faults that need a
particular answer (the tool faults, pings, endless lines) make it up.
"""

from __future__ import annotations

import json
from typing import Any

from ._answer import Frames, frame_json, is_done
from ._formats import api_error, keepalive, malformed_event
from ._formats import error_event as api_error_event
from ._json_depth import loads as loads_limited
from ._openai import DONE, Whole
from ._params import MIB, ParamInfo, after, choice, flag, integer, interval
from ._registry import FaultGroup
from ._sending import chat_only, healthy, send_frames, send_opening, send_part
from ._tool_calls import (
    TRICKY_ARGUMENTS,
    TRICKY_PIECES,
    inside_utf8,
    tool_completion,
    tool_frames,
)
from ._wire_exchange import Exchange, Outcome

__all__ = ["SSE"]

_TOOL = "lookup"  # the function called when the request offers no tools.


SSE = FaultGroup("sse")


@SSE.fault(
    "sse_keepalive",
    "Stream: 200 text/event-stream, then ': keep-alive' comments every `interval` with "
    "no data, until `hold`. Non-stream: 200 chunked application/json, then a newline "
    "every `interval`, until `hold`.",
    (interval(0.5),),
)
async def sse_keepalive(ex: Exchange) -> Outcome:
    ping = keepalive(ex.api) if ex.stream else b"\n"
    await ex.send_head()
    while True:
        await ex.sleep(ex.spec.number("interval"))
        await ex.send_data(ping)


@SSE.fault(
    "sse_pings",
    'Always an SSE stream: the role chunk, then an `event: <event>` with data {"type": '
    '"<event>"} every `interval`, never content, until `hold`.',
    (interval(0.5), ParamInfo("event", "str", "ping", "The event name.")),
)
async def sse_pings(ex: Exchange) -> Outcome:
    name = ex.spec.text("event") or "ping"
    ping = f'event: {name}\ndata: {{"type": {json.dumps(name)}}}\n\n'.encode()
    await send_opening(ex)
    while True:
        await ex.sleep(ex.spec.number("interval"))
        await ex.send_data(ping)


@SSE.fault(
    "sse_empty_deltas",
    "Always an SSE stream (whatever `stream` says): a role chunk, then valid chunks "
    "whose delta is {} or has content '' every `interval`, never any content, until "
    "`hold`.",
    (interval(0.5),),
)
async def sse_empty_deltas(ex: Exchange) -> Outcome:
    stream = await send_opening(ex)
    empty = (stream.chunk({}), stream.chunk({"content": ""}))
    beat = 0
    while True:
        await ex.sleep(ex.spec.number("interval"))
        await ex.send_data(empty[beat % 2])
        beat += 1


@SSE.fault(
    "sse_stall",
    "Stream: the role chunk and `after` content chunks, then silence with the socket "
    "open until `hold`. Non-stream: headers with Content-Length and half the body, then "
    "silence until `hold`.",
    (after(2),),
)
async def sse_stall(ex: Exchange) -> Outcome:
    await send_part(ex)
    await ex.stall()


@SSE.fault(
    "no_done",
    "Stream: every chunk, the chunked terminator and a clean close, but no 'data: "
    "[DONE]'. Non-stream: a normal response.",
)
async def no_done(ex: Exchange) -> Outcome:
    answer = await ex.answer()
    if not isinstance(answer, Frames):
        return await healthy(ex)
    await ex.send_head(
        answer.status,
        content_type=answer.content_type,
        headers=(*answer.headers, ("connection", "close")),
    )
    await send_frames(ex, answer, transform=lambda f: b"" if answer.is_end(f) else f)
    await ex.send_end()
    return Outcome.CLOSE


@SSE.fault(
    "done_then_hold",
    "Stream: every event up to and with [DONE], then the body is never terminated and "
    "the socket stays open until `hold`. Non-stream: the JSON, chunked, never terminated.",
)
async def done_then_hold(ex: Exchange) -> Outcome:
    answer = await ex.answer()
    await ex.send_head(answer.status, content_type=answer.content_type, headers=answer.headers)
    if isinstance(answer, Frames):
        await send_frames(ex, answer)
    else:
        await ex.send_data(answer.body)
    await ex.stall()


@SSE.fault(
    "data_after_done",
    "Stream: the whole stream with [DONE], then more content chunks ('after-done') and "
    "another [DONE], well framed. Non-stream: a normal response.",
)
async def data_after_done(ex: Exchange) -> Outcome:
    answer = await ex.answer()
    if not isinstance(answer, Frames):
        return await ex.send_whole(answer)
    await ex.send_answer_head(answer)
    ends: list[bytes] = []

    def keep_end(frame: bytes) -> bytes:
        if answer.is_end(frame):
            ends.append(frame)
        return frame

    await send_frames(ex, answer, transform=keep_end)
    await ex.send_data(answer.chunk({"content": " after-done"}))
    await ex.send_data(answer.chunk({}, "stop"))
    await ex.send_data(ends[-1] if ends else DONE)
    await ex.send_end()
    return Outcome.KEEP


@SSE.fault(
    "malformed_json",
    '200, but non-stream the body is the truncated JSON \'{"id": "x", "choices": [\' and '
    "stream one valid chunk is followed by 'data: {not json', then [DONE].",
)
async def malformed_json(ex: Exchange) -> Outcome:
    answer = await ex.answer()
    if not isinstance(answer, Frames):
        return await ex.send_whole(Whole(200, b'{"id": "x", "choices": ['))
    await ex.send_answer_head(answer)
    await send_frames(ex, answer, answer.prologue)
    await ex.send_data(malformed_event(answer.api))
    if answer.api == "chat":
        await ex.send_data(DONE)
    await ex.send_end()
    return Outcome.KEEP


@SSE.fault(
    "error_event",
    "Stream: 200, the role chunk and `after` content chunks, then an OpenAI error object "
    "as a data event (as an 'event: error' with event=true), then the end of the body, "
    "no [DONE]. Non-stream: 200 with an error object as the body.",
    (after(1), flag("event", False, "Send it as an 'event: error' event.")),
)
async def error_event(ex: Exchange) -> Outcome:
    message = "fault_server: injected error event mid-stream"
    failure = api_error(ex.api, 500, message).body
    answer = await ex.answer()
    if not isinstance(answer, Frames):
        return await ex.send_whole(Whole(200, failure))
    await ex.send_answer_head(answer)
    await send_frames(ex, answer, answer.prologue + ex.spec.integer("after"))
    if answer.api != "chat":  # their streams always name the error event.
        await ex.send_data(api_error_event(answer.api, message, answer.count))
    else:
        prefix = b"event: error\n" if ex.spec.get("event") else b""
        await ex.send_data(prefix + b"data: " + failure + b"\n\n")
    await ex.send_end()
    return Outcome.KEEP


@SSE.fault(
    "sse_crlf",
    "Stream: the healthy stream with every line ended by CRLF (eol=crlf) or a lone CR "
    "(eol=cr), both valid SSE. Non-stream: a normal response.",
    (choice("eol", "crlf", "The line ending.", "crlf", "cr"),),
)
async def sse_crlf(ex: Exchange) -> Outcome:
    eol = b"\r\n" if ex.spec.text("eol") == "crlf" else b"\r"
    return await _rewritten(ex, lambda frame: frame.replace(b"\n", eol))


@SSE.fault(
    "sse_multiline",
    "Stream: the healthy stream with each JSON spread over several `data:` lines (to be "
    "joined with newlines), plus `id:`, `retry:` and comment lines. Non-stream: normal.",
)
async def sse_multiline(ex: Exchange) -> Outcome:
    count = 0

    def spread(frame: bytes) -> bytes:
        nonlocal count
        data = frame_json(frame)
        if data is None:
            return frame
        count += 1
        lines = [f"id: {count}", "retry: 3000", ": the data of this event spans lines"]
        lines += ["data: " + line for line in json.dumps(data, indent=1).split("\n")]
        return ("\n".join(lines) + "\n\n").encode()

    return await _rewritten(ex, spread)


@SSE.fault(
    "sse_long_line",
    "Stream: the role chunk, then one valid content chunk whose line is `size` bytes, "
    "then the rest of the stream. Non-stream: a normal response.",
    (integer("size", MIB, "Bytes of the long data line.", 1024, 16 * MIB),),
)
async def sse_long_line(ex: Exchange) -> Outcome:
    answer = await ex.answer()
    if not isinstance(answer, Frames):
        return await ex.send_whole(answer)
    await ex.send_answer_head(answer)
    await send_frames(ex, answer, answer.prologue)
    empty = answer.chunk({"content": ""})
    fill = max(0, ex.spec.integer("size") - len(empty) + 2)  # +2: the blank line is not in it.
    await ex.send_data(answer.chunk({"content": ("lorem " * (fill // 6 + 1))[:fill]}))
    await send_frames(ex, answer)
    await ex.send_end()
    return Outcome.KEEP


@SSE.fault(
    "endless_line",
    "Always an SSE stream: the role chunk, then one `data:` line whose JSON string grows "
    "a word every `interval` and never ends: bytes arrive, no event completes.",
    (interval(0.05),),
)
async def endless_line(ex: Exchange) -> Outcome:
    stream = await send_opening(ex)
    opening = stream.chunk({"content": "echo:"})
    await ex.send_data(opening[: opening.index(b'echo:"') + len(b"echo:")])
    while True:
        await ex.sleep(ex.spec.number("interval"))
        await ex.send_data(b" lorem")


@SSE.fault(
    "bad_usage",
    "The usage report broken. mode=missing: no usage chunk although include_usage asked "
    "for one (non-stream: no usage key); null: usage is null; early: the usage chunk "
    "comes before the content (non-stream: normal).",
    (choice("mode", "missing", "How usage is broken.", "missing", "null", "early"),),
)
async def bad_usage(ex: Exchange) -> Outcome:
    if (refused := await chat_only(ex)) is not None:
        return refused
    mode = ex.spec.text("mode")
    answer = await ex.answer()
    if isinstance(answer, Whole):
        data = _json(answer.body)
        if mode == "early" or not isinstance(data, dict) or "usage" not in data:
            return await ex.send_whole(answer)
        if mode == "missing":
            del data["usage"]
        else:
            data["usage"] = None
        return await ex.send_whole(Whole(answer.status, _dumps(data), headers=answer.headers))
    await ex.send_answer_head(answer)
    if mode == "early":
        frames = await answer.rest()
        usage = [f for f in frames if _is_usage(f)]
        others = [f for f in frames if not _is_usage(f)]
        for frame in others[:1] + usage + others[1:]:
            await ex.send_data(frame)
    elif mode == "missing":
        await send_frames(ex, answer, transform=lambda f: b"" if _is_usage(f) else f)
    else:
        await send_frames(ex, answer, transform=_null_usage)
    await ex.send_end()
    return Outcome.KEEP


@SSE.fault(
    "tool_split",
    "A tool call whose arguments hold non-ASCII text and escapes: stream, the argument "
    "deltas split inside JSON escapes (after a backslash, inside \\uXXXX) and each frame "
    "sent in two chunks split inside a UTF-8 character; non-stream, the body sent in two "
    "writes split inside a UTF-8 character. The arguments join to valid JSON.",
)
async def tool_split(ex: Exchange) -> Outcome:
    if (refused := await chat_only(ex)) is not None:
        return refused
    if not ex.stream:
        body = tool_completion(ex.model, [(_tool(ex), TRICKY_ARGUMENTS)])
        await ex.send_head(content_length=len(body))
        cut = inside_utf8(body) or len(body) // 2
        await ex.send_data(body[:cut])
        await ex.sleep(0.01)  # a pause, so the halves arrive apart.
        await ex.send_data(body[cut:])
        await ex.send_end()
        return Outcome.KEEP
    await ex.send_head()
    for frame in tool_frames(ex.model, [(0, _tool(ex), TRICKY_PIECES)]):
        inside = inside_utf8(frame)
        if inside is None:
            await ex.send_data(frame)
            continue
        await ex.send_data(frame[:inside])
        await ex.sleep(0.01)
        await ex.send_data(frame[inside:])
    await ex.send_end()
    return Outcome.KEEP


@SSE.fault(
    "index_gap",
    "Stream: two tool calls with indices 0 and 2 (none at 1), each in pieces, then "
    "finish_reason tool_calls. Non-stream: the same two tool calls.",
)
async def index_gap(ex: Exchange) -> Outcome:
    if (refused := await chat_only(ex)) is not None:
        return refused
    first, second = '{"text": "first"}', '{"text": "second"}'
    if not ex.stream:
        return await ex.send_whole(
            Whole(200, tool_completion(ex.model, [(_tool(ex), first), (_tool(ex), second)]))
        )
    calls = [(0, _tool(ex), _halves(first)), (2, _tool(ex), _halves(second))]
    return await _send_frames_whole(ex, tool_frames(ex.model, calls))


@SSE.fault(
    "tool_args_unclosed",
    'A tool call whose arguments JSON never closes (\'{"text": "...\'), with finish_reason '
    "tool_calls and, stream, [DONE]: well framed, unparsable arguments.",
)
async def tool_args_unclosed(ex: Exchange) -> Outcome:
    if (refused := await chat_only(ex)) is not None:
        return refused
    text = "echo: " + (ex.chat.text if ex.chat is not None else "")
    arguments = json.dumps({"text": text})[:-2]  # no closing quote, no closing brace.
    if not ex.stream:
        return await ex.send_whole(Whole(200, tool_completion(ex.model, [(_tool(ex), arguments)])))
    return await _send_frames_whole(ex, tool_frames(ex.model, [(0, _tool(ex), _halves(arguments))]))


@SSE.fault(
    "json_for_stream",
    "Stream: 200 application/json with a whole chat.completion (Content-Length) instead "
    "of an event stream. Non-stream: a normal response.",
)
async def json_for_stream(ex: Exchange) -> Outcome:
    if not ex.stream:
        return await healthy(ex)
    answer = await ex.answer(stream=False)
    if isinstance(answer, Frames):  # an upstream that streams anyway: send it joined.
        body = b"".join(await answer.rest())
        answer = Whole(answer.status, body, "application/json", answer.headers)
    return await ex.send_whole(answer)


async def _rewritten(ex: Exchange, rewrite: Any) -> Outcome:
    answer = await ex.answer()
    if not isinstance(answer, Frames):
        return await ex.send_whole(answer)
    await ex.send_answer_head(answer)
    await send_frames(ex, answer, transform=rewrite)
    await ex.send_end()
    return Outcome.KEEP


async def _send_frames_whole(ex: Exchange, frames: list[bytes]) -> Outcome:
    await ex.send_head()
    for frame in frames:
        await ex.send_data(frame)
    await ex.send_end()
    return Outcome.KEEP


def _tool(ex: Exchange) -> str:
    return (ex.chat.tool_name if ex.chat is not None else None) or _TOOL


def _halves(text: str) -> tuple[str, str]:
    return text[: len(text) // 2], text[len(text) // 2 :]


def _is_usage(frame: bytes) -> bool:
    data = frame_json(frame)
    return isinstance(data, dict) and data.get("choices") == [] and "usage" in data


def _null_usage(frame: bytes) -> bytes:
    if is_done(frame):
        return frame
    data = frame_json(frame)
    if not isinstance(data, dict) or "usage" not in data:
        return frame
    data["usage"] = None
    return b"data: " + _dumps(data) + b"\n\n"


def _json(body: bytes) -> Any:
    try:
        return loads_limited(body)
    except ValueError:
        return None


def _dumps(data: object) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()
