"""Parsing the JSON a server sends, without letting it block the loop or blow the stack.

Valid JSON can still be hostile: 3 MB of ``{"choices":[{}, {}, ...]}`` takes seconds and
hundreds of MiB to parse and turn into objects, and ten thousand nested brackets raise
``RecursionError`` from deep inside the parser. Every JSON document a server sends goes
through this module:

- its nesting depth is checked *before* parsing (at most `MAX_DEPTH`), in C-speed passes
  over the bytes, so deep nesting is a `MalformedResponse`, never a ``RecursionError``;
- so is its density (`JSONTooDense`): past 100,000 objects and arrays, at most one per 64
  bytes, so what a parse costs stays within a few times the body's size;
- a body larger than `OFF_LOOP_BYTES` is parsed (and converted, see `parse_body`) in a
  worker thread, under the call's total deadline: the call ends on time even while the
  parse runs on, and other calls on the loop are not held up. A `CapacityLimiter` per
  event loop bounds how many such parses run at once.

`loads` is the one synchronous entry (small documents: error bodies, SSE events).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread
from pydantic_core import from_json

from . import _exceptions as exc
from ._call import Call

__all__ = [
    "MAX_DEPTH",
    "OFF_LOOP_BYTES",
    "JSONTooDeep",
    "JSONTooDense",
    "loads",
    "parse_body",
    "too_deep",
]

MAX_DEPTH = 128
OFF_LOOP_BYTES = 64 * 1024
# Parses running at once in worker threads, per event loop.
_THREADS = 4

T = TypeVar("T")

_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")

_limiters: anyio.lowlevel.RunVar[anyio.CapacityLimiter] = anyio.lowlevel.RunVar(
    "stallproof_json_limiter"
)


class JSONTooDeep(ValueError):
    """The document nests deeper than `MAX_DEPTH` (raised before parsing)."""


class JSONTooDense(ValueError):
    """The document holds more objects and arrays than its size allows (raised before
    parsing): each costs the parser 64-250 bytes of heap for 2 bytes of input, so 15 MB of
    ``[{},{},...]`` would cost 400 MiB."""


# A document may hold this many objects and arrays whatever its size; past it, at most
# one per `_BYTES_PER_CONTAINER` bytes on average (an API answer holds far fewer: text,
# numbers and strings, in a few dozen containers; 1,000 embeddings hold 2,000).
_FREE_CONTAINERS = 100_000
_BYTES_PER_CONTAINER = 64


def too_deep(data: bytes) -> bool:
    """Whether arrays and objects in ``data`` nest deeper than `MAX_DEPTH`.

    Only C-speed passes over the bytes, never a Python step per byte: everything but
    brackets is deleted, then each round deletes every innermost ``[]`` pair; what survives
    `MAX_DEPTH` rounds nests deeper. That first pass counts brackets inside strings too,
    so a document it finds too deep is checked again with its strings cut out (slower, and
    only then). Brackets in strings can make a deeper document look shallower, never
    deeper: the parser still refuses past Python's recursion limit, with a typed error.
    """
    if data.count(b"[") + data.count(b"{") <= MAX_DEPTH:
        return False  # not even that many brackets
    if not _peel(data):
        return False
    # `\\` is the only escape whose second byte is a backslash: removing those pairs
    # first, left to right as a lexer reads them, leaves every `\"` a quote inside a string.
    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    return _peel(b"".join(unescaped.split(b'"')[::2]))


def _peel(data: bytes) -> bool:
    brackets = data.translate(_BRACKETS, _NOT_BRACKETS)
    for _ in range(MAX_DEPTH):
        inner = brackets.replace(b"[]", b"")
        if len(inner) == len(brackets):
            return False  # nothing left to peel: balanced within the limit (or not JSON)
        brackets = inner
    return b"[]" in brackets


_decode = json.JSONDecoder().decode


def loads(data: bytes | str) -> object:
    """Parse one JSON document, refusing deep nesting before parsing.

    Raises:
        ValueError: not JSON (``json.JSONDecodeError``) or too deep (`JSONTooDeep`).
    """
    if isinstance(data, str):
        # (An SSE event's data: most have a few brackets, and need no bytes copy to say so.)
        containers = data.count("[") + data.count("{")
        deep = containers > MAX_DEPTH and too_deep(data.encode())
    else:
        containers = data.count(b"[") + data.count(b"{")
        deep = containers > MAX_DEPTH and too_deep(data)
    if deep:
        raise JSONTooDeep(f"JSON nested deeper than {MAX_DEPTH} levels")
    if containers > _FREE_CONTAINERS and containers * _BYTES_PER_CONTAINER > len(data):
        raise JSONTooDense(
            f"JSON with {containers} objects and arrays in {len(data)} bytes: more than one "
            f"per {_BYTES_PER_CONTAINER} bytes would cost the parser far more memory"
        )
    try:
        # pydantic-core's parser (jiter, in Rust): 2.5x faster than json's on an SSE
        # event, and the same objects for every document it accepts. What it refuses json
        # may still take (a lone surrogate escape, a UTF-16 body): json decides those, so
        # what is accepted and what each error says stay json's.
        return from_json(data)
    except ValueError:
        pass
    try:
        # A str goes straight to the decoder (json.loads's own checks are for bytes).
        return _decode(data) if isinstance(data, str) else json.loads(data)
    except RecursionError:  # unclosed brackets: the check above counts only pairs
        raise JSONTooDeep(f"JSON nested deeper than {MAX_DEPTH} levels") from None


def _limiter() -> anyio.CapacityLimiter:
    try:
        return _limiters.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(_THREADS)
        _limiters.set(limiter)
        return limiter


def _parse_then(content: bytes, convert: Callable[[object], T]) -> T:
    return convert(loads(content))


async def parse_body(
    content: bytes, call: Call, convert: Callable[[object], T], *, what: str = "response body"
) -> T:
    """Parse a whole body and ``convert`` the result, bounded by the call's total deadline.

    Large bodies are parsed and converted in a worker thread: when the deadline fires the
    call raises `TotalTimeout` at once and the thread's result is dropped.

    Raises:
        MalformedResponse: not JSON, or nested too deeply.
        TotalTimeout: the call's deadline passed while parsing.
    """
    try:
        if len(content) <= OFF_LOOP_BYTES:
            return _parse_then(content, convert)
        with call.within_total():
            return await anyio.to_thread.run_sync(
                _parse_then, content, convert, abandon_on_cancel=True, limiter=_limiter()
            )
    except (JSONTooDeep, JSONTooDense) as e:
        raise call.error(exc.MalformedResponse, f"{what}: {e}") from None
    except ValueError:
        raise call.error(
            exc.MalformedResponse,
            f"{what} is not JSON ({len(content)} bytes): {content[:80]!r}",
        ) from None
