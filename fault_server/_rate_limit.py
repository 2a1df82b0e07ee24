"""``rate_limit``: a real token bucket, answering rate-limit headers and 429s.

Each bucket belongs to a sequence key (or to the requests without one) and to the fault's
``limit`` and ``rate``: two tests with their own keys never share tokens. A bucket starts
full with ``limit`` tokens and gains ``rate`` tokens a second, up to ``limit``. A request
takes one token and gets the healthy answer with OpenAI's ``x-ratelimit-*-requests``
headers (Anthropic's ``anthropic-ratelimit-requests-*`` on ``/v1/messages``); when the
bucket is empty it gets a 429 whose ``Retry-After`` says when the next token comes.
"""

from __future__ import annotations

import datetime
import math

from ._answer import Frames
from ._buckets import Draw
from ._exchange import Exchange, Outcome
from ._formats import api_error
from ._sending import Behaviour, send_frames

__all__ = ["RATE_FAULTS"]


async def rate_limit(ex: Exchange) -> Outcome:
    spec = ex.spec
    limit, rate = spec.integer("limit"), spec.number("rate")
    key = ex.log.key if ex.log is not None else spec.key  # the X-Fault-Key header's too.
    draw = ex.buckets.draw(key, limit, rate)
    headers = _headers(ex, limit, draw)
    if not draw.granted:
        headers += (
            ("retry-after", str(max(1, math.ceil(draw.retry_after)))),
            ("retry-after-ms", f"{draw.retry_after * 1000:.0f}"),
        )
        message = f"fault_server: rate limit of {limit} requests reached, {rate:g} per second"
        return await ex.send_whole(api_error(ex.api, 429, message), headers)
    answer = await ex.answer()
    if isinstance(answer, Frames):
        await ex.send_head(
            answer.status,
            content_type=answer.content_type,
            headers=(*answer.headers, *headers),
        )
        await send_frames(ex, answer)
        await ex.send_end()
        return Outcome.KEEP
    return await ex.send_whole(answer, headers)


def _headers(ex: Exchange, limit: int, draw: Draw) -> tuple[tuple[str, str], ...]:
    if ex.api == "messages":
        reset = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(
            seconds=draw.retry_after if not draw.granted else draw.full_in
        )
        return (
            ("anthropic-ratelimit-requests-limit", str(limit)),
            ("anthropic-ratelimit-requests-remaining", str(draw.remaining)),
            ("anthropic-ratelimit-requests-reset", reset.isoformat(timespec="seconds")),
        )
    return (
        ("x-ratelimit-limit-requests", str(limit)),
        ("x-ratelimit-remaining-requests", str(draw.remaining)),
        ("x-ratelimit-reset-requests", f"{draw.full_in:.3f}s"),
    )


RATE_FAULTS: dict[str, Behaviour] = {"rate_limit": rate_limit}
