"""What the SDK faces share: the engine under an SDK client, and the SDK's settings in
stallproof's terms.

`stallproof.openai.AsyncOpenAI` and `stallproof.anthropic.AsyncAnthropic` are the SDKs'
own clients with one change: every request goes through an `Engine` (as the transport of
their HTTP client: an ``httpx2.AsyncClient`` with `AsyncTransport2` for openai >= 3 and
anthropic >= 1, an ``httpx.AsyncClient`` with `AsyncTransport` for openai 1.x/2.x and
anthropic 0.x, as `_compat.http_library` reads it from the installed SDK), and each
request carries this client's `Timeouts` and `Retry` to the engine as `CallOptions`. The
engine is shared by every ``copy()`` / ``with_options()`` of a client, like the SDK shares
its http client.

How the SDK's settings map (`_compat`, the one place that knows them):

- ``timeout=``: a `Timeouts` is used as is; a number is the total budget; an
  ``httpx2.Timeout`` (or ``httpx.Timeout``) sets connect/read/write/pool; None keeps the
  defaults (stallproof never disables a bound). Per call, ``create(..., timeout=...)``
  maps the same way on top of the client's bounds.
- Errors: whatever the SDK version, a bound that fires reaches the caller as the SDK's
  ``APITimeoutError`` and a connection fault as its ``APIConnectionError``, before the
  first byte or mid-stream (`TranslatingDecoder`: some SDK versions let a transport error
  met mid-stream through raw), with the stallproof error as ``__cause__``.
- ``max_retries=``: the SDK's own loop is off (``max_retries=0``): the engine retries
  inside the one total deadline. A ``max_retries=N`` given to the constructor or to
  ``with_options`` becomes ``Retry(attempts=N + 1)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator, Mapping
from types import ModuleType
from typing import Any, ClassVar, TypeVar

import httpx
import httpx2

from .. import _exceptions as exc
from .._breaker import CircuitState
from .._config import UNSET, Timeouts, Unset
from .._engine import CallOptions, Engine
from .._inflight import InflightCall
from .._pacer import PacerState
from .._policies import Retry
from ._arguments import check_call_options, unbuildable
from ._compat import http_library, phase_timeout, retry_from, timeouts_from
from ._own_client import adopt
from ._streams import without_cycle
from ._sync_transport import Transport, Transport2
from ._transport import AsyncTransport, AsyncTransport2
from ._typed import TypedEvent, check_result, invalid_result, unsendable_header

__all__ = ["FaceMixin", "Hardening", "TranslatingDecoder", "harden", "rebind"]

_F = TypeVar("_F", bound="FaceMixin")
# The engine's adapter for each (library, sync) pair.
_TRANSPORTS: dict[tuple[ModuleType, bool], type[Any]] = {
    (httpx, False): AsyncTransport,
    (httpx2, False): AsyncTransport2,
    (httpx, True): Transport,
    (httpx2, True): Transport2,
}


def engine_of(http_client: object) -> Engine | None:
    """The engine under a client built by `http_client2()` / `http_client()` (or their sync
    forms), if any."""
    transport = getattr(http_client, "_transport", None)
    if isinstance(transport, (AsyncTransport, AsyncTransport2, Transport, Transport2)):
        return transport.engine
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class Hardening:
    """One SDK client's link to its engine: the engine, and this client's bounds and retry."""

    engine: Engine
    timeouts: Timeouts
    retry: Retry | Unset | None = UNSET

    def call_options(
        self, per_call_timeout: object, body: object, credentials: frozenset[str] = frozenset()
    ) -> CallOptions:
        """What one request tells the engine: this client's bounds, tightened per call,
        the JSON body the SDK is sending (so the engine need not parse it again) and the
        SDK's auth header names (dropped on a redirect to another origin)."""
        return CallOptions(
            timeouts=timeouts_from(per_call_timeout, self.timeouts),
            retry=self.retry,
            body=body if isinstance(body, dict) else None,
            credentials=credentials,
        )

    def sdk_timeout(self, lib: ModuleType) -> Any:
        """The bounds as the SDK's ``timeout`` (``lib``'s ``Timeout``): its per-phase
        values match the engine's."""
        return phase_timeout(lib, self.timeouts)

    def derive(self, *, timeout: object, max_retries: object) -> Hardening:
        """This link for a ``copy()``: same engine, bounds and retry changed as asked."""
        timeouts = timeouts_from(timeout, self.timeouts)
        retry = retry_from(UNSET, max_retries)
        return Hardening(self.engine, timeouts, self.retry if retry is UNSET else retry)


def harden(
    http_client: Any,
    *,
    sdk: ModuleType,
    timeout: object,
    retry: Retry | Unset | None,
    max_retries: object,
    settings: dict[str, Any],
    engine: Engine | None,
    either_library: bool,
    sync: bool = False,
) -> tuple[Hardening, Any]:
    """The engine for a new face of ``sdk`` (the ``openai`` or ``anthropic`` module), and
    the http client to hand the SDK.

    With no ``http_client``, ``engine`` (or a new one from ``settings``) under a new client
    of the library the installed SDK runs on (`_compat.http_library`). With one built by
    stallproof (`http_client2()` / `http_client()`, or a client with our transport), its
    engine. With the caller's own client, a new engine installed as its transport
    (`stallproof._faces._own_client`). ``either_library``: the SDK takes a client of
    either library (openai), not only its own (anthropic). ``sync``: the same for a sync
    face, with the library's ``Client`` and `Transport2` / `Transport`; a caller's own sync
    client is refused (its transports block: the engine cannot send through them).
    """
    lib = http_library(sdk)
    kind = "Client" if sync else "AsyncClient"
    retry = retry_from(retry, max_retries)
    settings = {k: v for k, v in settings.items() if v is not UNSET}
    if engine is not None and (settings or http_client is not None):
        given = sorted(settings) + (["http_client"] if http_client is not None else [])
        raise exc.InvalidRequestError(f"pass an engine or {given}, not both")
    if engine is not None and not isinstance(engine, Engine):
        raise exc.InvalidRequestError(f"engine must be an Engine, got {engine!r}")
    if http_client is None:
        timeouts = timeouts_from(timeout, engine.timeout if engine is not None else Timeouts())
        if engine is None:
            if retry is not UNSET:
                settings["retry"] = retry
            engine = Engine(timeout=timeouts, **settings)
        hardening = Hardening(engine, timeouts, retry)
        # The engine follows redirects itself, inside the call's one deadline: this client
        # never sees one (see `stallproof._redirects`).
        client = getattr(lib, kind)(
            transport=_TRANSPORTS[lib, sync](engine),
            timeout=hardening.sdk_timeout(lib),
            follow_redirects=False,
        )
        return hardening, client
    kinds = tuple(getattr(m, kind) for m in ((httpx2, httpx) if either_library else (lib,)))
    if not isinstance(http_client, kinds):
        wanted = " or ".join(f"an {k.__module__.split('.')[0]}.{kind}" for k in kinds)
        raise exc.InvalidRequestError(
            f"http_client must be {wanted} for {sdk.__name__} "
            f"{getattr(sdk, '__version__', '')}, got {type(http_client).__name__}"
        )
    engine = engine_of(http_client)
    if engine is None and sync:
        raise exc.InvalidRequestError(
            f"http_client must be built by stallproof.sync_http_client2() (or "
            f"sync_http_client()), got your own {type(http_client).__name__}: its transports "
            "block, and stallproof's engine cannot send through them"
        )
    if engine is None:  # the caller's own client: the engine becomes its transport
        timeouts = timeouts_from(timeout, Timeouts())
        if retry is not UNSET:
            settings["retry"] = retry
        engine = adopt(http_client, timeout=timeouts, **settings)
        return Hardening(engine, timeouts, retry), http_client
    if settings:
        raise exc.InvalidRequestError(
            f"this http_client already has its engine: pass {sorted(settings)} to it, not here"
        )
    return Hardening(engine, timeouts_from(timeout, engine.timeout), retry), http_client


class FaceMixin:
    """The views and request hook every SDK face adds to the SDK's client."""

    _stallproof: Hardening
    #: A sync face (the SDK's sync client, over `Transport2`).
    _sync: ClassVar[bool] = False

    @property
    def engine(self) -> Engine:
        """The `Engine` every request of this client (and of its copies) goes through."""
        return self._stallproof.engine

    @property
    def timeouts(self) -> Timeouts:
        """This client's bounds (a call may tighten them with ``timeout=``)."""
        return self._stallproof.timeouts

    def inflight(self, *, stalled_after: float = 5.0) -> tuple[InflightCall, ...]:
        """Every call through this client's engine in progress now, longest first."""
        return self._stallproof.engine.inflight(stalled_after=stalled_after)

    def pacer_state(self) -> PacerState | None:
        """The pacer's state, or None without a pacer."""
        return self._stallproof.engine.pacer_state()

    def circuits(self) -> dict[str, CircuitState]:
        """The breaker's circuits by upstream (empty without a breaker)."""
        return self._stallproof.engine.circuits()

    def _build_request(self, options: Any, *, retries_taken: int = 0) -> Any:
        check_call_options(options)
        failure: BaseException | None = None
        try:
            request = super()._build_request(  # type: ignore[misc]
                options, retries_taken=retries_taken
            )
        except UnicodeEncodeError:
            request = None  # raised below, outside the handler: the codec quotes the value
        except (TypeError, ValueError, httpx.InvalidURL, httpx2.InvalidURL) as e:
            # Bad arguments the SDK met building the request (nothing is sent yet); its
            # message may quote a value: typed, below, outside the handler.
            request, failure = None, e
        if failure is not None:
            raise unbuildable(type(self).__module__.rpartition(".")[2], failure)
        if request is None:
            raise unsendable_header(self, options)
        request.extensions["stallproof"] = self._stallproof.call_options(
            options.timeout, options.json_data, _auth_header_names(self)
        )
        return request

    async def _process_response(self, **kwargs: Any) -> Any:
        # A stream dropped unread is freed at once, its call ended (`_faces._streams`).
        return without_cycle(await super()._process_response(**kwargs))  # type: ignore[misc]

    def _process_response_data(self, *, data: object, cast_to: Any, response: Any) -> Any:
        # Every result the SDK builds from JSON, whole or a stream's chunk: one missing a
        # required object or list is the SDK's own validation error (`_faces._typed`).
        result = super()._process_response_data(  # type: ignore[misc]
            data=data, cast_to=cast_to, response=response
        )
        path = check_result(result, cast_to)
        if path is not None:
            raise invalid_result(self, response, data, path)
        return result

    def copy(self: _F, *, timeout: Any = UNSET, max_retries: Any = UNSET, **kwargs: Any) -> _F:
        """The SDK's ``copy()``: the copy shares this client's engine (or takes the one
        under a new ``http_client``); ``timeout`` and ``max_retries`` change its bounds and
        its retry policy, as for the constructor. Other arguments are the SDK's."""
        hardening = self._stallproof.derive(timeout=timeout, max_retries=max_retries)
        extra = {**kwargs.pop("_extra_kwargs", {}), "_hardening": hardening}
        copied: _F = super().copy(  # type: ignore[misc]
            timeout=hardening.timeouts, _extra_kwargs=extra, **kwargs
        )
        return copied

    with_options = copy


def _auth_header_names(client: Any) -> frozenset[str]:
    # The SDKs name their credential headers in ``auth_headers`` (openai: Authorization;
    # anthropic: X-Api-Key, Authorization); a caller's subclass may add its own there.
    try:
        headers = client.auth_headers
    except Exception:  # an SDK whose key is not ready yet: the engine's own list applies
        return frozenset()
    if not isinstance(headers, Mapping):
        return frozenset()
    return frozenset(str(name).lower() for name in headers)


def rebind(hardening: Hardening, http_client: Any) -> Hardening:
    """A copy's link: its parent's bounds and retry, on the engine of its http client."""
    engine = engine_of(http_client)
    if engine is None:
        raise exc.InvalidRequestError(
            f"http_client must be built by stallproof.http_client2() / http_client(), got "
            f"{type(http_client).__name__}: stallproof's bounds live in the transport"
        )
    return dataclasses.replace(hardening, engine=engine)


_TIMEOUTS = (httpx2.TimeoutException, httpx.TimeoutException)
_CONNECTION = (httpx2.TransportError, httpx.TransportError)


class TranslatingDecoder:
    """An SDK's SSE decoder, with a transport error met mid-stream raised as the SDK's own
    ``APITimeoutError`` / ``APIConnectionError`` (``from`` the stallproof error), as the
    SDK does before the first byte. Both faces install it through ``_make_sse_decoder``."""

    def __init__(
        self, inner: Any, timeout_error: type[Exception], connection_error: type[Exception]
    ) -> None:
        self._inner = inner
        self._errors = (timeout_error, connection_error)

    def aiter_bytes(self, iterator: AsyncIterator[bytes]) -> AsyncIterator[Any]:
        return _TranslatedEvents(self._inner.aiter_bytes(iterator), *self._errors)

    def iter_bytes(self, iterator: Iterator[bytes]) -> Iterator[Any]:
        return _TranslatedEvents(self._inner.iter_bytes(iterator), *self._errors)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _TranslatedEvents:
    """The decoder's events (async or sync, as the SDK's stream reads them), errors
    translated, each a `TypedEvent` (its ``json()`` typed). A plain iterator, not a
    generator: when the SDK drops it unfinished (its own stream raised), nothing is left
    to finalise."""

    def __init__(
        self,
        events: Any,
        timeout_error: type[Exception],
        connection_error: type[Exception],
    ) -> None:
        self._events = events
        self._timeout_error = timeout_error
        self._connection_error = connection_error

    def __aiter__(self) -> _TranslatedEvents:
        return self

    async def __anext__(self) -> Any:
        try:
            return TypedEvent(await anext(self._events))
        except _CONNECTION as e:  # timeouts included
            raise self._translated(e) from e

    def __iter__(self) -> _TranslatedEvents:
        return self

    def __next__(self) -> Any:
        try:
            return TypedEvent(next(self._events))
        except _CONNECTION as e:  # timeouts included
            raise self._translated(e) from e

    def _translated(self, error: Exception) -> Exception:
        cls = self._timeout_error if isinstance(error, _TIMEOUTS) else self._connection_error
        return cls(request=_request_of(error))  # type: ignore[call-arg]


def _request_of(error: Exception) -> Any:
    try:
        return error.request  # type: ignore[attr-defined]
    except RuntimeError:  # httpx(2): "The .request property has not been set."
        return None
