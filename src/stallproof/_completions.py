"""``client.chat.completions.create``: openai's signature, stallproof's bounds."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, overload

from ._config import UNSET, TimeoutTypes, Unset
from ._models import ChatCompletion
from ._request import build_body
from ._retry import Retry
from ._stream import AsyncStream

if TYPE_CHECKING:
    from ._client import Client

__all__ = ["Chat", "Completions"]


class Completions:
    """``client.chat.completions``: the ``create`` method openai users already call."""

    def __init__(self, client: Client) -> None:
        self._client = client

    @overload
    async def create(
        self,
        *,
        messages: Iterable[Mapping[str, Any]],
        model: str,
        stream: Literal[False] = False,
        timeout: TimeoutTypes | Unset | None = UNSET,
        retry: Retry | Unset | None = UNSET,
        agent: str | None = None,
        labels: Mapping[str, str] | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, Any] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        **params: Any,
    ) -> ChatCompletion: ...

    @overload
    async def create(
        self,
        *,
        messages: Iterable[Mapping[str, Any]],
        model: str,
        stream: Literal[True],
        timeout: TimeoutTypes | Unset | None = UNSET,
        retry: Retry | Unset | None = UNSET,
        agent: str | None = None,
        labels: Mapping[str, str] | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, Any] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        **params: Any,
    ) -> AsyncStream: ...

    @overload
    async def create(
        self,
        *,
        messages: Iterable[Mapping[str, Any]],
        model: str,
        stream: bool,
        timeout: TimeoutTypes | Unset | None = UNSET,
        retry: Retry | Unset | None = UNSET,
        agent: str | None = None,
        labels: Mapping[str, str] | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, Any] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        **params: Any,
    ) -> ChatCompletion | AsyncStream: ...

    async def create(
        self,
        *,
        messages: Iterable[Mapping[str, Any]],
        model: str,
        stream: bool = False,
        timeout: TimeoutTypes | Unset | None = UNSET,
        retry: Retry | Unset | None = UNSET,
        agent: str | None = None,
        labels: Mapping[str, str] | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, Any] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        **params: Any,
    ) -> ChatCompletion | AsyncStream:
        """Create a chat completion; with ``stream=True``, an `AsyncStream` of chunks.

        Takes openai's keyword arguments (tools, tool_choice, response_format, temperature,
        max_tokens, stop, stream_options, ...) and passes any others through into the JSON
        body. ``timeout`` overrides the client's bounds for this call: a number replaces
        only the total budget. ``retry`` overrides the client's `Retry` (None: one attempt).
        ``agent`` and ``labels`` tag the call (see `stallproof.tag`) in errors' logs, spans
        and ``client.inflight()``.

        Raises:
            TimeoutException: a bound fired (the subclass names it).
            TransportError, ProtocolError, APIStatusError: see the exception tree.
            InvalidRequestError: the arguments cannot be sent.
        """
        body = build_body(messages, model, stream, params, extra_body)
        return await self._client._chat(
            body,
            stream=stream,
            timeout=timeout,
            retry=retry,
            agent=agent,
            labels=labels,
            extra_headers=extra_headers,
            extra_query=extra_query,
        )


class Chat:
    """``client.chat``."""

    def __init__(self, client: Client) -> None:
        self.completions = Completions(client)
