"""Does the total deadline hold when thousands of calls stall at once?

N calls start together on one event loop, each with ``Timeouts(total=1)``, against a
black-hole server: a loopback socket that listens (backlog 4,096) and never accepts, so the
kernel completes every TCP handshake, takes the request bytes and nothing ever answers. The
server costs no CPU. With the default ``Limits`` (100 connections) the first 100 calls stall
waiting for headers and the rest stall waiting for the pool; all of them must end with
`TotalTimeout` one second after they started.

For each call it records when it ended past its deadline (its *overshoot*) and reports
p50/p99/max per backend and pool:

- ``wire``: stallproof's own pool (`stallproof._wire._pool.Pool`), the default;
- ``httpcore2``: httpcore2's ``AsyncConnectionPool`` (pydantic's fork of httpcore) under the
  same engine;
- ``httpx``: a caller's plain ``httpx.AsyncClient`` (httpcore's pool) under the same engine.

Every run is bounded: N calls, each ended by its own 1 s deadline, the whole run cut at
``--budget`` seconds (calls still running then are counted as ``unfinished``).

    PYTHONPATH=src python benchmarks/scale.py          # N=100, 2000 and 10000, both backends
    python benchmarks/scale.py --calls 2000 --backend trio --pool httpcore2
    python benchmarks/scale.py --pool wire --pool httpcore2 --backend asyncio \\
        --calls 500 --calls 1000 --calls 2000 --bookkeeping   # CPU per bookkeeping pass
    python benchmarks/scale.py --calls 2000 --freeze   # the process's heap frozen first
    python benchmarks/scale.py --calls 10000 --backend trio --memory   # + heap per call

Memory per stalled call is taken once per run, when the most calls are in flight (all N
started and none ended, else as the first call ends), over the calls in flight then:
``rss KiB`` is the process's resident set then minus before the run (/proc/self/statm;
the figure of a process's first run only, as later runs reuse the memory earlier ones
freed: run one size and backend per process for it). With ``--memory``, ``heap KiB`` is
what Python allocated (`tracemalloc`, from the run's start: the benchmark's own task per
call included, ~4.4 KiB of it on asyncio) and ``objs/call`` the GC-tracked objects (~30 of
them the benchmark's own task's on asyncio); tracing slows every allocation, so the
timing columns of a ``--memory`` run do not compare with others.

``--freeze`` runs ``gc.collect(); gc.freeze()`` once, after the imports: what a latency-minded
service can do after start-up (CPython's `gc.freeze` documentation), so that full collections
during the storm no longer walk the ~110,000 objects the imports made (openai's and
pydantic's types among them). Its rows are a user's option, not the library's numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import os
import socket
import sys
import time
import tracemalloc
import warnings
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpcore2
import httpx
import sniffio

import stallproof
from stallproof._wire._pool import PoolStats

TOTAL = 1.0
POOLS = ("wire", "httpcore2", "httpx")


def black_hole() -> socket.socket:
    """A listening loopback socket that never accepts: every request stalls for ever."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)
    return sock


def make_client(url: str, pool: str) -> stallproof.Client:
    limits = stallproof.Limits()
    kwargs: dict[str, Any] = {}
    if pool == "httpx":
        kwargs["http_client"] = httpx.AsyncClient(
            limits=httpx.Limits(
                max_connections=limits.max_connections,
                max_keepalive_connections=limits.max_keepalive_connections,
            )
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the http_client warning
        client = stallproof.Client(
            base_url=url,
            api_key="sk-bench",
            timeout=stallproof.Timeouts(total=TOTAL),
            retry=None,
            **kwargs,
        )
    if pool == "httpcore2":
        client._engine.pool = Httpcore2Pool(limits)
    return client


class Httpcore2Pool:
    """httpcore2's own pool, with the engine's `Pool` interface."""

    def __init__(self, limits: stallproof.Limits) -> None:
        self._pool = httpcore2.AsyncConnectionPool(
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
        )

    async def send(self, request: httpcore2.Request) -> httpcore2.Response:
        return await self._pool.handle_async_request(request)

    def stats(self) -> PoolStats:
        queued = [r.is_queued() for r in self._pool._requests]
        conns = self._pool.connections
        return PoolStats(
            len(conns), sum(c.is_idle() for c in conns), queued.count(False), queued.count(True)
        )

    async def aclose(self) -> None:
        await self._pool.aclose()


class Bookkeeping:
    """CPU time (this thread's) spent in the pools' bookkeeping, with ``--bookkeeping``.

    httpcore2: ``_assign_requests_to_connections``, run on every arrival, cancellation and
    release. `Pool`: ``_checkout`` (arrival) and ``_grant`` (departure), its only passes.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self.passes = 0

    def wrap(self, owner: type, name: str) -> None:
        inner = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.thread_time() - t
                self.passes += 1

        setattr(owner, name, timed)

    def install(self) -> None:
        from httpcore2._async.connection_pool import AsyncConnectionPool

        from stallproof._wire._pool import Pool

        self.wrap(AsyncConnectionPool, "_assign_requests_to_connections")
        self.wrap(Pool, "_checkout")
        self.wrap(Pool, "_grant")


BOOKKEEPING = Bookkeeping()


class GCPauses:
    """How long the garbage collector stopped the loop during a run (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.total = 0.0
        self.longest = 0.0
        self.full: list[float] = []  # when each generation-2 collection started (monotonic)
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def reset(self) -> None:
        self.total, self.longest, self.full = 0.0, 0.0, []

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            if info["generation"] == 2:
                self.full.append(time.monotonic())
            return
        pause = time.perf_counter() - self._started
        self.total += pause
        self.longest = max(self.longest, pause)


GC = GCPauses()


@asynccontextmanager
async def spawner(
    spawn: str,
) -> AsyncIterator[Callable[[Callable[[], Coroutine[Any, Any, None]]], object]]:
    """Start tasks as a program on this backend would: its own task group (``native``:
    asyncio tasks gathered, a trio nursery), or anyio's (``anyio``), which on trio costs ~20 us
    more per task than the nursery it wraps (a `TaskHandle` and a cancel scope each)."""
    if spawn == "anyio":
        async with anyio.create_task_group() as tg:
            yield tg.start_soon
    elif sniffio.current_async_library() == "trio":
        import trio

        async with trio.open_nursery() as nursery:
            yield nursery.start_soon
    else:
        # asyncio.gather over tasks (asyncio.TaskGroup is 3.11+): what the budget cancels
        # is the gather, which cancels them all.
        tasks: list[asyncio.Future[None]] = []
        yield lambda f: tasks.append(asyncio.ensure_future(f()))
        await asyncio.gather(*tasks)


async def run(
    url: str,
    pool: str,
    calls: int,
    budget: float,
    memory: bool = False,
    spawn: str = "anyio",
) -> dict[str, Any]:
    client = make_client(url, pool)
    overshoot: list[float] = []
    outcomes: Counter[str] = Counter()

    starts: list[float] = []
    inflight = [0, 0]  # started, ended
    most = anyio.Event()  # the most calls are in flight: all started, or one ended

    async def one() -> None:
        start = time.monotonic()
        starts.append(start)
        inflight[0] += 1
        if inflight[0] == calls:
            most.set()
        try:
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "stall"}]
            )
            outcomes["answered"] += 1
        except stallproof.StallproofError as e:
            outcomes[type(e).__name__] += 1
        except Exception as e:  # an untyped error is a finding: count it by name
            outcomes[f"untyped {type(e).__name__}"] += 1
        inflight[1] += 1
        most.set()
        overshoot.append(time.monotonic() - start - TOTAL)

    peak: dict[str, float] = {}

    async def sample_peak() -> None:
        # Once, when the most calls are in flight: all started and none ended, else the
        # first call ended.
        await most.wait()
        n = inflight[0] - inflight[1]
        peak["calls"] = n
        peak["rss"] = (rss() - rss_before) / n
        if memory:
            peak["heap"] = (tracemalloc.get_traced_memory()[0] - heap_before) / n
            peak["objects"] = (len(gc.get_objects()) - objects_before) / n

    gc.collect()
    objects_before = len(gc.get_objects()) if memory else 0
    if memory:
        tracemalloc.start()
    heap_before = tracemalloc.get_traced_memory()[0] if memory else 0
    rss_before = rss()
    GC.reset()
    BOOKKEEPING.seconds, BOOKKEEPING.passes = 0.0, 0
    cpu = time.process_time()
    started = time.monotonic()
    with anyio.move_on_after(budget):
        async with spawner(spawn) as start_soon:
            start_soon(sample_peak)
            for _ in range(calls):
                start_soon(one)
    wall = time.monotonic() - started
    cpu = time.process_time() - cpu
    # Full collections in all, and those while the calls were ending (from the first
    # deadline on): a pause there makes every call due during it late by as much.
    ending = sum(t >= started + TOTAL for t in GC.full)
    gc_pauses = (GC.total, GC.longest, f"{len(GC.full)}/{ending}")
    unfinished = calls - len(overshoot)
    if memory:
        tracemalloc.stop()
    with anyio.move_on_after(10):
        await client.aclose()
        http = getattr(client._engine.pool, "_client", None)
        if http is not None:
            await http.aclose()
    return {
        "overshoot": overshoot,
        "outcomes": outcomes,
        "wall": wall,
        "cpu": cpu,
        "spread": max(starts) - min(starts) if starts else math.nan,
        "unfinished": unfinished,
        "bookkeeping": (BOOKKEEPING.seconds, BOOKKEEPING.passes),
        "gc": gc_pauses,
        "peak": peak,
    }


def rss() -> int:
    """The process's resident set, in bytes (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--calls", type=int, action="append", help="N (repeatable; default 100, 2000, 10000)"
    )
    parser.add_argument("--backend", choices=("asyncio", "trio"), action="append")
    parser.add_argument("--pool", choices=POOLS, action="append", help="default: wire")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per run at most")
    parser.add_argument(
        "--bookkeeping", action="store_true", help="also time the pools' bookkeeping passes"
    )
    parser.add_argument(
        "--freeze", action="store_true", help="gc.freeze() the heap after imports (a user option)"
    )
    parser.add_argument(
        "--memory", action="store_true", help="trace the heap and count objects (slows the run)"
    )
    parser.add_argument(
        "--spawn",
        choices=("native", "anyio"),
        default="anyio",
        help="start the calls in anyio's task group (default) or the backend's own",
    )
    args = parser.parse_args()
    sizes = args.calls or [100, 2000, 10_000]
    backends = args.backend or ["asyncio", "trio"]
    pools = args.pool or ["wire"]
    if any(n < 1 or n > 20_000 for n in sizes):
        parser.error("--calls must be 1..20000")
    sock = black_hole()
    host, port = sock.getsockname()
    url = f"http://{host}:{port}/v1"
    print(f"black-hole server {url}; total={TOTAL} s per call; python {sys.version.split()[0]}")
    if args.freeze:
        gc.collect()
        gc.freeze()
        print(f"gc.freeze() after imports: {gc.get_freeze_count()} objects frozen")
    if args.bookkeeping:
        BOOKKEEPING.install()
    columns = (
        "pool", "backend", "calls", "p50 ms", "p99 ms", "max ms", "start s", "cpu s", "gc s",
        "gc max", "full/end", "rss KiB", "heap KiB", "objs/call",
    )  # fmt: skip
    print(" ".join(f"{c:>8}" for c in columns) + "  outcomes")
    try:
        for pool in pools:
            for backend in backends:
                for n in sizes:
                    r = anyio.run(
                        run, url, pool, n, args.budget, args.memory, args.spawn, backend=backend
                    )
                    o = r["overshoot"]
                    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(r["outcomes"].items()))
                    if r["unfinished"]:
                        outcomes += f", unfinished {r['unfinished']}"
                    cells = [
                        f"{pool:>8}",
                        f"{backend:>8}",
                        f"{n:>8}",
                        *(f"{v * 1000:>8.1f}" for v in (pct(o, 0.5), pct(o, 0.99), pct(o, 1.0))),
                        f"{r['spread']:>8.2f}",
                        f"{r['cpu']:>8.2f}",
                        f"{r['gc'][0]:>8.2f}",
                        f"{r['gc'][1]:>8.2f}",
                        f"{r['gc'][2]:>8}",
                        *(
                            f"{r['peak'].get(k, math.nan) / d:>8.1f}"
                            for k, d in (("rss", 1024), ("heap", 1024), ("objects", 1))
                        ),
                    ]
                    if args.bookkeeping:
                        seconds, passes = r["bookkeeping"]
                        outcomes += (
                            f"; bookkeeping {seconds * 1000:.1f} ms CPU in {passes} passes"
                            f" ({seconds / max(passes, 1) * 1e6:.1f} us each)"
                        )
                    print(" ".join(cells) + f"  {outcomes}", flush=True)
    finally:
        sock.close()


if __name__ == "__main__":
    main()
