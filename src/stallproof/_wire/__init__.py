"""The wire: the layer that moves bytes and holds connections (HTTP/1.1).

The rule of this package: a wire knows nothing of calls, policies or SDKs. It imports
only `_config`, `_exceptions` and `_redact` from the rest of stallproof; the engine
imports it, never the other way round. Every socket operation it does is cancelled by the
engine's scope around it; the wire's own job is to stay whole when that happens (no slot
lost, no socket left open).

================ ================================================================
module           what is in it
================ ================================================================
`_base`          `Wire`: the interface the engine sends through
`_pool`          `Pool`: stallproof's own pool (cannot be bricked, O(1) per arrival
                 and departure), `PoolStats`
`_h1`            `H1Connection`: the pool's HTTP/1.1 connection on asyncio (an asyncio
                 Protocol, llhttp-parsed, bounds as loop timers); trio and proxied
                 origins use httpcore2's
`_messages`      httpcore2's `Request` and `Response` built without re-checking bytes
`_network`       `Network`: how the pool opens sockets (DNS on its own limiter, TLS
                 that closes its socket when cancelled)
`_proxy`         which proxy an origin goes through, and the connection to it
`_tls`           one SSL context per process (certifi's roots), built on first use
`_httpx_pool`    `HttpxClientPool`, `TransportPool`: a caller's own httpx/httpx2
                 client (or its transports) as a `Wire`
================ ================================================================
"""

from __future__ import annotations

from ._base import Wire
from ._httpx_pool import HttpxClientPool, TransportPool
from ._pool import Pool, PoolStats, RequestPlan

__all__ = ["HttpxClientPool", "Pool", "PoolStats", "RequestPlan", "TransportPool", "Wire"]
