"""`Network`: how the pool opens sockets — DNS that cannot starve, TLS that cannot leak.

httpcore2's anyio backend, with two holes closed:

- **DNS.** ``anyio.connect_tcp(name, ...)`` resolves through ``loop.getaddrinfo``, which on
  asyncio runs in the loop's default executor (``min(32, cpus + 4)`` threads: 6 on a 2-core
  box). A dozen lookups that hang on an unresponsive resolver fill it: every later call by
  name waits behind them, and ``asyncio.run`` waits for them at shutdown. Here each lookup
  runs ``getaddrinfo`` in a daemon thread of its own, counted on a `anyio.CapacityLimiter`
  (``max_lookups``) that belongs to this backend. A caller waits for its answer only inside
  its connect bound; a lookup that never returns keeps its token (so hung lookups stay
  bounded in number) but holds up nobody and nothing at shutdown. Concurrent lookups of the
  same name share one thread. Connections then go to the resolved addresses, which anyio
  connects without resolving again, staggered as anyio does for a name (happy eyeballs).
- **TLS.** httpcore's ``start_tls`` closes the TCP stream only when the handshake raises an
  ``Exception``; a cancellation (a deadline) left the socket open until the garbage
  collector found it. Here any exit but success closes it at once (``aclose_forcefully``).

``resolver`` is the seam for tests and for callers with their own name service: a blocking
``(host, port) -> [(family, address), ...]`` function, run in the lookup thread.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import httpcore2
from httpcore2._backends.anyio import AnyIOStream

from .._exceptions import InvalidRequestError

__all__ = ["Network", "Resolver", "system_resolver"]

# How long one connection attempt runs alone before the next address is tried alongside.
_HAPPY_EYEBALLS_DELAY = 0.25

Resolver = Callable[[str, int], Sequence[tuple[int, str]]]
"""A blocking name lookup: ``(host, port) -> [(socket family, IP address), ...]``."""


def system_resolver(host: str, port: int) -> list[tuple[int, str]]:
    """The operating system's resolver (``getaddrinfo``), IPv6 addresses first."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses: list[tuple[int, str]] = []
    for family, _, _, _, sockaddr in found:
        entry = (int(family), str(sockaddr[0]))
        if entry not in addresses:
            addresses.append(entry)
    addresses.sort(key=lambda a: a[0] != socket.AF_INET6)
    return addresses


@contextmanager
def _connect_errors(timeout: float | None) -> Iterator[None]:
    """Bound a connect step and map its failures to httpcore2's (the engine maps those)."""
    try:
        with anyio.fail_after(timeout):
            yield
    except TimeoutError as e:
        raise httpcore2.ConnectTimeout(str(e) or "connect timed out") from e
    except (OSError, anyio.BrokenResourceError) as e:
        raise httpcore2.ConnectError(str(e) or type(e).__name__) from e


class _Lookup:
    """One lookup in flight: its answer, and the event its waiters wait on."""

    __slots__ = ("abandoned", "addresses", "done", "error")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.abandoned = False
        self.addresses: Sequence[tuple[int, str]] = ()
        self.error: BaseException | None = None


class _TLSClosingStream(AnyIOStream):
    """httpcore2's anyio stream whose TLS handshake closes the socket on any failure."""

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        try:
            return await super().start_tls(ssl_context, server_hostname, timeout)
        except BaseException:
            # Cancelled mid-handshake: close now, not when the GC finds the socket.
            await anyio.aclose_forcefully(self._stream)
            raise


async def _connect_first(
    addresses: Sequence[tuple[int, str]], port: int, local_address: str | None
) -> anyio.abc.SocketStream:
    """Connect to the first address that answers (RFC 8305's "happy eyeballs", as anyio does
    for names): the next attempt starts when the one before fails or after 250 ms, and the
    first to connect wins; the others are cancelled or closed."""
    if len(addresses) == 1:
        # Nothing to race: no task group, task, event and timer of ours. A connect cut by
        # its deadline then unwinds in the caller's task, not a child's it must wait for
        # (in a wave of deadlines every hop through the loop makes the call later).
        return await anyio.connect_tcp(addresses[0][1], port, local_host=local_address)
    winner: anyio.abc.SocketStream | None = None
    failures: list[OSError] = []

    async def attempt(address: str, finished: anyio.Event) -> None:
        nonlocal winner
        try:
            stream = await anyio.connect_tcp(address, port, local_host=local_address)
        except OSError as e:
            failures.append(e)
            return
        finally:
            finished.set()
        if winner is None:
            winner = stream
            tg.cancel_scope.cancel()
        else:
            await anyio.aclose_forcefully(stream)

    try:
        async with anyio.create_task_group() as tg:
            for _, address in addresses:
                finished = anyio.Event()
                tg.start_soon(attempt, address, finished)
                with anyio.move_on_after(_HAPPY_EYEBALLS_DELAY):
                    await finished.wait()
    except BaseException:
        if winner is not None:
            await anyio.aclose_forcefully(winner)
        raise
    if winner is None:
        raise failures[-1] if failures else OSError("no address to connect to")
    return winner


class Network(httpcore2.AsyncNetworkBackend):
    """The pool's network backend: bounded DNS in its own threads, leak-free TLS.

    Args:
        max_lookups: name lookups running at once, hung ones included (default 32). A
            lookup past that waits for a token, inside its call's connect bound.
        resolver: the blocking lookup function (default `system_resolver`).
    """

    def __init__(self, *, max_lookups: int = 32, resolver: Resolver | None = None) -> None:
        if isinstance(max_lookups, bool) or not isinstance(max_lookups, int) or max_lookups < 1:
            raise InvalidRequestError(f"max_lookups must be a positive int, got {max_lookups!r}")
        self.max_lookups = max_lookups
        self._resolver: Resolver = resolver if resolver is not None else system_resolver
        self._limiter: anyio.CapacityLimiter | None = None
        self._lookups: dict[tuple[str, int], _Lookup] = {}

    @property
    def lookups_running(self) -> int:
        """Lookup threads that have not returned yet (hung ones included)."""
        return self._limiter.borrowed_tokens if self._limiter is not None else 0

    async def resolve(self, host: str, port: int) -> Sequence[tuple[int, str]]:
        """The addresses of ``host``: an IP literal as is, a name through the resolver."""
        try:
            ip = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            pass
        else:
            family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
            return [(int(family), ip.compressed)]
        key = (host, port)
        while True:
            lookup = self._lookups.get(key)
            if lookup is None:
                lookup = self._lookups[key] = _Lookup()
                try:
                    await self._start(key, lookup)
                except BaseException:
                    # Cancelled waiting for a token: whoever joined meanwhile starts anew.
                    del self._lookups[key]
                    lookup.abandoned = True
                    lookup.done.set()
                    raise
            await lookup.done.wait()
            if not lookup.abandoned:
                break
        if lookup.error is not None:
            raise lookup.error
        if not lookup.addresses:
            raise OSError(f"no address found for {host!r}")
        return lookup.addresses

    async def _start(self, key: tuple[str, int], lookup: _Lookup) -> None:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.max_lookups)
        limiter = self._limiter
        await limiter.acquire_on_behalf_of(lookup)
        token = anyio.lowlevel.current_token()

        def finish() -> None:  # on the event loop, when the thread returns
            limiter.release_on_behalf_of(lookup)
            if self._lookups.get(key) is lookup:
                del self._lookups[key]
            lookup.done.set()

        def work() -> None:  # in the lookup thread
            try:
                lookup.addresses = list(self._resolver(*key))
            except Exception as e:
                lookup.error = e
            # If the loop has ended there is nobody left to tell.
            with suppress(Exception):
                anyio.from_thread.run_sync(finish, token=token)

        thread = threading.Thread(target=work, name=f"stallproof DNS {key[0]}", daemon=True)
        try:
            thread.start()
        except BaseException:
            limiter.release_on_behalf_of(lookup)
            raise

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        with _connect_errors(timeout):
            addresses = await self.resolve(host, port)
            stream = await _connect_first(addresses, port, local_address)
            try:
                for option in socket_options or ():
                    stream.extra(anyio.abc.SocketAttribute.raw_socket).setsockopt(*option)
            except BaseException:
                await anyio.aclose_forcefully(stream)
                raise
            return _TLSClosingStream(stream)
        raise AssertionError("unreachable")  # pragma: no cover - _connect_errors re-raises

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        with _connect_errors(timeout):
            stream = await anyio.connect_unix(path)
            return _TLSClosingStream(stream)
        raise AssertionError("unreachable")  # pragma: no cover

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)
