"""The seeded random mix: weights over fault specs, for requests that nothing else chose.

The draw for the n-th request of a key depends only on (seed, key, n), through a hash, so
the same seed gives the same faults in the same order per key, however requests of
different keys interleave. The mix is set from any thread and read on the server's loop;
a lock keeps each key's draw count exact.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._bounded import touch
from ._scenarios import spec_of
from ._spec import FaultSpec, FaultSpecError

__all__ = ["Mix", "MixState"]


@dataclass(frozen=True, slots=True)
class Mix:
    """Weights over fault specs, a seed, and optionally the one key it applies to.

    The weights are probabilities: each in [0, 1], summing to at most 1; what is left is
    the chance of a plain healthy answer.

    Raises:
        FaultSpecError: for a bad spec, weight or seed.
    """

    weights: tuple[tuple[FaultSpec, float], ...]
    seed: int = 0
    key: str | None = None

    def __post_init__(self) -> None:
        total = 0.0
        for spec, weight in self.weights:
            if "first" in spec.params:
                raise FaultSpecError(f"a mix's fault cannot have 'first': {str(spec)!r}")
            if spec.info.scope == "connection":
                raise FaultSpecError(
                    f"fault {spec.name!r} acts on connections: arm it with a scenario, not the mix"
                )
            if (
                isinstance(weight, bool)
                or not isinstance(weight, (int, float))
                or not math.isfinite(weight)
                or not 0 <= weight <= 1
            ):
                raise FaultSpecError(
                    f"the weight of {str(spec)!r} must be a probability in [0, 1], got {weight!r}"
                )
            total += weight
        if total > 1 + 1e-9:
            raise FaultSpecError(f"the mix's weights sum to {total:g}; they must sum to <= 1")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise FaultSpecError(f"the mix's seed must be an integer, got {self.seed!r}")
        if self.key is not None and (not isinstance(self.key, str) or not self.key):
            raise FaultSpecError(f"the mix's key must be a non-empty string, got {self.key!r}")

    @classmethod
    def of(
        cls, weights: Mapping[str, float] | Mapping[FaultSpec, float], seed: int, key: str | None
    ) -> Mix:
        if not isinstance(weights, Mapping):
            raise FaultSpecError(
                f"the mix's weights must map fault specs to probabilities, got {weights!r}"
            )
        return cls(tuple((spec_of(s), w) for s, w in weights.items()), seed, key)

    @classmethod
    def from_json(cls, data: object) -> Mix:
        """``{"weights": {"status;code=503": 0.2}, "seed": 42, "key": null}``."""
        if not isinstance(data, dict):
            raise FaultSpecError(f"a mix must be a JSON object, got {data!r}")
        unknown = set(data) - {"weights", "seed", "key"}
        if unknown:
            raise FaultSpecError(
                f"unknown mix field(s) {sorted(unknown)}; known: weights, seed, key"
            )
        if "weights" not in data:
            raise FaultSpecError("a mix needs 'weights', like {\"status;code=503\": 0.2}")
        return cls.of(data["weights"], data.get("seed", 0), data.get("key"))

    def as_dict(self) -> dict[str, Any]:
        return {
            "weights": {str(spec): weight for spec, weight in self.weights},
            "seed": self.seed,
            "key": self.key,
        }

    def pick(self, key: str | None, n: int) -> FaultSpec | None:
        """The fault for the ``n``-th draw of ``key``, or None for healthy."""
        digest = hashlib.sha256(f"{self.seed}\0{key or ''}\0{n}".encode()).digest()
        u = int.from_bytes(digest[:8], "big") / 2**64
        for spec, weight in self.weights:
            if u < weight:
                return spec
            u -= weight
        return None


class MixState:
    """The current mix and each key's draw count; atomic, safe from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mix: Mix | None = None
        self._draws: OrderedDict[str | None, int] = OrderedDict()  # capped at MAX_KEYS.

    @property
    def mix(self) -> Mix | None:
        return self._mix

    def set(self, mix: Mix | None) -> None:
        """Install ``mix`` (None: no mix) and restart every key's draws."""
        with self._lock:
            self._mix = mix
            self._draws = OrderedDict()

    def draw(self, key: str | None) -> tuple[FaultSpec | None, bool]:
        """(the fault drawn or None for healthy, whether a draw happened at all)."""
        mix = self._mix
        if mix is None or (mix.key is not None and mix.key != key):
            return None, False
        with self._lock:
            n = touch(self._draws, key, 0)
            self._draws[key] = n + 1
        return mix.pick(key, n), True

    def forget(self, key: str) -> bool:
        """Restart ``key``'s draws; whether it had any."""
        with self._lock:
            return self._draws.pop(key, None) is not None
