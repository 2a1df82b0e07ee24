"""The engine under httpx and httpx2: bounds, typed errors in both families, release.

Drives plain ``httpx.AsyncClient`` / ``httpx2.AsyncClient`` with stallproof's transports
against real faults over loopback, on asyncio and trio: every fault ends within its bound
with an error that is both the stallproof class and the library's, and the pool holds
nothing afterwards.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import anyio
import httpx
import httpx2
import pytest

import stallproof
from stallproof import Timeouts

from ..support.timing import MARGIN, SentClock, wait_until

pytestmark = pytest.mark.anyio

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
STREAM_BODY = json.dumps(
    {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
)
# total 0.5 s past first_token + idle, so that a late first event still ends in idle.
BOUNDS = Timeouts(connect=2, read=2, write=2, pool=2, first_token=0.6, idle=0.5, total=1.6)
HOLD = 20


def nothing_held(transport: Any) -> bool:
    return bool(transport.engine.pool.stats().nothing_held)


@pytest.fixture(params=["httpx", "httpx2"])
def lib(request: pytest.FixtureRequest) -> Any:
    return httpx if request.param == "httpx" else httpx2


def make(lib: Any, **settings: Any) -> Any:
    settings.setdefault("retry", None)
    settings.setdefault("timeout", BOUNDS)
    if lib is httpx:
        return stallproof.http_client(**settings)
    return stallproof.http_client2(**settings)


async def test_healthy_call_and_stream(fault_server: Any, lib: Any) -> None:
    async with make(lib) as client:
        r = await client.post(fault_server.url() + "/chat/completions", content=BODY)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
        async with client.stream(
            "POST", fault_server.url() + "/chat/completions", content=STREAM_BODY
        ) as s:
            assert s.headers["content-type"].startswith("text/event-stream")
            data = b"".join([part async for part in s.aiter_bytes()])
        assert data.rstrip().endswith(b"data: [DONE]")
        assert nothing_held(client._transport), client._transport.engine.pool.stats()
        assert client._transport.inflight() == ()


@pytest.mark.parametrize(
    ("fault", "stream", "bound", "lib_class"),
    [
        ("half_open", False, "first_token", "TimeoutException"),
        ("sse_keepalive", True, "first_token", "TimeoutException"),
        ("sse_empty_deltas", True, "first_token", "TimeoutException"),
        ("trickle_body", False, "total", "TimeoutException"),
        ("sse_stall", True, "idle", "TimeoutException"),
    ],
)
async def test_bounds_fire_as_both_error_families(
    fault_server: Any, lib: Any, fault: str, stream: bool, bound: str, lib_class: str
) -> None:
    extra: dict[str, dict[str, Any]] = {
        "sse_stall": {"after": 2},
        "trickle_body": {"interval": 0.2},
    }
    params = extra.get(fault, {})
    url = fault_server.url(fault, hold=HOLD, **params) + "/chat/completions"
    async with make(lib) as client:
        clock = SentClock(client)
        with pytest.raises(stallproof.TimeoutException) as info:
            if stream:
                async with client.stream("POST", url, content=STREAM_BODY) as s:
                    async for _ in s.aiter_bytes():
                        pass
            else:
                await client.post(url, content=BODY)
        error = info.value
        assert error.bound == bound
        assert isinstance(error, getattr(lib, lib_class))
        assert error.request.url == url  # httpx's RequestError.request works
        assert clock.elapsed() <= BOUNDS.total + MARGIN
        assert nothing_held(client._transport), client._transport.engine.pool.stats()
        assert client._transport.inflight() == ()


async def test_reset_is_a_read_error_and_connection_lost(fault_server: Any, lib: Any) -> None:
    url = fault_server.url("reset", when="before") + "/chat/completions"
    async with make(lib) as client:
        with pytest.raises(stallproof.ConnectionLost) as info:
            await client.post(url, content=BODY)
        assert isinstance(info.value, lib.ReadError)
        assert nothing_held(client._transport), client._transport.engine.pool.stats()


async def test_status_errors_come_back_as_responses_after_retries(
    fault_server: Any, fault_key: str, lib: Any
) -> None:
    fast = stallproof.Retry(attempts=3, backoff_base=0.01, backoff_max=0.02)
    async with make(lib, retry=fast) as client:
        url = fault_server.url() + "/chat/completions"
        # 503 twice then healthy: the engine retries inside its deadline.
        headers = {"X-Fault": f"status;code=503;first=2;key={fault_key}"}
        r = await client.post(url, content=BODY, headers=headers)
        assert r.status_code == 200
        # Always 400: not retried, and the response reaches the caller as it was.
        r = await client.post(url, content=BODY, headers={"X-Fault": "status;code=400"})
        assert r.status_code == 400 and "error" in r.json()


async def test_the_library_timeouts_only_tighten(fault_server: Any, lib: Any) -> None:
    # httpx's own read timeout of 0.3 s is tighter than the engine's 2 s: it applies.
    async with make(lib) as client:
        with pytest.raises(stallproof.ReadTimeout):
            await client.post(
                fault_server.url("half_open", hold=HOLD) + "/chat/completions",
                content=BODY,
                timeout=lib.Timeout(5, read=0.3),
            )


async def test_caller_cancellation_releases_everything(fault_server: Any, lib: Any) -> None:
    async with make(lib) as client:
        url = fault_server.url("sse_stall", after=1, hold=HOLD) + "/chat/completions"
        with anyio.move_on_after(0.3):
            async with client.stream("POST", url, content=STREAM_BODY) as s:
                async for _ in s.aiter_bytes():
                    pass
        assert nothing_held(client._transport), client._transport.engine.pool.stats()
        assert client._transport.inflight() == ()


async def test_one_engine_shared_by_two_faces(fault_server: Any) -> None:
    engine = stallproof.Engine(timeout=BOUNDS, retry=None)
    a = httpx.AsyncClient(transport=stallproof.AsyncTransport(engine))
    b = httpx2.AsyncClient(transport=stallproof.AsyncTransport2(engine))
    url = fault_server.url("half_open", hold=HOLD) + "/chat/completions"
    async with a, b, anyio.create_task_group() as tg:
        for c in (a, b):
            tg.start_soon(_swallow, c.post(url, content=BODY))
        await wait_until(lambda: len(engine.inflight()) == 2, what="both calls in flight")
        tg.cancel_scope.cancel()  # seen: their bounds have nothing to add here
    assert engine.inflight() == ()
    await engine.aclose()


async def _swallow(coro: Any) -> None:
    with contextlib.suppress(stallproof.TimeoutException):
        await coro


def test_bad_settings_are_refused() -> None:
    with pytest.raises(stallproof.InvalidRequestError, match="engine or settings"):
        stallproof.AsyncTransport(stallproof.Engine(), retry=None)
    with pytest.raises(stallproof.InvalidRequestError, match="retry"):
        stallproof.AsyncTransport2(retry=3)
