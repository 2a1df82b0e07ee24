"""stallproof: LLM calls from agent harnesses that cannot hang.

Every call is bounded in every phase (connect, read, write, pool wait, time to first token,
stream idle) and by one total deadline that covers them all.

The SDK faces, `stallproof.openai.AsyncOpenAI` and `stallproof.anthropic.AsyncAnthropic`
(and their sync forms `OpenAI`, `Anthropic`), live in submodules that are imported on first
use: ``import stallproof`` imports neither SDK. Sync code has `Transport`, `Transport2`,
`sync_http_client()` and `sync_http_client2()`, and ``with stallproof.deadline(...)``.

Where is it stuck? `stallproof.inflight()` is every call in flight in the process (every
client, face and transport; `_registry`); `publish_inflight` (to Redis, `_publish`)
and `serve_inflight` (a local socket, `_local_socket`) show it to the ``stallproof``
command: ``stallproof top`` (`_top`) and ``stallproof diagnose`` (`_diagnose`), parsed in
`_cli` (docs/debugging.md).

Where things are. Six layers, each importing only from the layers below it; the life of
one call through them is told in docs/architecture.md. A sub-package's own docstring maps
its modules and states its rule.

=================== =====================================================================
module              what is in it
=================== =====================================================================
**the command**     ``stallproof top`` and ``diagnose``, and what feeds them (debugging.md)
`__main__`          ``python -m stallproof``: the command
`_cli`              ``stallproof top`` / ``diagnose``: arguments, output, exit status
`_top`              every call in flight across the fleet, sorted by what needs attention
`_diagnose`         the four probes (fleet, server gauges, a fresh call) and a verdict
`_publish`          `publish_inflight`: a process's calls in flight, to Redis with a TTL
`_local_socket`     `serve_inflight`: a process's calls in flight, on a local socket
**faces**           what callers hold; they adapt, they never bound
`_client`           `Client`: the native async OpenAI-compatible client
`_completions`      ``client.chat.completions`` (and ``client.beta``)
`_resources`        ``client.models``, ``client.embeddings``
`_responses`        ``client.responses``: the Responses API
`_raw`              a prepared call, and ``with_raw_response`` / ``with_streaming_response``
`_stream`           `AsyncStream`, `ResponseStream`: streams, typed event by event
`_request`          openai-style arguments -> the request body, with clear errors
`_results`          parsed JSON -> openai's own result types, validated
`_settings`         a `Client`'s settings as openai names them
`_faces/`           the engine as an httpx/httpx2 transport, and the SDK faces' plumbing
`openai`            `stallproof.openai.AsyncOpenAI` (public submodule)
`anthropic`         `stallproof.anthropic.AsyncAnthropic` (public submodule)
**the engine**      the one implementation of every bound
`_engine`           `Engine`: pace, attempt, retry, hand back a bounded response
`_callscope`        `CallScope`: the one owner of what a call holds until it ends
`_call`             `Call`: a call's clock, phase, and which bound is armed
`_deadline`         `deadline()`: one budget over a whole agent step
`_body`             `ResponseBody`: a body or event stream, bounded while it is read
`_progress`         what counts as progress (content) in an event stream
`_sse`              the incremental Server-Sent Events decoder, line length capped
`_decoding`         Content-Encoding decoding that counts what it decodes
`_json`             JSON from a server: off the loop when large, depth-checked
`_inflight`         `InflightCall`, `tag()`, `format_inflight`: where is each call?
`_registry`         every engine of the process, weakly: `stallproof.inflight()`
`_telemetry`        OpenTelemetry spans and metrics, stdlib logging
`_retry`            the retry loop (tenacity) and the budget's tokens
`_status`           a non-2xx answer -> a typed `APIStatusError`
`_redirects`        the next request after a 3xx: httpx's rules, credentials dropped
**policies**        what the engine consults before and after each attempt
`_policies`         `Retry`, `RetryBudget`, `Pacer`, `Breaker`, `RedisState` (config)
`_pacer`            `PacerRuntime`: concurrency, per-minute limits, fair turns, AIMD
`_breaker`          `Circuit`: pybreaker made right for asyncio and trio
`_fleet/`           the pacer and breaker shared across processes through Redis
**the wire**        bytes and connections
`_wire/`            `Wire` (the interface), `Pool`, `Network`, proxies, httpx adapters
**foundations**     imported by every layer, importing none
`_config`           `Timeouts`, `Limits`: frozen, validated bounds and caps
`_clock`            the event loop's clock, and a deadline read across clocks (sync too)
`_native_scope`     `NativeCancelScope`: an attempt's bound on asyncio's own task cancellation
`_exceptions`       the one exception tree
`_validate`         the validation rules and message shape every config shares
`_redact`           keeping secrets out of messages, reprs, logs, spans and chains
`_base_url`         `check_base_url`: the one rule for a base URL (no credentials, no query)
`_version`          the version, written once
=================== =====================================================================
"""

import importlib
from types import ModuleType

from ._breaker import CircuitState
from ._client import Client
from ._completions import Chat, Completions
from ._config import UNSET, Limits, Timeouts
from ._deadline import deadline
from ._engine import CallOptions, Engine
from ._exceptions import (
    APIStatusError,
    AuthenticationError,
    BadRequestError,
    CircuitOpen,
    ConflictError,
    ConnectError,
    ConnectionLost,
    ConnectTimeout,
    DeadlineExceeded,
    FirstTokenTimeout,
    IdleTimeout,
    InternalServerError,
    InvalidRequestError,
    MalformedResponse,
    NotFoundError,
    PacerTimeout,
    PermissionDeniedError,
    PoolTimeout,
    ProtocolError,
    RateLimitError,
    ReadTimeout,
    ResponseTooLarge,
    RetryWouldExceedDeadline,
    SharedStateUnavailable,
    StallproofError,
    StreamErrorEvent,
    TimeoutException,
    TooManyRedirects,
    TotalTimeout,
    TransportError,
    TruncatedResponse,
    UnprocessableEntityError,
    WriteTimeout,
)
from ._faces._sync_transport import Transport, Transport2, sync_http_client, sync_http_client2
from ._faces._transport import AsyncTransport, AsyncTransport2, http_client, http_client2
from ._inflight import InflightCall, dump_on_signal, format_inflight, tag
from ._local_socket import InflightServer, serve_inflight
from ._pacer import PacerState
from ._policies import DEFAULT_RETRY_STATUSES, Breaker, Pacer, RedisState, Retry, RetryBudget
from ._publish import InflightPublisher, publish_inflight
from ._raw import RawResponse, StreamingResponse
from ._registry import inflight
from ._resources import Embeddings, ModelList, ModelPage, Models
from ._responses import Responses
from ._stream import AsyncStream, ResponseStream
from ._version import __version__ as __version__

__all__ = [
    "APIStatusError",
    "AsyncStream",
    "AsyncTransport",
    "AsyncTransport2",
    "AuthenticationError",
    "BadRequestError",
    "Breaker",
    "CallOptions",
    "Chat",
    "CircuitOpen",
    "CircuitState",
    "Client",
    "Completions",
    "ConflictError",
    "ConnectError",
    "ConnectionLost",
    "ConnectTimeout",
    "deadline",
    "DeadlineExceeded",
    "DEFAULT_RETRY_STATUSES",
    "dump_on_signal",
    "Embeddings",
    "Engine",
    "FirstTokenTimeout",
    "format_inflight",
    "http_client",
    "http_client2",
    "IdleTimeout",
    "inflight",
    "InflightCall",
    "InflightPublisher",
    "InflightServer",
    "InternalServerError",
    "InvalidRequestError",
    "Limits",
    "MalformedResponse",
    "ModelList",
    "ModelPage",
    "Models",
    "NotFoundError",
    "Pacer",
    "PacerState",
    "PacerTimeout",
    "PermissionDeniedError",
    "PoolTimeout",
    "ProtocolError",
    "publish_inflight",
    "RateLimitError",
    "RawResponse",
    "ReadTimeout",
    "RedisState",
    "Responses",
    "ResponseStream",
    "ResponseTooLarge",
    "Retry",
    "RetryBudget",
    "RetryWouldExceedDeadline",
    "serve_inflight",
    "SharedStateUnavailable",
    "StallproofError",
    "StreamErrorEvent",
    "StreamingResponse",
    "sync_http_client",
    "sync_http_client2",
    "tag",
    "TimeoutException",
    "Timeouts",
    "TooManyRedirects",
    "TotalTimeout",
    "Transport",
    "Transport2",
    "TransportError",
    "TruncatedResponse",
    "UnprocessableEntityError",
    "UNSET",
    "WriteTimeout",
]

_SDK_FACES = ("anthropic", "openai")


def __getattr__(name: str) -> ModuleType:
    # `stallproof.openai` works after a bare `import stallproof`, importing the SDK then.
    if name in _SDK_FACES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type):
        _obj.__module__ = "stallproof"
del _name, _obj
