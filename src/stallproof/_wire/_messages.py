"""httpcore2's `Request` and `Response`, built without re-checking what is already bytes.

httpcore2's constructors check every header name and value of every request and response
(``enforce_bytes``: two ``isinstance`` and a call per string, ~100 calls per call of ours).
What the engine sends and what a wire parses are lists of ``(bytes, bytes)`` already, so
these build the same objects directly. ``tests/client/test_h1.py`` pins that they carry
exactly the attributes httpcore2's own constructors set.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Iterable, MutableMapping
from typing import Any

import httpcore2
from httpcore2._models import ByteStream

__all__ = ["new_request", "new_response"]


def new_request(
    method: bytes,
    scheme: bytes,
    host: bytes,
    port: int | None,
    target: bytes,
    headers: list[tuple[bytes, bytes]],
    content: bytes,
    extensions: dict[str, Any],
) -> httpcore2.Request:
    """``httpcore2.Request(method, URL(...), headers=..., content=..., extensions=...)``."""
    url = object.__new__(httpcore2.URL)
    url.scheme = scheme
    url.host = host
    url.port = port
    url.target = target
    request = object.__new__(httpcore2.Request)
    request.method = method
    request.url = url
    request.headers = headers
    request.stream = ByteStream(content)
    request.extensions = extensions
    return request


def new_response(
    status: int,
    headers: list[tuple[bytes, bytes]],
    stream: AsyncIterable[bytes] | Iterable[bytes],
    extensions: MutableMapping[str, Any],
) -> httpcore2.Response:
    """``httpcore2.Response(status, headers=..., content=stream, extensions=...)``."""
    response = object.__new__(httpcore2.Response)
    response.status = status
    response.headers = headers
    response.stream = stream
    response.extensions = extensions
    response._stream_consumed = False
    return response
