"""A streamed chat completion, bounded while the caller iterates it.

Each step of iteration runs under the earliest of: the call's total deadline, and either
``first_token`` (before the first content chunk) or ``idle`` (after it). Only time spent
waiting on the server counts towards first_token and idle; time the caller holds a chunk
does not. Total is wall time and counts everything.

The connection is released on every exit: end of stream, error, timeout, cancellation,
``break`` out of ``async for`` (the loop's generator is finalised at once), ``aclose()`` or
leaving ``async with``.
"""

from __future__ import annotations

import contextlib
import json
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from types import TracebackType

import anyio
import httpx

from . import _exceptions as exc
from ._call import Call
from ._config import Limits
from ._models import ChatCompletionChunk, Usage
from ._pacer import Permit
from ._sse import LineTooLong, ServerSentEvent, SSEDecoder

__all__ = ["AsyncStream"]

# After [DONE], how long we wait for the end of the HTTP body so the connection can be
# reused. A server that holds the socket open after [DONE] costs at most this much.
_DRAIN_AFTER_DONE = 0.25
# Closing is local work (a socket close), but it is bounded too.
_CLOSE_BOUND = 5.0
# Returned by the readers at `data: [DONE]` (or a clean end after a finish_reason).
_DONE = object()
# Non-content chunks kept from before the first content chunk.
_MAX_BUFFERED = 8


async def close_response(response: httpx.Response) -> None:
    """Release the response's connection, even from a cancelled scope."""
    with anyio.move_on_after(_CLOSE_BOUND, shield=True):
        await response.aclose()


class AsyncStream:
    """Async iterator of `ChatCompletionChunk`, returned by ``create(..., stream=True)``.

    Use it as ``async for chunk in stream`` and/or ``async with stream``. Besides the
    chunks, it exposes ``request_id``, ``server_request_id`` and ``response`` (the
    `httpx.Response`, headers only).
    """

    def __init__(self, response: httpx.Response, call: Call, limits: Limits) -> None:
        self.response = response
        self._call = call
        self._limits = limits
        self._bytes: AsyncGenerator[bytes, None] = response.aiter_bytes()  # type: ignore[assignment]
        self._decoder = SSEDecoder(limits.max_line_bytes)
        self._events: deque[ServerSentEvent] = deque()
        self._received = 0
        # Server-waiting time since the request was sent (first_token) or since the last
        # content chunk (idle).
        self._waited = anyio.current_time() - (call.sent_at or call.started)
        self._seen_content = False
        # Chunks read before the first content chunk, during the attempt (see _prefetch).
        self._buffered: deque[ChatCompletionChunk] = deque()
        # What the call's span reports at the end.
        self._response_id: str | None = None
        self._response_model: str | None = None
        self._finish_reasons: list[str] = []
        self._usage: Usage | None = None
        self._text: list[str] | None = [] if _records_content(call) else None
        self._ended = False
        self._last_had_content = False  # whether the chunk _parse returned last is progress
        self._permit: Permit | None = None  # the pacer's, set by the client
        self._finished = False
        self._done = False
        self._closed = False
        call.set_phase("streaming")

    @property
    def request_id(self) -> str:
        return self._call.request_id

    @property
    def server_request_id(self) -> str | None:
        return self._call.server_request_id

    # -- iteration -----------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[ChatCompletionChunk]:
        # A fresh generator per loop: when the caller `break`s, the loop drops its only
        # reference, the generator is finalised and its `finally` releases the connection.
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[ChatCompletionChunk]:
        try:
            while (chunk := await self._next()) is not None:
                yield chunk
        finally:
            await self.aclose()

    async def __anext__(self) -> ChatCompletionChunk:
        chunk = await self._next()
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def _prefetch(self) -> None:
        """Read up to and including the first content chunk (or the end), keeping them.

        Runs inside the client's attempt, under its first_token bound, so anything that
        goes wrong before content can still be retried.
        """
        while (chunk := await self._read_chunk()) is not _DONE:
            assert isinstance(chunk, ChatCompletionChunk)
            if self._last_had_content:
                self._buffered.append(chunk)
                self._seen_content = True
                self._waited = 0.0
                if self._call.observer is not None:
                    self._call.observer.first_chunk()
                return
            # Keep the first few (the role chunk); keep-alive deltas carry nothing, and a
            # server sending them forever must not grow memory.
            if len(self._buffered) < _MAX_BUFFERED:
                self._buffered.append(chunk)
        self._done = True

    async def _next(self) -> ChatCompletionChunk | None:
        if self._closed:
            return None
        if self._buffered:
            return self._buffered.popleft()
        if self._done:
            await self._finish()
            return None
        call = self._call
        t = call.timeouts
        bound, limit = ("idle", t.idle) if self._seen_content else ("first_token", t.first_token)
        start = anyio.current_time()
        try:
            if start >= call.total_deadline:
                raise call.timeout_error("total")
            # Events already received need no waiting, so no cancel scope: the common case
            # when a read carries several chunks.
            got = self._take_received()
            if got is None:
                with call.step(bound, start + (limit - self._waited)), call.translate_errors():
                    got = await self._read_chunk()
        except BaseException as e:
            self._end(e)
            await self.aclose()
            raise
        if got is _DONE:
            self._done = True
            await self._finish()
            return None
        assert isinstance(got, ChatCompletionChunk)
        if self._last_had_content:
            self._seen_content = True
            self._waited = 0.0
        else:
            self._waited += anyio.current_time() - start
        return got

    def _take_received(self) -> ChatCompletionChunk | object | None:
        """The next chunk among events already decoded, `_DONE` at ``[DONE]``, or None."""
        events = self._events
        while events:
            event = events.popleft()
            if event.data == "[DONE]":
                return _DONE
            chunk = self._parse(event)
            if chunk is not None:
                return chunk
        return None

    async def _read_chunk(self) -> ChatCompletionChunk | object:
        """Read until the next chunk event; `_DONE` at ``[DONE]`` or a clean end."""
        while True:
            got = self._take_received()
            if got is not None:
                return got
            try:
                data = await self._bytes.__anext__()
            except StopAsyncIteration:
                if self._finished:
                    return _DONE
                raise self._call.error(
                    exc.TruncatedResponse,
                    "stream ended without [DONE] and without a finish_reason",
                ) from None
            self._received += len(data)
            self._call.progress(len(data))
            if self._received > self._limits.max_response_bytes:
                raise self._call.error(
                    exc.ResponseTooLarge,
                    f"stream passed max_response_bytes={self._limits.max_response_bytes}",
                    limit=self._limits.max_response_bytes,
                )
            try:
                self._events.extend(self._decoder.feed(data))
            except LineTooLong:
                raise self._call.error(
                    exc.ResponseTooLarge,
                    f"an SSE line passed max_line_bytes={self._limits.max_line_bytes}",
                    limit=self._limits.max_line_bytes,
                ) from None

    def _parse(self, event: ServerSentEvent) -> ChatCompletionChunk | None:
        if not event.data:
            return None  # an event with no data carries nothing (a named ping, say)
        try:
            obj = json.loads(event.data)
        except ValueError:
            raise self._call.error(
                exc.MalformedResponse, f"SSE data is not JSON: {_excerpt(event.data)}"
            ) from None
        if event.event == "error" or (isinstance(obj, dict) and "error" in obj):
            err = obj.get("error", obj) if isinstance(obj, dict) else obj
            message = err.get("message") if isinstance(err, dict) else None
            raise self._call.error(
                exc.StreamErrorEvent,
                "the server reported an error inside the stream: "
                f"{message or _excerpt(event.data)}",
                body=obj,
            )
        if event.event not in ("message", "chunk"):
            return None  # other named events (pings, metadata) are not chunks
        chunk = ChatCompletionChunk.from_dict(obj, "chunk")
        self._note(chunk)
        return chunk

    def _note(self, chunk: ChatCompletionChunk) -> None:
        """Keep what the span reports, and count content as progress."""
        self._response_id = self._response_id or chunk.id
        self._response_model = self._response_model or chunk.model
        for c in chunk.choices:
            if c.finish_reason:
                self._finished = True
                self._finish_reasons.append(c.finish_reason)
            if self._text is not None and c.delta.content:
                self._text.append(c.delta.content)
        if chunk.usage is not None:
            self._usage = chunk.usage
        self._last_had_content = chunk.has_content
        if self._last_had_content:
            self._call.progress(content=True)

    def _end(self, error: BaseException | None) -> None:
        """The logical call is over: end its span and leave the in-flight view."""
        if self._ended:
            return
        self._ended = True
        call = self._call
        observer = call.observer
        if observer is not None:
            if error is not None:
                observer.failed(error)
            else:
                usage = self._usage
                if not self._done and observer.recording:
                    observer.span.set_attribute("stallproof.stream.abandoned", True)
                observer.finished(
                    response_id=self._response_id,
                    response_model=self._response_model,
                    finish_reasons=self._finish_reasons,
                    input_tokens=usage.prompt_tokens if usage else None,
                    output_tokens=usage.completion_tokens if usage else None,
                    output_text="".join(self._text) if self._text is not None else None,
                )
        permit = self._permit
        if permit is not None:
            usage = self._usage
            permit.release(
                used_tokens=usage.total_tokens if usage and error is None else None,
                succeeded=error is None and self._done,
            )
        call.unregister()

    # -- closing -------------------------------------------------------------------------

    async def _finish(self) -> None:
        # Read the end of the HTTP body if it is already on its way, so the connection can
        # go back to the pool; never wait long for it.
        if not self.response.is_closed:
            with anyio.move_on_after(min(_DRAIN_AFTER_DONE, max(self._call.remaining(), 0))):
                with contextlib.suppress(httpx.HTTPError):
                    async for _ in self._bytes:
                        pass
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the stream and release its connection. Safe to call more than once."""
        self._end(None)
        if not self._closed:
            self._closed = True
            with anyio.move_on_after(_CLOSE_BOUND, shield=True):
                # Finalise the body iterator now rather than at garbage collection.
                await self._bytes.aclose()
            await close_response(self.response)

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def _excerpt(text: str, limit: int = 120) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _records_content(call: Call) -> bool:
    observer = call.observer
    return observer is not None and observer.recording and observer.t.record_content
