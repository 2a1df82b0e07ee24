"""`Pool`: the engine's connection pool — cannot be bricked, O(1) per arrival and departure.

A small HTTP/1.1 pool over httpcore2's connections (`httpcore2.AsyncHTTPConnection`, which
connects, does TLS and speaks h11 through our `Network` backend). Why not httpcore2's own
``AsyncConnectionPool`` is measured in docs/pool.md; in short, every arrival, cancellation and
release there rebuilds the set of every queued request's connection: at 2,000 queued calls
each pass costs ~90 us of CPU and grows with the queue, where ours cost 3-5 us at any size.

The pool's state is a count, a set and insertion-ordered dicts, and every change to it is
made without awaiting (I/O — closing a socket — comes after):

- ``_idle``: per origin, the idle connections (most recent last); ``_idle_order`` the same
  connections oldest first, for eviction when a new origin needs a slot;
- ``_waiting``: callers waiting for a slot, first come first served (dict: O(1) removal);
- ``_open``: connections open or opening; ``_busy``: connections handed to a caller.

Connections are keyed by origin *and* proxy (`stallproof._wire._proxy`): a connection through a
proxy is only ever reused for the same origin through the same proxy. Which proxy an origin
takes is worked out once per origin (httpx's rules) and remembered, so the key stays O(1).

Each connection has exactly one owner at a time — the pool (idle), one caller (in use), or
a waiter it was just granted to — and every exit path of the owner gives it back:

- a waiter cancelled or timed out after it was granted a connection passes it on;
- a caller whose request fails or is cancelled, at any point from connecting to reading,
  closes its connection and frees the slot (a connection that never connected is dropped:
  this is the slot httpcore leaks, encode/httpcore#1093);
- a response body, when closed, returns the connection idle (keep-alive) or closes it.

Freeing a slot grants it to the first waiter at once, so a queue never stalls behind a
slot nobody holds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import math
import os
import ssl
import sys
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
)
from typing import Any, Protocol

import anyio
import httpcore2
import sniffio

from .._config import Limits
from .._exceptions import InvalidRequestError
from ._h1 import H1Body, H1Connection
from ._messages import new_response
from ._network import Network
from ._proxy import ProxyRoute, ProxyRoutes, ProxyTypes, proxy_routes
from ._tls import shared_ssl_context

__all__ = ["CONNECTIONS", "DeadlinePassed", "Pool", "PoolStats", "RequestPlan", "open_pool"]

CONNECTIONS = ("auto", "httpcore2")

# Closing a connection is local (a FIN, a TLS close_notify at most): bounded all the same.
_CLOSE_BOUND = 5.0


@dataclasses.dataclass(frozen=True, slots=True)
class PoolStats:
    """A snapshot of the pool.

    Attributes:
        connections: open or opening connections (idle ones included).
        idle: open connections no call holds, kept for reuse.
        in_use: connections a call holds (connecting, sending, or its body unread).
        waiting: calls waiting for a connection.
    """

    connections: int
    idle: int
    in_use: int
    waiting: int

    @property
    def nothing_held(self) -> bool:
        """No call holds or waits for a connection: what every test checks after a fault."""
        return self.in_use == 0 and self.waiting == 0


_Conn = httpcore2.AsyncConnectionInterface
"""A connection: direct (`AsyncHTTPConnection`) or through a proxy (`stallproof._wire._proxy`)."""

_Key = tuple[bytes, bytes, int, ProxyRoute | None]
"""Where a connection goes, as a dict key (httpcore2's `Origin` is not hashable): scheme,
host, port, and the proxy it goes through (None: direct; routes hash by identity)."""


class RequestPlan(Protocol):
    """A request the pool builds only once it holds a connection for it (`Pool.send`).

    Thousands of calls may wait for a connection at once; a waiting call that holds only
    its plan holds none of the request's objects (its URL, headers, body stream,
    extensions) for the garbage collector to walk, and one that never gets a connection
    never builds them.
    """

    @property
    def scheme(self) -> bytes: ...

    @property
    def host(self) -> bytes: ...

    @property
    def port(self) -> int | None: ...

    @property
    def pool_timeout(self) -> float | None:
        """How long to wait for a connection (None: what encloses the call bounds it)."""
        ...

    @property
    def wait_deadline(self) -> float | None:
        """When the wait for a connection ends (the loop's clock), as the call's own bounds
        would end it had they started: `DeadlinePassed` (None: what encloses the call
        bounds the wait)."""
        ...

    def build(self) -> httpcore2.Request:
        """The request, built when a connection is there to send it on: where the call's
        own bounds start, if they wait for one (``wait_deadline``)."""
        ...


class DeadlinePassed(Exception):
    """A `RequestPlan`'s ``wait_deadline`` passed before a connection was free for it."""


class _Waiter:
    """A call waiting for a connection; ``granted`` is set (and the waiter woken) when it
    has one, ``fresh`` when that is a new connection, not yet connected.

    Thousands of calls may wait at once, so the wake-up is the loop's own, not an
    `anyio.Event` (which is an event, the loop's event, its deque and two coroutines per
    waiting call): on asyncio a bare future the waiting task awaits, on trio the task
    itself, parked. Either is woken at most once, and not at all once the wait was
    cancelled: the cancelled waiter finds ``granted`` as it leaves (`Pool._leave`).

    On trio the waiter is its own abort function (`__call__`) and, where trio's park
    message can be found (`_trio_park`), its own awaitable: it parks the task as
    `trio.lowlevel.wait_task_rescheduled` does, without that function's coroutine, the
    generator it yields through and the message they keep alive while the task waits:
    three objects fewer per waiting call for every full collection to walk (thousands may
    wait; benchmarks/README.md, "10,000 calls").
    """

    __slots__ = ("_future", "_task", "expired", "fresh", "granted", "key")

    def __init__(self, key: _Key) -> None:
        self.key = key
        self.granted: _Conn | None = None
        self.fresh = False
        self.expired = False  # its deadline ended the wait
        self._future: asyncio.Future[None] | None = None
        self._task: Any = None  # trio: the parked task until it is woken or cancelled

    def wait(self) -> Awaitable[None]:
        """Sleep until `wake` (cancellable: a cancel scope around it ends the wait).

        What it returns is awaited as it is: no coroutine of ours per waiting call.
        """
        if sniffio.current_async_library() == "asyncio":
            self._future = future = asyncio.get_running_loop().create_future()
            return future
        lowlevel = sys.modules["trio"].lowlevel
        self._task = lowlevel.current_task()
        if _trio_park() is not None:
            return self
        return lowlevel.wait_task_rescheduled(self)  # type: ignore[no-any-return]

    # -- trio: the waiter as the awaitable that parks its task (see the class docstring)

    def __await__(self) -> Generator[Any, Any, None]:
        return self  # type: ignore[return-value]  # an iterator with send: what await needs

    def __next__(self) -> Any:
        """The await's first step: park the task, this waiter its abort function."""
        park = _trio_park()
        assert park is not None
        return park(self)

    def send(self, outcome: Any) -> Any:
        """trio resumes the task with an outcome (`wake`: a value; cancelled: the error)."""
        raise StopIteration(outcome.unwrap())

    def __call__(self, raise_cancel: object) -> Any:
        """trio's abort function: cancelled while parked, so never rescheduled."""
        self._task = None
        return sys.modules["trio"].lowlevel.Abort.SUCCEEDED

    def wake(self) -> None:
        future = self._future
        if future is not None:
            if not future.done():  # (a cancelled wait's future is done)
                future.set_result(None)
            return
        task, self._task = self._task, None
        if task is not None:
            sys.modules["trio"].lowlevel.reschedule(task)

    def expire(self) -> None:
        """trio: its deadline passed (`_Deadlines`); a no-op once woken or cancelled."""
        task, self._task = self._task, None
        if task is not None:
            self.expired = True
            sys.modules["trio"].lowlevel.reschedule(task)


_NOT_LOOKED_UP: Any = object()
_park: Any = _NOT_LOOKED_UP


def _trio_park() -> Callable[[Any], Any] | None:
    """The message a trio task yields to park itself, as ``park(abort_func)`` (None: not found).

    It is the one `trio.lowlevel.wait_task_rescheduled` yields, so it is taken from there
    (its first step, run once, to the yield, outside the scheduler) rather than imported by
    its private name, and checked: should a trio release park differently, waiters fall
    back to that function. (tests/client/test_call_garbage.py counts what a waiting call
    holds on trio: it fails if they do.)
    """
    global _park
    if _park is _NOT_LOOKED_UP:
        _park = None
        lowlevel = sys.modules["trio"].lowlevel

        def abort(raise_cancel: object) -> Any:  # pragma: no cover - never called
            return lowlevel.Abort.SUCCEEDED

        step = lowlevel.wait_task_rescheduled(abort)
        try:
            message = step.send(None)
        except BaseException:  # pragma: no cover - trio parks by yielding a message
            message = None
        finally:
            step.close()
        if getattr(message, "abort_func", None) is abort:
            cls = type(message)
            try:
                parks = getattr(cls(abort), "abort_func", None) is abort
            except Exception:  # pragma: no cover - trio's message takes the function
                parks = False
            if parks:
                _park = cls
    return _park  # type: ignore[no-any-return]


class _Deadlines:
    """trio: the deadlines of the waits in one run, kept by one task (a system task).

    On trio a cancel scope around each wait is a scope, its status and two sets per
    waiting call, and when thousands of deadlines pass together trio delivers each
    cancellation as a captured `trio.Cancelled` with its traceback (six frames, a closure
    and an outcome kept alive until the task runs): a burst of young objects per call that
    drives the collector (benchmarks/README.md). Here a waiting call is one heap entry,
    and a passed deadline wakes its task as a grant would, marked ``expired``.

    Entries of waits that ended otherwise (granted, cancelled) are dropped as they come
    to the top, or all at once when the heap reaches twice the waits it held when last
    swept (at least 1,024 entries): stale entries never outnumber that.
    """

    __slots__ = ("_heap", "_scope", "_seq", "_sweep_at", "alive")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _Waiter]] = []
        self._seq = 0
        self._sweep_at = _SWEEP_MIN
        self._scope: Any = None  # the task's cancel scope while it sleeps
        self.alive = True

    def add(self, deadline: float, waiter: _Waiter) -> None:
        heap = self._heap
        if len(heap) >= self._sweep_at:
            heap[:] = [entry for entry in heap if entry[2]._task is not None]
            heapq.heapify(heap)
            self._sweep_at = max(_SWEEP_MIN, 2 * len(heap))
        heapq.heappush(heap, (deadline, self._seq, waiter))
        self._seq += 1
        scope = self._scope
        if scope is not None and deadline < scope.deadline:
            scope.deadline = deadline

    async def run(self) -> None:
        trio = sys.modules["trio"]
        heap = self._heap
        try:
            while True:
                with trio.CancelScope(deadline=heap[0][0] if heap else math.inf) as scope:
                    self._scope = scope
                    await trio.sleep_forever()
                self._scope = None
                now = trio.current_time()
                while heap and heap[0][0] <= now:
                    heapq.heappop(heap)[2].expire()
        finally:
            self.alive = False


_SWEEP_MIN = 1024
_deadlines_var: Any = None  # trio.lowlevel.RunVar, made on first use (trio imported)


def _keep(deadline: float, waiter: _Waiter) -> bool:
    """trio: have this run's `_Deadlines` end ``waiter``'s wait at ``deadline``; False if
    it cannot (the run is ending: no new system task), and a cancel scope must."""
    global _deadlines_var
    lowlevel = sys.modules["trio"].lowlevel
    if _deadlines_var is None:
        _deadlines_var = lowlevel.RunVar("stallproof_pool_deadlines", default=None)
    keeper: _Deadlines | None = _deadlines_var.get()
    if keeper is None or not keeper.alive:
        keeper = _Deadlines()
        try:
            lowlevel.spawn_system_task(keeper.run, name="stallproof pool deadlines")
        except RuntimeError:  # pragma: no cover - the run's system nursery is closed
            return False
        _deadlines_var.set(keeper)
    keeper.add(deadline, waiter)
    return True


class Pool:
    """The connection pool the engine sends through (HTTP/1.1, one request per connection).

    Args:
        limits: ``max_connections``, ``max_keepalive_connections`` and ``keepalive_expiry``.
        network: the `Network` backend (default: one with its own DNS limiter).
        ssl_context: for https (default: one context per process, certifi's roots:
            `stallproof._wire._tls`).
        proxies: the `ProxyRoutes` to send through (see `stallproof._wire._proxy.proxy_routes`);
            None: every origin directly.
        connection: what a direct connection is: ``"auto"`` (the default) an `H1Connection`
            on asyncio (HTTP/1.1 on an asyncio Protocol, llhttp-parsed: `stallproof._wire._h1`)
            and httpcore2's on trio; ``"httpcore2"`` httpcore2's on both. Proxied
            origins always use httpcore2's proxy connections.
    """

    def __init__(
        self,
        limits: Limits,
        *,
        network: Network | None = None,
        ssl_context: ssl.SSLContext | None = None,
        proxies: ProxyRoutes | None = None,
        connection: str = "auto",
    ) -> None:
        if connection not in CONNECTIONS:
            raise InvalidRequestError(
                f"connection must be one of {', '.join(CONNECTIONS)}, got {connection!r}"
            )
        self._connection = connection
        self._max_open = limits.max_connections
        self._max_idle = min(limits.idle_connections, limits.max_connections)
        self._keepalive_expiry = limits.keepalive_expiry
        self.network = network if network is not None else Network()
        self._ssl_context = ssl_context
        self.proxies = proxies
        self._idle: dict[_Key, dict[_Conn, None]] = {}
        self._idle_order: dict[_Conn, _Key] = {}
        self._busy: set[_Conn] = set()
        self._waiting: dict[_Waiter, None] = {}
        self._open = 0

    @property
    def unshielded(self) -> bool:
        """Whether, on asyncio, nothing it does awaits in a shielded region: every
        connection is an `H1Connection` (no proxy, no httpcore2), whose closing never
        suspends. The engine then bounds an attempt on asyncio's own cancellation
        (`stallproof._native_scope`), which a shield would not hold off."""
        return self._connection == "auto" and self.proxies is None

    def stats(self) -> PoolStats:
        return PoolStats(
            connections=self._open,
            idle=len(self._idle_order),
            in_use=len(self._busy),
            waiting=len(self._waiting),
        )

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"<Pool connections={s.connections} idle={s.idle} in_use={s.in_use} "
            f"waiting={s.waiting}>"
        )

    # -- sending -----------------------------------------------------------------------------

    async def send(self, request: httpcore2.Request | RequestPlan) -> httpcore2.Response:
        """Send ``request`` on a connection of its origin; the body, once closed, frees it.

        A `RequestPlan` is built once a connection is there for it.

        Raises:
            httpcore2.PoolTimeout: no connection within ``request.extensions["timeout"]["pool"]``
                (a plan's ``pool_timeout``).
            httpcore2.UnsupportedProtocol: not an http(s) URL.
            httpcore2 errors of the connection (connect, read, write, protocol).
        """
        key = self._key(request)
        closing: list[_Conn] = []
        conn = self._checkout(key, closing)
        try:
            await _close(closing)
            del closing  # not held while the call waits (thousands may)
            if conn is None:
                # The wait is here, not in a coroutine of its own: thousands of calls may
                # wait at once, and each coroutine is one more object per call for the
                # garbage collector to walk. A waiter that fails gives back what it was
                # granted (`_leave`); ``conn`` is still None then.
                waiter = _Waiter(key)
                self._waiting[waiter] = None
                timeout = _pool_timeout(request)
                until = None if isinstance(request, httpcore2.Request) else request.wait_deadline
                pool_deadline = None if timeout is None else anyio.current_time() + timeout
                deadline = _earliest(pool_deadline, until)
                try:
                    woken = waiter.wait()
                    if deadline is None or (waiter._task is not None and _keep(deadline, waiter)):
                        # No cancel scope (and no timer) at all: what encloses the call
                        # bounds it, or on trio the run's `_Deadlines`.
                        await woken
                    else:
                        # A bare cancel scope, not `anyio.fail_after` (two generators and
                        # their context managers more per waiting call).
                        with anyio.CancelScope(deadline=deadline) as cancel_scope:
                            await woken
                        waiter.expired = cancel_scope.cancelled_caught
                    del woken
                    if not waiter.expired and waiter._future is None:
                        # trio: woken with a connection as the call's own deadline passed
                        # (a wave of deadlines frees slots and ends their waiters in one
                        # batch), the cancellation comes at the next checkpoint: here, so
                        # that the connection goes on to the next waiter unopened
                        # (`_leave`), not at the connect, which makes one and closes it.
                        # (asyncio's cancellation lands in the wait itself.)
                        await sys.modules["trio"].lowlevel.checkpoint_if_cancelled()
                    if not waiter.expired and until is not None:
                        # The same for the plan's deadline, which no cancel scope holds.
                        waiter.expired = anyio.current_time() >= until
                except BaseException:
                    await self._leave(waiter)
                    raise
                if waiter.expired:
                    await self._leave(waiter)
                    if pool_deadline is not None and (until is None or pool_deadline < until):
                        raise httpcore2.PoolTimeout(f"no connection free within {timeout} s")
                    raise DeadlinePassed("no connection free before the call's deadline")
                conn, waiter.granted = waiter.granted, None  # (`_Deadlines` may hold the waiter)
                if conn is None:  # pragma: no cover - woken only with a connection
                    raise RuntimeError("the pool woke a waiter without a connection")
                del waiter
            if not isinstance(request, httpcore2.Request):
                request = request.build()
            response = await conn.handle_async_request(request)
        except BaseException:
            if conn is not None:
                await self._discard(conn)
            raise
        stream = response.stream
        if not isinstance(stream, AsyncIterable):  # pragma: no cover - httpcore2 is async
            await self._discard(conn)
            raise httpcore2.LocalProtocolError("the connection gave a sync response stream")
        return new_response(
            response.status, response.headers, _Body(stream, self, conn, key), response.extensions
        )

    def _key(self, request: httpcore2.Request | RequestPlan) -> _Key:
        """Where ``request`` goes, as a key: its origin and the proxy route it takes (checked
        here: a route that cannot be used fails before any wait)."""
        if isinstance(request, httpcore2.Request):
            url = request.url
            scheme, host, port = url.scheme, url.host, url.port
        else:
            scheme, host, port = request.scheme, request.host, request.port
        if scheme not in (b"http", b"https"):
            raise httpcore2.UnsupportedProtocol(
                f"unsupported URL scheme {scheme.decode('ascii', 'replace')!r}"
            )
        port = port or (443 if scheme == b"https" else 80)
        route = None
        if self.proxies is not None:
            route = self.proxies.route(httpcore2.Origin(scheme, host, port))
            if route is not None:
                route.check()
        return (scheme, host, port, route)

    async def aclose(self) -> None:
        """Close every connection; calls still running fail with a read/write error."""
        closing = list(self._idle_order) + list(self._busy)
        for conns in self._idle.values():
            conns.clear()
        self._open -= len(self._idle_order)
        self._idle_order.clear()
        await _close(closing)

    # -- the bookkeeping: no awaits below this line until _close -----------------------------

    def _checkout(self, key: _Key, closing: list[_Conn]) -> _Conn | None:
        """An idle connection for ``key``, a new one if a slot is free, else None."""
        idle = self._idle.get(key)
        while idle:
            conn, _ = idle.popitem()
            del self._idle_order[conn]
            if conn.has_expired() or not conn.is_idle():
                self._open -= 1
                closing.append(conn)
                continue
            self._busy.add(conn)
            return conn
        if self._open >= self._max_open:
            if not self._idle_order:
                return None
            closing.append(self._evict_oldest_idle())
            self._open -= 1
        return self._new(key)

    def _new(self, key: _Key) -> _Conn:
        scheme, host, port, route = key
        origin = httpcore2.Origin(scheme, host, port)
        conn: _Conn
        ssl_context = self._ssl_context
        if ssl_context is None and origin.scheme == b"https":
            ssl_context = shared_ssl_context()  # one per process, not one per connection
        if route is None and self._fast_wire():
            conn = H1Connection(
                origin,
                ssl_context=ssl_context,
                keepalive_expiry=self._keepalive_expiry,
                network=self.network,
            )
        elif route is None:
            conn = httpcore2.AsyncHTTPConnection(
                origin=origin,
                ssl_context=ssl_context,
                keepalive_expiry=self._keepalive_expiry,
                network_backend=self.network,
            )
        else:
            conn = route.connection(
                origin,
                ssl_context=ssl_context,
                keepalive_expiry=self._keepalive_expiry,
                network=self.network,
            )
        self._open += 1
        self._busy.add(conn)
        return conn

    def _fast_wire(self) -> bool:
        """Whether a direct connection is an `H1Connection` (asyncio only)."""
        if self._connection == "httpcore2":
            return False
        try:
            return sniffio.current_async_library() == "asyncio"
        except sniffio.AsyncLibraryNotFoundError:  # pragma: no cover - always in a loop
            return False

    def _evict_oldest_idle(self) -> _Conn:
        conn, key = next(iter(self._idle_order.items()))
        del self._idle_order[conn]
        del self._idle[key][conn]
        return conn

    async def _leave(self, waiter: _Waiter) -> None:
        """A waiter gives up (timed out, cancelled): out of the queue, or, if it was
        granted a connection as it was leaving, the connection goes on to the next waiter."""
        conn = waiter.granted
        if conn is None:
            del self._waiting[waiter]
        elif waiter.fresh:
            # Never connected: it goes on as it is (no socket to close, no new connection
            # to make), or its slot is freed. When a wave of deadlines ends many waiters at
            # once, each would otherwise make a connection for the next and close its own.
            closing: list[_Conn] = []
            if not self._grant(conn, waiter.key, closing, fresh=True):
                self._busy.discard(conn)
                self._open -= 1
            await _close(closing)
        else:
            await self._checkin(conn, waiter.key)

    def _grant(
        self, conn: _Conn | None, key: _Key | None, closing: list[_Conn], *, fresh: bool = False
    ) -> bool:
        """Give a freed slot (with ``conn``, idle or ``fresh``, or empty) to the first
        waiter, if any."""
        if not self._waiting:
            return False
        waiter = next(iter(self._waiting))
        del self._waiting[waiter]
        if conn is not None and key == waiter.key:
            waiter.granted = conn  # still counted in _busy: it changes hands
            waiter.fresh = fresh
        else:
            if conn is not None:
                self._busy.discard(conn)
                if not fresh:
                    closing.append(conn)
                self._open -= 1
            waiter.granted = self._new(waiter.key)
            waiter.fresh = True
        waiter.wake()
        return True

    async def _checkin(self, conn: _Conn, key: _Key) -> None:
        """A caller is done with ``conn`` (of origin ``key``): reuse it if idle, else close it."""
        if not conn.is_idle() or conn.is_closed():
            await self._discard(conn)
            return
        closing: list[_Conn] = []
        if not self._grant(conn, key, closing):
            self._busy.discard(conn)
            if len(self._idle_order) >= self._max_idle:
                closing.append(conn)
                self._open -= 1
            else:
                self._idle.setdefault(key, {})[conn] = None
                self._idle_order[conn] = key
        await _close(closing)

    async def _discard(self, conn: _Conn) -> None:
        """Close ``conn`` (it failed, was cancelled, or its body was cut) and free its slot."""
        closing = [conn]
        if conn in self._busy:
            self._busy.discard(conn)
            self._open -= 1
            self._grant(None, None, closing)
        await _close(closing)


class _Body:
    """A response body that gives its connection back to the pool when it is closed."""

    def __init__(
        self,
        stream: AsyncIterable[bytes],
        wire: Pool,
        conn: _Conn,
        key: _Key,
    ) -> None:
        self._stream = stream
        self._wire = wire
        self._conn = conn
        self._key = key
        self._closed = False

    @property
    def closes_at_once(self) -> bool:
        """Closing it does no I/O and never suspends (an `H1Connection`'s body): no shield
        or timer is needed around it."""
        return isinstance(self._stream, H1Body)

    def __aiter__(self) -> _Parts | H1Body:
        # An iterator object, not an async generator: a body dropped unread (a stream the
        # caller never iterated) is closed by `aclose`, and the GC finds no generator of
        # ours left suspended to warn about.
        stream = self._stream
        if isinstance(stream, H1Body):
            return stream  # already such an iterator (one hop less per read)
        return _Parts(stream.__aiter__())

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        stream = self._stream
        if isinstance(stream, H1Body):
            # Closing it is local and immediate (no I/O to wait for, nothing to shield).
            stream.close()
            await self._wire._checkin(self._conn, self._key)
            return
        with anyio.CancelScope(shield=True):
            try:
                aclose = getattr(self._stream, "aclose", None)
                if aclose is not None:
                    with anyio.move_on_after(_CLOSE_BOUND):
                        await aclose()
            finally:
                await self._wire._checkin(self._conn, self._key)


class _Parts:
    """The chunks of one body; `aclose` closes the connection's own generator with it."""

    __slots__ = ("_parts",)

    def __init__(self, parts: AsyncIterator[bytes]) -> None:
        self._parts = parts

    def __aiter__(self) -> _Parts:
        return self

    async def __anext__(self) -> bytes:
        return await self._parts.__anext__()

    async def aclose(self) -> None:
        if isinstance(self._parts, AsyncGenerator):
            with anyio.CancelScope(shield=True):
                await self._parts.aclose()


def _earliest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None or a <= b else b


def _pool_timeout(request: httpcore2.Request | RequestPlan) -> float | None:
    if isinstance(request, httpcore2.Request):
        timeout: float | None = request.extensions.get("timeout", {}).get("pool")
        return timeout
    return request.pool_timeout


async def _close(conns: list[_Conn]) -> None:
    """Close connections taken out of the pool: shielded, bounded."""
    if not conns:
        return
    with anyio.CancelScope(shield=True), anyio.move_on_after(_CLOSE_BOUND):
        for conn in conns:
            if not conn.is_closed():  # each close is a checkpoint: skip the closed ones
                await conn.aclose()


def open_pool(limits: Limits, *, trust_env: bool = True, proxy: ProxyTypes | None = None) -> Pool:
    """The engine's default pool: through ``proxy`` if given, else (with ``trust_env``)
    through the proxies the environment names, as httpx would (see `stallproof._wire._proxy`).

    ``STALLPROOF_CONNECTION=httpcore2`` in the environment (read when the client is built)
    makes its direct connections httpcore2's on asyncio too: the way back from the asyncio
    wire (`stallproof._wire._h1`) without a code change, should it ever be needed.
    """
    connection = os.environ.get("STALLPROOF_CONNECTION", "auto").strip().lower() or "auto"
    if connection not in CONNECTIONS:
        raise InvalidRequestError(
            f"STALLPROOF_CONNECTION must be one of {', '.join(CONNECTIONS)}, got {connection!r}"
        )
    return Pool(limits, proxies=proxy_routes(proxy, trust_env=trust_env), connection=connection)
