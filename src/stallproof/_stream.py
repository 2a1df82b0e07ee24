"""Streamed results, bounded while the caller iterates them: chat completion chunks
(`AsyncStream`) and Responses API events (`ResponseStream`).

The engine's `ResponseBody` does the bounded reading: each step waits at most until the
earliest of the call's total deadline and ``first_token`` (before the first content chunk)
or ``idle`` (after it), counting only time spent waiting on the server. This module turns
its events into openai's types and decides when the stream is complete; the two kinds
differ only in that (`_EventStream._parse`, `_EventStream._complete_after`).

The connection is released on every exit: end of stream, error, timeout, cancellation,
``break`` out of ``async for`` (the loop's generator is finalised at once), ``aclose()`` or
leaving ``async with``.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any, Generic, TypeVar

import httpx
import httpx2
import pydantic
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import ResponseStreamEvent

from . import _exceptions as exc
from ._body import ResponseBody
from ._engine import Incoming
from ._results import to_result
from ._sse import ServerSentEvent

__all__ = ["AsyncStream", "ResponseStream"]

T = TypeVar("T")


class _EventStream(Generic[T]):
    """What every stream shares: bounded iteration, closing, the response's ids."""

    def __init__(self, incoming: Incoming) -> None:
        self._call = incoming.call
        self._body: ResponseBody = incoming.body
        self.status_code = incoming.status
        self.headers = httpx.Headers(incoming.headers)
        self._response: httpx2.Response | None = None
        self._complete = False

    @property
    def request_id(self) -> str | None:
        """The server's ``x-request-id`` (openai's meaning)."""
        return self._call.server_request_id

    @property
    def stallproof_request_id(self) -> str:
        """The id stallproof sent as ``x-request-id``, in our logs and spans."""
        return self._call.request_id

    @property
    def server_request_id(self) -> str | None:
        return self._call.server_request_id

    @property
    def response(self) -> httpx2.Response:
        """The response as openai's ``AsyncStream.response`` (an ``httpx2.Response``):
        status and headers; closing it closes this stream. Read chunks from the stream,
        not from it."""
        if self._response is None:
            self._response = httpx2.Response(
                self.status_code,
                headers=self.headers.raw,
                stream=_Closer(self),
                request=httpx2.Request(self._call.method, self._call.url or "http://invalid/"),
            )
        return self._response

    # -- iteration -----------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[T]:
        # A fresh generator per loop: when the caller `break`s, the loop drops its only
        # reference, the generator is finalised and its `finally` releases the connection.
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[T]:
        try:
            while (chunk := await self._next()) is not None:
                yield chunk
        finally:
            await self.aclose()

    async def __anext__(self) -> T:
        chunk = await self._next()
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def _next(self) -> T | None:
        body = self._body
        call = self._call
        while not body.closed:
            if self._complete:
                # The last event said the answer is complete: what follows is at most the
                # end of the HTTP body (read briefly, so a held-open socket costs little).
                await body.finish()
                return None
            if call.now() >= call.total_deadline:
                timeout = call.timeout_error("total")
                await body.fail(timeout)
                raise timeout
            got = await body.next_event()  # bounded; on failure it has ended the call
            if got is None:
                if body.outcome.finished:
                    await body.finish()
                    return None
                error = call.error(
                    exc.TruncatedResponse,
                    "stream ended without [DONE] and without a finish_reason",
                )
                await body.fail(error)
                raise error
            event, obj, _ = got
            if event.data == "[DONE]":
                await body.finish()
                return None
            try:
                chunk = self._parse(event, obj)
            except BaseException as e:
                await body.fail(e)
                raise
            if chunk is not None:
                self._complete = self._complete_after(chunk)
                return chunk
        return None

    def _parse(self, event: ServerSentEvent, obj: object) -> T | None:
        """The item an event carries, None for one to skip; raises on an error event."""
        raise NotImplementedError

    def _complete_after(self, item: T) -> bool:
        """Whether ``item`` is the last of the answer (chat ends at ``[DONE]`` instead)."""
        return False

    def _raise_error_event(self, event: ServerSentEvent, obj: object) -> None:
        if event.event == "error" or (isinstance(obj, dict) and "error" in obj):
            err = obj.get("error", obj) if isinstance(obj, dict) else obj
            message = err.get("message") if isinstance(err, dict) else None
            raise self._call.error(
                exc.StreamErrorEvent,
                "the server reported an error inside the stream: "
                f"{message or _excerpt(event.data)}",
                body=err,  # the inner error object, as openai's APIError.body
            )

    # -- closing -------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Stop the stream and release its connection. Safe to call more than once."""
        await self._body.aclose()

    async def close(self) -> None:
        """`aclose` under openai's name."""
        await self._body.aclose()

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class AsyncStream(_EventStream[ChatCompletionChunk]):
    """Async iterator of `ChatCompletionChunk`, returned by ``create(..., stream=True)``.

    Use it as ``async for chunk in stream`` and/or ``async with stream``. Besides the
    chunks, it exposes ``request_id``, ``server_request_id``, ``status_code`` and
    ``headers`` (the response's).
    """

    def _parse(self, event: ServerSentEvent, obj: object) -> ChatCompletionChunk | None:
        if not event.data:
            return None  # an event with no data carries nothing (a named ping, say)
        named = event.event not in ("message", "chunk")
        if obj is None:
            if named:
                return None  # a named event's non-JSON data is not ours to judge: skipped
            raise self._call.error(
                exc.MalformedResponse, f"SSE data is not JSON: {_excerpt(event.data)}"
            )
        self._raise_error_event(event, obj)
        if named:
            return None  # other named events (pings, metadata) are not chunks
        return to_result(ChatCompletionChunk, obj, self._call)


class ResponseStream(_EventStream[ResponseStreamEvent]):
    """Async iterator of the Responses API's events (openai's ``ResponseStreamEvent``
    union), returned by ``client.responses.create(..., stream=True)``.

    Each event is validated as the class its ``type`` names. The stream ends after
    ``response.completed``, ``response.failed`` or ``response.incomplete``, as openai's
    does, even if the server holds the socket open after it. An ``error`` event raises
    `StreamErrorEvent`. An event of a type this openai version does not know is skipped
    (it still counts as progress for ``idle``).
    """

    def _parse(self, event: ServerSentEvent, obj: object) -> ResponseStreamEvent | None:
        if not event.data or not isinstance(obj, dict):
            if event.data and obj is None and event.event in ("message", None):
                raise self._call.error(
                    exc.MalformedResponse, f"SSE data is not JSON: {_excerpt(event.data)}"
                )
            return None
        kind = obj.get("type")
        if kind == "error" or event.event == "error":
            raise self._call.error(
                exc.StreamErrorEvent,
                "the server reported an error inside the stream: "
                f"{obj.get('message') or _excerpt(event.data)}",
                body=obj,
            )
        cls = _response_event_classes().get(kind) if isinstance(kind, str) else None
        if cls is None:
            return None
        event_: ResponseStreamEvent = to_result(cls, obj, self._call)  # type: ignore[assignment]
        return event_

    def _complete_after(self, item: ResponseStreamEvent) -> bool:
        return item.type in _TERMINAL_EVENTS


_TERMINAL_EVENTS = frozenset({"response.completed", "response.failed", "response.incomplete"})


@functools.cache
def _response_event_classes() -> dict[str, type[pydantic.BaseModel]]:
    """``type`` -> the event class, from openai's discriminated union (whatever events the
    installed openai knows)."""
    union = typing.get_args(ResponseStreamEvent)[0]
    classes: dict[str, type[pydantic.BaseModel]] = {}
    for cls in typing.get_args(union):
        for value in typing.get_args(cls.model_fields["type"].annotation):
            classes[value] = cls
    return classes


class _Closer(httpx2.AsyncByteStream):
    """The body of `AsyncStream.response`: it yields nothing (chunks are the stream's) and
    closing it closes the stream, which is what openai's stream helpers do with it."""

    def __init__(self, stream: _EventStream[Any]) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        return
        yield b""

    async def aclose(self) -> None:
        await self._stream.aclose()


def _excerpt(text: str, limit: int = 120) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
