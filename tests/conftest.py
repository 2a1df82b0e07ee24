"""Shared test helpers.

The `fault_server` fixture (one server per session, in its own thread) and `fault_key`
come from our pytest plugin, `fault_server.pytest_plugin`, registered as an entry point.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

import stallproof

# How far past its bound a call may end. The bounds are anyio deadlines, so on an idle
# machine calls end within a few ms; the margin absorbs a noisy 2-core CI box.
MARGIN = float(os.environ.get("STALLPROOF_TEST_MARGIN", "0.1"))
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


def pool_state(client: stallproof.Client) -> dict[str, int]:
    """Active/idle connections and queued requests in the client's connection pool."""
    pool: Any = client._engine.pool
    if hasattr(pool, "_client"):  # a caller's httpx client: look at its httpcore pool
        pool = pool._client._transport._pool
    conns = list(pool.connections)
    return {
        "requests": len(pool._requests),
        "active": sum(1 for c in conns if not c.is_idle() and not c.is_closed()),
        "idle": sum(1 for c in conns if c.is_idle()),
    }


def assert_pool_clean(client: stallproof.Client) -> None:
    """No request holds a slot and no connection is checked out."""
    state = pool_state(client)
    assert state["requests"] == 0, state
    assert state["active"] == 0, state


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
    pool = client._client._transport.engine.pool
    return {
        "requests": len(pool._requests),
        "active": sum(1 for c in pool.connections if not c.is_idle() and not c.is_closed()),
    }


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
