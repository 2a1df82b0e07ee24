"""Turning a non-2xx response into a typed `APIStatusError`."""

from __future__ import annotations

import contextlib
import email.utils
import json
import time

import httpx

from . import _exceptions as exc
from ._call import Call

__all__ = ["parse_retry_after", "read_status_error"]


def parse_retry_after(headers: httpx.Headers, *, now: float | None = None) -> float | None:
    """Seconds the server asked us to wait, from ``retry-after-ms`` or ``Retry-After``.

    ``Retry-After`` may be seconds or an HTTP date. Returns None when absent or unparsable,
    and never a negative number.
    """
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            value = float(ms) / 1000.0
        except ValueError:
            value = None
        if value is not None and value == value and value >= 0:  # not NaN
            return value
    raw = headers.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds:  # NaN
        return None
    return max(0.0, seconds)


async def read_status_error(
    response: httpx.Response, call: Call, max_bytes: int
) -> exc.APIStatusError:
    """Read at most ``max_bytes`` of the error body and build the matching error."""
    buf = bytearray()
    async with contextlib.aclosing(response.aiter_bytes()) as parts:  # type: ignore[type-var]
        async for part in parts:
            buf += part
            if len(buf) >= max_bytes:
                del buf[max_bytes:]
                break
    text = buf.decode("utf-8", errors="replace")
    body: object = text or None
    detail = ""
    try:
        body = json.loads(text)
    except ValueError:
        detail = text.strip()[:200]
    else:
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict):
            detail = str(err.get("message") or "")[:500]
        elif isinstance(err, str):
            detail = err[:500]
        elif isinstance(body, dict) and isinstance(body.get("message"), str):
            detail = body["message"][:500]
    status = response.status_code
    reason = response.reason_phrase or ""
    message = f"HTTP {status} {reason}".rstrip()
    if detail:
        message += f": {detail}"
    cls = exc.status_error_class(status)
    return call.error(
        cls,
        message,
        status_code=status,
        body=body,
        headers={k.lower(): v for k, v in response.headers.items()},
        retry_after=parse_retry_after(response.headers),
    )
