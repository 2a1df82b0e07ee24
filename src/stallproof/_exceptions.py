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
│       ├── DeadlineExceeded       a `stallproof.deadline()` block around the call ran out
│       ├── RetryWouldExceedDeadline   the next retry's wait would not fit in the time left
│       └── PacerTimeout           the deadline ran out (or was sure to) in the pacer queue
├── TransportError                 the connection failed underneath us
│   ├── ConnectError               could not connect (refused, unreachable, DNS)
│   └── ConnectionLost             reset or closed before a response was complete
├── ProtocolError                  the server answered, but not in a shape we accept
│   ├── MalformedResponse          invalid JSON or SSE, or fields of the wrong type
│   ├── TruncatedResponse          the body or stream ended early
│   ├── ResponseTooLarge           a size cap (`max_response_bytes`, `max_line_bytes`) hit
│   └── TooManyRedirects           more redirects than `Limits.max_redirects`
├── APIStatusError                 a non-2xx answer; .status_code, .body, .request_id
│   ├── BadRequestError (400) · AuthenticationError (401) · PermissionDeniedError (403)
│   ├── NotFoundError (404) · ConflictError (409) · UnprocessableEntityError (422)
│   ├── RateLimitError (429)
│   └── InternalServerError (>= 500)
├── StreamErrorEvent               the server sent an error event inside a 200 stream
├── CircuitOpen                    the upstream's circuit breaker is open: not sent at all
├── SharedStateUnavailable         Redis (fleet state) failed and RedisState.fail="closed"
└── InvalidRequestError            bad arguments from the caller (also a ValueError)
```

Each class is also the openai SDK's class for the same failure, so code written for
``openai.AsyncOpenAI`` catches ours unchanged:

| stallproof                          | also an instance of                                  |
|-------------------------------------|------------------------------------------------------|
| `TimeoutException` (every bound)    | ``openai.APITimeoutError`` (not the builtin, see below) |
| `TransportError`, `CircuitOpen`,    | ``openai.APIConnectionError``                        |
| `SharedStateUnavailable`            |                                                      |
| `TruncatedResponse`, `ResponseTooLarge` | ``openai.APIConnectionError`` (*)              |
| `ProtocolError`, `StreamErrorEvent` | ``openai.APIError``                                  |
| `APIStatusError` and subclasses     | ``openai.APIStatusError`` and its class per status   |

(*) As the SDK makes of a body cut off, or refused, on its own transport.

Like openai's, they carry ``message``, ``request``, ``body`` (for a status error, the inner
``error`` object), ``code``, ``type``, ``param`` and, for status errors, ``response`` and
``status_code``. ``request_id`` is the *server's* ``x-request-id`` (as in openai);
``stallproof_request_id`` is ours, sent as ``x-request-id`` and found in our logs and spans.
No message ever contains a header value, so API keys cannot leak through an exception.
"""

from __future__ import annotations

import warnings
from typing import Any

import httpx2
import openai

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
    "SharedStateUnavailable",
    "StallproofError",
    "StreamErrorEvent",
    "TimeoutException",
    "TooManyRedirects",
    "TotalTimeout",
    "TransportError",
    "TruncatedResponse",
    "UnprocessableEntityError",
    "WriteTimeout",
]


_NO_URL = "https://stallproof.invalid/"


class StallproofError(Exception):
    """Root of every error stallproof raises.

    Attributes:
        stallproof_request_id: the id stallproof sent as ``x-request-id`` (None before a
            call started); our logs and spans carry it.
        server_request_id: the server's ``x-request-id`` / ``request-id`` header, if it sent
            one. ``request_id`` is the same value, under openai's name.
        elapsed: seconds from the start of the call to the error, if known.
        phase: the phase the call was in (``"connecting"``, ``"awaiting headers"``...).
        body, code, type, param: openai's: the server's error object and its fields (None
            when the server sent none).
        request: the request, as an ``httpx2.Request`` (openai's ``APIError.request``),
            built when first read.

    The constructor's ``request_id=`` is ours (`stallproof_request_id`).
    """

    code: str | None = None
    param: str | None = None
    type: str | None = None

    def __init__(
        self,
        message: str,
        *,
        request_id: str | None = None,
        server_request_id: str | None = None,
        elapsed: float | None = None,
        phase: str | None = None,
        body: object = None,
        method: str = "POST",
        url: str | None = None,
    ) -> None:
        # Not super().__init__: openai's constructors want an httpx response or request,
        # which are built lazily here (see `request`, `APIStatusError.response`).
        Exception.__init__(self, message)
        self.message = message
        self.stallproof_request_id = request_id
        self.server_request_id = server_request_id
        self.elapsed = elapsed
        self.phase = phase
        self.body = body
        self.method = method
        self.url = url
        if isinstance(body, dict):
            # As openai's APIError reads them.
            code = body.get("code")
            self.code = str(code) if code is not None else None
            param = body.get("param")
            self.param = param if isinstance(param, str) else None
            kind = body.get("type")
            self.type = kind if isinstance(kind, str) else None

    @property
    def request_id(self) -> str | None:
        """The server's request id (openai's meaning); ours is `stallproof_request_id`."""
        return self.server_request_id

    @request_id.setter
    def request_id(self, value: str | None) -> None:
        self.server_request_id = value

    @property
    def request(self) -> httpx2.Request:
        """The request that failed (method and URL; never its headers or body)."""
        request = self.__dict__.get("_request")  # set by the transport adapters
        if request is None:
            request = httpx2.Request(self.method, self.url or _NO_URL)
            self.__dict__["_request"] = request
        return request

    @request.setter
    def request(self, value: httpx2.Request) -> None:
        self.__dict__["_request"] = value

    def __str__(self) -> str:
        parts = [self.message]
        if self.stallproof_request_id is not None:
            parts.append(f"stallproof_request_id={self.stallproof_request_id}")
        if self.server_request_id is not None:
            parts.append(f"server_request_id={self.server_request_id}")
        return " ".join(parts) if len(parts) == 1 else f"{parts[0]} ({', '.join(parts[1:])})"


class TimeoutException(StallproofError, openai.APITimeoutError):
    """A bound fired. ``bound`` names it; ``limit`` is its configured value in seconds.

    Also an ``openai.APITimeoutError``, as openai's and httpx's timeouts are, and for the
    same reason *not* a builtin `TimeoutError` (``asyncio.TimeoutError``): code that wraps
    a read in ``asyncio.wait_for(..., 120)`` (langchain-openai does) catches that as its
    own timer firing and would report our 0.5 s idle bound as "no chunk for 120 s".
    """

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
        method: str = "POST",
        url: str | None = None,
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
            method=method,
            url=url,
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
    """A `stallproof.deadline()` block ran out: the call (or the block) had no time left.

    Attributes:
        name: the block's name (``deadline(name=...)``).

    ``limit`` is the block's budget in seconds and ``elapsed`` the time since the block
    began when raised by the block itself, or since the call began when raised by a call.
    """

    bound = "deadline"

    def __init__(self, message: str | None = None, *, name: str, **kwargs: Any) -> None:
        if message is None:
            phase = kwargs.get("phase")
            where = f" while {phase}" if phase else ""
            message = (
                f"deadline {name!r} of {kwargs['limit']:g}s ran out after "
                f"{kwargs['elapsed']:.3f}s{where}"
            )
        super().__init__(message, **kwargs)
        self.name = name

    @property
    def scope(self) -> str:
        """Deprecated: `name` (a deadline is a block; "scope" is the call's `CallScope`)."""
        warnings.warn(
            "DeadlineExceeded.scope is deprecated: use DeadlineExceeded.name",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.name


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


class CircuitOpen(StallproofError, openai.APIConnectionError):
    """The upstream's circuit breaker is open; the request was not sent.

    Also an ``openai.APIConnectionError``: the upstream is unreachable for now.

    Attributes:
        upstream: the breaker's key (base URL, and model if breakers are per model).
        retry_in: seconds until the breaker lets one probe through (0 while a probe runs).
    """

    def __init__(self, message: str, *, upstream: str, retry_in: float, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.upstream = upstream
        self.retry_in = retry_in


class SharedStateUnavailable(StallproofError, openai.APIConnectionError):
    """Fleet state on Redis did not answer in time and `RedisState` says ``fail="closed"``:
    the call was not sent rather than sent without the fleet's limits.

    Also an ``openai.APIConnectionError``, as `CircuitOpen` is: not sent, for now.

    Attributes:
        reason: why Redis is unavailable (a timeout, a refused connection, ...).
    """

    def __init__(self, message: str, *, reason: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.reason = reason


class TransportError(StallproofError, openai.APIConnectionError):
    """The connection failed underneath the call (also an ``openai.APIConnectionError``)."""


class ConnectError(TransportError):
    """Could not open a connection: refused, unreachable, or name resolution failed."""


class ConnectionLost(TransportError):
    """The server reset or closed the connection before the response was complete."""


class ProtocolError(StallproofError, openai.APIError):
    """The server answered, but not in a form stallproof accepts (an ``openai.APIError``)."""


class MalformedResponse(ProtocolError):
    """The body was not valid JSON / SSE, or a field had the wrong type.

    Attributes:
        path: where in the JSON the wrong field is (``choices[0].message.content``), when
            the error is about one field.
    """

    def __init__(self, message: str, *, path: str | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.path = path


class TruncatedResponse(ProtocolError, openai.APIConnectionError):
    """The body or stream ended before it was complete."""


class ResponseTooLarge(ProtocolError, openai.APIConnectionError):
    """A response or an SSE line passed its configured cap (see ``Limits``)."""

    def __init__(self, message: str, *, limit: int, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.limit = limit


class TooManyRedirects(ProtocolError, openai.APIConnectionError):
    """The server redirected the call more than ``Limits.max_redirects`` times (a loop,
    most often). Every hop ran inside the call's one deadline.

    Attributes:
        limit: the ``max_redirects`` that was passed.
    """

    def __init__(self, message: str, *, limit: int, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.limit = limit


class APIStatusError(StallproofError, openai.APIStatusError):
    """The server answered with a non-2xx status (also an ``openai.APIStatusError``).

    Attributes:
        status_code: the HTTP status.
        body: as openai gives it: the ``error`` object of a JSON body (the whole JSON when
            it has none), else the text (capped), else None.
        headers: response headers (lower-cased names); never includes request headers.
        retry_after: seconds the server asked us to wait (Retry-After / retry-after-ms), if any.
        response: the response as an ``httpx2.Response`` (openai's), built when first read.
        content: the response body as received (capped by ``Limits``).
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        body: object,
        headers: dict[str, str],
        retry_after: float | None = None,
        content: bytes = b"",
        **kwargs: Any,
    ) -> None:
        super().__init__(message, body=body, **kwargs)
        self.status_code = status_code
        self.headers = headers
        self.retry_after = retry_after
        self.content = content

    @property
    def response(self) -> httpx2.Response:
        response = self.__dict__.get("_response")
        if response is None:
            response = httpx2.Response(
                self.status_code,
                headers=self.headers,
                content=self.content,
                request=self.request,
            )
            self.__dict__["_response"] = response
        return response

    @response.setter
    def response(self, value: httpx2.Response) -> None:
        self.__dict__["_response"] = value


class BadRequestError(APIStatusError, openai.BadRequestError):
    """400."""


class AuthenticationError(APIStatusError, openai.AuthenticationError):
    """401."""


class PermissionDeniedError(APIStatusError, openai.PermissionDeniedError):
    """403."""


class NotFoundError(APIStatusError, openai.NotFoundError):
    """404."""


class ConflictError(APIStatusError, openai.ConflictError):
    """409."""


class UnprocessableEntityError(APIStatusError, openai.UnprocessableEntityError):
    """422."""


class RateLimitError(APIStatusError, openai.RateLimitError):
    """429."""


class InternalServerError(APIStatusError, openai.InternalServerError):
    """Any status >= 500."""


class StreamErrorEvent(StallproofError, openai.APIError):
    """The server sent an error object inside a 200 stream (an ``openai.APIError``).

    ``body`` is the ``error`` object it sent (the whole event when it has none), as openai.
    """

    def __init__(self, message: str, *, body: object, **kwargs: Any) -> None:
        super().__init__(message, body=body, **kwargs)


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
