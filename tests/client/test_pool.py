"""The connection layer under attack (issue 15, items 1, 2, 7, 9): `Pool` and `Network`.

Every test runs over real loopback sockets, on asyncio and trio:

- bursts of stalled calls cut by their deadline never leave a dead slot (httpcore's pool,
  under the same burst, bricks: `test_httpcore_bricks_under_the_same_burst`);
- 2,000 stalled calls on one loop all end typed, close to their deadline;
- a TLS handshake cut by the deadline closes its socket at once, not at the next GC;
- name lookups that hang (a real DNS query to a loopback UDP socket that never answers,
  through the `Network(resolver=...)` seam) neither starve a later call nor hold up shutdown.
"""

from __future__ import annotations

import contextlib
import gc
import os
import random
import socket
import ssl
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpcore2
import httpx
import pytest

import stallproof
from stallproof._wire._network import Network, system_resolver
from stallproof._wire._pool import DeadlinePassed, Pool, _Deadlines, _Waiter
from stallproof._wire._proxy import ProxyRoute

from ..support.memory import freeze_heap
from ..support.timing import MARGIN, stopwatch, wait_until
from ..support.wire import ChatArgs

pytestmark = pytest.mark.anyio

BODY: ChatArgs = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
# How late the p99 of 2,000 stalled calls may end past total=1 s, beyond the time the loop
# took to start them all. Starting 2,000 calls costs the loop ~0.1-0.2 s of CPU on an idle
# core and 1.2-2.5 s on this 2-core machine shared by ~8 sessions (load average 8); ending
# them costs about the same, so calls started late end late. Measured in pytest under that
# load: p99 0.44-2.34 s with start spreads of 1.25-2.51 s (p99 never above the spread by
# more than 0.1 s). A pool whose work per arrival or departure grows with the queue ends
# them seconds to minutes late instead (httpcore: p99 21 s at 1,000 calls). Absolute
# numbers on a quiet machine are in benchmarks/scale.py. With both cores busy besides
# (scripts/stress_tests.py), 0.5 s was not always enough: the ends of 2,000 calls compete
# for half a core. A pool that grows with the queue is still seconds late.
SCALE_SLACK = float(os.environ.get("STALLPROOF_SCALE_SLACK", "1.0"))


@pytest.fixture
def black_hole() -> Iterator[str]:
    """A loopback listener that never accepts: the kernel takes each request, nobody answers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)
    host, port = sock.getsockname()
    yield f"http://{host}:{port}/v1"
    sock.close()


def engine_client(**settings: Any) -> tuple[httpx.AsyncClient, Any]:
    """An httpx client on stallproof's transport; and its pool, to look at."""
    settings.setdefault("retry", None)
    transport = stallproof.AsyncTransport(**settings)
    return httpx.AsyncClient(transport=transport), transport.engine.pool


async def burst(client: httpx.AsyncClient, url: str, calls: int) -> list[str]:
    """``calls`` requests at once to a stalling URL; the name of what each one raised."""
    errors: list[str] = []

    async def one() -> None:
        try:
            await client.post(url, json=BODY)
        except Exception as e:
            errors.append(type(e).__name__)

    async with anyio.create_task_group() as tg:
        for _ in range(calls):
            tg.start_soon(one)
    return errors


# A burst of 4 stalled calls per connection, all cut by their deadline at once: while the
# calls holding connections leave, their slots go to waiters that are leaving too. 80
# calls on 20 connections meet that race as 400 on 100 (the default Limits) do: the
# count per slot makes it, not the pool's size; and httpcore's bookkeeping, O(queue x
# connections) per event, made 400 cost it 2 s of CPU where 80 cost 0.1 s.
BURST_CONNECTIONS = 20
BURST = 4 * BURST_CONNECTIONS


@pytest.mark.slow
async def test_bursts_of_timeouts_leave_no_dead_slot(fault_server: Any) -> None:
    """Three bursts of 80 stalled calls on 20 connections, each cut by total=0.5 s, then a
    call the server answers at once: it gets a connection and its answer within a second.

    On httpcore's pool (plain httpx) the same bursts leave connections that were assigned
    to a request cancelled before they connected owned by nobody (at 400 calls on 100
    connections: 55 of 100 slots dead after the first burst, all 100 after the second),
    and the healthy call then fails with PoolTimeout (encode/httpcore#1093; see
    `test_httpcore_bricks_under_the_same_burst`).
    """
    client, pool = engine_client(
        timeout=stallproof.Timeouts(total=0.5, pool=1.0),
        limits=stallproof.Limits(max_connections=BURST_CONNECTIONS),
    )
    stall = fault_server.url("stall_headers", hold=5) + "/chat/completions"
    async with client:
        for _ in range(3):
            errors = await burst(client, stall, BURST)
            assert errors == ["TotalTimeout"] * BURST
            stats = pool.stats()
            assert stats.nothing_held, stats
            assert stats.connections == stats.idle == 0, stats  # stalled ones are closed
        with stopwatch() as t:
            r = await client.post(fault_server.url() + "/chat/completions", json=BODY)
        assert r.status_code == 200
        assert t[0] < 1.0
        assert pool.stats().nothing_held


async def test_random_cancellations_across_two_origins_leave_the_pool_whole(
    fault_server: Any,
) -> None:
    """200 calls over 4 connections (20 started every 5 ms), half to ``127.0.0.1`` and
    half to ``localhost`` (two origins, so freed slots change origin), each cancelled by the
    caller after a random 0-250 ms: in the queue, connecting, sending, waiting for headers
    or reading; some finish, and their connections are reused or handed over. Afterwards
    nothing is held, every open connection is idle, and both origins answer."""
    rng = random.Random(15)
    client, pool = engine_client(
        limits=stallproof.Limits(max_connections=4, max_keepalive_connections=2)
    )
    port = fault_server.url().split(":")[2].split("/")[0]
    paths = [f"http://{host}:{port}/v1/chat/completions" for host in ("127.0.0.1", "localhost")]
    slow = [p.replace("/v1/", "/fault/healthy;delay=0.02/v1/") for p in paths]
    async with client:

        async def one(i: int) -> None:
            with anyio.move_on_after(rng.uniform(0, 0.25)):
                await client.post((paths if i % 3 else slow)[i % 2], json=BODY)

        async with anyio.create_task_group() as tg:
            for i in range(200):
                tg.start_soon(one, i)
                if i % 20 == 19:
                    await anyio.sleep(0.005)
        stats = pool.stats()
        assert stats.nothing_held, stats
        assert stats.connections == stats.idle <= 2, stats
        for url in paths:
            with stopwatch() as t:
                r = await client.post(url, json=BODY)
            assert r.status_code == 200
            assert t[0] < 1.0
        assert pool.stats().nothing_held


async def test_a_wave_of_deadlines_through_the_queue_leaves_the_pool_whole(
    black_hole: str,
) -> None:
    """A queue ended all at once: 1 connection stalled on a server that never answers and
    60 calls waiting for it, all cancelled by one scope. Each freed slot goes to a waiter
    that is leaving too, which hands the new, never connected connection on (no socket, no
    new connection per waiter); afterwards nothing is held and nothing is open."""
    pool = Pool(stallproof.Limits(max_connections=1, max_keepalive_connections=1))
    url = httpx.URL(black_hole + "/chat/completions")

    async def one() -> None:
        request = httpcore2.Request(
            b"POST",
            httpcore2.URL(scheme=b"http", host=url.host.encode(), port=url.port, target=b"/v1"),
            headers=[(b"host", url.host.encode()), (b"content-length", b"2")],
            content=b"{}",
        )
        await pool.send(request)

    for _ in range(2):
        with anyio.move_on_after(0.3):
            async with anyio.create_task_group() as tg:
                for _ in range(61):
                    tg.start_soon(one)
        stats = pool.stats()
        assert stats.nothing_held and stats.connections == 0, stats
    await pool.aclose()


class CountingPlan:
    """A `RequestPlan` for ``url`` that counts how often the pool built its request."""

    def __init__(self, url: httpx.URL) -> None:
        self.scheme = url.scheme.encode()
        self.host = url.host.encode()
        self.port = url.port
        self.pool_timeout: float | None = None
        self.wait_deadline: float | None = None
        self.built = 0

    def build(self) -> httpcore2.Request:
        self.built += 1
        return httpcore2.Request(
            b"POST",
            httpcore2.URL(scheme=self.scheme, host=self.host, port=self.port, target=b"/v1"),
            headers=[(b"host", self.host), (b"content-length", b"2")],
            content=b"{}",
        )


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_waiter_woken_as_its_deadline_passes_passes_its_connection_on(
    black_hole: str,
) -> None:
    """In a wave of deadlines a freed slot goes to the first waiter, whose own deadline
    passes about as it is woken. On trio that cancellation comes at the waiter's next
    checkpoint: the pool takes it before building the request and connecting, and hands
    the new, never connected connection on (as a waiter cancelled while waiting does),
    rather than opening it only to close it and make one more for the next waiter."""
    import trio

    pool = Pool(stallproof.Limits(max_connections=1, max_keepalive_connections=1))
    url = httpx.URL(black_hole)
    holder_plan, waiter_plan = CountingPlan(url), CountingPlan(url)
    holder_scope, waiter_scope = trio.CancelScope(), trio.CancelScope()

    async def holder() -> None:
        with holder_scope:
            try:
                await pool.send(holder_plan)
            finally:
                # The pool freed the holder's slot and granted it to the waiter, which is
                # now scheduled to run: its deadline passes before it does.
                waiter_scope.cancel()

    async def waiter() -> None:
        with waiter_scope:
            await pool.send(waiter_plan)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(holder)
            await wait_until(lambda: pool.stats().in_use == 1, what="the holder connected")
            nursery.start_soon(waiter)
            await wait_until(lambda: pool.stats().waiting == 1, what="the waiter queued")
            holder_scope.cancel()
    assert holder_plan.built == 1
    assert waiter_plan.built == 0  # never sent: no request, no connect
    stats = pool.stats()
    assert stats.nothing_held and stats.connections == 0, stats
    await pool.aclose()


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_waiter_granted_as_its_plans_deadline_passes_passes_its_connection_on(
    black_hole: str,
) -> None:
    """The same race with the plan's own deadline, which no cancel scope holds (on trio the
    pool keeps it, `_Deadlines`): a waiter that runs with its connection after that deadline
    hands it on unopened and raises `DeadlinePassed`."""
    import trio

    pool = Pool(stallproof.Limits(max_connections=1, max_keepalive_connections=1))
    url = httpx.URL(black_hole)
    holder_plan, waiter_plan = CountingPlan(url), CountingPlan(url)
    holder_scope = trio.CancelScope()
    failed: list[BaseException] = []

    async def holder() -> None:
        with holder_scope:
            try:
                await pool.send(holder_plan)
            finally:
                # The slot went to the waiter, now scheduled to run; its deadline passes
                # before it does (this task does not yield until then).
                assert waiter_plan.wait_deadline is not None
                while trio.current_time() < waiter_plan.wait_deadline:
                    time.sleep(0.001)  # noqa: ASYNC251 - holding the loop is the point

    async def waiter() -> None:
        try:
            await pool.send(waiter_plan)
        except DeadlinePassed as e:
            failed.append(e)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(holder)
            await wait_until(lambda: pool.stats().in_use == 1, what="the holder connected")
            waiter_plan.wait_deadline = trio.current_time() + 0.2
            nursery.start_soon(waiter)
            await wait_until(lambda: pool.stats().waiting == 1, what="the waiter queued")
            holder_scope.cancel()
    assert len(failed) == 1
    assert waiter_plan.built == 0  # never sent: no request, no connect
    stats = pool.stats()
    assert stats.nothing_held and stats.connections == 0, stats
    await pool.aclose()


async def test_a_plans_deadline_ends_its_wait_in_the_queue_on_time(black_hole: str) -> None:
    """Calls queued behind a stalled connection, each with its plan's own deadline (what
    the engine's calls wait with on trio, where the pool keeps those deadlines in one task,
    not a cancel scope per waiter): each ends with `DeadlinePassed` at its deadline,
    unbuilt, out of the queue; calls cancelled from outside meanwhile leave as they would.
    The earlier of the plan's deadline and the pool's own timeout is the one that ends a
    wait, as its own error."""
    pool = Pool(stallproof.Limits(max_connections=1, max_keepalive_connections=1))
    url = httpx.URL(black_hole)
    holder = CountingPlan(url)
    late: list[float] = []
    outcomes: list[str] = []

    async def wait(plan: CountingPlan, deadline: float) -> None:
        try:
            await pool.send(plan)
        except (DeadlinePassed, httpcore2.PoolTimeout) as e:
            late.append(anyio.current_time() - deadline)
            outcomes.append(type(e).__name__)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            holder_scope = anyio.CancelScope()

            async def hold() -> None:
                with holder_scope:
                    await pool.send(holder)

            tg.start_soon(hold)
            await wait_until(lambda: pool.stats().in_use == 1, what="the holder connected")
            now = anyio.current_time()
            plans = []
            for i in range(40):
                plan = CountingPlan(url)
                plan.wait_deadline = now + 0.3 + 0.01 * i
                plans.append(plan)
                tg.start_soon(wait, plan, plan.wait_deadline)
            # Two more: one whose pool timeout comes first, one whose plan deadline does.
            pool_first, plan_first = CountingPlan(url), CountingPlan(url)
            pool_first.pool_timeout, pool_first.wait_deadline = 0.3, now + 5
            plan_first.pool_timeout, plan_first.wait_deadline = 5, now + 0.3
            tg.start_soon(wait, pool_first, now + 0.3)
            tg.start_soon(wait, plan_first, now + 0.3)
            # And ten cancelled from outside while they wait.
            with anyio.CancelScope() as outside:
                async with anyio.create_task_group() as cancelled:
                    for _ in range(10):
                        plan = CountingPlan(url)
                        plan.wait_deadline = now + 5
                        cancelled.start_soon(pool.send, plan)
                    await wait_until(lambda: pool.stats().waiting == 52, what="all queued")
                    outside.cancel()
            await wait_until(lambda: len(outcomes) == 42, what="every wait ended", timeout=5)
            assert pool.stats().waiting == 0
            holder_scope.cancel()
    assert sorted(outcomes) == ["DeadlinePassed"] * 41 + ["PoolTimeout"], outcomes
    assert [plan.built for plan in (*plans, pool_first, plan_first)] == [0] * 42
    assert min(late) >= 0
    assert max(late) <= MARGIN, late
    stats = pool.stats()
    assert stats.nothing_held and stats.connections == 0, stats
    await pool.aclose()


def test_the_deadlines_of_ended_waits_are_swept() -> None:
    """Waits that end before their deadline (granted, cancelled) leave their entries in the
    trio deadline keeper's heap until they come to the top; it is swept whenever it has
    doubled, so it never holds more than twice the waits in progress (or 1,024)."""
    keeper = _Deadlines()
    live = []
    for i in range(20_000):
        waiter = _Waiter((b"http", b"h", 80, None))
        if i % 100 == 0:
            waiter._task = object()  # still parked
            live.append(waiter)
        keeper.add(1e9 + i, waiter)  # far off: none comes to the top
        assert len(keeper._heap) <= max(1024, 2 * len(live)) + 1
    assert {id(entry[2]) for entry in keeper._heap} >= {id(w) for w in live}


async def test_idle_connections_are_capped_and_reused(fault_server: Any) -> None:
    """6 answered calls at once keep at most ``max_keepalive_connections`` idle; the next
    calls reuse them (the server sees no new connection) instead of opening more."""
    client, pool = engine_client(
        limits=stallproof.Limits(max_connections=6, max_keepalive_connections=2)
    )
    url = fault_server.url("healthy", delay=0.05) + "/chat/completions"
    async with client:

        async def one() -> None:
            assert (await client.post(url, json=BODY)).status_code == 200

        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(one)
        stats = pool.stats()
        assert (stats.connections, stats.idle, stats.in_use) == (2, 2, 0), stats
        before = fault_server.stats().connections_accepted
        for _ in range(3):
            r = await client.post(url, json=BODY)
            assert r.status_code == 200
        assert fault_server.stats().connections_accepted == before
        assert pool.stats() == stats


@pytest.mark.slow
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_httpcore_bricks_under_the_same_burst(fault_server: Any) -> None:
    """Evidence for the test above: httpcore's own pool (plain httpx, asyncio) is left with
    connections nobody owns after the same bursts (80 calls on 20 connections) cut by
    their deadline.

    One burst orphaned 3-20 of the 20 slots in 15 of 16 tries with two busy loops on both
    cores, none in the other (a process's first test); the orphans stay, so the test
    bursts up to three times on the same pool.

    If this starts failing, httpcore fixed encode/httpcore#1093: good news, tell the docs.
    """
    stall = fault_server.url("stall_headers", hold=5) + "/chat/completions"
    limits = httpx.Limits(max_connections=BURST_CONNECTIONS)
    async with httpx.AsyncClient(timeout=httpx.Timeout(10, pool=1.0), limits=limits) as client:

        async def one() -> None:
            with anyio.move_on_after(0.5):
                await client.post(stall, json=BODY)

        pool = client._transport._pool  # type: ignore[attr-defined]
        orphans: list[Any] = []
        for _ in range(3):
            async with anyio.create_task_group() as tg:
                for _ in range(BURST):
                    tg.start_soon(one)
            assert not pool._requests  # no call is waiting or running...
            orphans = [c for c in pool.connections if c.info() == "CONNECTING"]
            if orphans:
                break
        assert orphans  # ...yet these slots are taken, by nobody, for ever


@pytest.mark.slow
async def test_2000_stalled_calls_end_typed_and_on_time(black_hole: str) -> None:
    """2,000 calls at once with total=1 s against a server that never answers: every call
    raises TotalTimeout, and the p99 of how late they end is no more than the time the loop
    took to start them all, plus SCALE_SLACK.

    The pool's work per arrival and per departure does not grow with the queue; with
    httpcore's pool the p99 at 1,000 calls was 21 s, at 2,000 two minutes.
    """
    client = stallproof.Client(
        base_url=black_hole, api_key="sk-x", timeout=stallproof.Timeouts(total=1.0), retry=None
    )
    late: list[float] = []
    starts: list[float] = []
    errors: list[str] = []

    async def one() -> None:
        start = time.monotonic()
        starts.append(start)
        try:
            await client.chat.completions.create(**BODY)
        except Exception as e:
            errors.append(type(e).__name__)
        late.append(time.monotonic() - start - 1.0)

    # The test process's heap (pytest, every test module's AST) is many times a service's:
    # a full GC pass over it costs ~0.6 s here and lands in the storm. Frozen, as a
    # latency-minded service does after start-up (the session froze it after collection;
    # this freezes what earlier tests left); what the calls allocate is still collected.
    freeze_heap()
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for _ in range(2000):
                tg.start_soon(one)
    assert errors == ["TotalTimeout"] * 2000
    late.sort()
    p99 = late[int(0.99 * len(late)) - 1]
    assert min(late) >= 0
    spread = max(starts) - min(starts)
    # Late by at most what starting them took, with room for a loaded runner (seen: p99
    # 4.1 s after a 3.0 s spread with both cores busy besides); httpcore's pool: 21 s.
    assert p99 < 1.5 * spread + SCALE_SLACK, (
        f"p50 {statistics.median(late):.3f} p99 {p99:.3f} max {late[-1]:.3f} spread {spread:.3f}"
    )
    assert client._engine.pool.stats().nothing_held
    await client.aclose()
    assert client._engine.pool.stats().connections == 0


class SilentTLSServer:
    """Accepts TCP connections and never answers the TLS ClientHello; records when each
    connection's client end closed (EOF seen)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.closed_at: list[float] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            t = threading.Thread(target=self._drain, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _drain(self, conn: socket.socket) -> None:
        conn.settimeout(0.2)
        with conn:
            while not self._stop.is_set():
                try:
                    if not conn.recv(65536):
                        self.closed_at.append(time.monotonic())
                        return
                except TimeoutError:
                    continue

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)
        self.sock.close()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts fds in /proc")
async def test_tls_handshake_cut_by_the_deadline_closes_the_socket_at_once() -> None:
    """20 calls whose TLS handshake the deadline cuts: with the garbage collector off, every
    socket is closed by the time the call has raised (the server sees each EOF within
    MARGIN), and the process holds no more fds than before.

    httpcore's ``start_tls`` closes only on ``Exception``: a cancellation left the socket
    to the GC (288 of 600 still open on asyncio, 336 on trio).
    """
    server = SilentTLSServer()
    client = stallproof.Client(
        base_url=f"https://127.0.0.1:{server.port}/v1",
        api_key="sk-x",
        timeout=stallproof.Timeouts(total=0.3),
        retry=None,
    )
    gc.collect()
    gc.disable()
    try:
        before = open_fds()
        ended: list[float] = []

        async def one() -> None:
            with pytest.raises(stallproof.TotalTimeout):
                await client.chat.completions.create(**BODY)
            ended.append(time.monotonic())

        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(one)
        last_end = max(ended)
        deadline = time.monotonic() + MARGIN + 1.0
        # The server is a thread: there is nothing to await but time.
        while len(server.closed_at) < server.accepted and time.monotonic() < deadline:  # noqa: ASYNC110
            await anyio.sleep(0.01)
        assert server.accepted == 20
        assert len(server.closed_at) == 20  # all closed, without the GC
        assert max(server.closed_at) - last_end < MARGIN
        assert open_fds() <= before
        assert client._engine.pool.stats().nothing_held
    finally:
        gc.enable()
        await client.aclose()
        server.close()


async def test_one_address_is_connected_without_a_task_group(
    black_hole: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An origin with one address is connected by the loop's own connect, in the caller's
    task: no task group, task, events and cancel scopes of anyio's racing one address
    (`anyio.connect_tcp`), which on trio, repeated through a wave of deadlines freeing
    slots, were what set off a full collection among 10,000 calls' deadlines."""
    from stallproof._wire import _network

    assert _network._loop_backend is not None  # anyio still has it where we look

    def no_task_group() -> Any:
        raise AssertionError("a task group was made to connect to one address")

    network = Network()
    url = httpx.URL(black_hole)
    monkeypatch.setattr(anyio, "create_task_group", no_task_group)
    stream = await network.connect_tcp(str(url.host), int(url.port or 80), timeout=5)
    await stream.aclose()
    # A refusal is the socket's own error, mapped as before.
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    with pytest.raises(httpcore2.ConnectError):
        await network.connect_tcp("127.0.0.1", port, timeout=5)


class BlackHoleDNS:
    """A DNS server on loopback UDP that reads queries and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]

    def resolver(self, hang_for: float) -> Any:
        """A `Network` resolver that asks this server about names under ``.blackhole`` (a
        real query over UDP, waiting ``hang_for`` s for the answer that never comes) and
        the system about the rest."""

        def resolve(host: str, port: int) -> list[tuple[int, str]]:
            if not host.endswith(".blackhole"):
                return system_resolver(host, port)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.settimeout(hang_for)
                s.sendto(dns_query(host), ("127.0.0.1", self.port))
                s.recv(512)  # raises TimeoutError after hang_for: nobody answers
            raise OSError(f"no answer for {host}")

        return resolve

    def close(self) -> None:
        self.sock.close()


def dns_query(name: str) -> bytes:
    """A standard DNS query (A record) for ``name``."""
    header = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return header + labels + b"\x00\x00\x01\x00\x01"


async def test_a_name_whose_first_address_black_holes_connects_to_the_next(
    fault_server: Any,
) -> None:
    """A name resolving to a black-holed address first (127.0.0.2, a listener whose accept
    queue is full, so the kernel drops further SYNs) and to the healthy server second:
    the call answers within ~250 ms (the next attempt starts then), not after the connect
    bound. (Resolving names ourselves, we also connect to their addresses ourselves.)"""
    port = int(fault_server.url().split(":")[2].split("/")[0])
    hole = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    hole.bind(("127.0.0.2", port))
    hole.listen(0)
    fillers = []
    for _ in range(3):  # fill the accept queue: the next SYN gets no answer
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.2", port))
        fillers.append(s)

    def resolve(host: str, port: int) -> list[tuple[int, str]]:
        return [(socket.AF_INET, "127.0.0.2"), (socket.AF_INET, "127.0.0.1")]

    wire = Pool(stallproof.Limits(), network=Network(resolver=resolve))
    engine = stallproof.Engine(
        timeout=stallproof.Timeouts(connect=5, total=10), retry=None, pool=wire
    )
    client = httpx.AsyncClient(transport=stallproof.AsyncTransport(engine=engine))
    try:
        with stopwatch() as t:
            r = await client.post(f"http://two.test:{port}/v1/chat/completions", json=BODY)
        assert r.status_code == 200
        assert 0.25 <= t[0] < 0.25 + MARGIN + 0.2
        assert wire.stats().connections == 1
    finally:
        await client.aclose()
        await engine.aclose()
        await wire.aclose()  # the engine leaves a pool it was given to its owner
        for s in fillers:
            s.close()
        hole.close()


async def test_lookups_of_one_name_share_one_thread() -> None:
    """50 calls to one hung name start one lookup, not 50 threads."""
    dns = BlackHoleDNS()
    network = Network(resolver=dns.resolver(hang_for=5))
    try:
        with anyio.move_on_after(0.3):
            async with anyio.create_task_group() as tg:
                for _ in range(50):
                    tg.start_soon(network.resolve, "same.blackhole", 80)
        assert network.lookups_running == 1
    finally:
        dns.close()


def dns_threads(suffix: str) -> int:
    """Lookup threads of ours alive in this process for names ending in ``suffix``."""
    return sum(
        t.name.startswith("stallproof DNS ") and t.name.endswith(suffix)
        for t in threading.enumerate()
    )


async def test_hung_names_past_the_lookup_cap_do_not_starve_a_call_by_name(
    fault_server: Any,
) -> None:
    """100 calls (two waves of 50 at once) to 100 names whose lookups hang, more names than
    ``max_lookups``=32, each cut by connect=0.5 s (ConnectTimeout, on time); then a call by
    name (``localhost``) to a healthy server: it answers at once.

    On asyncio, ``anyio.connect_tcp`` resolves in the loop's default executor: 12 hung
    lookups fill it (6 threads on 2 cores) and the later call timed out behind them. Our
    own lookup threads then kept a limiter token each until the resolver returned, so 32
    hung names took every token and every later call by name timed out waiting for one
    (issue 21). A caller that gives up now frees its slot; its lookup counts against a cap
    of its own (``max_abandoned``) until the resolver returns.
    """
    suffix = f".{random.getrandbits(32):x}.blackhole"
    dns = BlackHoleDNS()
    network = Network(resolver=dns.resolver(hang_for=10))
    wire = Pool(stallproof.Limits(), network=network)
    engine = stallproof.Engine(
        timeout=stallproof.Timeouts(connect=0.5, total=5), retry=None, pool=wire
    )
    client = httpx.AsyncClient(transport=stallproof.AsyncTransport(engine=engine))
    try:

        async def hung(i: int) -> None:
            with stopwatch() as t, pytest.raises(stallproof.ConnectTimeout):
                await client.post(f"http://h{i}{suffix}/v1/chat/completions", json=BODY)
            assert 0.5 <= t[0] < 0.5 + MARGIN

        for wave in range(2):
            async with anyio.create_task_group() as tg:
                for i in range(50):
                    tg.start_soon(hung, wave * 50 + i)
        port = fault_server.url().split(":")[2].split("/")[0]
        with stopwatch() as t:
            r = await client.post(f"http://localhost:{port}/v1/chat/completions", json=BODY)
        assert r.status_code == 200
        assert t[0] < 0.5
        # Still hung, more than 32 of them, and counted. (Not always 100: a call whose
        # bound ends as a slot frees may give up before it starts its lookup.)
        assert 64 <= network.lookups_running == network.lookups_abandoned <= 100
        assert dns_threads(suffix) == network.lookups_running
        assert wire.stats().nothing_held
    finally:
        await client.aclose()
        await engine.aclose()
        await wire.aclose()  # the engine leaves a pool it was given to its owner
        dns.close()


async def test_a_thousand_callers_of_hung_names_hold_one_thread_per_name() -> None:
    """1,000 callers at once of 10 names whose lookups hang, each giving up after 0.3 s:
    10 lookup threads, all abandoned, and a healthy name still resolves at once."""
    suffix = f".{random.getrandbits(32):x}.blackhole"
    dns = BlackHoleDNS()
    try:
        network = Network(resolver=dns.resolver(hang_for=10))

        async def one(i: int) -> None:
            with anyio.move_on_after(0.3):
                await network.resolve(f"n{i % 10}{suffix}", 80)

        # What is timed here is the thread count; each caller's bound is the 0.3 s cancel
        # scope (ending 1,000 of them at once on a loaded 2-core box takes a while).
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for i in range(1000):
                    tg.start_soon(one, i)
        with stopwatch() as t:
            assert await network.resolve("localhost", 80)
        assert t[0] < 0.5
        assert network.lookups_running == network.lookups_abandoned == 10
        assert dns_threads(suffix) == 10
    finally:
        dns.close()


@pytest.mark.slow
async def test_hung_lookups_stay_bounded_and_end_when_the_resolver_returns() -> None:
    """40 names whose lookups hang for 1.5 s, asked one every 10 ms with each caller giving
    up after 0.2 s, on a `Network` with 4 lookup slots and 6 for abandoned lookups: never
    more than 10 lookup threads; callers past that give up inside their own bound; once
    the resolver returns, no thread, no lookup and no slot is left."""
    suffix = f".{random.getrandbits(32):x}.blackhole"
    dns = BlackHoleDNS()
    try:
        network = Network(max_lookups=4, max_abandoned=6, resolver=dns.resolver(hang_for=1.5))
        peak = 0

        async def one(i: int) -> None:
            nonlocal peak
            with stopwatch() as t:
                with anyio.move_on_after(0.2):
                    await network.resolve(f"n{i}{suffix}", 80)
            assert t[0] < 0.2 + MARGIN
            peak = max(peak, dns_threads(suffix))

        async with anyio.create_task_group() as tg:
            for i in range(40):
                tg.start_soon(one, i)
                await anyio.sleep(0.01)
        assert peak <= 10
        assert network.lookups_running == dns_threads(suffix) == 10
        await wait_until(lambda: network.lookups_running == 0, timeout=1.5 + 2 * MARGIN + 1)
        await wait_until(lambda: dns_threads(suffix) == 0, timeout=1)
        assert network.lookups_waiting == network.lookups_abandoned == 0
        # The slots are back: a healthy name resolves at once.
        with stopwatch() as t:
            assert await network.resolve("localhost", 80)
        assert t[0] < 0.5
    finally:
        dns.close()


@pytest.mark.slow
def test_hung_lookups_do_not_hold_up_shutdown() -> None:
    """``asyncio.run`` of a program whose 12 lookups hang returns, and the process exits,
    at once: the lookup threads are daemons of ours, not the loop's default executor (which
    ``asyncio.run`` waits for: 148 s in the report)."""
    dns = BlackHoleDNS()
    program = textwrap.dedent(
        f"""
        import asyncio, socket, time
        import anyio, stallproof
        from stallproof._wire._network import Network

        def resolve(host, port):
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.settimeout(30)
                s.sendto(b"q", ("127.0.0.1", {dns.port}))
                s.recv(512)
            raise OSError("no answer")

        async def main():
            network = Network(resolver=resolve)
            async def one(i):
                with anyio.move_on_after(0.2):
                    await network.connect_tcp(f"h{{i}}.blackhole", 80, timeout=0.2)
            await asyncio.gather(*(one(i) for i in range(12)))
            assert network.lookups_running == 12

        start = time.monotonic()
        asyncio.run(main())
        print(round(time.monotonic() - start, 3))
        """
    )
    try:
        with stopwatch() as t:
            done = subprocess.run(
                [sys.executable, "-c", program], capture_output=True, text=True, timeout=20
            )
        assert done.returncode == 0, done.stderr
        assert float(done.stdout) < 0.2 + MARGIN + 0.3
        # Interpreter start-up and imports included (seconds on a loaded box); a hung lookup
        # would hold the exit for its 30 s.
        assert t[0] < 15
    finally:
        dns.close()


async def test_https_connections_share_one_ssl_context() -> None:
    # httpcore2 builds a context per https connection when given none (~25 ms each, 0.2 s
    # the first): the pool hands every connection the process's one context instead.
    from stallproof._wire._tls import shared_ssl_context

    pool = Pool(stallproof.Limits())
    route = ProxyRoute("https://proxy.example:3128")
    conns = [
        pool._new((b"https", b"a.example", 443, None)),
        pool._new((b"https", b"b.example", 443, None)),
        pool._new((b"https", b"c.example", 443, route)),
    ]
    context = shared_ssl_context()
    assert all(c._ssl_context is context for c in conns[:2])  # type: ignore[attr-defined]
    assert conns[2]._proxy_ssl_context is context  # type: ignore[attr-defined]
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    await pool.aclose()
