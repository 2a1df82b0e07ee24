"""What each fault of the catalogue does on the wire.

Each behaviour takes an `Exchange` whose request is fully read (``half_open``'s is not) and
returns how it left the connection. None of them bounds itself: the connection runs each one
under ``hold`` and closes the socket when it runs out, so a behaviour may stall forever.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType

from ._exchange import Exchange, Outcome
from ._openai import DONE, EventStream, Whole, error, huge_completion, huge_stream_line

__all__ = ["BEHAVIOURS", "Behaviour"]

Behaviour = Callable[[Exchange], Awaitable[Outcome]]


async def healthy(ex: Exchange) -> Outcome:
    """The normal answer. ``token_interval`` paces stream chunks, or delays a whole reply
    by the time its tokens would have taken."""
    interval = ex.spec.number("token_interval")
    reply = ex.reply
    if isinstance(reply, Whole):
        if ex.chat is not None and interval > 0:
            await ex.sleep(interval * ex.spec.integer("tokens"))
        return await ex.send_whole(reply)
    await ex.send_head()
    await _send_events(ex, reply.events, reply)
    await ex.send_end()
    return Outcome.KEEP


async def stall(ex: Exchange) -> Outcome:
    """``half_open`` and ``stall_headers``: never send a byte."""
    await ex.stall()


async def trickle_body(ex: Exchange) -> Outcome:
    body = ex.body
    status = ex.reply.status if isinstance(ex.reply, Whole) else 200
    interval, size = ex.spec.number("interval"), ex.spec.integer("chunk")
    await ex.send_head(status, content_length=len(body))
    for start in range(0, len(body), size):
        await ex.sleep(interval)
        await ex.send_data(body[start : start + size])
    await ex.send_end()
    return Outcome.KEEP


async def sse_keepalive(ex: Exchange) -> Outcome:
    ping = b": keep-alive\n\n" if ex.stream else b"\n"
    await ex.send_head()
    while True:
        await ex.sleep(ex.spec.number("interval"))
        await ex.send_data(ping)


async def sse_stall(ex: Exchange) -> Outcome:
    if isinstance(ex.reply, EventStream):
        await ex.send_head()
        await _send_events(ex, ex.reply.head(ex.spec.integer("after")), ex.reply)
    else:
        await _send_half(ex)
    await ex.stall()


async def sse_empty_deltas(ex: Exchange) -> Outcome:
    stream = ex.event_stream()
    await ex.send_head(content_type="text/event-stream")
    await ex.send_data(stream.events[0])
    empty = (stream.chunk({}), stream.chunk({"content": ""}))
    beat = 0
    while True:
        await ex.sleep(ex.spec.number("interval"))
        await ex.send_data(empty[beat % 2])
        beat += 1


async def reset(ex: Exchange) -> Outcome:
    if ex.spec.text("when") == "mid":
        if isinstance(ex.reply, EventStream):
            await ex.send_head()
            await _send_events(ex, ex.reply.head(ex.spec.integer("after")), ex.reply)
        else:
            await _send_half(ex)
    return await ex.reset()


async def close_mid_body(ex: Exchange) -> Outcome:
    if isinstance(ex.reply, EventStream):
        await ex.send_head()
        await _send_events(ex, ex.reply.head(ex.spec.integer("after")), ex.reply)
    else:
        await _send_half(ex)
    return Outcome.CLOSE


async def content_length_lie(ex: Exchange) -> Outcome:
    body = ex.body
    status = ex.reply.status if isinstance(ex.reply, Whole) else 200
    await ex.send_head(status, content_length=len(body) + ex.spec.integer("extra"))
    await ex.send_data(body)
    await ex.stall()


async def status(ex: Exchange) -> Outcome:
    spec = ex.spec
    code = spec.integer("code")
    headers: list[tuple[str, str]] = []
    retry_after = spec.text("retry_after")
    if retry_after is not None:
        headers.append(("retry-after", retry_after))
    if spec.get("retry_after_ms") is not None:
        headers.append(("retry-after-ms", f"{spec.number('retry_after_ms'):g}"))
    should_retry = spec.get("should_retry")
    if should_retry is not None:
        headers.append(("x-should-retry", "true" if should_retry else "false"))
    whole = error(code, f"fault_server: injected status {code}")
    body = spec.text("body")
    if body is not None:
        whole = Whole(code, body.encode())
    return await ex.send_whole(whole, tuple(headers))


async def malformed_json(ex: Exchange) -> Outcome:
    if not isinstance(ex.reply, EventStream):
        return await ex.send_whole(Whole(200, b'{"id": "x", "choices": ['))
    await ex.send_head()
    await ex.send_data(ex.reply.events[0])
    await ex.send_data(b"data: {not json\n\n")
    await ex.send_data(DONE)
    await ex.send_end()
    return Outcome.KEEP


async def huge_body(ex: Exchange) -> Outcome:
    size = ex.spec.integer("size")
    if isinstance(ex.reply, EventStream):
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
    if not isinstance(ex.reply, EventStream):
        return await healthy(ex)
    await ex.send_head(headers=(("connection", "close"),))
    await _send_events(ex, ex.reply.events[:-1], ex.reply)
    await ex.send_end()
    return Outcome.CLOSE


async def _send_events(ex: Exchange, events: tuple[bytes, ...], stream: EventStream) -> None:
    """Send SSE frames, ``token_interval`` apart before each content frame."""
    interval = ex.spec.number("token_interval")
    for index, event in enumerate(events):
        if interval > 0 and 1 <= index <= stream.content:
            await ex.sleep(interval)
        await ex.send_data(event)


async def _send_half(ex: Exchange) -> None:
    """Headers with the full Content-Length, and the first half of the body."""
    body = ex.body
    status = ex.reply.status if isinstance(ex.reply, Whole) else 200
    await ex.send_head(status, content_length=len(body))
    await ex.send_data(body[: len(body) // 2])


BEHAVIOURS: Mapping[str, Behaviour] = MappingProxyType(
    {
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
)
