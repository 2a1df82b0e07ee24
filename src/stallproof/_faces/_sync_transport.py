"""The engine as a sync httpx transport and a sync httpx2 transport: `Transport`,
`Transport2`, `sync_http_client()`, `sync_http_client2()`.

Sync code gets the same engine, bounds and errors as async code::

    client = openai.OpenAI(http_client=stallproof.sync_http_client2(timeout=30), max_retries=0)
    raw = httpx.Client(transport=stallproof.Transport(timeout=30))

Each request is handed to the process's engine loop (`stallproof._faces._engine_loop`),
where the engine sends it, exactly as for `AsyncTransport`: the request and response
translation, the errors flavoured as the library's, are the async adapters' own
(`stallproof._faces._transport`). The calling thread waits for the answer; when a bound
fires, the call ends on the loop, its socket is closed, and the thread gets the error at
once. A streamed body is read through the loop one chunk at a time, each read bounded as
in async code (``first_token``, ``idle``, ``total``; time the caller spends between two
reads does not count towards ``idle``). Closing the response releases the connection at
once; a body dropped unclosed is released when it is garbage-collected, on the loop.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import httpx2

from .. import _exceptions as exc
from .._body import ResponseBody
from .._breaker import CircuitState
from .._config import Timeouts, TimeoutTypes
from .._deadline import current_deadline
from .._engine import Engine, Incoming, Outgoing
from .._inflight import InflightCall
from .._pacer import PacerState
from ._engine_loop import EngineLoop, home_of
from ._transport import (
    _HTTPX,
    _HTTPX2,
    _EngineFace,
    _Library,
    engine_client,
    exchange,
    flavoured,
    library_response,
    outgoing,
    stream_class,
)

__all__ = ["Transport", "Transport2", "sync_http_client", "sync_http_client2"]

# How far past a call's own deadline its waiting thread waits for the engine loop. The
# engine's bounds end the call on time; this is the second line, if the loop were held up.
GRACE = 1.0
# Closing is local work (a socket close): how long a thread waits for the loop to do it.
_CLOSE_LIMIT = 5.0


def send_limit(engine: Engine, out: Outgoing) -> float:
    """How long a sync caller waits for ``out``'s answer: its total (clipped by any
    `deadline()` around it) plus `GRACE`."""
    timeouts = out.options.timeouts if out.options.timeouts is not None else engine.timeout
    left = timeouts.total
    enclosing = current_deadline()
    if enclosing is not None:
        left = min(left, enclosing.when_on(time.monotonic) - time.monotonic())
    return max(left, 0.0) + GRACE


async def _release(incoming: Incoming) -> None:
    await incoming.body.aclose()


class _SyncEngineFace(_EngineFace):
    """What both sync adapters share: the call handed to the engine loop, and the views
    read there (the engine's state belongs to its loop)."""

    def _home(self) -> EngineLoop:
        return home_of(self.engine)

    def inflight(self, *, stalled_after: float = 5.0) -> tuple[InflightCall, ...]:
        """Every call through this transport in progress right now (see `Client.inflight`)."""
        return self._home().run_sync(lambda: self.engine.inflight(stalled_after=stalled_after))

    def pacer_state(self) -> PacerState | None:
        return self._home().run_sync(self.engine.pacer_state)

    def circuits(self) -> dict[str, CircuitState]:
        return self._home().run_sync(self.engine.circuits)

    def _handle_sync(self, request: Any) -> Any:
        lib = self._lib
        out = outgoing(request, request.read())
        loop = self._home()
        try:
            incoming = loop.call(
                exchange, self.engine, out, limit=send_limit(self.engine, out), orphan=_release
            )
        except exc.StallproofError as e:
            raise flavoured(e, lib, request) from e.__cause__
        stream = None
        if incoming.body.is_stream:
            stream = _sync_stream_class(lib)(loop, incoming, request)
        return library_response(lib, incoming, request, stream)

    def close(self) -> None:
        """Close the engine's connections (bounded). In a child process, an engine the
        parent used is left alone: its connections are the parent's."""
        try:
            home = self._home()
        except exc.InvalidRequestError:
            return
        home.call(self.engine.aclose, limit=_CLOSE_LIMIT + GRACE)


class _SyncStreamBase:
    """A live body read from sync code: each chunk pulled through the engine loop, under
    the body's own bounds; errors flavoured as the library's (by the async stream)."""

    _lib: _Library

    def __init__(self, loop: EngineLoop, incoming: Incoming, request: Any) -> None:
        self._loop = loop
        self._body: ResponseBody = incoming.body
        self._deadline = incoming.call.total_deadline  # on the loop's clock
        self._parts = stream_class(self._lib)(incoming.body, request).__aiter__()

    def _limit(self) -> float:
        return max(self._deadline - self._loop.time(), 0.0) + GRACE

    def __iter__(self) -> Iterator[bytes]:
        while True:
            part = self._loop.call(_next_part, self._parts, limit=self._limit())
            if part is None:
                return
            yield part

    def close(self) -> None:
        """Release the connection and end the call, at once. Safe to call more than once."""
        if not self._body.closed:
            self._loop.call(_close, self._parts, self._body, limit=_CLOSE_LIMIT + GRACE)


async def _next_part(parts: Any) -> bytes | None:
    try:
        part: bytes = await parts.__anext__()
    except StopAsyncIteration:
        return None
    return part


async def _close(parts: Any, body: ResponseBody) -> None:
    await parts.aclose()  # its generator's cleanup closes the body once it has started
    await body.aclose()


class _SyncStream(_SyncStreamBase, httpx.SyncByteStream):
    _lib = _HTTPX


class _SyncStream2(_SyncStreamBase, httpx2.SyncByteStream):
    _lib = _HTTPX2


def _sync_stream_class(lib: _Library) -> type[_SyncStreamBase]:
    return _SyncStream if lib is _HTTPX else _SyncStream2


class Transport(_SyncEngineFace, httpx.BaseTransport):
    """stallproof's engine as a sync ``httpx`` transport.

    Takes the arguments of `AsyncTransport` (an ``engine``, or its settings). Requests
    run on stallproof's engine loop, a daemon thread shared by the process; the calling
    thread waits for the answer and is released when the call's bound fires.

    Example:
        >>> client = httpx.Client(transport=stallproof.Transport(timeout=30))
    """

    _lib = _HTTPX

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response: httpx.Response = self._handle_sync(request)
        return response


class Transport2(_SyncEngineFace, httpx2.BaseTransport):
    """stallproof's engine as a sync ``httpx2`` transport (what ``openai.OpenAI`` >= 3 and
    ``anthropic.Anthropic`` >= 2 run on). Takes the same arguments as `Transport`."""

    _lib = _HTTPX2

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        response: httpx2.Response = self._handle_sync(request)
        return response


def sync_http_client(
    *,
    timeout: TimeoutTypes = Timeouts(),  # noqa: B008 - frozen and immutable
    engine: Engine | None = None,
    **settings: Any,
) -> httpx.Client:
    """An ``httpx.Client`` whose every request goes through stallproof's engine (the sync
    `http_client()`): what to hand an SDK on httpx, ``openai.OpenAI(http_client=...)`` for
    openai < 3. Takes the engine's settings (see `AsyncTransport`)."""
    client: httpx.Client = engine_client(
        httpx.Client, Transport, timeout=timeout, engine=engine, settings=settings
    )
    return client


def sync_http_client2(
    *,
    timeout: TimeoutTypes = Timeouts(),  # noqa: B008 - frozen and immutable
    engine: Engine | None = None,
    **settings: Any,
) -> httpx2.Client:
    """An ``httpx2.Client`` whose every request goes through stallproof's engine (the sync
    `http_client2()`): what to hand ``openai.OpenAI(http_client=...)`` or
    ``anthropic.Anthropic(http_client=...)``."""
    client: httpx2.Client = engine_client(
        httpx2.Client, Transport2, timeout=timeout, engine=engine, settings=settings
    )
    return client
