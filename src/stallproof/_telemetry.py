"""OpenTelemetry spans and metrics, and stdlib logging, for every call.

Spans follow the OTel GenAI semantic conventions: one CLIENT span per logical call named
``chat {model}`` that covers every attempt (and, for a stream, the whole iteration), and
a child CLIENT span per HTTP attempt following the HTTP client conventions
(``http.request.resend_count`` on retries). W3C trace context is injected into each
attempt's request headers.

While an attempt runs its span is the current span, and HTTP client instrumentation
(``opentelemetry-instrumentation-httpx``) is suppressed for it: the engine's attempt span
*is* the HTTP client span, so a trace has exactly one per attempt, in the caller's trace,
and the ``traceparent`` on the wire is that span's.

Metrics follow the GenAI conventions too: ``gen_ai.client.operation.duration``,
``gen_ai.client.token.usage`` (by ``gen_ai.token.type``),
``gen_ai.client.operation.time_to_first_chunk`` and ``..time_per_output_chunk``, with the
bucket boundaries the conventions advise and ``server.address``, ``server.port``,
``gen_ai.response.model`` and ``error.type`` as attributes.

Only opentelemetry-api is used. With no tracer or meter provider configured, the API hands
out non-recording spans and no-op instruments: stallproof checks ``is_recording()`` before
building any attribute. A call that would record nothing at all and send no trace context
(`Instruments.quiet`: no provider behind the API, no span or baggage in the context to
propagate) skips the spans and instruments altogether. Prompts and completions are never
recorded unless ``record_content=True``.
"""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import baggage, metrics, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from . import _exceptions as exc
from ._version import __version__

if TYPE_CHECKING:
    from collections.abc import MutableMapping

    from ._breaker import CircuitState
    from ._call import Call
    from ._progress import Outcome

__all__ = ["CallTelemetry", "Instruments", "infer_provider", "logger"]

logger = logging.getLogger("stallproof")

_REQUEST_PARAMS = {
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
    "seed": "gen_ai.request.seed",
}
_BREAKER_VALUES = {"closed": 0, "half-open": 1, "open": 2}

# Bucket boundaries the GenAI conventions advise (the SDK's defaults, 0-10,000 in steps
# meant for milliseconds, would put nearly every call in the first two buckets).
DURATION_BUCKETS = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)
CHUNK_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
TOKEN_BUCKETS = (
    1,
    4,
    16,
    64,
    256,
    1024,
    4096,
    16384,
    65536,
    262144,
    1048576,
    4194304,
    16777216,
    67108864,
)

# The context key HTTP client instrumentations check before making a span of their own
# (opentelemetry.instrumentation.utils.is_http_instrumentation_enabled); the key object
# lives in opentelemetry-api, so no instrumentation package is needed to set it.
_SUPPRESS_HTTP = getattr(otel_context, "_SUPPRESS_HTTP_INSTRUMENTATION_KEY", None)

# Hosts whose provider is certain; anything else is named by the API it speaks.
_PROVIDER_HOSTS = (
    ("api.openai.com", "openai"),
    (".openai.azure.com", "azure.ai.openai"),
    (".services.ai.azure.com", "azure.ai.inference"),
    (".models.ai.azure.com", "azure.ai.inference"),
    ("api.anthropic.com", "anthropic"),
    ("generativelanguage.googleapis.com", "gcp.gemini"),
    ("aiplatform.googleapis.com", "gcp.vertex_ai"),
    ("api.mistral.ai", "mistral_ai"),
    ("api.groq.com", "groq"),
    ("api.deepseek.com", "deepseek"),
    ("api.x.ai", "x_ai"),
    ("api.perplexity.ai", "perplexity"),
    ("api.cohere.com", "cohere"),
    ("api.cohere.ai", "cohere"),
    (".amazonaws.com", "aws.bedrock"),
    (".cloud.ibm.com", "ibm.watsonx.ai"),
)


def infer_provider(host: str, path: str = "") -> str:
    """``gen_ai.provider.name`` for a call to ``host``: the provider when the host is a
    well-known one, else the API the call speaks (``anthropic`` for the Messages API,
    ``openai`` for the rest) — as the official OpenAI instrumentation does for any
    base_url. Pass ``provider_name=`` to a client to name a self-hosted server.
    """
    host = host.lower().rstrip(".")
    for suffix, provider in _PROVIDER_HOSTS:
        if host == suffix.lstrip(".") or (suffix.startswith(".") and host.endswith(suffix)):
            if provider == "aws.bedrock" and not host.startswith("bedrock"):
                continue
            return provider
    if path.split("?", 1)[0].rstrip("/").endswith("/messages"):
        return "anthropic"
    return "openai"


class Instruments:
    """A client's tracer, meter and instruments."""

    def __init__(
        self,
        *,
        provider_name: str | None,
        record_content: bool,
        tracer_provider: trace.TracerProvider | None,
        meter_provider: metrics.MeterProvider | None,
        circuits: Callable[[], Mapping[str, CircuitState]],
    ) -> None:
        self.provider_name = provider_name
        self.record_content = record_content
        self.tracer = trace.get_tracer("stallproof", __version__, tracer_provider=tracer_provider)
        # A tracer of the API's own: no-op, or (a proxy) no-op until a provider is set.
        self._noop_tracer = isinstance(self.tracer, trace.NoOpTracer)
        self._proxy_tracer = isinstance(self.tracer, trace.ProxyTracer)
        meter = metrics.get_meter("stallproof", __version__, meter_provider=meter_provider)
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.ttfc = meter.create_histogram(
            "gen_ai.client.operation.time_to_first_chunk",
            unit="s",
            description="Time from the start of a streamed call to its first content chunk.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.per_chunk = meter.create_histogram(
            "gen_ai.client.operation.time_per_output_chunk",
            unit="s",
            description="Time between two content chunks of a stream, after the first.",
            explicit_bucket_boundaries_advisory=CHUNK_BUCKETS,
        )
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        )
        self.inflight = meter.create_up_down_counter(
            "stallproof.client.inflight", unit="{call}", description="Calls in flight by phase"
        )
        self.attempts = meter.create_counter(
            "stallproof.client.attempts", unit="{attempt}", description="HTTP attempts"
        )
        # The meter keeps the gauge's callback for ever (the API's proxy meter does, to
        # hand it to an SDK installed later): the callback holds the engine weakly, or
        # every engine made would stay alive, and in `stallproof.inflight()`.
        weak_circuits = weakref.WeakMethod(circuits)

        def observe_breakers(options: Any) -> Iterable[metrics.Observation]:
            circuits = weak_circuits()
            states: Mapping[str, CircuitState] = circuits() if circuits is not None else {}
            for upstream, state in states.items():
                yield metrics.Observation(
                    _BREAKER_VALUES.get(state.state, -1), {"stallproof.upstream": upstream}
                )

        meter.create_observable_gauge(
            "stallproof.breaker.state",
            callbacks=[observe_breakers],
            description="Circuit state per upstream: 0 closed, 1 half-open, 2 open",
        )

    def quiet(self) -> bool:
        """Whether a call starting now would record nothing and send no trace context.

        True when neither a tracer nor a meter stands behind the API (its no-op defaults,
        or its proxies before a provider is set), the context holds no valid span to
        parent the call's, and the propagators would write nothing (the defaults, no
        baggage). Such a call's `CallTelemetry` makes no span and touches no instrument:
        what the API would have done with them is nothing.
        """
        return (
            self._metrics_off()
            and self._tracing_off()
            and not trace.get_current_span().get_span_context().is_valid
            and _default_propagation()
            and not baggage.get_all()
        )

    def _tracing_off(self) -> bool:
        if self._noop_tracer:
            return True
        # A proxy tracer stays the no-op one until a global provider is set.
        return self._proxy_tracer and isinstance(
            trace.get_tracer_provider(), trace.ProxyTracerProvider
        )

    def _metrics_off(self) -> bool:
        # The API's instruments: no-op ones (a NoOpMeterProvider's), or the global proxy
        # meter's, which do nothing until an SDK is set (``_real_instrument`` is None;
        # an instrument without that attribute is taken for a real one).
        instrument = self.inflight
        return isinstance(instrument, metrics.NoOpUpDownCounter) or (
            getattr(instrument, "_real_instrument", self) is None
        )

    def start(
        self,
        call: Call,
        body: Mapping[str, Any],
        *,
        operation: str = "chat",
        server_address: str = "",
        server_port: int = 0,
        path: str = "",
    ) -> CallTelemetry:
        provider = self.provider_name or infer_provider(server_address, path)
        return CallTelemetry(self, call, body, operation, provider, server_address, server_port)

    def start_quiet(self, call: Call) -> CallTelemetry:
        """The telemetry of a call started while `quiet`: log lines only."""
        return CallTelemetry(self, call, {}, "", "", "", 0, quiet=True)


class CallTelemetry:
    """The span, metrics and log lines of one logical call."""

    def __init__(
        self,
        instruments: Instruments,
        call: Call,
        body: Mapping[str, Any],
        operation: str,
        provider: str,
        server_address: str,
        server_port: int,
        *,
        quiet: bool = False,
    ) -> None:
        self.instruments = instruments
        self.server_address = server_address
        self.server_port = server_port
        self.call = call
        self._attempt_span: trace.Span | None = None
        self._ended = False
        self._last_chunk: float | None = None
        # Nothing to record or propagate (`Instruments.quiet`): no span, no instrument.
        self._quiet = quiet
        if quiet:
            self._base_attrs: dict[str, Any] = {}
            self.span: trace.Span = trace.INVALID_SPAN
            self.recording = False
            _log_start(call)
            return
        # Attributes of every metric point (and of the span from its start).
        self._base_attrs = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": call.model,
            "server.address": server_address,
            "server.port": server_port,
        }
        self.span = instruments.tracer.start_span(
            f"{operation} {call.model}" if call.model else operation,
            kind=SpanKind.CLIENT,
            attributes=self._base_attrs,
        )
        self.recording = self.span.is_recording()
        if self.recording:
            attrs: dict[str, Any] = {
                "gen_ai.request.stream": call.stream,
                "stallproof.request_id": call.request_id,
            }
            attrs.update(_request_attributes(body))
            if call.agent is not None:
                attrs["gen_ai.agent.name"] = call.agent
            for k, v in call.labels.items():
                attrs[f"stallproof.label.{k}"] = v
            if instruments.record_content:
                attrs["gen_ai.input.messages"] = json.dumps(body.get("messages"), default=str)
            self.span.set_attributes(attrs)
        instruments.inflight.add(1, {"stallproof.phase": call.phase})
        _log_start(call)

    # -- phases and attempts -----------------------------------------------------------------

    def phase_changed(self, old: str, new: str) -> None:
        if self._quiet:
            return
        self.instruments.inflight.add(-1, {"stallproof.phase": old})
        self.instruments.inflight.add(1, {"stallproof.phase": new})

    def enter_attempt(self, n: int, url: str) -> tuple[Mapping[str, str], object]:
        """Start attempt ``n``'s span and make it the current span until `exit_attempt`.

        Returns the W3C trace-context headers to send and the token `exit_attempt` takes.
        HTTP client instrumentation is suppressed meanwhile: this span is the attempt's
        HTTP client span, so no second one (in another trace) is made and the
        ``traceparent`` sent is this span's. The span itself ends in `attempt_ended`.
        """
        if self._quiet:
            return _NO_CARRIER, None
        carrier: dict[str, str] = {}
        self.attempt_started(n, url, carrier)
        span = self._attempt_span
        assert span is not None
        if not carrier and _inert(span):
            # No trace at all (no SDK, no parent, nothing to propagate): nothing inside
            # the attempt could use the span, so it is not made current.
            return carrier, None
        ctx = trace.set_span_in_context(span)
        if _SUPPRESS_HTTP is not None:
            ctx = otel_context.set_value(_SUPPRESS_HTTP, True, ctx)
        return carrier, otel_context.attach(ctx)

    @staticmethod
    def exit_attempt(token: object) -> None:
        """Restore the context `enter_attempt` replaced (None: it replaced none)."""
        if token is not None:
            otel_context.detach(token)  # type: ignore[arg-type]

    def attempt_started(self, n: int, url: str, carrier: MutableMapping[str, str]) -> None:
        """Start attempt ``n``'s span and put its W3C trace context in ``carrier``."""
        self._end_attempt(None)
        context = trace.set_span_in_context(self.span)
        span = self.instruments.tracer.start_span("POST", context=context, kind=SpanKind.CLIENT)
        self._attempt_span = span
        if span.is_recording():
            attrs: dict[str, Any] = {
                "http.request.method": "POST",
                "url.full": url,
                "server.address": self.server_address,
                "server.port": self.server_port,
            }
            if n > 1:
                attrs["http.request.resend_count"] = n - 1
            span.set_attributes(attrs)
        # W3C trace context for the server, whether or not we record (a sampled-out span
        # still carries its trace id); skipped only when the default propagators would
        # write nothing: no valid span and no baggage.
        if not _inert(span) or not _default_propagation() or baggage.get_all():
            propagate.inject(carrier, context=trace.set_span_in_context(span))

    def attempt_ended(self, error: BaseException | None, status: int | None = None) -> None:
        if self._quiet:
            return
        outcome = "ok" if error is None else self._error_type(error)
        self.instruments.attempts.add(1, {**self._base_attrs, "stallproof.outcome": outcome})
        self._end_attempt(error, status)

    def _end_attempt(self, error: BaseException | None, status: int | None = None) -> None:
        span = self._attempt_span
        if span is None:
            return
        self._attempt_span = None
        if span.is_recording():
            if status is None and isinstance(error, exc.APIStatusError):
                status = error.status_code
            if status is not None:
                span.set_attribute("http.response.status_code", status)
            if error is not None:
                # An HTTP client span names a failed status by its code (HTTP conventions).
                error_type = str(status) if status and status >= 400 else self._error_type(error)
                span.set_attribute("error.type", error_type)
                span.set_status(Status(StatusCode.ERROR, error_type))
                fired = self._fired(error)
                if fired is not None:
                    self._deadline_event(span, fired)
        span.end()

    def retry_scheduled(self, error: BaseException, delay: float) -> None:
        if self.recording:
            self.span.add_event(
                "stallproof.retry_scheduled",
                {
                    "stallproof.retry.delay": delay,
                    "stallproof.retry.reason": type(error).__name__,
                    "stallproof.retry.attempt": self.call.attempt + 1,
                },
            )

    def breaker_changed(self, upstream: str, old: str, new: str) -> None:
        if self.recording:
            self.span.add_event(
                "stallproof.breaker_state_change",
                {
                    "stallproof.upstream": upstream,
                    "stallproof.breaker.from": old,
                    "stallproof.breaker.to": new,
                },
            )
        logger.warning(
            "circuit for %s went %s -> %s request_id=%s",
            upstream,
            old,
            new,
            self.call.request_id,
            extra={"stallproof_request_id": self.call.request_id},
        )

    def first_chunk(self) -> None:
        """The stream's first content chunk arrived (later calls are no-ops)."""
        if self._last_chunk is not None or self._quiet:
            return
        ttfc = self.call.elapsed()
        self._last_chunk = ttfc
        self.instruments.ttfc.record(ttfc, self._base_attrs)
        if self.recording:
            self.span.set_attribute("gen_ai.response.time_to_first_chunk", ttfc)

    def chunk(self) -> None:
        """A content chunk arrived: the first sets time to first chunk, each later one
        records the time since the one before (``time_per_output_chunk``)."""
        if self._quiet:
            return
        if self._last_chunk is None:
            self.first_chunk()
            return
        now = self.call.elapsed()
        self.instruments.per_chunk.record(now - self._last_chunk, self._base_attrs)
        self._last_chunk = now

    # -- the end ---------------------------------------------------------------------------

    def finished(self, outcome: Outcome) -> None:
        """The call succeeded: response attributes, token usage, and the end of the span."""
        if self._ended:
            return
        if self._quiet:
            self._end(None)
            return
        if outcome.response_model:
            self._base_attrs["gen_ai.response.model"] = outcome.response_model
        usage = {"input": outcome.input_tokens, "output": outcome.output_tokens}
        for kind, count in usage.items():
            if count is not None:
                self.instruments.tokens.record(
                    count, {**self._base_attrs, "gen_ai.token.type": kind}
                )
        if self.recording:
            attrs: dict[str, Any] = {"gen_ai.response.finish_reasons": list(outcome.finish_reasons)}
            optional = {
                "gen_ai.response.id": outcome.response_id,
                "gen_ai.response.model": outcome.response_model,
                "gen_ai.usage.input_tokens": outcome.input_tokens,
                "gen_ai.usage.output_tokens": outcome.output_tokens,
                "gen_ai.usage.cache_read.input_tokens": outcome.cache_read_tokens,
                "gen_ai.usage.reasoning.output_tokens": outcome.reasoning_tokens,
                "openai.response.service_tier": outcome.service_tier,
                "openai.response.system_fingerprint": outcome.system_fingerprint,
                "stallproof.server_request_id": self.call.server_request_id,
            }
            attrs.update((k, v) for k, v in optional.items() if v is not None and v != "")
            if self.instruments.record_content and outcome.text is not None:
                attrs["gen_ai.output.messages"] = json.dumps(
                    [{"role": "assistant", "content": "".join(outcome.text)}]
                )
            self.span.set_attributes(attrs)
        self._end(None)

    def failed(self, error: BaseException) -> None:
        if self._ended:
            return
        error_type = self._error_type(error)
        if not isinstance(error, Exception) and error_type == "cancelled":
            # The caller's cancellation: not an error of the call, but the span ends.
            if self.recording:
                self.span.set_attribute("error.type", error_type)
            self._end(error)
            return
        if self.recording:
            self.span.set_attribute("error.type", error_type)
            if self.call.server_request_id:
                self.span.set_attribute("stallproof.server_request_id", self.call.server_request_id)
            self.span.set_status(Status(StatusCode.ERROR, error_type))
            fired = self._fired(error)
            if fired is not None:
                self._deadline_event(self.span, fired)
        logger.info(
            "call failed: %s: %s",
            type(error).__name__,
            error,
            extra={"stallproof_request_id": self.call.request_id},
        )
        self._end(error)

    def _end(self, error: BaseException | None) -> None:
        self._ended = True
        if not self._quiet:
            self._end_attempt(error)
            attrs = dict(self._base_attrs)
            if error is not None:
                attrs["error.type"] = self._error_type(error)
            self.instruments.duration.record(self.call.elapsed(), attrs)
            self.instruments.inflight.add(-1, {"stallproof.phase": self.call.phase})
            self.span.end()
        if error is None and logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "call finished in %.3fs request_id=%s",
                self.call.elapsed(),
                self.call.request_id,
                extra={"stallproof_request_id": self.call.request_id},
            )

    def _deadline_event(self, span: trace.Span, error: exc.TimeoutException) -> None:
        span.add_event(
            "stallproof.deadline_expired",
            {
                "stallproof.bound": error.bound,
                "stallproof.limit": error.limit,
                "stallproof.elapsed": error.elapsed,
                "stallproof.phase": error.phase or "",
            },
        )

    def _fired(self, error: BaseException) -> exc.TimeoutException | None:
        """The bound behind ``error``: itself, or the total deadline that cancelled it."""
        if isinstance(error, exc.TimeoutException):
            return error
        if not isinstance(error, Exception) and self.call.remaining() <= 0:
            # Cancelled by the call's own total deadline (or an enclosing deadline()
            # scope), which raises its timeout only after this attempt has unwound.
            return self.call.timeout_error("total")
        return None

    def _error_type(self, error: BaseException) -> str:
        """``error.type``: the stallproof class, naming the bound that fired, or the
        exception's own name; ``cancelled`` when the caller cancelled the call."""
        fired = self._fired(error)
        if fired is not None:
            error = fired
        elif not isinstance(error, Exception):
            return "cancelled"
        if isinstance(error, exc.StallproofError):
            return f"stallproof.{type(error).__name__}"
        return type(error).__qualname__


_NO_CARRIER: Mapping[str, str] = {}


def _log_start(call: Call) -> None:
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "call started model=%s stream=%s agent=%s request_id=%s",
            call.model,
            call.stream,
            call.agent,
            call.request_id,
            extra={"stallproof_request_id": call.request_id},
        )


def _inert(span: trace.Span) -> bool:
    """A span of no trace: not recording, with no valid context (OpenTelemetry's no-op)."""
    return not span.is_recording() and not span.get_span_context().is_valid


_textmap_checked: tuple[object, bool] = (None, False)


def _default_propagation() -> bool:
    """Whether the global propagator is W3C trace context and/or baggage only (the API's
    default), which writes nothing for an invalid span and empty baggage."""
    global _textmap_checked
    textmap = propagate.get_global_textmap()
    if _textmap_checked[0] is not textmap:
        parts: list[object] = [textmap]
        if isinstance(textmap, CompositePropagator):
            parts = list(textmap._propagators)
        known = (TraceContextTextMapPropagator, W3CBaggagePropagator)
        _textmap_checked = (textmap, all(type(p) in known for p in parts))
    return _textmap_checked[1]


def _request_attributes(body: Mapping[str, Any]) -> dict[str, Any]:
    """The GenAI request attributes the body has data for."""
    attrs: dict[str, Any] = {}
    for name, key in _REQUEST_PARAMS.items():
        value = body.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            attrs[key] = value
    n = body.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and n != 1:
        attrs["gen_ai.request.choice.count"] = n
    stop = body.get("stop", body.get("stop_sequences"))
    if isinstance(stop, str):
        attrs["gen_ai.request.stop_sequences"] = [stop]
    elif isinstance(stop, list) and all(isinstance(x, str) for x in stop):
        attrs["gen_ai.request.stop_sequences"] = list(stop)
    fmt = body.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind in ("json_object", "json_schema"):
        attrs["gen_ai.output.type"] = "json"
    elif kind == "text":
        attrs["gen_ai.output.type"] = "text"
    tier = body.get("service_tier")
    if isinstance(tier, str):
        attrs["openai.request.service_tier"] = tier
    return attrs
