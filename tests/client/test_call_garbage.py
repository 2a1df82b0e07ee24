"""A call leaves no cyclic garbage of the engine's: its objects are freed when it ends.

At scale the garbage collector's pauses are the tail of the deadline (benchmarks/scale.py):
every object a call leaves in a reference cycle waits for a collection, and full
collections over thousands of calls stop the loop for hundreds of milliseconds. These
tests make calls end the way a storm ends them (the total deadline), then collect with
``gc.DEBUG_SAVEALL`` and look for the engine's own objects among what only the collector
could free.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import types
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpcore2
import pytest

import stallproof
from stallproof._body import ResponseBody
from stallproof._call import Call
from stallproof._callscope import CallScope
from stallproof._telemetry import CallTelemetry

from ..support.clients import MakeClient
from ..support.timing import wait_until

pytestmark = pytest.mark.anyio

BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
_OURS = (Call, CallScope, CallTelemetry, ResponseBody)
_OUR_MODULES = ("_engine.py", "_call.py", "_callscope.py", "_body.py", "_retry.py")


@pytest.fixture
def black_hole() -> Iterator[str]:
    """A loopback listener that never accepts: the kernel takes each request, nobody answers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    host, port = sock.getsockname()
    yield f"http://{host}:{port}/v1"
    sock.close()


def _engine_garbage() -> list[str]:
    """What the collector alone would free that belongs to the engine (by type or frame)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = []
        for obj in gc.garbage:
            if isinstance(obj, _OURS):
                found.append(type(obj).__name__)
            elif isinstance(obj, types.FrameType) and obj.f_code.co_filename.endswith(_OUR_MODULES):
                # co_qualname is 3.11+; 3.10 (which we support) has only co_name.
                code = obj.f_code
                found.append(f"frame {getattr(code, 'co_qualname', code.co_name)}")
        return found
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


async def _calls_without_gc(client: stallproof.Client, n: int, error: type[Exception]) -> list[str]:
    gc.collect()
    gc.disable()
    try:
        for _ in range(n):
            with pytest.raises(error):
                await client.chat.completions.create(**BODY)
        return _engine_garbage()
    finally:
        gc.enable()


async def test_a_call_ended_by_its_deadline_leaves_no_cycle(
    make_client: MakeClient, black_hole: str
) -> None:
    # The default Retry: a TotalTimeout is not retried, so the first attempt's own path.
    client = make_client(
        black_hole, retry=stallproof.Retry(), timeout=stallproof.Timeouts(total=0.2)
    )
    assert await _calls_without_gc(client, 3, stallproof.TotalTimeout) == []


def _one_connection(make_client: MakeClient, black_hole: str) -> stallproof.Client:
    """A client of one connection to a server that never answers: one call takes it, the
    rest wait in the pool's queue (for 10 s at most)."""
    client: stallproof.Client = make_client(
        black_hole,
        limits=stallproof.Limits(max_connections=1, max_keepalive_connections=1),
        timeout=stallproof.Timeouts(total=10),
    )
    return client


# GC-tracked objects a call waiting for a connection may hold, its asyncio task included:
# 21 on CPython 3.11; 39 when each waiting call still held its built request, the pool's
# own waiting coroutine and the redirect layer's, its per-call defaults, its JSON body and
# prepared call, and a bound method per timer. (Each object more per call adds ~0.4 ms to
# every full collection's pause per 1,000 calls in flight, measured on the 2-core VM here.)
WAITING_OBJECTS = 24


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # what a task costs is the loop's
async def test_a_call_waiting_for_a_connection_holds_few_objects_and_no_request(
    make_client: MakeClient, black_hole: str
) -> None:
    """Thousands of calls may wait for a connection at once, and every full collection walks
    every object each of them holds: at 10,000 calls that pause is the tail of the deadline
    (benchmarks/scale.py). A waiting call holds the pool's `RequestPlan`, not its request
    (built once it has a connection), and few objects in all."""
    client = _one_connection(make_client, black_hole)
    pool = client._engine.pool
    n = 50
    first = asyncio.ensure_future(client.chat.completions.create(**BODY))
    await wait_until(lambda: pool.stats().in_use == 1, what="the one connection taken")
    gc.collect()
    known = {id(o) for o in gc.get_objects()}
    waiting = [asyncio.ensure_future(client.chat.completions.create(**BODY)) for _ in range(n)]
    try:
        await wait_until(lambda: pool.stats().waiting == n, what="every call queued")
        gc.collect()
        new = [o for o in gc.get_objects() if id(o) not in known]
        assert [o for o in new if isinstance(o, httpcore2.Request)] == []
        per_call = len(new) / n
        assert per_call <= WAITING_OBJECTS, sorted(
            Counter(type(o).__name__ for o in new).items(), key=lambda kv: -kv[1]
        )
        del new
    finally:
        for task in (first, *waiting):
            task.cancel()
        outcomes = await asyncio.gather(first, *waiting, return_exceptions=True)
    assert all(isinstance(o, asyncio.CancelledError) for o in outcomes), outcomes
    assert pool.stats().nothing_held


# On trio, what a waiting call holds besides its task and context: 18 on CPython 3.11 (its
# coroutines, `Call`, scope, telemetry, plan, waiter, `bounded` block, the keeper's heap
# entry). 25 before its cancel scope was deferred until a connection is free (a scope, its
# status and two sets per call) and the pool's waiter parked the task itself (trio's
# coroutine, generator and message per waiting call).
TRIO_WAITING_OBJECTS = 20


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_call_waiting_for_a_connection_on_trio_holds_no_cancel_scope_of_its_own(
    make_client: MakeClient, black_hole: str
) -> None:
    """On trio a waiting call's bounds are kept by the pool (one heap entry per call, in one
    task per run: `stallproof._wire._pool._Deadlines`), not by a cancel scope per call
    whose cancellation trio delivers as a captured exception with its traceback: those,
    thousands at once when a wave of deadlines passes, set off full collections among the
    deadlines (benchmarks/scale.py). The call's scope starts once it has a connection."""
    import trio

    client = _one_connection(make_client, black_hole)
    pool = client._engine.pool
    n = 50

    async def one() -> None:
        await client.chat.completions.create(**BODY)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one)
        await wait_until(lambda: pool.stats().in_use == 1, what="the one connection taken")
        gc.collect()
        known = {id(o) for o in gc.get_objects()}
        for _ in range(n):
            nursery.start_soon(one)
        await wait_until(lambda: pool.stats().waiting == n, what="every call queued")
        gc.collect()
        new = [o for o in gc.get_objects() if id(o) not in known]
        kinds = Counter(type(o).__name__ for o in new)
        census = sorted(kinds.items(), key=lambda kv: -kv[1])
        # (The pool's deadline keeper holds a scope of its own, one for all the calls.)
        for kind in ("CancelScope", "CancelStatus", "WaitTaskRescheduled", "Request"):
            assert kinds[kind] <= 2, (kind, census)
        # Besides what trio's task costs (the task, its context, the bound `send`): ours.
        per_call = (len(new) - kinds["Task"] - kinds["Context"]) / n
        assert per_call <= TRIO_WAITING_OBJECTS, (per_call, census)
        del new
        nursery.cancel_scope.cancel()
    assert pool.stats().nothing_held
