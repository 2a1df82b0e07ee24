"""Client-side pacing: a concurrency limit, per-minute request and token limits, a fair
queue between agents and an adaptive limit, all inside the call's total deadline.

Harnesses put a pacer in front of their LLM calls. One that waits without a bound is one
more place to hang, and one that serves first come, first served lets a chatty agent starve
the rest. `PacerRuntime.acquire` waits at most until the call's deadline, fails at once when the
per-minute schedule shows the call cannot go in time, and serves agents in turn.

The rules (defaults in brackets):

* **Capacity.** A call may go when (1) fewer permits are held than the current limit,
  (2) the grants of the last 60 seconds (a sliding window, not reset on the minute) number
  fewer than ``requests_per_minute``, and (3) their tokens plus this call's estimate fit in
  ``tokens_per_minute``; a call's estimate is replaced by its real usage when it is known.
  A call that alone needs more than ``tokens_per_minute`` goes when the window is empty.
* **Fairness: deficit round robin.** Each agent has a FIFO queue (calls without an agent
  share one). Agents with queued calls take turns in the order they arrived. On its turn an
  agent gains its weight [1] in credit and is granted one call per whole credit; then the
  turn passes. An agent whose queue empties loses its credit. The agent whose turn it is is
  served first even if a later, smaller request would fit now, so a big request cannot be
  starved. Bound, equal weights: between two grants to an agent that stays queued, every
  other agent is granted at most one call. Weighted: over n rounds an agent that stays
  queued gets more than n*w - 1 and at most n*w grants.
* **AIMD** (``adaptive`` and ``max_concurrent`` set): the limit starts at max_concurrent.
  A release with ``overloaded=True`` (429, 503, 529) multiplies it by ``decrease_factor``
  [0.5], rounded down, never below ``min_concurrent`` [1]; once per congestion event:
  permits granted before the last decrease do not decrease it again. Each window of
  successes (as many successful releases as the current limit) adds ``increase_step`` [1],
  up to max_concurrent: 8 -> 4 -> 2 -> 1, and back to 8 after 1+2+...+7 = 28 successes.
  Cancellations and other failures leave the limit alone.

With ``shared=RedisState(...)`` every rule above also holds across the processes that
share it: a call granted here still needs the fleet's grant (`_fleet.FleetPacer`), and
falls back to this process's state alone when Redis does not answer in time.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math

import anyio
import anyio.lowlevel

from . import _exceptions as exc
from ._exceptions import PacerTimeout
from ._fleet import FleetBreaker, FleetLease, FleetPacer, FleetVerdict, Stores
from ._policies import Pacer
from ._validate import invalid, is_int, is_number

__all__ = [
    "OVERLOAD_STATUSES",
    "PacerState",
    "PacerTimeout",
    "PacerRuntime",
    "Permit",
    "is_overload",
]

#: Answers that mean "the server is overloaded": they shrink the adaptive limit.
OVERLOAD_STATUSES = frozenset({429, 503, 529})
_MINUTE = 60.0


def is_overload(error: BaseException | None) -> bool:
    """Whether ``error`` is an answer that should shrink the adaptive limit (429/503/529)."""
    return isinstance(error, exc.APIStatusError) and error.status_code in OVERLOAD_STATUSES


@dataclasses.dataclass(frozen=True, slots=True)
class PacerState:
    """A snapshot of a client's pacer, from `Client.pacer_state()`."""

    limit: int | None  # the concurrency limit now (AIMD-adjusted); None: no limit
    in_use: int  # permits held
    queued: dict[str | None, int]  # calls waiting, per agent (None: calls without an agent)
    requests_available: int | None  # grants the request windows allow now; None: no limit
    tokens_available: int | None  # estimated tokens the token windows allow now
    overloads: int  # overloaded releases reported so far
    shared: str | None = None  # "redis", "local (why)" while Redis fails; None: not shared


# -- rate windows ---------------------------------------------------------------------------


class _Entry:
    """One grant's amount (1 request, or its tokens); corrections change it in place."""

    __slots__ = ("amount", "time")

    def __init__(self, time: float, amount: int) -> None:
        self.time = time
        self.amount = amount


class _Window:
    """One per-minute limit: the grants of the last 60 seconds may not pass ``capacity``."""

    __slots__ = ("capacity", "log", "name", "used")

    def __init__(self, name: str, capacity: float) -> None:
        self.name = name
        self.capacity = capacity
        self.log: collections.deque[_Entry] = collections.deque()
        self.used = 0  # the sum of the amounts in `log`

    def expire(self, now: float) -> None:
        while self.log and self.log[0].time + _MINUTE <= now:
            self.used -= self.log.popleft().amount

    def ready_at(self, amount: int, now: float) -> float:
        """When ``amount`` fits, if nothing else is granted meanwhile."""
        self.expire(now)
        excess = self.used + min(amount, self.capacity) - self.capacity
        for entry in self.log:
            if excess <= 0:
                break
            excess -= entry.amount
            now = entry.time + _MINUTE
        return now

    def take(self, amount: int, now: float) -> _Entry:
        entry = _Entry(now, amount)
        self.log.append(entry)
        self.used += amount
        return entry

    def correct(self, entry: _Entry, amount: int, now: float) -> None:
        self.expire(now)
        if entry.time + _MINUTE > now:  # still in the window
            self.used += amount - entry.amount
        entry.amount = amount

    def available(self, now: float) -> int:
        self.expire(now)
        return max(0, math.floor(self.capacity - self.used))


# -- permits and the queue ------------------------------------------------------------------


class Permit:
    """Leave to send one call. Release it once, from the event loop; later releases do
    nothing. ``with permit:`` releases it on exit: success if the block ended normally,
    overloaded if it raised a 429/503/529 `APIStatusError`, no outcome otherwise.
    """

    __slots__ = (
        "_epoch",
        "_fleet",
        "_pacing",
        "_released",
        "_requests",
        "_tokens",
        "agent",
        "estimated_tokens",
        "waited",
    )

    def __init__(self, pacing: PacerRuntime, waiter: _Waiter, now: float) -> None:
        self._pacing = pacing
        self.agent = waiter.agent
        self.estimated_tokens = waiter.tokens
        self.waited = now - waiter.arrived  # seconds spent in the queue
        # Its entries in the rate windows, corrected in place by `release`.
        self._requests = pacing._rpm.take(1, now) if pacing._rpm else None
        self._tokens = pacing._tpm.take(waiter.tokens, now) if pacing._tpm else None
        self._epoch = pacing._epoch
        self._released = False
        self._fleet: FleetLease | None = None  # the fleet's grant, when shared

    @property
    def released(self) -> bool:
        return self._released

    @property
    def fleet_verdict(self) -> FleetVerdict | None:
        """The fleet breaker's verdict for the first attempt, when the fleet's grant
        carried it (`PacerRuntime.acquire` with ``breaker``)."""
        return None if self._fleet is None else self._fleet.verdict

    def release(
        self, *, used_tokens: int | None = None, overloaded: bool = False, succeeded: bool = False
    ) -> None:
        """Give the slot back and say how the call went.

        Args:
            used_tokens: the call's real token count (``usage.total_tokens``); it replaces
                the estimate in the token windows. None keeps the estimate.
            overloaded: the server answered 429, 503 or 529: the adaptive limit shrinks.
            succeeded: the call got its answer: it counts towards growing the limit back.

        With neither flag (cancelled, timed out, any other error) the limit is unchanged.
        """
        if self._released:
            return
        self._released = True
        bad = used_tokens is not None and not (is_int(used_tokens) and used_tokens >= 0)
        self._pacing._release(self, None if bad else used_tokens, overloaded, succeeded)
        if self._fleet is not None:
            self._fleet.release(
                used_tokens=None if bad else used_tokens,
                overloaded=overloaded,
                succeeded=succeeded,
                refund=False,
            )
        if bad:  # the slot is back all the same: a bad report must not leak a permit
            raise invalid("used_tokens", "None or an int >= 0", used_tokens)

    def overload(self) -> None:
        """Report a 429/503/529 answer to one attempt while the call goes on (a retry):
        the adaptive limit shrinks as for ``release(overloaded=True)``; the permit stays
        held. Ignored once released."""
        if not self._released:
            self._pacing._overload(self)
            if self._fleet is not None:
                self._fleet.overload()

    def _abandon(self) -> None:
        # Granted to a caller that left before it could use it: nothing was sent.
        if not self._released:
            self._released = True
            self._pacing._release(self, None, False, False, refund=True)
            if self._fleet is not None:
                self._fleet.release(
                    used_tokens=None, overloaded=False, succeeded=False, refund=True
                )

    def __enter__(self) -> Permit:
        return self

    def __exit__(self, exc_type: object, error: BaseException | None, tb: object) -> None:
        self.release(overloaded=is_overload(error), succeeded=error is None)


class _Waiter:
    __slots__ = ("agent", "arrived", "deadline", "event", "permit", "tokens", "wake_at")

    def __init__(self, agent: str | None, tokens: int, deadline: float, now: float) -> None:
        self.agent = agent
        self.tokens = tokens
        self.deadline = deadline
        self.arrived = now
        self.event = anyio.Event()  # set on grant, or to make it re-read `wake_at`
        self.permit: Permit | None = None
        self.wake_at = math.inf  # when a rate window frees up for it (head of the turn only)


class PacerRuntime:
    """The running state of a `Pacer`, shared by every call of one client.

    It belongs to one event loop (waiters sleep on anyio events) and never blocks it: state
    changes are synchronous, and each waiter sleeps until its own deadline at most.
    """

    def __init__(self, policy: Pacer, *, stores: Stores | None = None) -> None:
        self.policy = policy
        self._fleet = (
            None
            if policy.shared is None
            else FleetPacer(policy, (stores or Stores()).get(policy.shared))
        )
        most = policy.max_concurrent
        self._limit = math.inf if most is None else float(most)
        self._epoch = 0  # bumped on every decrease: one decrease per congestion event
        self._successes = 0
        self._overloads = 0
        self._in_use = 0
        rpm, tpm = policy.requests_per_minute, policy.tokens_per_minute
        self._rpm = None if rpm is None else _Window("requests_per_minute", rpm)
        self._tpm = None if tpm is None else _Window("tokens_per_minute", tpm)
        self._queues: dict[str | None, collections.deque[_Waiter]] = {}
        self._ring: collections.deque[str | None] = collections.deque()  # ring[0]: the turn
        self._credit: dict[str | None, float] = {}
        self._last_now = 0.0

    def _now(self) -> float:
        """The loop's clock. A release may come from a finaliser where no loop runs (a
        stream dropped unread, freed at teardown or in another thread): then the latest time
        this pacer read, a little stale, so that giving a permit back never raises."""
        with contextlib.suppress(Exception):  # anyio's or sniffio's "no event loop here"
            self._last_now = anyio.current_time()
        return self._last_now

    @property
    def limit(self) -> int | None:
        """The concurrency limit now (None: none)."""
        if math.isinf(self._limit):
            return None
        return max(self.policy.min_concurrent, int(self._limit + 1e-9))

    def snapshot(self) -> PacerState:
        now = anyio.current_time()
        return PacerState(
            limit=self.limit,
            in_use=self._in_use,
            queued={agent: len(q) for agent, q in self._queues.items()},
            requests_available=None if self._rpm is None else self._rpm.available(now),
            tokens_available=None if self._tpm is None else self._tpm.available(now),
            overloads=self._overloads,
            shared=self.shared_status(),
        )

    def shared_status(self) -> str | None:
        """Where fleet answers come from now: "redis", "local (why)"; None: not shared."""
        return None if self._fleet is None else self._fleet.store.describe()

    async def aclose(self) -> None:
        """Close the connection to the fleet state, if any (bounded)."""
        if self._fleet is not None:
            await self._fleet.store.aclose()

    async def acquire(
        self,
        *,
        agent: str | None,
        estimated_tokens: int,
        deadline: float,
        breaker: tuple[FleetBreaker, str] | None = None,
    ) -> Permit:
        """Wait for leave to send one call, at most until ``deadline``.

        Args:
            agent: who calls; agents take turns. None: the shared default queue.
            estimated_tokens: what the call counts against ``tokens_per_minute``
                (`Pacer.estimate_tokens`); `Permit.release` corrects it.
            deadline: the call's total deadline, on `anyio.current_time`'s clock.
            breaker: the call's fleet breaker and upstream: when it shares this pacer's
                Redis, the fleet's grant brings its verdict too (`Permit.fleet_verdict`).

        Raises:
            PacerTimeout: the deadline passed in the queue; or, at once, the per-minute
                windows show that capacity cannot arrive before it.
            InvalidRequestError: a bad argument.
            SharedStateUnavailable: shared on Redis with ``fail="closed"``, and Redis did
                not answer in time.

        A caller cancelled while it waits leaves the queue and takes nothing.
        """
        if agent is not None and not isinstance(agent, str):
            raise invalid("agent", "None or a str", agent)
        if not (is_int(estimated_tokens) and estimated_tokens >= 0):
            raise invalid("estimated_tokens", "an int >= 0", estimated_tokens)
        if not is_number(deadline):
            raise invalid("deadline", "a finite time on anyio.current_time()'s clock", deadline)
        await anyio.lowlevel.checkpoint()
        now = self._now()
        waiter = _Waiter(agent, estimated_tokens, deadline, now)
        self._check_in_time(waiter, now)
        self._enqueue(waiter)
        self._dispatch(now)
        try:
            while (permit := waiter.permit) is None:
                with anyio.CancelScope(deadline=min(deadline, waiter.wake_at)):
                    await waiter.event.wait()
                if waiter.permit is not None:
                    continue
                if waiter.event.is_set():  # poked: sleep again with the new wake_at
                    waiter.event = anyio.Event()
                now = self._now()
                if now >= waiter.wake_at:
                    waiter.wake_at = math.inf
                self._check_in_time(waiter, now)
                self._dispatch(now)
        except BaseException:
            if waiter.permit is not None:
                waiter.permit._abandon()  # granted as we were cancelled: give it all back
            else:
                self._remove(waiter)
            raise
        if self._fleet is not None:
            try:
                permit._fleet = await self._fleet.acquire(
                    agent=agent,
                    tokens=estimated_tokens,
                    deadline=deadline,
                    arrived=waiter.arrived,
                    breaker=breaker,
                )
            except BaseException:
                permit._abandon()  # not sent: the local grant goes back as if never made
                raise
        return permit

    # -- internals: every method below runs without awaiting, so none can be interrupted --

    def _check_in_time(self, waiter: _Waiter, now: float) -> None:
        left = waiter.deadline - now
        if left > 0:
            ready, rate = self._ready_at(waiter.tokens, now)
            if rate is None or ready < waiter.deadline:
                return
            what = (
                f"not sent: {rate.name}={rate.capacity:g} frees capacity in"
                f" {ready - now:.3f}s but only {left:.3f}s of the call's total budget is left"
            )
        else:
            what = f"waited {now - waiter.arrived:.3f}s in the pacer queue"
        queue = self._queues.get(waiter.agent, ())
        ahead = queue.index(waiter) if waiter in queue else len(queue)
        who = "no agent" if waiter.agent is None else f"agent {waiter.agent!r}"
        what += f" ({who}, {ahead} ahead)"
        if left <= 0:
            what += "; the call's total budget ran out before it was sent"
        raise PacerTimeout(
            what,
            agent=waiter.agent,
            ahead=ahead,
            waited=now - waiter.arrived,
            limit=waiter.deadline - waiter.arrived,
            elapsed=now - waiter.arrived,
            phase="pacer queue",
        )

    def _ready_at(self, tokens: int, now: float) -> tuple[float, _Window | None]:
        """When the rate windows let a call of ``tokens`` go, and which limit holds it."""
        ready, holding = now, None
        for rate, amount in ((self._rpm, 1), (self._tpm, tokens)):
            if rate is not None and (at := rate.ready_at(amount, now)) > ready:
                ready, holding = at, rate
        return ready, holding

    def _enqueue(self, waiter: _Waiter) -> None:
        queue = self._queues.get(waiter.agent)
        if queue is None:
            queue = self._queues[waiter.agent] = collections.deque()
            self._credit[waiter.agent] = 0.0
            self._ring.append(waiter.agent)  # a new agent waits at most one round
            if len(self._ring) == 1:
                self._next_turn()
        queue.append(waiter)

    def _next_turn(self) -> None:
        # ring[0] takes the turn and gains its weight; an agent still short of one credit
        # keeps what it has and passes.
        weights = self.policy.weights or {}
        while self._ring:
            agent = self._ring[0]
            self._credit[agent] += 1.0 if agent is None else weights.get(agent, 1.0)
            if self._credit[agent] >= 1 - 1e-9:
                return
            self._ring.rotate(-1)

    def _leave(self, agent: str | None) -> None:
        del self._queues[agent], self._credit[agent]
        if self._ring[0] == agent:
            self._ring.popleft()
            self._next_turn()
        else:
            self._ring.remove(agent)

    def _remove(self, waiter: _Waiter) -> None:
        queue = self._queues[waiter.agent]
        queue.remove(waiter)
        if not queue:
            self._leave(waiter.agent)
        self._dispatch(self._now())  # it may have been what blocked the others

    def _dispatch(self, now: float) -> None:
        """Grant queued calls in turn while capacity lasts; time the next try if a rate
        window blocks the call whose turn it is."""
        limit = self.limit
        while self._ring and (limit is None or self._in_use < limit):
            agent = self._ring[0]
            queue = self._queues[agent]
            waiter = queue[0]
            ready, _ = self._ready_at(waiter.tokens, now)
            if ready > now:
                if waiter.wake_at != ready:
                    waiter.wake_at = ready
                    waiter.event.set()
                return
            queue.popleft()
            self._in_use += 1
            waiter.permit = Permit(self, waiter, now)
            waiter.event.set()
            self._credit[agent] -= 1
            if not queue:
                self._leave(agent)
            elif self._credit[agent] < 1 - 1e-9:
                self._ring.rotate(-1)
                self._next_turn()

    def _release(
        self,
        permit: Permit,
        used_tokens: int | None,
        overloaded: bool,
        succeeded: bool,
        refund: bool = False,
    ) -> None:
        now = self._now()
        self._in_use -= 1
        tokens = 0 if refund else used_tokens
        if tokens is not None and self._tpm is not None and permit._tokens is not None:
            self._tpm.correct(permit._tokens, tokens, now)
        if refund and self._rpm is not None and permit._requests is not None:
            self._rpm.correct(permit._requests, 0, now)
        adaptive, most = self.policy.adaptive, self.policy.max_concurrent
        if overloaded:
            self._overload(permit)
        elif succeeded and adaptive and most is not None and self._limit < most:
            self._successes += 1
            if self._successes >= (self.limit or 1):  # a window of successes
                self._successes = 0
                self._limit = min(self._limit + self.policy.increase_step, most)
        self._dispatch(now)

    def _overload(self, permit: Permit) -> None:
        self._overloads += 1
        policy = self.policy
        if policy.adaptive and policy.max_concurrent is not None and permit._epoch == self._epoch:
            decreased = math.floor(self._limit * policy.decrease_factor)
            self._limit = float(max(policy.min_concurrent, decreased))
            self._epoch += 1  # permits granted before now are part of this event
            self._successes = 0
