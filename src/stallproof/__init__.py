"""stallproof: LLM calls from agent harnesses that cannot hang.

Every call is bounded in every phase (connect, read, write, pool wait, time to first token,
stream idle) and by one total deadline that covers them all.

The SDK faces, `stallproof.openai.AsyncOpenAI` and `stallproof.anthropic.AsyncAnthropic`
(and their sync forms `OpenAI`, `Anthropic`), live in submodules that are imported on first
use: ``import stallproof`` imports neither SDK. Sync code has `Transport`, `Transport2`,
`sync_http_client()` and `sync_http_client2()`, and ``with stallproof.deadline(...)``.

Where is it stuck? `stallproof.inflight()` is every call in flight in the process (every
client, face and transport; `_registry`); `publish_inflight` (to Redis, `_fleet._publish`)
and `serve_inflight` (a local socket, `_local_socket`) show it to the ``stallproof``
command: ``stallproof top`` (`_top`) and ``stallproof diagnose`` (`_diagnose`), parsed in
`_cli` (docs/debugging.md).
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
    TotalTimeout,
    TransportError,
    TruncatedResponse,
    UnprocessableEntityError,
    WriteTimeout,
)
from ._faces._sync_transport import Transport, Transport2, sync_http_client, sync_http_client2
from ._faces._transport import AsyncTransport, AsyncTransport2, http_client, http_client2
from ._fleet._publish import InflightPublisher, publish_inflight
from ._inflight import InflightCall, dump_on_signal, format_inflight, tag
from ._local_socket import InflightServer, serve_inflight
from ._pacer import PacerState
from ._policies import DEFAULT_RETRY_STATUSES, Breaker, Pacer, RedisState, Retry, RetryBudget
from ._raw import RawResponse, StreamingResponse
from ._registry import inflight
from ._resources import Embeddings, ModelList, ModelPage, Models
from ._stream import AsyncStream
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
