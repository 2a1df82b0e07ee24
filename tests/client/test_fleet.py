"""Fleet state on Redis (`RedisState`): limits and circuits shared by worker processes, and
Redis trouble that never hangs or fails a call.

Every test runs a real redis-server (the `redis_server` / `own_redis` fixtures) and, where
the fleet matters, real worker processes (tests/support/fleet_worker.py); what was sent is counted
at the fault server.
"""

from __future__ import annotations

import logging
import math
import signal
import socket
import time
from typing import Any, NamedTuple

import anyio
import pytest
from openai.types.chat import ChatCompletionMessageParam
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint

import stallproof

from ..support.clients import MakeClient, pacer_state
from ..support.fleet import FleetWorkers, RedisServer, healthy_state, settled, silent_listener
from ..support.otel import points
from ..support.timing import MARGIN, stopwatch

# Worker processes and a real redis-server: seconds each, so out of `make test-quick`.
pytestmark = pytest.mark.slow

MSGS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]


def _job(base_url: str, redis: RedisServer, prefix: str, **kw: Any) -> dict[str, Any]:
    return {"base_url": base_url, "redis_url": redis.url, "prefix": prefix, **kw}


def _requests(fault_server: Any, key: str) -> list[Any]:
    return [r for c in fault_server.journal(key) for r in c.requests]


async def _until_redis(client: Any, within: float = 5.0) -> None:
    """Call (healthy) until the client is back on Redis (``within`` s at most): a call after
    ``retry_interval`` tries Redis again, and on a loaded machine the first try may still
    fall back."""
    with anyio.fail_after(within):
        while True:
            await client.chat.completions.create(model="m", messages=MSGS)
            if pacer_state(client).shared == "redis":
                return
            await anyio.sleep(0.05)


async def _until_requests(fault_server: Any, key: str, n: int) -> None:
    """Wait (20 s at most) until the server has seen ``n`` requests with ``key``."""
    with anyio.fail_after(20):
        while True:
            if len(_requests(fault_server, key)) >= n:
                return
            await anyio.sleep(0.02)  # another process's progress: there is no event to wait on


class Fleet(NamedTuple):
    fault_server: Any
    fault_key: str
    redis: RedisServer
    prefix: str
    workers: FleetWorkers


@pytest.fixture
def fleet(
    fault_server: Any,
    fault_key: str,
    redis_server: RedisServer,
    redis_prefix: str,
    fleet_workers: FleetWorkers,
) -> Fleet:
    """What a test with worker processes uses: the server, its key, Redis, the workers."""
    return Fleet(fault_server, fault_key, redis_server, redis_prefix, fleet_workers)


def _metric(reader: InMemoryMetricReader, name: str) -> dict[str, int]:
    """A counter's value per its first attribute's value."""
    out: dict[str, int] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == name:
                    for p in points(m, NumberDataPoint):
                        label = str(next(iter((p.attributes or {}).values()), ""))
                        out[label] = out.get(label, 0) + int(p.value)
    return out


# -- config ----------------------------------------------------------------------------------


def test_redis_state_validates_and_never_shows_the_password() -> None:
    shared = stallproof.RedisState("redis://user:hunter2-SECRET@127.0.0.1:6379/0")
    assert "hunter2" not in repr(shared)
    assert "hunter2" not in repr(stallproof.Pacer(requests_per_minute=5, shared=shared))
    for bad in (
        {"url": "http://x"},
        {"url": "redis://x", "op_timeout": 0},
        {"url": "redis://x", "op_timeout": math.inf},
        {"url": "redis://x", "fail": "sometimes"},
        {"url": "redis://x", "prefix": "a{b}"},
        {"url": "redis://x", "lease_ttl": True},
    ):
        with pytest.raises(stallproof.InvalidRequestError, match="RedisState"):
            stallproof.RedisState(**bad)
    with pytest.raises(stallproof.InvalidRequestError, match=r"Pacer\.shared"):
        stallproof.Pacer(shared="redis://x")  # type: ignore[arg-type]
    with pytest.raises(stallproof.InvalidRequestError, match=r"Breaker\.shared"):
        stallproof.Breaker(shared="redis://x")  # type: ignore[arg-type]
    with pytest.raises(stallproof.InvalidRequestError) as info:
        stallproof.RedisState("http://u:hunter2-SECRET@h")
    assert "hunter2" not in str(info.value)


# -- the fleet, in real processes ----------------------------------------------------------


def test_workers_sharing_a_pacer_never_exceed_the_fleets_requests_per_minute(
    fault_server: Any,
    fault_key: str,
    redis_server: RedisServer,
    redis_prefix: str,
    fleet_workers: FleetWorkers,
) -> None:
    # Three workers, each allowed 8 a minute, each trying 6 at once: 8 in all reach the
    # server (24 would without shared state); the rest fail at once, nothing hangs.
    job = _job(
        fault_server.url("healthy", key=fault_key),
        redis_server,
        redis_prefix,
        pacer={"requests_per_minute": 8},
        calls=6,
        total=3.0,
    )
    results = fleet_workers.run([job, job, job])
    outcomes = [r for worker in results for r in worker]
    assert len(outcomes) == 18
    assert len(_requests(fault_server, fault_key)) == 8
    assert sorted(e for e, _ in outcomes if e is not None) == ["PacerTimeout"] * 10
    assert sum(e is None for e, _ in outcomes) == 8
    assert max(t for _, t in outcomes) < 3.0 + MARGIN


def test_breaker_opens_for_the_whole_fleet_and_lets_exactly_one_probe_through(
    fault_server: Any,
    fault_key: str,
    redis_server: RedisServer,
    redis_prefix: str,
    fleet_workers: FleetWorkers,
) -> None:
    # Long enough that the refusing phase (two worker processes' calls) ends inside it on a
    # loaded 2-core runner too: it took 2.8 s under scripts/stress_tests.py.
    reset = 4.0
    breaker = {"fail_max": 3, "reset_timeout": reset}
    # One upstream (the base URL), its faults chosen per request by the X-Fault header.
    failing = _job(
        fault_server.url(),
        redis_server,
        redis_prefix,
        breaker=breaker,
        calls=3,
        fault=f"status;code=500;key={fault_key}",
    )
    slow = {**failing, "calls": 2, "fault": f"healthy;delay=1.5;key={fault_key}"}
    healthy = {**failing, "calls": 2, "fault": f"healthy;key={fault_key}"}
    # Every worker of every phase is started (imports done) before the first phase goes.
    first, *procs = fleet_workers.start(
        failing, *[{**failing, "calls": 2}] * 2, slow, slow, slow, healthy
    )
    refusing, probing, after = procs[:2], procs[2:5], procs[5]

    fleet_workers.go(first)
    assert [e for e, _ in fleet_workers.results(first, timeout=30)] == ["InternalServerError"] * 3
    opened = time.monotonic()
    # Other processes, which never saw a failure, find the circuit open: nothing is sent.
    fleet_workers.go(*refusing)
    refused = [e for p in refusing for e, _ in fleet_workers.lines(p, 2, timeout=30)]
    assert refused == ["CircuitOpen"] * 4
    assert time.monotonic() - opened < reset  # (still open: the test is not too slow)
    assert len(_requests(fault_server, fault_key)) == 3
    # After reset_timeout, one probe for the fleet: a slow healthy answer, and while it is
    # in flight every other call of every worker is refused.
    time.sleep(max(0.0, opened + reset + 0.1 - time.monotonic()))
    fleet_workers.go(*probing)
    outcomes = [e for p in probing for e, _ in fleet_workers.results(p, timeout=30)]
    assert sorted(str(e) for e in outcomes) == ["CircuitOpen"] * 5 + ["None"]
    assert len(_requests(fault_server, fault_key)) == 4
    # The probe succeeded: the circuit is closed for everyone.
    fleet_workers.go(after)
    assert [e for e, _ in fleet_workers.results(after, timeout=30)] == [None, None]


def test_fairness_between_agents_holds_across_processes(
    fault_server: Any,
    fault_key: str,
    redis_server: RedisServer,
    redis_prefix: str,
    fleet_workers: FleetWorkers,
) -> None:
    # One call at a time for the fleet. A chatty agent queues 8 calls in one process first;
    # a quiet one in another process queues 2 a little later: turns alternate, so the quiet
    # agent's calls go 2nd and 4th at the latest, not after the chatty agent's 8.
    chatty_key, quiet_key = f"{fault_key}-chatty", f"{fault_key}-quiet"
    common = {"pacer": {"max_concurrent": 1}, "total": 15.0}
    chatty, quiet = fleet_workers.start(
        _job(
            fault_server.url("healthy", delay=0.15, key=chatty_key),
            redis_server,
            redis_prefix,
            agent="chatty",
            calls=8,
            **common,
        ),
        _job(
            fault_server.url("healthy", delay=0.15, key=quiet_key),
            redis_server,
            redis_prefix,
            agent="quiet",
            calls=2,
            **common,
        ),
    )
    fleet_workers.go(chatty)
    time.sleep(0.3)
    fleet_workers.go(quiet)
    assert all(e is None for e, _ in fleet_workers.results(chatty, timeout=30))
    assert all(e is None for e, _ in fleet_workers.results(quiet, timeout=30))
    order = sorted(
        [(r.started, "chatty") for r in _requests(fault_server, chatty_key)]
        + [(r.started, "quiet") for r in _requests(fault_server, quiet_key)]
    )
    who = [name for _, name in order]
    assert len(who) == 10
    # One at a time for the whole fleet (two processes would otherwise overlap)...
    assert (
        _peak_concurrency(_requests(fault_server, chatty_key) + _requests(fault_server, quiet_key))
        == 1
    )
    # ...and in fair turns: a FIFO across the fleet would serve the quiet agent last.
    assert who.index("quiet") <= 3 and who.count("quiet") == 2
    assert [i for i, name in enumerate(who) if name == "quiet"][1] <= 5, who


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_killed_workers_leases_return_within_their_ttl(
    fleet: Fleet, make_client: MakeClient, anyio_backend: str
) -> None:
    fault_server, fault_key, redis_server, redis_prefix, fleet_workers = fleet
    ttl = 2.0
    (worker,) = fleet_workers.start(
        _job(
            fault_server.url("stall_headers", hold=20, key=fault_key),
            redis_server,
            redis_prefix,
            pacer={"max_concurrent": 2},
            calls=2,
            total=30.0,
            lease_ttl=ttl,
            op_timeout=0.3,
        )
    )
    fleet_workers.go(worker)
    await _until_requests(fault_server, fault_key, 2)  # both hold their leases at the server
    worker.send_signal(signal.SIGKILL)
    killed_at = anyio.current_time()
    shared = healthy_state(redis_server.url, redis_prefix, lease_ttl=ttl)
    client = make_client(
        fault_server.url(), pacer=stallproof.Pacer(max_concurrent=2, shared=shared)
    )
    # The dead worker's two slots are still leased: a short call cannot get one...
    with stopwatch() as t, pytest.raises(stallproof.PacerTimeout):
        await client.chat.completions.create(model="m", messages=MSGS, timeout=0.3)
    assert t[0] < 0.3 + MARGIN
    # ...and a patient one gets one as soon as the leases expire (lease_ttl after their
    # grant, plus the worker's op_timeout), not later.
    await client.chat.completions.create(model="m", messages=MSGS, timeout=10.0)
    assert anyio.current_time() - killed_at < ttl + 0.3 + 0.3 + MARGIN
    assert pacer_state(client).shared == "redis"


# -- a healthy Redis under load --------------------------------------------------------------


def _redis_count(url: str, command: str, key: str) -> int:
    """One command's integer answer, asked with a plain socket (RESP): what Redis holds."""
    host, port = url.removeprefix("redis://").split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(f"*2\r\n${len(command)}\r\n{command}\r\n${len(key)}\r\n{key}\r\n".encode())
        answer = s.recv(64)
    assert answer.startswith(b":"), answer
    return int(answer[1:].split(b"\r\n")[0])


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_200_calls_in_flight_against_a_healthy_redis_never_fall_back_or_drop_a_release(
    fault_server: Any,
    fault_key: str,
    redis_server: RedisServer,
    redis_prefix: str,
    make_client: MakeClient,
    anyio_backend: str,
) -> None:
    # The production default op_timeout (0.1 s), a pacer and a breaker sharing one store,
    # 200 calls at once: the loop is loaded (hundreds of tasks, the fault server's
    # thread in this process), Redis is not. Before pipelining and a bound that does not
    # count the loop's lateness, 10-40% of admissions fell back here and releases were
    # dropped while the store flapped.
    shared = stallproof.RedisState(redis_server.url, prefix=redis_prefix)
    reader = InMemoryMetricReader()
    client = make_client(
        fault_server.url("healthy", delay=0.3, key=fault_key),
        timeout=30.0,
        pacer=stallproof.Pacer(max_concurrent=200, shared=shared),
        breaker=stallproof.Breaker(shared=shared),
        meter_provider=MeterProvider(metric_readers=[reader]),
    )
    errors: list[BaseException] = []

    async def call() -> None:
        try:
            await client.chat.completions.create(model="m", messages=MSGS)
        except stallproof.StallproofError as e:
            errors.append(e)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for _ in range(200):
                tg.start_soon(call)
        await settled(client)
    assert errors == []
    assert _metric(reader, "stallproof.shared.fallbacks") == {}
    assert _metric(reader, "stallproof.shared.dropped") == {}
    assert _metric(reader, "stallproof.shared.transitions") == {}
    assert pacer_state(client).shared == "redis"
    assert pacer_state(client).in_use == 0
    # Every lease went back to Redis itself: none is left to expire.
    assert _redis_count(redis_server.url, "ZCARD", f"{{{redis_prefix}}}:pacer:leases") == 0
    assert len(_requests(fault_server, fault_key)) == 200


def _evalsha_calls(url: str) -> int:
    """How many EVALSHA Redis has run (``INFO commandstats``): scripts, i.e. round trips."""
    host, port = url.removeprefix("redis://").split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"*2\r\n$4\r\nINFO\r\n$12\r\ncommandstats\r\n")
        data = b""
        while not data.endswith(b"\r\n\r\n") and len(data) < 1_000_000:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    line = next((x for x in data.decode().splitlines() if x.startswith("cmdstat_evalsha:")), "")
    return int(line.split("calls=")[1].split(",")[0]) if line else 0


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_shared_pacer_and_breaker_admit_a_call_in_one_round_trip(
    fault_server: Any,
    fault_key: str,
    own_redis: RedisServer,
    redis_prefix: str,
    make_client: MakeClient,
    anyio_backend: str,
) -> None:
    # One call: one script before it is sent (the pacer's grant and the breaker's verdict
    # together), two after it in the background (release, outcome); two scripts in turn
    # before it made four.
    shared = healthy_state(own_redis.url, redis_prefix)
    client = make_client(
        fault_server.url("healthy", key=fault_key),
        pacer=stallproof.Pacer(max_concurrent=4, shared=shared),
        breaker=stallproof.Breaker(fail_max=1, reset_timeout=0.5, shared=shared),
    )
    await client.chat.completions.create(model="m", messages=MSGS)  # scripts loaded
    await settled(client)
    before = _evalsha_calls(own_redis.url)
    await client.chat.completions.create(model="m", messages=MSGS)
    await settled(client)
    assert _evalsha_calls(own_redis.url) - before == 3
    assert pacer_state(client).shared == "redis"
    # The verdict that comes with the grant is the breaker's own: open, refused; after
    # reset_timeout, this call is the fleet's one probe, and its success closes the circuit.
    with pytest.raises(stallproof.InternalServerError):
        await client.chat.completions.create(
            model="m", messages=MSGS, extra_headers={"X-Fault": "status;code=500"}
        )
    await settled(client)
    with pytest.raises(stallproof.CircuitOpen):
        await client.chat.completions.create(model="m", messages=MSGS)
    await anyio.sleep(0.6)
    await client.chat.completions.create(model="m", messages=MSGS)
    await settled(client)
    assert [c.state for c in client.circuits().values()] == ["closed"]
    assert pacer_state(client).in_use == 0


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_release_redis_missed_is_sent_again_when_it_is_back(
    fault_server: Any,
    fault_key: str,
    own_redis: RedisServer,
    redis_prefix: str,
    make_client: MakeClient,
    anyio_backend: str,
) -> None:
    # A call ends while Redis is stalled: its release gets no answer. It is kept, not
    # dropped, and goes out when Redis is tried again (retry_interval later): the lease
    # is back long before it would expire by itself (the call's 30 s total).
    shared = stallproof.RedisState(
        own_redis.url, prefix=redis_prefix, op_timeout=0.2, retry_interval=0.5
    )
    reader = InMemoryMetricReader()
    client = make_client(
        fault_server.url("healthy", delay=0.5, key=fault_key),
        timeout=30.0,
        pacer=stallproof.Pacer(max_concurrent=4, shared=shared),
        meter_provider=MeterProvider(metric_readers=[reader]),
    )
    leases = f"{{{redis_prefix}}}:pacer:leases"
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: client.chat.completions.create(model="m", messages=MSGS))
        await _until_requests(fault_server, fault_key, 1)
        assert _redis_count(own_redis.url, "ZCARD", leases) == 1
        own_redis.pause()
    try:
        with anyio.fail_after(5):  # the release waits op_timeout for an answer, in vain
            while pacer_state(client).shared == "redis":
                await settled(client)
    finally:
        own_redis.resume()
    with anyio.fail_after(5):  # Redis's state: there is no event to wait on
        while _redis_count(own_redis.url, "ZCARD", leases) != 0:  # noqa: ASYNC110
            await anyio.sleep(0.05)
    await settled(client)
    assert _metric(reader, "stallproof.shared.dropped") == {}
    assert pacer_state(client).shared == "redis"


# -- Redis trouble -------------------------------------------------------------------------


def _shared_client(make_client: MakeClient, base_url: str, url: str, prefix: str, **kw: Any) -> Any:
    shared = stallproof.RedisState(url, prefix=prefix, op_timeout=0.1, **kw)
    reader = InMemoryMetricReader()
    client = make_client(
        base_url,
        pacer=stallproof.Pacer(max_concurrent=4, requests_per_minute=100, shared=shared),
        breaker=stallproof.Breaker(fail_max=3, shared=shared),
        meter_provider=MeterProvider(metric_readers=[reader]),
    )
    return client, reader


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("stall", ["answers nothing", "never accepts"])
@pytest.mark.anyio
async def test_a_stalled_redis_costs_a_call_at_most_op_timeout_then_nothing(
    fault_server: Any,
    make_client: MakeClient,
    redis_prefix: str,
    caplog: pytest.LogCaptureFixture,
    stall: str,
    anyio_backend: str,
) -> None:
    caplog.set_level(logging.WARNING, logger="stallproof")
    with silent_listener() as silent:
        url = silent if stall == "answers nothing" else fault_server.blackhole_url
        url = url.replace("http://", "redis://").removesuffix("/v1")
        client, reader = _shared_client(
            make_client, fault_server.url("healthy", delay=0.3), url, redis_prefix
        )
        seen: list[Any] = []

        async def watch() -> None:
            while True:
                seen.extend(client.inflight())
                await anyio.sleep(0.02)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            with stopwatch() as t:  # the pacer's operation waits out op_timeout; then no more
                await client.chat.completions.create(model="m", messages=MSGS, timeout=5)
            tg.cancel_scope.cancel()
        assert t[0] < 0.3 + 0.1 + MARGIN
        with stopwatch() as t:  # Redis is known to be down: no more time spent on it
            for _ in range(3):
                await client.chat.completions.create(
                    model="m", messages=MSGS, timeout=5, extra_headers={"X-Fault": "healthy"}
                )
        assert t[0] < 3 * 0.05 + MARGIN
    # While it waited for its answer, inflight() said where its limits came from.
    assert seen[-1].shared == "local (no answer within op_timeout=0.1s)"
    assert (pacer_state(client).shared or "").startswith("local (")
    lines = [r.getMessage() for r in caplog.records if "fleet state on Redis" in r.getMessage()]
    # One for the client (its pacer and breaker share the RedisState), not one per call.
    assert len(lines) == 1
    assert "unavailable" in lines[0] and "local state" in lines[0]
    assert _metric(reader, "stallproof.shared.transitions") == {"local": 1}
    assert sum(_metric(reader, "stallproof.shared.fallbacks").values()) >= 8


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_redis_killed_and_restarted_mid_run_falls_back_then_resynchronises(
    fault_server: Any,
    own_redis: RedisServer,
    redis_prefix: str,
    make_client: MakeClient,
    caplog: pytest.LogCaptureFixture,
    anyio_backend: str,
) -> None:
    caplog.set_level(logging.WARNING, logger="stallproof")
    client, reader = _shared_client(
        make_client, fault_server.url(), own_redis.url, redis_prefix, retry_interval=0.3
    )
    await client.chat.completions.create(model="m", messages=MSGS)
    assert pacer_state(client).shared == "redis"
    own_redis.kill()
    with stopwatch() as t:
        for _ in range(5):  # every call still goes, on time, on local state
            await client.chat.completions.create(model="m", messages=MSGS, timeout=2)
    assert t[0] < 5 * 0.05 + 0.1 + MARGIN
    assert (pacer_state(client).shared or "").startswith("local (")
    own_redis.start()
    await anyio.sleep(0.35)  # retry_interval
    await _until_redis(client)
    (circuit,) = client.circuits().values()
    assert circuit.state == "closed"
    messages = [r.getMessage() for r in caplog.records]
    assert sum("resynchronised" in m for m in messages) == 1
    assert _metric(reader, "stallproof.shared.transitions") == {"local": 1, "shared": 1}


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_fail_closed_refuses_at_once_without_sending(
    fault_server: Any,
    fault_key: str,
    make_client: MakeClient,
    redis_prefix: str,
    anyio_backend: str,
) -> None:
    with silent_listener() as silent:
        client, _ = _shared_client(
            make_client,
            fault_server.url("healthy", key=fault_key),
            silent,
            redis_prefix,
            fail="closed",
        )
        for _ in range(2):
            with stopwatch() as t, pytest.raises(stallproof.SharedStateUnavailable) as info:
                await client.chat.completions.create(model="m", messages=MSGS, timeout=5)
            assert t[0] < 0.1 + MARGIN
            assert "op_timeout" in info.value.reason
            assert info.value.stallproof_request_id is not None
    assert _requests(fault_server, fault_key) == []
    assert pacer_state(client).in_use == 0


@pytest.mark.parametrize("anyio_backend", ["trio"])
@pytest.mark.anyio
async def test_on_trio_calls_run_on_local_state(
    fault_server: Any,
    redis_server: RedisServer,
    redis_prefix: str,
    make_client: MakeClient,
    caplog: pytest.LogCaptureFixture,
    anyio_backend: str,
) -> None:
    caplog.set_level(logging.WARNING, logger="stallproof")
    client, _ = _shared_client(make_client, fault_server.url(), redis_server.url, redis_prefix)
    for _ in range(3):
        await client.chat.completions.create(model="m", messages=MSGS)
    assert (
        pacer_state(client).shared
        == "local (redis-py runs on asyncio only; this loop is not asyncio)"
    )
    assert sum("asyncio only" in r.getMessage() for r in caplog.records) == 1


# -- every limit is the fleet's ------------------------------------------------------------


def _peak_concurrency(requests: list[Any]) -> int:
    events = sorted(
        [(r.started, 1) for r in requests] + [(r.ended, -1) for r in requests if r.ended],
        key=lambda e: (e[0], e[1]),
    )
    peak = now = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_an_overload_seen_by_one_process_shrinks_the_fleets_limit(
    fault_server: Any,
    fault_key: str,
    redis_server: RedisServer,
    redis_prefix: str,
    make_client: MakeClient,
    anyio_backend: str,
) -> None:
    # Two clients with their own in-process state, as two workers have: a 429 that one of
    # them sees halves the concurrency limit of both (4 -> 2).
    shared = healthy_state(redis_server.url, redis_prefix, poll_interval=0.01)
    pacer = stallproof.Pacer(max_concurrent=4, shared=shared)
    one, two = (make_client(fault_server.url(), pacer=pacer) for _ in range(2))
    with pytest.raises(stallproof.RateLimitError):
        await one.chat.completions.create(
            model="m", messages=MSGS, extra_headers={"X-Fault": "status;code=429"}
        )
    await settled(one)  # the release went in the background

    async def call() -> None:
        await two.chat.completions.create(
            model="m",
            messages=MSGS,
            timeout=10,
            extra_headers={"X-Fault": f"healthy;delay=0.3;key={fault_key}"},
        )

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(call)
    requests = _requests(fault_server, fault_key)
    assert len(requests) == 4
    assert _peak_concurrency(requests) == 2


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_an_overload_report_that_reaches_redis_after_its_release_still_counts(
    redis_server: RedisServer, redis_prefix: str, anyio_backend: str
) -> None:
    """An attempt's 429 report and the call's release are two background operations on
    connections of their own: Redis may run the release first. The report must shrink the
    fleet's limit all the same (it once looked the lease up, gone by then)."""
    import redis.asyncio

    from stallproof._fleet import Stores
    from stallproof._pacer import PacerRuntime

    shared = healthy_state(redis_server.url, redis_prefix)
    stores = Stores()
    pacing = PacerRuntime(stallproof.Pacer(max_concurrent=4, shared=shared), stores=stores)
    permit = await pacing.acquire(
        agent=None, estimated_tokens=1, deadline=anyio.current_time() + 10
    )
    lease = permit._fleet
    assert lease is not None
    lease._fleet._report(lease, True, None, False, False, False)  # the release, first
    await stores.settle()
    lease._fleet._report(lease, False, None, True, False, False)  # then the 429 report
    await stores.settle()
    db = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        limit = await db.hget("{" + redis_prefix + "}:pacer:aimd", "limit")
    finally:
        await db.aclose()
        await pacing.aclose()
    assert limit is not None and float(limit) == 2


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_tokens_per_minute_is_the_fleets(
    fault_server: Any,
    fault_key: str,
    redis_server: RedisServer,
    redis_prefix: str,
    make_client: MakeClient,
    anyio_backend: str,
) -> None:
    shared = healthy_state(redis_server.url, redis_prefix)
    pacer = stallproof.Pacer(tokens_per_minute=100, shared=shared)
    one, two = (make_client(fault_server.url(), pacer=pacer) for _ in "12")
    slow = {"X-Fault": f"healthy;delay=0.5;key={fault_key}"}

    async def call(client: Any, timeout: float = 30) -> None:
        # Its estimate: 3 tokens of message and max_tokens=45, until its usage is known.
        await client.chat.completions.create(
            model="m", messages=MSGS, max_tokens=45, extra_headers=slow, timeout=timeout
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, one)
        tg.start_soon(call, two)
        await _until_requests(fault_server, fault_key, 2)  # both hold their estimates
        with stopwatch() as t, pytest.raises(stallproof.PacerTimeout, match="fleet"):
            await call(one, timeout=5)
        assert t[0] < 0.1 + MARGIN  # at once: the window frees capacity only in a minute
    # Their real usage (9 tokens each) replaced the estimates, for the fleet: room again.
    await settled(one)  # the releases went in the background
    await settled(two)
    with stopwatch() as t:
        await call(two, timeout=5)
    assert t[0] < 0.5 + 0.3 + MARGIN
    assert len(_requests(fault_server, fault_key)) == 3


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_caller_cancelled_during_a_redis_operation_leaves_nothing_behind(
    fault_server: Any,
    fault_key: str,
    make_client: MakeClient,
    redis_prefix: str,
    anyio_backend: str,
) -> None:
    with silent_listener() as silent:
        shared = stallproof.RedisState(silent, prefix=redis_prefix, op_timeout=5.0)
        client = make_client(
            fault_server.url("healthy", key=fault_key),
            pacer=stallproof.Pacer(max_concurrent=1, shared=shared),
        )
        with stopwatch() as t, anyio.move_on_after(0.2):
            await client.chat.completions.create(model="m", messages=MSGS, timeout=30)
        assert t[0] < 0.2 + MARGIN
        await settled(client)  # the cancelled operation's task unwinds
        assert pacer_state(client).in_use == 0
        assert client.inflight() == ()
        assert client._engine._pacing is not None and client._engine._pacing._fleet is not None
        assert client._engine._pacing._fleet.store._tasks == set()
    assert _requests(fault_server, fault_key) == []


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_redis_stalled_mid_run_costs_no_call_its_budget_and_resynchronises(
    fault_server: Any,
    own_redis: RedisServer,
    redis_prefix: str,
    make_client: MakeClient,
    anyio_backend: str,
) -> None:
    client, reader = _shared_client(
        make_client, fault_server.url(), own_redis.url, redis_prefix, retry_interval=0.3
    )
    await client.chat.completions.create(model="m", messages=MSGS)  # connections are open
    own_redis.pause()  # SIGSTOP: the open connections get no answer, new ones no accept
    try:
        with stopwatch() as t:
            for _ in range(5):
                await client.chat.completions.create(model="m", messages=MSGS, timeout=2)
        # One operation waits out op_timeout; then none until retry_interval has passed,
        # and again at most one.
        assert t[0] < 2 * 0.1 + 5 * 0.05 + MARGIN
        assert pacer_state(client).shared == "local (no answer within op_timeout=0.1s)"
    finally:
        own_redis.resume()
    await anyio.sleep(0.35)  # retry_interval
    await _until_redis(client)
    assert _metric(reader, "stallproof.shared.transitions") == {"local": 1, "shared": 1}


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_killed_workers_probe_frees_the_fleets_probe_slot_at_its_deadline(
    fleet: Fleet, make_client: MakeClient, anyio_backend: str
) -> None:
    fault_server, fault_key, redis_server, redis_prefix, fleet_workers = fleet
    breaker: dict[str, Any] = {"fail_max": 1, "reset_timeout": 0.5}
    shared = healthy_state(redis_server.url, redis_prefix)
    client = make_client(fault_server.url(), breaker=stallproof.Breaker(**breaker, shared=shared))
    with pytest.raises(stallproof.InternalServerError):
        await client.chat.completions.create(
            model="m", messages=MSGS, extra_headers={"X-Fault": "status;code=500"}
        )
    await settled(client)  # the outcome went in the background: the circuit is open
    # A worker becomes the fleet's probe (after reset_timeout), stalls, and is killed. (It
    # starts in milliseconds, forked from the zygote: it must not ask before reset_timeout.)
    await anyio.sleep(breaker["reset_timeout"] + 0.1)
    (worker,) = fleet_workers.start(
        _job(
            fault_server.url(),
            redis_server,
            redis_prefix,
            breaker=breaker,
            total=2.0,
            op_timeout=0.3,
            fault=f"stall_headers;hold=20;key={fault_key}",
        )
    )
    fleet_workers.go(worker)
    await _until_requests(fault_server, fault_key, 1)
    probe_sent = anyio.current_time()
    worker.send_signal(signal.SIGKILL)
    with pytest.raises(stallproof.CircuitOpen) as info:
        await client.chat.completions.create(model="m", messages=MSGS)
    assert info.value.retry_in == 0  # a probe is in flight, as far as the fleet knows
    # Its slot is free by its call's deadline (total=2 s, plus the worker's op_timeout):
    # then this process's call is the probe, succeeds, and closes the circuit.
    with anyio.fail_after(5):
        while True:
            try:
                await client.chat.completions.create(model="m", messages=MSGS)
                break
            except stallproof.CircuitOpen:
                await anyio.sleep(0.05)
    assert anyio.current_time() - probe_sent < 2.0 + 0.3 + 0.1 + MARGIN
    await settled(client)
    (circuit,) = client.circuits().values()
    assert circuit.state == "closed"
