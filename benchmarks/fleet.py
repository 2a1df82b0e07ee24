"""Fleet state on Redis: what it adds per call, and how close a fleet keeps to its limit.

1. **Admission overhead.** One process admits calls through a `Pacer` (requests per minute
   and a concurrency limit) and a `Breaker`'s circuit, with local state and with
   ``shared=RedisState(...)`` on a redis-server on loopback, in interleaved rounds. Each
   admission is what a call does before it is sent: ``PacerRuntime.acquire`` then
   ``Circuit.admit``, and after it ``release``/``success`` (which send their Redis updates
   in the background). ``shared`` is what the engine does: the pacer's grant brings the
   breaker's verdict, one round trip (``FLEET_ADMIT``); ``shared-2rt`` asks them in turn,
   two round trips (as before). Reported: median and p99 per admission, and what the fleet
   adds over local state at each; and, as the floor, one redis-py PING round trip on the
   same machine.
2. **Fleet accuracy.** ``--workers`` processes each call a healthy fault server as fast as
   they can for ``--seconds``, all with ``Pacer(requests_per_minute=--rpm)``: once with
   local pacers, once sharing one through Redis. Reported: calls the server received vs the
   limit (the 60 s window cannot refill within the run, so the limit is the most the fleet
   may send). Each worker runs 8 calls at a time; its RedisState has op_timeout=0.5, so that
   a busy machine's first connections do not fall back to local state (the run says if any
   did).

Needs redis-server on PATH (``apt-get install redis-server``); it starts its own on a free
loopback port and stops it at the end. Every loop is bounded in count and in time.

    PYTHONPATH=src:. python benchmarks/fleet.py [--admissions 2000] [--workers 4] [--rpm 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import stallproof
from fault_server import running
from stallproof._breaker import BreakerRegistry
from stallproof._fleet import Stores
from stallproof._pacer import PacerRuntime

ROUNDS = 10
# Admissions per round not counted: a round's new connection pool opens its connections
# (and redis-py loads the scripts) on its first admissions, once per process in real use.
WARMUP = 20


@contextmanager
def redis_server() -> Iterator[str]:
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not os.path.exists(binary):
        sys.exit("redis-server is not installed (apt-get install redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly"]
    proc = subprocess.Popen([*args, "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):  # up to 10 s
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


async def _admissions(
    pacer: stallproof.Pacer, breaker: stallproof.Breaker, n: int, *, one_trip: bool
) -> list[float]:
    stores = Stores()  # as a client does: one connection pool for the pacer and the breaker
    pacing = PacerRuntime(pacer, stores=stores)
    circuits = BreakerRegistry(breaker, stores=stores)
    circuit = circuits.circuit("http://upstream", "m")
    loop = asyncio.get_running_loop()
    times: list[float] = []
    try:
        for i in range(WARMUP + n):
            start = time.perf_counter()
            deadline = loop.time() + 10
            permit = await pacing.acquire(
                agent="a",
                estimated_tokens=10,
                deadline=deadline,
                breaker=circuit.fleet if one_trip else None,
            )
            ticket = await circuit.admit(deadline=deadline, verdict=permit.fleet_verdict)
            ticket.success()
            permit.release(succeeded=True)
            if i >= WARMUP:
                times.append(time.perf_counter() - start)
            await asyncio.sleep(0)  # let the background releases run, as between real calls
        if pacing.shared_status() not in (None, "redis"):
            sys.exit(f"Redis failed during the run: {pacing.shared_status()}")
    finally:
        await pacing.aclose()
        await circuits.aclose()
    return times


async def _pings(url: str, n: int) -> list[float]:
    """The floor: one redis-py PING round trip on the same loop and machine."""
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(url)
    times: list[float] = []
    try:
        for i in range(WARMUP + n):
            start = time.perf_counter()
            await asyncio.wait_for(client.ping(), 5)
            if i >= WARMUP:  # the first opens the connection
                times.append(time.perf_counter() - start)
    finally:
        await client.aclose()
    return times


async def overhead(url: str, n: int) -> None:
    kinds = ["local", "shared", "shared-2rt"]
    results: dict[str, list[float]] = {kind: [] for kind in [*kinds, "PING"]}
    per_round = max(1, n // ROUNDS)
    for i in range(ROUNDS):
        results["PING"] += await _pings(url, per_round)
        for kind in kinds[i % 3 :] + kinds[: i % 3]:  # interleaved, each first in turn
            shared = (
                stallproof.RedisState(url, prefix=f"bench-{i}-{kind}") if kind != "local" else None
            )
            # rpm high enough never to hold a call: this measures bookkeeping, not waiting.
            pacer = stallproof.Pacer(
                max_concurrent=64, requests_per_minute=10_000_000, shared=shared
            )
            breaker = stallproof.Breaker(shared=shared)
            results[kind] += await _admissions(
                pacer, breaker, per_round, one_trip=kind != "shared-2rt"
            )
    print(f"admission overhead ({per_round * ROUNDS} admissions each, {ROUNDS} rounds)")
    print(f"{'state':<10} {'median ms':>10} {'p99 ms':>8}  {'over local: median':>18} {'p99':>8}")
    local = results["local"]
    for kind, times in results.items():
        med, p99 = statistics.median(times), _p99(times)
        extra = ""
        if kind.startswith("shared"):
            extra_med = (med - statistics.median(local)) * 1e3
            extra = f"  {extra_med:>+15.3f} ms {(p99 - _p99(local)) * 1e3:>+8.3f} ms"
        print(f"{kind:<10} {med * 1e3:>10.3f} {p99 * 1e3:>8.3f}{extra}")
    print()


async def worker(job: dict[str, Any]) -> None:
    shared = (
        stallproof.RedisState(job["redis"], prefix=job["prefix"], op_timeout=0.5)
        if job["redis"]
        else None
    )
    client = stallproof.Client(
        base_url=job["base_url"],
        api_key="sk-bench",
        retry=None,
        timeout=2.0,  # a call the window cannot admit fails at once (PacerTimeout)
        pacer=stallproof.Pacer(requests_per_minute=job["rpm"], shared=shared),
    )
    await asyncio.sleep(max(0.0, job["start_at"] - time.time()))
    stop = time.monotonic() + job["seconds"]
    counts = {"sent": 0, "refused": 0, "failed": 0}

    async def loop() -> None:
        while time.monotonic() < stop and sum(counts.values()) < 1_000_000:
            try:
                await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}]
                )
                counts["sent"] += 1
            except stallproof.PacerTimeout:
                counts["refused"] += 1
                await asyncio.sleep(0.01)
            except stallproof.StallproofError:  # a busy machine: a bound fired
                counts["failed"] += 1

    try:
        await asyncio.gather(*(loop() for _ in range(8)))
    finally:
        await client.aclose()
    state = client.pacer_state()
    assert state is not None  # the client was built with a pacer
    print(json.dumps({**counts, "shared": state.shared}))


def accuracy(url: str, workers: int, rpm: int, seconds: float) -> None:
    print(f"fleet accuracy ({workers} workers, requests_per_minute={rpm} each, {seconds:g} s)")
    print(f"{'pacers':<8} {'server saw':>10} {'limit':>6} {'sent/limit':>10}")
    with running(host="127.0.0.1", port=0) as srv:
        for kind in ("local", "shared"):
            key = f"bench-{kind}-{time.time_ns()}"
            job = {
                "base_url": srv.url("healthy", key=key),
                "redis": url if kind == "shared" else None,
                "prefix": key,
                "rpm": rpm,
                "seconds": seconds,
                "start_at": time.time() + 2.0 + 0.3 * workers,
            }
            procs = [
                subprocess.Popen(
                    [sys.executable, __file__, "--worker", json.dumps(job)],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for _ in range(workers)
            ]
            fell_back = 0
            for proc in procs:
                out, _ = proc.communicate(timeout=seconds + 60)
                fell_back += any(
                    (json.loads(line).get("shared") or "redis") != "redis"
                    for line in out.splitlines()
                )
            seen = srv.key_stats(key).requests
            note = f"  ({fell_back} workers ended on local state)" if fell_back else ""
            print(f"{kind:<8} {seen:>10} {rpm:>6} {seen / rpm:>10.2f}{note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--admissions", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rpm", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        asyncio.run(worker(json.loads(args.worker)))
        return
    with redis_server() as url:
        asyncio.run(overhead(url, min(args.admissions, 100_000)))
        accuracy(url, args.workers, args.rpm, min(args.seconds, 120.0))


if __name__ == "__main__":
    main()
