"""One worker process of a fleet, for the fleet tests (started by `FleetWorkers`).

Usage: ``python fleet_worker.py JOB`` where JOB is JSON::

    {"base_url": ..., "redis_url": ..., "prefix": ...,
     "calls": 3, "total": 2.0, "agent": null, "op_timeout": 1.0,
     "pacer": {"requests_per_minute": 10} | null, "breaker": {"fail_max": 3} | null,
     "lease_ttl": 300, "fault": "status;code=500" | null}

It prints ``ready`` once its client is built, waits for a ``go`` line on stdin (so that
workers start together, however long their imports took), makes ``calls`` calls at the
same time, and prints one JSON line per call as it ends: ``[error class or null, elapsed
seconds]``, flushed, so a test can kill the worker mid-run.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import stallproof


async def _one(client: stallproof.Client, job: dict[str, Any]) -> None:
    start = time.monotonic()
    error: str | None = None
    try:
        await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hello"}],
            agent=job.get("agent"),
            extra_headers={"X-Fault": job["fault"]} if job.get("fault") else None,
        )
    except stallproof.StallproofError as e:
        error = type(e).__name__
    print(json.dumps([error, round(time.monotonic() - start, 4)]), flush=True)


async def main(job: dict[str, Any]) -> None:
    shared = stallproof.RedisState(
        job["redis_url"],
        prefix=job["prefix"],
        op_timeout=job.get("op_timeout", 1.0),
        lease_ttl=job.get("lease_ttl", 300.0),
    )
    pacer = job.get("pacer")
    breaker = job.get("breaker")
    client = stallproof.Client(
        base_url=job["base_url"],
        api_key="sk-test-worker",
        retry=None,
        timeout=stallproof.Timeouts(total=job.get("total", 5.0)),
        pacer=stallproof.Pacer(**pacer, shared=shared) if pacer is not None else None,
        breaker=stallproof.Breaker(**breaker, shared=shared) if breaker is not None else None,
    )
    print("ready", flush=True)
    go = await asyncio.wait_for(asyncio.to_thread(sys.stdin.readline), 120)
    if go.strip() != "go":
        raise SystemExit(f"expected 'go', got {go!r}")
    try:
        calls = asyncio.gather(*(_one(client, job) for _ in range(job.get("calls", 1))))
        await asyncio.wait_for(calls, 60)  # a worker never outlives its test
    finally:
        await client.aclose()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
