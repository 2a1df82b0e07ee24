"""Keeping secrets out of everything stallproof shows: messages, reprs, logs, spans, chains.

A secret travels in a header (``Authorization``, ``api-key``, ``x-api-key``...) or in a
URL's userinfo (``https://user:KEY@host``). Three rules keep it in the request alone:

- a header value is never quoted: a bad one is refused by *name* (`check_headers`), before
  anything is sent, because the HTTP layer's own error quotes the value it refused;
- a URL is shown without its userinfo (`safe_url`);
- an error that outlives the call carries no request with secret headers in it: the
  request a library's exception must hold is a copy with those values replaced
  (`redacted_request`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

__all__ = ["KNOWN_HEADERS", "SECRET_HEADERS", "check_headers", "redacted_request", "safe_url"]

SECRET_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "api-key",
        "x-api-key",
        "x-goog-api-key",
        "cookie",
    }
)
_REDACTED = "[redacted]"
# A header name is an RFC 9110 token; a value may not hold a control character (field-vchar,
# SP and HTAB only). Regular expressions: every header of every call passes here.
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_EDGE = (b" ", b"\t")
#: How many headers found fine `check_headers` remembers per ``known`` set.
KNOWN_HEADERS = 256


def header_problem(name: bytes, value: bytes) -> str | None:
    """What is wrong with one header, in words that never quote its value (None: fine)."""
    if _TOKEN.fullmatch(name) is None:
        return f"header name {name[:60]!r} is not a valid HTTP token"
    label = name.decode("ascii").lower()
    if value[:1] in _EDGE or value[-1:] in _EDGE:
        return f"header {label!r} has surrounding whitespace in its value (value not shown)"
    if _BAD.search(value) is not None:
        return f"header {label!r} has a control character in its value (value not shown)"
    return None


def check_headers(
    headers: Iterable[tuple[bytes, bytes]], known: set[tuple[bytes, bytes]] | None = None
) -> str | None:
    """The first problem among ``headers`` (see `header_problem`), or None.

    ``known``: headers already found fine, skipped (a set lookup, where the checks scan
    every byte of a value: a client sends the same few headers on every call); the fine
    ones are added to it, up to `KNOWN_HEADERS` (then it starts again).
    """
    for pair in headers:
        if known is not None and pair in known:
            continue
        problem = header_problem(*pair)
        if problem is not None:
            return problem
        if known is not None:
            if len(known) >= KNOWN_HEADERS:
                known.clear()
            known.add(pair)
    return None


def safe_url(url: Any) -> str:
    """``url`` (an httpx URL or a string) as text without its userinfo."""
    text = str(url)
    scheme, sep, rest = text.partition("://")
    if not sep:
        return text
    authority, slash, path = rest.partition("/")
    host = authority.rpartition("@")[2]
    return f"{scheme}://{host}{slash}{path}"


def redacted_request(request: Any) -> Any:
    """A copy of an httpx/httpx2 request with secret header values (and the URL's
    userinfo) replaced: what an exception may hold on to after the call."""
    if request is None:
        return None
    headers = [
        (k, _REDACTED if k.lower() in SECRET_HEADERS else v)
        for k, v in request.headers.multi_items()
    ]
    url = (
        request.url.copy_with(username=None, password=None) if request.url.userinfo else request.url
    )
    return type(request)(request.method, url, headers=headers, extensions={})
