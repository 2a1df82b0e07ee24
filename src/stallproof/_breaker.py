"""Circuit breakers per upstream, on pybreaker, made right for asyncio and trio.

pybreaker has the state machine we want (closed -> open after ``fail_max`` consecutive
failures -> half-open -> closed after ``success_threshold`` successes), its counters and
its listeners. What it lacks for async callers (its ``call_async`` needs tornado, its
decorator counts an ``async def`` as a success when the coroutine is *created*, and
``with breaker.calling(): await ...`` lets every concurrent caller through in half-open
and counts ``CancelledError`` as a failure) is handled here:

* Admission and outcome are separate steps around the attempt (`Circuit.admit` returns a
  `Ticket`; the ticket records how the attempt ended).
* Exactly one probe in half-open: the ticket that moved the circuit to half-open is the
  probe; every other caller gets `CircuitOpen` until it reports back.
* The caller's own cancellation is no outcome at all. Our total deadline expiring is a
  failure (the upstream was too slow). 4xx answers other than 408/429 are the caller's
  fault and count as successes: the upstream is up.
* A 429 carrying Retry-After opens the circuit for exactly that long (clamped to
  ``max_open``), whatever the failure count: the server said when to come back.
* Open time is measured on the event loop's monotonic clock (`anyio.current_time`), not
  on pybreaker's wall-clock ``datetime``.

With ``shared=RedisState(...)`` the circuit lives in Redis (`_fleet.FleetBreaker`): every
process sharing it opens together, and one probe goes for the whole fleet. pybreaker's own
Redis storage is synchronous (it would block the loop on every state read), so it is not
used; the local pybreaker keeps recording this process's outcomes and decides alone while
Redis does not answer.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

import anyio
import pybreaker

from . import _exceptions as exc
from ._fleet import FleetBreaker, FleetVerdict, Health, Stores, now
from ._policies import Breaker

__all__ = ["BreakerRegistry", "Circuit", "CircuitState", "Ticket"]


@dataclasses.dataclass(frozen=True, slots=True)
class CircuitState:
    """A snapshot of one circuit, from `Client.circuits()`."""

    upstream: str
    state: str  # "closed", "open" or "half-open"
    failures: int
    retry_in: float  # seconds until a probe may go (0 unless open)
    probing: bool


class Circuit:
    """One upstream's breaker: pybreaker's state machine plus async-correct admission.

    It belongs to its client's event loop: admission and outcomes change state without
    awaiting, so they need no lock (see "One event loop per client" in docs/concurrency.md).
    """

    def __init__(
        self,
        upstream: str,
        policy: Breaker,
        on_change: Callable[[str, str, str], None] | None = None,
        fleet: FleetBreaker | None = None,
    ) -> None:
        self.upstream = upstream
        self.policy = policy
        self._on_change = on_change
        self._fleet = fleet
        self._fleet_state: str | None = None  # the state Redis last reported
        self._fleet_open_until = 0.0  # on the loop clock
        self._open_until = 0.0
        self._open_for: float | None = None  # a Retry-After to use for the next opening
        self._probing = False
        self._cb = pybreaker.CircuitBreaker(
            fail_max=policy.fail_max,
            reset_timeout=policy.reset_timeout,
            success_threshold=policy.success_threshold,
            listeners=[_Listener(self)],
            name=upstream,
            throw_new_error_on_trip=False,
        )

    def shared_status(self) -> str | None:
        """Where this circuit's answers come from now: "redis", "local (why)"; None: not
        shared."""
        return None if self._fleet is None else self._fleet.store.describe()

    def _fleet_view(self) -> bool:
        """Whether Redis decides now (it answered last time and said something)."""
        fleet = self._fleet
        return (
            fleet is not None
            and fleet.store.health is Health.SHARED
            and self._fleet_state is not None
        )

    @property
    def state(self) -> str:
        if self._fleet_view():
            return str(self._fleet_state)
        return str(self._cb.current_state)

    def snapshot(self) -> CircuitState:
        state = self.state
        until = self._fleet_open_until if self._fleet_view() else self._open_until
        retry_in = max(0.0, until - anyio.current_time()) if state == "open" else 0.0
        return CircuitState(self.upstream, state, self._cb.fail_counter, retry_in, self._probing)

    def check(self) -> None:
        """Raise `CircuitOpen` if an attempt would be refused now; cheap, takes no slot.

        Called before a request is even built, so a refused call costs microseconds.
        `admit` still decides (and takes the probe slot) when the attempt starts.
        """
        if self._fleet_view():
            left = self._fleet_open_until - anyio.current_time()
            if self._fleet_state == pybreaker.STATE_OPEN and left > 0:
                raise self._refuse(left)
            return
        state = self.state
        if state == pybreaker.STATE_OPEN:
            left = self._open_until - anyio.current_time()
            if left > 0:
                raise self._refuse(left)
        elif state == pybreaker.STATE_HALF_OPEN and self._probing:
            raise self._refuse(0.0)

    @property
    def fleet(self) -> tuple[FleetBreaker, str] | None:
        """This circuit on Redis (its fleet side and upstream), for an admission that
        asks the pacer and the breaker in one round trip; None: not shared."""
        return None if self._fleet is None else (self._fleet, self.upstream)

    async def admit(self, *, deadline: float, verdict: FleetVerdict | None = None) -> Ticket:
        """Let an attempt through, or raise `CircuitOpen`.

        Without shared state: at once, no I/O. Shared: Redis decides, within its
        ``op_timeout`` and ``deadline``; when it does not answer in time this process's
        own state decides (``fail="open"``), or `SharedStateUnavailable` is raised
        (``fail="closed"``). ``verdict``: Redis's answer already in hand (it came with
        the pacer's grant): no round trip.
        """
        fleet = self._fleet
        if fleet is not None:
            if verdict is None:
                verdict = await fleet.admit(self.upstream, deadline=deadline)
            if verdict is not None:
                self._fleet_seen(verdict.state, verdict.retry_in)
                if verdict.verdict == "refuse":
                    raise self._refuse(verdict.retry_in)
                return Ticket(self, probe=verdict.verdict == "probe", fleet_id=verdict.ticket_id)
            if fleet.store.fail_closed:
                raise fleet.store.unavailable_error(f"not sent to {self.upstream}")
        return self._admit_local()

    def _fleet_seen(self, state: str, retry_in: float) -> None:
        # What Redis said, kept so that `check` and `snapshot` cost no round trip.
        before = self.state
        self._fleet_state = state
        self._fleet_open_until = now() + retry_in if state == pybreaker.STATE_OPEN else 0.0
        if self._on_change is not None and before != state:
            self._on_change(self.upstream, before, state)

    def _admit_local(self) -> Ticket:
        state = self.state
        now = anyio.current_time()
        if state == pybreaker.STATE_OPEN:
            if now < self._open_until:
                raise self._refuse(self._open_until - now)
            self._cb.half_open()
            self._probing = True
            return Ticket(self, probe=True)
        if state == pybreaker.STATE_HALF_OPEN:
            if self._probing:
                raise self._refuse(0.0)
            self._probing = True
            return Ticket(self, probe=True)
        return Ticket(self, probe=False)

    def _refuse(self, retry_in: float) -> exc.CircuitOpen:
        when = f"probes in {retry_in:.3f}s" if retry_in > 0 else "a probe is in flight"
        return exc.CircuitOpen(
            f"circuit for {self.upstream} is open ({when})",
            upstream=self.upstream,
            retry_in=retry_in,
        )

    # -- outcomes, reported through a Ticket ------------------------------------------------

    def _record(
        self, failed: bool, probe: bool, open_for: float | None = None, fleet_id: str | None = None
    ) -> None:
        if fleet_id is not None and self._fleet is not None:
            outcome = "failure" if failed else "success"
            self._fleet.record(self.upstream, fleet_id, outcome, open_for, self._fleet_seen)
        self._record_local(failed, probe, open_for)

    def _record_local(self, failed: bool, probe: bool, open_for: float | None) -> None:
        if probe:
            self._probing = False
        if open_for is not None:
            self._open_for = min(open_for, self.policy.max_open)
            if self.state != pybreaker.STATE_OPEN:
                self._cb.open()  # notifies the listener, which sets the open time
            else:
                self._open_until = anyio.current_time() + self._open_for
                self._open_for = None
            return
        if self.state == pybreaker.STATE_OPEN:
            return  # an attempt admitted before the circuit opened: no news
        with contextlib.suppress(_AttemptFailed):
            self._cb.call(_fail if failed else _succeed)

    def unused(self, verdict: FleetVerdict) -> None:
        """A verdict taken with the pacer's grant whose attempt never started: the
        fleet's probe slot, if it was the probe, goes back."""
        if verdict.verdict == "probe" and self._fleet is not None:
            self._fleet.record(self.upstream, verdict.ticket_id, "release", None, self._fleet_seen)

    def _release(self, probe: bool, fleet_id: str | None = None) -> None:
        if probe and fleet_id is not None and self._fleet is not None:
            self._fleet.record(self.upstream, fleet_id, "release", None, self._fleet_seen)
        if probe:
            self._probing = False

    def _opened(self) -> None:
        # Listener hook: pybreaker moved to open; start the clock on our monotonic time.
        wait = self._open_for if self._open_for is not None else self.policy.reset_timeout
        self._open_for = None
        self._open_until = anyio.current_time() + wait


class Ticket:
    """One admitted attempt. Report exactly one outcome (later reports are ignored)."""

    __slots__ = ("_circuit", "_done", "fleet_id", "probe")

    def __init__(self, circuit: Circuit, *, probe: bool, fleet_id: str | None = None) -> None:
        self._circuit = circuit
        self.probe = probe
        self.fleet_id = fleet_id  # admitted by Redis: the outcome goes there too
        self._done = False

    def success(self) -> None:
        if not self._done:
            self._done = True
            self._circuit._record(False, self.probe, fleet_id=self.fleet_id)

    def failure(self, error: BaseException, *, deadline_expired: bool) -> None:
        """Classify ``error`` and record it: failure, success, or no outcome."""
        if self._done:
            return
        self._done = True
        circuit = self._circuit
        if isinstance(error, anyio.get_cancelled_exc_class()) and not deadline_expired:
            # The caller gave up: says nothing about the server.
            circuit._release(self.probe, self.fleet_id)
            return
        if isinstance(error, exc.APIStatusError):
            if error.status_code == 429 and error.retry_after is not None:
                circuit._record(True, self.probe, error.retry_after, self.fleet_id)
                return
            if 400 <= error.status_code < 500 and error.status_code not in (408, 429):
                # The caller's mistake; the server is up.
                circuit._record(False, self.probe, fleet_id=self.fleet_id)
                return
        if isinstance(error, (exc.InvalidRequestError, exc.CircuitOpen)):
            circuit._release(self.probe, self.fleet_id)
            return
        circuit._record(True, self.probe, fleet_id=self.fleet_id)


class BreakerRegistry:
    """The circuits of one client, created on first use."""

    def __init__(
        self,
        policy: Breaker,
        on_change: Callable[[str, str, str], None] | None = None,
        *,
        stores: Stores | None = None,
    ) -> None:
        self.policy = policy
        self._on_change = on_change
        self._circuits: dict[str, Circuit] = {}
        self._fleet = (
            None
            if policy.shared is None
            else FleetBreaker(policy, (stores or Stores()).get(policy.shared))
        )

    def shared_status(self) -> str | None:
        """Where circuit answers come from now: "redis", "local (why)"; None: not shared."""
        return None if self._fleet is None else self._fleet.store.describe()

    async def aclose(self) -> None:
        """Close the connection to the fleet state, if any (bounded)."""
        if self._fleet is not None:
            await self._fleet.store.aclose()

    def circuit(self, base_url: str, model: str) -> Circuit:
        key = f"{base_url} model={model}" if self.policy.per_model else base_url
        circuit = self._circuits.get(key)
        if circuit is None:
            circuit = self._circuits.setdefault(
                key, Circuit(key, self.policy, self._on_change, self._fleet)
            )
        return circuit

    def snapshot(self) -> dict[str, CircuitState]:
        return {key: c.snapshot() for key, c in list(self._circuits.items())}


class _AttemptFailed(Exception):
    pass


def _fail() -> None:
    raise _AttemptFailed


def _succeed() -> None:
    return None


class _Listener(pybreaker.CircuitBreakerListener):
    def __init__(self, circuit: Circuit) -> None:
        self._circuit = circuit

    def state_change(
        self,
        cb: pybreaker.CircuitBreaker,
        old_state: pybreaker.CircuitBreakerState | None,
        new_state: pybreaker.CircuitBreakerState,
    ) -> None:
        if new_state.name == pybreaker.STATE_OPEN:
            self._circuit._opened()
        hook = self._circuit._on_change
        if hook is not None:
            hook(self._circuit.upstream, old_state.name if old_state else "", new_state.name)
