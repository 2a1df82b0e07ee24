"""Faults of the status: an HTTP error with its retry headers, and ``rate_limit``, a real
token bucket answering rate-limit headers and 429s.

``status`` answers a well-formed error, so the connection stays usable. For ``rate_limit``,
each bucket belongs to a sequence key (or to the requests without one) and to the fault's
``limit`` and ``rate``: two tests with their own keys never share tokens. A bucket starts
full with ``limit`` tokens and gains ``rate`` tokens a second, up to ``limit``. A request
takes one token and gets the healthy answer with OpenAI's ``x-ratelimit-*-requests``
headers (Anthropic's ``anthropic-ratelimit-requests-*`` on ``/v1/messages``); when the
bucket is empty it gets a 429 whose ``Retry-After`` says when the next token comes.
"""

from __future__ import annotations

import datetime
import email.utils
import math
import time

from ._answer import Frames
from ._buckets import Draw
from ._formats import api_error
from ._openai import Whole
from ._params import flag, integer, number, text
from ._registry import FaultGroup
from ._sending import send_frames
from ._wire_exchange import Exchange, Outcome

__all__ = ["STATUS"]


STATUS = FaultGroup("status")


@STATUS.fault(
    "status",
    "An HTTP error with an OpenAI-shaped error body and optional retry headers. The "
    "response is well formed and the connection stays usable. With `interval`, the body "
    "comes one byte every `interval` seconds.",
    (
        integer("code", 500, "The status code.", 200, 599),
        text("retry_after", "Retry-After header, verbatim."),
        number(
            "retry_after_date",
            None,
            "Retry-After as an HTTP date this many seconds from now.",
            minimum=-1e9,
        ),
        number("retry_after_ms", None, "retry-after-ms header."),
        flag("should_retry", None, "x-should-retry header: true or false."),
        text("body", "Body to send instead of the error JSON."),
        number("interval", 0.0, "Seconds between body bytes (a slow error body)."),
    ),
)
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


@STATUS.fault(
    "rate_limit",
    "A token bucket per key (and per limit/rate): each request takes a token and gets "
    "the healthy answer with rate-limit headers "
    "(x-ratelimit-limit/remaining/reset-requests; anthropic-ratelimit-requests-* on "
    "/v1/messages); an empty bucket answers 429 with Retry-After (whole seconds, rounded "
    "up), retry-after-ms and remaining 0.",
    (
        integer("limit", 3, "Bucket capacity: requests allowed in a burst.", 1),
        number("rate", 1.0, "Tokens added back per second.", 0.001),
    ),
)
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
