"""`Client`: an async, OpenAI-compatible chat client where every call is bounded."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import httpx
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from . import _exceptions as exc
from ._breaker import Breaker, CircuitState
from ._completions import Chat
from ._config import UNSET, Limits, Timeouts, TimeoutTypes, Unset
from ._engine import CallOptions, Engine, Incoming, Outgoing
from ._httpx_pool import HttpxClientPool
from ._inflight import InflightCall
from ._json import parse_body
from ._models import ChatCompletion
from ._pacer import Pacer, PacerState
from ._redact import safe_url
from ._retry import Retry, RetryBudget
from ._stream import AsyncStream

__all__ = ["Client"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
_NO_RETRY = Retry(attempts=1)
_USER_AGENT = "stallproof/0.1"
# Headers that frame the request on the wire: set by us from the body and the URL only.
_FRAMING = frozenset({b"content-length", b"host", b"transfer-encoding", b"connection"})


class Client:
    """An async chat client that cannot hang: a drop-in for ``openai.AsyncOpenAI`` on chat.

    Args:
        base_url: e.g. ``"http://127.0.0.1:8000/v1"``. Defaults to ``$OPENAI_BASE_URL``,
            then OpenAI's URL.
        api_key: sent as ``Authorization: Bearer ...``. Defaults to ``$OPENAI_API_KEY``;
            with neither, no Authorization header is sent (local servers often need none).
            The key never appears in a repr, a log line or an exception.
        timeout: the default bounds of every call: a number (the total budget in seconds)
            or a `Timeouts`. Each call may override it with ``create(..., timeout=...)``.
        limits: size caps and pool size (`Limits`).
        retry: the default `Retry` policy (3 attempts); None never retries. Each call may
            override it with ``create(..., retry=...)``. Retries always fit in ``total``.
        retry_budget: the `RetryBudget` shared by every call of this client; None lets
            every call retry as its policy says, even when everything is failing.
        breaker: a `Breaker` policy to keep one circuit breaker per upstream; None (the
            default) sends every call.
        pacer: a `Pacer` that every call waits for before it is sent (concurrency, requests
            and tokens per minute, fair between agents, adaptive under 429); the wait counts
            against the call's total deadline. None (the default): no pacing.
        default_headers: extra headers sent with every request.
        http_client: an ``httpx.AsyncClient`` to send through instead of stallproof's own
            pool (for its proxies, certificates or event hooks). Every bound still holds,
            but its pool is httpcore's, which cancellations can leave with dead slots
            (encode/httpcore#1093): a warning says so once. Not closed by `aclose`.
        trust_env: let httpx read proxy settings from the environment (default True).
        tracer_provider, meter_provider: OpenTelemetry providers; default the global ones.
            With none configured, tracing costs a few no-op calls.
        provider_name: ``gen_ai.provider.name`` on spans and metrics (default "openai").
        record_content: put prompts and completions on spans (default False: never).

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
        timeout: TimeoutTypes = Timeouts(),  # noqa: B008 - frozen and immutable
        limits: Limits = Limits(),  # noqa: B008 - frozen and immutable
        retry: Retry | None = Retry(),  # noqa: B008 - frozen and immutable
        retry_budget: RetryBudget | None = RetryBudget(),  # noqa: B008 - frozen and immutable
        breaker: Breaker | None = None,
        pacer: Pacer | None = None,
        default_headers: Mapping[str, str] | None = None,
        http_client: httpx.AsyncClient | None = None,
        trust_env: bool = True,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        provider_name: str = "openai",
        record_content: bool = False,
    ) -> None:
        if base_url is None:
            base_url = os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        if api_key is None:
            api_key = os.environ.get("OPENAI_API_KEY") or None
        if api_key is not None and not isinstance(api_key, str):
            raise exc.InvalidRequestError(f"api_key must be a str, got {type(api_key).__name__}")
        if api_key and (api_key != api_key.strip() or not api_key.isprintable()):
            # A key read from a file often ends in a newline. Never echo it.
            raise exc.InvalidRequestError(
                "api_key has surrounding whitespace or a control character (value not shown)"
            )
        if not isinstance(limits, Limits):
            raise exc.InvalidRequestError(f"limits must be a Limits, got {limits!r}")
        try:
            url = httpx.URL(str(base_url))
        except httpx.InvalidURL as e:
            raise exc.InvalidRequestError(f"invalid base_url: {e}") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise exc.InvalidRequestError(
                f"base_url must be an absolute http(s) URL, got {safe_url(base_url)!r}"
            )
        if url.port is not None and not 0 < url.port < 65536:
            raise exc.InvalidRequestError(f"base_url port {url.port} is out of range (1-65535)")
        if http_client is not None and not isinstance(http_client, httpx.AsyncClient):
            raise exc.InvalidRequestError(
                f"http_client must be an httpx.AsyncClient, got {type(http_client).__name__}"
            )
        self.base_url = url.copy_with(path=url.path.rstrip("/") + "/")
        # The breaker's key shows in circuits(), CircuitOpen and log lines: no userinfo.
        self._upstream = safe_url(self.base_url)
        # Joined once: httpx's URL.join costs ~0.4 ms, a third of our per-call overhead.
        chat_url = self.base_url.join("chat/completions")
        self._scheme = chat_url.raw_scheme
        self._host = chat_url.raw_host
        self._port = chat_url.port
        self._chat_target = chat_url.raw_path
        self.timeout = Timeouts.coerce(timeout)
        self.limits = limits
        self._api_key = api_key
        headers = {"user-agent": _USER_AGENT, "accept": "application/json"}
        for name in default_headers or {}:
            if isinstance(name, str) and name.lower().encode() in _FRAMING:
                raise exc.InvalidRequestError(
                    f"default_headers may not set {name!r}: stallproof frames the request"
                )
        headers.update(default_headers or {})
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self._headers = _encode_headers(headers)
        if retry is not None and not isinstance(retry, Retry):
            raise exc.InvalidRequestError(f"retry must be a Retry or None, got {retry!r}")
        self.retry = retry or _NO_RETRY
        self._engine = Engine(
            timeout=self.timeout,
            limits=limits,
            retry=self.retry,
            retry_budget=retry_budget,
            breaker=breaker,
            pacer=pacer,
            pool=HttpxClientPool(http_client) if http_client is not None else None,
            trust_env=trust_env,
            provider_name=provider_name,
            record_content=record_content,
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
        )
        self.chat = Chat(self)

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
        return self._api_key

    def __repr__(self) -> str:
        key = "None" if self._api_key is None else "'***'"
        return f"<stallproof.Client base_url={safe_url(self.base_url)!r} api_key={key}>"

    async def aclose(self) -> None:
        """Close the client's connections (not those of an ``http_client`` passed in)."""
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
        self,
        body: dict[str, Any],
        options: CallOptions,
        *,
        stream: bool,
        extra_headers: Mapping[str, str | None] | None,
        extra_query: Mapping[str, Any] | None,
    ) -> Outgoing:
        headers = list(self._headers)
        if stream:
            headers = [(k, v) for k, v in headers if k != b"accept"]
            headers.append((b"accept", b"text/event-stream"))
        if extra_headers:
            if not isinstance(extra_headers, Mapping):
                raise exc.InvalidRequestError(
                    f"extra_headers must be a mapping, got {type(extra_headers).__name__}"
                )
            for name, value in extra_headers.items():
                key = _encode_name(name)
                if key in _FRAMING:
                    raise exc.InvalidRequestError(
                        f"extra_headers may not set {name!r}: stallproof frames the request"
                    )
                headers = [(k, v) for k, v in headers if k != key]
                if value is not None:  # None: openai's way to remove a default header
                    headers.append((key, _encode_value(name, value)))
        try:
            content = json.dumps(body, ensure_ascii=False, allow_nan=False).encode()
        except (TypeError, ValueError) as e:
            raise exc.InvalidRequestError(f"request body is not JSON-serialisable: {e}") from None
        headers.append((b"content-type", b"application/json"))
        headers.append((b"content-length", str(len(content)).encode()))
        target = self._chat_target
        if extra_query:
            query = httpx.QueryParams(dict(extra_query))
            target += (b"&" if b"?" in target else b"?") + str(query).encode()
        return Outgoing(
            b"POST",
            self._scheme,
            self._host,
            self._port,
            target,
            headers,
            content,
            options=options,
        )

    async def _chat(
        self,
        body: dict[str, Any],
        *,
        stream: bool,
        timeout: TimeoutTypes | Unset | None,
        retry: Retry | Unset | None,
        agent: str | None,
        labels: Mapping[str, str] | None,
        extra_headers: Mapping[str, str | None] | None,
        extra_query: Mapping[str, Any] | None,
    ) -> ChatCompletion | AsyncStream:
        if retry is not UNSET and retry is not None and not isinstance(retry, Retry):
            raise exc.InvalidRequestError(f"retry must be a Retry or None, got {retry!r}")
        if agent is not None and not isinstance(agent, str):
            raise exc.InvalidRequestError(f"agent must be a str or None, got {agent!r}")
        if labels is not None and (
            not isinstance(labels, Mapping)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
        ):
            raise exc.InvalidRequestError(f"labels must map str to str, got {labels!r}")
        options = CallOptions(
            timeouts=self._resolve_timeouts(timeout),
            retry=retry,
            agent=agent,
            labels=labels,
            body=body,
            upstream=self._upstream,
            operation="chat",
        )
        out = self._outgoing(
            body, options, stream=stream, extra_headers=extra_headers, extra_query=extra_query
        )
        incoming = await self._engine.send(out)
        if incoming.error is not None:
            await incoming.body.aclose()
            raise incoming.error
        if stream:
            if not incoming.body.is_stream:
                raise await _refuse(
                    incoming, "asked for a stream but the server answered with a JSON body"
                )
            return AsyncStream(incoming)
        if incoming.body.is_stream:
            raise await _refuse(incoming, "asked for JSON but the server answered with a stream")
        return await _completion(incoming)

    def _resolve_timeouts(self, timeout: TimeoutTypes | Unset | None) -> Timeouts:
        if timeout is UNSET or timeout is None:
            return self.timeout
        return Timeouts.coerce(timeout, base=self.timeout)


async def _refuse(incoming: Incoming, message: str) -> exc.MalformedResponse:
    error = incoming.call.error(exc.MalformedResponse, message)
    await incoming.body.fail(error)
    return error


async def _completion(incoming: Incoming) -> ChatCompletion:
    """Parse a whole body into a `ChatCompletion`; any failure ends the call with it."""
    body = incoming.body
    call = incoming.call
    content = body.content or b""
    try:
        try:
            result = await parse_body(content, call, _completion_or_error)
        except exc.MalformedResponse as e:
            if e.request_id is not None:
                raise
            raise call.error(exc.MalformedResponse, e.message) from None
        if isinstance(result, dict):
            raise call.error(
                exc.StreamErrorEvent, "the server answered 200 with an error object", body=result
            )
    except BaseException as e:
        await body.fail(e)
        raise
    outcome = body.outcome
    outcome.response_id = result.id
    outcome.response_model = result.model
    outcome.finish_reasons = [c.finish_reason for c in result.choices if c.finish_reason]
    usage = result.usage
    if usage is not None:
        outcome.note_usage(
            {
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "total_tokens": usage.total_tokens,
            }
        )
    if outcome.text is not None and result.choices:
        outcome.text.append(result.choices[0].message.content or "")
    await body.aclose()
    return result


def _completion_or_error(data: object) -> ChatCompletion | dict[str, Any]:
    """A parsed body as a `ChatCompletion`, or the error object a server sent with a 200."""
    if not isinstance(data, dict):
        raise exc.MalformedResponse(f"response body is JSON {type(data).__name__}, not object")
    if "error" in data and "choices" not in data:
        return data
    return ChatCompletion.from_dict(data)


def _encode_name(name: object) -> bytes:
    if not isinstance(name, str) or not name or not name.isascii():
        raise exc.InvalidRequestError(f"header name must be a non-empty ASCII str, got {name!r}")
    return name.lower().encode("ascii")


def _encode_value(name: str, value: object) -> bytes:
    # The value may be a secret: never echo it in the message.
    if not isinstance(value, str):
        raise exc.InvalidRequestError(f"header {name!r} must have a str value")
    if value != value.strip() or any(c in value for c in "\r\n\0"):
        raise exc.InvalidRequestError(
            f"header {name!r} has surrounding whitespace or a control character in its "
            "value (value not shown)"
        )
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        raise exc.InvalidRequestError(
            f"header {name!r} has a character that cannot be sent in HTTP (value not shown)"
        ) from None


def _encode_headers(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    return [(_encode_name(k), _encode_value(k, v)) for k, v in headers.items()]
