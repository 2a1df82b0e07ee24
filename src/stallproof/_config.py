"""Frozen, validated configuration: the bounds of a call and the caps on what it may hold.

Runtime state (a running deadline, counters) never lives here; see `_call.py`.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Final

from ._exceptions import InvalidRequestError
from ._validate import check_int, seconds

__all__ = ["UNSET", "Limits", "Timeouts", "TimeoutTypes", "Unset"]


class Unset(enum.Enum):
    """Sentinel type for "not given" (distinct from None, which can be a real value)."""

    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = Unset.UNSET


@dataclasses.dataclass(frozen=True, slots=True)
class Timeouts:
    """Every bound on a call, in seconds. All are finite; none can be disabled.

    Args:
        connect: opening a TCP (and TLS) connection. Default 10.
        read: one socket read; resets on every byte received, so it only catches a server
            that sends nothing at all. Default 60.
        write: one socket write; fires when the server stops reading. Default 30.
        pool: waiting for a free connection from the pool. Default 30.
        first_token: from the moment the request is sent until the first content-bearing
            chunk of a stream (non-stream: the first body byte). Default 120.
        idle: the longest gap between content-bearing SSE events in a stream. Comments,
            pings, empty deltas and keep-alive bytes do not reset it. Time the caller spends
            holding a chunk is not counted. Default 60.
        total: the whole call: pool wait, connect, send, headers, the whole body or the whole
            stream as the caller iterates it, the pacer's queue, every retry and every
            backoff. When it runs out the call raises `TotalTimeout` wherever it is.
            Default 600.

    A float passed as ``timeout=`` means ``Timeouts(total=that)``.

    Example:
        >>> Timeouts(total=30, first_token=10).first_token
        10.0
    """

    connect: float = 10.0
    read: float = 60.0
    write: float = 30.0
    pool: float = 30.0
    first_token: float = 120.0
    idle: float = 60.0
    total: float = 600.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = seconds(f"Timeouts.{field.name}", getattr(self, field.name))
            object.__setattr__(self, field.name, value)

    @classmethod
    def coerce(cls, value: object, *, base: Timeouts | None = None) -> Timeouts:
        """A `Timeouts` from a number (the total budget: ``base``'s other bounds stay) or a
        `Timeouts`. What the SDKs pass (an ``httpx.Timeout``, None, ``NOT_GIVEN``) is read
        by ``stallproof._faces._compat.timeouts_from``, the one place that knows them.
        """
        if isinstance(value, Timeouts):
            return value
        if value is None:
            raise InvalidRequestError(
                "timeout=None would let a call run forever, which stallproof never does: "
                "pass a number of seconds (the total budget) or a stallproof.Timeouts"
            )
        total = seconds("timeout", value)
        return dataclasses.replace(base or cls(), total=total)

    def replace(self, **changes: float) -> Timeouts:
        """A copy with some bounds changed (validated like the constructor)."""
        return dataclasses.replace(self, **changes)


TimeoutTypes = Timeouts | float | int


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """Caps that turn a misbehaving server into a typed error instead of unbounded memory.

    Args:
        max_response_bytes: largest non-stream body (after decompression) and largest
            total of a stream. Default 32 MiB.
        max_line_bytes: longest single SSE line (one ``data:`` line). Default 1 MiB.
        max_error_body_bytes: how much of a non-2xx body is read for the error. Default 64 KiB.
        max_connections: connections the client's pool may open at once. Default 100.
        max_keepalive_connections: idle connections kept for reuse. Default (None): as
            many as ``max_connections``, so a harness whose agents all call at once reuses every
            connection it opened (at 20, 64 agents at once closed and reopened 44 a round,
            a TLS handshake each against a real server).
        keepalive_expiry: seconds an idle connection is kept. Default 5.
        max_redirects: redirects one call follows (inside its one deadline; see
            `stallproof._redirects`) before it fails with `TooManyRedirects`; 0 follows
            none. Default 10.
    """

    max_response_bytes: int = 32 * 1024 * 1024
    max_line_bytes: int = 1024 * 1024
    max_error_body_bytes: int = 64 * 1024
    max_connections: int = 100
    max_keepalive_connections: int | None = None
    keepalive_expiry: float = 5.0
    max_redirects: int = 10

    @property
    def idle_connections(self) -> int:
        """How many idle connections the pool keeps: ``max_keepalive_connections``, or
        ``max_connections`` when that is None."""
        value = self.max_keepalive_connections
        return self.max_connections if value is None else value

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "max_keepalive_connections" and value is None:
                continue  # as many as max_connections (`idle_connections`)
            if field.name == "keepalive_expiry":
                object.__setattr__(self, field.name, seconds("Limits.keepalive_expiry", value))
                continue
            minimum = 0 if field.name == "max_redirects" else 1
            check_int(f"Limits.{field.name}", value, minimum=minimum)
        if self.idle_connections > self.max_connections:
            raise InvalidRequestError(
                "Limits.max_keepalive_connections must be <= max_connections, got "
                f"{self.max_keepalive_connections} > {self.max_connections}"
            )
