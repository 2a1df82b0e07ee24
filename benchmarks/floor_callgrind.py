"""`floor.py`'s clients, counted in CPU instructions (valgrind's callgrind): load-proof ratios.

On a shared machine CPU time per call moves with the load (caches, frequency, the
kernel's own work); the number of instructions the client executes in user space does
not. Each client runs in its own process under ``valgrind --tool=callgrind`` with
instrumentation off; after its warm-up it turns it on (``callgrind_control -i on``), makes
its calls, and turns it off, so imports and warm-up are not counted. The server
(`floor_server.py`) runs outside valgrind. Kernel work (the syscalls) is not counted:
the clients make the same number of sends per call, and their reads differ little.

    python benchmarks/floor_callgrind.py [--calls 40] [--only aiohttp,stallproof]
        [--measure non-stream,stream,"64 concurrent"]

About 30 s per client and measurement on 2 cores (valgrind runs Python ~50x slower).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence

import floor

MEASUREMENTS = ("non-stream", "stream", "64 concurrent")
_COLLECTED = re.compile(r"Collected : (\d+)")


async def child(name: str, measurement: str, calls: int, base: str) -> None:
    """In the valgrind process: warm up, count ``calls`` calls, stop counting."""

    def instrument(flag: str) -> None:
        subprocess.run(
            ["callgrind_control", "-i", flag, str(os.getpid())], check=True, capture_output=True
        )

    url = base + "/chat/completions"
    bench = floor.make(name, base)
    for i in range(20):
        await bench.call(i % 2 == 1, url)
    if measurement == "64 concurrent":
        await floor.concurrent_mixed(bench, url, floor.CONCURRENCY)
    instrument("on")
    if measurement == "64 concurrent":
        await floor.concurrent_mixed(bench, url, calls)
    else:
        for _ in range(calls):
            await bench.call(measurement == "stream", url)
    instrument("off")
    await bench.aclose()


def count(name: str, measurement: str, calls: int, base: str) -> float:
    """Instructions per call of ``name`` in ``measurement``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={tmp}/cg.out",
                sys.executable,
                os.path.abspath(__file__),
                "--child",
                name,
                measurement,
                str(calls),
                base,
            ],
            capture_output=True,
            text=True,
            timeout=900,
        )
    found = _COLLECTED.search(out.stderr)
    if out.returncode != 0 or found is None:
        raise RuntimeError(f"{name} {measurement}: {out.stderr[-500:]}")
    return int(found.group(1)) / calls


def main(args: argparse.Namespace) -> int:
    names = [n for n in floor.CLIENTS if not args.only or n in args.only]
    if floor.BASE not in names:
        names.insert(0, floor.BASE)
    with floor.server_process() as (root, pid):
        base = root.replace("/v1", "/n/16/v1")
        print(
            f"server: floor_server.py, child process {pid}; load average {os.getloadavg()[0]:.1f}"
        )
        rows = []
        for measurement in args.measure:
            calls = args.calls * 4 if measurement == "64 concurrent" else args.calls
            per_call = {name: count(name, measurement, calls, base) for name in names}
            floor_count = per_call[floor.BASE]
            rows.append(
                [measurement, f"{floor_count / 1000:,.0f}k"]
                + [f"{per_call[n] / floor_count:.2f}x" for n in names]
            )
            print(f"  {measurement}: " + ", ".join(f"{n} {per_call[n]:,.0f}" for n in names))
    print()
    print("user-space instructions per call (callgrind), as a ratio to aiohttp's")
    print(floor._table(rows, ["measurement", f"{floor.BASE} itself", *names]))
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--calls", type=int, default=40, help="calls counted (x4 concurrent)")
    p.add_argument("--only", type=lambda s: s.split(","), help="clients, comma-separated")
    p.add_argument(
        "--measure", type=lambda s: s.split(","), default=list(MEASUREMENTS), help="which"
    )
    return p.parse_args(argv)


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        _, _, name, measurement, calls, base = sys.argv
        asyncio.run(child(name, measurement, int(calls), base))
        sys.exit(0)
    sys.exit(main(parse_args()))
