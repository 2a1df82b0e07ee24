"""One registry per process: every call in flight, whatever client made it.

Every `Engine` registers its table of running calls here when it is built, and every face
sends through an engine: `Client`, the SDK faces, the httpx transports and the sync
clients are all in one `stallproof.inflight()`. The per-client views
(``client.inflight()``) read the same tables, one engine's each.

The registry holds its engines weakly: an engine (a client) that is dropped disappears
from it with its calls. Reads are safe from any thread — the publisher
(`stallproof.publish_inflight`) and the local socket (`stallproof.serve_inflight`) read
from threads of their own, and a sync client's engine runs on a loop in another thread:

- a table is copied with ``dict.copy()``, which the GIL (or, without one, the dict's own
  lock) makes atomic, then read outside any lock;
- each call's times are read on its own loop's clock (`Call.now`: asyncio's
  ``loop.time``, the trio run's clock object), which answers from any thread.

A read takes no lock a call would wait for: a call never waits for the registry.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import time
import weakref
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from ._inflight import HOST, InflightCall, attention
from ._validate import seconds

if TYPE_CHECKING:
    from ._call import Call

__all__ = [
    "MAX_ROWS",
    "BackgroundView",
    "ProcessTable",
    "inflight",
    "register",
    "snapshot",
    "table_json",
]

#: The most calls one process publishes (what needs attention first); the count of all
#: of them travels with them.
MAX_ROWS = 500

# key -> (weak reference to the owner, its table of calls). Keys come from a counter, not
# id(owner): an id is reused once its object is gone, and the weak reference's callback
# of a dead engine must not remove a new one.
_TABLES: dict[int, tuple[weakref.ref[object], dict[int, Call]]] = {}
_KEYS = itertools.count()


def register(owner: object, calls: dict[int, Call]) -> None:
    """Put ``owner``'s table of running calls in the process registry until ``owner`` is
    garbage-collected."""
    key = next(_KEYS)

    def forget(_: weakref.ref[object], key: int = key) -> None:
        _TABLES.pop(key, None)

    _TABLES[key] = (weakref.ref(owner, forget), calls)


def snapshot(calls: dict[int, Call], stalled_after: float) -> list[InflightCall]:
    """A record per call of one table, from any thread."""
    records = []
    for call in list(calls.copy().values()):
        try:
            now = call.now()
        except RuntimeError:  # pragma: no cover - a clock that needs its own loop
            now = time.monotonic()
        # From another thread, the call may change phase between our clock read and its
        # snapshot: its times then read 0, not a few microseconds below.
        now = max(now, call.phase_since, call.last_progress)
        records.append(call.snapshot(now, stalled_after))
    return records


def inflight(*, stalled_after: float = 5.0) -> tuple[InflightCall, ...]:
    """Every call in flight in this process, of every client, face and transport,
    longest-running first. Safe from any thread.

    Each record is an `InflightCall`, as ``client.inflight()`` gives, with its ``pid``.
    A call is ``stalled`` when it made no progress (phase change, content chunk, body
    bytes) for more than ``stalled_after`` seconds and its deadline has not fired.

    Example:
        >>> print(stallproof.format_inflight(stallproof.inflight()))
    """
    stalled_after = seconds("stalled_after", stalled_after, allow_zero=True)
    records: list[InflightCall] = []
    for ref, calls in list(_TABLES.copy().values()):
        if ref() is not None:
            records.extend(snapshot(calls, stalled_after))
    return tuple(sorted(records, key=lambda c: -c.elapsed))


def table_json(*, stalled_after: float, ttl: float | None = None, most: int = MAX_ROWS) -> bytes:
    """This process's table as JSON: what the publisher and the local socket send.

    ``{"v": 1, "host", "pid", "stalled_after", "ttl", "total", "calls":
    [InflightCall.as_json, ...]}``: at most ``most`` calls, those that need attention
    first; ``total`` counts them all; ``ttl`` is the publisher's (None from a socket).
    """
    calls = sorted(inflight(stalled_after=stalled_after), key=attention)
    table = {
        "v": 1,
        "host": HOST,
        "pid": os.getpid(),
        "stalled_after": stalled_after,
        "ttl": ttl,
        "total": len(calls),
        "calls": [c.as_json() for c in calls[:most]],
    }
    return json.dumps(table, separators=(",", ":")).encode()


@dataclasses.dataclass(frozen=True, slots=True)
class ProcessTable:
    """One process's in-flight table, as another process read it (`table_json`)."""

    host: str
    pid: int
    stalled_after: float
    #: Calls in flight there; ``calls`` holds at most `MAX_ROWS` of them.
    total: int
    calls: tuple[InflightCall, ...]
    #: How long the table lives unrefreshed on Redis (the publisher's ``ttl``); None when
    #: it was read from the process's socket.
    ttl: float | None = None
    #: Seconds since it was published (Redis); 0 when read from its socket.
    age: float = 0.0

    @classmethod
    def from_json(cls, data: bytes | str, *, age: float = 0.0) -> ProcessTable:
        """Parse what `table_json` made.

        Raises:
            ValueError: not such a table (bad JSON, a missing or mistyped field).
        """
        try:
            obj: Any = json.loads(data)
            if not isinstance(obj, dict) or obj.get("v") != 1:
                raise ValueError('not a stallproof in-flight table (no "v": 1)')
            host, pid, total, after = obj["host"], obj["pid"], obj["total"], obj["stalled_after"]
            rows, ttl = obj["calls"], obj.get("ttl")
            if not (
                (ttl is None or isinstance(ttl, (int, float)))
                and isinstance(host, str)
                and isinstance(pid, int)
                and isinstance(total, int)
                and isinstance(after, (int, float))
                and isinstance(rows, list)
            ):
                raise ValueError("a field of the table has the wrong type")
        except KeyError as e:
            raise ValueError(f"not a stallproof in-flight table: no {e}") from None
        calls = tuple(InflightCall.from_json(r) for r in rows if isinstance(r, dict))
        return cls(host, pid, float(after), total, calls, None if ttl is None else float(ttl), age)


V = TypeVar("V", bound="BackgroundView")


class BackgroundView:
    """What shows this registry to other processes from a thread of its own (the Redis
    publisher, the local socket): started once, closed once, a context manager."""

    def start(self: V) -> V:
        raise NotImplementedError

    def close(self, timeout: float = 5.0) -> None:
        raise NotImplementedError

    def __enter__(self: V) -> V:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
