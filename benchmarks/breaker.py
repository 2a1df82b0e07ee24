"""What a call costs when the circuit is open, next to a healthy call on a warm connection.

An open circuit refuses a call before it touches the pool or the network; this measures how
cheap that refusal is. One client against the healthy fault server (in this process's
thread): ``--calls`` healthy calls, then the circuit is opened with three 503s and
``--calls`` refused calls. Both are timed in the same run, and the ratio is what to compare
across machines (tests/client/test_breaker.py checks the behaviour: no request reaches the server).

    PYTHONPATH=src:. python benchmarks/breaker.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import anyio
from openai.types.chat import ChatCompletionMessageParam

import fault_server
import stallproof

MSGS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]


async def measure(base_url: str, calls: int) -> tuple[list[float], list[float]]:
    breaker = stallproof.Breaker(fail_max=3, reset_timeout=600)
    async with stallproof.Client(
        base_url=base_url, api_key="sk-bench", retry=None, breaker=breaker
    ) as client:
        healthy: list[float] = []
        for _ in range(calls):
            start = time.perf_counter()
            await client.chat.completions.create(model="m", messages=MSGS)
            healthy.append(time.perf_counter() - start)
        failing = {"X-Fault": "status;code=503"}
        for _ in range(3):
            with contextlib.suppress(stallproof.InternalServerError):
                await client.chat.completions.create(
                    model="m", messages=MSGS, extra_headers=failing
                )
        refused: list[float] = []
        for _ in range(calls):
            start = time.perf_counter()
            try:
                await client.chat.completions.create(model="m", messages=MSGS)
            except stallproof.CircuitOpen:
                pass
            else:
                raise SystemExit("the circuit let a call through")
            refused.append(time.perf_counter() - start)
    return healthy, refused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per measurement")
    args = parser.parse_args()
    if not 1 <= args.calls <= 100_000:
        parser.error("--calls must be between 1 and 100000")
    with fault_server.running(host="127.0.0.1", port=0) as srv:
        healthy, refused = anyio.run(measure, srv.url(), args.calls)
    h, r = statistics.median(healthy), statistics.median(refused)
    print(f"healthy call, warm connection: median {h * 1e6:8.0f} us")
    print(f"refused call, circuit open:    median {r * 1e6:8.0f} us")
    print(f"refused / healthy: {r / h:.3f}")


if __name__ == "__main__":
    main()
