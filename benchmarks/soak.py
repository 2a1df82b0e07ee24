"""The chaos soak at size: 20,000 calls, random faults, totals and cancellations, every face.

The suite's soak (tests/integrations/test_soak.py) runs a few hundred calls, what CI
affords; this one runs the same engine (tests/support/soak.py) at the size of issue 21's
promise. Every call draws a fault from the fault server's catalogue (stalls, trickles,
keep-alive floods, resets, bad bodies, status errors, healthy, a listener that never
accepts, a refused port), a total, stream or not, and for 10% of them a cancellation at a
random moment (asyncio: ``Task.cancel()``, ``asyncio.timeout``, anyio's ``move_on_after``
and ``CancelScope``; trio: its cancel scopes). The faces: `stallproof.Client`,
`stallproof.openai.AsyncOpenAI`, `stallproof.anthropic.AsyncAnthropic`, and the sync
`stallproof.openai.OpenAI` called from worker threads.

The fault server runs in a process of its own (``fault-server --port 0``, loopback only),
so its work does not hold this process's GIL. The run is bounded: ``--calls`` calls, each
stopped by a watchdog at its total + 3 s, the whole run by ``--limit`` seconds.

Exit status 1 on any hang, untyped error or leak, or 0.5% or more of the calls ending over
100 ms past their deadline.

    python benchmarks/soak.py                                  # 20,000 calls, asyncio
    python benchmarks/soak.py --backend trio --calls 5000
    python benchmarks/soak.py --faces client,openai --seed 7   # what issue 21 names
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the soak engine is the suite's: tests/support/soak.py

from tests.support import soak  # noqa: E402
from tests.support.soak_report import HANG, UNTYPED, Result  # noqa: E402
from tests.support.wire import cli_server  # noqa: E402

LATE = 0.1  # late: ended more than this past the deadline
LATE_SHARE = 0.005  # issue 21: under 0.5% of the calls


@contextlib.contextmanager
def fault_server(max_hold: float) -> Iterator[soak.Targets]:
    """``fault-server --port 0`` in a process of its own; its three URLs (it prints the
    blackhole's and the refused port's after its own)."""
    with cli_server("--max-hold", f"{max_hold}", cwd=ROOT) as (base, proc):
        assert proc.stdout is not None
        blackhole, refused = (proc.stdout.readline().decode().strip() for _ in range(2))
        yield soak.Targets(server=f"{base}/v1", blackhole=blackhole, refused=refused)


class Progress:
    """A line every 10 s: calls done, and any hang or untyped error so far."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.bad = 0
        self.started = time.monotonic()
        self.printed = self.started

    def __call__(self, result: Result) -> None:
        self.done += 1
        self.bad += result.outcome in (HANG, UNTYPED)
        now = time.monotonic()
        if now - self.printed >= 10 or self.done == self.total:
            self.printed = now
            rate = self.done / max(now - self.started, 1e-9)
            print(
                f"  {self.done}/{self.total} calls, {rate:.0f}/s, {self.bad} hung or untyped, "
                f"load average {os.getloadavg()[0]:.1f}",
                flush=True,
            )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--calls", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=None, help="default: from the clock (printed)")
    p.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    p.add_argument("--faces", default=",".join(soak.FACES), help="comma-separated")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--cancel", type=float, default=0.1, help="share of calls cancelled")
    p.add_argument("--limit", type=float, default=1800, help="the whole run's bound, seconds")
    p.add_argument(
        "--freeze",
        action="store_true",
        help="gc.collect(); gc.freeze() after the imports, as a latency-minded service can "
        "(full collections then skip the ~240,000 objects the imports made)",
    )
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    settings = soak.Settings(
        calls=args.calls,
        seed=seed,
        faces=tuple(args.faces.split(",")),
        concurrency=args.concurrency,
        totals=(0.2, 2.0),
        cancel=args.cancel,
        hold=6.0,
        threads=16,
        limit=args.limit,
    )
    if args.freeze:
        gc.collect()
        gc.freeze()
    load = os.getloadavg()
    print(
        f"soak: {args.calls} calls on {args.backend}, seed {seed}, load average {load[0]:.1f}"
        + (", heap frozen" if args.freeze else "")
    )
    with fault_server(max_hold=settings.hold) as targets:
        report = anyio.run(
            lambda: soak.run(settings, targets, on_result=Progress(args.calls)),
            backend=args.backend,
        )
    print()
    print(report.summary())
    print(
        f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after, on {os.cpu_count()} cores"
    )
    print(report.table())
    failures = report.failures(
        late_after=LATE, late_share=LATE_SHARE, beyond_lag=LATE, against_loop=False
    )
    for line in failures[:40]:
        print(line)
    if len(failures) > 40:
        print(f"... and {len(failures) - 40} more")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
