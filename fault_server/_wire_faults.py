"""Faults of the socket and of HTTP framing: half-close, cuts, stalls and trickles inside the
head, chunked bodies that never end.

Every byte is still framed by h11 (`Exchange.head_bytes`, `data_bytes`, `end_bytes`); these
faults break the response only by what they leave out or how slowly they send it.
"""

from __future__ import annotations

import json

from ._answer import Frames
from ._exchange import Exchange, Outcome
from ._sending import Behaviour, healthy, send_frames, send_opening, send_part

__all__ = ["WIRE_FAULTS"]

_WORD = " lorem"


async def half_close(ex: Exchange) -> Outcome:
    await send_part(ex)
    await ex.half_close()
    await ex.stall()  # still reading: the client's close (or hold) ends it.


async def cut_after(ex: Exchange) -> Outcome:
    answer = await ex.answer()
    if isinstance(answer, Frames):
        head = ex.head_bytes(
            answer.status, content_type=answer.content_type, headers=answer.headers
        )
        body = b"".join([ex.data_bytes(frame) for frame in await answer.rest()])
    else:
        head = ex.head_bytes(
            answer.status,
            content_type=answer.content_type,
            content_length=len(answer.body),
            headers=answer.headers,
        )
        body = ex.data_bytes(answer.body)
    response = head + body + ex.end_bytes()
    cut = ex.spec.integer("bytes")
    if cut < len(head) and ex.log is not None:
        ex.log.status = None  # the head itself was cut: no status went out.
    await ex.write(response[:cut])
    then = ex.spec.text("then")
    if then == "reset":
        return await ex.reset()
    if then == "stall":
        await ex.stall()
    return Outcome.CLOSE


async def stall_in_headers(ex: Exchange) -> Outcome:
    head = ex.head_bytes()
    await ex.write(head[:-2])  # every header line, not the blank line that ends the head.
    await ex.stall()


async def trickle_headers(ex: Exchange) -> Outcome:
    answer = await ex.answer()
    length = None if isinstance(answer, Frames) else len(answer.body)
    head = ex.head_bytes(
        answer.status,
        content_type=answer.content_type,
        content_length=length,
        headers=answer.headers,
    )
    interval, size = ex.spec.number("interval"), ex.spec.integer("chunk")
    for start in range(0, len(head), size):
        if start:
            await ex.sleep(interval)
        await ex.write(head[start : start + size])
    if isinstance(answer, Frames):
        await send_frames(ex, answer)
    else:
        await ex.send_data(answer.body)
    await ex.send_end()
    return Outcome.KEEP


async def chunked_no_end(ex: Exchange) -> Outcome:
    answer = await ex.answer()
    await ex.send_head(answer.status, content_type=answer.content_type, headers=answer.headers)
    if isinstance(answer, Frames):
        await send_frames(ex, answer, transform=lambda f: b"" if answer.is_end(f) else f)
    else:
        await ex.send_data(answer.body)
    await ex.stall()


async def endless_body(ex: Exchange) -> Outcome:
    interval = ex.spec.number("interval")
    if ex.stream:
        stream = await send_opening(ex)
        word = stream.chunk({"content": _WORD})
    else:
        stream = ex.event_stream()
        await ex.send_head()  # chunked application/json
        await ex.send_data(_open_completion(ex, stream.id, stream.created))
        word = _WORD.encode()
    while True:
        await ex.sleep(interval)
        await ex.send_data(word)


def _open_completion(ex: Exchange, cid: str, created: int) -> bytes:
    """A ``chat.completion`` JSON cut inside its content string, which stays open."""
    head = {"id": cid, "object": "chat.completion", "created": created, "model": ex.model}
    text = json.dumps(head, separators=(",", ":"))[:-1]
    return (text + ',"choices":[{"index":0,"message":{"role":"assistant","content":"echo:').encode()


WIRE_FAULTS: dict[str, Behaviour] = {
    # Connection level: they act before a request is read (_connection, _tls).
    "slow_accept": healthy,
    "refuse": healthy,
    "tls_stall": healthy,
    "half_close": half_close,
    "cut_after": cut_after,
    "stall_in_headers": stall_in_headers,
    "trickle_headers": trickle_headers,
    "chunked_no_end": chunked_no_end,
    "endless_body": endless_body,
}
