"""What stallproof's engine costs per call as the openai SDK's transport.

The same openai SDK, two transports under it, against the same healthy fault server:

- ``stock``: ``openai.AsyncOpenAI(max_retries=0)``, the SDK's own httpx2 client;
- ``engine``: ``stallproof.openai.AsyncOpenAI()``, stallproof's engine as the httpx2
  transport, with its defaults (3-attempt `Retry`, retry budget, every bound, in-flight
  registry, OpenTelemetry API with no SDK).

Reported per call: the latency (wall), and the client process's CPU time (the server
runs in another process, so it is not counted), each as a ratio per round. On a shared
machine the CPU ratio is the steadier of the two. Both build the same typed objects, so
the difference is the transport: the engine's bounds,
retry loop, SSE content tracking and bookkeeping against httpx2's own transport. Calls are
made one at a time (non-stream, then stream with every chunk consumed) in rounds that
alternate which client goes first; the ratio is the median over rounds of each round's
``median(engine) / median(stock)``, so drift between rounds cancels. Target: <= 1.10x.

    python benchmarks/sdk_overhead.py [--calls 400] [--budget 50] [--profile]

``--profile`` runs the engine client alone under pyinstrument and prints where its time
goes (pyinstrument must be installed).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence

import anyio
import httpx2
import openai
from overhead import (
    TOKENS,
    Bench,
    OpenAIBench,
    Sample,
    fault_server_process,
    interleaved,
    ms,
    paired,
    pct,
    sequential,
    table,
    with_tokens,
)

import stallproof
import stallproof.openai

CLIENTS = ("engine", "stock")
ROUNDS = 20
TARGET = 1.10


class EngineBench(OpenAIBench):
    """The same calls as `OpenAIBench`, through `stallproof.openai.AsyncOpenAI`."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.client = stallproof.openai.AsyncOpenAI(base_url=url, api_key="bench", timeout=30)


def make(name: str, url: str) -> Bench:
    return EngineBench(url) if name == "engine" else OpenAIBench(url)


Result = tuple[str, dict[str, Sample], dict[str, list[float]], str]


async def measure(args: argparse.Namespace, url: str) -> list[Result]:
    """Per measurement: the samples, and each client's CPU seconds per call in each round."""
    benches = {name: make(name, url) for name in CLIENTS}
    names = {id(b): name for name, b in benches.items()}
    results: list[Result] = []
    try:
        for bench in benches.values():
            for i in range(args.warmup):
                await bench.call(stream=i % 2 == 1)
        share = args.budget / 2
        for label, stream in (("non-stream", False), ("stream", True)):
            cpu: dict[str, list[float]] = {name: [] for name in CLIENTS}

            async def run(
                b: Bench,
                n: int,
                s: Sample,
                stream: bool = stream,
                cpu: dict[str, list[float]] = cpu,
            ) -> None:
                # The server runs in another process: this is the client's CPU alone.
                c0 = time.process_time()
                await sequential(b, n, stream, s)
                cpu[names[id(b)]].append((time.process_time() - c0) / n)

            samples, ran = await interleaved(
                benches, args.calls, time.monotonic() + share, run, ROUNDS
            )
            results.append((label, samples, cpu, f"{ran}/{ROUNDS}"))
    finally:
        for bench in benches.values():
            await bench.aclose()
    return results


async def profile(args: argparse.Namespace, url: str) -> None:
    from pyinstrument import Profiler

    bench = EngineBench(url)
    try:
        for i in range(args.warmup):
            await bench.call(stream=i % 2 == 1)
        with Profiler(async_mode="disabled") as profiler:
            for i in range(args.calls):
                await bench.call(stream=i % 2 == 1)
    finally:
        await bench.aclose()
    print(profiler.output_text(unicode=False, color=False, show_all=False))


async def main(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    with fault_server_process(args.thread) as (base, how):
        url = with_tokens(base, TOKENS)
        print(f"server: {how}, {url}")
        print(
            f"python {platform.python_version()}, {os.cpu_count()} cpus, "
            f"httpx2 {httpx2.__version__}, openai {openai.__version__}, "
            f"stallproof {stallproof.__version__}"
        )
        if args.profile:
            await profile(args, url)
            return 0
        results = await measure(args, url)
    rows, ratios, worst = [], [], 0.0
    for label, samples, cpu, rounds in results:
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
        engine, stock = samples["engine"], samples["stock"]
        ratio = paired(engine.round_medians, stock.round_medians)
        cpu_ratio = paired(cpu["engine"], cpu["stock"])
        worst = max(worst, ratio)
        extra = paired(engine.round_medians, stock.round_medians, lambda a, b: a - b)
        ratios.append(
            [
                label,
                f"{extra * 1000:+.3f}",
                f"{ratio:.3f}x",
                f"{statistics.median(cpu['engine']) * 1000:.3f}",
                f"{statistics.median(cpu['stock']) * 1000:.3f}",
                f"{cpu_ratio:.3f}x",
                rounds,
            ]
        )
    print()
    print(table(rows, ["calls", "transport", "calls", "median ms", "p99 ms", "calls/s"]))
    print()
    print("engine vs stock httpx2 under the same SDK: median over rounds")
    print(
        table(
            ratios,
            [
                "calls",
                "ms/call",
                "latency ratio",
                "engine CPU ms",
                "stock CPU ms",
                "CPU ratio",
                "rounds",
            ],
        )
    )
    verdict = "within" if worst <= TARGET else "ABOVE"
    print(f"\nworst ratio {worst:.3f}x: {verdict} the {TARGET:.2f}x target")
    print(f"total {time.monotonic() - t0:.1f}s")
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--calls", type=int, default=400, help="calls per client per measurement")
    p.add_argument("--warmup", type=int, default=30, help="warm-up calls per client")
    p.add_argument("--budget", type=float, default=50, help="seconds, a soft cap on the run")
    p.add_argument("--thread", action="store_true", help="run the server in a thread")
    p.add_argument("--profile", action="store_true", help="profile the engine client")
    args = p.parse_args(argv)
    if args.calls < 1:
        p.error("--calls must be >= 1")
    return args


if __name__ == "__main__":
    sys.exit(anyio.run(main, parse_args()))
