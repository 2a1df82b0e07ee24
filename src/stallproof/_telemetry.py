"""OpenTelemetry spans and metrics, and stdlib logging, for every call.

Spans follow the OTel GenAI semantic conventions: one CLIENT span per logical call named
``chat {model}`` that covers every attempt (and, for a stream, the whole iteration), and
a child CLIENT span per HTTP attempt following the HTTP client conventions
(``http.request.resend_count`` on retries). W3C trace context is injected into each
attempt's request headers.

Only opentelemetry-api is used. With no tracer or meter provider configured, the API hands
out non-recording spans and no-op instruments: stallproof checks ``is_recording()`` before
building any attribute, so the cost is a few no-op calls. Prompts and completions are
never recorded unless ``record_content=True``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics, propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from . import _exceptions as exc

if TYPE_CHECKING:
    from collections.abc import MutableMapping

    from ._breaker import CircuitState
    from ._call import Call

__all__ = ["CallTelemetry", "Telemetry", "logger"]

logger = logging.getLogger("stallproof")

_VERSION = "0.1.0"
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


class Telemetry:
    """A client's tracer, meter and instruments."""

    def __init__(
        self,
        *,
        provider_name: str,
        record_content: bool,
        tracer_provider: trace.TracerProvider | None,
        meter_provider: metrics.MeterProvider | None,
        circuits: Any,
    ) -> None:
        self.provider_name = provider_name
        self.record_content = record_content
        self.tracer = trace.get_tracer("stallproof", _VERSION, tracer_provider=tracer_provider)
        meter = metrics.get_meter("stallproof", _VERSION, meter_provider=meter_provider)
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s", description="Duration of chat calls"
        )
        self.ttfc = meter.create_histogram(
            "gen_ai.client.operation.time_to_first_chunk",
            unit="s",
            description="Time from the start of a streamed call to its first content chunk",
        )
        self.inflight = meter.create_up_down_counter(
            "stallproof.client.inflight", unit="{call}", description="Calls in flight by phase"
        )
        self.attempts = meter.create_counter(
            "stallproof.client.attempts", unit="{attempt}", description="HTTP attempts"
        )
        self._circuits = circuits

        def observe_breakers(options: Any) -> Iterable[metrics.Observation]:
            states: Mapping[str, CircuitState] = self._circuits()
            for upstream, state in states.items():
                yield metrics.Observation(
                    _BREAKER_VALUES.get(state.state, -1), {"stallproof.upstream": upstream}
                )

        meter.create_observable_gauge(
            "stallproof.breaker.state",
            callbacks=[observe_breakers],
            description="Circuit state per upstream: 0 closed, 1 half-open, 2 open",
        )

    def start(
        self,
        call: Call,
        body: Mapping[str, Any],
        *,
        operation: str = "chat",
        server_address: str = "",
        server_port: int = 0,
    ) -> CallTelemetry:
        return CallTelemetry(self, call, body, operation, server_address, server_port)


class CallTelemetry:
    """The span, metrics and log lines of one logical call."""

    def __init__(
        self,
        t: Telemetry,
        call: Call,
        body: Mapping[str, Any],
        operation: str,
        server_address: str,
        server_port: int,
    ) -> None:
        self.t = t
        self.server_address = server_address
        self.server_port = server_port
        self.call = call
        self._attempt_span: trace.Span | None = None
        self._ended = False
        self._ttfc_recorded = False
        self._base_attrs = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": t.provider_name,
            "gen_ai.request.model": call.model,
        }
        self.span = t.tracer.start_span(
            f"{operation} {call.model}" if call.model else operation,
            kind=SpanKind.CLIENT,
            attributes=self._base_attrs,
        )
        self.recording = self.span.is_recording()
        if self.recording:
            attrs: dict[str, Any] = {
                "gen_ai.request.stream": call.stream,
                "server.address": server_address,
                "server.port": server_port,
                "stallproof.request_id": call.request_id,
            }
            for name, key in _REQUEST_PARAMS.items():
                value = body.get(name)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    attrs[key] = value
            if call.agent is not None:
                attrs["stallproof.agent"] = call.agent
            for k, v in call.labels.items():
                attrs[f"stallproof.label.{k}"] = v
            if t.record_content:
                attrs["gen_ai.input.messages"] = json.dumps(body.get("messages"), default=str)
            self.span.set_attributes(attrs)
        t.inflight.add(1, {"stallproof.phase": call.phase})
        logger.debug(
            "call started model=%s stream=%s agent=%s request_id=%s",
            call.model,
            call.stream,
            call.agent,
            call.request_id,
            extra={"stallproof_request_id": call.request_id},
        )

    # -- phases and attempts -----------------------------------------------------------------

    def phase_changed(self, old: str, new: str) -> None:
        self.t.inflight.add(-1, {"stallproof.phase": old})
        self.t.inflight.add(1, {"stallproof.phase": new})

    def attempt_started(self, n: int, url: str, carrier: MutableMapping[str, str]) -> None:
        """Start attempt ``n``'s span and put its W3C trace context in ``carrier``."""
        self._end_attempt(None)
        context = trace.set_span_in_context(self.span)
        span = self.t.tracer.start_span("POST", context=context, kind=SpanKind.CLIENT)
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
        # W3C trace context for the server, whether or not we record.
        propagate.inject(carrier, context=trace.set_span_in_context(span))

    def attempt_ended(self, error: BaseException | None, status: int | None = None) -> None:
        outcome = "ok" if error is None else type(error).__name__
        self.t.attempts.add(1, {**self._base_attrs, "stallproof.outcome": outcome})
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
                span.set_attribute("error.type", _error_type(error))
                span.set_status(Status(StatusCode.ERROR, type(error).__name__))
                if isinstance(error, exc.TimeoutException):
                    self._deadline_event(span, error)
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
        if self._ttfc_recorded:
            return
        self._ttfc_recorded = True
        ttfc = self.call.elapsed()
        self.t.ttfc.record(ttfc, self._base_attrs)
        if self.recording:
            self.span.set_attribute("gen_ai.response.time_to_first_chunk", ttfc)

    # -- the end ---------------------------------------------------------------------------

    def finished(
        self,
        *,
        response_id: str | None,
        response_model: str | None,
        finish_reasons: Sequence[str],
        input_tokens: int | None,
        output_tokens: int | None,
        output_text: str | None = None,
    ) -> None:
        if self._ended:
            return
        if self.recording:
            attrs: dict[str, Any] = {"gen_ai.response.finish_reasons": list(finish_reasons)}
            if response_id:
                attrs["gen_ai.response.id"] = response_id
            if response_model:
                attrs["gen_ai.response.model"] = response_model
            if input_tokens is not None:
                attrs["gen_ai.usage.input_tokens"] = input_tokens
            if output_tokens is not None:
                attrs["gen_ai.usage.output_tokens"] = output_tokens
            if self.call.server_request_id:
                attrs["stallproof.server_request_id"] = self.call.server_request_id
            if self.t.record_content and output_text is not None:
                attrs["gen_ai.output.messages"] = json.dumps(
                    [{"role": "assistant", "content": output_text}]
                )
            self.span.set_attributes(attrs)
        self._end(None)

    def failed(self, error: BaseException) -> None:
        if self._ended:
            return
        if isinstance(error, BaseException) and not isinstance(error, Exception):
            # The caller's cancellation: not an error of the call, but the span ends.
            if self.recording:
                self.span.set_attribute("error.type", "cancelled")
            self._end(error, status_error=False)
            return
        if self.recording:
            self.span.set_attribute("error.type", _error_type(error))
            if self.call.server_request_id:
                self.span.set_attribute("stallproof.server_request_id", self.call.server_request_id)
            self.span.set_status(Status(StatusCode.ERROR, type(error).__name__))
            if isinstance(error, exc.TimeoutException):
                self._deadline_event(self.span, error)
        logger.info(
            "call failed: %s: %s",
            type(error).__name__,
            error,
            extra={"stallproof_request_id": self.call.request_id},
        )
        self._end(error)

    def _end(self, error: BaseException | None, status_error: bool = True) -> None:
        self._ended = True
        self._end_attempt(error)
        attrs = dict(self._base_attrs)
        if error is not None:
            attrs["error.type"] = _error_type(error) if status_error else "cancelled"
        self.t.duration.record(self.call.elapsed(), attrs)
        self.t.inflight.add(-1, {"stallproof.phase": self.call.phase})
        self.span.end()
        if error is None:
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


def _error_type(error: BaseException) -> str:
    if isinstance(error, exc.StallproofError):
        return f"stallproof.{type(error).__name__}"
    return type(error).__qualname__
