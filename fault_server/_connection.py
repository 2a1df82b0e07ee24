"""One accepted connection: read requests with h11, pick each one's fault, run it, repeat.

Bounds, all from the server's ``max_hold``: waiting for a request (keep-alive idle), reading
one request (head and body together), and running one fault (its ``hold``, never more than
``max_hold``). A client that misbehaves gets an HTTP error where one can still be sent; a
client that leaves ends its exchange; nothing here raises into the server.

Every bound is an anyio cancel scope around code that runs in the connection's own task,
never ``asyncio.wait_for``: before Python 3.12 that runs its coroutine in a task of its own,
and when the caller is cancelled it cancels that task and waits for it without ever reading
its outcome, so a fault that ended with `PeerGone` as the server shut down was reported as
"Task exception was never retrieved". The only other task is the `PeerWatcher`'s, which is
cancelled and awaited when the fault ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time

import anyio
import h11

from ._behaviours import BEHAVIOURS
from ._control import PREFIX, control
from ._exchange import Exchange, Outcome, PeerGone, PeerWatcher, whole_bytes
from ._faults import FaultSpec, FaultSpecError, parse_fault
from ._openai import (
    ChatRequest,
    EventStream,
    RequestError,
    Whole,
    completion,
    completion_stream,
    error,
    models,
    parse_chat,
)
from ._stats import Counters

__all__ = ["MAX_BODY", "Connection"]

logger = logging.getLogger("fault_server")

MAX_BODY = 8 * 1024 * 1024  # larger request bodies get a 413.
_MAX_HEAD = 64 * 1024  # larger request heads get a 431 (h11's status hint).
_READ_SIZE = 65536
_LINGER = 1.0  # bounds the drain of an unread body after an early error answer.
_CLOSE_FLUSH = 1.0  # bounds the flush of a graceful close before it becomes an abort.
_CHAT = "/v1/chat/completions"
_MODELS = "/v1/models"


class _Closed(Exception):
    """The connection must end: the client left, timed out, or broke the protocol."""


class Connection:
    """Serves the requests of one accepted connection until it must close."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        counters: Counters,
        max_hold: float,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._counters = counters
        self._max_hold = max_hold
        self._conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_HEAD)
        self._keys_seen: set[tuple[int, str]] = set()
        self._request: h11.Request | None = None

    async def serve(self) -> None:
        """Serve until the connection ends; closes it in every case.

        Ends with a FIN (its flush bounded by `_CLOSE_FLUSH`), except when the client is
        already gone, a fault aborted, or the server is shutting down: then at once.
        """
        graceful = False
        try:
            graceful = await self._serve()
        except _Closed:
            graceful = True  # a FIN, so an idle keep-alive client sees a clean end.
        except PeerGone:
            pass
        finally:
            if graceful:
                await self._close()
            else:
                self._writer.transport.abort()

    async def _serve(self) -> bool:
        """Serve requests; True when the connection may be closed gracefully."""
        while True:
            request = await self._next_request()
            if request is None:
                return True
            outcome = await self._handle(request)
            if outcome is not Outcome.KEEP:
                return outcome is Outcome.CLOSE
            conn = self._conn
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return True
            conn.start_next_cycle()

    # -- reading -----------------------------------------------------------------------

    async def _next_request(self) -> h11.Request | None:
        """The next request head, or None when the client is done with the connection."""
        deadline = time.monotonic() + self._max_hold
        while True:
            event = await self._next_event(deadline)
            if isinstance(event, h11.Request):
                return event
            if isinstance(event, h11.ConnectionClosed):
                return None

    async def _read_body(self, deadline: float) -> bytes | None:
        """The request body, or None after answering 413 (the connection then closes)."""
        length = self._header(b"content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY:
            await self._refuse_body()
            return None
        if self._conn.they_are_waiting_for_100_continue:
            await self._write(
                self._conn.send(h11.InformationalResponse(status_code=100, headers=[]))
            )
        body = bytearray()
        while True:
            event = await self._next_event(deadline)
            if isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY:
                    await self._refuse_body()
                    return None
            elif isinstance(event, h11.EndOfMessage):
                return bytes(body)
            elif isinstance(event, h11.ConnectionClosed):
                raise _Closed

    async def _next_event(self, deadline: float) -> h11.Event:
        while True:
            try:
                event = self._conn.next_event()
            except h11.RemoteProtocolError as exc:
                await self._answer_broken_request(exc)
                raise _Closed from exc
            if isinstance(event, h11.Event):
                return event
            if event is h11.PAUSED:
                raise _Closed  # only after a protocol switch, which we never accept.
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Closed
            try:
                with anyio.fail_after(remaining):
                    data = await self._reader.read(_READ_SIZE)
            except (TimeoutError, ConnectionError, OSError) as exc:
                raise _Closed from exc
            self._conn.receive_data(data)

    def _header(self, name: bytes) -> str | None:
        if self._request is None:
            return None
        for key, value in self._request.headers:
            if key == name:
                return value.decode("latin-1").strip()
        return None

    # -- answering ---------------------------------------------------------------------

    async def _handle(self, request: h11.Request) -> Outcome:
        self._request = request
        deadline = time.monotonic() + self._max_hold
        method = request.method.decode("ascii", "replace")
        path = request.target.decode("ascii", "replace").partition("?")[0]
        request_id = self._request_id()
        if path.startswith(PREFIX):
            if await self._read_body(deadline) is None:
                return Outcome.CLOSE
            return await self._send(control(method, path, self._counters), request_id)
        self._counters.request()
        spec_text: str | None = None
        if path.startswith("/fault/"):
            spec_text, _, rest = path[len("/fault/") :].partition("/")
            path = "/" + rest
        spec_text = self._header(b"x-fault") or spec_text
        try:
            spec = parse_fault(spec_text) if spec_text else FaultSpec()
        except FaultSpecError as exc:
            return await self._refuse(error(400, str(exc), code="invalid_fault"), request_id)
        spec = self._count_key(spec)
        routed = self._route(method, path)
        if routed is not None:
            return await self._refuse(routed, request_id)
        hold = self._max_hold
        if spec.get("hold") is not None:
            hold = min(hold, spec.number("hold"))
        if spec.name == "half_open":  # never read past the head.
            reply: Whole | EventStream = Whole(200, b"")
            return await self._run(spec, reply, None, request_id, hold)
        body = await self._read_body(deadline)
        if body is None:
            return Outcome.CLOSE
        chat: ChatRequest | None = None
        if path == _MODELS:
            reply = models()
        else:
            try:
                chat = parse_chat(body)
            except RequestError as exc:
                return await self._send(error(400, str(exc), param=exc.param), request_id)
            tokens = spec.integer("tokens")
            reply = completion_stream(chat, tokens) if chat.stream else completion(chat, tokens)
        return await self._run(spec, reply, chat, request_id, hold)

    def _count_key(self, spec: FaultSpec) -> FaultSpec:
        """Count the request under its key; past ``first`` such requests, serve healthy."""
        key = spec.key
        if key is None:
            return spec
        ordinal = self._counters.key_request(key, self._keys_seen)
        first = spec.first
        if first is not None and ordinal > first:
            return FaultSpec()
        self._counters.key_faulted(key)
        return spec

    @staticmethod
    def _route(method: str, path: str) -> Whole | None:
        """An error for a path or method we do not serve, else None."""
        wanted = {_CHAT: "POST", _MODELS: "GET"}.get(path)
        if wanted is None:
            return error(404, f"unknown path {path!r}; served: {_CHAT}, {_MODELS}")
        if method != wanted:
            return error(405, f"{path} takes {wanted}, not {method}")
        return None

    async def _run(
        self,
        spec: FaultSpec,
        reply: Whole | EventStream,
        chat: ChatRequest | None,
        request_id: str,
        hold: float,
    ) -> Outcome:
        """Run the fault's behaviour for at most ``hold`` seconds."""
        watcher = PeerWatcher(self._reader, self._conn)
        exchange = Exchange(
            conn=self._conn,
            writer=self._writer,
            watcher=watcher,
            spec=spec,
            reply=reply,
            chat=chat,
            request_id=request_id,
        )
        behaviour = BEHAVIOURS[spec.name]
        watcher.start()
        try:
            with anyio.move_on_after(hold):
                await exchange.sleep(spec.number("delay"))
                return await behaviour(exchange)
            return Outcome.CLOSE  # hold ran out.
        except PeerGone:
            return Outcome.ABORTED
        finally:
            await watcher.stop()

    async def _refuse(self, whole: Whole, request_id: str) -> Outcome:
        """Answer an error before the body was read: read (and drop) it first."""
        if await self._read_body(time.monotonic() + self._max_hold) is None:
            return Outcome.CLOSE
        return await self._send(whole, request_id)

    async def _send(self, whole: Whole, request_id: str, *, close: bool = False) -> Outcome:
        headers = [("x-request-id", request_id)]
        if close:
            headers.append(("connection", "close"))
        head_only = self._request is not None and self._request.method == b"HEAD"
        try:
            await self._write(whole_bytes(self._conn, whole, headers, head_only=head_only))
        except PeerGone:
            return Outcome.ABORTED
        return Outcome.CLOSE if close else Outcome.KEEP

    async def _refuse_body(self) -> None:
        """Answer 413, then drain what the client still sends, briefly, before closing.

        Closing with unread data would send an RST that can destroy the 413 in flight.
        """
        whole = error(413, f"request body larger than {MAX_BODY} bytes")
        if await self._send(whole, self._request_id(), close=True) is Outcome.ABORTED:
            raise _Closed
        with anyio.move_on_after(_LINGER), contextlib.suppress(Exception):
            self._writer.write_eof()
            while await self._reader.read(_READ_SIZE):
                pass

    async def _answer_broken_request(self, exc: h11.RemoteProtocolError) -> None:
        """A 4xx for a request h11 cannot parse, if a response can still be sent."""
        if self._conn.our_state not in {h11.IDLE, h11.SEND_RESPONSE}:
            return
        whole = error(exc.error_status_hint, f"malformed HTTP request: {exc}")
        headers = [("x-request-id", self._request_id()), ("connection", "close")]
        with contextlib.suppress(PeerGone, h11.LocalProtocolError):
            await self._write(whole_bytes(self._conn, whole, headers))

    def _request_id(self) -> str:
        """The client's ``x-request-id`` when it sent a sane one, else a new ``req_<hex>``."""
        given = self._header(b"x-request-id")
        if given and len(given) <= 200 and given.isprintable():
            return given
        return "req_" + secrets.token_hex(16)

    async def _write(self, data: bytes | None) -> None:
        if not data:
            return
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            raise PeerGone from exc

    async def _close(self) -> None:
        """Close with a FIN after flushing; abort if the flush takes over `_CLOSE_FLUSH`."""
        transport = self._writer.transport
        if transport.is_closing():
            transport.abort()
            return
        self._writer.close()
        try:
            with anyio.fail_after(_CLOSE_FLUSH):
                await self._writer.wait_closed()
        except (TimeoutError, ConnectionError, OSError):
            transport.abort()
        except asyncio.CancelledError:
            transport.abort()
            raise
