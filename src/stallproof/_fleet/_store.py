"""Fleet state on Redis: the config (`RedisState`) and the store every operation goes through.

Redis is one more upstream that can be slow, down or stalled, so the store treats it like
one. The operations asked for in one loop turn go to Redis as one pipeline (a *batch*, in a
task of its own, on one pooled connection: at most `_MAX_BATCHES` at once), so hundreds of
calls in flight need a handful of connections, not one each. A batch is bounded by
``op_timeout`` of Redis's silence: the time this loop was late (`LoopLag`) is not counted,
and an answer already read when the bound runs out is still taken. When the bound fires
the batch is cancelled and left to close its connection, and its callers go on at once
with the answer `UNAVAILABLE`; a caller is bounded by its own deadline too. The caller
then uses its in-process state (``fail="open"``) or refuses the call with
`SharedStateUnavailable` (``fail="closed"``).

After a failure the store does not try Redis again for ``retry_interval``: a dead Redis
costs the first call at most ``op_timeout``, and the calls after it nothing. The first
operation that succeeds after that resynchronises: fleet state is the authority again.
Every change of health is one log line on the ``stallproof`` logger and one count on the
``stallproof.shared.transitions`` metric; every operation that fell back counts on
``stallproof.shared.fallbacks``. Background operations (releases, outcomes) are never
skipped: while Redis is down they are kept and sent when it is tried again, for
`SharedStore.keep` at most; one given up counts on ``stallproof.shared.dropped``.

redis-py's client is asyncio only. Under trio the store is always unavailable (one log
line says why) and every call runs on local state.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import hashlib
import logging
import math
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import anyio
from opentelemetry import metrics

from .. import _exceptions as exc
from .._policies import RedisState
from ._lag import LoopLag

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

# Pipelines in flight at once (each holds one connection), and operations per pipeline.
_MAX_BATCHES = 8
_MAX_BATCH = 512
# How long background operations wait for a caller's to go with (see `_schedule_flush`).
_BACKGROUND_DELAY = 0.005
# Loop turns a bound that ran out waits for an answer already read (see `_wait`).
_HANDOVER_TURNS = 4
# Background operations kept while Redis is down; past this, new ones are dropped.
_MAX_DEFERRED = 10_000


class _RedisFailed(Exception):
    """Why a batch got no answer (its operations fall back)."""


class _Op:
    """One script to run: awaited by a caller (``future``), or sent in the background
    (``on_result``, kept through failures until ``until``)."""

    __slots__ = ("args", "batch", "future", "name", "on_result", "script", "sent", "until")

    def __init__(
        self,
        name: str,
        script: str,
        args: Sequence[object],
        *,
        future: asyncio.Future[Any] | None = None,
        on_result: Callable[[Any], None] | None = None,
        until: float = math.inf,
    ) -> None:
        self.name = name
        self.script = script
        self.args = args
        self.future = future
        self.on_result = on_result
        self.until = until
        self.batch: list[_Op] = []  # the ops sent with it, and the task sending them
        self.sent: asyncio.Task[Any] | None = None

    @property
    def wanted(self) -> bool:
        """False once its caller stopped waiting: it is not sent."""
        return self.future is None or not self.future.done()


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
        self._shas: dict[str, str] = {}
        self._tasks: set[asyncio.Task[Any]] = set()  # batches in flight
        self._pending: list[_Op] = []  # operations of this loop turn, not sent yet
        self._flush_soon = False  # a flush of `_pending` is scheduled this turn
        self._flush_later: asyncio.TimerHandle | None = None  # ... or after a short delay
        self._batches = 0
        self._deferred: collections.deque[_Op] = collections.deque()  # kept while down
        self._resend_at: asyncio.TimerHandle | None = None
        self._closing = False
        self._lag = LoopLag(tick=min(0.01, config.op_timeout / 10))
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
        self._dropped = meter.create_counter(
            "stallproof.shared.dropped",
            unit="{operation}",
            description="Background fleet-state updates (releases, outcomes) given up:"
            " Redis did not take them within their time",
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
        """Run one script within ``op_timeout`` of Redis's silence and ``deadline``;
        `UNAVAILABLE` if it could not. Never raises for Redis's sake; the caller's own
        cancellation propagates."""
        await anyio.lowlevel.checkpoint()
        if self.health is Health.LOCAL and now() < self._retry_at:
            return self._fell_back(name)
        if not self._on_asyncio():
            return self._fell_back(name)
        start = now()
        if deadline - start <= 0:
            return self._fell_back(name)
        future = asyncio.get_running_loop().create_future()
        op = _Op(name, script, args, future=future)
        self._enqueue(op)
        try:
            # The batch that carries the op decides whether Redis failed (`_batch`, by
            # op_timeout); an op queued behind other batches fails as soon as one of them
            # finds Redis down. Twice op_timeout is only a backstop.
            await self._wait(future, start, 2 * self.config.op_timeout, deadline)
        finally:
            if not future.done():  # out of time or cancelled: the answer is not wanted
                future.cancel()
                if op.sent is not None and not any(o.wanted for o in op.batch):
                    op.sent.cancel()  # nobody wants its answers: it ends now
        if future.cancelled() or future.exception() is not None:
            return self._fell_back(name)
        return future.result()

    def submit(
        self,
        name: str,
        script: str,
        args: Sequence[object],
        *,
        on_result: Callable[[Any], None] | None = None,
    ) -> None:
        """Run one script in the background (releases, outcomes: they happen where no one
        can await), batched with the other operations of this loop turn. If Redis fails,
        it is kept and sent again when Redis is next tried, for ``keep`` seconds at most
        (see `SharedStore.keep`); then it is dropped (``stallproof.shared.dropped``) and
        whatever it would have freed expires by itself. ``on_result`` gets the answer."""
        if not self._on_asyncio():
            return
        op = _Op(name, script, args, on_result=on_result, until=now() + self.keep)
        if self.health is Health.LOCAL and now() < self._retry_at:
            self._defer(op)
        else:
            self._enqueue(op)

    @property
    def keep(self) -> float:
        """How long a background operation waits for Redis, through failures: long
        enough for two tries after ``retry_interval``."""
        return 2 * (self.config.retry_interval + self.config.op_timeout)

    async def _wait(
        self, future: asyncio.Future[Any], start: float, bound: float, deadline: float
    ) -> None:
        """Wait for ``future`` until ``deadline``, or until ``bound`` seconds after
        ``start`` not counting the time this loop was late (`LoopLag`): a loaded loop is
        not Redis's silence."""
        lag = self._lag
        lag.hold()
        try:
            late0 = lag.stalled(start)
            while not future.done():
                t = now()
                limit = min(deadline, start + bound + lag.stalled(t) - late0)
                if t >= limit:
                    break
                # (A timer and a waiter, no task or cancel scope: this is on every call's
                # path. Cancelling the wait leaves the future.)
                await asyncio.wait({future}, timeout=limit - t)
            # A timer runs in the loop turn that reads the socket, before the coroutine
            # that parses what was read: an answer that came in time may be in hand but
            # not yet handed over. A few more loop turns (each polls the sockets) hand it.
            for _ in range(_HANDOVER_TURNS):
                if future.done() or now() >= deadline:
                    break
                await asyncio.sleep(0)
        finally:
            lag.release()

    # -- batches: every operation of one loop turn goes to Redis as one pipeline ----------

    def _enqueue(self, op: _Op) -> None:
        self._pending.append(op)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        """A caller waits: flush at the end of this loop turn. Only background ops: flush
        within `_BACKGROUND_DELAY`, or with the next caller's op, whichever is first; on
        loopback each send wakes Redis at once, and a send on a call's path costs what
        Redis takes to run what it carries."""
        loop = asyncio.get_running_loop()
        if any(op.future is not None for op in self._pending):
            if not self._flush_soon:
                self._flush_soon = True
                loop.call_soon(self._flush)
        elif self._pending and self._flush_later is None and not self._flush_soon:
            self._flush_later = loop.call_later(_BACKGROUND_DELAY, self._flush)

    def _flush(self) -> None:
        self._flush_soon = False
        if self._flush_later is not None:
            self._flush_later.cancel()
            self._flush_later = None
        loop = asyncio.get_running_loop()
        while self._pending and self._batches < _MAX_BATCHES:
            ops = [op for op in self._pending[:_MAX_BATCH] if op.wanted]
            del self._pending[:_MAX_BATCH]
            if ops:
                self._batches += 1
                task = loop.create_task(self._batch(ops))
                self._tasks.add(task)
                task.add_done_callback(self._forget)

    async def _batch(self, ops: list[_Op]) -> None:
        """Send ``ops`` as one pipeline, bounded by ``op_timeout`` of Redis's silence;
        hand each op its answer, or, if Redis failed, fail or keep them."""
        sent = asyncio.get_running_loop().create_task(self._pipeline(ops))
        for op in ops:
            op.batch, op.sent = ops, sent
        try:
            await self._wait(sent, now(), self.config.op_timeout, math.inf)
        finally:
            self._batches -= 1
            if sent.cancelled():
                pass  # by its callers, who all stopped waiting: no news about Redis
            elif not sent.done():
                sent.cancel()  # its connection is closed as the task unwinds (redis-py does)
                reason = f"no answer within op_timeout={self.config.op_timeout:g}s"
                if self._closing:
                    reason = "the client was closed"
                self._failed(ops, reason)
            elif (error := sent.exception()) is not None:
                self._failed(ops, f"{type(error).__name__}: {_first_line(error)}")
            else:
                self._answered(ops, sent.result())
            for op in ops:  # (no cycle left through the batch)
                op.batch, op.sent = [], None
            self._schedule_flush()

    async def _pipeline(self, ops: list[_Op]) -> list[Any]:
        """One round trip (two when Redis has not seen a script yet: it loads it)."""
        from redis.exceptions import NoScriptError

        client = self._connect()
        answers = await self._send(client, ops)
        missing = [i for i, a in enumerate(answers) if isinstance(a, NoScriptError)]
        if missing:  # a new or restarted Redis: load what it lacks, run those again
            for script in {ops[i].script for i in missing}:
                await client.script_load(script)
            again = await self._send(client, [ops[i] for i in missing])
            for i, answer in zip(missing, again, strict=True):
                answers[i] = answer
        return answers

    async def _send(self, client: Any, ops: list[_Op]) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for op in ops:
            pipe.execute_command("EVALSHA", self._sha(op.script), 0, *op.args)
        return list(await pipe.execute(raise_on_error=False))

    def _sha(self, script: str) -> str:
        sha = self._shas.get(script)
        if sha is None:
            sha = self._shas[script] = hashlib.sha1(script.encode()).hexdigest()
        return sha

    def _answered(self, ops: list[_Op], answers: list[Any]) -> None:
        self._up()
        for op, answer in zip(ops, answers, strict=True):
            if isinstance(answer, Exception):  # a script error: Redis is not what we expect
                self._failed([op], f"{type(answer).__name__}: {_first_line(answer)}")
            elif op.future is not None:
                if not op.future.done():
                    op.future.set_result(answer)
            elif op.on_result is not None:
                op.on_result(answer)

    def _failed(self, ops: list[_Op], reason: str) -> None:
        """Redis failed these: callers hear it now; background ops wait for its return."""
        if not self._closing:
            self._down(reason)
            ops = [*ops, *self._pending]  # not sent yet: not sent to a Redis that is down
            self._pending.clear()
        for op in ops:
            if op.future is not None:
                if not op.future.done():
                    op.future.set_exception(_RedisFailed(reason))
            else:
                self._defer(op)

    def _defer(self, op: _Op) -> None:
        if self._closing or now() >= op.until or len(self._deferred) >= _MAX_DEFERRED:
            self._dropped.add(1, {"stallproof.shared.operation": op.name})
            return
        self._deferred.append(op)
        if self._resend_at is None:
            loop = asyncio.get_running_loop()
            self._resend_at = loop.call_at(max(self._retry_at, loop.time()), self._resend)

    def _resend(self) -> None:
        """Send the kept background ops again (Redis is tried again now)."""
        self._resend_at = None
        deferred, self._deferred = self._deferred, collections.deque()
        for op in deferred:
            if now() >= op.until:
                self._dropped.add(1, {"stallproof.shared.operation": op.name})
            else:
                self._enqueue(op)

    def _forget(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: the batch already said what it meant

    def _connect(self) -> Any:
        if self._client is None:
            import redis.asyncio
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff

            # Our bound (`_wait`, which does not count the loop's lateness) cancels a
            # batch that Redis left unanswered; redis-py's own timeouts, on the wall
            # clock, are only a backstop, far enough out that a loaded loop never trips
            # them first. One connection per batch in flight: the pool never runs out.
            backstop = 10 * self.config.op_timeout + 1.0
            pool = redis.asyncio.BlockingConnectionPool.from_url(
                self.config.url,
                max_connections=_MAX_BATCHES,
                timeout=None,
                socket_timeout=backstop,
                socket_connect_timeout=backstop,
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
            if self._deferred:  # what waited for Redis goes now
                if self._resend_at is not None:
                    self._resend_at.cancel()
                self._resend()

    async def settle(self) -> None:
        """Wait (at most ``op_timeout``) for the background operations sent so far
        (releases, outcomes) to be answered or given up; those kept while Redis is down
        are not waited for."""
        with anyio.move_on_after(self.config.op_timeout, shield=True):
            while self._tasks or self._pending:
                if self._pending and self._batches < _MAX_BATCHES:
                    self._flush()
                if self._tasks:
                    await asyncio.wait(set(self._tasks))
                else:
                    await anyio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        """Wait (at most ``op_timeout``) for background operations, then close the
        client; what is still unsent is dropped (and counted)."""
        await self.settle()
        self._closing = True
        if self._resend_at is not None:
            self._resend_at.cancel()
            self._resend_at = None
        for op in [*self._deferred, *self._pending]:
            if op.future is None:
                self._dropped.add(1, {"stallproof.shared.operation": op.name})
            elif not op.future.done():
                op.future.set_exception(_RedisFailed("the client was closed"))
        self._deferred.clear()
        self._pending.clear()
        if self._flush_later is not None:
            self._flush_later.cancel()
            self._flush_later = None
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            with anyio.move_on_after(self.config.op_timeout, shield=True):
                await asyncio.wait(set(self._tasks))
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
