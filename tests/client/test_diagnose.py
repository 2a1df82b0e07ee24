"""``stallproof diagnose``: the fleet's calls (real workers on a real Redis), the server's own
running/waiting gauges (the fault server's ``/metrics``), a fresh probe, and a verdict that
names its numbers. The parser and the verdict rules are also tested on literal input.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fault_server import ServerThread, running
from stallproof._diagnose import (
    DEFAULT_GAUGES,
    HEADLINES,
    Fleet,
    MetricsError,
    Probe,
    Server,
    judge,
    parse_prometheus,
    read_gauges,
)

from ..support.fleet import RedisServer, free_port
from ..support.observe import run_cli, start_calls, wait_for_fleet

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 3.0
vllm:num_requests_running{engine="1",model_name="qwen"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen"} 0.0
vllm:num_requests_waiting{engine="1",model_name="qwen"} 7.0 1700000000000
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="qwen"} 12 # {trace_id="a b}"} 1.0
process_cpu_seconds_total 1.5e+01
"""

SGLANG = """\
sglang:num_running_reqs{model_name="m",tp_rank="0"} 0
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 4
sglang:token_usage{model_name="m",note="a \\"quoted\\" } brace"} NaN
"""


# -- the parser and the verdict, on literal input -----------------------------------------


def test_vllm_and_sglang_gauges_sum_over_their_label_sets() -> None:
    samples = parse_prometheus(VLLM)
    counts = read_gauges(samples, DEFAULT_GAUGES)
    assert counts["running"] == (5.0, "vllm:num_requests_running")
    assert counts["waiting"] == (7.0, "vllm:num_requests_waiting")
    assert samples["process_cpu_seconds_total"] == 15.0
    counts = read_gauges(parse_prometheus(SGLANG), DEFAULT_GAUGES)
    assert counts["running"] == (0.0, "sglang:num_running_reqs")
    assert counts["waiting"] == (4.0, "sglang:num_queue_reqs")
    # Both families (the fault server writes both): each request is counted once.
    both = read_gauges(parse_prometheus(VLLM + SGLANG), DEFAULT_GAUGES)
    assert both == {
        "running": (5.0, "vllm:num_requests_running"),
        "waiting": (7.0, "vllm:num_requests_waiting"),
    }
    # A gauge of another name, given by the user; a count nobody names stays unknown.
    mine = read_gauges(
        parse_prometheus("my_running 2\nmy_running 1\n"),
        {"running": ["my_running"], "waiting": ["my_waiting"]},
    )
    assert mine == {"running": (3.0, "my_running"), "waiting": (None, None)}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<html><body>Not Found</body></html>", "line 1 is not a Prometheus sample"),
        ('{"object": "list", "data": []}', "line 1 is not a Prometheus sample"),
        ("ok 1\nok two\n", "line 2 is not a Prometheus sample: 'ok two'"),
        ("# only comments\n\n", "no Prometheus samples"),
        ("", "no Prometheus samples"),
        ('m{a="unclosed} 1', "line 1"),
    ],
)
def test_garbage_is_named_not_guessed(text: str, message: str) -> None:
    with pytest.raises(MetricsError, match=message):
        parse_prometheus(text)


def _fleet(calls: int, stalled: int, before_headers: int) -> Fleet:
    return Fleet("test", 2, calls, stalled, before_headers, {"awaiting headers": before_headers})


ANSWERED = Probe("m", "answered", ttft_s=0.05, total_s=0.2, chunks=8)
SLOW = Probe("m", "answered", ttft_s=9.0, total_s=9.5, chunks=8)
STALLED = Probe("m", "stalled", detail="FirstTokenTimeout after 3.00s in phase 'awaiting headers'")


@pytest.mark.parametrize(
    ("fleet", "server", "probe", "verdict", "words"),
    [
        (_fleet(14, 10, 10), Server("u", 0, 0), ANSWERED, "client_stuck", "10 calls are stalled"),
        (_fleet(14, 10, 10), Server("u", 4, 0), ANSWERED, "client_stuck", "only 4 running"),
        (_fleet(14, 10, 10), Server("u"), ANSWERED, "client_stuck", "counts are unknown"),
        (_fleet(5, 0, 0), Server("u", 3, 0), STALLED, "server_stalled", "3 running, 0 waiting"),
        (None, Server("u", 2, 9), STALLED, "server_queueing", "2 running, 9 waiting"),
        (_fleet(5, 0, 0), Server("u", 8, 8), ANSWERED, "server_queueing", "8 running, 8 waiting"),
        (None, Server("u", 1, 0), Probe("m", "refused", status=429), "server_queueing", "429"),
        (
            None,
            Server("u", 1, 0),
            Probe("m", "error", status=500, detail="boom"),
            "server_error",
            "boom",
        ),
        (_fleet(3, 0, 0), Server("u", 3, 0), SLOW, "slow_but_alive", "took 9.000s"),
        (_fleet(9, 4, 0), Server("u", 6, 0), ANSWERED, "slow_but_alive", "holds 6 requests"),
        (_fleet(3, 0, 0), Server("u", 3, 0), ANSWERED, "healthy", "no fleet call is stalled"),
    ],
)
def test_the_verdict_follows_the_mismatch(
    fleet: Fleet | None, server: Server, probe: Probe, verdict: str, words: str
) -> None:
    got, summary, evidence = judge(fleet, server, probe, slow_ttft=5.0)
    assert got == verdict, summary
    assert words in summary
    assert summary.startswith(HEADLINES[verdict] + ": ")
    assert evidence[0].startswith("fleet:") and evidence[1].startswith("server:")
    assert evidence[2].startswith("probe:")


# -- against the fault server, with real workers ------------------------------------------


@pytest.fixture
def server() -> Iterator[ServerThread]:
    """A fault server of this test alone: its gauges count this test's requests only."""
    with running(host="127.0.0.1", port=0, max_hold=60) as srv:
        yield srv


def _job(srv: ServerThread, redis: RedisServer, prefix: str, **kw: Any) -> dict[str, Any]:
    return {
        "base_url": srv.url(),
        "redis_url": redis.url,
        "prefix": prefix,
        "stuck": 5,
        "stuck_fault": "half_open",
        "slow": 2,
        # A token every 0.1 s: its gaps stay well under stalled_after on a loaded runner.
        "slow_fault": "token_rate;tps=10;tokens=600",
        "interval": 0.2,
        "ttl": 1.5,
        "stalled_after": 0.5,
        "total": 40.0,
        **kw,
    }


def _diagnose(
    srv: ServerThread, redis: RedisServer, prefix: str, *args: str, timeout: float = 3.0
) -> Any:
    return run_cli(
        "diagnose",
        *("--base-url", srv.url(), "--redis", redis.url, "--prefix", prefix),
        *("--api-key", "sk-test-probe", "--timeout", str(timeout)),
        *args,
    )


@pytest.mark.slow
def test_client_side_stuck_names_the_numbers(
    server: ServerThread, redis_server: RedisServer, redis_prefix: str, inflight_workers: Any
) -> None:
    """Two workers, 5 calls each stuck before headers on half-open connections (which never
    reach the server's engine) and 2 slow streams: the server runs only the 4 streams, a
    fresh probe answers, so the 10 stalled calls are the clients' own."""
    job = _job(server, redis_server, redis_prefix)
    procs = start_calls(inflight_workers, job, job)
    pids = {p.pid for p in procs}
    wait_for_fleet(
        redis_server.url,
        redis_prefix,
        lambda s: (
            len([c for c in s.calls if c.pid in pids]) == 14
            and sum(c.stalled for c in s.calls) == 10
        ),
    )
    done = _diagnose(server, redis_server, redis_prefix, "--json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["verdict"] == "client_stuck"
    assert report["numbers"] == {
        "fleet_calls": 14,
        "fleet_stalled": 10,
        "fleet_before_headers": 10,
        "server_running": 4.0,
        "server_waiting": 0.0,
        "probe_ttft_s": report["numbers"]["probe_ttft_s"],
        "probe_total_s": report["numbers"]["probe_total_s"],
    }
    assert 0 < report["numbers"]["probe_ttft_s"] < 3
    assert report["probe"]["outcome"] == "answered"
    assert report["server"]["found"] == {
        "running": ["vllm:num_requests_running"],
        "waiting": ["vllm:num_requests_waiting"],
    }
    summary = report["summary"]
    assert "10 calls are stalled in the fleet (10 before headers)" in summary
    assert "the server reports only 4 running, 0 waiting" in summary
    assert report["evidence"][0].startswith("fleet: 14 calls in flight in 2 processes, 10 stalled")

    words = _diagnose(server, redis_server, redis_prefix)
    assert words.returncode == 1, words.stderr
    assert words.stdout.startswith("verdict: client-side stuck: 10 calls are stalled")

    # One endpoint per engine: their counts add up (here the same one twice).
    metrics = server.url().removesuffix("/v1") + "/metrics"
    twice = _diagnose(server, redis_server, redis_prefix, "--json", *("--metrics", metrics) * 2)
    assert twice.returncode == 1, twice.stderr
    assert json.loads(twice.stdout)["numbers"]["server_running"] == 8.0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "verdict", "running_", "waiting"),
    [
        # The answer starts (head, role chunk) and its first token never comes: running.
        ("slow_first_token;wait=50", "server_stalled", 3.0, 0.0),
        # Read whole and never scheduled: an engine's queue.
        ("stall_headers", "server_queueing", 0.0, 3.0),
    ],
)
def test_a_stalling_server_is_named(
    server: ServerThread,
    redis_server: RedisServer,
    redis_prefix: str,
    inflight_workers: Any,
    fault: str,
    verdict: str,
    running_: float,
    waiting: float,
) -> None:
    """Every chat request stalls at the server: the fleet's 3 calls, and the probe too,
    which gets no first token within --timeout."""
    server.scenario(fault, path="/v1/chat/*")
    job = _job(server, redis_server, redis_prefix, stuck=0, slow=0, plain=3)
    start_calls(inflight_workers, job)
    wait_for_fleet(redis_server.url, redis_prefix, lambda s: sum(c.stalled for c in s.calls) == 3)
    started = time.monotonic()
    # A 1 s probe: what is proven is that it stalls (the bound's value is the engine's
    # to prove), and the scrape of /metrics, bounded by it too, takes milliseconds.
    done = _diagnose(server, redis_server, redis_prefix, "--json", "--model", "m", timeout=1.0)
    assert time.monotonic() - started < 1 + 15  # the probe's bound, and imports
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["verdict"] == verdict, report["summary"]
    assert report["probe"]["outcome"] == "stalled"
    assert "FirstTokenTimeout" in report["probe"]["detail"]
    numbers = report["numbers"]
    assert (numbers["server_running"], numbers["server_waiting"]) == (running_, waiting)
    assert numbers["fleet_stalled"] == 3
    assert numbers["probe_ttft_s"] is None


@pytest.mark.slow
def test_a_healthy_server_and_fleet(
    server: ServerThread, redis_server: RedisServer, redis_prefix: str
) -> None:
    done = _diagnose(server, redis_server, redis_prefix, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["verdict"] == "healthy"
    assert report["numbers"]["fleet_calls"] == 0
    assert report["numbers"]["server_running"] == 0.0


def test_bad_input_is_a_message_and_status_2(fault_server: Any) -> None:
    """Unreachable addresses, metrics that are not Prometheus text, bad options: one line
    on stderr, status 2, within the bounds; never a traceback or a hang."""
    base = fault_server.url()
    cases = [
        (("--base-url", fault_server.refused_url), "cannot reach"),
        (("--base-url", "ftp://example.invalid/v1"), "--base-url must be an http"),
        (("--base-url", base, "--metrics", base + "/models"), "not Prometheus text"),
        (("--base-url", base, "--metrics", fault_server.refused_url), "cannot read"),
        (
            ("--base-url", base, "--redis", f"redis://127.0.0.1:{free_port()}/0"),
            "cannot read the fleet's calls",
        ),
        (("--base-url", base, "--gauge", "running"), "--gauge must be running=NAME"),
        (("--base-url", base, "--timeout", "0"), "--timeout must be > 0"),
        (
            ("--base-url", base, "--model", "m", "--api-key", "k", "--socket", "/nonexistent"),
            "no socket",
        ),
    ]
    secret = "sk-diagnose-secret-4242"
    refused = fault_server.url("status", code=401)
    cases.append((("--base-url", refused, "--model", "m", "--api-key", secret), "HTTP 401"))
    for args, message in cases:
        started = time.monotonic()
        done = run_cli("diagnose", "--timeout", "3", *args, timeout=60)
        assert secret not in done.stdout + done.stderr
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert message in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert time.monotonic() - started < 20
