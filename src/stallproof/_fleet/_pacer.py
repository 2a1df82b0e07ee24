"""`FleetPacer`: the fleet side of a `Pacer` with ``shared=RedisState(...)``.

A call that the process's own pacer would send also needs a grant from Redis: a
concurrency lease, the request and token windows, the adaptive limit, fair turns between
agents across processes. The answer is `UNAVAILABLE` when Redis does not answer in time;
the caller then goes on with its own state (``fail="open"``) or refuses (``fail="closed"``).
Releases and overload reports are sent in the background (bounded): a lease that could not
be released expires by itself at its call's deadline, or ``lease_ttl``, whichever is first.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import anyio

from .._exceptions import PacerTimeout
from . import _scripts as lua
from ._store import UNAVAILABLE, SharedStore

if TYPE_CHECKING:
    from .._policies import Pacer
    from ._breaker import FleetBreaker, FleetVerdict

__all__ = ["FleetLease", "FleetPacer"]


def _agent_key(agent: str | None) -> str:
    # Never empty, never ambiguous between "no agent" and an agent named like the marker.
    return "-" if agent is None else "a:" + agent


class FleetLease:
    """One call's grant from the fleet; released once, in the background. ``verdict``:
    the fleet breaker's answer for the call's first attempt, when it came in the same
    round trip (`FLEET_ADMIT`)."""

    __slots__ = ("_done", "_fleet", "epoch", "id", "verdict")

    def __init__(
        self, fleet: FleetPacer, lease_id: str, epoch: int, verdict: FleetVerdict | None = None
    ) -> None:
        self._fleet = fleet
        self.id = lease_id
        self.epoch = epoch
        self.verdict = verdict
        self._done = False

    def release(
        self, *, used_tokens: int | None, overloaded: bool, succeeded: bool, refund: bool
    ) -> None:
        if not self._done:
            self._done = True
            self._fleet._report(self, True, used_tokens, overloaded, succeeded, refund)

    def overload(self) -> None:
        if not self._done:
            self._fleet._report(self, False, None, True, False, False)


class FleetPacer:
    """Fleet-wide admission for one `Pacer` (see the module docstring)."""

    def __init__(self, policy: Pacer, store: SharedStore) -> None:
        self.policy = policy
        self.store = store
        self._prefix = store.key + ":pacer"
        # Set when this process releases a lease: its own waiters ask again at once rather
        # than at their next poll (other processes' releases are seen by polling).
        self._released: anyio.Event | None = None

    def _poke(self, answer: object = None) -> None:
        released, self._released = self._released, None
        if released is not None:
            released.set()

    async def _nap(self, seconds: float) -> None:
        if self._released is None:
            self._released = anyio.Event()
        with anyio.move_on_after(seconds):
            await self._released.wait()

    async def acquire(
        self,
        *,
        agent: str | None,
        tokens: int,
        deadline: float,
        arrived: float,
        breaker: tuple[FleetBreaker, str] | None = None,
    ) -> FleetLease | None:
        """Wait for the fleet's grant, at most until ``deadline``.

        Returns None when Redis did not answer in time and ``fail="open"``: the caller
        goes on with its own pacer alone. With ``breaker`` (a fleet breaker and the
        upstream) on the same store, the grant's round trip also takes the breaker's
        verdict for the first attempt (`FleetLease.verdict`): one round trip, not two.

        Raises:
            PacerTimeout: the deadline passed in the fleet's queue, or the fleet's windows
                show capacity cannot come before it.
            SharedStateUnavailable: Redis did not answer and ``fail="closed"``.
        """
        policy, config, store = self.policy, self.store.config, self.store
        wid = store.new_id()
        weights = policy.weights or {}
        weight = 1.0 if agent is None else weights.get(agent, 1.0)
        # A waiter that stops asking (its worker died) leaves the queue after this.
        longest_sleep = max(1.0, config.poll_interval)
        waiter_ms = math.ceil((2 * longest_sleep + 2 * config.op_timeout) * 1000)
        key = _agent_key(agent)
        queued = False
        fleet_breaker = breaker[0] if breaker is not None and breaker[0].store is store else None
        script, name = lua.PACER_ACQUIRE, "pacer.acquire"
        if fleet_breaker is not None:
            script, name = lua.FLEET_ADMIT, "fleet.admit"
        try:
            while True:
                now = anyio.current_time()
                if now >= deadline:
                    raise self._timeout(agent, arrived, deadline, now, "")
                lease_s = min(deadline - now, config.lease_ttl) + config.op_timeout
                args = [
                    self._prefix,
                    wid,
                    key,
                    repr(float(weight)),
                    tokens,
                    policy.max_concurrent or 0,
                    repr(float(policy.requests_per_minute or 0)),
                    repr(float(policy.tokens_per_minute or 0)),
                    math.ceil(lease_s * 1000),
                    waiter_ms,
                    1 if policy.adaptive else 0,
                ]
                breaker_args: list[object] = []
                if fleet_breaker is not None and breaker is not None:
                    breaker_args = fleet_breaker.admit_args(breaker[1], deadline)
                answer = await store.run(name, script, args + breaker_args, deadline=deadline)
                if answer is UNAVAILABLE:
                    if store.fail_closed:
                        raise store.unavailable_error("not sent")
                    if queued:  # best effort; its entry expires by itself otherwise
                        store.submit("pacer.leave", lua.PACER_LEAVE, [self._prefix, wid, key])
                    return None
                queued = True
                granted, wait_ms = int(answer[0]), int(answer[1])
                if granted:
                    queued = False
                    verdict = None
                    if fleet_breaker is not None and len(answer) >= 6:
                        verdict = fleet_breaker.verdict(answer[3:6], breaker_args)
                    return FleetLease(self, wid, int(answer[2]), verdict)
                now = anyio.current_time()
                if wait_ms >= 0:  # our turn; a rate window frees capacity in wait_ms
                    ready = now + wait_ms / 1000
                    if ready >= deadline:
                        raise self._timeout(
                            agent,
                            arrived,
                            deadline,
                            now,
                            f"the fleet's per-minute limits free capacity in {wait_ms / 1000:.3f}s",
                        )
                    nap = min(wait_ms / 1000, longest_sleep)
                else:  # not our turn, or every concurrency slot of the fleet is leased
                    nap = config.poll_interval
                await self._nap(max(0.0, min(nap, deadline - now)))
        except BaseException:
            if queued:
                store.submit("pacer.leave", lua.PACER_LEAVE, [self._prefix, wid, key])
            raise

    def _timeout(
        self, agent: str | None, arrived: float, deadline: float, now: float, why: str
    ) -> PacerTimeout:
        who = "no agent" if agent is None else f"agent {agent!r}"
        if why:
            what = (
                f"not sent: {why} but only {deadline - now:.3f}s of the call's total budget is left"
            )
        else:
            what = (
                f"waited {now - arrived:.3f}s in the fleet's pacer queue; the call's total"
                " budget ran out before it was sent"
            )
        return PacerTimeout(
            f"{what} ({who})",
            agent=agent,
            ahead=0,
            waited=now - arrived,
            limit=deadline - arrived,
            elapsed=now - arrived,
            phase="pacer queue",
        )

    def _report(
        self,
        lease: FleetLease,
        release: bool,
        used_tokens: int | None,
        overloaded: bool,
        succeeded: bool,
        refund: bool,
    ) -> None:
        policy = self.policy
        self.store.submit(
            "pacer.release",
            lua.PACER_RELEASE,
            [
                self._prefix,
                lease.id,
                int(release),
                -1 if used_tokens is None else used_tokens,
                int(overloaded),
                int(succeeded),
                int(refund),
                policy.max_concurrent or 0,
                int(policy.adaptive),
                policy.min_concurrent,
                repr(float(policy.decrease_factor)),
                repr(float(policy.increase_step)),
                lease.epoch,
            ],
            on_result=self._poke if release else None,
        )
