"""Sending through a caller's own httpx / httpx2 client instead of stallproof's pool.

`Client(http_client=...)` keeps working for callers who configured proxies, certificates
or event hooks on an httpx client (`HttpxClientPool`), and so do the SDK faces given a
caller's own ``httpx2.AsyncClient`` or ``httpx.AsyncClient`` (`TransportPool`, over the
transports that client would have used: its proxies and TLS settings stay). The engine
drives either through the same interface as its own pool (``send`` and ``stats``, on
httpcore2 requests), so every bound still holds; but the connections are then pooled by
httpcore's pool, whose bookkeeping cancellation can leave with dead slots
(encode/httpcore#830, #1093). A warning says so, once per process.
"""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator, Callable, Sequence
from types import ModuleType
from typing import Any

import httpcore2
import httpx

from ._pool import PoolStats

__all__ = ["HttpxClientPool", "TransportPool", "warn_once"]

_warned = False

# httpx's (and httpx2's, same names) exceptions as the pool's own, so that the engine
# translates them in one place.
_ERRORS: tuple[tuple[str, type[Exception]], ...] = (
    ("ConnectTimeout", httpcore2.ConnectTimeout),
    ("ReadTimeout", httpcore2.ReadTimeout),
    ("WriteTimeout", httpcore2.WriteTimeout),
    ("PoolTimeout", httpcore2.PoolTimeout),
    ("ConnectError", httpcore2.ConnectError),
    ("ProxyError", httpcore2.ProxyError),
    ("RemoteProtocolError", httpcore2.RemoteProtocolError),
    ("LocalProtocolError", httpcore2.LocalProtocolError),
    ("UnsupportedProtocol", httpcore2.UnsupportedProtocol),
    ("ReadError", httpcore2.ReadError),
    ("WriteError", httpcore2.WriteError),
    ("TransportError", httpcore2.NetworkError),
    ("HTTPError", httpcore2.NetworkError),
)


def _translated(error: Exception, lib: ModuleType) -> Exception:
    for theirs, ours in _ERRORS:
        if isinstance(error, getattr(lib, theirs)):
            return ours(str(error) or type(error).__name__)
    return httpcore2.NetworkError(type(error).__name__)  # pragma: no cover


def warn_once(what: str, *, stacklevel: int) -> None:
    """The one warning per process that a caller's own pool carries the connections
    (``stacklevel`` counted from this function, as for ``warnings.warn``)."""
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            f"stallproof: sending through {what}: every bound holds, but httpcore's pool "
            "can lose slots when calls are cancelled (encode/httpcore#1093); leave "
            "http_client unset to use stallproof's pool",
            RuntimeWarning,
            stacklevel=stacklevel,
        )


def _library_request(lib: ModuleType, request: httpcore2.Request, content: bytes) -> Any:
    url = request.url
    return lib.Request(
        request.method.decode("ascii"),
        lib.URL(
            scheme=url.scheme.decode("ascii"),
            host=url.host.decode("ascii"),
            port=url.port,
            raw_path=url.target,
        ),
        headers=request.headers,
        content=content,
        extensions=dict(request.extensions),
    )


def _pool_response(response: Any, lib: ModuleType) -> httpcore2.Response:
    return httpcore2.Response(
        response.status_code,
        headers=response.headers.raw,
        content=_Body(response, lib),
        extensions={
            "http_version": response.http_version.encode(),
            "reason_phrase": response.reason_phrase.encode(),
        },
    )


def _pool_stats(transports: Sequence[object]) -> PoolStats:
    """What the httpcore pools under ``transports`` hold, as far as they can be seen (the
    library's default transport). A custom transport without an httpcore pool shows as
    empty."""
    requests: list[Any] = []
    conns: list[Any] = []
    for transport in transports:
        pool = getattr(transport, "_pool", None)
        requests += getattr(pool, "_requests", ())
        conns += getattr(pool, "connections", ())
    return PoolStats(
        connections=sum(1 for c in conns if not c.is_closed()),
        idle=sum(1 for c in conns if c.is_idle()),
        in_use=sum(1 for r in requests if not r.is_queued()),
        waiting=sum(1 for r in requests if r.is_queued()),
    )


class _Body:
    """An httpx (or httpx2) response's raw bytes, as a pool response stream."""

    def __init__(self, response: Any, lib: ModuleType) -> None:
        self._response = response
        self._lib = lib

    async def __aiter__(self) -> AsyncIterator[bytes]:
        # Errors are raised outside the except block, so that their __context__ is not
        # httpx's exception, whose .request holds the Authorization header.
        error: Exception | None = None
        try:
            async for part in self._response.aiter_raw():
                yield part
        except self._lib.HTTPError as e:
            error = _translated(e, self._lib)
        if error is not None:
            raise error

    async def aclose(self) -> None:
        await self._response.aclose()


class HttpxClientPool:
    """The engine's pool interface over a caller's ``httpx.AsyncClient`` (not closed here)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client
        warn_once("a caller's httpx.AsyncClient", stacklevel=4)  # the caller of Client()

    async def send(self, request: httpcore2.Request) -> httpcore2.Response:
        content = b"".join([part async for part in request.stream])  # type: ignore[union-attr]
        req = _library_request(httpx, request, content)
        error: Exception | None = None
        try:
            response = await self._client.send(req, stream=True, follow_redirects=False)
        except httpx.HTTPError as e:
            error = _translated(e, httpx)
        if error is not None:
            raise error
        return _pool_response(response, httpx)

    def stats(self) -> PoolStats:
        """The caller's client's pool, as far as it can be seen (httpx's default transport)."""
        return _pool_stats([getattr(self._client, "_transport", None)])

    async def aclose(self) -> None:
        """The caller's client is theirs to close."""


class TransportPool:
    """The engine's pool interface over the transports of a caller's httpx2 (or httpx)
    client: each request goes to the transport that client would have picked for its URL
    (``route``), so its proxies, certificates and pool limits stay as configured.

    Args:
        lib: ``httpx2`` or ``httpx``, the library of those transports.
        route: the transport for a URL (the client's own mounts, then its default).
        transports: every one of them, closed with this pool.
    """

    def __init__(
        self, lib: ModuleType, route: Callable[[Any], Any], transports: Sequence[Any]
    ) -> None:
        self._lib = lib
        self._route = route
        self._transports = tuple(transports)

    async def send(self, request: httpcore2.Request) -> httpcore2.Response:
        content = b"".join([part async for part in request.stream])  # type: ignore[union-attr]
        req = _library_request(self._lib, request, content)
        error: Exception | None = None
        try:
            response = await self._route(req.url).handle_async_request(req)
        except self._lib.HTTPError as e:
            error = _translated(e, self._lib)
        if error is not None:
            raise error
        return _pool_response(response, self._lib)

    def stats(self) -> PoolStats:
        return _pool_stats(self._transports)

    async def aclose(self) -> None:
        for transport in self._transports:
            await transport.aclose()
