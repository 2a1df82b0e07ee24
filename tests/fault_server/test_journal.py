"""The journal never stalls the server, and never grows without bound.

The latency test runs the server in a process of its own (tests/support/journal_server.py),
its journal filled with 50,000 requests, and measures a healthy request's latency on another
connection while the test queries the journal and asks for verdicts, all over real sockets.
The 50,000 are journaled in place, as the server records a request it serves: sending them
cost the server ~7 s of CPU in h11 that the queries' cost does not depend on (what goes
into the journal over the wire: `test_the_journal_pages_through_everything_once_in_order`).
"""

from __future__ import annotations

import json
import socket
import statistics
import threading
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest

from fault_server import ServerThread, running
from fault_server._journal import CONNECTION_COST, REQUEST_COST, Journal, JournalLimits

from ..support.wire import address, cli_server, http_request, pipeline, raw_exchange

KEYS = 1000
FILL = 50_000
JSON = {"Content-Type": "application/json"}


def fill(base_url: str, count: int, keys: int = KEYS, per_connection: int = 1000) -> None:
    """``count`` journaled requests (cheap 404s), spread evenly over ``keys`` keys."""
    for start in range(0, count, per_connection):
        batch = [
            f"GET /v1/nope HTTP/1.1\r\nHost: x\r\nX-Fault-Key: k{i % keys}\r\n\r\n".encode()
            for i in range(start, min(count, start + per_connection))
        ]
        batch[-1] = batch[-1].replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
        assert pipeline(base_url, batch) == len(batch)


def get_json(base_url: str, path: str) -> dict[str, Any]:
    answer = raw_exchange(base_url, http_request("GET", path), seconds=5)
    assert answer.status == 200, answer
    data = answer.json()
    assert isinstance(data, dict)
    return data


class Probe:
    """Healthy requests on one keep-alive connection, back to back, with their latency."""

    def __init__(self, base_url: str) -> None:
        self.sock = socket.create_connection(address(base_url), timeout=10)
        self.request = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"

    def once(self) -> float:
        start = time.perf_counter()
        self.sock.sendall(self.request)
        data = b""
        while b"\r\n\r\n" not in data or not data.endswith(b"}]}"):
            chunk = self.sock.recv(65536)
            assert chunk, "the server closed the probe connection"
            data += chunk
        return time.perf_counter() - start

    def run(self, seconds: float) -> list[float]:
        end = time.monotonic() + seconds
        out = []
        while time.monotonic() < end:
            out.append(self.once())
        return out


@pytest.fixture(scope="module")
def full() -> Iterator[str]:
    args = ("--requests", str(FILL), "--keys", str(KEYS))
    with cli_server(*args, script="journal_server.py") as (base_url, _):
        yield base_url


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1]


@pytest.mark.slow
def test_queries_on_50k_requests_add_under_50_ms_to_other_connections(full: str) -> None:
    probe = Probe(full)
    baseline = probe.run(1.0)
    stop = threading.Event()
    costs: list[float] = []
    seen: dict[str, dict[str, Any]] = {}

    def query() -> None:
        paths = [
            "/_fault/journal?key=k7",
            "/_fault/verdict?key=k7",
            "/_fault/journal",
            "/_fault/journal?after=40.500&limit=500",
        ]
        while not stop.is_set():
            for path in paths:
                start = time.perf_counter()
                seen[path] = get_json(full, path)
                costs.append(time.perf_counter() - start)

    worker = threading.Thread(target=query)
    worker.start()
    try:
        during = probe.run(2.0)
    finally:
        stop.set()
        worker.join(30)
    probe.sock.close()
    # p95 against p95: on a loaded machine the baseline has its own tail, which the queries
    # do not cause.
    added = p95(during) - p95(baseline)
    assert added < 0.05, (added, p95(during), p95(baseline), max(costs))
    assert len(costs) >= 8, costs  # the queries ran, and each was quick
    verdict = seen["/_fault/verdict?key=k7"]
    assert isinstance(verdict, dict) and verdict["attempts"] == FILL // KEYS
    keyed = seen["/_fault/journal?key=k7"]
    assert isinstance(keyed, dict)
    assert sum(len(c["requests"]) for c in keyed["connections"]) == FILL // KEYS


@pytest.mark.slow
def test_the_journal_pages_through_everything_once_in_order() -> None:
    with running() as srv:
        fill(srv.base_url, 2500, keys=10, per_connection=700)
        seen: list[tuple[int, int]] = []
        path = "/_fault/journal?limit=400"
        pages = 0
        while True:
            page = get_json(srv.base_url, path)
            pages += 1
            for conn in page["connections"]:
                seen += [(r["connection"], r["index"]) for r in conn["requests"]]
            if page["next"] is None:
                break
            path = f"/_fault/journal?limit=400&after={page['next']}"
        assert seen == sorted(seen) and len(seen) == len(set(seen)) == 2500
        assert pages == 7
        keyed = get_json(srv.base_url, "/_fault/journal?key=k3&limit=100")
        assert sum(len(c["requests"]) for c in keyed["connections"]) == 100
        assert keyed["next"] is not None


@pytest.mark.parametrize("query", ["after=x", "after=1", "limit=0", "limit=5001", "limit=a"])
def test_a_bad_page_request_gets_a_400(fault_server: ServerThread, query: str) -> None:
    answer = raw_exchange(fault_server.base_url, http_request("GET", f"/_fault/journal?{query}"))
    assert answer.status == 400, answer


def test_forget_drops_a_keys_journal_counts_and_rules(own_server: ServerThread) -> None:
    own_server.scenario("status", code=503, times=1, key="gone")
    fill(own_server.base_url, 40, keys=2)
    assert own_server.key_stats("k0").requests == 20
    body = json.dumps({"key": "k0"}).encode()
    answer = raw_exchange(own_server.base_url, http_request("POST", "/_fault/forget", body, JSON))
    assert answer.status == 200, answer
    assert answer.json() == {
        "forgot": {"requests": 20, "counts": 1, "rules": 0, "draws": 0, "fixtures": 0}
    }
    assert own_server.journal("k0") == ()
    assert own_server.key_stats("k0").requests == 0
    assert len([r for c in own_server.journal("k1") for r in c.requests]) == 20
    assert own_server.forget("gone")["rules"] == 1 and own_server.scenarios() == ()


@pytest.fixture
def own_server() -> Iterator[ServerThread]:
    with running(max_hold=5) as srv:
        yield srv


# -- the pytest plugin forgets each test's key: these two run in this order -----------------


def test_plugin_forgets_a_tests_key_before_the_next_test(pytester: pytest.Pytester) -> None:
    """One session of the plugin: a test leaves requests and a rule under its key; the next
    test finds none of it. (Its own session: under pytest-xdist, two tests of ours may run
    in different workers, each with its own server.)"""
    pytester.makepyfile(
        """
        import httpx

        LEFT_BEHIND = []

        def test_leaves_requests_under_its_key(fault_server, fault_key):
            headers = {"X-Fault-Key": fault_key}
            httpx.get(fault_server.url() + "/models", headers=headers).raise_for_status()
            fault_server.scenario("status", code=500, key=fault_key)
            assert fault_server.journal(fault_key) != ()
            LEFT_BEHIND.append(fault_key)

        def test_finds_that_key_forgotten(fault_server):
            (key,) = LEFT_BEHIND
            assert fault_server.journal(key) == ()
            assert fault_server.key_stats(key).requests == 0
            assert fault_server.scenarios(key) == ()
        """
    )
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=2)


# -- bounded memory --------------------------------------------------------------------------


def journal_with(limits: JournalLimits, requests: int, text: int) -> Journal:
    journal = Journal(limits)
    conn = journal.open("127.0.0.1:1")
    for i in range(requests):
        if i % 100 == 0:
            conn = journal.open(f"127.0.0.1:{i}")
        log = conn.request("POST", "/v1/chat/completions" + "x" * text)
        log.key = f"key-{i % 500}-" + "k" * text
        log.request_id = f"req-{i}-" + "r" * text
        log.idempotency_key = f"idem-{i}"
        log.fault, log.source = "status;code=503" + "f" * text, "path"
        conn.end_request(log, "complete")
    return journal


@pytest.mark.slow
@pytest.mark.parametrize("text", [0, 40, 2000])
def test_the_journal_stays_within_its_byte_budget_by_measure(text: int) -> None:
    limits = JournalLimits(requests=1_000_000, connections=1_000_000, bytes=2 * 1024 * 1024)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        journal = journal_with(limits, 10_000, text)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    _connections, requests, charged = journal.size
    assert charged <= limits.bytes
    assert requests < 10_000  # the oldest went
    # what it really holds is covered by what it charges (the charge is honest).
    assert used <= limits.bytes * 1.1, (used, charged, requests)
    assert journal.snapshot()[-1].requests[-1].request_id.startswith("req-9999-")  # type: ignore[union-attr]


def test_the_journal_keeps_the_newest_requests_and_connections() -> None:
    journal = journal_with(JournalLimits(requests=1000, connections=50), 5000, 0)
    connections, requests, _ = journal.size
    assert (connections, requests) == (50, 1000)
    records = journal.snapshot()
    indexes = [r.request_id for c in records for r in c.requests]
    assert indexes[0] == "req-4000-" and indexes[-1] == "req-4999-"
    assert len(journal.snapshot(key="key-7-")) == 2  # 1000 kept / 500 keys, on 2 connections
    assert journal.forget("key-7-") == 2 and journal.snapshot(key="key-7-") == ()


def test_costs_are_stated() -> None:
    assert REQUEST_COST > 0 and CONNECTION_COST > 0
