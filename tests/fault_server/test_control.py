"""Faults armed on the server: scenarios, the seeded mix, the control API, journal, verdicts.

Tests that count or arm server-wide things start their own server (``own``); tests that use
a key-isolated `FaultScope` share the session's server, as a user's suite would.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from typing import Any

import httpx
import openai
import pytest

import fault_server
from fault_server import FaultScope, FaultSpecError, KeyStats, ServerThread, Verdict
from fault_server._scenarios import Match, Rule, Scenarios
from fault_server._spec import parse_fault

from ..support.timing import MARGIN, wait_until_sync
from ..support.wire import CHAT, ROOT, STREAM, Raw, chat_path, request

pytestmark = pytest.mark.usefixtures("no_server_errors")


JSON = {"Content-Type": "application/json"}  # what every control write must say.


def codes(url: str, n: int, **kwargs: Any) -> list[int]:
    with httpx.Client() as client:
        return [client.get(url + "/models", **kwargs).status_code for _ in range(n)]


def control(srv: ServerThread, method: str, path: str, body: object = None) -> httpx.Response:
    content = None if body is None else json.dumps(body).encode()
    return httpx.request(method, f"{srv.base_url}/_fault/{path}", content=content, headers=JSON)


# -- scenarios ------------------------------------------------------------------------------


def test_fail_n_then_ok_with_the_scope_fixture(fault_scope: FaultScope) -> None:
    rule = fault_scope.fail_first(2, "status", code=503)
    assert (rule.times, rule.remaining) == (2, 2)
    assert codes(fault_scope.url(), 4) == [503, 503, 200, 200]
    assert fault_scope.stats() == KeyStats(requests=4, connections=1, faulted=2)
    (left,) = fault_scope.scenarios()
    assert (left.remaining, left.used) == (0, 2)
    assert fault_scope.verdict().attempts == 4


def test_a_chain_of_faults_then_healthy(fault_scope: FaultScope) -> None:
    fault_scope.then("status", code=429).then("status", code=502, times=2).then("reset")
    url = fault_scope.url() + "/models"
    seen: list[object] = []
    for _ in range(5):
        try:
            seen.append(httpx.get(url).status_code)
        except httpx.TransportError:  # ReadError or RemoteProtocolError, as the RST lands
            seen.append("reset")
    assert seen == [429, 502, 502, "reset", 200]
    applied = fault_scope.verdict().requests
    assert [r.fault.replace(f";key={fault_scope.key}", "") for r in applied] == [
        "status;code=429",
        "status;code=502",
        "status;code=502",
        "reset",
        "healthy",
    ]


def test_scopes_are_isolated(fault_server: ServerThread, fault_key: str) -> None:
    mine, theirs = fault_server.scope(fault_key + "-a"), fault_server.scope(fault_key + "-b")
    try:
        mine.fail_first(1, "status", code=500)
        assert codes(theirs.url(), 1) == [200]  # another key: the rule does not match
        assert codes(fault_server.url(), 1) == [200]  # no key at all: nor here
        assert codes(mine.url(), 2) == [500, 200]
        # A scope's headers put a request in it without changing the URL.
        theirs.fail_first(1, "status", code=418)
        assert codes(fault_server.url(), 2, headers=theirs.headers()) == [418, 200]
    finally:
        mine.clear()
        theirs.clear()
    assert mine.scenarios() == theirs.scenarios() == ()


def test_rules_match_path_method_stream_and_model(own: ServerThread) -> None:
    own.scenario("status", code=401, path="/v1/models", method="GET")
    own.scenario("status", code=402, stream=True)
    own.scenario("status", code=403, model="gpt-*")
    with httpx.Client() as client:
        chat = own.url() + "/chat/completions"
        got = [
            client.get(own.url() + "/models").status_code,
            client.post(chat, json=STREAM).status_code,
            client.post(chat, json={**CHAT, "model": "gpt-4o"}).status_code,
            client.post(chat, json=CHAT).status_code,
            # A fault named in the path loses to a matching rule...
            client.post(own.url("status", code=500) + "/chat/completions", json=STREAM).status_code,
            # ...one named in a header wins over every rule.
            client.post(chat, json=STREAM, headers={"X-Fault": "status;code=409"}).status_code,
        ]
    assert got == [401, 402, 403, 200, 402, 409]
    assert [r.used for r in own.scenarios()] == [1, 2, 1]
    sources = [r.source for c in own.journal() for r in c.requests]
    assert sources == ["scenario", "scenario", "scenario", "default", "scenario", "header"]


def test_a_rule_id_makes_arming_idempotent(own: ServerThread) -> None:
    for _ in range(3):
        own.scenario("status", code=503, times=1, rule_id="flaky")
    assert len(own.scenarios()) == 1
    assert codes(own.url(), 2) == [503, 200]
    own.scenario("status", code=503, times=1, rule_id="flaky")  # re-armed: one use again
    assert codes(own.url(), 2) == [503, 200]


def test_a_rule_id_replaces_only_a_rule_still_armed() -> None:
    """Arming finds a rule by its id in an index: a rule cleared (with its key, or by a
    replace of its key's rules) is gone from it, and the same id arms a new rule at the
    end of the queue; a rule still armed is replaced in its place."""
    scenarios = Scenarios()

    def armed() -> list[tuple[str, str | None, object]]:
        return [(r.id, r.match.key, r.spec.params["code"]) for r in scenarios.rules()]

    def rule(rule_id: str, key: str, code: int) -> Rule:
        return Rule(rule_id, parse_fault(f"status;code={code}"), Match(key=key))

    scenarios.add(rule("a", "k1", 500))
    scenarios.add(rule("b", "k2", 501))
    scenarios.add(rule("c", "k1", 502))
    assert scenarios.clear("k1") == 2
    scenarios.add(rule("a", "k3", 503))  # "a" was cleared: a new rule, after "b"
    scenarios.add(rule("b", "k2", 504))  # "b" is armed: replaced in place
    assert armed() == [("b", "k2", 504), ("a", "k3", 503)]
    scenarios.replace([rule("d", "k3", 505)], key="k3")
    scenarios.add(rule("a", "k1", 506))
    assert armed() == [("b", "k2", 504), ("d", "k3", 505), ("a", "k1", 506)]
    scenarios.clear()
    scenarios.add(rule("b", "k1", 507))
    assert armed() == [("b", "k1", 507)]


def test_scenario_generic_params_come_from_the_request(own: ServerThread, fault_key: str) -> None:
    own.scenario("sse_stall", after=1, key=fault_key)
    with Raw(own) as raw:  # the request's own hold ends the rule's stall
        raw.send(request(chat_path(own, key=fault_key, hold=0.3), STREAM))
        start = time.monotonic()
        raw.head()
        raw.wait_eof(2)
        assert time.monotonic() - start < 1
    (conn,) = own.journal(fault_key)
    assert conn.requests[0].fault == f"sse_stall;after=1;key={fault_key};hold=0.3"


def test_bad_scenarios_raise_before_anything_is_armed(own: ServerThread) -> None:
    with pytest.raises(FaultSpecError, match="times"):
        own.scenario("status", times=0)
    with pytest.raises(FaultSpecError, match="unknown fault"):
        own.scenario("nope")
    with pytest.raises(FaultSpecError, match="slow_accept"):
        own.scenario("slow_accept", model="gpt-*")
    with pytest.raises(FaultSpecError, match="times"):
        own.scenario("status;key=k;first=1")
    with pytest.raises(FaultSpecError, match="sum"):
        own.set_mix({"status": 0.7, "reset": 0.7})
    assert own.scenarios() == ()
    assert own.mix is None


# -- control API ----------------------------------------------------------------------------


def test_control_api_scenarios_round_trip(own: ServerThread) -> None:
    rules = [
        {"fault": "status;code=503", "times": 2, "match": {"key": "k1"}, "id": "a"},
        {"fault": "status;code=500", "match": {"path": "/v1/models"}},
    ]
    put = control(own, "PUT", "scenarios", {"scenarios": rules})
    assert put.status_code == 200, put.text
    assert put.json()["scenarios"][0]["id"] == "a"
    assert control(own, "PUT", "scenarios", {"scenarios": rules}).json() == put.json()  # idempotent
    assert codes(own.url(key="k1"), 3) == [503, 503, 500]
    listed = control(own, "GET", "scenarios?key=k1").json()["scenarios"]
    assert [(r["id"], r["remaining"], r["used"]) for r in listed] == [("a", 0, 2)]
    # Atomic: one bad rule and nothing changes.
    bad = control(own, "PUT", "scenarios", {"scenarios": [rules[0], {"fault": "nope"}]})
    assert bad.status_code == 400
    assert "scenario 1" in bad.json()["error"]["message"]
    assert len(control(own, "GET", "scenarios").json()["scenarios"]) == 2
    # POST adds, and replaces by id.
    added = control(own, "POST", "scenarios", {"fault": "status;code=418", "id": "a", "times": 1})
    assert [r["fault"] for r in added.json()["scenarios"]] == ["status;code=418", "status;code=500"]
    # PUT with a key replaces that key's rules only, and gives them the key.
    keyed = control(own, "PUT", "scenarios", {"key": "k2", "scenarios": [{"fault": "reset"}]})
    assert keyed.json()["scenarios"][0]["match"] == {"key": "k2"}
    assert len(control(own, "GET", "scenarios").json()["scenarios"]) == 3
    assert control(own, "DELETE", "scenarios?key=k2").json() == {"cleared": 1}
    assert control(own, "DELETE", "scenarios").json() == {"cleared": 2}
    assert control(own, "DELETE", "scenarios").json() == {"cleared": 0}


def test_control_api_arms_a_slow_accept(own: ServerThread) -> None:
    put = control(
        own, "PUT", "scenarios", {"scenarios": [{"fault": "slow_accept;pause=0.3", "times": 1}]}
    )
    assert put.status_code == 200
    start = time.monotonic()
    assert httpx.get(own.url() + "/models").status_code == 200
    assert time.monotonic() - start >= 0.28


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "words"),
    [
        ("GET", "nothing", None, 404, ["unknown control path", "/_fault/scenarios"]),
        ("DELETE", "stats", None, 405, ["GET"]),
        ("PUT", "scenarios", b"{not json", 400, ["not valid JSON"]),
        ("PUT", "scenarios", {"rules": []}, 400, ['{"scenarios": [...]}']),
        ("PUT", "scenarios", {"scenarios": {}}, 400, ["must be a list"]),
        ("PUT", "scenarios", {"scenarios": [{"times": 1}]}, 400, ["needs 'fault'"]),
        ("PUT", "scenarios", {"scenarios": [{"fault": "bogus"}]}, 400, ["unknown fault"]),
        ("PUT", "scenarios", {"scenarios": [{"fault": "reset;when=x"}]}, 400, ["when"]),
        ("PUT", "scenarios", {"scenarios": [{"fault": "reset", "times": 0}]}, 400, ["times"]),
        ("PUT", "scenarios", {"scenarios": [{"fault": "reset", "when": 1}]}, 400, ["when"]),
        ("PUT", "scenarios", {"scenarios": [{"fault": "reset", "match": {"x": 1}}]}, 400, ["x"]),
        (
            "PUT",
            "scenarios",
            {"scenarios": [{"fault": "reset", "match": {"stream": 1}}]},
            400,
            ["stream"],
        ),
        ("PUT", "scenarios", {"key": 5, "scenarios": []}, 400, ["key"]),
        ("PUT", "mix", {"weights": {"reset": 1.5}}, 400, ["probability", "1.5"]),
        ("PUT", "mix", {"weights": {"reset": 0.6, "status": 0.6}}, 400, ["sum"]),
        ("PUT", "mix", {"weights": {"slow_accept": 0.1}}, 400, ["scenario"]),
        ("PUT", "mix", {"weights": {"reset": 0.1}, "seed": "x"}, 400, ["seed"]),
        ("PUT", "mix", {"weights": [1]}, 400, ["weights"]),
        ("PUT", "mix", {"weights": {}, "bogus": 1}, 400, ["bogus"]),
        ("GET", "journal?who=me", None, 400, ["who", "key"]),
        ("GET", "verdict", None, 400, ["key"]),
        ("POST", "reset", {"all": "yes"}, 400, ["all"]),
    ],
)
def test_bad_control_input_gets_a_clear_400(
    srv: ServerThread, method: str, path: str, body: object, status: int, words: list[str]
) -> None:
    content = body if isinstance(body, bytes) else None if body is None else json.dumps(body)
    url = f"{srv.base_url}/_fault/{path}"
    response = httpx.request(method, url, content=content, headers=JSON)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    if status == 400:
        assert error["code"] == "invalid_control"
    for word in words:
        assert word in error["message"], error["message"]


def test_reset_all_disarms(own: ServerThread) -> None:
    own.scenario("status", code=500)
    own.set_mix({"status;code=502": 1.0})
    assert codes(own.url(), 1) == [500]
    assert control(own, "POST", "reset").json()["requests"] == 0
    assert len(own.scenarios()) == 1  # a plain reset keeps what is armed
    assert control(own, "POST", "reset", {"all": True}).status_code == 200
    assert own.scenarios() == ()
    assert control(own, "GET", "mix").json() == {"mix": None}
    assert codes(own.url(), 1) == [200]


# -- the seeded mix -------------------------------------------------------------------------


def test_the_mix_is_reproducible_from_its_seed(own: ServerThread) -> None:
    weights = {"status;code=503": 0.3, "status;code=429": 0.2}

    def run(seed: int, key: str) -> list[int]:
        own.set_mix(weights, seed=seed)
        return codes(own.url(key=key), 40)

    first = run(7, "a")
    assert run(7, "a") == first  # set_mix restarts the draws: the same faults again
    assert run(8, "a") != first
    assert run(7, "b") != first  # the draws are per key...
    own.set_mix(weights, seed=7)
    interleaved_a, interleaved_b = [], []
    with httpx.Client() as client:
        for _ in range(40):  # ...so interleaving keys changes nothing
            interleaved_a.append(client.get(own.url(key="a") + "/models").status_code)
            interleaved_b.append(client.get(own.url(key="b") + "/models").status_code)
    assert interleaved_a == first
    assert interleaved_b == run(7, "b")
    assert {503, 429, 200} <= set(first)
    assert 5 < first.count(200) < 35
    put = control(own, "PUT", "mix", {"weights": weights, "seed": 7})  # the same over HTTP
    assert put.json()["mix"] == {"weights": weights, "seed": 7, "key": None}
    assert codes(own.url(key="a"), 40) == first
    sources = {r.source for c in own.journal("a") for r in c.requests}
    assert sources == {"mix", "path"}  # "path": healthy;key=a, drawn healthy
    assert control(own, "DELETE", "mix").json() == {"mix": None}


def test_the_mix_leaves_named_faults_and_other_keys_alone(own: ServerThread) -> None:
    own.set_mix({"status;code=503": 1.0}, key="only-me")
    assert codes(own.url(key="only-me"), 2) == [503, 503]
    assert codes(own.url(key="someone-else"), 1) == [200]
    assert codes(own.url(), 1) == [200]
    own.set_mix({"status;code=503": 1.0})
    assert codes(own.url("status", code=418), 1) == [418]
    assert codes(own.url(), 1, headers={"X-Fault": "status;code=409"}) == [409]
    assert codes(own.url(), 1) == [503]


# -- journal and verdicts -------------------------------------------------------------------


def leave(raw: Raw, *, reset: bool) -> None:
    """Close the socket: with an RST, or with a FIN after reading what is there (closing
    with unread data makes the kernel send an RST instead)."""
    raw.recv_for(0.05)
    if reset:
        raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    raw.sock.close()


def wait_closed(srv: ServerThread) -> None:
    wait_until_sync(lambda: not srv.stats().connections_open, what="every connection closed")


def test_the_journal_says_what_each_connection_did(own: ServerThread) -> None:
    with httpx.Client() as client:
        client.get(own.url(key="j") + "/models")
    for reset in (False, True):  # the client gives up: FIN, then RST
        raw = Raw(own)
        raw.send(request(chat_path(own, "sse_stall", key="j", hold=5), STREAM))
        raw.head()
        leave(raw, reset=reset)
    with Raw(own) as raw:  # the client waits until the server gives up
        raw.send(request(chat_path(own, "stall_headers", key="j", hold=0.2), CHAT))
        raw.wait_eof(2)
    wait_closed(own)
    conns = own.journal("j")
    assert [(c.closed_by, c.how) for c in conns] == [
        ("client", "fin"),
        ("client", "fin"),
        ("client", "rst"),
        ("server", "hold"),
    ]
    requests = [c.requests[0] for c in conns]
    assert [r.outcome for r in requests] == [
        "complete",
        "client_closed",
        "client_reset",
        "hold_expired",
    ]
    assert [r.status for r in requests] == [200, 200, 200, None]
    assert requests[1].bytes_sent > 0 and requests[3].bytes_sent == 0
    assert all(r.key == "j" and r.ended is not None for r in requests)
    assert requests[3].ended is not None and requests[3].ended - requests[3].started >= 0.19
    served = control(own, "GET", "journal?key=j").json()["connections"]
    assert [c["requests"][0]["outcome"] for c in served] == [r.outcome for r in requests]
    own.reset_stats()
    assert [c.requests for c in own.journal()] in ([], [()])  # a control connection may linger


def test_verdict_gave_up_and_dangling(own: ServerThread) -> None:
    raw = Raw(own)
    raw.send(request(chat_path(own, "half_open", key="v", hold=5), CHAT))
    wait_until_sync(lambda: own.key_stats("v").requests == 1, what="the server saw the request")
    time.sleep(0.25)  # the interval between the two attempts the verdict must report
    leave(raw, reset=False)
    with Raw(own) as raw:
        raw.send(request(chat_path(own, "half_open", key="v", hold=0.2), CHAT))
        raw.wait_eof(2)
    wait_closed(own)
    verdict = own.verdict("v")
    assert (verdict.attempts, verdict.connections) == (2, 2)
    assert (verdict.closed_by_client, verdict.reset_by_client, verdict.dangling) == (1, 0, 1)
    (gave_up,) = verdict.gave_up
    assert 0.2 <= gave_up < 1
    assert verdict.intervals[0] >= 0.25
    served = control(own, "GET", "verdict?key=v").json()
    assert served["dangling"] == 1 and served["attempts"] == 2
    with pytest.raises(ValueError, match="key"):
        own.verdict()


def test_verdict_checks_retry_after(own: ServerThread) -> None:
    """A client that waits as told, and one that does not, grouped by their own headers."""
    with httpx.Client() as client:
        for key, pause in (("patient", 0.35), ("eager", 0.0)):
            headers = {"Idempotency-Key": f"idem-{key}", "x-request-id": f"req-{key}"}
            url = own.url("status", code=429, retry_after="0.3", key=key, first=1) + "/models"
            assert client.get(url, headers=headers).status_code == 429
            time.sleep(pause)
            assert client.get(url, headers=headers).status_code == 200
    patient = own.verdict(idempotency_key="idem-patient")
    assert patient.attempts == 2
    assert patient.retry_after[0].advised == pytest.approx(0.3)
    assert patient.honoured_retry_after is True
    eager = own.verdict(request_id="req-eager")
    assert eager.honoured_retry_after is False
    assert eager.retry_after[0].waited is not None and eager.retry_after[0].waited < 0.3
    assert own.verdict("eager") == eager


def test_verdict_on_the_openai_sdk_retrying(fault_scope: FaultScope) -> None:
    """The SDK under test is not instrumented: the server alone says what it did."""
    fault_scope.fail_first(2, "status", code=429, retry_after_ms=150)
    with openai.OpenAI(base_url=fault_scope.url(), api_key="x", max_retries=2) as client:
        client.models.list()
    verdict: Verdict = fault_scope.verdict()
    assert verdict.attempts == 3
    assert [r.status for r in verdict.requests] == [429, 429, 200]
    assert verdict.honoured_retry_after is True
    assert all(gap >= 0.15 for gap in verdict.intervals)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_the_scope_fixture_in_an_async_test(fault_scope: FaultScope) -> None:
    fault_scope.fail_first(1, "status", code=503)
    async with httpx.AsyncClient() as client:
        first = await client.get(fault_scope.url() + "/models")
        second = await client.get(fault_scope.url() + "/models")
    assert (first.status_code, second.status_code) == (503, 200)
    assert fault_scope.verdict().attempts == 2


def test_docs_list_every_control_route() -> None:
    """docs/fault_control.md has a row for each method of each /_fault/ route."""
    from fault_server._control_api import _ROUTES

    text = (ROOT / "docs" / "fault_control.md").read_text(encoding="utf-8")
    section = text.split("\n## The control API\n", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    for path, methods in _ROUTES.items():
        for method in methods:
            assert any(f"`{method} {path}" in row for row in rows), (method, path)


# -- connection-level faults armed for a key stay with that key's connections -------------


def test_a_scoped_refuse_takes_only_its_own_tests_connection(own: ServerThread) -> None:
    scope = own.scope("test-a")
    scope.scenario("refuse", times=1)
    assert codes(own.url(), 1) == [200]  # another test's connection: untouched.
    assert codes(own.url(key="test-b"), 1) == [200]
    with pytest.raises(httpx.TransportError):
        httpx.get(scope.url() + "/models")
    assert codes(scope.url(), 1) == [200]  # times=1: used.
    (refused,) = [c for c in scope.journal() if c.fault is not None]
    assert refused.fault == "refuse"
    assert refused.requests[0].outcome == "server_reset"


def test_a_scoped_slow_accept_delays_only_its_own_tests_connection(own: ServerThread) -> None:
    scope = own.scope("test-a")
    scope.scenario("slow_accept", pause=1.0, times=1)
    start = time.monotonic()
    assert codes(own.url(), 1) == [200]
    assert time.monotonic() - start < 1.0 - MARGIN  # not the 1 s pause: not its fault.
    start = time.monotonic()
    assert codes(scope.url(), 1) == [200]
    assert time.monotonic() - start >= 1.0


def test_connection_rules_match_a_key_only(own: ServerThread) -> None:
    with pytest.raises(FaultSpecError, match="can match a key only"):
        own.scenario("refuse", path="/v1/*")
    with pytest.raises(FaultSpecError, match="before any request can carry a key"):
        own.scenario("tls_stall", key="k")


@pytest.mark.slow
def test_ten_thousand_armed_rules_cost_a_healthy_request_little(own: ServerThread) -> None:
    """Requests alternate between a bare server and one with 10,000 rules armed by other
    keys, so that the load of a busy machine weighs on both medians alike."""
    for i in range(10_000):
        own.scenario("status", code=503, key=f"other-{i}", rule_id=f"r{i}")
    with fault_server.running(port=0, max_hold=5.0) as bare, httpx.Client() as client:
        times: dict[str, list[float]] = {"bare": [], "armed": []}
        pair = [("bare", bare), ("armed", own)]
        for _ in range(300):
            pair.reverse()  # neither goes first every time.
            for name, server in pair:
                start = time.monotonic()
                assert client.get(server.url(key="mine") + "/models").status_code == 200
                times[name].append(time.monotonic() - start)
    bare_median, armed_median = (sorted(t)[len(t) // 2] for t in times.values())
    more = armed_median - bare_median
    assert more < 0.001, f"{more * 1000:.2f} ms more per request"
