"""The engine as an httpx transport and as an httpx2 transport: two thin adapters.

Anything built on httpx or httpx2 — the openai and anthropic SDKs, litellm, langchain,
pydantic-ai, a hand-written client — gets stallproof's guarantees by sending through one
of these::

    client = openai.AsyncOpenAI(http_client=stallproof.http_client2(timeout=30))
    raw = httpx.AsyncClient(transport=stallproof.AsyncTransport(timeout=30))

Each adapter turns the library's request into the engine's `Outgoing`, and the engine's
`Incoming` back into the library's response, whose body stays bounded while it is read.
A stallproof error leaves the adapter as an instance of *both* the stallproof class and
the matching class of the library (a `stallproof.IdleTimeout` that is also an
``httpx2.TimeoutException``), so the SDKs map it to their own ``APITimeoutError`` /
``APIConnectionError`` with the stallproof error — bound, elapsed, phase — as
``__cause__``, and code that catches either family catches it.

The library client's own per-phase timeouts (connect, read, write, pool) can only tighten
the engine's, never loosen them; ``total``, ``first_token`` and ``idle`` are the engine's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import httpx
import httpx2

from .. import _exceptions as exc
from .._body import ResponseBody
from .._breaker import CircuitState
from .._config import Timeouts, TimeoutTypes
from .._engine import CallOptions, Engine, Incoming, Outgoing
from .._inflight import InflightCall
from .._pacer import PacerState
from .._redact import redacted_request
from ._typed import typed_json

__all__ = ["AsyncTransport", "AsyncTransport2", "http_client", "http_client2"]


@dataclasses.dataclass(frozen=True)
class _Library:
    """The exception classes of one HTTP library that our errors take on at its boundary."""

    module: ModuleType
    timeout: type[Exception]
    connect_timeout: type[Exception]
    read_timeout: type[Exception]
    write_timeout: type[Exception]
    pool_timeout: type[Exception]
    connect_error: type[Exception]
    read_error: type[Exception]
    transport_error: type[Exception]
    remote_protocol_error: type[Exception]
    local_protocol_error: type[Exception]
    decoding_error: type[Exception]
    too_many_redirects: type[Exception]

    @classmethod
    def of(cls, m: ModuleType) -> _Library:
        return cls(
            m,
            m.TimeoutException,
            m.ConnectTimeout,
            m.ReadTimeout,
            m.WriteTimeout,
            m.PoolTimeout,
            m.ConnectError,
            m.ReadError,
            m.TransportError,
            m.RemoteProtocolError,
            m.LocalProtocolError,
            m.DecodingError,
            m.TooManyRedirects,
        )

    def base_for(self, error: exc.StallproofError) -> type[Exception]:
        """The library class a stallproof error is also an instance of at this boundary."""
        if isinstance(error, exc.TimeoutException):
            return {
                "connect": self.connect_timeout,
                "read": self.read_timeout,
                "write": self.write_timeout,
                "pool": self.pool_timeout,
            }.get(error.bound, self.timeout)
        if isinstance(error, exc.ConnectError):
            return self.connect_error
        if isinstance(error, exc.ConnectionLost):
            return self.read_error
        if isinstance(error, exc.TooManyRedirects):
            return self.too_many_redirects
        if isinstance(error, (exc.TruncatedResponse, exc.ResponseTooLarge)):
            return self.remote_protocol_error
        if isinstance(error, exc.ProtocolError | exc.StreamErrorEvent):
            return self.decoding_error
        if isinstance(error, exc.InvalidRequestError):
            return self.local_protocol_error
        return self.transport_error


_HTTPX = _Library.of(httpx)
_HTTPX2 = _Library.of(httpx2)
_FLAVOURS: dict[tuple[type[exc.StallproofError], type[Exception]], type[Exception]] = {}


def flavoured(error: exc.StallproofError, lib: _Library, request: Any) -> Exception:
    """``error`` as an instance of its own class and of ``lib``'s matching class."""
    base = lib.base_for(error)
    key = (type(error), base)
    cls = _FLAVOURS.get(key)
    if cls is None:
        cls = type(
            type(error).__name__,
            (type(error), base),
            {"__module__": "stallproof", "request": property(_get_request, _set_request)},
        )
        _FLAVOURS[key] = cls
    new: Any = cls.__new__(cls)  # a TimeoutException is also an OSError: its own __new__
    new.__dict__.update(error.__dict__)
    new.args = error.args
    # What httpx(2).RequestError.request reads: a copy without the secret headers, since
    # the SDKs keep this error as __cause__ of their own and crash reporters walk chains.
    new._request = redacted_request(request)
    new.__cause__ = error.__cause__
    new.__context__ = error.__context__
    new.__suppress_context__ = error.__suppress_context__
    return new  # type: ignore[no-any-return]


def _get_request(self: Any) -> Any:
    if self._request is None:
        raise RuntimeError("The .request property has not been set.")
    return self._request


def _set_request(self: Any, request: Any) -> None:
    # httpx(2) attaches the request to errors passing through it (``request_context``):
    # keep only a copy without the secret headers.
    self._request = redacted_request(request)


def outgoing(request: Any, content: bytes) -> Outgoing:
    """An httpx(2) request, its body already read, as the engine's `Outgoing`."""
    url = request.url
    options = request.extensions.get("stallproof")
    return Outgoing(
        request.method.encode("ascii"),
        url.raw_scheme,
        url.raw_host,
        url.port,
        url.raw_path,
        list(request.headers.raw),
        content,
        timeout=request.extensions.get("timeout"),
        options=options if isinstance(options, CallOptions) else CallOptions(),
    )


async def exchange(engine: Engine, out: Outgoing) -> Incoming:
    """Send ``out`` through ``engine``; a whole body is closed at once (the call is over:
    nothing more to wait for), a stream is left to whoever reads it."""
    incoming = await engine.send(out)
    if not incoming.body.is_stream:
        await incoming.body.aclose()
    return incoming


def library_response(lib: _Library, incoming: Incoming, request: Any, stream: Any) -> Any:
    """The engine's answer as ``lib``'s response: its content, or ``stream`` to read.

    Raises:
        MalformedResponse (flavoured as ``lib``'s error): a 2xx answer to a request that
            accepts JSON alone, not labelled JSON and not JSON either — what the SDKs
            would hand back as a str where a model was expected.
    """
    body = incoming.body
    if not body.is_stream:
        content = body.content or b""
        if content and _json_asked_not_given(
            request, incoming.status, incoming.header("content-type")
        ):
            try:
                typed_json(content)
            except exc.MalformedResponse as e:
                raise flavoured(e, lib, request) from None
        return _response_class(lib)(
            incoming.status,
            headers=incoming.headers,
            content=content,
            extensions=incoming.extensions,
            request=request,
        )
    return _response_class(lib)(
        incoming.status,
        headers=incoming.headers,
        stream=stream,
        extensions=incoming.extensions,
        request=request,
    )


class _EngineFace:
    """What both adapters share: the engine, its views, and the request/response mapping."""

    _lib: _Library

    def __init__(
        self,
        engine: Engine | None = None,
        *,
        timeout: TimeoutTypes = Timeouts(),  # noqa: B008 - frozen and immutable
        **settings: Any,
    ) -> None:
        if engine is not None and settings:
            raise exc.InvalidRequestError(
                f"pass an engine or settings, not both (got {sorted(settings)})"
            )
        if engine is not None and not isinstance(engine, Engine):
            raise exc.InvalidRequestError(f"engine must be an Engine, got {engine!r}")
        self.engine = engine or Engine(timeout=Timeouts.coerce(timeout), **settings)

    def inflight(self, *, stalled_after: float = 5.0) -> tuple[InflightCall, ...]:
        """Every call through this transport in progress right now (see `Client.inflight`)."""
        return self.engine.inflight(stalled_after=stalled_after)

    def pacer_state(self) -> PacerState | None:
        return self.engine.pacer_state()

    def circuits(self) -> dict[str, CircuitState]:
        return self.engine.circuits()

    async def _handle(self, request: Any) -> Any:
        lib = self._lib
        out = outgoing(request, await request.aread())
        try:
            incoming = await exchange(self.engine, out)
        except exc.StallproofError as e:
            raise flavoured(e, lib, request) from e.__cause__
        stream = stream_class(lib)(incoming.body, request) if incoming.body.is_stream else None
        return library_response(lib, incoming, request, stream)

    async def aclose(self) -> None:
        await self.engine.aclose()


def _json_asked_not_given(request: Any, status: int, content_type: str | None) -> bool:
    """A 2xx answer to a request that accepts JSON alone, not labelled as JSON."""
    if not 200 <= status < 300 or request.headers.get("accept") != "application/json":
        return False
    return not (content_type or "").split(";", 1)[0].strip().lower().endswith("json")


def stream_class(lib: _Library) -> type[Any]:
    """The async byte stream class of ``lib`` (`_Stream` or `_Stream2`)."""
    return _Stream if lib is _HTTPX else _Stream2


def _response_class(lib: _Library) -> type[Any]:
    return _Response if lib is _HTTPX else _Response2


class _TypedJSON:
    """A response whose ``json()`` raises a `MalformedResponse` (also the library's
    ``DecodingError``) for a body that does not parse, never a raw ``JSONDecodeError``
    (see `stallproof._faces._typed`)."""

    _lib: _Library
    content: bytes
    request: Any

    def json(self, **kwargs: Any) -> Any:
        try:
            return typed_json(self.content, **kwargs)
        except exc.MalformedResponse as e:
            raise flavoured(e, self._lib, self.request) from None


class _Response(_TypedJSON, httpx.Response):
    _lib = _HTTPX


class _Response2(_TypedJSON, httpx2.Response):
    _lib = _HTTPX2


class _StreamBase:
    """A live body for the library's response: bounded reads, our errors flavoured."""

    _lib: _Library

    def __init__(self, body: ResponseBody, request: Any) -> None:
        self._body = body
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for part in self._body.aiter_bytes():
                yield part
        except exc.StallproofError as e:
            raise flavoured(e, self._lib, self._request) from e.__cause__

    async def aclose(self) -> None:
        await self._body.aclose()


class _Stream(_StreamBase, httpx.AsyncByteStream):
    _lib = _HTTPX


class _Stream2(_StreamBase, httpx2.AsyncByteStream):
    _lib = _HTTPX2


class AsyncTransport(_EngineFace, httpx.AsyncBaseTransport):
    """stallproof's engine as an ``httpx`` transport.

    Args:
        engine: an `Engine` to share with other faces; or leave it out and pass the
            engine's settings here: ``timeout`` (a number is the total budget, or
            `Timeouts`), ``limits``, ``retry``, ``retry_budget``, ``breaker``, ``pacer``,
            ``provider_name``, ``record_content``, ``tracer_provider``,
            ``meter_provider``, ``trust_env``, ``proxy`` (see `Client`).

    Example:
        >>> client = httpx.AsyncClient(transport=stallproof.AsyncTransport(timeout=30))
    """

    _lib = _HTTPX

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response: httpx.Response = await self._handle(request)
        return response


class AsyncTransport2(_EngineFace, httpx2.AsyncBaseTransport):
    """stallproof's engine as an ``httpx2`` transport (what openai ≥ 3 and anthropic ≥ 2
    run on). Takes the same arguments as `AsyncTransport`."""

    _lib = _HTTPX2

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response: httpx2.Response = await self._handle(request)
        return response


def _client_timeout(lib: ModuleType, timeouts: Timeouts) -> Any:
    # The library's own per-phase timeouts match ours, so they never tighten them.
    return lib.Timeout(
        connect=timeouts.connect, read=timeouts.read, write=timeouts.write, pool=timeouts.pool
    )


def engine_client(
    client_class: type[Any],
    transport_class: type[_EngineFace],
    *,
    timeout: TimeoutTypes,
    engine: Engine | None,
    settings: dict[str, Any],
) -> Any:
    """A ``client_class`` (an httpx or httpx2 client, async or sync) over a new
    ``transport_class`` on ``engine`` (or on a new engine built from the settings)."""
    transport = transport_class(
        engine, **({"timeout": timeout} if engine is None else {}), **settings
    )
    lib = transport._lib.module
    return client_class(transport=transport, timeout=_client_timeout(lib, transport.engine.timeout))


def http_client(
    *,
    timeout: TimeoutTypes = Timeouts(),  # noqa: B008 - frozen and immutable
    engine: Engine | None = None,
    **settings: Any,
) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` whose every request goes through stallproof's engine.

    Takes the engine's settings (see `AsyncTransport`); httpx's own settings such as
    ``headers`` or ``base_url`` may be set on the returned client.
    """
    client: httpx.AsyncClient = engine_client(
        httpx.AsyncClient, AsyncTransport, timeout=timeout, engine=engine, settings=settings
    )
    return client


def http_client2(
    *,
    timeout: TimeoutTypes = Timeouts(),  # noqa: B008 - frozen and immutable
    engine: Engine | None = None,
    **settings: Any,
) -> httpx2.AsyncClient:
    """An ``httpx2.AsyncClient`` whose every request goes through stallproof's engine:
    what to hand ``openai.AsyncOpenAI(http_client=...)`` or
    ``anthropic.AsyncAnthropic(http_client=...)``."""
    client: httpx2.AsyncClient = engine_client(
        httpx2.AsyncClient, AsyncTransport2, timeout=timeout, engine=engine, settings=settings
    )
    return client
