"""Fleet state on Redis: the config (`RedisState`) and the store every operation goes through.

Redis is one more upstream that can be slow, down or stalled, so the store treats it like
one. Each operation runs with its own short bound (``op_timeout``), clipped to the calling
request's deadline, in a task of its own: when the bound fires the task is cancelled and
left to close its connection, and the caller goes on at once with the answer
`UNAVAILABLE`. The caller then uses its in-process state (``fail="open"``) or refuses the
call with `SharedStateUnavailable` (``fail="closed"``).

After a failure the store does not try Redis again for ``retry_interval``: a dead Redis
costs the first call at most ``op_timeout``, and the calls after it nothing. The first
operation that succeeds after that resynchronises: fleet state is the authority again.
Every change of health is one log line on the ``stallproof`` logger and one count on the
``stallproof.shared.transitions`` metric; every operation that fell back counts on
``stallproof.shared.fallbacks``.

redis-py's client is asyncio only. Under trio the store is always unavailable (one log
line says why) and every call runs on local state.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import anyio
from opentelemetry import metrics

from .. import _exceptions as exc
from .._policies import RedisState

__all__ = ["UNAVAILABLE", "Health", "SharedStore", "Stores", "now"]

logger = logging.getLogger("stallproof")


class Health(enum.Enum):
    """Where the store's answers come from now."""

    UNKNOWN = "unknown"  # not tried yet
    SHARED = "shared"  # Redis answered the last operation
    LOCAL = "local"  # Redis failed: callers use their own state until retry_at


class _Unavailable:
    __slots__ = ()

    def __repr__(self) -> str:
        return "UNAVAILABLE"


#: What `SharedStore.run` returns when Redis did not answer in time.
UNAVAILABLE: Any = _Unavailable()


class SharedStore:
    """One process's connection to the fleet state: bounded operations, health, fallback.

    Belongs to one asyncio event loop (the one of its first operation).
    """

    def __init__(
        self, config: RedisState, *, meter_provider: metrics.MeterProvider | None = None
    ) -> None:
        self.config = config
        self.key = "{" + config.prefix + "}"
        self.health = Health.UNKNOWN
        self.reason = ""  # why the store is LOCAL
        self._retry_at = -math.inf
        self._client: Any = None
        self._scripts: dict[str, Any] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        meter = metrics.get_meter("stallproof", meter_provider=meter_provider)
        self._fallbacks = meter.create_counter(
            "stallproof.shared.fallbacks",
            unit="{operation}",
            description="Fleet-state operations answered from local state (Redis failed)",
        )
        self._transitions = meter.create_counter(
            "stallproof.shared.transitions",
            unit="{change}",
            description="Changes between fleet state on Redis and local fallback",
        )

    @property
    def fail_closed(self) -> bool:
        return self.config.fail == "closed"

    def describe(self) -> str:
        """For `inflight()`: where this process's answers come from now."""
        if self.health is Health.LOCAL:
            return f"local ({self.reason})"
        return "redis"

    def unavailable_error(self, what: str) -> exc.SharedStateUnavailable:
        return exc.SharedStateUnavailable(
            f"{what}: fleet state on Redis is unavailable ({self.reason}) and"
            " RedisState.fail='closed'",
            reason=self.reason,
        )

    def new_id(self) -> str:
        return uuid.uuid4().hex

    # -- operations -------------------------------------------------------------------------

    async def run(self, name: str, script: str, args: Sequence[object], *, deadline: float) -> Any:
        """Run one script within ``op_timeout`` and ``deadline``; `UNAVAILABLE` if it could
        not. Never raises for Redis's sake; the caller's own cancellation propagates."""
        await anyio.lowlevel.checkpoint()
        if self.health is Health.LOCAL and now() < self._retry_at:
            return self._fell_back(name)
        if not self._on_asyncio():
            return self._fell_back(name)
        bound = min(self.config.op_timeout, deadline - now())
        if bound <= 0:
            return self._fell_back(name)
        task = self._start(script, args)
        try:
            with anyio.move_on_after(bound) as timer:
                result = await asyncio.shield(task)
        except asyncio.CancelledError:
            task.cancel()
            raise
        except Exception as e:  # redis.RedisError, OSError, a script error: all "Redis failed"
            self._down(f"{type(e).__name__}: {_first_line(e)}")
            return self._fell_back(name)
        if timer.cancelled_caught:
            task.cancel()  # its connection is closed as the task unwinds (redis-py does)
            if bound >= self.config.op_timeout:  # Redis's fault, not a call out of time
                self._down(f"no answer within op_timeout={self.config.op_timeout:g}s")
            return self._fell_back(name)
        self._up()
        return result

    def submit(
        self,
        name: str,
        script: str,
        args: Sequence[object],
        *,
        on_result: Callable[[Any], None] | None = None,
    ) -> None:
        """Run one script in the background, bounded by ``op_timeout`` (releases, outcomes:
        they happen where no one can await). Skipped while Redis is known to be down;
        whatever it would have freed expires by itself. ``on_result`` gets the answer."""
        if self.health is Health.LOCAL and now() < self._retry_at:
            self._fell_back(name)
            return
        if not self._on_asyncio():
            return
        task = self._start(script, args)
        timer = asyncio.get_running_loop().call_later(self.config.op_timeout, task.cancel)

        def settle(t: asyncio.Task[Any]) -> None:
            timer.cancel()
            if t.cancelled():
                self._down(f"no answer within op_timeout={self.config.op_timeout:g}s")
            elif (error := t.exception()) is not None:
                self._down(f"{type(error).__name__}: {_first_line(error)}")
            else:
                self._up()
                if on_result is not None:
                    on_result(t.result())

        task.add_done_callback(settle)

    def _start(self, script: str, args: Sequence[object]) -> asyncio.Task[Any]:
        client = self._connect()
        runner = self._scripts.get(script)
        if runner is None:
            runner = self._scripts[script] = client.register_script(script)
        task = asyncio.get_running_loop().create_task(runner(args=list(args), client=client))
        self._tasks.add(task)
        task.add_done_callback(self._forget)
        return task

    def _forget(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: the caller already logged what it meant

    def _connect(self) -> Any:
        if self._client is None:
            import redis.asyncio
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff

            bound = self.config.op_timeout
            # A blocking pool: past 64 connections an operation waits for one (inside its
            # own bound) where the default pool would raise at once.
            pool = redis.asyncio.BlockingConnectionPool.from_url(
                self.config.url,
                max_connections=64,
                timeout=None,
                socket_timeout=bound,
                socket_connect_timeout=bound,
                retry=Retry(NoBackoff(), 0),  # one try: falling back is our retry
                health_check_interval=0,
            )
            self._client = redis.asyncio.Redis.from_pool(pool)
        return self._client

    def _on_asyncio(self) -> bool:
        try:
            asyncio.get_running_loop()
            return True
        except RuntimeError:
            pass
        if self.health is not Health.LOCAL:
            self._down("redis-py runs on asyncio only; this loop is not asyncio")
        self._retry_at = math.inf
        return False

    # -- health -----------------------------------------------------------------------------

    def _fell_back(self, name: str) -> Any:
        self._fallbacks.add(1, {"stallproof.shared.operation": name})
        return UNAVAILABLE

    def _down(self, reason: str) -> None:
        self._retry_at = now() + self.config.retry_interval
        if self.health is not Health.LOCAL:
            self.health, self.reason = Health.LOCAL, reason
            self._transitions.add(1, {"stallproof.shared.health": "local"})
            logger.warning(
                "stallproof: fleet state on Redis (prefix %r) unavailable (%s); using %s until"
                " it is back (fail=%s)",
                self.config.prefix,
                reason,
                "local state" if self.config.fail == "open" else "refusals",
                self.config.fail,
            )

    def _up(self) -> None:
        if self.health is not Health.SHARED:
            if self.health is Health.LOCAL:
                self._transitions.add(1, {"stallproof.shared.health": "shared"})
                logger.warning(
                    "stallproof: fleet state on Redis (prefix %r) is back; resynchronised",
                    self.config.prefix,
                )
            self.health, self.reason = Health.SHARED, ""

    async def settle(self) -> None:
        """Wait (at most ``op_timeout``) for the background operations sent so far
        (releases, outcomes) to be answered or given up."""
        with anyio.move_on_after(self.config.op_timeout, shield=True):
            for task in list(self._tasks):
                await asyncio.wait({task})

    async def aclose(self) -> None:
        """Wait (at most ``op_timeout``) for background operations, then close the client."""
        await self.settle()
        for task in list(self._tasks):
            task.cancel()
        client, self._client = self._client, None
        if client is not None:
            with anyio.move_on_after(self.config.op_timeout, shield=True):
                await client.aclose()


class Stores:
    """The `SharedStore`s of one client, one per `RedisState`: a pacer and a breaker given
    the same settings share one connection pool and one health (one failure, one log line)."""

    def __init__(self, meter_provider: metrics.MeterProvider | None = None) -> None:
        self._meter_provider = meter_provider
        self._stores: dict[RedisState, SharedStore] = {}

    async def settle(self) -> None:
        """`SharedStore.settle` for each store: each waits at most its ``op_timeout``."""
        for store in list(self._stores.values()):
            await store.settle()

    def get(self, config: RedisState) -> SharedStore:
        store = self._stores.get(config)
        if store is None:
            store = self._stores[config] = SharedStore(config, meter_provider=self._meter_provider)
        return store


def now() -> float:
    """The loop's clock (`anyio.current_time`), also inside asyncio callbacks, where anyio
    cannot tell which library runs the loop."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return anyio.current_time()


def _first_line(error: BaseException) -> str:
    # redis-py's messages name host:port, never the password.
    text = str(error).splitlines()
    return text[0][:200] if text else ""
