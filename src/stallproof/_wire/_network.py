"""`Network`: how the pool opens sockets — DNS that cannot starve, TLS that cannot leak.

httpcore2's anyio backend, with two holes closed:

- **DNS.** ``anyio.connect_tcp(name, ...)`` resolves through ``loop.getaddrinfo``, which on
  asyncio runs in the loop's default executor (``min(32, cpus + 4)`` threads: 6 on a 2-core
  box). A dozen lookups that hang on an unresponsive resolver fill it: every later call by
  name waits behind them, and ``asyncio.run`` waits for them at shutdown. Here each lookup
  runs ``getaddrinfo`` in a daemon thread of its own, and concurrent lookups of one name
  share that thread. A caller waits for its answer only inside its connect bound; when
  every caller of a lookup has given up, its slot (``max_lookups``) is free for the next
  name at once and the lookup counts as *abandoned* (``max_abandoned``) until the resolver
  returns: hung names cannot starve calls to healthy ones, lookup threads stay bounded
  (``max_lookups + max_abandoned``), and none holds up shutdown. Connections then go to
  the resolved addresses, which anyio connects without resolving again, staggered as
  anyio does for a name (happy eyeballs).
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

from .._validate import check_int, invalid

__all__ = ["Network", "Resolver", "system_resolver"]

# The running loop's anyio backend, whose ``connect_tcp`` connects one IP address (what
# `anyio.connect_tcp` runs in each of its attempts). Not in anyio's public names; should a
# release move it, connects go through `anyio.connect_tcp` as before (tests/client/test_pool.py
# checks it is found).
_loop_backend: Callable[[], Any] | None
try:
    from anyio._core import _eventloop

    _loop_backend = _eventloop.get_async_backend
except (ImportError, AttributeError):  # pragma: no cover - anyio 4.4+ has it
    _loop_backend = None

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
    """One lookup in flight: its answer, the event its waiters wait on, and how many wait."""

    __slots__ = ("addresses", "done", "error", "waiters")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.waiters = 0
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
        # Nothing to race: no task group, task, event and timer of ours, nor of anyio's
        # (`anyio.connect_tcp` races even one address in a task group of its own: a task,
        # a nursery, events and cancel scopes per connect, where the loop's own connect is
        # a socket and one await). A connect cut by its deadline then unwinds in the
        # caller's task, not a child's it must wait for (in a wave of deadlines every hop
        # through the loop makes the call later; on trio, at 10,000 calls stalled, the
        # objects of those connects were what set off a full collection among them).
        address = addresses[0][1]
        if local_address is None and _loop_backend is not None:
            stream: anyio.abc.SocketStream = await _loop_backend().connect_tcp(address, port)
            return stream
        return await anyio.connect_tcp(address, port, local_host=local_address)
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

    A lookup is *waited on* while a call waits for its answer, and *abandoned* once every
    call waiting for it has given up (its connect bound or a cancellation) while its thread
    still runs. The two are counted apart, so lookups that hang cannot take the slots of
    calls to healthy names: a call that gives up frees its slot at once, and its lookup
    moves to the abandoned count until the resolver returns.

    Args:
        max_lookups: lookups waited on at once (default 32). A call whose name needs a new
            lookup past that waits for a slot, inside its connect bound.
        max_abandoned: abandoned lookups whose threads may still run (default 256). Past
            that, new lookups wait (inside their connect bound) until one returns, so
            lookup threads never number more than ``max_lookups + max_abandoned``. 0: an
            abandoned lookup keeps its slot until it returns.
        resolver: the blocking lookup function (default `system_resolver`).
    """

    def __init__(
        self,
        *,
        max_lookups: int = 32,
        max_abandoned: int = 256,
        resolver: Resolver | None = None,
    ) -> None:
        check_int("Network.max_lookups", max_lookups)
        check_int("Network.max_abandoned", max_abandoned, minimum=0)
        if resolver is not None and not callable(resolver):
            raise invalid("Network.resolver", "None or a callable", type(resolver).__name__)
        self.max_lookups = max_lookups
        self.max_abandoned = max_abandoned
        self._resolver: Resolver = resolver if resolver is not None else system_resolver
        # Every lookup whose thread has not returned, waited on or abandoned.
        self._lookups: dict[tuple[str, int], _Lookup] = {}
        self._waited = 0
        self._abandoned = 0
        self._freed: anyio.Event | None = None  # set (and dropped) when a slot frees

    @property
    def lookups_running(self) -> int:
        """Lookup threads that have not returned yet (hung ones included)."""
        return self._waited + self._abandoned

    @property
    def lookups_waiting(self) -> int:
        """Lookups that a call is waiting for."""
        return self._waited

    @property
    def lookups_abandoned(self) -> int:
        """Lookups whose callers all gave up, their threads still running."""
        return self._abandoned

    async def resolve(self, host: str, port: int) -> Sequence[tuple[int, str]]:
        """The addresses of ``host``: an IP literal as is, a name through the resolver."""
        try:
            ip = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            pass
        else:
            family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
            return [(int(family), ip.compressed)]
        lookup = await self._join((host, port))
        try:
            await lookup.done.wait()
        finally:
            self._leave(lookup)
        if lookup.error is not None:
            raise lookup.error
        if not lookup.addresses:
            raise OSError(f"no address found for {host!r}")
        return lookup.addresses

    async def _join(self, key: tuple[str, int]) -> _Lookup:
        """The lookup of ``key`` this call waits on: the one running (one thread per name),
        or a new one once a slot is free."""
        while True:
            lookup = self._lookups.get(key)
            if lookup is not None:
                if lookup.waiters == 0:  # abandoned, and wanted again
                    self._abandoned -= 1
                    self._waited += 1
                lookup.waiters += 1
                return lookup
            if self._waited < self.max_lookups and (
                self._waited + self._abandoned < self.max_lookups + self.max_abandoned
            ):
                return self._start(key)
            if self._freed is None:
                self._freed = anyio.Event()
            await self._freed.wait()

    def _leave(self, lookup: _Lookup) -> None:
        """A call stops waiting for ``lookup`` (answered, timed out or cancelled)."""
        lookup.waiters -= 1
        if lookup.waiters == 0 and not lookup.done.is_set():
            self._waited -= 1
            self._abandoned += 1
            self._wake()

    def _wake(self) -> None:
        if self._freed is not None:
            self._freed.set()
            self._freed = None

    def _start(self, key: tuple[str, int], /) -> _Lookup:
        """Start the lookup of ``key`` in a daemon thread; no await between the caller's
        check of the counts and this."""
        lookup = _Lookup()
        lookup.waiters = 1
        token = anyio.lowlevel.current_token()

        def finish() -> None:  # on the event loop, when the thread returns
            del self._lookups[key]
            if lookup.waiters:
                self._waited -= 1
            else:
                self._abandoned -= 1
            lookup.done.set()
            self._wake()

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
        except RuntimeError as e:  # "can't start new thread": the process is out of them
            raise OSError(f"cannot start a lookup thread: {e}") from e
        self._lookups[key] = lookup
        self._waited += 1
        return lookup

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
