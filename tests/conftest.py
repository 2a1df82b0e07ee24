"""Shared test helpers.

The `fault_server` fixture (one server per session, in its own thread) and `fault_key`
come from our pytest plugin, `fault_server.pytest_plugin`, registered as an entry point.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import httpx
import pytest

import stallproof
from stallproof._pool import WireStats

from .rawserver import Answer, RawRequest, RawServer

# `pytester`: tests of our pytest plugin run a session of their own.
pytest_plugins = ["pytester"]

# How far past its bound a call may end, measured from the moment the bound started. The
# bounds are anyio deadlines, so on an idle machine calls end within a few ms; the margin is
# what a 2-core runner whose cores are both busy with other work honours (scripts/
# stress_tests.py: the suite under two busy loops saw up to ~0.15 s of scheduling delay).
MARGIN = float(os.environ.get("STALLPROOF_TEST_MARGIN", "0.3"))
# A fake API key; tests assert it never shows up in reprs, errors, logs or spans.
KEY = "sk-test-SECRET-0123456789"


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@contextmanager
def stopwatch() -> Iterator[list[float]]:
    """`with stopwatch() as t: ...` then `t[0]` is the elapsed wall time in seconds."""
    box = [0.0]
    start = time.monotonic()
    try:
        yield box
    finally:
        box[0] = time.monotonic() - start


async def wait_until(
    condition: Callable[[], bool], *, timeout: float = 5.0, what: str = "the condition"
) -> None:
    """Poll ``condition`` every 10 ms until it holds; fail the test after ``timeout`` s.

    For state that another thread (the fault server) or task changes: waiting for it with
    a fixed sleep is either too short on a busy machine or wasted time on an idle one.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not hold within {timeout}s")
        await anyio.sleep(0.01)


def wait_until_sync(
    condition: Callable[[], bool], *, timeout: float = 5.0, what: str = "the condition"
) -> None:
    """`wait_until` for sync tests."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not hold within {timeout}s")
        time.sleep(0.01)


async def warm(client: stallproof.Client) -> None:
    """One healthy call, so the pool holds an open connection to the server.

    The next call then sends its request at once: a bound that starts when the request is
    sent (first_token, read) starts when the test's stopwatch does, not after a connect
    and the client's first-call set-up, which a busy machine can stretch past MARGIN.
    """
    await complete(client, stream=False)
    assert pool_state(client).connections >= 1


def pool_state(client: stallproof.Client) -> WireStats:
    """The client's connection pool: connections, idle, in use, waiting (`WireStats`)."""
    return client._engine.pool.stats()


def assert_pool_clean(client: stallproof.Client) -> None:
    """No call holds a connection or waits for one."""
    state = pool_state(client)
    assert state.nothing_held, state


async def complete(client: stallproof.Client, *, stream: bool, **kwargs: Any) -> None:
    """One call as a caller makes it: for a stream, read every chunk."""
    kwargs.setdefault("model", "m")
    kwargs.setdefault("messages", [{"role": "user", "content": "hello there"}])
    if stream:
        s = await client.chat.completions.create(stream=True, **kwargs)
        async for _ in s:
            pass
    else:
        await client.chat.completions.create(**kwargs)


async def hold_the_only_connection(
    make_client: Any, fault_server: Any
) -> tuple[stallproof.Client, stallproof.AsyncStream]:
    """A one-connection client whose connection is held by a stream stalled mid-way."""
    client: stallproof.Client = make_client(
        fault_server.url("sse_stall", after=1, hold=20),
        limits=stallproof.Limits(max_connections=1, max_keepalive_connections=1),
    )
    holder = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hello there"}], stream=True
    )
    await holder.__anext__()
    return client, holder


def sdk_pool_held(client: Any) -> dict[str, int]:
    """Queued requests and checked-out connections in the pool under an SDK client."""
    stats = client._client._transport.engine.pool.stats()
    return {"requests": stats.waiting, "active": stats.in_use}


class SentClock:
    """Seconds since the SDK handed its request to the http client: the bounds start there,
    after the SDK's own preparation (its first call looks up the platform in a thread)."""

    def __init__(self, sdk_client: Any) -> None:
        self.sent: float | None = None
        sdk_client._client.event_hooks = {"request": [self._mark], "response": []}

    async def _mark(self, request: Any) -> None:
        self.sent = time.monotonic()

    def elapsed(self) -> float:
        assert self.sent is not None, "no request was sent"
        return time.monotonic() - self.sent


class Sent:
    """What a client sent, request by request: seen through an httpx event hook."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []
        self.bodies: list[bytes] = []
        self.urls: list[httpx.URL] = []

    async def hook(self, request: httpx.Request) -> None:
        self.urls.append(request.url)
        self.headers.append(dict(request.headers))
        self.bodies.append(request.content)


def spying_client(make_client: Any, base_url: str, **kwargs: Any) -> tuple[Any, Sent]:
    """A client that sends through an ``http_client`` whose event hook records each request
    (the public seam for seeing what goes on the wire)."""
    sent = Sent()
    http = httpx.AsyncClient(event_hooks={"request": [sent.hook]})
    with warnings.catch_warnings():
        # The one-time warning about httpcore's pool is for users, not for this test.
        warnings.simplefilter("ignore", RuntimeWarning)
        client = make_client(base_url, http_client=http, **kwargs)
    return client, sent


@pytest.fixture
async def make_client() -> AsyncIterator[Any]:
    """Factory of clients that are closed, and checked for leaks, at the end of the test.

    Clients make one attempt per call unless the test passes ``retry=``, so a bound test
    sees exactly the bound it set up; retries have their own tests.
    """
    clients: list[stallproof.Client] = []

    def factory(base_url: str, **kwargs: Any) -> stallproof.Client:
        kwargs.setdefault("api_key", KEY)
        kwargs.setdefault("retry", None)
        client = stallproof.Client(base_url=base_url, **kwargs)
        clients.append(client)
        return client

    yield factory
    for client in clients:
        assert_pool_clean(client)
        await client.aclose()
        if client._engine.pool is not None and hasattr(client._engine.pool, "_client"):
            await client._engine.pool._client.aclose()  # the http_client the test made


@pytest.fixture
def raw_server() -> Iterator[Any]:
    """Factory of `RawServer`s (see tests/rawserver.py), stopped at the end of the test."""
    servers: list[RawServer] = []

    def factory(answer: Any, **kwargs: Any) -> RawServer:
        server = RawServer(answer, **kwargs)
        servers.append(server)
        return server

    yield factory
    for server in servers:
        server.close()


def always(answer: Answer) -> Any:
    """A `RawServer` answer that ignores the request."""

    def respond(request: RawRequest) -> Answer:
        return answer

    return respond


# -- Redis, for fleet state (RedisState) ---------------------------------------------------

REDIS_BINARY = shutil.which("redis-server") or next(
    (p for p in ("/usr/bin/redis-server", "/usr/sbin/redis-server") if os.path.exists(p)), None
)


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A real redis-server subprocess on a loopback port, without persistence.

    `kill` stops it the hard way (SIGKILL: what a crash looks like to clients); `start`
    brings it back on the same port, empty; `pause`/`resume` stall it and let it go on.
    Every wait is bounded.
    """

    def __init__(self, binary: str, port: int | None = None) -> None:
        self.binary = binary
        self.port = port or free_port()
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        self._proc = subprocess.Popen(
            [
                self.binary,
                *("--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no", "--protected-mode", "no"),
                *("--loglevel", "warning"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        limit = time.monotonic() + timeout
        while time.monotonic() < limit:
            if self._proc.poll() is not None:
                raise RuntimeError(f"redis-server exited at start ({self._proc.returncode})")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s,
            ):
                s.sendall(b"PING\r\n")
                if s.recv(64).startswith(b"+PONG"):
                    return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer PING within {timeout}s")

    def pause(self) -> None:
        """SIGSTOP: connections stay open and nothing answers (a stalled Redis)."""
        if self._proc is not None:
            self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc is not None:
            self._proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(timeout=10)
            self._proc = None

    def stop(self) -> None:
        if self._proc is not None:
            self.resume()  # a paused process does not act on SIGTERM
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=5)
            self._proc = None


def _started_redis(port: int | None = None) -> RedisServer:
    if REDIS_BINARY is None:
        pytest.skip(
            "redis-server is not installed (apt-get install redis-server): the fleet tests"
            " need a real Redis"
        )
    server = RedisServer(REDIS_BINARY, port)
    try:
        server.start()
    except (OSError, RuntimeError) as e:
        pytest.skip(f"redis-server could not be started: {e}")
    return server


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for the session (tests keep apart by `redis_prefix`)."""
    server = _started_redis()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test alone, for tests that kill and restart it."""
    server = _started_redis()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_prefix(fault_key: str) -> str:
    """A key prefix unique to the test: its fleet state is its own."""
    return f"test-{fault_key}"


@contextmanager
def silent_listener() -> Iterator[str]:
    """``redis://`` URL of a socket that accepts connections (the kernel does) and never
    reads or answers: a stalled Redis, as a client sees one."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield f"redis://127.0.0.1:{s.getsockname()[1]}/0"


class FleetWorkers:
    """Worker processes (tests/fleet_worker.py) that make calls through shared state.

    Each gets a JSON job, prints ``ready`` once it has imported everything and built its
    client, makes its calls when told ``go`` (so phases do not depend on how long imports
    take on a busy machine), and prints one JSON line per finished call: its error class
    name (or null) and its elapsed seconds. Every wait is bounded.
    """

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen[str]] = []

    def start(self, *jobs: dict[str, Any], timeout: float = 60.0) -> list[subprocess.Popen[str]]:
        """Start one worker per job and wait until every one is ready."""
        script = os.path.join(os.path.dirname(__file__), "fleet_worker.py")
        procs = [
            subprocess.Popen(
                [sys.executable, script, json.dumps(job)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for job in jobs
        ]
        self._procs += procs
        limit = time.monotonic() + timeout
        for proc in procs:
            assert proc.stdout is not None
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, limit - time.monotonic()))
            line = proc.stdout.readline() if ready else ""
            if line.strip() != "ready":
                raise AssertionError(f"worker not ready within {timeout}s: {line!r}")
        return procs

    @staticmethod
    def go(*procs: subprocess.Popen[str]) -> None:
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()

    def run(self, jobs: list[dict[str, Any]], *, timeout: float = 30.0) -> list[list[Any]]:
        """Start one worker per job, let them all go at once; each worker's results."""
        procs = self.start(*jobs)
        self.go(*procs)
        return [self.results(p, timeout=timeout) for p in procs]

    def results(self, proc: subprocess.Popen[str], *, timeout: float) -> list[Any]:
        out, err = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            raise AssertionError(f"worker failed ({proc.returncode}): {err[-2000:]}")
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def kill_all(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=10)


@pytest.fixture
def fleet_workers() -> Iterator[FleetWorkers]:
    workers = FleetWorkers()
    try:
        yield workers
    finally:
        workers.kill_all()
