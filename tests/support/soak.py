"""The chaos soak: many calls, each with a random fault, total, mode and cancellation, through
every face at once; each outcome classified, then the clients checked for leaks.

One engine for the suite's soak (tests/integrations/test_soak.py, a size CI affords) and
the benchmark's (benchmarks/soak.py, 20,000 calls). Its parts:

- `soak_plan`: the fault mix (`FAULTS`: every request-level fault of the fault server's
  catalogue but the tool-call ones and rate_limit, plus a listener that never accepts and
  a refused port), `Settings`, and every call drawn up front from the seed (`draw`): face,
  fault, total, stream or not (read whole, or closed after a few events), and for a share
  of the calls a cancellation at a random moment within the total;
- `soak_calls`: one call through its face (`stallproof.Client`,
  `stallproof.openai.AsyncOpenAI`, `stallproof.anthropic.AsyncAnthropic`, and
  `stallproof.openai.OpenAI` from worker threads), under its cancellation;
- `soak_report`: outcomes, the event loop's own lag, leaks, the table.

A call ends `SUCCESS`, `TYPED` (stallproof's exception tree, or the SDK's own
``openai.APIError`` / ``anthropic.APIError``), `CANCELLED` (the cancellation it was given
came out as the caller's), `UNTYPED` (anything else: a failure) or `HANG` (not over by its
total + ``guard``: a failure; a watchdog stops it). Its overshoot is how long after its
deadline (the earlier of its total and its cancellation) it ended. After the run, with the
clients still open, every pool holds nothing and every pacer permit is back; once they are
closed, no file descriptor and no asyncio task is left, and nothing was raised where no
caller could catch it (`sys.unraisablehook`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack, contextmanager
from typing import Any

import anyio
import sniffio

import stallproof
import stallproof.anthropic
import stallproof.openai

from .clients import KEY
from .soak_calls import call_async, call_sync, cancelled
from .soak_plan import FACES, FAULTS, Fault, Plan, Settings, Targets, draw
from .soak_report import (
    CANCELLED,
    HANG,
    SUCCESS,
    TYPED,
    UNTYPED,
    GcPauses,
    Leaks,
    LoopLag,
    Report,
    Result,
    by_total,
    classify,
    fd_census,
)

__all__ = [
    "CANCELLED",
    "FACES",
    "FAULTS",
    "HANG",
    "SUCCESS",
    "TYPED",
    "UNTYPED",
    "Report",
    "Result",
    "Settings",
    "Targets",
    "run",
]

# The bounds besides the total every client has; each call sets its own total.
BOUNDS = stallproof.Timeouts(connect=1, read=1, write=1, pool=1, first_token=0.6, idle=0.5)
LIMITS = stallproof.Limits(max_response_bytes=1024 * 1024, max_line_bytes=128 * 1024)


class _Clients:
    """The clients of a run, one per (face, target), made on first use; the async ones
    are closed with ``stack``, the sync ones by `close_sync`."""

    def __init__(self, settings: Settings, targets: Targets, stack: AsyncExitStack) -> None:
        self._settings = settings
        self._targets = targets
        self._stack = stack
        self._made: dict[tuple[str, str], Any] = {}

    def get(self, face: str, target: str) -> Any:
        key = (face, target)
        if key not in self._made:
            self._made[key] = self._make(face, self._targets.url(target))
        return self._made[key]

    def _make(self, face: str, url: str) -> Any:
        concurrency = self._settings.concurrency
        kw: dict[str, Any] = {
            "api_key": KEY,
            "timeout": BOUNDS,
            "limits": LIMITS,
            # A pacer that rarely queues (its limit shrinks on 429s): its permits are checked.
            "pacer": stallproof.Pacer(
                max_concurrent=concurrency, min_concurrent=max(1, concurrency // 2)
            ),
        }
        if face == "openai-sync":
            return stallproof.openai.OpenAI(base_url=url, **kw)
        client: Any
        if face == "client":
            client = stallproof.Client(base_url=url, **kw)
            self._stack.push_async_callback(client.aclose)
        elif face == "openai":
            client = stallproof.openai.AsyncOpenAI(base_url=url, **kw)
            self._stack.push_async_callback(client.close)
        else:
            client = stallproof.anthropic.AsyncAnthropic(base_url=url.removesuffix("/v1"), **kw)
            self._stack.push_async_callback(client.close)
        return client

    def engines(self) -> dict[str, stallproof.Engine]:
        return {
            f"{face}@{target}": (c._engine if face == "client" else c.engine)
            for (face, target), c in self._made.items()
        }

    def close_sync(self) -> None:
        for (face, _), client in self._made.items():
            if face == "openai-sync":
                client.close()


def _ended(plan: Plan, start: float, outcome: str, detail: str, by_deadline: bool) -> Result:
    return Result(plan, outcome, detail, start, time.monotonic(), by_deadline)


async def _call(clients: _Clients, plan: Plan, settings: Settings, limiter: Any) -> Result:
    """One call under its cancellation and a watchdog, classified."""
    client = clients.get(plan.face, plan.fault.target)
    if plan.face == "openai-sync":
        return await _sync_call(client, plan, settings, limiter)
    call = call_async(plan.face, client, plan, settings.hold)
    start = time.monotonic()
    result = None
    with anyio.move_on_after(plan.total + settings.guard) as watchdog:
        try:
            if await cancelled(plan, call):
                result = _ended(plan, start, CANCELLED, plan.cancel or "", True)
            else:
                result = _ended(plan, start, SUCCESS, "", False)
        except Exception as e:
            outcome, detail = classify(e)
            result = _ended(plan, start, outcome, detail, by_total(e))
    if watchdog.cancel_called or result is None:
        return _ended(plan, start, HANG, "stopped by the watchdog", False)
    return result


async def _sync_call(
    client: stallproof.openai.OpenAI, plan: Plan, settings: Settings, limiter: Any
) -> Result:
    """A sync call in a worker thread; its clock starts in the thread (not while it waits
    for one). A thread cannot be cancelled: past the guard it is abandoned, a hang."""

    def in_thread() -> Result:
        start = time.monotonic()
        try:
            call_sync(client, plan, settings.hold)
        except Exception as e:
            outcome, detail = classify(e)
            return _ended(plan, start, outcome, detail, by_total(e))
        return _ended(plan, start, SUCCESS, "", False)

    queued = time.monotonic()
    with anyio.move_on_after(plan.total + settings.guard + 5.0):  # + a wait for a thread
        result = await anyio.to_thread.run_sync(in_thread, abandon_on_cancel=True, limiter=limiter)
        if result.elapsed > plan.total + settings.guard:
            return dataclasses.replace(result, outcome=HANG, detail="over total + guard")
        return result
    return Result(plan, HANG, "thread abandoned by the watchdog", queued, math.inf, False)


async def _warm(targets: Targets, faces: Sequence[str]) -> None:
    """One healthy call and stream through each face, on clients closed after: the SDKs
    build their types on first use, and the sync faces' engine loop thread starts."""
    settings = Settings(calls=1, seed=0, faces=tuple(faces))
    healthy = Fault("healthy", "healthy;tokens=4", 1)
    async with AsyncExitStack() as stack:
        clients = _Clients(settings, targets, stack)
        limiter = anyio.CapacityLimiter(1)
        for face in faces:
            for stream in (False, True):
                plan = Plan(0, face, healthy, stream, None, 30.0, None, 0.0)
                result = await _call(clients, plan, settings, limiter)
                if result.outcome != SUCCESS:
                    raise RuntimeError(f"warm-up call failed: {result}")
        clients.close_sync()


# -- leaks ------------------------------------------------------------------------------------


def _held(engine: stallproof.Engine) -> str | None:
    stats = engine.pool.stats()
    whole = stats.in_use == 0 and stats.waiting == 0 and stats.connections == stats.idle
    return None if whole else repr(stats)


def _permits_held(engine: stallproof.Engine) -> str | None:
    state = engine.pacer_state()
    if state is None or (state.in_use == 0 and not any(state.queued.values())):
        return None
    return repr(state)


async def _settled(engines: Mapping[str, stallproof.Engine], seconds: float) -> None:
    """Wait (bounded) until no pool holds a slot: a sync call's release runs on the engine
    loop's thread, a moment after the call returned."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if all(_held(e) is None and _permits_held(e) is None for e in engines.values()):
            return
        await anyio.sleep(0.02)


def _tasks() -> int:
    if sniffio.current_async_library() == "asyncio":
        return len(asyncio.all_tasks())
    return 0  # trio: no task outlives its nursery


@contextmanager
def _unraisable() -> Iterator[list[str]]:
    """What is raised where no caller can catch it (a finaliser, a callback), while the
    soak runs; passed on to the hook that was there (pytest's turns it into a warning)."""
    seen: list[str] = []
    before = sys.unraisablehook

    def hook(info: Any) -> None:
        seen.append(f"{info.exc_type.__name__}: {info.exc_value!r:.200} in {info.object!r:.100}")
        before(info)

    sys.unraisablehook = hook
    try:
        yield seen
    finally:
        sys.unraisablehook = before


# -- the run ----------------------------------------------------------------------------------


async def run(
    settings: Settings,
    targets: Targets,
    *,
    server_ports: frozenset[int] = frozenset(),
    on_result: Callable[[Result], None] | None = None,
) -> Report:
    """Run the soak on the current event loop (asyncio or trio) and report it.

    ``server_ports``: the ports of a fault server in this process, whose sockets the fd
    count leaves out. ``on_result``: called with each call's result as it ends.
    """
    backend = sniffio.current_async_library()
    plans = draw(settings, backend)
    await _warm(targets, settings.faces)
    gc.collect()
    fds_before, tasks_before = fd_census(server_ports), _tasks()
    results: list[Result] = []
    running: dict[int, float] = {}
    pending = iter(plans)
    limiter = anyio.CapacityLimiter(settings.threads)
    lag = LoopLag()
    started = time.monotonic()

    with _unraisable() as unraisable, GcPauses().watching() as pauses:
        async with AsyncExitStack() as stack:
            clients = _Clients(settings, targets, stack)

            async def worker() -> None:
                for plan in pending:
                    running[plan.index] = time.monotonic()
                    result = await _call(clients, plan, settings, limiter)
                    del running[plan.index]
                    results.append(result)
                    if on_result is not None:
                        on_result(result)

            with anyio.move_on_after(settings.limit):
                async with anyio.create_task_group() as outer:
                    outer.start_soon(lag.run, time.monotonic)
                    async with anyio.create_task_group() as tg:
                        for _ in range(settings.concurrency):
                            tg.start_soon(worker)
                    outer.cancel_scope.cancel()
            now = time.monotonic()
            for index, start in running.items():  # cut by the run's limit
                results.append(
                    Result(plans[index], HANG, "cut by the run's limit", start, now, False)
                )
            wall = time.monotonic() - started
            engines = clients.engines()
            await _settled(engines, 2.0)
            pools = {k: h for k, e in engines.items() if (h := _held(e)) is not None}
            permits = {k: h for k, e in engines.items() if (h := _permits_held(e)) is not None}
            clients.close_sync()
        gc.collect()
        await anyio.sleep(0.05)  # a closed transport lets go of its socket a turn later
    fds_after = fd_census(server_ports)
    fds = {k: fds_after[k] - fds_before[k] for k in fds_after | fds_before}
    leaks = Leaks(
        pools,
        permits,
        {k: n for k, n in fds.items() if n},
        _tasks() - tasks_before,
        tuple(unraisable),
    )
    return Report(settings, backend, results, leaks, lag, pauses, wall, len(plans) - len(results))
