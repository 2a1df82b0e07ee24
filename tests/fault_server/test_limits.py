"""Bad input gets a clear 4xx, and the server keeps serving: nesting, empty matches, heads.

Each case goes over a real loopback socket to a real server and reads the answer off the
wire: a dropped connection (what deeply nested JSON got before) fails the test as surely as
a wrong status.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterator

import pytest

from fault_server import FaultSpecError, ServerThread, running
from fault_server._bounded import MAX_KEYS, SeenKeys, touch

from ..support.wire import http_request, raw_exchange

DEEP = b"[" * 100_000
JSON = {"Content-Type": "application/json"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def proxy(fault_server: ServerThread) -> Iterator[ServerThread]:
    with running(upstream=fault_server.url()) as srv:
        yield srv


def assert_still_serving(srv: ServerThread) -> None:
    answer = raw_exchange(srv.base_url, http_request("GET", "/v1/models"))
    assert answer.status == 200, answer


@pytest.mark.parametrize(
    ("path", "method"),
    [("/v1/chat/completions", "POST"), ("/_fault/scenarios", "POST"), ("/_fault/mix", "PUT")],
)
@pytest.mark.parametrize(
    "body", [DEEP, b"[" * 200 + b"]" * 200, b'{"a":' * 500 + b"1" + b"}" * 500]
)
def test_deeply_nested_json_gets_a_400(
    fault_server: ServerThread, path: str, method: str, body: bytes
) -> None:
    answer = raw_exchange(fault_server.base_url, http_request(method, path, body, JSON))
    assert answer.status == 400, answer
    message = answer.json()["error"]["message"]  # type: ignore[index]
    assert "nested deeper than 128" in message, message
    assert_still_serving(fault_server)


def test_deeply_nested_json_through_the_proxy_gets_the_upstreams_400(proxy: ServerThread) -> None:
    answer = raw_exchange(proxy.base_url, http_request("POST", "/v1/chat/completions", DEEP, JSON))
    assert answer.status == 400, answer
    assert "nested deeper" in answer.json()["error"]["message"]  # type: ignore[index]
    assert_still_serving(proxy)


def test_nesting_up_to_the_limit_is_accepted(fault_server: ServerThread) -> None:
    deep_content = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    value: object = "leaf"
    for _ in range(120):
        value = [value]
    body = json.dumps({**deep_content, "metadata": value}).encode()
    answer = raw_exchange(
        fault_server.base_url, http_request("POST", "/v1/chat/completions", body, JSON)
    )
    assert answer.status == 200, answer


@pytest.mark.parametrize("match", ["", [], 0, False, "key=k"])
def test_a_rule_whose_match_is_not_an_object_is_refused(
    fault_server: ServerThread, fault_key: str, match: object
) -> None:
    body = json.dumps({"fault": "status;code=503", "match": match, "id": fault_key}).encode()
    answer = raw_exchange(
        fault_server.base_url, http_request("POST", "/_fault/scenarios", body, JSON)
    )
    assert answer.status == 400, answer
    assert "'match' must be a JSON object" in answer.json()["error"]["message"]  # type: ignore[index]
    assert all(rule.id != fault_key for rule in fault_server.scenarios())


def head_of(size: int) -> bytes:
    """A GET head of exactly ``size`` bytes, blank line included."""
    start = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Pad: "
    end = b"\r\n\r\n"
    return start + b"a" * (size - len(start) - len(end)) + end


@pytest.mark.parametrize(
    ("size", "status"),
    [(65_536, 200), (65_537, 431), (100 * 1024, 431), (126 * 1024, 431)],
)
def test_the_request_head_limit_is_exactly_64_kib(
    fault_server: ServerThread, size: int, status: int
) -> None:
    answer = raw_exchange(fault_server.base_url, head_of(size))
    assert answer.status == status, answer
    assert_still_serving(fault_server)


def test_a_long_head_behind_a_body_is_refused_too(fault_server: ServerThread) -> None:
    body = json.dumps(CHAT).encode()
    first = http_request("POST", "/v1/chat/completions", body, {**JSON, "Connection": "keep-alive"})
    answer = raw_exchange(fault_server.base_url, first + head_of(100 * 1024))
    assert answer.raw.count(b"HTTP/1.1 200") == 1, answer
    assert b"HTTP/1.1 431" in answer.raw, answer


def test_at_most_10000_rules_are_armed(fault_server: ServerThread, fault_key: str) -> None:
    many = [{"fault": "status;code=503", "times": 1} for _ in range(10_001)]
    body = json.dumps({"key": fault_key, "scenarios": many}).encode()
    answer = raw_exchange(
        fault_server.base_url, http_request("PUT", "/_fault/scenarios", body, JSON)
    )
    assert answer.status == 400, answer
    assert "at most 10000 rules" in answer.json()["error"]["message"]  # type: ignore[index]
    assert fault_server.scenarios(fault_key) == ()
    assert_still_serving(fault_server)


def test_exhausted_rules_make_room_for_new_ones() -> None:
    with running(max_hold=5) as srv:
        body = json.dumps({"scenarios": [{"fault": "status;code=418", "times": 1}] * 10_000})
        put = http_request("PUT", "/_fault/scenarios", body.encode(), JSON)
        assert raw_exchange(srv.base_url, put).status == 200
        assert raw_exchange(srv.base_url, http_request("GET", "/v1/models")).status == 418
        srv.scenario("status", code=409, rule_id="newest")  # the exhausted one made room
        rules = srv.scenarios()
        assert len(rules) == 10_000 and rules[-1].id == "newest"
        with pytest.raises(FaultSpecError, match="at most 10000 rules"):
            srv.scenario("status", code=409, rule_id="one-too-many")


def test_per_key_memory_keeps_the_most_recent_keys() -> None:
    counts: OrderedDict[str, int] = OrderedDict()
    for i in range(MAX_KEYS + 10):
        touch(counts, f"k{i}", 0)
    touch(counts, "k10", 0)  # seen again: now the most recent
    assert len(counts) == MAX_KEYS and "k9" not in counts and next(reversed(counts)) == "k10"
    seen = SeenKeys()
    for i in range(SeenKeys.CAP + 5):
        seen.add((0, f"k{i}"))
    assert len(seen) == SeenKeys.CAP and (0, "k0") not in seen and (0, f"k{SeenKeys.CAP}") in seen
