"""`Wire`: what the engine sends a request through and gets a response back from.

One interface, several implementations (httpx's ``_transports/base.py``): stallproof's
own `Pool`, and the adapters over a caller's own httpx client (`HttpxClientPool`,
`TransportPool`). The engine bounds every call around it; a wire bounds nothing itself
but the socket operations the engine's scope cancels.
"""

from __future__ import annotations

from typing import Protocol

import httpcore2

from ._pool import PoolStats

__all__ = ["Wire"]


class Wire(Protocol):
    """What the engine sends through: stallproof's `Pool`, or an adapter with its interface."""

    async def send(self, request: httpcore2.Request) -> httpcore2.Response:
        """Send ``request``; return once the head is in, the body still to be read."""
        ...

    def stats(self) -> PoolStats:
        """How many connections are open, idle, and how many requests wait."""
        ...

    async def aclose(self) -> None:
        """Close every connection."""
        ...
