"""Faults of time: a slow first token, a steady token rate, jitter.

These answers are healthy, only slow; a client's bounds above the times they take must not
fire, and its first-token and idle bounds below them must.
"""

from __future__ import annotations

import random

from ._answer import Frames
from ._params import integer, number
from ._registry import FaultGroup
from ._sending import send_frames
from ._wire_exchange import Exchange, Outcome

__all__ = ["TIME"]


TIME = FaultGroup("time")


@TIME.fault(
    "slow_first_token",
    "Stream: the head and the role chunk at once, then `wait` seconds before the first "
    "content chunk. Non-stream: the head (Content-Length) at once, the body after `wait`.",
    (number("wait", 1.0, "Seconds between the head and the first content."),),
)
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


@TIME.fault(
    "token_rate",
    "Stream: a content chunk every 1/`tps` seconds, each interval varied by up to "
    "±`jitter` of itself from a generator seeded with `seed`. Non-stream: the whole "
    "answer after the sum of those intervals.",
    (
        number("tps", 10.0, "Content tokens per second.", 0.01),
        number("jitter", 0.0, "Fraction of the interval to vary it by, 0 to 1.", 0, 1),
        integer("seed", 0, "Seed of the jitter: the same seed gives the same pauses."),
    ),
)
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
