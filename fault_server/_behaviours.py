"""What each fault of the catalogue does on the wire.

Each behaviour takes an `Exchange` whose request is fully read (``half_open``'s is not) and
returns how it left the connection. None of them bounds itself: the connection runs each one
under ``hold`` and closes the socket when it runs out, so a behaviour may stall forever.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from types import MappingProxyType

from ._answer import Frames
from ._exchange import Exchange, Outcome
from ._formats import api_error, keepalive
from ._openai import DONE, Whole, huge_completion, huge_stream_line
from ._rate_limit import RATE_FAULTS
from ._sending import Behaviour, healthy, send_frames, send_opening, send_part
from ._slicer import SLICER_FAULTS
from ._sse_faults import SSE_FAULTS
from ._timing_faults import TIMING_FAULTS
from ._wire_faults import WIRE_FAULTS

__all__ = ["BEHAVIOURS", "Behaviour"]


async def stall(ex: Exchange) -> Outcome:
    """``half_open`` and ``stall_headers``: never send a byte."""
    await ex.stall()


async def trickle_body(ex: Exchange) -> Outcome:
    whole = await ex.whole()
    interval, size = ex.spec.number("interval"), ex.spec.integer("chunk")
    await ex.send_head(
        whole.status,
        content_type=whole.content_type,
        content_length=len(whole.body),
        headers=whole.headers,
    )
    for start in range(0, len(whole.body), size):
        await ex.sleep(interval)
        await ex.send_data(whole.body[start : start + size])
    await ex.send_end()
    return Outcome.KEEP


async def sse_keepalive(ex: Exchange) -> Outcome:
    ping = keepalive(ex.api) if ex.stream else b"\n"
    await ex.send_head()
    while True:
        await ex.sleep(ex.spec.number("interval"))
        await ex.send_data(ping)


async def sse_stall(ex: Exchange) -> Outcome:
    await send_part(ex)
    await ex.stall()


async def sse_empty_deltas(ex: Exchange) -> Outcome:
    stream = await send_opening(ex)
    empty = (stream.chunk({}), stream.chunk({"content": ""}))
    beat = 0
    while True:
        await ex.sleep(ex.spec.number("interval"))
        await ex.send_data(empty[beat % 2])
        beat += 1


async def reset(ex: Exchange) -> Outcome:
    if ex.spec.text("when") == "mid":
        await send_part(ex)
    return await ex.reset()


async def close_mid_body(ex: Exchange) -> Outcome:
    await send_part(ex)
    return Outcome.CLOSE


async def content_length_lie(ex: Exchange) -> Outcome:
    whole = await ex.whole()
    await ex.send_head(
        whole.status,
        content_type=whole.content_type,
        content_length=len(whole.body) + ex.spec.integer("extra"),
        headers=whole.headers,
    )
    await ex.send_data(whole.body)
    await ex.stall()


async def status(ex: Exchange) -> Outcome:
    spec = ex.spec
    code = spec.integer("code")
    headers: list[tuple[str, str]] = []
    retry_after = spec.text("retry_after")
    if retry_after is not None:
        headers.append(("retry-after", retry_after))
    if spec.get("retry_after_date") is not None:
        when = time.time() + spec.number("retry_after_date")
        headers.append(("retry-after", email.utils.formatdate(when, usegmt=True)))
    if spec.get("retry_after_ms") is not None:
        headers.append(("retry-after-ms", f"{spec.number('retry_after_ms'):g}"))
    should_retry = spec.get("should_retry")
    if should_retry is not None:
        headers.append(("x-should-retry", "true" if should_retry else "false"))
    whole = api_error(ex.api, code, f"fault_server: injected status {code}")
    body = spec.text("body")
    if body is not None:
        whole = Whole(code, body.encode())
    interval = spec.number("interval")
    if interval <= 0:
        return await ex.send_whole(whole, tuple(headers))
    await ex.send_head(  # a slow error body: one byte per interval.
        code,
        content_type=whole.content_type,
        content_length=len(whole.body),
        headers=tuple(headers),
    )
    for i in range(len(whole.body)):
        await ex.sleep(interval)
        await ex.send_data(whole.body[i : i + 1])
    await ex.send_end()
    return Outcome.KEEP


async def malformed_json(ex: Exchange) -> Outcome:
    answer = await ex.answer()
    if not isinstance(answer, Frames):
        return await ex.send_whole(Whole(200, b'{"id": "x", "choices": ['))
    await ex.send_answer_head(answer)
    await send_frames(ex, answer, answer.prologue)
    await ex.send_data(b"data: {not json\n\n")
    if answer.api == "chat":
        await ex.send_data(DONE)
    await ex.send_end()
    return Outcome.KEEP


async def huge_body(ex: Exchange) -> Outcome:
    size = ex.spec.integer("size")
    if ex.stream:
        await ex.send_head()
        _, pieces = huge_stream_line(ex.model, size)
    else:
        length, pieces = huge_completion(ex.model, size)
        await ex.send_head(content_length=length)
    for piece in pieces:
        await ex.send_data(piece)
    if ex.stream:
        await ex.send_data(b"\n\n" + DONE)
    await ex.send_end()
    return Outcome.KEEP


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


_BASIC: dict[str, Behaviour] = {
    "healthy": healthy,
    "half_open": stall,
    "stall_headers": stall,
    "trickle_body": trickle_body,
    "sse_keepalive": sse_keepalive,
    "sse_stall": sse_stall,
    "sse_empty_deltas": sse_empty_deltas,
    "reset": reset,
    "close_mid_body": close_mid_body,
    "content_length_lie": content_length_lie,
    "status": status,
    "malformed_json": malformed_json,
    "huge_body": huge_body,
    "no_done": no_done,
}

BEHAVIOURS: Mapping[str, Behaviour] = MappingProxyType(
    {**_BASIC, **WIRE_FAULTS, **SSE_FAULTS, **TIMING_FAULTS, **RATE_FAULTS, **SLICER_FAULTS}
)
