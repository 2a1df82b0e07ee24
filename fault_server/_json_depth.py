"""`loads`: `json.loads` with a nesting limit, so hostile JSON gets a 400, not a crash.

CPython's JSON decoder recurses once per ``[`` or ``{``: a body of 100,000 ``[`` raises
`RecursionError`, which no ``except ValueError`` catches, and the connection handler died
with it (the client saw its connection dropped, with no answer). Every JSON the server reads
— chat bodies, control bodies, an upstream's events in proxy mode — goes through `loads`,
which refuses anything nested deeper than `MAX_DEPTH` with `JSONTooDeep`, a `ValueError`.

The check costs nothing for ordinary bodies: a body with at most `MAX_DEPTH` brackets cannot
be nested deeper, and those with more are walked once, iteratively, after decoding.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

__all__ = ["MAX_DEPTH", "JSONTooDeep", "loads"]

MAX_DEPTH = 128  # far above any real request (tool schemas nest a dozen levels or so).


class JSONTooDeep(ValueError):
    """JSON nested deeper than `MAX_DEPTH` arrays and objects."""

    def __init__(self) -> None:
        super().__init__(f"JSON nested deeper than {MAX_DEPTH} levels")


def loads(data: bytes | str) -> Any:
    """`json.loads`, refusing nesting deeper than `MAX_DEPTH`.

    Raises:
        JSONTooDeep: nested too deep (a `ValueError`).
        ValueError: not JSON (`json.JSONDecodeError`, or `UnicodeDecodeError`).
    """
    try:
        value = json.loads(data)
    except RecursionError:
        raise JSONTooDeep() from None
    if _brackets(data) > MAX_DEPTH:
        _check_depth(value)
    return value


def _brackets(data: bytes | str) -> int:
    if isinstance(data, str):
        return data.count("[") + data.count("{")
    return data.count(b"[") + data.count(b"{")


def _check_depth(value: Any) -> None:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children: Iterable[Any]
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > MAX_DEPTH:
            raise JSONTooDeep()
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
