"""What most faults are made of: send the healthy answer, or the first part of it.

Shared by the fault group modules (`_faults_socket`, `_faults_http`, `_faults_sse`,
`_faults_status`, `_faults_time`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ._answer import Frames
from ._formats import api_error
from ._openai import EventStream, Whole
from ._wire_exchange import Exchange, Outcome

__all__ = [
    "Behaviour",
    "chat_only",
    "healthy",
    "send_frames",
    "send_half",
    "send_opening",
    "send_part",
]

Behaviour = Callable[[Exchange], Awaitable[Outcome]]


async def send_frames(
    ex: Exchange,
    frames: Frames,
    limit: int | None = None,
    *,
    transform: Callable[[bytes], bytes] | None = None,
    pause: Callable[[], float] | None = None,
) -> int:
    """Send up to ``limit`` more frames (all, without it); returns how many were sent.

    Before each paced frame (content chunks) it waits ``pause()`` if given, else the
    request's ``token_interval``. ``transform`` rewrites each frame before it goes out.
    """
    interval = ex.spec.number("token_interval")
    sent = 0
    while limit is None or sent < limit:
        index = frames.count
        frame = await frames.next()
        if frame is None:
            break
        if frames.paced(index, frame):
            wait = pause() if pause is not None else interval
            if wait > 0:
                await ex.sleep(wait)
        await ex.send_data(transform(frame) if transform is not None else frame)
        sent += 1
    return sent


async def healthy(ex: Exchange) -> Outcome:
    """The normal answer. ``token_interval`` paces stream chunks, or delays a whole reply
    by the time its tokens would have taken."""
    answer = await ex.answer()
    if isinstance(answer, Whole):
        interval = ex.spec.number("token_interval")
        if ex.chat is not None and interval > 0:
            await ex.sleep(interval * ex.spec.integer("tokens"))
        return await ex.send_whole(answer)
    await ex.send_answer_head(answer)
    await send_frames(ex, answer)
    await ex.send_end()
    return Outcome.KEEP


async def send_half(ex: Exchange, whole: Whole) -> None:
    """Headers with the full Content-Length, and the first half of the body."""
    await ex.send_head(
        whole.status,
        content_type=whole.content_type,
        content_length=len(whole.body),
        headers=whole.headers,
    )
    await ex.send_data(whole.body[: len(whole.body) // 2])


async def send_part(ex: Exchange) -> None:
    """The first part of the answer: stream, the head, the role chunk and ``after`` content
    chunks; non-stream, the head with the full Content-Length and half the body."""
    answer = await ex.answer()
    if isinstance(answer, Frames):
        await ex.send_answer_head(answer)
        await send_frames(ex, answer, answer.prologue + ex.spec.integer("after"))
    else:
        await send_half(ex, answer)


async def send_opening(ex: Exchange) -> EventStream:
    """The head of a made-up stream in the request's format and its opening events (chat:
    the role chunk); returns the stream, for its `EventStream.chunk`."""
    stream = ex.event_stream()
    await ex.send_head(content_type="text/event-stream")
    for frame in stream.events[: stream.prologue]:
        await ex.send_data(frame)
    return stream


async def chat_only(ex: Exchange) -> Outcome | None:
    """For a fault made of chat completion chunks only: a 400 that says so on another API,
    rather than an answer its clients would not recognise; None on chat."""
    if ex.api in (None, "chat"):
        return None
    message = f"fault {ex.spec.name!r} breaks chat completions only, not the {ex.api} API"
    return await ex.send_whole(api_error(ex.api, 400, message))
