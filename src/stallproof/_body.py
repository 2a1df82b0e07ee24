"""`ResponseBody`: a response body that stays bounded while the caller reads it.

The engine returns a response once its body is safe to hand over: a whole body already
read (non-stream answers, error answers), or an event stream read up to its first content
event. What is left of a stream is read here, one bounded step at a time: each read waits
at most until the earliest of the call's total deadline and its phase bound (``first_token``
before the first content event, ``idle`` after). Only time spent waiting on the server
counts towards those two; time the caller spends between reads does not. Total is wall
time and counts everything.

A body is read either as bytes (what a transport hands httpx) or as events (what
stallproof's own client parses); the events are decoded once, by the engine, to tell
content from keep-alives, and the same decoding serves both.

States, and the only moves between them::

    LIVE ──(the server ends the body)──▶ DRAINED ──(aclose)──▶ CLOSED
      └──────────(aclose, error, cancellation)──────────────────▲

The body owns its connection and its `CallScope` from its constructor: closing it (or
reaching an error) releases the connection and ends the call, exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import warnings
from collections import deque
from collections.abc import AsyncIterator, Callable
from types import TracebackType

import anyio
import httpcore2
import sniffio

from . import _exceptions as exc
from ._call import Call
from ._callscope import CallScope
from ._config import Limits
from ._decoding import ContentDecoder, typed_errors
from ._progress import Outcome, classify
from ._sse import LineTooLong, ServerSentEvent, SSEDecoder

__all__ = ["Event", "ResponseBody", "aclose_iterator", "close_pool_response", "closes_at_once"]

# Closing is local work (a socket close), but it is bounded too.
_CLOSE_BOUND = 5.0
# After the end of a stream's content, how long we wait for the end of the HTTP body so the
# connection can be reused. A server that holds the socket open costs at most this much.
_DRAIN_BOUND = 0.25
# The most bytes of events sorted between two checkpoints.
_SLICE = 16 * 1024

_NO_SCOPE = contextlib.nullcontext()

Event = tuple[ServerSentEvent, object, bool]
"""A decoded event, its data parsed as JSON (None if not JSON), and whether it is content."""


class _State(enum.Enum):
    LIVE = "live"  # more may come from the server
    DRAINED = "drained"  # the server ended the body; buffered data may remain
    CLOSED = "closed"  # released: connection back or closed, call ended


async def aclose_iterator(iterator: AsyncIterator[bytes]) -> None:
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        await aclose()


def closes_at_once(response: httpcore2.Response) -> bool:
    """Whether closing ``response`` does no I/O and never suspends (the asyncio wire's
    bodies: `_wire._pool._Body.closes_at_once`): nothing can interrupt it, so it needs no
    shield and no timer."""
    return getattr(response.stream, "closes_at_once", False) is True


async def close_pool_response(response: httpcore2.Response) -> None:
    """Release a pool response's connection, even from a cancelled scope."""
    with anyio.move_on_after(_CLOSE_BOUND, shield=True):
        await response.aclose()


_closing: set[asyncio.Task[None]] = set()


async def _close_quietly(
    raw: AsyncIterator[bytes] | None, pool_response: httpcore2.Response
) -> None:
    # Only the response: its body iterator (``raw``) may be in the same garbage cycle as
    # the body, and then the loop's async-generator hook finalises it already.
    del raw
    with anyio.move_on_after(_CLOSE_BOUND, shield=True), contextlib.suppress(Exception):
        await pool_response.aclose()


_Closer = Callable[[AsyncIterator[bytes] | None, httpcore2.Response], None]


def _closer() -> _Closer | None:
    """A way for a finaliser to close a response on the running event loop (thread-safe
    and safe from ``__del__``: it only schedules). None on an unknown loop."""
    library = sniffio.current_async_library()
    if library == "asyncio":
        loop = asyncio.get_running_loop()

        def start(raw: AsyncIterator[bytes] | None, pool_response: httpcore2.Response) -> None:
            task = loop.create_task(_close_quietly(raw, pool_response))
            _closing.add(task)  # a strong reference until it is done
            task.add_done_callback(_closing.discard)

        def schedule_asyncio(
            raw: AsyncIterator[bytes] | None, pool_response: httpcore2.Response
        ) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to do
                loop.call_soon_threadsafe(start, raw, pool_response)

        return schedule_asyncio
    if library == "trio":
        import trio

        token = trio.lowlevel.current_trio_token()

        def schedule_trio(
            raw: AsyncIterator[bytes] | None, pool_response: httpcore2.Response
        ) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(
                    trio.lowlevel.spawn_system_task, _close_quietly, raw, pool_response
                )

        return schedule_trio
    return None  # pragma: no cover


class ResponseBody:
    """The body of one response: whole (``content``) or a live event stream."""

    def __init__(
        self,
        scope: CallScope,
        limits: Limits,
        *,
        content: bytes | None = None,
        pool_response: httpcore2.Response | None = None,
        outcome: Outcome | None = None,
        parse_outcome: Callable[[bytes], Outcome | None] | None = None,
        decoder: ContentDecoder | None = None,
    ) -> None:
        self._scope = scope
        self._call: Call = scope.call
        self._limits = limits
        self.content = content
        self._pool_response = pool_response
        telemetry = scope.telemetry
        keep_text = telemetry.recording and telemetry.instruments.record_content
        self.outcome = outcome if outcome is not None else Outcome(keep_text=keep_text)
        self._parse_outcome = parse_outcome
        self._state = _State.DRAINED if pool_response is None else _State.LIVE
        self._raw: AsyncIterator[bytes] | None = None
        self._close_later: _Closer | None = None
        if pool_response is not None:
            self._raw = pool_response.stream.__aiter__()  # type: ignore[union-attr]
            self._close_later = _closer()
        self._decoder = SSEDecoder(limits.max_line_bytes)
        # Decodes the pool_response's Content-Encoding and counts the decoded bytes of the whole
        # stream against max_response_bytes.
        self._content = decoder or ContentDecoder((), limits.max_response_bytes)
        # Buffered before the caller chose how to read: bytes and their events.
        self._chunks: deque[bytes] = deque()
        self._events: deque[Event] = deque()
        self._mode: str | None = None
        self._seen_content = False
        # Server-waiting time since the request was sent (first_token) or since the last
        # content event (idle).
        call = self._call
        self._waited = call.now() - (call.sent_at or call.started)
        # When the last step, which brought no content, ended: the caller's time from then
        # to the next step counts as waiting too (see `_step`). None after content.
        self._idle_since: float | None = None
        # Data of the events kept before the caller chose how to read (see `_absorb_events`).
        self._kept_undecided = 0
        # How many of the queued chunks (a byte reader's) and events (stallproof's client's)
        # the caller takes until it has taken the last one that carries content: from then
        # on its time counts (`_content_taken`), in the middle of a read as at its end.
        self._chunks_to_content = 0
        self._events_to_content = 0
        self._handed_content = False  # the event just handed out was the last content queued

    @property
    def is_stream(self) -> bool:
        return self._pool_response is not None

    @property
    def closed(self) -> bool:
        return self._state is _State.CLOSED

    @property
    def seen_content(self) -> bool:
        return self._seen_content

    # -- reading, one bounded step at a time -----------------------------------------------

    async def prefetch(self) -> None:
        """Read up to and including the first content event (or the end).

        Runs inside the engine's attempt, under its first_token bound, so anything that
        goes wrong before content can still be retried: the caller has seen nothing.
        """
        while not self._seen_content and self._state is _State.LIVE:
            await self._step()
        if self._seen_content:
            self._scope.telemetry.first_chunk()

    async def _step(self) -> None:
        """One read from the server, under total and the phase bound, decoded and sorted."""
        assert self._raw is not None
        call = self._call
        bound, limit = self._phase()
        start = call.now()
        if start >= call.total_deadline:
            raise call.timeout_error("total")
        if self._idle_since is not None:
            # The caller's time is not counted while it holds content; what it spends on
            # events that carried none (an SDK parsing a flood of empty chunks) is: else a
            # flood that costs the caller more than the server would hold idle off forever.
            self._waited += start - self._idle_since
        content = False
        deadline = start + (limit - self._waited)
        read_before = getattr(self._raw, "read_before", None)
        if read_before is not None:
            # The asyncio wire: the read is bounded by a loop timer, not a cancel scope.
            data = await call.read_before(read_before, bound, deadline)
            if data is not None:
                with call.step(bound, deadline) if self._needs_slices(data) else _NO_SCOPE:
                    content = await self._sort(data)
        else:
            with call.step(bound, deadline):
                try:
                    data = await self._raw.__anext__()
                except StopAsyncIteration:
                    data = None
                if data is not None:
                    content = await self._sort(data)
        if data is None:
            with typed_errors(call, self._limits.max_response_bytes):
                self._content.finish()
            # An event cut off by the end of the body is discarded, as the SSE spec says.
            self._state = _State.DRAINED
            return
        if content:
            self._seen_content = True
            self._waited = 0.0
            self._idle_since = None
        else:
            end = call.now()
            self._waited += end - start
            self._idle_since = end

    def _phase(self) -> tuple[str, float]:
        """The phase bound that counts time without content now, and its limit."""
        t = self._call.timeouts
        return ("idle", t.idle) if self._seen_content else ("first_token", t.first_token)

    def _needs_slices(self, data: bytes) -> bool:
        """Whether sorting ``data`` may await (and so must run under the step's scope)."""
        return len(data) > _SLICE or not self._content.identity

    async def _sort(self, data: bytes) -> bool:
        """Decode and sort one read's bytes; True on content. Awaits only if
        `_needs_slices`: a checkpoint between pieces, so the step's deadline fires in the
        middle of a flood of tiny events or of a body that decodes to far more."""
        call = self._call
        content = False
        call.progress(len(data))
        with typed_errors(call, self._limits.max_response_bytes):
            for piece in self._content.feed(data):
                for at in range(0, len(piece), _SLICE):
                    if at:
                        await anyio.lowlevel.checkpoint()
                    content = self._take(piece[at : at + _SLICE]) or content
                if not self._content.identity:
                    await anyio.lowlevel.checkpoint()
        return content

    def _take(self, data: bytes) -> bool:
        """Keep decoded bytes for a byte reader and sort their events; True on content."""
        keep = self._mode != "events"
        if keep:
            self._chunks.append(data)
        try:
            events = self._decoder.feed(data)
        except LineTooLong:
            raise self._call.error(
                exc.ResponseTooLarge,
                f"an SSE line passed max_line_bytes={self._limits.max_line_bytes}",
                limit=self._limits.max_line_bytes,
            ) from None
        content = self._absorb_events(events)
        if content and keep:
            self._chunks_to_content = len(self._chunks)
        return content

    def _absorb_events(self, events: list[ServerSentEvent]) -> bool:
        content = 0
        mode = self._mode
        outcome = self.outcome
        telemetry = self._scope.telemetry
        for event in events:
            is_content, obj = classify(event, outcome)
            if is_content:
                content += 1
                telemetry.chunk()
            if mode == "events":
                self._events.append((event, obj, is_content))
            elif mode is None and (
                is_content or self._kept_undecided <= self._limits.max_line_bytes
            ):
                # Before the caller chose (the engine's prefetch), each event is kept twice:
                # as bytes (bounded by max_response_bytes) and decoded, ten times larger.
                # Past a line's cap of events without content, those are kept as bytes
                # alone: a flood before the first content cannot cost ten times the stream.
                self._kept_undecided += len(event.data)
                self._events.append((event, obj, is_content))
            else:
                continue
            if is_content:
                self._events_to_content = len(self._events)
        if content:
            self._call.progress(content=content)  # (one clock reading for the whole read)
        return content > 0

    async def _guarded_step(self) -> None:
        """A step after the body was handed over: a failure ends the call."""
        try:
            await self._step()
        except BaseException as e:
            await self._fail(e)
            raise

    # -- as bytes (for a transport) --------------------------------------------------------

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive; ends the call at the end or on error."""
        self._mode = "bytes"
        self._events.clear()
        if self.content is not None:
            if self.content:
                yield self.content
            await self.aclose()
            return
        try:
            while True:
                if self._decoder.not_utf8:
                    # The SDKs decode an event stream's lines strictly: a byte that is not
                    # UTF-8 would fail raw inside their decoder. Typed here, before the
                    # chunk that holds it is handed on.
                    await self._fail_with(exc.MalformedResponse, "the event stream is not UTF-8")
                while self._chunks:
                    yield self._chunks.popleft()
                    if self._chunks_to_content:
                        self._chunks_to_content -= 1
                        if not self._chunks_to_content:
                            self._content_taken()
                    if self._chunks:
                        await self._fail_if_overdue()
                if self._state is not _State.LIVE:
                    break
                if self.outcome.saw_done:
                    # The stream said it is complete ([DONE], response.completed,
                    # message_stop): what follows is at most the end of the HTTP body. An
                    # SDK reads on to the end of the body (the Responses and Messages
                    # streams do), so a server that holds the socket open after its last
                    # event would turn a complete answer into an idle timeout.
                    await self._drain()
                    break
                await self._guarded_step()
        finally:
            await self.aclose()

    # -- as events (for stallproof's own client) ---------------------------------------------

    async def next_event(self) -> Event | None:
        """The next decoded event, or None at the end of the body. Does not close."""
        self._mode = "events"
        self._chunks.clear()
        if self._handed_content:
            self._handed_content = False
            self._content_taken()
        if self._events:
            await self._fail_if_overdue()
        while not self._events:
            if self._state is not _State.LIVE:
                return None
            await self._guarded_step()
        if self._events_to_content:
            self._events_to_content -= 1
            self._handed_content = not self._events_to_content
        return self._events.popleft()

    def _content_taken(self) -> None:
        """The caller asks for more after the last content queued: its time counts from now,
        whether the rest of the read (events without content) is queued or still to come.
        (A read that brings content and then a flood would otherwise hand the flood over
        uncounted: an SDK parsing it on a starved process, idle that much late.)"""
        self._waited = 0.0
        self._idle_since = self._call.now()

    async def _fail_if_overdue(self) -> None:
        """Between the pieces of one read the caller takes (a read holds up to the socket's
        buffer: thousands of events in a flood), the bound the caller's time has used up
        fails the call now, not at the next read: an SDK parsing a quarter megabyte of
        empty chunks on a starved process would make ``idle`` that much late. Total always
        counts; first_token or idle once the caller's time counts: after a read that
        brought no content (`_step`), or once it took the last content queued
        (`_content_taken`)."""
        call = self._call
        now = call.now()
        if now >= call.total_deadline:
            bound = "total"
        elif self._idle_since is None:
            return
        else:
            bound, limit = self._phase()
            if self._waited + (now - self._idle_since) < limit:
                return
        error = call.timeout_error(bound)
        await self._fail(error)
        raise error

    # -- the end ---------------------------------------------------------------------------

    async def _fail(self, error: BaseException) -> None:
        self._scope.end(error)
        await self._release()

    async def _fail_with(self, cls: type[exc.StallproofError], message: str) -> None:
        error = self._call.error(cls, message)
        await self._fail(error)
        raise error

    async def discard(self) -> None:
        """Release the connection without ending the call (its attempt failed: a retry
        may follow)."""
        await self._release()

    async def fail(self, error: BaseException) -> None:
        """End the call with ``error`` (a face found the body unacceptable) and release."""
        await self._fail(error)

    async def finish(self) -> None:
        """The content is complete: read the rest of the body briefly, then close.

        Reading the end of the HTTP body lets the connection go back to the pool; a server
        that holds the socket open after its last event costs at most a quarter second.
        """
        await self._drain()
        await self.aclose()

    async def _drain(self) -> None:
        """Read the rest of the body, discarded, for at most `_DRAIN_BOUND` (and never past
        total): DRAINED if it ends in that time, which frees the connection for reuse."""
        if self._state is _State.LIVE and self._raw is not None:
            bound = min(_DRAIN_BOUND, max(self._call.remaining(), 0.0))
            read_before = getattr(self._raw, "read_before", None)
            if read_before is not None:  # the asyncio wire: a loop timer, not a cancel scope
                until = self._call.now() + bound
                try:
                    while await read_before(until) is not None:
                        pass
                except TimeoutError:
                    return
                except Exception:
                    pass
                self._state = _State.DRAINED
                return
            with anyio.move_on_after(bound):
                with contextlib.suppress(Exception):
                    async for _ in self._raw:
                        pass
                self._state = _State.DRAINED

    async def aclose(self) -> None:
        """Release the connection and end the call. Safe to call more than once."""
        if self._state is _State.CLOSED:
            return
        complete = self._state is _State.DRAINED
        outcome = self.outcome
        if self.content is not None and self._parse_outcome is not None:
            outcome = self._parse_outcome(self.content) or outcome
        self._scope.end(None, outcome, complete=complete)
        await self._release()

    async def _release(self) -> None:
        if self._state is _State.CLOSED:
            return
        self._state = _State.CLOSED
        self._chunks.clear()
        self._events.clear()
        raw, pool_response = self._raw, self._pool_response
        self._raw = None
        if raw is not None or pool_response is not None:
            with (
                _NO_SCOPE
                if pool_response is not None and closes_at_once(pool_response)
                else anyio.move_on_after(_CLOSE_BOUND, shield=True)
            ):
                try:
                    if raw is not None:
                        # Finalise the body iterator now rather than at garbage collection.
                        with contextlib.suppress(Exception):
                            await aclose_iterator(raw)
                finally:
                    # In a ``finally``: an anyio shield does not stop asyncio's own
                    # ``Task.cancel()`` (asyncio.timeout, wait_for, TaskGroup), and a close
                    # it interrupts must still hand the connection back (the pool's
                    # bookkeeping runs before its first await: see `_wire._pool._Body`).
                    if pool_response is not None:
                        with contextlib.suppress(Exception):
                            await pool_response.aclose()

    def __del__(self) -> None:
        # Dropped without being read to the end or closed: the call's permit and its
        # in-flight entry are given back here, so a forgotten stream does not starve the
        # pacer; the connection is closed by a task scheduled on the body's event loop.
        if (
            self._pool_response is not None
            and self._state is not _State.CLOSED
            and not self._scope.ended
        ):
            self._state = _State.CLOSED
            self._scope.end(
                self._call.error(
                    exc.StallproofError,
                    "the response body was dropped without being closed",
                )
            )
            if self._close_later is not None:
                self._close_later(self._raw, self._pool_response)
            warnings.warn(
                f"stallproof: a response body (request_id={self._call.request_id}) was "
                "never closed; use `async with` or `await stream.aclose()`",
                ResourceWarning,
                stacklevel=1,
            )

    async def __aenter__(self) -> ResponseBody:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
