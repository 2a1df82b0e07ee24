"""`H1Connection`: one HTTP/1.1 connection on an asyncio Protocol, parsed by llhttp (httptools).

The pool's connection on asyncio for direct origins (`Pool` picks it; proxied origins and
trio keep httpcore2's). It does what httpcore2's ``AsyncHTTPConnection`` does for the
pool — connect (DNS through `Network.resolve`), TLS, send a request, read its head and
body, keep the connection alive — at a fraction of the Python work per call:

- the request head and body leave in one write (httpcore2: two sends, one per h11 event);
- bytes are pushed to it by the event loop (``data_received``) and parsed in C by llhttp,
  which also undoes chunked framing; a read of the body takes everything buffered so far;
- a read waits on one future; its ``read`` bound (and a write's ``write`` bound) is a
  loop timer that fails that future, not an anyio cancel scope per read; and one timer
  per connection serves every read, moved on only when it fires early (`_arm`).

Everything that bounds a call from outside still holds: a read or a write is an await on
a future, which the engine's cancel scope cancels like any other; the pool closes a
connection whose call failed or was cancelled at any point, exactly as it does
httpcore2's. Buffering is bounded: a response head over `MAX_HEAD_BYTES` fails, and the
socket stops being read while more than `_HIGH_WATER` bytes of body wait for the caller.

Errors are httpcore2's, so the engine's one translation (`Call._translate`) applies
unchanged: `ConnectError`/`ConnectTimeout` while connecting, `ReadTimeout`/`WriteTimeout`,
`RemoteProtocolError` (the server closed early, or sent what is not HTTP), `ReadError`
(the socket failed), `LocalProtocolError` (a body that breaks its own Content-Length).
"""

from __future__ import annotations

import asyncio
import enum
import socket
import ssl
from collections import deque
from collections.abc import AsyncIterable, Iterable, Sequence
from typing import Any

import httpcore2
import httptools
from httpcore2._models import ByteStream

from ._messages import new_response
from ._network import Network, _connect_errors

__all__ = ["MAX_HEAD_BYTES", "H1Connection"]

#: The largest response head accepted (h11's limit, which httpcore2 used).
MAX_HEAD_BYTES = 100 * 1024
# Body bytes buffered for the caller before the socket stops being read.
_HIGH_WATER = 256 * 1024
# The most body bytes one read returns (httpcore2 read 64 KiB at a time).
_READ_MAX = 64 * 1024
# How long one connection attempt runs alone before the next address is tried alongside
# (as `Network` does: RFC 8305's "happy eyeballs").
_HAPPY_EYEBALLS_DELAY = 0.25


class _State(enum.Enum):
    NEW = "new"  # not connected yet
    IDLE = "idle"  # connected, no request
    ACTIVE = "active"  # a request is out; its response not read to the end
    CLOSED = "closed"


class H1Connection(httpcore2.AsyncConnectionInterface, asyncio.Protocol):
    """One HTTP/1.1 connection to ``origin`` (direct, no proxy), on the running asyncio loop.

    Args:
        origin: scheme, host and port it connects to.
        ssl_context: for https.
        keepalive_expiry: seconds it may stay idle before the pool drops it (None: no limit).
        network: resolves names (`Network.resolve`: DNS in its own bounded threads).
    """

    def __init__(
        self,
        origin: httpcore2.Origin,
        *,
        ssl_context: ssl.SSLContext | None,
        keepalive_expiry: float | None,
        network: Network,
    ) -> None:
        self._origin = origin
        self._ssl_context = ssl_context
        self._keepalive_expiry = keepalive_expiry
        self._network = network
        self._loop = asyncio.get_running_loop()
        self._state = _State.NEW
        self._transport: asyncio.Transport | None = None
        self._parser: httptools.HttpResponseParser | None = None
        self._expire_at: float | None = None
        self._stale = False  # the peer closed, or sent something unasked, while idle
        self._waiter: asyncio.Future[None] | None = None
        # The bound of the wait in progress (`_wait`): when, and what it fails with (an
        # httpcore2 timeout and its limit; None: the built-in TimeoutError). One loop timer
        # per connection serves every wait: see `_arm`.
        self._due: float | None = None
        self._due_error: tuple[type[httpcore2.TimeoutException], float] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._write_paused = False
        self._reading_paused = False
        self._lost = False
        # The response being read.
        self._head_only = False  # HEAD: the head is the whole response
        self._head_bytes = 0
        self._head_done = False
        self._interim = False
        self._status = 0
        self._reason = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._eof_body = False  # framed by the end of the connection
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._complete = False
        self._keep_alive = False
        self._error: Exception | None = None

    def __repr__(self) -> str:
        o = self._origin
        return (
            f"<H1Connection {o.scheme.decode()}://{o.host.decode()}:{o.port} {self._state.value}>"
        )

    # -- what the pool asks ----------------------------------------------------------------

    def can_handle_request(self, origin: httpcore2.Origin) -> bool:
        return origin == self._origin

    def is_available(self) -> bool:
        return self._state is _State.IDLE and not self._stale

    def has_expired(self) -> bool:
        if self._state is not _State.IDLE:
            return False
        if self._stale or self._lost:
            return True
        return self._expire_at is not None and self._loop.time() > self._expire_at

    def is_idle(self) -> bool:
        return self._state is _State.IDLE

    def is_closed(self) -> bool:
        return self._state is _State.CLOSED

    def info(self) -> str:
        return self._state.value

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        """Close at once (no I/O to wait for): the socket is gone by the next loop turn."""
        if self._state is _State.CLOSED:
            return
        self._state = _State.CLOSED
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        transport = self._transport
        if transport is not None:
            # abort, not close: nothing of ours is left to send, and a half-read response
            # must not be drained first.
            transport.abort()
        self._fail(httpcore2.ReadError("the connection was closed"))

    # -- one request -----------------------------------------------------------------------

    async def handle_async_request(self, request: httpcore2.Request) -> httpcore2.Response:
        ext = request.extensions
        timeouts = ext.get("timeout") or {}
        trace = ext.get("trace")
        if self._state is _State.NEW:
            await self._connect(timeouts.get("connect"), trace, request)
        elif self._state is not _State.IDLE:
            raise httpcore2.ConnectionNotAvailable()
        elif self._stale or self._lost:
            # Closed by the server since the pool checked it: as httpcore2 reports it.
            raise httpcore2.RemoteProtocolError("Server disconnected without sending a response.")
        self._start_response(request.method == b"HEAD")
        self._state = _State.ACTIVE
        self._expire_at = None
        data = _encode(request)
        if trace is not None:
            await trace("http11.send_request_headers.started", {"request": request})
        transport = self._transport
        assert transport is not None
        if isinstance(data, bytes):
            transport.write(data)
            await self._drained(timeouts.get("write"))
        else:
            await self._write_stream(data, request, timeouts.get("write"))
        if trace is not None:
            await trace("http11.send_request_body.complete", {"request": request})
            await trace("http11.receive_response_headers.started", {"request": request})
        read_timeout = timeouts.get("read")
        while not self._head_done:
            if self._error is not None:
                raise self._error
            await self._wait(read_timeout)
        return new_response(
            self._status,
            self._headers,
            H1Body(self, read_timeout, trace, request),
            {"http_version": b"HTTP/1.1", "reason_phrase": self._reason},
        )

    async def _write_stream(
        self,
        data: tuple[bytes, AsyncIterable[bytes] | Iterable[bytes], bool],
        request: httpcore2.Request,
        timeout: float | None,
    ) -> None:
        """A streamed request body: the head, then each part (chunk-framed if asked)."""
        head, parts, chunked = data
        transport = self._transport
        assert transport is not None
        transport.write(head)
        if isinstance(parts, AsyncIterable):
            async for part in parts:
                self._write_part(transport, part, chunked)
                await self._drained(timeout)
        else:
            for part in parts:
                self._write_part(transport, part, chunked)
                await self._drained(timeout)
        if chunked:
            transport.write(b"0\r\n\r\n")

    @staticmethod
    def _write_part(transport: asyncio.Transport, part: bytes, chunked: bool) -> None:
        if not part:
            return
        transport.write(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)

    async def _drained(self, timeout: float | None) -> None:
        """Wait while the socket's write buffer is over its high-water mark."""
        while self._write_paused and not self._lost:
            await self._wait(timeout, httpcore2.WriteTimeout)
        # A peer that closed while we wrote may still have answered: the head says.

    # -- reading, for `H1Body` ---------------------------------------------------------------

    async def next_part(self, timeout: float | None, until: float | None = None) -> bytes | None:
        """Every body byte buffered so far (waiting for some), None at the end of the body.

        Raises `httpcore2.ReadTimeout` after ``timeout`` s without a byte, and the
        built-in `TimeoutError` if ``until`` (the loop's clock) passes while waiting.
        """
        while True:
            chunks = self._chunks
            if chunks:
                if self._buffered <= _READ_MAX:
                    data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
                    chunks.clear()
                    self._buffered = 0
                else:
                    data = self._take(_READ_MAX)
                if self._reading_paused and self._buffered <= _HIGH_WATER and self._transport:
                    self._reading_paused = False
                    self._transport.resume_reading()
                return data
            if self._complete:
                return None
            if self._error is not None:
                raise self._error
            await self._wait(timeout, until=until)

    def _take(self, limit: int) -> bytes:
        """The first ``limit`` buffered bytes (a caller gets at most that per read, as
        from httpcore2: a face hands each read to an SDK that parses it in one go)."""
        chunks = self._chunks
        parts: list[bytes] = []
        n = 0
        while chunks and n < limit:
            chunk = chunks.popleft()
            if n + len(chunk) > limit:
                cut = limit - n
                parts.append(chunk[:cut])
                chunks.appendleft(chunk[cut:])
                n = limit
                break
            parts.append(chunk)
            n += len(chunk)
        self._buffered -= n
        return b"".join(parts)

    def response_closed(self) -> None:
        """The caller is done with the body: idle again if it was read whole, else closed."""
        if self._state is not _State.ACTIVE:
            return
        if self._complete and self._keep_alive and not self._lost and not self._chunks:
            self._state = _State.IDLE
            self._parser = None  # a new one per response: no state carried over
            if self._keepalive_expiry is not None:
                self._expire_at = self._loop.time() + self._keepalive_expiry
        else:
            self.close()

    # -- waiting -------------------------------------------------------------------------

    async def _wait(
        self,
        timeout: float | None,
        error: type[httpcore2.TimeoutException] = httpcore2.ReadTimeout,
        *,
        until: float | None = None,
    ) -> None:
        """Wait for the protocol to have news (data, the end, an error, drained buffers).

        A bound fails the one future waited on (``timeout`` with ``error``, ``until``
        with `TimeoutError`, whichever is first), by the connection's loop timer (`_arm`);
        a cancellation (the engine's scope) cancels the future like any other await.
        """
        loop = self._loop
        waiter = loop.create_future()
        self._waiter = waiter
        if timeout is not None:
            at = loop.time() + timeout
            if until is not None and until < at:
                self._arm(until, None)
            else:
                self._arm(at, (error, timeout))
        elif until is not None:
            self._arm(until, None)
        try:
            await waiter
        finally:
            self._waiter = None
            self._due = None

    def _arm(
        self, due: float, error: tuple[type[httpcore2.TimeoutException], float] | None
    ) -> None:
        """Bound the wait about to start at ``due`` (the loop's clock).

        One timer per connection, not one per wait: each read's bound lies further ahead
        than the one before, so a timer armed for an earlier wait that has not fired yet
        comes first, and `_on_timer` moves it on to this wait's bound when it does. A new
        timer is made only when none is armed or the armed one comes too late.
        """
        self._due = due
        self._due_error = error
        timer = self._timer
        if timer is None or self._timer_at > due:
            if timer is not None:
                timer.cancel()
            self._timer = self._loop.call_at(due, self._on_timer)
            self._timer_at = due

    def _on_timer(self) -> None:
        self._timer = None
        due = self._due
        waiter = self._waiter
        if due is None or waiter is None or waiter.done():
            return  # no bounded wait now: the next one arms a timer again
        if self._timer_at < due:
            # Armed for an earlier wait: this wait's bound is further ahead.
            self._timer = self._loop.call_at(due, self._on_timer)
            self._timer_at = due
            return
        error = self._due_error
        if error is None:
            waiter.set_exception(TimeoutError())
        else:
            cls, limit = error
            waiter.set_exception(cls(f"timed out after {limit} s"))

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: Exception) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    # -- connecting ------------------------------------------------------------------------

    async def _connect(self, timeout: float | None, trace: Any, request: httpcore2.Request) -> None:
        origin = self._origin
        host = origin.host.decode("ascii")
        tls = origin.scheme == b"https"
        if trace is not None:
            await trace("connection.connect_tcp.started", {"host": host, "port": origin.port})
        with _connect_errors(timeout):
            addresses = await self._network.resolve(host, origin.port)
            sock = await _connect_first(self._loop, addresses, origin.port)
            if tls:
                if trace is not None:
                    await trace("connection.start_tls.started", {"server_hostname": host})
                context = self._ssl_context
                if context is None:
                    from ._tls import shared_ssl_context

                    context = shared_ssl_context()
                # asyncio closes the socket if the handshake fails or is cancelled.
                await self._loop.create_connection(
                    lambda: self, sock=sock, ssl=context, server_hostname=host
                )
            else:
                await self._loop.create_connection(lambda: self, sock=sock)
        if self._transport is None:  # pragma: no cover - asyncio calls connection_made first
            raise httpcore2.ConnectError("the connection was not made")
        self._state = _State.IDLE

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._transport = None
        self._write_paused = False
        if self._state is not _State.ACTIVE:
            self._stale = True
            self._wake()
            return
        if self._head_done and not self._complete and self._eof_body and exc is None:
            self._complete = True  # the end of the connection is the end of this body
            self._keep_alive = False
            self._wake()
        elif not self._complete:
            if exc is not None:
                self._fail(httpcore2.ReadError(str(exc) or type(exc).__name__))
            elif not self._head_done:
                self._fail(
                    httpcore2.RemoteProtocolError("Server disconnected without sending a response.")
                )
            else:
                self._fail(
                    httpcore2.RemoteProtocolError(
                        "peer closed connection without sending complete message body"
                    )
                )
        else:
            self._wake()

    def eof_received(self) -> bool | None:
        return None  # close the transport: connection_lost(None) follows

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake()

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        if self._state is not _State.ACTIVE or parser is None or self._complete:
            # Bytes nobody asked for (on an idle connection, or after a whole response):
            # the connection cannot be trusted with another request.
            self._stale = True
            if self._state is _State.ACTIVE:
                self._keep_alive = False
            return
        if not self._head_done:
            self._head_bytes += len(data)
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._complete = True  # 101 and the like: we speak nothing else on it
            self._keep_alive = False
        except httptools.HttpParserError as e:
            self._fail(httpcore2.RemoteProtocolError(f"the server sent bad HTTP: {e}"))
            return
        if not self._head_done and self._head_bytes > MAX_HEAD_BYTES:
            self._fail(httpcore2.RemoteProtocolError("the response head is too large"))
            return
        if self._buffered > _HIGH_WATER and not self._reading_paused and self._transport:
            self._reading_paused = True
            self._transport.pause_reading()
        self._wake()

    # -- llhttp callbacks (httptools calls them by name) -------------------------------------

    def _start_response(self, head_only: bool) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._head_only = head_only
        self._head_bytes = 0
        self._head_done = False
        self._interim = False
        self._status = 0
        self._reason = b""
        self._headers = []
        self._eof_body = False
        self._chunks.clear()
        self._buffered = 0
        self._complete = False
        self._keep_alive = False
        self._error = None

    def on_status(self, reason: bytes) -> None:
        self._reason = reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            self._interim = True  # 100 Continue, 103 Early Hints: the answer follows
            self._headers = []
            return
        self._status = status
        self._head_done = True
        self._keep_alive = self._parser.should_keep_alive()
        if self._head_only:
            # No body follows a HEAD's head, whatever it says; llhttp cannot be told,
            # so the connection is not reused.
            self._complete = True
            self._keep_alive = False
            return
        framed = False
        for name, value in self._headers:
            lower = name.lower()
            if lower == b"content-length" or (
                lower == b"transfer-encoding" and b"chunked" in value.lower()
            ):
                framed = True
                break
        self._eof_body = not framed and status not in (204, 304)

    def on_body(self, body: bytes) -> None:
        if self._complete:
            return
        self._chunks.append(body)
        self._buffered += len(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        if self._head_done:
            self._complete = True
            if self._parser is not None:
                self._keep_alive = self._keep_alive and self._parser.should_keep_alive()


class H1Body:
    """The body of one `H1Connection` response: every read takes what is buffered."""

    __slots__ = ("_conn", "_request", "_started", "_timeout", "_trace")

    #: `Pool` closes it without a shielded scope or a timer: closing does no I/O.
    closes_at_once = True

    def __init__(
        self,
        conn: H1Connection,
        timeout: float | None,
        trace: Any,
        request: httpcore2.Request,
    ) -> None:
        self._conn = conn
        self._timeout = timeout
        self._trace = trace
        self._request = request
        self._started = False

    def __aiter__(self) -> H1Body:
        return self

    async def __anext__(self) -> bytes:
        data = await self.read_before(None)
        if data is None:
            raise StopAsyncIteration
        return data

    async def read_before(self, until: float | None) -> bytes | None:
        """What `__anext__` returns (None at the end), but `TimeoutError` if ``until`` (the
        loop's clock) passes first: a caller's bound as a loop timer, not a cancel scope."""
        if not self._started:
            self._started = True
            if self._trace is not None:
                await self._trace(
                    "http11.receive_response_body.started", {"request": self._request}
                )
        return await self._conn.next_part(self._timeout, until)

    def close(self) -> None:
        self._conn.response_closed()

    async def aclose(self) -> None:
        self._conn.response_closed()


def _encode(
    request: httpcore2.Request,
) -> bytes | tuple[bytes, AsyncIterable[bytes] | Iterable[bytes], bool]:
    """The request as bytes to write at once; or, for a streamed body, the head, the
    parts and whether they are to be chunk-framed."""
    parts = [request.method, b" ", request.url.target, b" HTTP/1.1\r\n"]
    declared: int | None = None
    chunked = False
    for name, value in request.headers:
        parts += (name, b": ", value, b"\r\n")
        lower = name.lower()
        if lower == b"content-length":
            declared = int(value) if value.isdigit() else -1
        elif lower == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
    stream = request.stream
    whole = isinstance(stream, (ByteStream, list, tuple))
    body = b"".join(stream) if whole else b""  # type: ignore[arg-type]
    if declared is None and not chunked:
        # No framing given (httpcore2's Request adds none): say what is sent.
        if whole:
            if body or request.method not in (b"GET", b"HEAD"):
                parts.append(b"Content-Length: %d\r\n" % len(body))
        else:
            parts.append(b"Transfer-Encoding: chunked\r\n")
            chunked = True
    parts.append(b"\r\n")
    if whole:
        if chunked:
            parts.append(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n")
        elif declared is not None and declared != len(body):
            # What h11 refuses: the engine turns it into InvalidRequestError.
            which = "much" if len(body) > declared else "little"
            raise httpcore2.LocalProtocolError(f"Too {which} data for declared Content-Length")
        else:
            parts.append(body)
        return b"".join(parts)
    return b"".join(parts), stream, chunked


async def _connect_one(
    loop: asyncio.AbstractEventLoop, family: int, ip: str, port: int
) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        await loop.sock_connect(sock, (ip, port))
    except BaseException:
        sock.close()  # failed or cancelled: no socket left for the GC
        raise
    return sock


async def _connect_first(
    loop: asyncio.AbstractEventLoop, addresses: Sequence[tuple[int, str]], port: int
) -> socket.socket:
    """Connect to the first address that answers: the next attempt starts when the one
    before fails or after 250 ms (as `Network` does); the losers are closed."""
    if len(addresses) == 1:
        return await _connect_one(loop, addresses[0][0], addresses[0][1], port)
    tasks: list[asyncio.Task[socket.socket]] = []
    winner: asyncio.Task[socket.socket] | None = None
    try:
        for family, ip in addresses:
            tasks.append(loop.create_task(_connect_one(loop, family, ip, port)))
            winner = await _first_success(tasks, _HAPPY_EYEBALLS_DELAY)
            if winner is not None:
                return winner.result()
        while any(not t.done() for t in tasks):
            winner = await _first_success(tasks, None)
            if winner is not None:
                return winner.result()
        errors = [t.exception() for t in tasks]
        raise next((e for e in reversed(errors) if e is not None), OSError("no address"))
    finally:
        for t in tasks:
            if t is winner:
                continue
            if not t.done():
                t.cancel()  # it closes its own socket as the cancellation lands
            elif not t.cancelled() and t.exception() is None:
                t.result().close()


async def _first_success(
    tasks: list[asyncio.Task[socket.socket]], timeout: float | None
) -> asyncio.Task[socket.socket] | None:
    """Wait up to ``timeout`` until one of ``tasks`` connects (it is returned) or every
    one still running has failed (None)."""
    pending = [t for t in tasks if not t.done()]
    while pending:
        done, _ = await asyncio.wait(pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if not done:
            return None  # the delay passed: start the next
        for t in done:
            if not t.cancelled() and t.exception() is None:
                return t
        pending = [t for t in tasks if not t.done()]
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception() is None:
            return t
    return None
