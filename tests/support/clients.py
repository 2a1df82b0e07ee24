"""Clients as tests drive them: one call as a caller makes it, the pool checked for leaks."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any, Protocol

import httpx
import httpx2
import openai

import stallproof
from stallproof._wire._pool import PoolStats


class MakeClient(Protocol):
    """The ``make_client`` fixture (tests/conftest.py): a `stallproof.Client` for
    ``base_url``, closed and checked for leaks when the test ends."""

    def __call__(self, base_url: str, **kwargs: Any) -> stallproof.Client: ...


# A fake API key; tests assert it never shows up in reprs, errors, logs or spans.
KEY = "sk-test-SECRET-0123456789"


def chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and every exception reachable through __cause__ and __context__ (a
    suppressed context included)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__]


# The installed openai's major: 3 runs on httpx2, 1 and 2 on plain httpx (`make test` runs
# on openai 3, `make test-openai2` on openai 2). Read from its version, not from stallproof.
OPENAI_MAJOR = int(openai.__version__.split(".")[0])
OPENAI_HTTP = httpx2 if OPENAI_MAJOR >= 3 else httpx


async def warm(client: stallproof.Client) -> None:
    """One healthy call, so the pool holds an open connection to the server.

    The next call then sends its request at once: a bound that starts when the request is
    sent (first_token, read) starts when the test's stopwatch does, not after a connect
    and the client's first-call set-up, which a busy machine can stretch past MARGIN.
    """
    await complete(client, stream=False)
    assert pool_state(client).connections >= 1


def pool_state(client: stallproof.Client) -> PoolStats:
    """The client's connection pool: connections, idle, in use, waiting (`PoolStats`)."""
    return client._engine.pool.stats()


def pacer_state(client: stallproof.Client) -> stallproof.PacerState:
    """The client's pacer: permits in use, queued, its limit, where its state is shared."""
    state = client.pacer_state()
    assert state is not None, "the client was built without a pacer"
    return state


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
    make_client: MakeClient, fault_server: Any
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


def spying_client(
    make_client: MakeClient, base_url: str, **kwargs: Any
) -> tuple[stallproof.Client, Sent]:
    """A client that sends through an ``http_client`` whose event hook records each request
    (the public seam for seeing what goes on the wire)."""
    sent = Sent()
    http = httpx.AsyncClient(event_hooks={"request": [sent.hook]})
    with warnings.catch_warnings():
        # The one-time warning about httpcore's pool is for users, not for this test.
        warnings.simplefilter("ignore", RuntimeWarning)
        client = make_client(base_url, http_client=http, **kwargs)
    return client, sent
