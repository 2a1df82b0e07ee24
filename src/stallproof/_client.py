"""`Client`: an async, OpenAI-compatible chat client where every call is bounded."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from types import TracebackType
from typing import Any, NoReturn, TypeVar

import httpx
import httpx2
from openai import NOT_GIVEN, NotGiven
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from . import _exceptions as exc
from ._breaker import CircuitState
from ._completions import Beta, Chat
from ._config import UNSET, Limits, Timeouts, TimeoutTypes, Unset
from ._engine import CallOptions, Engine, Incoming, Outgoing
from ._faces._compat import timeouts_from
from ._inflight import InflightCall
from ._pacer import PacerState
from ._policies import Breaker, Pacer, Retry, RetryBudget
from ._raw import DEFAULT_PER_CALL, PerCall, Prepared
from ._redact import safe_url
from ._resources import Embeddings, Models
from ._responses import Responses
from ._settings import Settings
from ._wire._httpx_pool import HttpxClientPool
from ._wire._proxy import ProxyTypes

__all__ = ["Client"]

R = TypeVar("R")


class Client:
    """An async chat client that cannot hang: a drop-in for ``openai.AsyncOpenAI`` on chat.

    Takes ``openai.AsyncOpenAI``'s arguments (``NOT_GIVEN`` / ``omit`` mean "not given"),
    returns openai's own result types and raises errors that are also openai's classes.
    See docs/migrating.md for the few deliberate differences.

    Args:
        base_url: e.g. ``"http://127.0.0.1:8000/v1"``. Defaults to ``$OPENAI_BASE_URL``,
            then OpenAI's URL. Credentials (``user:password@``) and a query are refused
            (`InvalidRequestError`): pass them as ``api_key`` and ``default_query``.
        api_key: sent as ``Authorization: Bearer ...``. Defaults to ``$OPENAI_API_KEY``;
            with neither, no Authorization header is sent (local servers often need none).
            The key never appears in a repr, a log line or an exception.
        organization: sent as ``OpenAI-Organization``; default ``$OPENAI_ORG_ID``.
        project: sent as ``OpenAI-Project``; default ``$OPENAI_PROJECT_ID``.
        timeout: the default bounds of every call: a number (the total budget in seconds),
            a `Timeouts`, or an ``httpx.Timeout`` (its phases replace ours; total stays).
            Never None: stallproof never runs a call unbounded. Each call may override it
            with ``create(..., timeout=...)``.
        max_retries: openai's retry count: ``n`` means ``Retry(attempts=n + 1)``.
        limits: size caps and pool size (`Limits`).
        retry: the default `Retry` policy (3 attempts); None never retries. Each call may
            override it with ``create(..., retry=...)``. Retries always fit in ``total``.
            Give this or ``max_retries``, not both.
        retry_budget: the `RetryBudget` shared by every call of this client; None lets
            every call retry as its policy says, even when everything is failing.
        breaker: a `Breaker` policy to keep one circuit breaker per upstream; None (the
            default) sends every call.
        pacer: a `Pacer` that every call waits for before it is sent (concurrency, requests
            and tokens per minute, fair between agents, adaptive under 429); the wait counts
            against the call's total deadline. None (the default): no pacing.
        default_headers: extra headers sent with every request.
        default_query: query parameters added to every request (Azure's ``api-version``).
        http_client: an ``httpx.AsyncClient`` to send through instead of stallproof's own
            pool (for its proxies, certificates or event hooks). Every bound still holds,
            but its pool is httpcore's, which cancellations can leave with dead slots
            (encode/httpcore#1093): a warning says so once. Not closed by `aclose`.
        trust_env: send through the proxies the environment names, as httpx does
            (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, bar ``NO_PROXY``; default
            True). See docs/pool.md, "Proxies".
        proxy: a proxy for every call instead of the environment's: a URL
            (``http://user:pass@proxy:3128``, ``https://...``, ``socks5://...`` with the
            ``socks`` extra) or an ``httpx.Proxy``. Its credentials never show in a repr,
            an error, a log line or a span.
        tracer_provider: the OpenTelemetry tracer provider; default the global one. With
            none configured, tracing costs a few no-op calls.
        meter_provider: the OpenTelemetry meter provider; default the global one.
        provider_name: ``gen_ai.provider.name`` on spans and metrics (default "openai").
        record_content: put prompts and completions on spans (default False: never).

    A client belongs to one event loop, the one of its first call: make one client per
    loop, never share it between threads (docs/concurrency.md).

    Example:
        >>> async with Client(base_url="http://127.0.0.1:8000/v1", timeout=30) as client:
        ...     resp = await client.chat.completions.create(
        ...         model="m", messages=[{"role": "user", "content": "hi"}])
    """

    def __init__(
        self,
        *,
        base_url: str | httpx.URL | None = None,
        api_key: str | None = None,
        organization: str | None = None,
        project: str | None = None,
        timeout: TimeoutTypes | httpx.Timeout | httpx2.Timeout | NotGiven = NOT_GIVEN,
        max_retries: int | NotGiven = NOT_GIVEN,
        limits: Limits = Limits(),  # noqa: B008 - frozen and immutable
        retry: Retry | Unset | None = UNSET,
        retry_budget: RetryBudget | None = RetryBudget(),  # noqa: B008 - frozen and immutable
        breaker: Breaker | None = None,
        pacer: Pacer | None = None,
        default_headers: Mapping[str, str] | None = None,
        default_query: Mapping[str, object] | None = None,
        http_client: httpx.AsyncClient | None = None,
        trust_env: bool = True,
        proxy: ProxyTypes | None = None,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        provider_name: str = "openai",
        record_content: bool = False,
    ) -> None:
        if not isinstance(limits, Limits):
            raise exc.InvalidRequestError(f"limits must be a Limits, got {limits!r}")
        if http_client is not None and not isinstance(http_client, httpx.AsyncClient):
            raise exc.InvalidRequestError(
                f"http_client must be an httpx.AsyncClient, got {type(http_client).__name__}"
            )
        if http_client is not None and proxy is not None:
            raise exc.InvalidRequestError(
                "give proxy to your http_client (httpx.AsyncClient(proxy=...)), not to Client: "
                "with an http_client, stallproof's own pool is not used"
            )
        self._settings = Settings.make(
            base_url=base_url,
            api_key=api_key,
            organization=organization,
            project=project,
            timeout=timeout,
            max_retries=max_retries,
            retry=retry,
            default_headers=default_headers,
            default_query=default_query,
        )
        self.limits = limits
        self._engine = Engine(
            timeout=self._settings.timeout,
            limits=limits,
            retry=self._settings.retry,
            retry_budget=retry_budget,
            breaker=breaker,
            pacer=pacer,
            pool=HttpxClientPool(http_client) if http_client is not None else None,
            trust_env=trust_env,
            proxy=proxy,
            provider_name=provider_name,
            record_content=record_content,
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
        )
        self._attach()

    def _attach(self) -> None:
        s = self._settings
        self.base_url = s.base_url
        self.timeout = s.timeout
        self.retry = s.retry
        self.max_retries = s.retry.attempts - 1
        # The breaker's key shows in circuits(), CircuitOpen and log lines: no userinfo.
        self._upstream = safe_url(s.base_url)
        # The engine's options of a call that passes no per-call argument, per operation:
        # all this client's own (frozen), so one object for every such call.
        self._plain_options: dict[str, CallOptions] = {}
        self.chat = Chat(self)
        self.beta = Beta(self.chat)
        self.models = Models(self)
        self.embeddings = Embeddings(self)
        self.responses = Responses(self)

    def with_options(self, **changes: Any) -> Client:
        """A client with some settings changed, sharing this one's engine (its pool,
        retry budget, breaker and pacer), as ``AsyncOpenAI.with_options`` shares its
        http client. Takes ``base_url``, ``api_key``, ``organization``, ``project``,
        ``timeout``, ``max_retries``, ``retry``, ``default_headers``, ``default_query``.
        ``copy`` is the same method.

        Raises:
            TypeError: an option that cannot change per copy (``limits``, ``http_client``,
                ``pacer``...): make a new `Client` for those.
        """
        new = copy.copy(self)
        new._settings = self._settings.replace(changes)
        new._attach()
        return new

    copy = with_options

    def inflight(self, *, stalled_after: float = 5.0) -> tuple[InflightCall, ...]:
        """Every call of this client in progress right now, longest-running first.

        A call is ``stalled`` when it made no progress (phase change, content chunk, body
        bytes) for more than ``stalled_after`` seconds and its deadline has not fired.
        Streams stay in flight until they end or are closed. See `format_inflight`.
        """
        return self._engine.inflight(stalled_after=stalled_after)

    @property
    def retry_tokens(self) -> float | None:
        """Tokens left in the client's retry budget (None without a budget)."""
        return self._engine.retry_tokens

    def pacer_state(self) -> PacerState | None:
        """A snapshot of the pacer: limit, in use, queued per agent (None without one)."""
        return self._engine.pacer_state()

    def circuits(self) -> dict[str, CircuitState]:
        """A snapshot of every upstream's circuit breaker (empty without a `Breaker`)."""
        return self._engine.circuits()

    @property
    def api_key(self) -> str | None:
        return self._settings.api_key

    @property
    def organization(self) -> str | None:
        return self._settings.organization

    @property
    def project(self) -> str | None:
        return self._settings.project

    def __repr__(self) -> str:
        key = "None" if self._settings.api_key is None else "'***'"
        return f"<stallproof.Client base_url={safe_url(self.base_url)!r} api_key={key}>"

    async def aclose(self) -> None:
        """Close the client's connections (not those of an ``http_client`` passed in).

        Copies made by `with_options` share them: closing one closes all, as in openai.
        """
        await self._engine.aclose()

    async def close(self) -> None:
        """`aclose` under openai's name."""
        await self._engine.aclose()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- the one place a request is made -------------------------------------------------

    def _outgoing(
        self, method: bytes, path: str, body: dict[str, Any] | None, opts: PerCall, *, stream: bool
    ) -> Outgoing:
        """The request the engine sends for one call of this client."""
        operation = path.split("/", 1)[0]  # (a fixed few: "chat", "responses", "models"...)
        if opts is DEFAULT_PER_CALL:
            options = self._plain_options.get(operation)
            if options is None:
                options = self._plain_options[operation] = self._options(operation, opts)
        else:
            options = self._options(operation, opts)
        s = self._settings
        out = s.outgoing(method, path, body, options, stream=stream)
        s.add_headers(out, opts.extra_headers)
        s.add_query(out, opts.extra_query)
        return out

    def _options(self, operation: str, opts: PerCall) -> CallOptions:
        return CallOptions(
            timeouts=self._resolve_timeouts(opts.timeout),
            retry=opts.retry,  # UNSET: the engine's, which is this client's
            agent=opts.agent,
            labels=opts.labels,
            upstream=self._upstream,
            operation=operation,
        )

    async def _send(
        self, method: bytes, path: str, body: dict[str, Any] | None, opts: PerCall, *, stream: bool
    ) -> Incoming:
        """Send one call through the engine; a non-2xx answer is raised (body released)."""
        incoming = await self._engine.send(self._outgoing(method, path, body, opts, stream=stream))
        if incoming.error is not None:
            await _raise_status(incoming)
        return incoming

    def _resolve_timeouts(self, timeout: object) -> Timeouts:
        # None: openai's "no timeout"; stallproof never runs a call unbounded, so the
        # client's bounds apply.
        return timeouts_from(timeout, self._settings.timeout)

    async def _run(self, prepared: Prepared[R]) -> R:
        # `_send`, with the engine awaited from here: a call stalled in flight holds one
        # coroutine less (thousands may be in flight; docs/pool.md). Nor does it hold
        # ``prepared`` (its caller passes it on without keeping it): the request has what
        # the call needs, and the result needs only ``convert``.
        convert = prepared.convert
        out = self._outgoing(
            prepared.method, prepared.path, prepared.body, prepared.opts, stream=prepared.stream
        )
        del prepared
        incoming = await self._engine.send(out)
        if incoming.error is not None:
            await _raise_status(incoming)
        return await convert(incoming)


async def _raise_status(incoming: Incoming) -> NoReturn:
    """A non-2xx answer, as its `APIStatusError`, its body released first."""
    assert incoming.error is not None
    await incoming.body.aclose()
    raise incoming.error
