"""A worker process with calls in flight, for the `stallproof top` / `diagnose` tests.

Usage: ``python inflight_worker.py JOB`` where JOB is JSON::

    {"base_url": ..., "redis_url": ... | null, "prefix": ..., "socket": path | null,
     "stuck": 5, "stuck_fault": "half_open", "slow": 2, "slow_fault": "token_rate;tps=4",
     "plain": 0, "interval": 0.2, "ttl": 1.5, "stalled_after": 1.0, "total": 60,
     "mode": "asyncio" | "trio" | "sync"}

It publishes its in-flight table (`stallproof.publish_inflight` to Redis, or
`stallproof.serve_inflight` on ``socket``), prints ``ready``, waits for ``go`` on stdin,
then starts ``stuck`` calls with ``stuck_fault``, ``slow`` streams with ``slow_fault``
and ``plain`` calls with no fault header, half of them through a second client (one
registry per process), and keeps them in flight until ``stop`` (or end of input) arrives,
then closes everything and exits 0. It never lives longer than 120 s. In ``sync`` mode
the calls are made by threads through ``stallproof.openai.OpenAI`` (the sync face).
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

import anyio

import stallproof


async def _call(client: stallproof.Client, fault: str | None, stream: bool, agent: str) -> None:
    headers = {"X-Fault": fault} if fault else None
    try:
        if stream:
            answer = await client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "hello"}],
                stream=True,
                agent=agent,
                extra_headers=headers,
            )
            async with answer:
                async for _ in answer:
                    pass
        else:
            await client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "hello"}],
                agent=agent,
                extra_headers=headers,
            )
    except stallproof.StallproofError:
        pass


def _view(job: dict[str, Any]) -> Any:
    """The publisher to Redis, or the local socket."""
    if job.get("redis_url"):
        shared = stallproof.RedisState(job["redis_url"], prefix=job["prefix"], op_timeout=2.0)
        view: Any = stallproof.publish_inflight(
            shared,
            interval=job.get("interval", 0.2),
            ttl=job.get("ttl", 1.5),
            stalled_after=job.get("stalled_after", 1.0),
        )
    else:
        view = stallproof.serve_inflight(
            job.get("socket"), stalled_after=job.get("stalled_after", 1.0)
        )
    return view


def _calls(job: dict[str, Any]) -> list[tuple[str | None, bool, str]]:
    """(fault, stream, agent) of every call the job asks for."""
    return [
        (job.get(f"{kind}_fault"), stream, f"{kind}-{i}")
        for kind, stream in (("stuck", False), ("slow", True), ("plain", False))
        for i in range(job.get(kind, 0))
    ]


def sync_main(job: dict[str, Any]) -> None:
    import stallproof.openai

    view = _view(job)
    clients = [
        stallproof.openai.OpenAI(
            base_url=job["base_url"],
            api_key="sk-test-worker",
            max_retries=0,
            timeout=job.get("total", 60.0),
        )
        for _ in range(2)
    ]
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("expected 'go'")

    def one(client: Any, fault: str | None, stream: bool, agent: str) -> None:
        headers = {"X-Fault": fault} if fault else None
        try:
            with stallproof.tag(agent=agent):
                answer = client.chat.completions.create(
                    model="m",
                    messages=[{"role": "user", "content": "hello"}],
                    stream=stream,
                    extra_headers=headers,
                )
                if stream:
                    with answer:
                        for _ in answer:
                            pass
        except Exception:  # openai's errors, with ours as their cause
            pass

    for n, (fault, stream, agent) in enumerate(_calls(job)):
        threading.Thread(
            target=one, args=(clients[n % 2], fault, stream, agent), daemon=True
        ).start()
    print("going", flush=True)
    done = threading.Thread(target=sys.stdin.readline, daemon=True)
    done.start()
    done.join(120)  # a worker never outlives its test
    view.close()
    # The calls' threads are daemons: they end with the process.


async def main(job: dict[str, Any]) -> None:
    view = _view(job)
    clients = [
        stallproof.Client(
            base_url=job["base_url"],
            api_key="sk-test-worker",
            retry=None,
            timeout=stallproof.Timeouts(total=job.get("total", 60.0)),
        )
        for _ in range(2)
    ]
    print("ready", flush=True)
    with anyio.fail_after(120):  # a worker never outlives its test
        go = await anyio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        if go.strip() != "go":
            raise SystemExit(f"expected 'go', got {go!r}")
        async with anyio.create_task_group() as tg:
            for n, (fault, stream, agent) in enumerate(_calls(job)):
                tg.start_soon(_call, clients[n % 2], fault, stream, agent)
            print("going", flush=True)
            await anyio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
            tg.cancel_scope.cancel()
    view.close()
    for client in clients:
        await client.aclose()


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    if spec.get("mode") == "sync":
        sync_main(spec)
    else:
        anyio.run(main, spec, backend=spec.get("mode", "asyncio"))
