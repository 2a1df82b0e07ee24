"""``client.chat.completions``: openai's methods and parameters, stallproof's bounds.

``create`` takes exactly openai's keyword arguments (its ``CompletionCreateParams``
TypedDict, so a typo such as ``max_token=2`` is a TypeError at run time and a mypy
error), plus stallproof's per-call ``retry``, ``agent`` and ``labels``. Anything new or
vendor-specific goes in ``extra_body``. ``parse`` and ``stream`` are openai's helpers
(structured outputs, stream events and ``get_final_completion()``) over the same call.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Literal, cast, overload

import httpx
import httpx2
import pydantic
from openai import NotGiven, Omit, omit
from openai.lib._parsing import (
    parse_chat_completion,
    type_to_response_format_param,
    validate_input_tools,
)
from openai.lib.streaming.chat import AsyncChatCompletionStreamManager
from openai.types.chat import ChatCompletion, ParsedChatCompletion
from openai.types.chat.completion_create_params import CompletionCreateParamsBase
from typing_extensions import TypedDict, TypeVar, Unpack

from ._config import Timeouts
from ._engine import Incoming
from ._policies import Retry
from ._raw import (
    PerCall,
    Prepared,
    RawResponse,
    Sender,
    StreamingResponse,
    raw_wrapper,
    streaming_wrapper,
)
from ._request import build_body, check_known, is_omitted, pop_stream
from ._results import read_result, refuse
from ._stream import AsyncStream

__all__ = ["Beta", "Chat", "Completions", "CreateArgs"]

# What parse()/stream() parse the content into; None without a response_format, as openai's
# ResponseFormatT (so `async with ...stream(...) as s` needs no annotation).
T = TypeVar("T", default=None)


class CallArgs(TypedDict, total=False):
    """Per-call arguments of every method: openai's, and stallproof's ``retry``, ``agent``
    and ``labels``.

    ``timeout``: a number replaces only the total budget; an ``httpx.Timeout`` its phases;
    None (openai's "no timeout") keeps the client's bounds: a call is never unbounded.
    """

    timeout: float | Timeouts | httpx.Timeout | httpx2.Timeout | NotGiven | Omit | None
    retry: Retry | None
    agent: str | None
    labels: Mapping[str, str] | None
    extra_headers: Mapping[str, str | Omit | None] | None
    extra_query: Mapping[str, object] | None
    extra_body: Mapping[str, object] | None


class CreateArgs(CompletionCreateParamsBase, CallArgs, total=False):
    """openai's ``chat.completions.create`` arguments (but ``stream``) and `CallArgs`."""


_KNOWN = frozenset(CreateArgs.__annotations__) | {"stream"}


def _check_args(method: str, params: Mapping[str, Any]) -> None:
    check_known(method, params, _KNOWN)
    for name in ("messages", "model"):
        if name not in params:
            raise TypeError(f"{method}() missing required keyword argument: {name!r}")


async def _open_stream(incoming: Incoming) -> AsyncStream:
    if not incoming.body.is_stream:
        raise await refuse(incoming, "asked for a stream but the server answered with a JSON body")
    return AsyncStream(incoming)


async def _completion(incoming: Incoming) -> ChatCompletion:
    return await read_result(incoming, ChatCompletion)


class Completions:
    """``client.chat.completions``."""

    def __init__(self, client: Sender) -> None:
        self._client = client
        self.with_raw_response = RawCompletions(self)
        self.with_streaming_response = StreamingCompletions(self)

    def _prepare(self, method: str, params: dict[str, Any]) -> Prepared[Any]:
        _check_args(method, params)
        stream = pop_stream(params)
        response_format = params.get("response_format")
        if inspect.isclass(response_format) and issubclass(response_format, pydantic.BaseModel):
            raise TypeError(
                "a pydantic model as response_format needs chat.completions.parse(), not create()"
            )
        opts = PerCall.pop(params)
        extra_body = params.pop("extra_body", None)
        messages = params.pop("messages")
        model = params.pop("model")
        body = build_body(messages, model, stream, params, extra_body)
        convert = _open_stream if stream else _completion
        return Prepared(b"POST", "chat/completions", body, opts, stream, convert)

    @overload
    async def create(
        self,
        *,
        stream: Literal[False] | NotGiven | Omit | None = ...,
        **params: Unpack[CreateArgs],
    ) -> ChatCompletion: ...

    @overload
    async def create(
        self, *, stream: Literal[True], **params: Unpack[CreateArgs]
    ) -> AsyncStream: ...

    @overload
    async def create(
        self, *, stream: bool, **params: Unpack[CreateArgs]
    ) -> ChatCompletion | AsyncStream: ...

    async def create(
        self,
        *,
        stream: bool | NotGiven | Omit | None = False,
        **params: Unpack[CreateArgs],
    ) -> ChatCompletion | AsyncStream:
        """Create a chat completion; with ``stream=True``, an `AsyncStream` of chunks.

        Takes openai's keyword arguments (see `CreateArgs`); ``NOT_GIVEN``/``omit`` leave
        one out. ``timeout`` overrides the client's bounds for this call: a number
        replaces only the total budget. ``retry`` overrides the client's `Retry` (None:
        one attempt). ``agent`` and ``labels`` tag the call (see `stallproof.tag`) in
        errors' logs, spans and ``client.inflight()``.

        Returns:
            ``openai.types.chat.ChatCompletion``, validated; or an `AsyncStream` of
            ``ChatCompletionChunk``.

        Raises:
            TypeError: an argument openai does not have (``max_token=``), or a missing one.
            TimeoutException: a bound fired (the subclass names it).
            TransportError, ProtocolError, APIStatusError: see the exception tree.
            InvalidRequestError: the arguments cannot be sent.
        """
        run = self._client._run(self._prepare("create", {"stream": stream, **params}))
        # Neither the arguments nor the prepared call are held while it runs (thousands
        # may be in flight): the request has their values.
        del params
        result: ChatCompletion | AsyncStream = await run
        return result

    async def parse(
        self,
        *,
        response_format: type[T] | Mapping[str, object] | NotGiven | Omit = omit,
        **params: Any,
    ) -> ParsedChatCompletion[T]:
        """openai's structured outputs: ``response_format`` a pydantic model (or a
        ``response_format`` dict); ``choices[i].message.parsed`` is the parsed content.

        Raises:
            openai.LengthFinishReasonError: the answer was cut off (``finish_reason``
                ``"length"``), as openai raises it. And what `create` raises.
        """
        input_tools = validate_input_tools(params.get("tools", omit))
        params["response_format"] = type_to_response_format_param(response_format)  # type: ignore[arg-type]
        prepared = self._prepare("parse", {**params, "stream": False})

        async def convert(incoming: Incoming) -> ParsedChatCompletion[T]:
            completion = await _completion(incoming)
            return parse_chat_completion(
                response_format=response_format,  # type: ignore[arg-type]
                input_tools=input_tools,
                chat_completion=completion,
            )

        return await self._client._run(
            Prepared(prepared.method, prepared.path, prepared.body, prepared.opts, False, convert)
        )

    def stream(
        self,
        *,
        response_format: type[T] | Mapping[str, object] | NotGiven | Omit = omit,
        **params: Any,
    ) -> AsyncChatCompletionStreamManager[T]:
        """openai's stream helper: ``async with client.chat.completions.stream(...) as s``
        gives content/tool-call events and ``await s.get_final_completion()``.

        The request is sent when the block is entered; every chunk is read under the
        call's bounds, and leaving the block releases the connection.
        """
        input_tools = validate_input_tools(params.get("tools", omit))
        formatted = type_to_response_format_param(response_format)  # type: ignore[arg-type]
        if not is_omitted(formatted):
            params["response_format"] = formatted
        request = self.create(stream=True, **params)
        return AsyncChatCompletionStreamManager(
            cast(Any, request),  # our AsyncStream has what the manager uses of openai's
            response_format=response_format,  # type: ignore[arg-type]
            input_tools=input_tools,
        )


class RawCompletions:
    """``client.chat.completions.with_raw_response``: `create` returning a `RawResponse`."""

    def __init__(self, completions: Completions) -> None:
        self._run = raw_wrapper(completions._client, self._prepare)
        self._completions = completions

    def _prepare(self, **params: Any) -> Prepared[Any]:
        return self._completions._prepare("create", params)

    async def create(
        self, *, stream: bool | NotGiven | Omit | None = False, **params: Unpack[CreateArgs]
    ) -> RawResponse[Any]:
        """`Completions.create`, with the status and headers: ``.parse()`` is the result."""
        return await self._run(stream=stream, **params)


class StreamingCompletions:
    """``client.chat.completions.with_streaming_response``."""

    def __init__(self, completions: Completions) -> None:
        self._run = streaming_wrapper(completions._client, self._prepare)
        self._completions = completions

    def _prepare(self, **params: Any) -> Prepared[Any]:
        return self._completions._prepare("create", params)

    def create(
        self, *, stream: bool | NotGiven | Omit | None = False, **params: Unpack[CreateArgs]
    ) -> StreamingResponse[Any]:
        """`Completions.create` as an async context manager; ``await r.parse()``."""
        return self._run(stream=stream, **params)


class Chat:
    """``client.chat``."""

    def __init__(self, client: Sender) -> None:
        self.completions = Completions(client)


class Beta:
    """``client.beta``, for code written against openai's beta namespace (autogen-ext's
    structured outputs call ``client.beta.chat.completions.parse``): ``beta.chat`` is
    ``client.chat`` itself, as openai's ``beta.chat.completions`` is its chat completions
    resource. The rest of openai's beta (assistants, realtime, ...) is not a chat call."""

    def __init__(self, chat: Chat) -> None:
        self.chat = chat
