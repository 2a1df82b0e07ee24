"""Sending through a caller's own ``httpx.AsyncClient`` instead of stallproof's pool.

`Client(http_client=...)` keeps working for callers who configured proxies, certificates
or event hooks on an httpx client. The engine drives it through the same interface as its
own pool (``send`` and ``stats``, on httpcore2 requests), so every bound still holds; but
that client's pool is httpcore's, whose bookkeeping cancellation can leave with dead slots
(encode/httpcore#830, #1093). A warning says so, once per process.
"""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator
from typing import Any

import httpcore2
import httpx

from ._pool import WireStats

__all__ = ["HttpxClientPool"]

_warned = False

# httpx's exceptions, as the pool's own, so the engine translates them in one place.
_ERRORS: tuple[tuple[type[httpx.HTTPError], type[Exception]], ...] = (
    (httpx.ConnectTimeout, httpcore2.ConnectTimeout),
    (httpx.ReadTimeout, httpcore2.ReadTimeout),
    (httpx.WriteTimeout, httpcore2.WriteTimeout),
    (httpx.PoolTimeout, httpcore2.PoolTimeout),
    (httpx.ConnectError, httpcore2.ConnectError),
    (httpx.ProxyError, httpcore2.ProxyError),
    (httpx.RemoteProtocolError, httpcore2.RemoteProtocolError),
    (httpx.LocalProtocolError, httpcore2.LocalProtocolError),
    (httpx.UnsupportedProtocol, httpcore2.UnsupportedProtocol),
    (httpx.ReadError, httpcore2.ReadError),
    (httpx.WriteError, httpcore2.WriteError),
    (httpx.TransportError, httpcore2.NetworkError),
    (httpx.HTTPError, httpcore2.NetworkError),
)


def _translated(error: httpx.HTTPError) -> Exception:
    for theirs, ours in _ERRORS:
        if isinstance(error, theirs):
            return ours(str(error) or type(error).__name__)
    return httpcore2.NetworkError(type(error).__name__)  # pragma: no cover


class _Body:
    """An httpx response's raw bytes, as a pool response stream."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        # Errors are raised outside the except block, so that their __context__ is not
        # httpx's exception, whose .request holds the Authorization header.
        error: Exception | None = None
        try:
            async for part in self._response.aiter_raw():
                yield part
        except httpx.HTTPError as e:
            error = _translated(e)
        if error is not None:
            raise error

    async def aclose(self) -> None:
        await self._response.aclose()


class HttpxClientPool:
    """The engine's pool interface over a caller's ``httpx.AsyncClient`` (not closed here)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        global _warned
        self._client = client
        if not _warned:
            _warned = True
            warnings.warn(
                "stallproof: sending through a caller's httpx.AsyncClient: every bound holds, "
                "but httpcore's pool can lose slots when calls are cancelled "
                "(encode/httpcore#1093); leave http_client unset to use stallproof's pool",
                RuntimeWarning,
                stacklevel=3,
            )

    async def send(self, request: httpcore2.Request) -> httpcore2.Response:
        url = request.url
        ext: dict[str, Any] = dict(request.extensions)
        req = httpx.Request(
            request.method.decode("ascii"),
            httpx.URL(
                scheme=url.scheme.decode("ascii"),
                host=url.host.decode("ascii"),
                port=url.port,
                raw_path=url.target,
            ),
            headers=request.headers,
            content=b"".join([part async for part in request.stream]),  # type: ignore[union-attr]
            extensions=ext,
        )
        error: Exception | None = None
        try:
            response = await self._client.send(req, stream=True, follow_redirects=False)
        except httpx.HTTPError as e:
            error = _translated(e)
        if error is not None:
            raise error
        return httpcore2.Response(
            response.status_code,
            headers=response.headers.raw,
            content=_Body(response),
            extensions={
                "http_version": response.http_version.encode(),
                "reason_phrase": response.reason_phrase.encode(),
            },
        )

    def stats(self) -> WireStats:
        """The caller's client's pool, as far as it can be seen (httpx's default transport).

        A custom transport without an httpcore pool shows as empty.
        """
        pool = getattr(getattr(self._client, "_transport", None), "_pool", None)
        requests = list(getattr(pool, "_requests", ()))
        conns = list(getattr(pool, "connections", ()))
        idle = sum(1 for c in conns if c.is_idle())
        return WireStats(
            connections=sum(1 for c in conns if not c.is_closed()),
            idle=idle,
            in_use=sum(1 for r in requests if not r.is_queued()),
            waiting=sum(1 for r in requests if r.is_queued()),
        )

    async def aclose(self) -> None:
        """The caller's client is theirs to close."""
