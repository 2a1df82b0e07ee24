"""What stallproof's bounds cost per call, next to raw httpx and the openai SDK.

All three clients talk to the same healthy fault server (no delay, no token interval), run
in a separate process by default so its CPU is not in the client's event loop. Each
measurement interleaves the clients in rounds, rotating who goes first, so drift (CPU
frequency, the server warming up, the page cache) lands on all of them alike:

- sequential non-stream calls, one at a time;
- sequential stream calls, every chunk consumed;
- a concurrent run: ``--workers`` tasks calling at once (non-stream and stream alternately).

It reports the median and p99 latency per call, calls per second, and stallproof's ratios to
httpx and to openai. Unless ``--no-memory``, stallproof and httpx then each run in a fresh
child process that reports its RSS growth over 1,000 calls and, under tracemalloc, the peak
and the retained Python heap over 250 more.

The raw-httpx baseline does the least a caller must: ``r.json()`` for a completion, and
``aiter_lines`` + ``json.loads`` per SSE line for a stream. stallproof and openai also build
typed objects; that is part of what is measured.

    python benchmarks/overhead.py [--calls 300] [--workers 16] [--budget 55] [--no-memory]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import operator
import os
import platform
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import anyio
import httpx
import openai
from openai.types.chat import ChatCompletionMessageParam

import stallproof

CLIENTS = ("stallproof", "httpx", "openai")
MODEL = "fault-model"
MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You are a benchmark."},
    {"role": "user", "content": "measure the overhead of every client on this healthy server"},
]
TOKENS = 16  # content chunks per stream (and words per completion)
ROUNDS = 15  # each sequential measurement is split into this many interleaved rounds
CONCURRENT_ROUNDS = 5


# -- the three clients behind one interface -----------------------------------------------


class Bench(Protocol):
    async def call(self, stream: bool) -> str: ...
    async def aclose(self) -> None: ...


class StallproofBench:
    def __init__(self, url: str) -> None:
        self.client = stallproof.Client(base_url=url, api_key="bench", timeout=30)

    async def call(self, stream: bool) -> str:
        create = self.client.chat.completions.create
        if not stream:
            resp = await create(model=MODEL, messages=MESSAGES)
            message = resp.choices[0].message if resp.choices else None
            return (message.content if message else None) or ""
        parts = []
        async for chunk in await create(model=MODEL, messages=MESSAGES, stream=True):
            for c in chunk.choices or ():
                if c.delta and c.delta.content:
                    parts.append(c.delta.content)
        return "".join(parts)

    async def aclose(self) -> None:
        await self.client.aclose()


class HttpxBench:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/") + "/chat/completions"
        self.client = httpx.AsyncClient(
            timeout=30, headers={"Authorization": "Bearer bench"}, trust_env=False
        )

    async def call(self, stream: bool) -> str:
        body: dict[str, Any] = {"model": MODEL, "messages": MESSAGES}
        if not stream:
            r = await self.client.post(self.url, json=body)
            r.raise_for_status()
            return str(r.json()["choices"][0]["message"]["content"])
        body["stream"] = True
        parts = []
        async with self.client.stream("POST", self.url, json=body) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    continue  # read on to the end of the body, so the connection is reused
                for c in json.loads(data).get("choices") or ():
                    parts.append((c.get("delta") or {}).get("content") or "")
        return "".join(parts)

    async def aclose(self) -> None:
        await self.client.aclose()


class OpenAIBench:
    def __init__(self, url: str) -> None:
        self.client = openai.AsyncOpenAI(base_url=url, api_key="bench", max_retries=0, timeout=30)
        self.messages: list[ChatCompletionMessageParam] = list(MESSAGES)

    async def call(self, stream: bool) -> str:
        create = self.client.chat.completions.create
        if not stream:
            resp = await create(model=MODEL, messages=self.messages)
            return resp.choices[0].message.content or ""
        parts = []
        async for chunk in await create(model=MODEL, messages=self.messages, stream=True):
            for c in chunk.choices:
                if c.delta.content:
                    parts.append(c.delta.content)
        return "".join(parts)

    async def aclose(self) -> None:
        await self.client.close()


def make(name: str, url: str) -> Bench:
    factories: dict[str, Callable[[str], Bench]] = {
        "stallproof": StallproofBench,
        "httpx": HttpxBench,
        "openai": OpenAIBench,
    }
    return factories[name](url)


# -- measurements --------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class Sample:
    """Latencies of every call one client made in one measurement, and the wall time."""

    latencies: list[float] = dataclasses.field(default_factory=list)
    wall: float = 0.0
    # Per round, for `paired` comparisons.
    round_medians: list[float] = dataclasses.field(default_factory=list)
    round_rates: list[float] = dataclasses.field(default_factory=list)

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.wall if self.wall else 0.0


async def sequential(bench: Bench, n: int, stream: bool, out: Sample) -> None:
    start = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        await bench.call(stream)
        out.latencies.append(time.perf_counter() - t)
    out.wall += time.perf_counter() - start


async def concurrent(bench: Bench, n: int, workers: int, out: Sample) -> None:
    todo = iter(range(n))

    async def worker() -> None:
        for i in todo:
            t = time.perf_counter()
            await bench.call(stream=i % 2 == 1)
            out.latencies.append(time.perf_counter() - t)

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(workers):
            tg.start_soon(worker)
    out.wall += time.perf_counter() - start


async def interleaved(
    benches: dict[str, Bench],
    total: int,
    deadline: float,
    run: Callable[[Bench, int, Sample], Awaitable[None]],
    rounds: int,
) -> tuple[dict[str, Sample], int]:
    """``total`` calls per client in ``rounds`` rounds, rotating the order; stop at
    ``deadline``. Returns the samples and how many rounds ran."""
    samples = {name: Sample() for name in benches}
    per_round = max(1, total // rounds)
    names = list(benches)
    done = 0
    for r in range(rounds):
        if done and time.monotonic() > deadline:
            break
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            s = samples[name]
            n0, wall0 = len(s.latencies), s.wall
            await run(benches[name], per_round, s)
            s.round_medians.append(statistics.median(s.latencies[n0:]))
            s.round_rates.append((len(s.latencies) - n0) / (s.wall - wall0))
        done += 1
    return samples, done


def paired(
    mine: Sequence[float],
    theirs: Sequence[float],
    op: Callable[[float, float], float] = operator.truediv,
) -> float:
    """The median over rounds of ``op(mine, theirs)``: each round's clients ran back to back,
    so a per-round comparison is little touched by drift between rounds."""
    return statistics.median(op(a, b) for a, b in zip(mine, theirs, strict=True))


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


# -- memory, in a fresh child process per client -------------------------------------------


def _rss_bytes() -> int:
    """Resident set size now (Linux), else the peak so far."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        import resource  # not on Windows, where /proc is missing too

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss if sys.platform == "darwin" else rss * 1024


MEMORY_CALLS = 1000  # calls whose RSS growth is measured
TRACED_CALLS = 250  # calls under tracemalloc, which makes each call about 3x slower
MEMORY_CLIENTS = ("stallproof", "httpx")


async def memory_probe(name: str, url: str, workers: int) -> dict[str, float]:
    """Run in a fresh process: RSS growth over 1,000 calls, then the Python heap's peak and
    what it keeps over 250 more under tracemalloc."""
    bench = make(name, url)
    try:
        for i in range(50):
            await bench.call(stream=i % 2 == 1)
        gc.collect()
        rss0 = _rss_bytes()
        await concurrent(bench, MEMORY_CALLS, workers, Sample())
        gc.collect()
        rss1 = _rss_bytes()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        await concurrent(bench, TRACED_CALLS, workers, Sample())
        gc.collect()
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    finally:
        await bench.aclose()
    return {"rss_growth": rss1 - rss0, "heap_peak": peak - base, "heap_retained": current - base}


def run_memory_probes(url: str, workers: int) -> dict[str, dict[str, float]]:
    results = {}
    for name in MEMORY_CLIENTS:
        cmd = [sys.executable, __file__, "--memory-probe", name, "--url", url]
        cmd += ["--workers", str(workers)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"memory probe for {name} failed:\n{proc.stderr}")
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    return results


# -- the server ----------------------------------------------------------------------------


@contextmanager
def fault_server_process(thread: bool) -> Iterator[tuple[str, str]]:
    """The healthy server's base URL and how it runs: a child process, else a thread."""
    if not thread:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (os.path.join(root, "src"), root, env.get("PYTHONPATH")) if p
        )
        with tempfile.TemporaryFile(mode="w+") as errors:
            proc = subprocess.Popen(
                [sys.executable, "-m", "fault_server", "--port", "0"],
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
                env=env,
            )
            try:
                url = _first_line(proc, timeout=15)
                if url.startswith("http"):
                    yield url, f"separate process (python -m fault_server, pid {proc.pid})"
                    return
            finally:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            errors.seek(0)
            why = url or errors.read().strip()[-300:] or "no output"
            print(f"fault server CLI not usable ({why}); running it in a thread instead")
    import fault_server

    with fault_server.running(port=0) as srv:
        yield srv.url(), "thread runner in this process (shares the GIL with the clients)"


def with_tokens(url: str, tokens: int) -> str:
    """``http://h:p/v1`` -> ``http://h:p/fault/healthy;tokens=N/v1``."""
    u = httpx.URL(url)
    return str(u.copy_with(path=f"/fault/healthy;tokens={tokens}{u.path}"))


def _first_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The child's first stdout line, waiting at most ``timeout``; the rest is drained so a
    chatty server can never block on a full pipe."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put("")

    threading.Thread(target=pump, daemon=True).start()
    try:
        return lines.get(timeout=timeout).strip()
    except queue.Empty:
        return ""


# -- report --------------------------------------------------------------------------------


def ms(x: float) -> str:
    return f"{x * 1000:.2f}"


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(
            c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    with fault_server_process(args.thread) as (base, how):
        url = with_tokens(base, TOKENS)
        print(f"server: {how}, {url}")
        print(
            f"python {platform.python_version()}, {os.cpu_count()} cpus, "
            f"httpx {httpx.__version__}, openai {openai.__version__}, "
            f"stallproof {stallproof.__version__}, backend {args.backend}"
        )
        benches = {name: make(name, url) for name in CLIENTS}
        try:
            for bench in benches.values():
                for i in range(args.warmup):
                    await bench.call(stream=i % 2 == 1)
            # Three measurements share the budget; the memory probes take about 20 s more.
            share = (args.budget - (20 if args.memory else 0)) / 3
            results: list[tuple[str, dict[str, Sample], str]] = []

            async def seq_plain(b: Bench, n: int, s: Sample) -> None:
                await sequential(b, n, False, s)

            async def seq_stream(b: Bench, n: int, s: Sample) -> None:
                await sequential(b, n, True, s)

            async def conc(b: Bench, n: int, s: Sample) -> None:
                await concurrent(b, n, args.workers, s)

            # Concurrent batches are fewer and larger: a batch only a few times the number of
            # workers would mostly measure ramp-up and drain.
            for label, run, n_rounds in (
                ("non-stream, sequential", seq_plain, ROUNDS),
                ("stream, sequential", seq_stream, ROUNDS),
                (f"mixed, {args.workers} concurrent", conc, CONCURRENT_ROUNDS),
            ):
                samples, ran = await interleaved(
                    benches, args.calls, time.monotonic() + share, run, n_rounds
                )
                results.append((label, samples, f"{ran}/{n_rounds}"))
        finally:
            for bench in benches.values():
                await bench.aclose()
        memory = run_memory_probes(url, args.workers) if args.memory else None

    rows = []
    ratios = []
    for label, samples, rounds in results:
        for name in CLIENTS:
            s = samples[name]
            rows.append(
                [
                    label if name == CLIENTS[0] else "",
                    name,
                    str(len(s.latencies)),
                    ms(statistics.median(s.latencies)),
                    ms(pct(s.latencies, 99)),
                    f"{s.rate:.0f}",
                ]
            )
        sp, hx, oa = (samples[n] for n in CLIENTS)
        ratios.append(
            [
                label,
                f"{paired(sp.round_medians, hx.round_medians, operator.sub) * 1000:+.2f}",
                f"{paired(sp.round_medians, hx.round_medians):.2f}x",
                f"{paired(sp.round_medians, oa.round_medians):.2f}x",
                f"{paired(sp.round_rates, hx.round_rates):.2f}x",
                f"{paired(sp.round_rates, oa.round_rates):.2f}x",
                rounds,
            ]
        )
    print()
    print(table(rows, ["measurement", "client", "calls", "median ms", "p99 ms", "calls/s"]))
    print()
    print("stallproof against the others: the median over rounds of each round's comparison")
    print(
        table(
            ratios,
            [
                "stallproof vs",
                "ms/call vs httpx",
                "median/httpx",
                "median/openai",
                "calls/s vs httpx",
                "calls/s vs openai",
                "rounds",
            ],
        )
    )
    if memory:
        print()
        mrows = [
            [
                name,
                f"{m['rss_growth'] / 2**20:.2f}",
                f"{m['heap_peak'] / 2**20:.2f}",
                f"{m['heap_retained'] / 1024:.0f}",
            ]
            for name, m in memory.items()
        ]
        print(
            f"memory, each client in a fresh process, {args.workers} concurrent, half streamed: "
            f"RSS growth over {MEMORY_CALLS:,} calls after warm-up;\nPython heap (tracemalloc) "
            f"peak and retained after gc over {TRACED_CALLS} more"
        )
        print(table(mrows, ["client", "RSS growth MiB", "heap peak MiB", "heap retained KiB"]))
    print(f"\ntotal {time.monotonic() - t0:.1f}s")
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--calls", type=int, default=300, help="calls per client per measurement")
    p.add_argument("--workers", type=int, default=16, help="concurrent workers (default 16)")
    p.add_argument("--warmup", type=int, default=30, help="warm-up calls per client")
    p.add_argument("--budget", type=float, default=55, help="seconds, a soft cap on the whole run")
    p.add_argument("--no-memory", dest="memory", action="store_false", help="skip memory")
    p.add_argument("--thread", action="store_true", help="run the server in a thread")
    p.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    p.add_argument("--memory-probe", choices=CLIENTS, help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.calls < 1 or args.workers < 1:
        p.error("--calls and --workers must be >= 1")
    return args


if __name__ == "__main__":
    ns = parse_args()
    if ns.memory_probe:
        result = anyio.run(memory_probe, ns.memory_probe, ns.url, ns.workers)
        print(json.dumps(result))
        sys.exit(0)
    sys.exit(anyio.run(main, ns, backend=ns.backend))
