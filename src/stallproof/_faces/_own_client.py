"""A caller's own ``httpx2.AsyncClient`` (or ``httpx.AsyncClient``) under an SDK face.

``stallproof.openai.AsyncOpenAI(http_client=httpx2.AsyncClient(proxy=..., headers=...,
event_hooks=...))`` keeps that client — its headers, auth, event hooks, base settings —
and installs stallproof's engine as its transport. The engine sends through the
transports the client had (its default one and its proxy mounts, so proxies and TLS
settings stay), every bound of the engine above them. The client's connections are then
pooled by httpcore's pool, not stallproof's: a warning says so once per process (see
`stallproof._wire._httpx_pool`).

The client is changed in place: every request it sends from then on, the SDK's or not,
goes through the engine; closing the SDK client closes it, as the SDKs do.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import httpx
import httpx2

from .._engine import Engine
from .._wire._httpx_pool import TransportPool, warn_once
from ._transport import AsyncTransport, AsyncTransport2

__all__ = ["adopt"]


class _ClosesItsPool:
    """A transport over a pool the engine does not own: closing it closes that pool."""

    engine: Engine

    async def aclose(self) -> None:
        await super().aclose()  # type: ignore[misc]
        await self.engine.pool.aclose()


class _OwnTransport(_ClosesItsPool, AsyncTransport):
    pass


class _OwnTransport2(_ClosesItsPool, AsyncTransport2):
    pass


def adopt(client: httpx2.AsyncClient | httpx.AsyncClient, **settings: Any) -> Engine:
    """Install a new engine (built from ``settings``) as ``client``'s transport, over the
    transports ``client`` had; return that engine."""
    lib: ModuleType = httpx2 if isinstance(client, httpx2.AsyncClient) else httpx
    default = client._transport
    mounts = dict(client._mounts)

    def route(url: Any) -> Any:
        # As the client's own _transport_for_url: the first mount that matches, or default.
        for pattern, transport in mounts.items():
            if pattern.matches(url):
                return default if transport is None else transport
        return default

    transports = [default, *(t for t in mounts.values() if t is not None)]
    engine = Engine(pool=TransportPool(lib, route, transports), **settings)
    own = _OwnTransport2 if lib is httpx2 else _OwnTransport
    client._transport = own(engine)
    client._mounts = {}
    # adopt <- harden <- the face's __init__ <- the caller
    warn_once(f"your own {lib.__name__}.AsyncClient's transport", stacklevel=5)
    return engine
