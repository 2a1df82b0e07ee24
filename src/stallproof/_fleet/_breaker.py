"""`FleetBreaker`: the fleet side of a `Breaker` with ``shared=RedisState(...)``.

Redis decides whether a circuit admits an attempt, with one half-open probe for the whole
fleet; `UNAVAILABLE` when it does not answer in time (the caller then decides alone).
Outcomes are recorded in the background, bounded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from . import _scripts as lua
from ._store import UNAVAILABLE, SharedStore, now

if TYPE_CHECKING:
    from .._policies import Breaker

__all__ = ["FleetBreaker", "FleetVerdict"]


class FleetVerdict:
    """Redis's answer to one admission: go, be the probe, or refused for ``retry_in``."""

    __slots__ = ("retry_in", "state", "ticket_id", "verdict")

    def __init__(self, verdict: str, retry_in: float, state: str, ticket_id: str) -> None:
        self.verdict = verdict
        self.retry_in = retry_in
        self.state = state
        self.ticket_id = ticket_id


class FleetBreaker:
    """Fleet-wide circuit state for one `Breaker` (see the module docstring)."""

    def __init__(self, policy: Breaker, store: SharedStore) -> None:
        self.policy = policy
        self.store = store

    def _key(self, upstream: str) -> str:
        return f"{self.store.key}:cb:{upstream}"

    async def admit(self, upstream: str, *, deadline: float) -> FleetVerdict | None:
        """Redis's verdict, or None when it did not answer in time."""
        args = self.admit_args(upstream, deadline)
        answer = await self.store.run("breaker.admit", lua.BREAKER_ADMIT, args, deadline=deadline)
        if answer is UNAVAILABLE:
            return None
        return self.verdict(answer, args)

    def admit_args(self, upstream: str, deadline: float) -> list[object]:
        """`BREAKER_ADMIT`'s arguments (also sent with the pacer's, `FLEET_ADMIT`)."""
        # A probe holds the fleet's one slot until its call's deadline at most (max_open
        # when it has none): a probe whose worker died frees it by then.
        hold = deadline - now() + self.store.config.op_timeout
        if not math.isfinite(hold):
            hold = self.policy.max_open
        probe_ms = math.ceil(min(max(hold, 0.1), self.policy.max_open) * 1000)
        return [self._key(upstream), self.store.new_id(), probe_ms]

    @staticmethod
    def verdict(answer: Sequence[Any], args: Sequence[object]) -> FleetVerdict:
        """`BREAKER_ADMIT`'s answer, for the ticket of ``args`` (`admit_args`)."""
        verdict, ms, state = answer
        return FleetVerdict(_text(verdict), int(ms) / 1000, _text(state), str(args[1]))

    def record(
        self,
        upstream: str,
        ticket_id: str,
        outcome: str,
        open_for: float | None,
        on_state: Callable[[str, float], None],
    ) -> None:
        """Send one outcome ('success', 'failure', 'release') in the background."""
        policy = self.policy
        open_ms = -1 if open_for is None else math.ceil(min(open_for, policy.max_open) * 1000)

        def done(answer: Any) -> None:
            state, ms = answer
            on_state(_text(state), int(ms) / 1000)

        self.store.submit(
            "breaker.record",
            lua.BREAKER_RECORD,
            [
                self._key(upstream),
                ticket_id,
                outcome,
                open_ms,
                policy.fail_max,
                math.ceil(policy.reset_timeout * 1000),
                policy.success_threshold,
            ],
            on_result=done,
        )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
