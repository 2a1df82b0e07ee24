"""stallproof next to the floor of a Python HTTP client: CPU per call and per SSE event.

Six clients make the same chat completion calls to one canned server (`floor_server.py`,
in a child process: its CPU is not in the clients' process):

- ``httpx``, ``httpx2``, ``aiohttp``: raw clients, doing the least a caller must
  (``json()`` of a completion; a stream's lines read, ``json.loads`` per ``data:`` line);
- ``openai``: the stock SDK (``AsyncOpenAI(max_retries=0)``, on its own httpx2 client);
- ``stallproof``: ``stallproof.Client``, typed results, every bound on;
- ``face``: ``stallproof.openai.AsyncOpenAI``, the same SDK on stallproof's engine.

Every client keeps up to 100 idle connections, so none churns connections at 64 calls at
once. Measurements, each in interleaved rounds (every client runs one block per round, in
an order that rotates every round):

1. ``non-stream``: sequential calls;
2. ``stream``: sequential streamed calls of 16 content chunks, every chunk consumed;
3. ``64 concurrent``: 64 tasks sharing one client, half the calls streamed;
4. ``SSE``: ``--streams`` concurrent streams of ``--events`` content chunks each, sent as
   fast as the server can: events per second of the client process's CPU (one core's
   worth of events). The client is the slower side, so many events arrive per read.
5. ``SSE paced``: ``--paced-streams`` streams at once, each event ``--interval`` ms after
   the one before (a model's pace): each event arrives in a read of its own, so this one
   counts what a read costs as well as what an event does.

The number compared is the client process's CPU time per call (``time.process_time``),
which the machine's other load changes far less than latency; wall time per call is
reported too. Ratios are to ``aiohttp`` and are the median over rounds of each round's
ratio, so drift between rounds cancels.

    python benchmarks/floor.py [--calls 400] [--rounds 10] [--budget 120] [--only a,b]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Protocol

import aiohttp
import httpx
import httpx2
import openai

import stallproof
import stallproof.openai

CLIENTS = ("httpx", "httpx2", "aiohttp", "openai", "stallproof", "face")
BASE = "aiohttp"
MODEL = "fault-model"
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a benchmark."},
    {"role": "user", "content": "measure the cost of every client on this canned server"},
]
IDLE = 100  # idle connections every client keeps
CONCURRENCY = 64


class Bench(Protocol):
    async def call(self, stream: bool, url: str) -> int: ...
    async def aclose(self) -> None: ...


def _lines_events(line: str, out: list[str]) -> int:
    if not line.startswith("data:"):
        return 0
    data = line[5:].strip()
    if data == "[DONE]":
        return 0  # read on to the end of the body, so the connection is reused
    for c in json.loads(data).get("choices") or ():
        out.append((c.get("delta") or {}).get("content") or "")
    return 1


class HttpxBench:
    def __init__(self, module: Any) -> None:
        self.client = module.AsyncClient(
            timeout=30,
            headers={"Authorization": "Bearer bench"},
            trust_env=False,
            limits=module.Limits(max_connections=IDLE, max_keepalive_connections=IDLE),
        )

    async def call(self, stream: bool, url: str) -> int:
        body: dict[str, Any] = {"model": MODEL, "messages": MESSAGES}
        if not stream:
            r = await self.client.post(url, json=body)
            r.raise_for_status()
            str(r.json()["choices"][0]["message"]["content"])
            return 1
        body["stream"] = True
        parts: list[str] = []
        events = 0
        async with self.client.stream("POST", url, json=body) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                events += _lines_events(line, parts)
        return events

    async def aclose(self) -> None:
        await self.client.aclose()


class AiohttpBench:
    def __init__(self) -> None:
        connector = aiohttp.TCPConnector(limit=IDLE, limit_per_host=0, keepalive_timeout=30)
        self.session = aiohttp.ClientSession(
            connector=connector,
            headers={"Authorization": "Bearer bench"},
            timeout=aiohttp.ClientTimeout(total=30),
        )

    async def call(self, stream: bool, url: str) -> int:
        body: dict[str, Any] = {"model": MODEL, "messages": MESSAGES}
        if not stream:
            async with self.session.post(url, json=body) as r:
                r.raise_for_status()
                str((await r.json())["choices"][0]["message"]["content"])
            return 1
        body["stream"] = True
        parts: list[str] = []
        events = 0
        async with self.session.post(url, json=body) as r:
            r.raise_for_status()
            async for raw in r.content:
                events += _lines_events(raw.decode(), parts)
        return events

    async def aclose(self) -> None:
        await self.session.close()


class SDKBench:
    """The openai SDK's chat completions, on whatever client it was built with."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def call(self, stream: bool, url: str) -> int:
        create = self.client.chat.completions.create
        if not stream:
            resp = await create(model=MODEL, messages=MESSAGES)
            message = resp.choices[0].message if resp.choices else None
            str((message.content if message else None) or "")
            return 1
        parts: list[str] = []
        events = 0
        async for chunk in await create(model=MODEL, messages=MESSAGES, stream=True):
            events += 1
            for c in chunk.choices or ():
                if c.delta and c.delta.content:
                    parts.append(c.delta.content)
        return events

    async def aclose(self) -> None:
        close = getattr(self.client, "aclose", None) or self.client.close
        await close()


class Clients:
    """One client of each kind per base URL (the SDKs take the URL at construction)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = names
        self._made: dict[tuple[str, str], Bench] = {}

    def get(self, name: str, base: str) -> Bench:
        key = (name, base)
        if key not in self._made:
            self._made[key] = make(name, base)
        return self._made[key]

    async def aclose(self) -> None:
        for bench in self._made.values():
            await bench.aclose()


def make(name: str, base: str) -> Bench:
    limits = stallproof.Limits(max_connections=IDLE, max_keepalive_connections=IDLE)
    if name == "httpx":
        return HttpxBench(httpx)
    if name == "httpx2":
        return HttpxBench(httpx2)
    if name == "aiohttp":
        return AiohttpBench()
    if name == "openai":
        # openai's own default limits keep 100 idle connections (1,000 at most).
        return SDKBench(
            openai.AsyncOpenAI(base_url=base, api_key="bench", max_retries=0, timeout=120)
        )
    if name == "stallproof":
        return SDKBench(
            stallproof.Client(base_url=base, api_key="bench", timeout=120, limits=limits)
        )
    if name == "face":
        return SDKBench(
            stallproof.openai.AsyncOpenAI(
                base_url=base, api_key="bench", limits=limits, timeout=120
            )
        )
    raise ValueError(name)


# -- measurements --------------------------------------------------------------------------

Block = Callable[[Bench, str, int], Awaitable[int]]


async def sequential_plain(bench: Bench, url: str, n: int) -> int:
    for _ in range(n):
        await bench.call(False, url)
    return n


async def sequential_stream(bench: Bench, url: str, n: int) -> int:
    for _ in range(n):
        await bench.call(True, url)
    return n


async def concurrent_mixed(bench: Bench, url: str, n: int) -> int:
    todo = iter(range(n))

    async def worker() -> None:
        for i in todo:
            await bench.call(i % 2 == 1, url)

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return n


def many_streams(streams: int) -> Block:
    async def run(bench: Bench, url: str, n: int) -> int:
        # n streams in all, ``streams`` at a time; returns the content events received.
        todo = iter(range(n))
        events = 0

        async def worker() -> None:
            nonlocal events
            for _ in todo:
                got = await bench.call(True, url)  # (not `events += await`: a lost update)
                events += got

        await asyncio.gather(*(worker() for _ in range(streams)))
        return events

    return run


class Result:
    def __init__(self) -> None:
        self.cpu: list[float] = []  # per round: CPU seconds per unit
        self.wall: list[float] = []  # per round: wall seconds per unit
        self.units = 0


async def interleave(
    clients: Clients,
    names: Sequence[str],
    base: str,
    path: str,
    block: Block,
    per_round: int,
    rounds: int,
    deadline: float,
) -> tuple[dict[str, Result], int]:
    results = {name: Result() for name in names}
    ran = 0
    for r in range(rounds):
        if ran and time.monotonic() > deadline:
            break
        order = list(names[r % len(names) :]) + list(names[: r % len(names)])
        for name in order:
            bench = clients.get(name, base)
            url = base + path
            c0, w0 = time.process_time(), time.perf_counter()
            units = await block(bench, url, per_round)
            c1, w1 = time.process_time(), time.perf_counter()
            res = results[name]
            res.cpu.append((c1 - c0) / units)
            res.wall.append((w1 - w0) / units)
            res.units += units
        ran += 1
    return results, ran


def ratio(mine: list[float], base: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(mine, base, strict=True))


# -- the server ----------------------------------------------------------------------------


@contextlib.contextmanager
def server_process() -> Iterator[tuple[str, int]]:
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.Popen(
        [sys.executable, os.path.join(here, "floor_server.py")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        if not url.startswith("http://"):
            raise RuntimeError(f"floor_server.py did not start: {url!r}")
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ratios(
    measurements: list[tuple[str, str, dict[str, Result], str]], names: Sequence[str], kind: str
) -> str:
    rows = []
    for label, unit, results, rounds in measurements:
        base = getattr(results[BASE], kind)
        row = [label, f"{statistics.median(base) * 1e6:.0f} us/{unit}"]
        row += [f"{ratio(getattr(results[n], kind), base):.2f}x" for n in names]
        rows.append([*row, rounds])
    return _table(rows, ["measurement", f"{BASE} itself", *names, "rounds"])


def first_client() -> str:
    """What the first `Client()` of a fresh process costs, and its first https context."""
    code = (
        "import time, stallproof\n"
        "from stallproof._wire._tls import shared_ssl_context\n"
        "t = time.perf_counter(); stallproof.Client(api_key='x', base_url='https://h/v1')\n"
        "t1 = time.perf_counter(); shared_ssl_context(); t2 = time.perf_counter()\n"
        "print(f'first Client() {(t1 - t) * 1000:.1f} ms; the process\\'s SSL context "
        "(first https connection) {(t2 - t1) * 1000:.1f} ms')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return (out.stdout or out.stderr).strip()


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> int:
    names = [n for n in CLIENTS if n in args.only] if args.only else list(CLIENTS)
    if BASE not in names:
        names.insert(0, BASE)
    t0 = time.monotonic()
    with server_process() as (root, pid):
        print(
            f"server: floor_server.py, child process {pid}, {root}; python "
            f"{platform.python_version()}, {os.cpu_count()} cpus, load average "
            f"{os.getloadavg()[0]:.1f}; aiohttp {aiohttp.__version__}, httpx {httpx.__version__}, "
            f"httpx2 {httpx2.__version__}, openai {openai.__version__}, "
            f"stallproof {stallproof.__version__}"
        )
        base16 = root.replace("/v1", "/n/16/v1")
        base_sse = root.replace("/v1", f"/n/{args.events}/v1")
        base_paced = root.replace("/v1", f"/n/{args.paced_events}/i/{args.interval}/v1")
        clients = Clients(names)
        path = "/chat/completions"
        try:
            for name in names:
                for i in range(args.warmup):
                    await clients.get(name, base16).call(i % 2 == 1, base16 + path)
                await clients.get(name, base_sse).call(True, base_sse + path)
            share = args.budget / 5
            measurements: list[tuple[str, str, dict[str, Result], str]] = []
            seq = args.calls // args.rounds
            for label, base, block, per_round, unit in (
                ("non-stream", base16, sequential_plain, seq, "call"),
                (
                    "stream (16 chunks)",
                    base16,
                    sequential_stream,
                    args.calls // args.rounds,
                    "call",
                ),
                (
                    f"{CONCURRENCY} concurrent, half streamed",
                    base16,
                    concurrent_mixed,
                    max(CONCURRENCY * 2, args.calls // 2),
                    "call",
                ),
                (
                    f"SSE, {args.streams} streams x {args.events} events",
                    base_sse,
                    many_streams(args.streams),
                    args.streams,
                    "event",
                ),
                (
                    f"SSE paced, {args.paced_streams} streams x {args.paced_events} events "
                    f"{args.interval} ms apart",
                    base_paced,
                    many_streams(args.paced_streams),
                    args.paced_streams,
                    "event",
                ),
            ):
                results, ran = await interleave(
                    clients,
                    names,
                    base,
                    path,
                    block,
                    max(1, per_round),
                    args.rounds,
                    time.monotonic() + share,
                )
                measurements.append((label, unit, results, f"{ran}/{args.rounds}"))
        finally:
            await clients.aclose()

    print()
    print("CPU of the client process per call (per event for SSE), as a ratio to aiohttp's:")
    print("the median over rounds of each round's ratio; aiohttp's own in microseconds")
    print(_ratios(measurements, names, "cpu"))
    print()
    print("wall time per call (per event for SSE), ratio to aiohttp's, median over rounds")
    print(_ratios(measurements, names, "wall"))
    if "face" in names and "openai" in names:
        print()
        print("the face against the stock SDK (CPU, wall): median over rounds")
        print(
            _table(
                [
                    [label]
                    + [
                        f"{ratio(getattr(r['face'], k), getattr(r['openai'], k)):.3f}x"
                        for k in ("cpu", "wall")
                    ]
                    for label, _, r, _ in measurements
                ],
                ["measurement", "CPU face/openai", "wall face/openai"],
            )
        )
    print()
    print("SSE events per second of client CPU (one core), median over rounds")
    sse = [m for m in measurements if m[1] == "event"]
    print(
        _table(
            [
                [n] + [f"{1 / statistics.median(r[n].cpu):,.0f}" for _, _, r, _ in sse]
                for n in names
            ],
            ["client"] + [label for label, _, _, _ in sse],
        )
    )
    print()
    print(first_client())
    print(f"\ntotal {time.monotonic() - t0:.1f}s, load average now {os.getloadavg()[0]:.1f}")
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--calls", type=int, default=400, help="sequential calls per client")
    p.add_argument("--rounds", type=int, default=10, help="interleaved rounds per measurement")
    p.add_argument("--warmup", type=int, default=20, help="warm-up calls per client")
    p.add_argument("--streams", type=int, default=64, help="concurrent streams for SSE")
    p.add_argument("--events", type=int, default=256, help="content events per SSE stream")
    p.add_argument("--paced-streams", type=int, default=128, help="streams at once, paced SSE")
    p.add_argument("--paced-events", type=int, default=64, help="events per paced stream")
    p.add_argument("--interval", type=int, default=20, help="ms between paced events")
    p.add_argument("--budget", type=float, default=150, help="seconds, a soft cap on the run")
    p.add_argument("--only", type=lambda s: s.split(","), help="clients, comma-separated")
    args = p.parse_args(argv)
    if args.calls < args.rounds or args.rounds < 1:
        p.error("--calls must be >= --rounds >= 1")
    if args.only and set(args.only) - set(CLIENTS):
        p.error(f"--only takes {', '.join(CLIENTS)}")
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
