"""One exception tree for everything a call can end with.

```
StallproofError
├── TimeoutException               a bound fired; .bound, .limit, .elapsed, .phase
│   ├── ConnectTimeout             TCP/TLS connect took longer than `connect`
│   ├── ReadTimeout                one socket read waited longer than `read`
│   ├── WriteTimeout               one socket write waited longer than `write`
│   ├── PoolTimeout                no pooled connection within `pool`
│   ├── FirstTokenTimeout          no content within `first_token` of sending
│   ├── IdleTimeout                no content event for `idle` mid-stream
│   └── TotalTimeout               the call's whole budget (`total`) ran out
│       ├── DeadlineExceeded       a `stallproof.deadline()` scope around the call ran out
│       ├── RetryWouldExceedDeadline   the next retry's wait would not fit in the time left
│       └── PacerTimeout           the deadline ran out (or was sure to) in the pacer queue
├── TransportError                 the connection failed underneath us
│   ├── ConnectError               could not connect (refused, unreachable, DNS)
│   └── ConnectionLost             reset or closed before a response was complete
├── ProtocolError                  the server answered, but not in a shape we accept
│   ├── MalformedResponse          invalid JSON or SSE, or fields of the wrong type
│   ├── TruncatedResponse          the body or stream ended early
│   └── ResponseTooLarge           a size cap (`max_response_bytes`, `max_line_bytes`) hit
├── APIStatusError                 a non-2xx answer; .status_code, .body, .request_id
│   ├── BadRequestError (400) · AuthenticationError (401) · PermissionDeniedError (403)
│   ├── NotFoundError (404) · ConflictError (409) · UnprocessableEntityError (422)
│   ├── RateLimitError (429)
│   └── InternalServerError (>= 500)
├── StreamErrorEvent               the server sent an error event inside a 200 stream
├── CircuitOpen                    the upstream's circuit breaker is open: not sent at all
└── InvalidRequestError            bad arguments from the caller (also a ValueError)
```

Every error carries the call's `request_id` (ours, sent as `x-request-id`) and, when the
server sent one, `server_request_id`. No message ever contains a header value, so API keys
cannot leak through an exception.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "APIStatusError",
    "AuthenticationError",
    "BadRequestError",
    "CircuitOpen",
    "ConflictError",
    "ConnectError",
    "ConnectTimeout",
    "ConnectionLost",
    "DeadlineExceeded",
    "FirstTokenTimeout",
    "IdleTimeout",
    "InternalServerError",
    "InvalidRequestError",
    "MalformedResponse",
    "NotFoundError",
    "PacerTimeout",
    "PermissionDeniedError",
    "PoolTimeout",
    "ProtocolError",
    "RateLimitError",
    "ReadTimeout",
    "ResponseTooLarge",
    "RetryWouldExceedDeadline",
    "StallproofError",
    "StreamErrorEvent",
    "TimeoutException",
    "TotalTimeout",
    "TransportError",
    "TruncatedResponse",
    "UnprocessableEntityError",
    "WriteTimeout",
]


class StallproofError(Exception):
    """Root of every error stallproof raises.

    Attributes:
        request_id: the id stallproof sent as ``x-request-id`` (None before a call started).
        server_request_id: the server's ``x-request-id`` / ``request-id`` header, if it sent one.
        elapsed: seconds from the start of the call to the error, if known.
        phase: the phase the call was in (``"connecting"``, ``"awaiting headers"``...).
    """

    def __init__(
        self,
        message: str,
        *,
        request_id: str | None = None,
        server_request_id: str | None = None,
        elapsed: float | None = None,
        phase: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.request_id = request_id
        self.server_request_id = server_request_id
        self.elapsed = elapsed
        self.phase = phase

    def __str__(self) -> str:
        parts = [self.message]
        if self.request_id is not None:
            parts.append(f"request_id={self.request_id}")
        if self.server_request_id is not None:
            parts.append(f"server_request_id={self.server_request_id}")
        return " ".join(parts) if len(parts) == 1 else f"{parts[0]} ({', '.join(parts[1:])})"


class TimeoutException(StallproofError):
    """A bound fired. ``bound`` names it; ``limit`` is its configured value in seconds."""

    bound: str = "total"

    def __init__(
        self,
        message: str | None = None,
        *,
        limit: float,
        elapsed: float,
        phase: str | None = None,
        request_id: str | None = None,
        server_request_id: str | None = None,
    ) -> None:
        if message is None:
            where = f" while {phase}" if phase else ""
            message = (
                f"{self.bound} timeout: the {self.bound} bound of {limit:g}s fired"
                f" after {elapsed:.3f}s{where}"
            )
        super().__init__(
            message,
            request_id=request_id,
            server_request_id=server_request_id,
            elapsed=elapsed,
            phase=phase,
        )
        self.limit = limit
        self.elapsed: float = elapsed


class ConnectTimeout(TimeoutException):
    """Opening the TCP (and TLS) connection took longer than ``Timeouts.connect``."""

    bound = "connect"


class ReadTimeout(TimeoutException):
    """A single socket read waited longer than ``Timeouts.read``.

    This bound resets on every byte: a server trickling bytes never trips it. ``idle``,
    ``first_token`` and ``total`` are the bounds that end such a call.
    """

    bound = "read"


class WriteTimeout(TimeoutException):
    """A single socket write waited longer than ``Timeouts.write`` (the peer stopped reading)."""

    bound = "write"


class PoolTimeout(TimeoutException):
    """No connection from the pool became free within ``Timeouts.pool``."""

    bound = "pool"


class FirstTokenTimeout(TimeoutException):
    """No content arrived within ``Timeouts.first_token`` of sending the request."""

    bound = "first_token"


class IdleTimeout(TimeoutException):
    """A stream went ``Timeouts.idle`` without a content-bearing event.

    SSE comments, pings, empty deltas and keep-alive bytes do not count as content.
    """

    bound = "idle"


class TotalTimeout(TimeoutException):
    """The whole call, retries, waits and stream included, ran past ``Timeouts.total``."""

    bound = "total"


class DeadlineExceeded(TotalTimeout):
    """A `stallproof.deadline()` scope ran out: the call (or the block) had no time left.

    Attributes:
        scope: the scope's name (``deadline(name=...)``).

    ``limit`` is the scope's budget in seconds and ``elapsed`` the time since the scope
    began when raised by the scope itself, or since the call began when raised by a call.
    """

    bound = "deadline"

    def __init__(self, message: str | None = None, *, scope: str, **kwargs: Any) -> None:
        if message is None:
            phase = kwargs.get("phase")
            where = f" while {phase}" if phase else ""
            message = (
                f"deadline {scope!r} of {kwargs['limit']:g}s ran out after "
                f"{kwargs['elapsed']:.3f}s{where}"
            )
        super().__init__(message, **kwargs)
        self.scope = scope


class RetryWouldExceedDeadline(TotalTimeout):
    """A retry was due, but its wait (backoff or the server's Retry-After) would not fit in
    the time left, so the call failed at once instead of sleeping into a certain timeout.

    The error that ended the last attempt is ``__cause__``.

    Attributes:
        retry_after: the wait that did not fit, in seconds.
        remaining: the time that was left of the total budget.
    """

    def __init__(
        self, message: str, *, retry_after: float, remaining: float, **kwargs: Any
    ) -> None:
        super().__init__(message, **kwargs)
        self.retry_after = retry_after
        self.remaining = remaining


class PacerTimeout(TotalTimeout):
    """The call's total deadline passed, or was sure to pass, while it waited in the pacer.

    Raised at once, without waiting, when the per-minute limits show that capacity cannot
    arrive before the deadline. Nothing was sent.

    Attributes:
        agent: the agent whose queue the call was in (None: the default queue).
        ahead: calls queued before it in that agent's queue.
        waited: seconds it spent in the queue (0 when it failed at once).

    ``limit`` is the time the call had left when it reached the pacer; ``phase`` is
    ``"pacer queue"``.
    """

    bound = "total"

    def __init__(
        self, message: str, *, agent: str | None, ahead: int, waited: float, **kwargs: Any
    ) -> None:
        super().__init__(message, **kwargs)
        self.agent = agent
        self.ahead = ahead
        self.waited = waited


class CircuitOpen(StallproofError):
    """The upstream's circuit breaker is open; the request was not sent.

    Attributes:
        upstream: the breaker's key (base URL, and model if breakers are per model).
        retry_in: seconds until the breaker lets one probe through (0 while a probe runs).
    """

    def __init__(self, message: str, *, upstream: str, retry_in: float, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.upstream = upstream
        self.retry_in = retry_in


class TransportError(StallproofError):
    """The connection failed underneath the call."""


class ConnectError(TransportError):
    """Could not open a connection: refused, unreachable, or name resolution failed."""


class ConnectionLost(TransportError):
    """The server reset or closed the connection before the response was complete."""


class ProtocolError(StallproofError):
    """The server answered, but not in a form stallproof accepts."""


class MalformedResponse(ProtocolError):
    """The body was not valid JSON / SSE, or a field had the wrong type."""


class TruncatedResponse(ProtocolError):
    """The body or stream ended before it was complete."""


class ResponseTooLarge(ProtocolError):
    """A response or an SSE line passed its configured cap (see ``Limits``)."""

    def __init__(self, message: str, *, limit: int, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.limit = limit


class APIStatusError(StallproofError):
    """The server answered with a non-2xx status.

    Attributes:
        status_code: the HTTP status.
        body: the parsed JSON body if it was JSON, else the text (capped), else None.
        headers: response headers (lower-cased names); never includes request headers.
        retry_after: seconds the server asked us to wait (Retry-After / retry-after-ms), if any.
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        body: object,
        headers: dict[str, str],
        retry_after: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(message, **kwargs)
        self.status_code = status_code
        self.body = body
        self.headers = headers
        self.retry_after = retry_after


class BadRequestError(APIStatusError):
    """400."""


class AuthenticationError(APIStatusError):
    """401."""


class PermissionDeniedError(APIStatusError):
    """403."""


class NotFoundError(APIStatusError):
    """404."""


class ConflictError(APIStatusError):
    """409."""


class UnprocessableEntityError(APIStatusError):
    """422."""


class RateLimitError(APIStatusError):
    """429."""


class InternalServerError(APIStatusError):
    """Any status >= 500."""


class StreamErrorEvent(StallproofError):
    """The server sent an error object inside a 200 stream; ``body`` is what it sent."""

    def __init__(self, message: str, *, body: object, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.body = body


class InvalidRequestError(StallproofError, ValueError):
    """The caller passed something that cannot be sent (a bad argument, not a server error)."""


_STATUS_CLASSES: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    422: UnprocessableEntityError,
    429: RateLimitError,
}


def status_error_class(status_code: int) -> type[APIStatusError]:
    """The most specific `APIStatusError` subclass for a status code."""
    if status_code >= 500:
        return InternalServerError
    return _STATUS_CLASSES.get(status_code, APIStatusError)


TIMEOUT_CLASSES: dict[str, type[TimeoutException]] = {
    cls.bound: cls
    for cls in (
        ConnectTimeout,
        ReadTimeout,
        WriteTimeout,
        PoolTimeout,
        FirstTokenTimeout,
        IdleTimeout,
        TotalTimeout,
    )
}


def _set_public_module() -> None:
    # Tracebacks and reprs say `stallproof.ReadTimeout`, not `stallproof._exceptions.ReadTimeout`.
    for name in __all__:
        globals()[name].__module__ = "stallproof"


_set_public_module()
