"""The fleet's calls in flight on Redis, for `stallproof top`: `InflightPublisher` and
`read_tables`.

A process that opts in (`stallproof.publish_inflight`) writes its table of calls in flight
(`stallproof.inflight()`, every client of the process) to the Redis its fleet already
shares, every ``interval`` seconds, as one key that expires after ``ttl``: a process that
dies stops refreshing its key, and its calls disappear within ``ttl``. `read_tables` reads
every live process's table in one script.

The publisher is a daemon thread with its own asyncio loop and its own `SharedStore`: it
never runs on the caller's loop, so a call never waits for it, and it works the same for
asyncio, trio and sync callers. Each write is one script, bounded by ``op_timeout`` like
every fleet operation; while Redis does not answer, tables are simply not published (the
store logs the change of health once).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import os
import threading
import uuid

from . import _exceptions as exc
from ._fleet import _scripts as lua
from ._fleet._store import UNAVAILABLE, SharedStore
from ._inflight import HOST
from ._policies import RedisState
from ._registry import BackgroundView, ProcessTable, table_json
from ._validate import check_number

__all__ = ["InflightPublisher", "publish_inflight", "read_tables"]

#: The most processes `read_tables` reads at once.
MAX_PROCESSES = 500


class InflightPublisher(BackgroundView):
    """Publishes this process's calls in flight to Redis for `stallproof top`.

    Made and started by `stallproof.publish_inflight`; see there.
    """

    def __init__(
        self,
        shared: RedisState,
        *,
        interval: float = 1.0,
        ttl: float | None = None,
        stalled_after: float = 5.0,
    ) -> None:
        if not isinstance(shared, RedisState):
            raise exc.InvalidRequestError(f"shared must be a RedisState, got {shared!r}")
        self.shared = shared
        check_number("interval", interval, above=0, maximum=3600)
        check_number("ttl", ttl, above=0, maximum=86400, optional=True)
        check_number("stalled_after", stalled_after, minimum=0, maximum=86400)
        self.interval = float(interval)
        self.ttl = float(ttl) if ttl is not None else max(3 * self.interval, 1.0)
        if self.ttl <= self.interval:
            raise exc.InvalidRequestError(
                f"ttl must be longer than interval ({self.interval:g}s), got {self.ttl!r}:"
                " a live process's table would expire between two writes"
            )
        self.stalled_after = float(stalled_after)
        #: This process's entry in the fleet's index (host, pid, and a random part: a pid
        #: can be reused by a later process).
        self.id = f"{HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        #: Tables written so far.
        self.published = 0
        self._stop = threading.Event()
        self._wake: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
        self._thread: threading.Thread | None = None
        self._store: SharedStore | None = None

    def __repr__(self) -> str:
        state = "closed" if self._stop.is_set() else "running" if self._thread else "new"
        return (
            f"InflightPublisher({self.shared!r}, interval={self.interval:g},"
            f" ttl={self.ttl:g}, {state})"
        )

    @property
    def health(self) -> str:
        """``"redis"`` while the last write went through; ``"local (why)"`` after one did
        not; ``"unknown"`` before the first."""
        store = self._store
        if store is None or store.health.value == "unknown":
            return "unknown"
        return store.describe()

    def start(self) -> InflightPublisher:
        """Start publishing (idempotent)."""
        if self._stop.is_set():
            raise exc.InvalidRequestError("this publisher is closed: make a new one")
        if self._thread is None:
            self._thread = threading.Thread(
                target=asyncio.run,
                args=(self._run(),),
                name=f"stallproof-publish-inflight-{self.shared.prefix}",
                daemon=True,
            )
            self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stop publishing and remove this process's table from Redis (one bounded
        operation); waits at most ``timeout`` seconds for the thread. Idempotent."""
        self._stop.set()
        wake = self._wake
        if wake is not None:
            loop, event = wake
            with contextlib.suppress(RuntimeError):  # its loop already closed
                loop.call_soon_threadsafe(event.set)
        if self._thread is not None:
            self._thread.join(timeout)

    async def _run(self) -> None:
        self._store = store = SharedStore(self.shared)
        event = asyncio.Event()
        self._wake = (asyncio.get_running_loop(), event)
        ttl_ms = math.ceil(self.ttl * 1000)
        try:
            while not self._stop.is_set():
                table = table_json(stalled_after=self.stalled_after, ttl=self.ttl)
                answer = await store.run(
                    "inflight.publish",
                    lua.INFLIGHT_PUBLISH,
                    [store.key, self.id, table, ttl_ms],
                    deadline=math.inf,  # no call waits: op_timeout alone bounds it
                )
                if answer is not UNAVAILABLE:
                    self.published += 1
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(event.wait(), self.interval)
            await store.run(
                "inflight.remove",
                lua.INFLIGHT_REMOVE,
                [store.key, self.id],
                deadline=math.inf,  # no call waits: op_timeout alone bounds it
            )
        finally:
            await store.aclose()


def publish_inflight(
    shared: RedisState,
    *,
    interval: float = 1.0,
    ttl: float | None = None,
    stalled_after: float = 5.0,
) -> InflightPublisher:
    """Publish this process's calls in flight to Redis, for ``stallproof top``.

    Every ``interval`` seconds a daemon thread writes `stallproof.inflight()` — every
    client, face and transport of the process — to the Redis the fleet shares, as one
    key that expires after ``ttl``: when the process dies, its calls leave ``top`` within
    ``ttl``. The thread has its own event loop and Redis connection; a call never waits
    for it. Each write is one operation bounded by ``shared.op_timeout``; while Redis
    does not answer, nothing is published and calls go on as before.

    Args:
        shared: where to publish: the same `RedisState` (url and prefix) the fleet's
            pacer or breaker uses, or any other. ``stallproof top --redis URL --prefix P``
            reads it.
        interval: seconds between two writes (default 1).
        ttl: seconds a table lives without being refreshed (default 3 x interval, at
            least 1); must be longer than ``interval``.
        stalled_after: a call without progress for longer than this is ``stalled``
            (default 5, as for `inflight`).

    Returns:
        The running `InflightPublisher`; ``close()`` stops it and removes the table (also
        as a context manager).

    Example:
        >>> publisher = stallproof.publish_inflight(stallproof.RedisState("redis://redis:6379"))
    """
    return InflightPublisher(
        shared, interval=interval, ttl=ttl, stalled_after=stalled_after
    ).start()


async def read_tables(
    shared: RedisState, *, most: int = MAX_PROCESSES, store: SharedStore | None = None
) -> tuple[list[ProcessTable], int]:
    """Every live process's published table (at most ``most``), and how many processes
    publish, in one operation bounded by ``op_timeout``. A table that does not parse is
    left out (a process of another version). ``store``: one to reuse (its loop's), else a
    store of this read alone.

    Raises:
        SharedStateUnavailable: Redis did not answer within ``op_timeout``.
    """
    own = store is None
    if store is None:
        store = SharedStore(shared)
    try:
        answer = await store.run(
            "inflight.read",
            lua.INFLIGHT_READ,
            [store.key, most],
            deadline=math.inf,  # op_timeout alone bounds it
        )
        if answer is UNAVAILABLE:
            raise exc.SharedStateUnavailable(
                f"Redis did not answer ({shared!r}): {store.reason}", reason=store.reason
            )
    finally:
        if own:
            await store.aclose()
    count, rest = int(answer[0]), answer[1:]
    tables = []
    for i in range(0, len(rest) - 1, 2):
        with contextlib.suppress(ValueError):
            table = ProcessTable.from_json(rest[i])
            # Its age from its key's expiry: Redis's clock, not the publisher's.
            left = max(0, int(rest[i + 1])) / 1000
            age = max(0.0, table.ttl - left) if table.ttl is not None else 0.0
            tables.append(dataclasses.replace(table, age=round(age, 3)))
    return tables, count
