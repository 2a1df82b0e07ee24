"""Every fault x (stream, non-stream): the right typed error, within its bound + MARGIN.

Each case drives a real fault over a real loopback socket (fault_server), on asyncio and
on trio, and checks the pool afterwards: nothing stays checked out.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import anyio
import httpcore2
import pytest
from openai.types.chat import ChatCompletionMessageParam

import stallproof
from stallproof import Timeouts

from ..support.clients import (
    MakeClient,
    assert_pool_clean,
    complete,
    hold_the_only_connection,
    warm,
)
from ..support.timing import MARGIN, engine_of, stopwatch

pytestmark = pytest.mark.anyio

MSGS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]
# Loose bounds that should not fire; each case tightens the one it wants to see.
LOOSE = Timeouts(connect=5, read=5, write=5, pool=5, first_token=5, idle=5, total=5)
HOLD = 20  # the fault server keeps a stalled socket this long: far past every budget


@dataclasses.dataclass(frozen=True)
class Case:
    fault: str
    stream: bool
    expect: type[stallproof.StallproofError]
    timeouts: Timeouts
    params: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def id(self) -> str:
        kind = "stream" if self.stream else "plain"
        extra = ",".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.fault}[{extra}]-{kind}-{self.expect.__name__}"


def t(**bounds: float) -> Timeouts:
    return LOOSE.replace(**bounds)


CASES = [
    # Accepts, never reads, never answers. (A total of its own, every other bound loose: the
    # half second a loaded runner honours, as read's below.)
    *(Case("half_open", s, stallproof.TotalTimeout, t(total=0.5)) for s in (False, True)),
    *(
        Case("half_open", s, stallproof.FirstTokenTimeout, t(first_token=0.6))
        for s in (False, True)
    ),
    *(Case("half_open", s, stallproof.ReadTimeout, t(read=0.5)) for s in (False, True)),
    # Reads the request, never sends a status line.
    *(Case("stall_headers", s, stallproof.TotalTimeout, t(total=0.5)) for s in (False, True)),
    *(
        Case("stall_headers", s, stallproof.FirstTokenTimeout, t(first_token=0.6))
        for s in (False, True)
    ),
    # One byte per interval: `read` (0.5 s) never fires; total, or first_token, does, 0.5 s
    # after read would have (its end could not pass for theirs).
    Case("trickle_body", False, stallproof.TotalTimeout, t(read=0.5, total=1), {"interval": 0.05}),
    Case(
        "trickle_body",
        True,
        stallproof.FirstTokenTimeout,
        t(read=0.5, first_token=1),
        {"interval": 0.05},
    ),
    Case("trickle_body", True, stallproof.TotalTimeout, t(read=0.5, total=1), {"interval": 0.05}),
    # Keep-alive comments (stream) / whitespace (plain) forever.
    Case(
        "sse_keepalive",
        True,
        stallproof.FirstTokenTimeout,
        t(read=0.5, first_token=1),
        {"interval": 0.05},
    ),
    Case("sse_keepalive", False, stallproof.TotalTimeout, t(read=0.5, total=1), {"interval": 0.05}),
    # Data events with empty deltas forever: not content.
    Case(
        "sse_empty_deltas",
        True,
        stallproof.FirstTokenTimeout,
        t(read=0.5, first_token=1),
        {"interval": 0.05},
    ),
    # Some content, then silence with the socket open.
    Case("sse_stall", True, stallproof.IdleTimeout, t(idle=0.8), {"after": 2}),
    Case("sse_stall", True, stallproof.ReadTimeout, t(read=0.5), {"after": 2}),
    Case("sse_stall", False, stallproof.TotalTimeout, t(total=0.5)),
    # Body shorter than Content-Length, socket held open.
    Case("content_length_lie", False, stallproof.TotalTimeout, t(total=0.5)),
    Case("content_length_lie", False, stallproof.ReadTimeout, t(read=0.5)),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
async def test_fault_ends_with_the_bound_that_fired(
    case: Case, fault_server: Any, fault_scope: Any, make_client: MakeClient
) -> None:
    # On a warm connection the request goes out as the stopwatch starts, so the stopwatch
    # measures first_token and read from the moment they start, as it does total.
    assert issubclass(case.expect, stallproof.TimeoutException)  # CASES are all bounds
    client = make_client(fault_server.url())
    await warm(client)
    fault = fault_scope.headers(case.fault, hold=HOLD, **case.params)
    limit = getattr(case.timeouts, case.expect.bound)
    with stopwatch() as elapsed, pytest.raises(case.expect) as info:
        await complete(client, stream=case.stream, timeout=case.timeouts, extra_headers=fault)
    err = info.value
    assert elapsed[0] <= limit + MARGIN, f"{elapsed[0]:.3f}s for a {limit}s {err.bound} bound"
    assert err.bound == case.expect.bound
    assert err.limit == limit
    assert err.elapsed is not None and err.elapsed <= elapsed[0] + 0.01
    assert err.stallproof_request_id and err.stallproof_request_id.startswith("sp-")
    assert err.bound in str(err) and f"{limit:g}s" in str(err)
    # first_token / idle measure from sending or from the last content, not call start.
    if case.expect.bound in ("total", "read"):
        assert elapsed[0] >= limit - 0.05
    assert_pool_clean(client)


FAST_CASES = [
    *(
        Case("reset", s, stallproof.ConnectionLost, t(total=2), {"when": "before"})
        for s in (False, True)
    ),
    *(
        Case("reset", s, stallproof.ConnectionLost, t(total=2), {"when": "mid"})
        for s in (False, True)
    ),
    *(Case("close_mid_body", s, stallproof.TruncatedResponse, t(total=2)) for s in (False, True)),
    *(Case("malformed_json", s, stallproof.MalformedResponse, t(total=2)) for s in (False, True)),
    *(
        Case("status", s, stallproof.InternalServerError, t(total=2), {"code": 503})
        for s in (False, True)
    ),
    *(
        Case("status", s, stallproof.RateLimitError, t(total=2), {"code": 429})
        for s in (False, True)
    ),
    *(
        Case("status", s, stallproof.BadRequestError, t(total=2), {"code": 400})
        for s in (False, True)
    ),
]


@pytest.mark.parametrize("case", FAST_CASES, ids=lambda c: c.id)
async def test_broken_answers_fail_fast_with_a_typed_error(
    case: Case, fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url(case.fault, hold=HOLD, **case.params))
    with stopwatch() as elapsed, pytest.raises(case.expect) as info:
        await complete(client, stream=case.stream, timeout=case.timeouts)
    assert elapsed[0] < 1.0, f"{case.fault} took {elapsed[0]:.3f}s"
    assert info.value.stallproof_request_id
    assert_pool_clean(client)


async def test_status_error_carries_code_body_request_ids_and_retry_after(
    fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url("status", code=503, retry_after=7))
    with pytest.raises(stallproof.InternalServerError) as info:
        await client.chat.completions.create(
            model="m", messages=MSGS, extra_headers={"x-request-id": "mine-1"}
        )
    err = info.value
    assert err.status_code == 503
    assert err.retry_after == 7.0
    assert isinstance(err.body, dict) and "message" in err.body  # the inner error object
    assert err.stallproof_request_id == "mine-1"
    assert err.request_id == err.server_request_id  # openai's meaning: the server's id
    assert err.server_request_id
    assert "503" in str(err)


async def test_never_accepting_listener_is_a_connect_timeout(
    fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(fault_server.blackhole_url)
    with stopwatch() as elapsed, pytest.raises(stallproof.ConnectTimeout) as info:
        await client.chat.completions.create(model="m", messages=MSGS, timeout=t(connect=0.5))
    assert elapsed[0] <= 0.5 + MARGIN
    assert info.value.phase == "connecting"


async def test_never_accepting_listener_is_cut_by_total(
    fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(fault_server.blackhole_url)
    with stopwatch() as elapsed, pytest.raises(stallproof.TotalTimeout) as info:
        await client.chat.completions.create(model="m", messages=MSGS, timeout=t(total=0.7))
    assert 0.65 <= elapsed[0] <= 0.7 + MARGIN
    assert info.value.phase == "connecting"


async def test_refused_connection_is_a_connect_error(make_client: MakeClient) -> None:
    with anyio.fail_after(5):
        # Port 1 on loopback: nothing listens there.
        client = make_client("http://127.0.0.1:1/v1")
        with pytest.raises(stallproof.ConnectError):
            await client.chat.completions.create(model="m", messages=MSGS, timeout=t(total=2))


async def test_a_peer_that_stops_reading_is_a_write_timeout(
    fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url("half_open", hold=HOLD))
    # Far more than loopback's socket buffers hold (a send buffer of at most 4 MiB; the
    # peer never reads, so its receive buffer never grows), so the write must block. Not
    # 48 MiB: copying that into the transport's buffer before the bound starts took 0.3 s
    # of a starved worker, which the clock below cannot leave out.
    big: list[ChatCompletionMessageParam] = [{"role": "user", "content": "x" * (16 * 1024 * 1024)}]
    # The write bound starts after the body is serialised and the connection made: timed
    # from where the wire says it starts sending (the trace event the call's phase comes
    # from), the body already encoded. (A stopwatch around the whole call, less a
    # serialisation timed beforehand, swung by half a second on a loaded machine; a mark
    # at the pool's entry still counted the encoding.)
    pool = engine_of(client).pool
    pool_send = pool.send
    sending: list[float] = []

    async def send_marked(request: Any) -> Any:
        if not isinstance(request, httpcore2.Request):
            request = request.build()  # a `RequestPlan`: built once a connection is free
        trace = request.extensions["trace"]

        async def marked(name: str, info: Any) -> None:
            if name == "http11.send_request_headers.started":
                sending.append(time.monotonic())
            await trace(name, info)

        request.extensions["trace"] = marked
        return await pool_send(request)

    pool.send = send_marked
    with pytest.raises(stallproof.WriteTimeout) as info:
        await client.chat.completions.create(model="m", messages=big, timeout=t(write=0.5))
    elapsed = time.monotonic() - sending[0]
    assert 0.5 <= elapsed <= 0.5 + MARGIN, elapsed
    assert info.value.phase == "sending"


async def test_pool_wait_is_a_pool_timeout(fault_server: Any, make_client: MakeClient) -> None:
    client, holder = await hold_the_only_connection(make_client, fault_server)
    async with holder:
        with stopwatch() as elapsed, pytest.raises(stallproof.PoolTimeout) as info:
            await client.chat.completions.create(model="m", messages=MSGS, timeout=t(pool=0.5))
        assert elapsed[0] <= 0.5 + MARGIN
        assert info.value.phase == "pool wait"


async def test_total_covers_a_long_pool_wait(fault_server: Any, make_client: MakeClient) -> None:
    client, holder = await hold_the_only_connection(make_client, fault_server)
    async with holder:
        with stopwatch() as elapsed, pytest.raises(stallproof.TotalTimeout):
            await client.chat.completions.create(model="m", messages=MSGS, timeout=0.6)
        assert elapsed[0] <= 0.6 + MARGIN


async def test_a_deadline_block_ends_a_call_waiting_for_a_connection(
    fault_server: Any, make_client: MakeClient
) -> None:
    """A `deadline()` block shorter than the call's total ends it in the pool's queue, on
    time and by its own name, out of the queue. (On trio the pool, not a cancel scope of
    the call's, keeps the call's deadline while it waits: `stallproof._wire._pool`.)"""
    client, holder = await hold_the_only_connection(make_client, fault_server)
    async with holder:
        with (
            stopwatch() as elapsed,
            pytest.raises(stallproof.DeadlineExceeded) as info,
            stallproof.deadline(0.5, name="turn"),
        ):
            await client.chat.completions.create(model="m", messages=MSGS, timeout=30)
        assert 0.5 <= elapsed[0] <= 0.5 + MARGIN
        assert info.value.name == "turn"
        assert engine_of(client).pool.stats().waiting == 0


async def test_idle_is_not_reset_by_keepalives_after_content(
    fault_server: Any, make_client: MakeClient
) -> None:
    # sse_stall delivers content, then goes silent; a read bound longer than idle proves
    # idle is what ends it, measured from the last content event.
    client = make_client(fault_server.url("sse_stall", after=3, hold=HOLD))
    stream = await client.chat.completions.create(
        model="m", messages=MSGS, stream=True, timeout=t(idle=0.5, read=3)
    )
    got = 0
    with pytest.raises(stallproof.IdleTimeout) as info:
        async for chunk in stream:
            got += 1
            del chunk
    assert got >= 3
    assert info.value.phase == "streaming"


async def test_caller_time_between_chunks_does_not_count_as_idle(
    fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url("healthy", tokens=4))
    stream = await client.chat.completions.create(
        model="m", messages=MSGS, stream=True, timeout=t(idle=0.3, first_token=0.3)
    )
    chunks = 0
    async for _ in stream:
        chunks += 1
        await anyio.sleep(0.2)  # two slow steps in a row would exceed idle if they counted
    assert chunks >= 4


async def test_per_call_timeout_overrides_the_client_default(
    fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url("half_open", hold=HOLD), timeout=30.0)
    with stopwatch() as elapsed, pytest.raises(stallproof.TotalTimeout) as info:
        await client.chat.completions.create(model="m", messages=MSGS, timeout=0.5)
    assert info.value.limit == 0.5
    assert elapsed[0] <= 0.5 + MARGIN


@pytest.mark.parametrize("stream", [False, True])
async def test_size_caps_end_huge_answers_with_a_typed_error(
    stream: bool, fault_server: Any, make_client: MakeClient
) -> None:
    """A 16 MiB body or SSE line against 1 MiB caps: ResponseTooLarge, memory bounded."""
    client = make_client(
        fault_server.url("huge_body", size=16 * 1024 * 1024),
        limits=stallproof.Limits(max_response_bytes=1024 * 1024, max_line_bytes=64 * 1024),
    )
    with stopwatch() as elapsed, pytest.raises(stallproof.ResponseTooLarge) as info:
        s = await client.chat.completions.create(model="m", messages=MSGS, stream=stream)
        assert isinstance(s, stallproof.AsyncStream)  # a plain answer raised above
        async for _ in s:
            pass
    assert info.value.limit == (64 * 1024 if stream else 1024 * 1024)
    assert elapsed[0] < 2.0
    assert_pool_clean(client)
