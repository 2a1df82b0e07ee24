"""`Client`: an async, OpenAI-compatible chat client where every call is bounded."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import anyio
import httpx
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from . import _exceptions as exc
from ._breaker import Breaker, BreakerRegistry, CircuitState
from ._call import Call, new_request_id
from ._completions import Chat
from ._config import UNSET, Limits, Timeouts, TimeoutTypes, Unset
from ._inflight import InflightCall, current_tags
from ._models import ChatCompletion
from ._pacer import Pacer, PacerState, Pacing, Permit, is_overload
from ._request import Body
from ._retry import Retry, RetryBudget, TokenBucket, make_retrying
from ._status import read_status_error
from ._stream import AsyncStream, close_response
from ._telemetry import CallTelemetry, Telemetry

__all__ = ["Client"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
_NO_RETRY = Retry(attempts=1)
_USER_AGENT = "stallproof/0.1"


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
        http_client: an ``httpx.AsyncClient`` to use instead of the client's own. Its own
            timeouts are overridden per request by ours; it is not closed by `aclose`.
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
        if not isinstance(limits, Limits):
            raise exc.InvalidRequestError(f"limits must be a Limits, got {limits!r}")
        try:
            url = httpx.URL(str(base_url))
        except httpx.InvalidURL as e:
            raise exc.InvalidRequestError(f"invalid base_url: {e}") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise exc.InvalidRequestError(
                f"base_url must be an absolute http(s) URL, got {str(base_url)!r}"
            )
        self.base_url = url.copy_with(path=url.path.rstrip("/") + "/")
        self._upstream = str(self.base_url)
        # Joined once: httpx's URL.join costs ~0.4 ms, a third of our per-call overhead.
        self._chat_url = self.base_url.join("chat/completions")
        self.timeout = Timeouts.coerce(timeout)
        self.limits = limits
        self._api_key = api_key
        headers = {"user-agent": _USER_AGENT, "accept": "application/json"}
        headers.update(default_headers or {})
        self._headers = httpx.Headers(headers)
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient(
            limits=httpx.Limits(
                max_connections=limits.max_connections,
                max_keepalive_connections=limits.max_keepalive_connections,
                keepalive_expiry=limits.keepalive_expiry,
            ),
            trust_env=trust_env,
            follow_redirects=False,
        )
        if retry is not None and not isinstance(retry, Retry):
            raise exc.InvalidRequestError(f"retry must be a Retry or None, got {retry!r}")
        self.retry = retry or _NO_RETRY
        self._bucket = TokenBucket(retry_budget) if retry_budget is not None else None
        self._breakers = BreakerRegistry(breaker) if breaker is not None else None
        if pacer is not None and not isinstance(pacer, Pacer):
            raise exc.InvalidRequestError(f"pacer must be a Pacer or None, got {pacer!r}")
        self._pacing = Pacing(pacer) if pacer is not None else None
        self._rng = random.Random()
        self._calls: dict[int, Call] = {}
        self._telemetry = Telemetry(
            server_address=url.host,
            server_port=url.port or (443 if url.scheme == "https" else 80),
            provider_name=provider_name,
            record_content=record_content,
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            circuits=self.circuits,
        )
        self.chat = Chat(self)

    def inflight(self, *, stalled_after: float = 5.0) -> tuple[InflightCall, ...]:
        """Every call of this client in progress right now, longest-running first.

        A call is ``stalled`` when it made no progress (phase change, content chunk, body
        bytes) for more than ``stalled_after`` seconds and its deadline has not fired.
        Streams stay in flight until they end or are closed. See `format_inflight`.
        """
        now = anyio.current_time()
        calls = [c.snapshot(now, stalled_after) for c in list(self._calls.values())]
        return tuple(sorted(calls, key=lambda c: -c.elapsed))

    @property
    def retry_tokens(self) -> float | None:
        """Tokens left in the client's retry budget (None without a budget)."""
        return self._bucket.tokens if self._bucket is not None else None

    def pacer_state(self) -> PacerState | None:
        """A snapshot of the pacer: limit, in use, queued per agent (None without one)."""
        return self._pacing.snapshot() if self._pacing is not None else None

    def circuits(self) -> dict[str, CircuitState]:
        """A snapshot of every upstream's circuit breaker (empty without a `Breaker`)."""
        return self._breakers.snapshot() if self._breakers is not None else {}

    @property
    def api_key(self) -> str | None:
        return self._api_key

    def __repr__(self) -> str:
        key = "None" if self._api_key is None else "'***'"
        return f"<stallproof.Client base_url={str(self.base_url)!r} api_key={key}>"

    async def aclose(self) -> None:
        """Close the client's connections (not those of an ``http_client`` passed in)."""
        if self._owns_http:
            await self._http.aclose()

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

    def _resolve_timeouts(self, timeout: TimeoutTypes | Unset | None) -> Timeouts:
        if timeout is UNSET or timeout is None:
            return self.timeout
        return Timeouts.coerce(timeout, base=self.timeout)

    def _build_request(
        self,
        path: str,
        body: dict[str, Any],
        call: Call,
        extra_headers: Mapping[str, str] | None,
        extra_query: Mapping[str, Any] | None,
    ) -> httpx.Request:
        headers = httpx.Headers(self._headers)
        headers["x-request-id"] = call.request_id
        if extra_headers:
            for name, value in extra_headers.items():
                if value is None:  # openai's way to remove a default header
                    headers.pop(name, None)
                else:
                    headers[name] = value
            call.request_id = headers.get("x-request-id", call.request_id)
        try:
            content = json.dumps(body, ensure_ascii=False, allow_nan=False).encode()
        except (TypeError, ValueError) as e:
            raise exc.InvalidRequestError(f"request body is not JSON-serialisable: {e}") from None
        headers["content-type"] = "application/json"
        if call.stream:
            headers["accept"] = "text/event-stream"
        t = call.timeouts
        request = self._http.build_request(
            "POST",
            self._chat_url if path == "chat/completions" else self.base_url.join(path),
            content=content,
            headers=headers,
            params=dict(extra_query) if extra_query else None,
            timeout=httpx.Timeout(connect=t.connect, read=t.read, write=t.write, pool=t.pool),
            extensions={"trace": call.trace},
        )
        request.stream = Body(content)
        return request

    def _resolve_retry(self, retry: Retry | Unset | None) -> Retry:
        if retry is UNSET:
            return self.retry
        if retry is None:
            return _NO_RETRY
        if not isinstance(retry, Retry):
            raise exc.InvalidRequestError(f"retry must be a Retry or None, got {retry!r}")
        return retry

    async def _chat(
        self,
        body: dict[str, Any],
        *,
        stream: bool,
        timeout: TimeoutTypes | Unset | None,
        retry: Retry | Unset | None,
        agent: str | None,
        labels: Mapping[str, str] | None,
        extra_headers: Mapping[str, str] | None,
        extra_query: Mapping[str, Any] | None,
    ) -> ChatCompletion | AsyncStream:
        model = str(body["model"])
        circuit = None
        if self._breakers is not None:
            circuit = self._breakers.circuit(self._upstream, model)
            circuit.check()  # while open, fail before doing any work at all
        timeouts = self._resolve_timeouts(timeout)
        policy = self._resolve_retry(retry)
        if agent is not None and not isinstance(agent, str):
            raise exc.InvalidRequestError(f"agent must be a str or None, got {agent!r}")
        if labels is not None and (
            not isinstance(labels, Mapping)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
        ):
            raise exc.InvalidRequestError(f"labels must map str to str, got {labels!r}")
        tag_agent, tag_labels = current_tags()
        call = Call(
            timeouts,
            new_request_id(),
            stream=stream,
            model=model,
            agent=agent if agent is not None else tag_agent,
            labels={**tag_labels, **(labels or {})},
            max_attempts=policy.attempts,
        )
        request = self._build_request("chat/completions", body, call, extra_headers, extra_query)
        if policy.attempts > 1 and "idempotency-key" not in request.headers:
            # The same key on every attempt lets a server drop a duplicate it already ran.
            request.headers["idempotency-key"] = f"stallproof-{call.request_id}"
        observer = call.observer = self._telemetry.start(call, body)
        call.register(self._calls)
        permit: Permit | None = None
        if self._pacing is not None:
            permit = await self._pace(call, body)
        retrying = make_retrying(
            policy, call, self._bucket, rng=self._rng, on_retry=observer.retry_scheduled
        )
        attempts = itertools.count(1)

        async def attempt() -> ChatCompletion | AsyncStream:
            n = next(attempts)
            call.start_attempt(n)
            request.headers["x-stallproof-attempt"] = f"{n}/{policy.attempts}"
            before = circuit.state if circuit is not None else ""
            ticket = circuit.admit() if circuit is not None else None
            observer.attempt_started(n, request)
            try:
                result = await self._attempt(request, call)
            except BaseException as e:
                observer.attempt_ended(e)
                if permit is not None and is_overload(e):
                    permit.overload()
                if ticket is not None:
                    ticket.failure(e, deadline_expired=call.remaining() <= 0)
                raise
            else:
                observer.attempt_ended(None, call.status_code)
                if ticket is not None:
                    ticket.success()
            finally:
                if circuit is not None and circuit.state != before:
                    observer.breaker_changed(circuit.upstream, before, circuit.state)
            return result

        try:
            with call.total_scope():
                result: ChatCompletion | AsyncStream = await retrying(attempt)
        except BaseException as e:
            observer.failed(e)
            if permit is not None:
                permit.release()
            call.unregister()
            raise
        if self._bucket is not None:
            self._bucket.record_success()
        if isinstance(result, ChatCompletion):
            _finish_completion(observer, result)
            if permit is not None:
                usage = result.usage
                permit.release(used_tokens=usage.total_tokens if usage else None, succeeded=True)
            call.unregister()
        else:
            result._permit = permit  # held until the stream ends or is closed
        return result

    async def _pace(self, call: Call, body: Mapping[str, Any]) -> Permit:
        """Wait for the pacer, inside the call's deadline; on failure the call is over."""
        assert self._pacing is not None
        call.set_phase("pacer queue")
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        estimate = self._pacing.policy.estimate_tokens(
            body.get("messages"), max_tokens=max_tokens if isinstance(max_tokens, int) else None
        )
        try:
            # Not inside total_scope: acquire is bounded by the same deadline and, unlike a
            # bare cancel scope, says the pacer is where the time went.
            return await self._pacing.acquire(
                agent=call.agent, estimated_tokens=estimate, deadline=call.total_deadline
            )
        except BaseException as e:
            if isinstance(e, exc.PacerTimeout):
                e.request_id = call.request_id
            assert call.observer is not None
            call.observer.failed(e)
            call.unregister()
            raise

    async def _attempt(self, request: httpx.Request, call: Call) -> ChatCompletion | AsyncStream:
        """One attempt: send, check the status, read the body or the stream's first content."""
        response: httpx.Response | None = None
        handed_over = False
        try:
            with call.bounded(), call.translate_errors():
                response = await self._http.send(request, stream=True)
                call.headers_received = True
                call.status_code = response.status_code
                call.server_request_id = response.headers.get(
                    "x-request-id"
                ) or response.headers.get("request-id")
                if response.status_code >= 300:
                    raise await read_status_error(response, call, self.limits.max_error_body_bytes)
                if not call.stream:
                    return await self._read_completion(response, call)
                ctype = response.headers.get("content-type", "")
                if ctype.startswith("application/json"):
                    raise call.error(
                        exc.MalformedResponse,
                        "asked for a stream but the server answered with a JSON body",
                    )
                stream = AsyncStream(response, call, self.limits)
                # Read up to the first content chunk here, inside the attempt: until then a
                # failure can still be retried, because the caller has seen nothing.
                await stream._prefetch()
                handed_over = True
                return stream
        finally:
            if response is not None and not handed_over:
                await close_response(response)

    async def _read_completion(self, response: httpx.Response, call: Call) -> ChatCompletion:
        cap = self.limits.max_response_bytes
        declared = response.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > cap:
            raise call.error(
                exc.ResponseTooLarge,
                f"Content-Length {declared} is over max_response_bytes={cap}",
                limit=cap,
            )
        buf = bytearray()
        async with contextlib.aclosing(response.aiter_bytes()) as parts:  # type: ignore[type-var]
            async for part in parts:
                call.progress(len(part))
                if not buf:
                    # The first body byte ends first_token; total still applies to the rest.
                    call.rearm(None)
                buf += part
                if len(buf) > cap:
                    raise call.error(
                        exc.ResponseTooLarge, f"body passed max_response_bytes={cap}", limit=cap
                    )
        try:
            data = json.loads(buf)
        except ValueError:
            raise call.error(
                exc.MalformedResponse,
                f"response body is not JSON ({len(buf)} bytes): {bytes(buf[:80])!r}",
            ) from None
        if not isinstance(data, dict):
            raise call.error(
                exc.MalformedResponse, f"response body is JSON {type(data).__name__}, not object"
            )
        if "error" in data and "choices" not in data:
            raise call.error(
                exc.StreamErrorEvent, "the server answered 200 with an error object", body=data
            )
        try:
            return ChatCompletion.from_dict(data)
        except exc.MalformedResponse as e:
            raise call.error(exc.MalformedResponse, e.message) from None


def _finish_completion(observer: CallTelemetry, result: ChatCompletion) -> None:
    usage = result.usage
    observer.finished(
        response_id=result.id,
        response_model=result.model,
        finish_reasons=[c.finish_reason for c in result.choices if c.finish_reason],
        input_tokens=usage.prompt_tokens if usage else None,
        output_tokens=usage.completion_tokens if usage else None,
        output_text=result.choices[0].message.content if result.choices else None,
    )
