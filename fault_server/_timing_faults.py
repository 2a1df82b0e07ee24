"""Faults of time: a slow first token, a steady token rate, jitter.

These answers are healthy, only slow; a client's bounds above the times they take must not
fire, and its first-token and idle bounds below them must.
"""

from __future__ import annotations

import random

from ._answer import Frames
from ._exchange import Exchange, Outcome
from ._sending import Behaviour, send_frames

__all__ = ["TIMING_FAULTS"]


async def slow_first_token(ex: Exchange) -> Outcome:
    wait = ex.spec.number("wait")
    answer = await ex.answer()
    if isinstance(answer, Frames):
        await ex.send_answer_head(answer)
        await send_frames(ex, answer, answer.prologue)
        await ex.sleep(wait)
        await send_frames(ex, answer)
    else:
        await ex.send_head(
            answer.status,
            content_type=answer.content_type,
            content_length=len(answer.body),
            headers=answer.headers,
        )
        await ex.sleep(wait)
        await ex.send_data(answer.body)
    await ex.send_end()
    return Outcome.KEEP


async def token_rate(ex: Exchange) -> Outcome:
    spec = ex.spec
    base = 1.0 / spec.number("tps")
    jitter = spec.number("jitter")
    rng = random.Random(spec.integer("seed"))

    def pause() -> float:
        return base * (1.0 + jitter * rng.uniform(-1.0, 1.0))

    answer = await ex.answer()
    if isinstance(answer, Frames):
        await ex.send_answer_head(answer)
        await send_frames(ex, answer, pause=pause)
        await ex.send_end()
        return Outcome.KEEP
    tokens = spec.integer("tokens") if ex.chat is not None else 0
    await ex.sleep(sum(pause() for _ in range(tokens)))
    return await ex.send_whole(answer)


TIMING_FAULTS: dict[str, Behaviour] = {
    "slow_first_token": slow_first_token,
    "token_rate": token_rate,
}
