"""Proxies for the `Pool`: which proxy an origin goes through, and the connection to it.

The routing is httpx's, read with httpx's own helpers so the two never disagree:

- an explicit ``proxy=`` sends every origin through it (the environment is not read);
- else, with ``trust_env``, ``HTTP_PROXY`` / ``HTTPS_PROXY`` / ``ALL_PROXY`` (or their
  lower-case forms) as ``httpx._utils.get_environment_proxies`` reads them, and
  ``NO_PROXY`` as it turns them into patterns (``*`` bypasses every proxy; ``.example.com``
  its subdomains; ``example.com`` it and its subdomains; IP addresses and ``localhost``
  exactly), matched most specific first as httpx sorts its mounts (`httpx._utils.URLPattern`).

The connections are httpcore2's own: `AsyncForwardHTTPConnection` (an http:// origin: the
request goes to the proxy with an absolute target), `AsyncTunnelHTTPConnection` (https://:
``CONNECT``, then TLS to the origin through the tunnel) and, with the ``socks`` extra
(``socksio``), `AsyncSocks5Connection`. Each proxy is a `ProxyRoute`, hashed by identity,
so the pool keys its connections by origin and route in O(1); the route for an origin is
worked out once and remembered (a bounded memo).

Secrets: the proxy's userinfo becomes a ``Proxy-Authorization`` header (or SOCKS5
credentials) held by the route alone; a route shows itself, and every message names the
proxy, without them.
"""

from __future__ import annotations

import base64
import ssl
from collections.abc import Iterable, Mapping
from typing import Any

import httpcore2
import httpx
from httpcore2._async.http_proxy import AsyncForwardHTTPConnection, AsyncTunnelHTTPConnection
from httpx._utils import URLPattern, get_environment_proxies

from .._base_url import is_host_name
from .._exceptions import InvalidRequestError
from .._redact import safe_url
from ._tls import shared_ssl_context

__all__ = ["ProxyRoute", "ProxyRoutes", "ProxyTypes", "proxy_routes"]

ProxyTypes = str | httpx.URL | httpx.Proxy
"""What ``proxy=`` takes: a URL (``http://user:pass@proxy:3128``) or an ``httpx.Proxy``."""

_SCHEMES = ("http", "https", "socks5", "socks5h")
_DEFAULT_PORTS = {"http": 80, "https": 443, "socks5": 1080, "socks5h": 1080}
# Origins whose route is remembered; past this the memo starts again (a client talks to
# a handful of origins, but a bad caller must not grow it without bound).
_MEMO_MAX = 1024
# The environment variable each of httpx's mount keys comes from, for error messages.
_ENV_NAMES = {"http://": "HTTP_PROXY", "https://": "HTTPS_PROXY", "all://": "ALL_PROXY"}


class ProxyRoute:
    """One proxy: its address, what it is told, and how to open a connection through it.

    Hashed and compared by identity: the pool keys connections by (origin, route), and
    two routes are the same proxy only if they are the same object.
    """

    __slots__ = ("_auth", "_headers", "_socks_ready", "origin", "proxy_ssl_context", "shown")

    def __init__(self, proxy: ProxyTypes, *, ssl_context: ssl.SSLContext | None = None) -> None:
        if not isinstance(proxy, httpx.Proxy):
            proxy = _parse(proxy)
        url = proxy.url
        if not url.host:
            raise InvalidRequestError(f"proxy URL has no host: {safe_url(url)}")
        if not is_host_name(url.host):
            raise InvalidRequestError(f"proxy URL host {url.host!r} is not a host name")
        port = url.port if url.port is not None else _DEFAULT_PORTS[url.scheme]
        if not 0 < port < 65536:  # httpx takes any number; the connect would fail untyped
            raise InvalidRequestError(f"proxy URL port {port} is out of range (1-65535)")
        self.origin = httpcore2.Origin(url.raw_scheme, url.raw_host, port)
        self.shown = f"{url.scheme}://{url.host}:{port}"
        self._auth = proxy.raw_auth
        headers = [(k, v) for k, v in proxy.headers.raw]
        if self._auth is not None and not self.socks:
            token = base64.b64encode(self._auth[0] + b":" + self._auth[1])
            headers.insert(0, (b"Proxy-Authorization", b"Basic " + token))
        self._headers = headers
        self.proxy_ssl_context: ssl.SSLContext | None = None
        if url.scheme == "https":
            self.proxy_ssl_context = proxy.ssl_context or ssl_context
        self._socks_ready = not self.socks or _socksio_installed()

    @property
    def socks(self) -> bool:
        return self.origin.scheme in (b"socks5", b"socks5h")

    def __repr__(self) -> str:
        return f"<ProxyRoute {self.shown}>"

    def check(self) -> None:
        """Refuse, before any slot is taken, a proxy this installation cannot speak.

        Raises:
            httpcore2.UnsupportedProtocol: a SOCKS proxy without the ``socks`` extra (the
                engine turns it into `InvalidRequestError`; it is never retried).
        """
        if not self._socks_ready:
            raise httpcore2.UnsupportedProtocol(
                f"the SOCKS proxy {self.shown} needs the socksio package: "
                "pip install stallproof[socks]"
            )

    def connection(
        self,
        origin: httpcore2.Origin,
        *,
        ssl_context: ssl.SSLContext | None,
        keepalive_expiry: float | None,
        network: httpcore2.AsyncNetworkBackend,
    ) -> httpcore2.AsyncConnectionInterface:
        """A new, unconnected connection to ``origin`` through this proxy."""
        if self.socks:
            from httpcore2._async.socks_proxy import AsyncSocks5Connection

            holding = _Holding(network)
            return _SocksConnection(
                AsyncSocks5Connection(
                    proxy_origin=self.origin,
                    remote_origin=origin,
                    proxy_auth=self._auth,
                    ssl_context=ssl_context,
                    keepalive_expiry=keepalive_expiry,
                    network_backend=holding,
                ),
                holding,
            )
        proxy_ssl_context = self.proxy_ssl_context
        if proxy_ssl_context is None and self.origin.scheme == b"https":
            proxy_ssl_context = shared_ssl_context()  # not one per connection (httpcore2's)
        if origin.scheme == b"http":
            return AsyncForwardHTTPConnection(
                proxy_origin=self.origin,
                remote_origin=origin,
                proxy_headers=self._headers,
                keepalive_expiry=keepalive_expiry,
                network_backend=network,
                proxy_ssl_context=proxy_ssl_context,
            )
        return AsyncTunnelHTTPConnection(
            proxy_origin=self.origin,
            remote_origin=origin,
            ssl_context=ssl_context,
            proxy_ssl_context=proxy_ssl_context,
            proxy_headers=self._headers,
            keepalive_expiry=keepalive_expiry,
            network_backend=network,
        )


class _Holding(httpcore2.AsyncNetworkBackend):
    """The backend a SOCKS connection opens its socket through, holding on to it.

    httpcore2's `AsyncSocks5Connection` forgets its socket when the SOCKS handshake fails
    or is cancelled (a proxy that never answers, a deadline): its ``aclose`` closes only a
    finished connection, so the socket stayed open until the GC found it.
    """

    def __init__(self, network: httpcore2.AsyncNetworkBackend) -> None:
        self._network = network
        self.streams: list[httpcore2.AsyncNetworkStream] = []

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        stream = await self._network.connect_tcp(host, port, timeout, local_address, socket_options)
        self.streams.append(stream)
        return stream

    async def sleep(self, seconds: float) -> None:
        await self._network.sleep(seconds)


class _SocksConnection(httpcore2.AsyncConnectionInterface):
    """httpcore2's SOCKS5 connection, whose ``aclose`` also closes a half-made socket."""

    def __init__(self, inner: httpcore2.AsyncConnectionInterface, holding: _Holding) -> None:
        self._inner = inner
        self._holding = holding

    async def handle_async_request(self, request: httpcore2.Request) -> httpcore2.Response:
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            streams, self._holding.streams = self._holding.streams, []
            for stream in streams:
                await stream.aclose()

    def info(self) -> str:
        return self._inner.info()

    def can_handle_request(self, origin: httpcore2.Origin) -> bool:
        return self._inner.can_handle_request(origin)

    def is_available(self) -> bool:
        return self._inner.is_available()

    def has_expired(self) -> bool:
        return self._inner.has_expired()

    def is_idle(self) -> bool:
        return self._inner.is_idle()

    def is_closed(self) -> bool:
        # Closed only once our aclose has let go of the socket it may be holding.
        return self._inner.is_closed() and not self._holding.streams

    def is_connected(self) -> bool:
        return self._inner.is_connected()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} [{self.info()}]>"


def _parse(url: object) -> httpx.Proxy:
    """``url`` as an ``httpx.Proxy`` (which moves its userinfo to ``auth``)."""
    problem = None
    try:
        return httpx.Proxy(url=url)  # type: ignore[arg-type]  # checked by the except
    except (ValueError, TypeError, httpx.InvalidURL):
        problem = _what_is_wrong(url)
    # Raised outside the except block: httpx's message (the chained context) quotes the
    # URL, userinfo and all.
    raise InvalidRequestError(problem)


def _what_is_wrong(proxy: object) -> str:
    """Why ``proxy`` is not a proxy URL, quoting at most its scheme (never its userinfo)."""
    if not isinstance(proxy, str | httpx.URL):
        return f"proxy must be a URL or an httpx.Proxy, got {type(proxy).__name__}"
    scheme, sep, _ = str(proxy).partition("://")
    if not sep:
        return "proxy must be a URL with a scheme: http://, https://, socks5:// or socks5h://"
    if scheme not in _SCHEMES and scheme.isalnum() and len(scheme) <= 10:
        return f"proxy URL scheme must be http, https, socks5 or socks5h, got {scheme!r}"
    return "proxy is not a valid http, https, socks5 or socks5h URL (URL not shown)"


def _socksio_installed() -> bool:
    try:
        import socksio  # noqa: F401  # httpcore2's SOCKS5 connection imports it
    except ImportError:
        return False
    return True


class ProxyRoutes:
    """Which `ProxyRoute` (or None: direct) each origin takes, as httpx would choose."""

    __slots__ = ("_memo", "_patterns")

    def __init__(self, mounts: Mapping[str, ProxyRoute | None]) -> None:
        # httpx sorts its mounts this way: the most specific pattern matches first.
        self._patterns = sorted(
            ((URLPattern(key), route) for key, route in mounts.items()), key=lambda p: p[0]
        )
        self._memo: dict[tuple[bytes, bytes, int], ProxyRoute | None] = {}

    def __repr__(self) -> str:
        shown = ", ".join(f"{p.pattern}: {r.shown if r else 'direct'}" for p, r in self._patterns)
        return f"<ProxyRoutes {shown}>"

    def route(self, origin: httpcore2.Origin) -> ProxyRoute | None:
        """The proxy for ``origin`` (None: connect directly). O(1) once seen."""
        key = (origin.scheme, origin.host, origin.port)
        memo = self._memo
        if key in memo:
            return memo[key]
        url = httpx.URL(
            scheme=origin.scheme.decode("ascii"),
            host=origin.host.decode("ascii"),
            port=origin.port,
        )
        found = next((route for pattern, route in self._patterns if pattern.matches(url)), None)
        if len(memo) >= _MEMO_MAX:
            memo.clear()
        memo[key] = found
        return found


def proxy_routes(
    proxy: ProxyTypes | None,
    *,
    trust_env: bool,
    ssl_context: ssl.SSLContext | None = None,
) -> ProxyRoutes | None:
    """The routes for an explicit ``proxy`` or, with ``trust_env``, the environment's.

    None when every origin connects directly (no proxy anywhere): the pool's fast path.

    Raises:
        InvalidRequestError: ``proxy`` (or a proxy variable) is not a usable proxy URL.
    """
    if proxy is not None:
        return ProxyRoutes({"all://": ProxyRoute(proxy, ssl_context=ssl_context)})
    if not trust_env:
        return None
    mounts: dict[str, ProxyRoute | None] = {}
    for key, url in get_environment_proxies().items():
        if url is None:
            mounts[key] = None
            continue
        try:
            mounts[key] = ProxyRoute(url, ssl_context=ssl_context)
        except InvalidRequestError as e:
            name = _ENV_NAMES.get(key, "a proxy variable")
            raise InvalidRequestError(f"{name} from the environment: {e}") from None
    if not any(route is not None for route in mounts.values()):
        return None
    return ProxyRoutes(mounts)
