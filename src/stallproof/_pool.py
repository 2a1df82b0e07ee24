"""The engine's connection pool (placeholder until the hardened pool lands)."""

from __future__ import annotations

import httpcore2

from ._config import Limits

__all__ = ["open_pool"]


def open_pool(limits: Limits, *, trust_env: bool = True) -> httpcore2.AsyncConnectionPool:
    return httpcore2.AsyncConnectionPool(
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
    )
