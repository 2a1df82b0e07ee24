"""`GET /metrics`: Prometheus gauges of the requests in flight, by fault and phase, and
under the names vLLM and SGLang use for running and waiting requests."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator

import httpx
import pytest

import fault_server
from fault_server import ServerThread

from ..support.timing import wait_until_sync
from ..support.wire import CHAT, STREAM, address, chat_path, request

pytestmark = pytest.mark.usefixtures("no_server_errors")


def scrape(srv: ServerThread) -> dict[str, float]:
    """Each sample of the exposition, by its name and labels as written."""
    response = httpx.get(srv.base_url + "/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples: dict[str, float] = {}
    for line in response.text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


@contextlib.contextmanager
def held(srv: ServerThread, data: bytes) -> Iterator[socket.socket]:
    """A connection that sent ``data`` and is held open by its fault."""
    sock = socket.create_connection(address(srv.base_url), timeout=5)
    try:
        sock.sendall(data)
        yield sock
    finally:
        sock.close()


def test_an_idle_server_exposes_every_family_at_zero(own: ServerThread) -> None:
    samples = scrape(own)
    model = '{model_name="fault-model"}'
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
    ):
        assert samples[name + model] == 0
    assert samples["fault_server_connections_open"] == 1  # the scrape's own.
    assert not [k for k in samples if k.startswith("fault_server_requests_in_flight")]


def test_requests_count_by_phase_and_only_answered_ones_run(own: ServerThread) -> None:
    own.scenario("slow_accept", pause=4.0, times=1)
    with contextlib.ExitStack() as stack:
        stack.enter_context(held(own, b""))  # slow_accept: held before any byte is read.
        # Running: being answered, however slowly.
        for fault, params in [
            ("slow_first_token", {"wait": 4}),
            ("trickle_body", {"interval": 1}),
            ("sse_stall", {"after": 1}),
        ]:
            stack.enter_context(held(own, request(chat_path(own, fault, **params), STREAM)))
        # Waiting: read whole, held before the answer starts.
        stack.enter_context(held(own, request(chat_path(own, "stall_headers"), CHAT)))
        stack.enter_context(held(own, request(chat_path(own, delay=4), CHAT)))
        # Reading: never read whole, never reaching "the engine".
        stack.enter_context(held(own, request(chat_path(own, "half_open"), CHAT)))
        head = request(chat_path(own), CHAT).split(b"\r\n\r\n")[0] + b"\r\n\r\n"
        stack.enter_context(held(own, head))  # a body that never comes.

        def settled() -> bool:
            s = scrape(own)
            return (
                s.get('vllm:num_requests_running{model_name="fault-model"}') == 3
                and s.get('vllm:num_requests_waiting{model_name="fault-model"}') == 2
                and s.get('fault_server_connections_held{fault="slow_accept"}') == 1
                and s.get('fault_server_requests_in_flight{fault="half_open",phase="reading"}') == 1
            )

        wait_until_sync(settled, what="the gauges")
        samples = scrape(own)
    in_flight = {k: v for k, v in samples.items() if k.startswith("fault_server_requests_in")}
    assert in_flight == {
        'fault_server_requests_in_flight{fault="half_open",phase="reading"}': 1,
        'fault_server_requests_in_flight{fault="healthy",phase="reading"}': 1,
        'fault_server_requests_in_flight{fault="healthy",phase="waiting"}': 1,
        'fault_server_requests_in_flight{fault="stall_headers",phase="waiting"}': 1,
        'fault_server_requests_in_flight{fault="slow_first_token",phase="running"}': 1,
        'fault_server_requests_in_flight{fault="trickle_body",phase="running"}': 1,
        'fault_server_requests_in_flight{fault="sse_stall",phase="running"}': 1,
    }
    assert samples['sglang:num_running_reqs{model_name="fault-model"}'] == 3
    assert samples['sglang:num_queue_reqs{model_name="fault-model"}'] == 2
    # Once the clients are gone, nothing is left in flight.
    wait_until_sync(
        lambda: (
            scrape(own)['vllm:num_requests_running{model_name="fault-model"}'] == 0
            and scrape(own)['vllm:num_requests_waiting{model_name="fault-model"}'] == 0
        ),
        what="the gauges back at zero",
    )


def test_metrics_take_no_query_and_follow_the_control_token() -> None:
    with fault_server.running(port=0, control_token="s3cret") as srv:
        assert httpx.get(srv.base_url + "/metrics").status_code == 401
        authorised = httpx.get(
            srv.base_url + "/metrics", headers={"Authorization": "Bearer s3cret"}
        )
        assert authorised.status_code == 200
        bad = httpx.get(srv.base_url + "/metrics?x=1", headers={"X-Fault-Token": "s3cret"})
        assert bad.status_code == 400
        assert "unknown query parameter" in json.loads(bad.text)["error"]["message"]


def test_a_stalled_tls_handshake_is_a_held_connection() -> None:
    with fault_server.running(port=0, tls=True, max_hold=5.0) as srv:
        srv.scenario("tls_stall", times=1)
        tls_port = int(srv.tls_url().rsplit(":", 1)[1].split("/")[0])
        with socket.create_connection(("127.0.0.1", tls_port), timeout=5):
            wait_until_sync(
                lambda: scrape(srv).get('fault_server_connections_held{fault="tls_stall"}') == 1,
                what="the stalled handshake counted",
            )
            assert scrape(srv)['vllm:num_requests_running{model_name="fault-model"}'] == 0
