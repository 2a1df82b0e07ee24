"""Bad input gets a clear 4xx, and the server keeps serving: nesting, empty matches, heads.

Each case goes over a real loopback socket to a real server and reads the answer off the
wire: a dropped connection (what deeply nested JSON got before) fails the test as surely as
a wrong status.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from fault_server import ServerThread, running
from tests.wire import http_request, raw_exchange

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
