"""Control queries at the documented bounds never freeze serving.

The journal is filled to its 100,000 requests (half of them under one key) and the counts
to 100,000 keys directly through the server's state (a real client would need minutes to
make that many requests); then a healthy client keeps asking while the heaviest control
queries run, and none of its requests may wait more than `STALL_BOUND` longer than the
slowest of them waited over a quiet second just before or just after (what the machine's
own load costs: a busy runner delays any request, and its spikes come when they come; the
freeze this guards against cost 2-5 s).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

import fault_server
from fault_server import ServerThread
from fault_server._bounded import MAX_KEYS, SeenKeys

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_server_errors")]

BIG_KEY = "big"
# How much longer than the machine's own spikes a healthy request may wait while a control
# query runs. Issue 23's bound was 0.1 s, which held with four suite workers and two busy
# loops on 2 cores; with eight suite workers each process gets a fifth of a core, and
# the query's thread and the serving loop share the GIL: 0.12-0.2 s was seen. Still far
# from the 2-5 s freeze this guards against.
STALL_BOUND = 0.25


@pytest.fixture(scope="module")
def full() -> Iterator[ServerThread]:
    """A server whose journal and counts hold what the documentation says they can."""
    with fault_server.running(port=0, max_hold=5.0) as srv:
        state = srv.server._state  # filled in place: 100,000 real requests take minutes.
        limits = state.journal.limits
        per_conn = limits.requests // 1000
        for c in range(1000):
            conn = state.journal.open(f"127.0.0.1:{10000 + c}")
            for i in range(per_conn):
                log = conn.request("POST", "/v1/chat/completions")
                log.key = BIG_KEY if i % 2 == 0 else f"k{c}-{i}"
                log.status = 200
                conn.end_request(log, "complete")
            conn.close("client", "fin")
        seen = SeenKeys()
        for k in range(MAX_KEYS):
            state.counters.key_request(f"key-{k}", seen)
        yield srv


class Prober(threading.Thread):
    """Healthy keep-alive requests, one after another, until stopped; the slowest kept."""

    def __init__(self, srv: ServerThread) -> None:
        super().__init__(daemon=True)
        self._address = (srv.server._bound()[0], srv.port)
        self._done = threading.Event()
        self.slowest = 0.0
        self.count = 0

    def run(self) -> None:
        request = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
        with socket.create_connection(self._address, timeout=10) as sock:
            while not self._done.is_set():
                start = time.monotonic()
                sock.sendall(request)
                data = b""
                while b"\r\n\r\n" not in data or not data.endswith(b"}"):
                    chunk = sock.recv(65536)
                    assert chunk, "the server closed the prober's connection"
                    data += chunk
                self.slowest = max(self.slowest, time.monotonic() - start)
                self.count += 1
                # A request every 10 ms or so: one starts within 10 ms of the serving loop
                # being blocked and waits it out (a 0.3 s block showed as 0.29 s in 10 of
                # 10 tries, as with 2 ms), at a fifth of the requests' CPU.
                time.sleep(0.01)

    def warm(self) -> None:
        """Wait (at most 5 s) until the prober has made 20 requests; then start timing."""
        deadline = time.monotonic() + 5
        while self.count < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.count >= 20, "the prober did not get going"
        self.slowest = 0.0

    def baseline(self, seconds: float = 1.0) -> float:
        """The slowest healthy request over ``seconds`` with no control query running: what
        the machine's own load costs a request; then start timing afresh."""
        self.slowest = 0.0
        time.sleep(seconds)
        quiet, self.slowest = self.slowest, 0.0
        return quiet

    def stop(self) -> None:
        self._done.set()
        self.join(10)


@pytest.mark.parametrize(
    "query",
    [
        f"verdict?key={BIG_KEY}",
        "stats",
        "journal?limit=5000",
        f"journal?key={BIG_KEY}&limit=5000",
        "scenarios",
    ],
)
def test_a_control_query_never_stalls_a_healthy_request(full: ServerThread, query: str) -> None:
    prober = Prober(full)
    prober.start()
    try:
        prober.warm()
        before = prober.baseline()
        with httpx.Client(timeout=30) as client:
            for _ in range(2):
                response = client.get(f"{full.base_url}/_fault/{query}")
                assert response.status_code == 200, response.text
        during = prober.slowest
        quiet = max(before, prober.baseline())  # the machine's own spikes, either side
    finally:
        prober.stop()
    if query.startswith("verdict"):
        assert response.json()["attempts"] > 49_000  # the prober's own requests push some out.
    if query == "stats":
        assert len(response.json()["keys"]) == MAX_KEYS
    assert during < quiet + STALL_BOUND, (
        f"a healthy request waited {during:.3f} s ({quiet:.3f} s with no query)"
    )


def test_forgetting_a_big_key_never_stalls_a_healthy_request() -> None:
    with fault_server.running(port=0, max_hold=5.0) as srv:
        state = srv.server._state
        conn = state.journal.open("127.0.0.1:1")
        for _ in range(50_000):
            conn.request("GET", "/v1/models").key = BIG_KEY
        prober = Prober(srv)
        prober.start()
        try:
            prober.warm()
            before = prober.baseline()
            response = httpx.post(
                f"{srv.base_url}/_fault/forget",
                json={"key": BIG_KEY},
                timeout=30,
            )
            during = prober.slowest
            quiet = max(before, prober.baseline())  # the machine's own spikes, either side
        finally:
            prober.stop()
        assert response.json()["forgot"]["requests"] == 50_000
        assert during < quiet + STALL_BOUND, (
            f"a healthy request waited {during:.3f} s ({quiet:.3f} s with no query)"
        )
