"""The fleet: a `Pacer`'s limits and a `Breaker`'s circuits shared across processes through
Redis (``shared=RedisState(...)``, the ``redis`` extra; docs/fleet.md). The store and
scripts also carry each process's calls in flight for ``stallproof top`` (`_publish`, a
layer above).

The rule of this package: Redis is one more upstream that can be slow, down or stalled.
Every operation goes through `SharedStore` with its own bound clipped to the call's
deadline, and answers `UNAVAILABLE` rather than wait; redis-py is imported here only, and
only when a `RedisState` is first used. Outside this package, code sees the fleet sides
(`FleetPacer`, `FleetBreaker`) and the store's health, never a Redis client.

============ ==================================================================
module       what is in it
============ ==================================================================
`_store`     `SharedStore` (one per `RedisState`), `Stores`, `Health`, `UNAVAILABLE`
`_lag`       `LoopLag`: how late the loop was, so a bound on Redis does not count it
`_scripts`   the Lua scripts: every change to fleet state is one atomic script
`_pacer`     `FleetPacer`, `FleetLease`: admission, leases, overload reports
`_breaker`   `FleetBreaker`, `FleetVerdict`: the shared circuit and its one probe
============ ==================================================================
"""

from __future__ import annotations

from ._breaker import FleetBreaker, FleetVerdict
from ._pacer import FleetLease, FleetPacer
from ._store import UNAVAILABLE, Health, SharedStore, Stores, now

__all__ = [
    "UNAVAILABLE",
    "FleetBreaker",
    "FleetLease",
    "FleetPacer",
    "FleetVerdict",
    "Health",
    "SharedStore",
    "Stores",
    "now",
]
