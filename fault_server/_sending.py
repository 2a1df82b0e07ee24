"""What most faults are made of: send the healthy answer, or the first part of it.

Shared by the behaviour modules (`_behaviours`, `_wire_faults`, `_sse_faults`,
`_timing_faults`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ._answer import Frames
from ._exchange import Exchange, Outcome
from ._openai import Whole

__all__ = ["Behaviour", "healthy", "send_frames", "send_half", "send_part"]

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
        await send_frames(ex, answer, 1 + ex.spec.integer("after"))
    else:
        await send_half(ex, answer)
