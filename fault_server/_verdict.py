"""Verdicts: how the client under test behaved, judged from the journal alone.

A test names the attempts to judge by what they share: the sequence ``key``, the client's
``x-request-id`` or its ``Idempotency-Key``. The verdict then says how many attempts the
client made and how far apart, when it gave up on a fault (and whether with a FIN or an
RST), which faults it left dangling until the server's hold ran out, and whether each retry
waited as long as the previous response's Retry-After (or retry-after-ms) advised.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, fields
from typing import Any

from ._journal import ConnectionRecord, RequestRecord, requests_of

__all__ = ["RetryAfterCheck", "Verdict", "judge"]

# A retry that comes this much before the advised time still honours it: the client's and
# the server's clocks start at slightly different instants (the last byte sent vs read).
_TOLERANCE = 0.05


@dataclass(frozen=True, slots=True)
class RetryAfterCheck:
    """One response that advised a delay, and what the client did next.

    Attributes:
        attempt: index (from 0) of the attempt whose response advised the delay.
        advised: the advised delay, in seconds.
        waited: seconds from the end of that response to the next attempt; None if there
            was no next attempt.
        honoured: whether ``waited`` was at least ``advised`` (less 50 ms); None without a
            next attempt.
    """

    attempt: int
    advised: float
    waited: float | None
    honoured: bool | None


@dataclass(frozen=True, slots=True)
class Verdict:
    """How a client behaved over a group of attempts.

    Attributes:
        attempts: requests in the group.
        connections: distinct connections they came on.
        intervals: seconds between the starts of consecutive attempts.
        gave_up: per attempt that the client left before its response was complete, the
            seconds from its request to the client leaving.
        closed_by_client: attempts the client ended with a FIN (it closed the socket).
        reset_by_client: attempts the client ended with an RST.
        dangling: attempts whose fault ran out its hold with the client still connected:
            the client never gave up, the server did.
        running: attempts not over yet (the client may still be waiting).
        retry_after: each response that advised a delay, and whether it was waited.
        honoured_retry_after: True when every advice followed by another attempt was
            honoured, False when one was not, None when no advice was followed by one.
        requests: the attempts themselves, in order.
    """

    attempts: int
    connections: int
    intervals: tuple[float, ...]
    gave_up: tuple[float, ...]
    closed_by_client: int
    reset_by_client: int
    dangling: int
    running: int
    retry_after: tuple[RetryAfterCheck, ...]
    honoured_retry_after: bool | None
    requests: tuple[RequestRecord, ...]

    def as_dict(self) -> dict[str, Any]:
        # by hand: asdict would deep-copy every request first, only to be replaced.
        out = {name: getattr(self, name) for name in _VERDICT_FIELDS}
        out["retry_after"] = [asdict(check) for check in self.retry_after]
        out["requests"] = [r.as_dict() for r in self.requests]
        return out


_VERDICT_FIELDS = tuple(f.name for f in fields(Verdict))


def judge(records: tuple[ConnectionRecord, ...]) -> Verdict:
    """The verdict on every request in ``records`` (already filtered to one group)."""
    requests = requests_of(records)
    starts = [r.started for r in requests]
    left = [r for r in requests if r.outcome in ("client_closed", "client_reset")]
    checks = []
    for i, r in enumerate(requests):
        if r.retry_after is None:
            continue
        nxt = requests[i + 1] if i + 1 < len(requests) else None
        end = r.ended if r.ended is not None else r.started
        waited = None if nxt is None else max(0.0, nxt.started - end)
        honoured = None if waited is None else waited >= r.retry_after - _TOLERANCE
        checks.append(RetryAfterCheck(i, r.retry_after, waited, honoured))
    judged = [c.honoured for c in checks if c.honoured is not None]
    return Verdict(
        attempts=len(requests),
        connections=len({r.connection for r in requests}),
        intervals=tuple(b - a for a, b in itertools.pairwise(starts)),
        gave_up=tuple((r.ended or r.started) - r.started for r in left),
        closed_by_client=sum(r.outcome == "client_closed" for r in requests),
        reset_by_client=sum(r.outcome == "client_reset" for r in requests),
        dangling=sum(r.outcome == "hold_expired" for r in requests),
        running=sum(r.outcome == "running" for r in requests),
        retry_after=tuple(checks),
        honoured_retry_after=all(judged) if judged else None,
        requests=tuple(requests),
    )
