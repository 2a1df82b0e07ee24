"""Turning a non-2xx response into a typed `APIStatusError`.

``headers`` here are lower-cased names mapped to values."""

from __future__ import annotations

import email.utils
import http
import json
import time
from collections.abc import Mapping, Sequence

from . import _exceptions as exc
from ._call import Call

__all__ = ["parse_retry_after", "status_error_from_body"]


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
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


def status_error_from_body(
    call: Call, status: int, headers: Sequence[tuple[bytes, bytes]], content: bytes
) -> exc.APIStatusError:
    """The `APIStatusError` subclass for ``status``, built from its (capped) body."""
    text = content.decode("utf-8", errors="replace")
    body: object = text or None
    detail = ""
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
        detail = text.strip()[:200]
    else:
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict):
            detail = str(err.get("message") or "")[:500]
        elif isinstance(err, str):
            detail = err[:500]
        elif isinstance(body, dict) and isinstance(body.get("message"), str):
            detail = body["message"][:500]
    if isinstance(body, dict) and "error" in body:
        body = body["error"]  # openai's APIStatusError.body is the inner error object
    lowered = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in headers}
    reason = _REASONS.get(status, "")
    message = f"HTTP {status} {reason}".rstrip()
    if detail:
        message += f": {detail}"
    if status == 404 and call.url is not None:
        message += f" ({_where(call.url)})"
    cls = exc.status_error_class(status)
    return call.error(
        cls,
        message,
        status_code=status,
        body=body,
        headers=lowered,
        retry_after=parse_retry_after(lowered),
        content=content,
    )


def _where(url: str) -> str:
    """Which URL a 404 came from, and the usual cause: a base URL without ``/v1``."""
    bare = url.split("?", 1)[0]  # a query may carry a key: never in a message
    hint = f"{bare} was not found"
    path = bare.split("://", 1)[-1].partition("/")[2]
    if not path.startswith("v1/") and "/v1/" not in f"/{path}":
        hint += "; the base URL does not end in /v1, which most OpenAI-compatible servers need"
    return hint


_REASONS = {code.value: code.phrase for code in http.HTTPStatus}
