"""The control API answers test code, never a web page (`fault_server._control_guard`).

Every request goes over a real loopback socket with the headers a browser would send, and
the test checks both the status and that nothing was armed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from fault_server import FaultServer, ServerThread, running
from fault_server._control_guard import ControlGuard

from ..support.wire import http_request, raw_exchange

TOKEN = "tok-SECRET-0123456789"
RULE = json.dumps({"fault": "status;code=418", "id": "guarded"}).encode()


@pytest.fixture
def srv() -> Iterator[ServerThread]:
    with running(max_hold=5) as server:
        yield server


@pytest.fixture
def tokened() -> Iterator[ServerThread]:
    with running(max_hold=5, control_token=TOKEN) as server:
        yield server


def post_rule(srv: ServerThread, headers: dict[str, str], method: str = "POST") -> int | None:
    return raw_exchange(
        srv.base_url, http_request(method, "/_fault/scenarios", RULE, headers)
    ).status


def armed(srv: ServerThread) -> bool:
    return any(rule.id == "guarded" for rule in srv.scenarios())


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        # the classic: a page's fetch() with a "simple" content type, no preflight.
        ({"Content-Type": "text/plain", "Origin": "http://evil.example"}, 403),
        ({"Content-Type": "application/json", "Origin": "http://evil.example"}, 403),
        ({"Content-Type": "application/json", "Origin": "null"}, 403),
        ({"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, 403),
        ({"Content-Type": "application/json", "Sec-Fetch-Site": "same-site"}, 403),
        # DNS rebinding: same-origin for the browser, but the Host is the page's name.
        ({"Content-Type": "application/json", "Host": "evil.example:80"}, 403),
        ({"Content-Type": "text/plain"}, 415),
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415),
        ({"Content-Type": "multipart/form-data; boundary=x"}, 415),
        ({}, 415),
    ],
)
def test_a_cross_site_or_non_json_write_is_refused_and_arms_nothing(
    srv: ServerThread, headers: dict[str, str], status: int
) -> None:
    assert post_rule(srv, headers) == status
    assert not armed(srv)
    answer = raw_exchange(srv.base_url, http_request("POST", "/_fault/reset", b"", headers))
    assert answer.status == status, answer


def test_a_same_origin_json_write_is_applied(srv: ServerThread) -> None:
    origin = srv.base_url  # http://127.0.0.1:PORT: the server's own origin
    host = origin.removeprefix("http://")
    headers = {"Content-Type": "application/json; charset=utf-8", "Origin": origin, "Host": host}
    assert post_rule(srv, {**headers, "Sec-Fetch-Site": "same-origin"}) == 200
    assert armed(srv)


@pytest.mark.parametrize("host", ["localhost:1234", "127.0.0.1", "[::1]:80", "app.localhost"])
def test_local_hosts_may_write(srv: ServerThread, host: str) -> None:
    assert post_rule(srv, {"Content-Type": "application/json", "Host": host}) == 200


def test_reads_and_bodyless_deletes_need_no_content_type(srv: ServerThread) -> None:
    # A read is answered for any Host; a DELETE is a write, so its Host must be local.
    for method, path, host in [
        ("GET", "/_fault/stats", "name:1"),
        ("DELETE", "/_fault/scenarios", "127.0.0.1:1"),
    ]:
        answer = raw_exchange(srv.base_url, http_request(method, path, b"", {"Host": host}))
        assert answer.status == 200, answer


def test_a_token_is_required_when_set(tokened: ServerThread) -> None:
    json_type = {"Content-Type": "application/json"}
    assert post_rule(tokened, json_type) == 401
    assert post_rule(tokened, {**json_type, "X-Fault-Token": "wrong"}) == 401
    get = raw_exchange(tokened.base_url, http_request("GET", "/_fault/stats"))
    assert get.status == 401, get
    assert TOKEN not in get.raw.decode()
    assert not armed(tokened)
    assert post_rule(tokened, {**json_type, "Authorization": f"Bearer {TOKEN}"}) == 200
    # the token admits a Host that is a name (a container's service name)...
    assert post_rule(tokened, {**json_type, "X-Fault-Token": TOKEN, "Host": "faults:8000"}) == 200
    # ...but never a cross-site page, nor a write that is not JSON.
    origin = {"Origin": "http://evil.example", "X-Fault-Token": TOKEN}
    assert post_rule(tokened, {**json_type, **origin}) == 403
    assert post_rule(tokened, {"Content-Type": "text/plain", "X-Fault-Token": TOKEN}) == 415
    # the OpenAI routes need no token: this one meets the rule the token armed.
    models = raw_exchange(tokened.base_url, http_request("GET", "/v1/models"))
    assert models.status == 418, models


def test_the_token_never_shows_in_a_repr() -> None:
    assert TOKEN not in repr(ControlGuard(TOKEN))


@pytest.mark.parametrize("token", ["", " padded ", "tab\there", "é", 7])
def test_a_bad_token_is_refused_at_construction(token: object) -> None:
    with pytest.raises(ValueError, match="control_token"):
        FaultServer(control_token=token)  # type: ignore[arg-type]


@pytest.mark.parametrize("path", ["/_fault/scenarios", "/_fault/mix", "/_fault/fixtures"])
def test_a_rebound_page_cannot_delete_what_is_armed(srv: ServerThread, path: str) -> None:
    srv.scenario("status", code=418, rule_id="guarded")
    srv.set_mix({"status;code=503": 0.5})
    srv.fixture(contains="x", reply="kept")
    request = http_request("DELETE", path, b"", {"Host": "rebound.example:8000"})
    assert raw_exchange(srv.base_url, request).status == 403
    assert armed(srv)
    assert srv.mix is not None
    assert len(srv.fixtures()) == 1
    from_test = http_request("DELETE", path, b"", {"Host": "127.0.0.1"})  # a test's own.
    assert raw_exchange(srv.base_url, from_test).status == 200


def test_beyond_loopback_without_a_token_it_refuses_to_start() -> None:
    with pytest.raises(ValueError, match="not loopback, without a control token"):
        FaultServer(host="0.0.0.0")
    FaultServer(host="0.0.0.0", control_token=TOKEN)  # a token: fine.
    FaultServer(host="0.0.0.0", insecure_open_control=True)  # said out loud: fine.
    FaultServer(host="localhost")
    FaultServer(host="::1")
