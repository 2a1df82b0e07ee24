"""Faults of HTTP framing: heads never sent, left open or trickled; bodies trickled, shorter
than their Content-Length, chunked without an end, endless or huge.

Every byte is still framed by h11 (`Exchange.head_bytes`, `data_bytes`, `end_bytes`); these
faults break the response only by what they leave out or how slowly they send it.
"""

from __future__ import annotations

import json

from ._answer import Frames
from ._openai import DONE, huge_completion, huge_stream_line
from ._params import MIB, integer, interval
from ._registry import FaultGroup
from ._sending import send_frames, send_opening
from ._wire_exchange import Exchange, Outcome

__all__ = ["HTTP"]

HTTP = FaultGroup("http")

_WORD = " lorem"


@HTTP.fault(
    "stall_headers",
    "Read the whole request, never send a status line; close after `hold`.",
)
async def stall_headers(ex: Exchange) -> Outcome:
    await ex.stall()


@HTTP.fault(
    "stall_in_headers",
    "Send the status line and every header line but not the blank line that ends the "
    "head; then silence until `hold`.",
)
async def stall_in_headers(ex: Exchange) -> Outcome:
    head = ex.head_bytes()
    await ex.write(head[:-2])  # every header line, not the blank line that ends the head.
    await ex.stall()


@HTTP.fault(
    "trickle_headers",
    "Send the response head `chunk` bytes every `interval` seconds, then the healthy body at once.",
    (interval(0.5), integer("chunk", 1, "Bytes per send.", 1)),
)
async def trickle_headers(ex: Exchange) -> Outcome:
    answer = await ex.answer()
    length = None if isinstance(answer, Frames) else len(answer.body)
    head = ex.head_bytes(
        answer.status,
        content_type=answer.content_type,
        content_length=length,
        headers=answer.headers,
    )
    pause, size = ex.spec.number("interval"), ex.spec.integer("chunk")
    for start in range(0, len(head), size):
        if start:
            await ex.sleep(pause)
        await ex.write(head[start : start + size])
    if isinstance(answer, Frames):
        await send_frames(ex, answer)
    else:
        await ex.send_data(answer.body)
    await ex.send_end()
    return Outcome.KEEP


@HTTP.fault(
    "trickle_body",
    "200 with a correct Content-Length at once, then the normal body (JSON, or the SSE "
    "stream) `chunk` bytes every `interval` seconds, until done or `hold`.",
    (interval(1.0), integer("chunk", 1, "Bytes per send.", 1)),
)
async def trickle_body(ex: Exchange) -> Outcome:
    whole = await ex.whole()
    pause, size = ex.spec.number("interval"), ex.spec.integer("chunk")
    await ex.send_head(
        whole.status,
        content_type=whole.content_type,
        content_length=len(whole.body),
        headers=whole.headers,
    )
    for start in range(0, len(whole.body), size):
        await ex.sleep(pause)
        await ex.send_data(whole.body[start : start + size])
    await ex.send_end()
    return Outcome.KEEP


@HTTP.fault(
    "content_length_lie",
    "Content-Length `extra` bytes larger than the body; send the whole body (stream: up "
    "to and with [DONE]), then keep the socket open, sending nothing, until `hold`.",
    (integer("extra", 100, "Bytes promised but never sent.", 1),),
)
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


@HTTP.fault(
    "chunked_no_end",
    "A chunked body that never gets its final 0-size chunk: non-stream the whole JSON, "
    "stream every event but [DONE]; then silence with the socket open until `hold`.",
)
async def chunked_no_end(ex: Exchange) -> Outcome:
    answer = await ex.answer()
    await ex.send_head(answer.status, content_type=answer.content_type, headers=answer.headers)
    if isinstance(answer, Frames):
        await send_frames(ex, answer, transform=lambda f: b"" if answer.is_end(f) else f)
    else:
        await ex.send_data(answer.body)
    await ex.stall()


@HTTP.fault(
    "endless_body",
    "A body that never ends: stream, valid content chunks forever, one every `interval`; "
    "non-stream, a chunked JSON completion whose content string grows a word every "
    "`interval`. Ends at `hold`.",
    (interval(0.01),),
)
async def endless_body(ex: Exchange) -> Outcome:
    pause = ex.spec.number("interval")
    if ex.stream:
        stream = await send_opening(ex)
        word = stream.chunk({"content": _WORD})
    else:
        stream = ex.event_stream()
        await ex.send_head()  # chunked application/json
        await ex.send_data(_open_completion(ex, stream.id, stream.created))
        word = _WORD.encode()
    while True:
        await ex.sleep(pause)
        await ex.send_data(word)


def _open_completion(ex: Exchange, cid: str, created: int) -> bytes:
    """A ``chat.completion`` JSON cut inside its content string, which stays open."""
    head = {"id": cid, "object": "chat.completion", "created": created, "model": ex.model}
    text = json.dumps(head, separators=(",", ":"))[:-1]
    return (text + ',"choices":[{"index":0,"message":{"role":"assistant","content":"echo:').encode()


@HTTP.fault(
    "huge_body",
    "200 with a body of `size` bytes, generated as it is sent: non-stream one valid JSON "
    "completion with Content-Length; stream a single `data:` line of `size` bytes, then "
    "[DONE]. Ends at `hold` if the client reads too slowly.",
    (integer("size", 64 * MIB, "Bytes of body (non-stream) or of the data line.", 1024),),
)
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
