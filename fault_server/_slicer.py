"""``slicer``: the healthy response cut into small writes of varied size, spaced in time.

Like Toxiproxy's slicer, it works on the bytes of the connection, the response head
included: a client that assumes a read returns a whole line, a whole event or a whole
header block meets the pieces. Each slice is ``size`` bytes, varied by up to ±``variation``
from a generator seeded with ``seed``, and ``interval`` seconds follow each one (the server
sets TCP_NODELAY, so slices leave as separate segments).
"""

from __future__ import annotations

import random

from ._answer import Frames
from ._exchange import Exchange, Outcome
from ._sending import Behaviour

__all__ = ["SLICER_FAULTS"]


async def slicer(ex: Exchange) -> Outcome:
    spec = ex.spec
    size, variation = spec.integer("size"), spec.integer("variation")
    interval = spec.number("interval")
    rng = random.Random(spec.integer("seed"))

    async def sliced(data: bytes) -> None:
        start = 0
        while start < len(data):
            length = max(1, size + rng.randint(-variation, variation))
            await ex.write(data[start : start + length])
            start += length
            await ex.sleep(interval)

    answer = await ex.answer()
    if isinstance(answer, Frames):
        await sliced(
            ex.head_bytes(answer.status, content_type=answer.content_type, headers=answer.headers)
        )
        while (frame := await answer.next()) is not None:
            await sliced(ex.data_bytes(frame))
    else:
        head = ex.head_bytes(
            answer.status,
            content_type=answer.content_type,
            content_length=len(answer.body),
            headers=answer.headers,
        )
        await sliced(head + ex.data_bytes(answer.body))
    await sliced(ex.end_bytes())
    return Outcome.KEEP


SLICER_FAULTS: dict[str, Behaviour] = {"slicer": slicer}
