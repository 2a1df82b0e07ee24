"""`CallScope`: the one owner of everything a logical call holds until it ends.

A call holds four things that must each be given back exactly once, on every exit —
success, error, timeout, cancellation, a stream closed half-read or dropped unread:

- its telemetry (the call span, the in-flight gauge, the duration metric);
- its pacer permit (concurrency slot, token estimate);
- its entry in the client's in-flight registry (`inflight()`);
- the breaker ticket of the attempt in progress.

The engine opens a scope when a call starts and hands it to whatever outlives `send`
(the response body of a stream). `end` is the only way out and runs once: a state
machine of two states, OPEN and ENDED, not a handful of flags that must agree.
"""

from __future__ import annotations

import enum
from collections.abc import MutableMapping
from typing import TYPE_CHECKING

from . import _exceptions as exc
from ._call import Call
from ._pacer import PacerRuntime, Permit, is_overload
from ._progress import Outcome

if TYPE_CHECKING:
    from ._breaker import Circuit, Ticket
    from ._fleet import FleetVerdict
    from ._telemetry import CallTelemetry

__all__ = ["CallScope"]


class _State(enum.Enum):
    OPEN = "open"
    ENDED = "ended"


class CallScope:
    """Owns one call's telemetry, pacer permit, registry entry and breaker ticket."""

    __slots__ = (
        "_before",
        "_circuit",
        "_permit",
        "_registry",
        "_state",
        "_ticket",
        "_verdict",
        "call",
        "telemetry",
    )

    def __init__(
        self, call: Call, telemetry: CallTelemetry, registry: MutableMapping[int, Call]
    ) -> None:
        self.call = call
        self.telemetry = telemetry
        self._registry = registry
        self._permit: Permit | None = None
        self._ticket: Ticket | None = None
        self._circuit: Circuit | None = None
        self._verdict: FleetVerdict | None = None  # the fleet breaker's, from the grant
        self._before = ""  # the circuit's state before the attempt's admission
        self._state = _State.OPEN
        call.telemetry = telemetry
        registry[id(call)] = call

    @property
    def ended(self) -> bool:
        return self._state is _State.ENDED

    # -- what the scope acquires along the way -------------------------------------------

    async def pace(
        self, pacing: PacerRuntime, estimated_tokens: int, circuit: Circuit | None = None
    ) -> None:
        """Wait for a pacer permit inside the call's deadline; the scope then holds it.
        With a ``circuit`` shared on the same Redis, the fleet's grant also brings the
        breaker's verdict for the first attempt (one round trip): `admit` uses it."""
        call = self.call
        call.set_phase("pacer queue")
        try:
            self._permit = await pacing.acquire(
                agent=call.agent,
                estimated_tokens=estimated_tokens,
                deadline=call.total_deadline,
                breaker=None if circuit is None else circuit.fleet,
            )
            self._verdict = self._permit.fleet_verdict
            if self._verdict is not None:
                self._circuit = circuit  # to give its probe slot back if unused (`end`)
        except (exc.PacerTimeout, exc.SharedStateUnavailable) as e:
            e.stallproof_request_id = call.request_id
            raise
        finally:
            call.shared = pacing.shared_status() or call.shared

    async def admit(self, circuit: Circuit | None) -> None:
        """Take the breaker ticket for the attempt about to start (None: no breaker);
        a shared circuit asks Redis, inside the call's deadline."""
        if circuit is not None:
            self._circuit = circuit
            self._before = circuit.state
            verdict, self._verdict = self._verdict, None  # the first attempt's only
            try:
                self._ticket = await circuit.admit(
                    deadline=self.call.total_deadline, verdict=verdict
                )
            finally:
                self.call.shared = circuit.shared_status() or self.call.shared

    def attempt_ended(self, error: BaseException | None, status: int | None = None) -> None:
        """Settle the attempt's ticket and telemetry; an overload answer slows the pacer."""
        self.telemetry.attempt_ended(error, status)
        if error is not None and self._permit is not None and is_overload(error):
            self._permit.overload()
        ticket, self._ticket = self._ticket, None
        circuit = self._circuit
        if ticket is None or circuit is None:
            return
        before = self._before
        if error is None:
            ticket.success()
        else:
            ticket.failure(error, deadline_expired=self.call.remaining() <= 0)
        if circuit.state != before:
            self.telemetry.breaker_changed(circuit.upstream, before, circuit.state)

    # -- the end -------------------------------------------------------------------------

    def end(
        self,
        error: BaseException | None,
        outcome: Outcome | None = None,
        *,
        complete: bool = True,
    ) -> None:
        """End the call: telemetry, permit, registry entry, ticket. Runs once; later calls
        are no-ops.

        Args:
            error: why the call failed, or None.
            outcome: what it produced (ids, finish reasons, usage) when it succeeded.
            complete: False when the caller stopped reading a stream before its end.
        """
        if self._state is _State.ENDED:
            return
        self._state = _State.ENDED
        if self._ticket is not None:
            # An attempt was still open (the call ended mid-attempt): settle its ticket too.
            self.attempt_ended(error)
        verdict, self._verdict = self._verdict, None
        if verdict is not None and self._circuit is not None:
            self._circuit.unused(verdict)  # ended before its first attempt
        telemetry = self.telemetry
        if error is not None:
            telemetry.failed(error)
        else:
            o = outcome or Outcome()
            if not complete and telemetry.recording:
                telemetry.span.set_attribute("stallproof.stream.abandoned", True)
            telemetry.finished(o)
        permit, self._permit = self._permit, None
        if permit is not None:
            permit.release(
                used_tokens=outcome.total_tokens if outcome is not None and error is None else None,
                succeeded=error is None and complete,
            )
        self._registry.pop(id(self.call), None)
        # The call's phase changes no longer feed its telemetry; this also breaks the
        # call <-> telemetry cycle, so both are freed without the garbage collector.
        self.call.telemetry = None
