"""Everything a server's connections share: its bounds, counters, journal and armed faults."""

from __future__ import annotations

from dataclasses import dataclass, field

from ._buckets import Buckets
from ._control_guard import ControlGuard
from ._control_worker import ControlWorker
from ._fixtures import Fixtures
from ._journal import Journal
from ._metrics import Flights
from ._mix import MixState
from ._proxy import Upstream
from ._scenarios import Scenarios
from ._stats import Counters

__all__ = ["ServerState"]


@dataclass(eq=False, slots=True)
class ServerState:
    """The shared state of one `FaultServer`; each part is safe from any thread."""

    max_hold: float
    counters: Counters = field(default_factory=Counters)
    journal: Journal = field(default_factory=Journal)
    scenarios: Scenarios = field(default_factory=Scenarios)
    mix: MixState = field(default_factory=MixState)
    upstream: Upstream | None = None
    buckets: Buckets = field(default_factory=Buckets)
    guard: ControlGuard = field(default_factory=ControlGuard)
    control: ControlWorker = field(default_factory=ControlWorker)
    flights: Flights = field(default_factory=Flights)
    fixtures: Fixtures = field(default_factory=Fixtures)

    def reset(self) -> None:
        """Zero the counts, restart the sequences and the mix's draws, empty the journal,
        refill the rate limits' buckets."""
        self.counters.reset()
        self.journal.clear()
        self.mix.set(self.mix.mix)
        self.buckets.clear()

    def forget(self, key: str) -> dict[str, int]:
        """Drop everything kept for ``key``: its journal entries, counts (its ``first=N``
        sequence), mix draws, rules and fixtures. Returns how much of each went."""
        return {
            "requests": self.journal.forget(key),
            "counts": int(self.counters.forget(key)),
            "rules": self.scenarios.clear(key),
            "draws": int(self.mix.forget(key)),
            "fixtures": self.fixtures.clear(key),
        }
