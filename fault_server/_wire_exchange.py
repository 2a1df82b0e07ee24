"""One request/response on a connection: the wire primitives that faults are made of.

A fault gets an `Exchange` and uses it to send a head and body data, always framed by h11,
so that every byte that is sent is well formed; faults break framing only by what they leave
out: a body cut short, a Content-Length never met, a chunked body never terminated, an RST.
Faults sleep and stall through it too. While a fault runs, a `PeerWatcher` keeps reading
the socket, so that a client that leaves ends the fault at once (`PeerGone`) instead of when
``hold`` runs out; what it reads goes to h11's buffer, so a pipelined next request is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import enum
import http
import logging
import math
import socket
import struct
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, NoReturn, Protocol

import anyio
import h11

from ._answer import Frames
from ._buckets import Buckets
from ._formats import made_stream
from ._journal import RequestLog
from ._openai import Api, ChatRequest, EventStream, Whole

if TYPE_CHECKING:  # the spec parser reads the catalogue, whose faults import this module.
    from ._spec import FaultSpec

__all__ = [
    "Exchange",
    "Outcome",
    "PeerGone",
    "PeerWatcher",
    "Source",
    "advised_delay",
    "linger_zero",
    "whole_bytes",
]

logger = logging.getLogger("fault_server")

_WATCH_CAP = 1024 * 1024  # bytes the watcher buffers before it stops reading.
_READ_SIZE = 65536


class PeerGone(Exception):
    """The client closed or reset the connection while a fault was running."""


class Outcome(enum.Enum):
    """How an exchange left the connection."""

    KEEP = "keep"  # response complete and well framed: the next request may follow.
    CLOSE = "close"  # close with a FIN, after flushing what was written.
    ABORTED = "aborted"  # already torn down (RST sent, or the peer left).


class PeerWatcher:
    """Reads the socket into h11 while a fault runs; sets `gone` on EOF or error.

    It stops reading, without setting `gone`, once `_WATCH_CAP` bytes are buffered: past that
    the client's sends block, and only ``hold`` ends the exchange.

    It starts only when an exchange must notice the client leaving while the server is not
    writing to it: at its first wait (`Exchange.sleep`, a stall) or once the socket's send
    buffer backs up. A healthy answer written at once never starts it: a task per request
    was a fifth of the server's CPU per request.

    Its task is the only one a connection creates besides its own. `stop` cancels it and
    waits for it; a done-callback reads its outcome, so that even when the waiting is itself
    cancelled (the server shutting down), an error in it is logged and never left for
    asyncio to report as "never retrieved".
    """

    def __init__(self, reader: asyncio.StreamReader, conn: h11.Connection) -> None:
        self.gone = asyncio.Event()
        self.how: str | None = None  # "fin" or "rst" once gone.
        self._reader = reader
        self._conn = conn
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start watching, unless already watching (or done)."""
        if self._task is not None or self.gone.is_set():
            return
        task = asyncio.get_running_loop().create_task(self._run(), name="fault_server.watch")
        task.add_done_callback(_report_watcher)
        self._task = task

    async def stop(self) -> None:
        """Cancel the watch and wait until it has ended.

        Waits with `asyncio.wait`, which never raises the watcher's outcome and never
        swallows a cancellation of the caller (``await`` under ``suppress(CancelledError)``
        would do both).
        """
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait((task,))

    async def _run(self) -> None:
        fed = 0
        try:
            while fed < _WATCH_CAP:
                data = await self._reader.read(_READ_SIZE)
                if not data:
                    self._conn.receive_data(b"")
                    self.how = "fin"
                    break
                fed += len(data)
                self._conn.receive_data(data)
            else:
                return  # buffered enough: stop reading, and so stop noticing.
        except (ConnectionError, OSError):
            self.how = "rst"
        self.gone.set()


def _report_watcher(task: asyncio.Task[None]) -> None:
    """Read a finished watcher's outcome, logging an error (a bug) if it had one."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        logger.error("fault_server: peer watcher failed", exc_info=exc)


class Source(Protocol):
    """Where the healthy answer comes from: made up here, or fetched from an upstream."""

    async def answer(self, stream: bool) -> Whole | Frames:
        """The answer; ``stream`` says whether an SSE stream was asked for."""
        ...

    async def aclose(self) -> None:
        """Release what the answers hold."""
        ...


class Exchange:
    """The request a fault answers, and the means to answer it (or not)."""

    def __init__(
        self,
        *,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        watcher: PeerWatcher,
        spec: FaultSpec,
        chat: ChatRequest | None,
        request_id: str,
        source: Source,
        log: RequestLog | None = None,
        buckets: Buckets | None = None,
    ) -> None:
        self.spec = spec
        self.buckets = buckets if buckets is not None else Buckets()
        self.chat = chat
        self.log = log
        self._conn = conn
        self._writer = writer
        self._watcher = watcher
        self._request_id = request_id
        self._source = source
        self._answers: dict[bool, Whole | Frames] = {}

    # -- what to send ------------------------------------------------------------------

    @property
    def stream(self) -> bool:
        """Whether the request asked for an SSE stream (``"stream": true``)."""
        return self.chat is not None and self.chat.stream

    @property
    def api(self) -> Api | None:
        """The request's wire format (`_formats`); None for a request without a body."""
        return self.chat.api if self.chat is not None else None

    @property
    def model(self) -> str:
        return self.chat.model if self.chat is not None else "fault-model"

    async def answer(self, stream: bool | None = None) -> Whole | Frames:
        """The healthy answer: `Frames` for a stream, else a `Whole` (errors are Wholes too).

        ``stream`` overrides what the request asked for. Fetched once per kind, at the first
        call: a fault that never asks (a stall, a status) never contacts an upstream.
        """
        want = self.stream if stream is None else stream
        if want not in self._answers:
            self._answers[want] = await self._source.answer(want)
        return self._answers[want]

    async def whole(self) -> Whole:
        """The healthy answer as one body (every frame joined, for a stream)."""
        answer = await self.answer()
        if isinstance(answer, Whole):
            return answer
        body = b"".join(await answer.rest())
        return Whole(answer.status, body, answer.content_type, answer.headers)

    def event_stream(self) -> EventStream:
        """A stream the server makes up, in the request's format, for faults that write
        their own chunks."""
        chat = self.chat or ChatRequest(model=self.model, text="", prompt_tokens=0)
        return made_stream(chat, self.spec.integer("tokens"))

    # -- sending -----------------------------------------------------------------------

    def head_bytes(
        self,
        status: int = 200,
        *,
        content_type: str | None = None,
        content_length: int | None = None,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> bytes:
        """The status line and headers framed by h11, to be written by the caller (whole
        or in pieces). Without ``content_length``, HTTP/1.1 is chunked."""
        if content_type is None:
            content_type = "text/event-stream" if self.stream else "application/json"
        fields = [("content-type", content_type), ("x-request-id", self._request_id)]
        if content_type == "text/event-stream":
            fields.append(("cache-control", "no-cache"))
        if content_length is not None:
            fields.append(("content-length", str(content_length)))
        fields.extend(headers)
        if self.log is not None:
            self.log.status = status
            self.log.retry_after = advised_delay(fields)
        response = h11.Response(status_code=status, headers=fields, reason=_reason(status))
        return self._conn.send(response) or b""

    async def send_head(
        self,
        status: int = 200,
        *,
        content_type: str | None = None,
        content_length: int | None = None,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """Send the status line and headers. Without ``content_length``, HTTP/1.1 is chunked."""
        await self.write(
            self.head_bytes(
                status, content_type=content_type, content_length=content_length, headers=headers
            )
        )

    async def send_answer_head(
        self, answer: Whole | Frames, *, content_length: int | None = None
    ) -> None:
        """The head for ``answer``: its status, content type and passed-on headers."""
        headers = answer.headers
        await self.send_head(
            answer.status,
            content_type=answer.content_type,
            content_length=content_length,
            headers=headers,
        )

    def data_bytes(self, data: bytes) -> bytes:
        """Body bytes framed by h11 (a chunk when chunked), to be written by the caller."""
        return (self._conn.send(h11.Data(data=data)) or b"") if data else b""

    async def send_data(self, data: bytes) -> None:
        """Send body bytes, framed by h11 (a chunk when chunked)."""
        await self.write(self.data_bytes(data))

    def end_bytes(self) -> bytes:
        return self._conn.send(h11.EndOfMessage()) or b""

    async def send_end(self) -> None:
        """End the body well (the chunked terminator when chunked)."""
        await self.write(self.end_bytes())

    async def send_whole(self, whole: Whole, headers: tuple[tuple[str, str], ...] = ()) -> Outcome:
        """Send a complete, well-framed response."""
        fields = (("x-request-id", self._request_id), *headers)
        if self.log is not None:
            self.log.status = whole.status
            self.log.retry_after = advised_delay((*fields, *whole.headers))
        await self.write(whole_bytes(self._conn, whole, fields))
        return Outcome.KEEP

    async def write(self, data: bytes | None) -> None:
        """Write bytes already framed (by the methods above) and wait for the buffer to drain."""
        if not data:
            return
        if self.log is not None:
            self.log.bytes_sent += len(data)
        try:
            self._writer.write(data)
            if self._writer.transport.get_write_buffer_size():
                self._watcher.start()  # the client may leave while the buffer drains.
                await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            raise PeerGone from exc

    # -- waiting -----------------------------------------------------------------------

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or raise `PeerGone` as soon as the client leaves."""
        gone = self._watcher.gone
        if seconds > 0:
            self._watcher.start()
        if seconds <= 0:
            await asyncio.sleep(0)
        else:
            with anyio.move_on_after(seconds):  # math.inf: no deadline at all.
                await gone.wait()
        if gone.is_set():
            raise PeerGone

    async def stall(self) -> NoReturn:
        """Send nothing, keep the socket open, until ``hold`` ends the exchange."""
        await self.sleep(math.inf)
        raise PeerGone  # sleep(inf) only returns by raising; this is for the type checker.

    async def flush(self) -> None:
        """Wait until what was written has left the process's buffer."""
        transport = self._writer.transport
        while transport.get_write_buffer_size() and not transport.is_closing():
            await self.sleep(0.005)

    async def reset(self) -> Outcome:
        """Flush what was written, then abort the connection with a TCP RST."""
        await self.flush()
        linger_zero(self._writer)
        self._writer.transport.abort()
        return Outcome.ABORTED

    async def half_close(self) -> None:
        """Flush, then shut down our sending side (a FIN); the socket stays open to read.

        Under TLS, which asyncio cannot half-close, the TCP socket beneath is shut down: a
        FIN without TLS's close_notify, which the client reads as a truncated stream.
        """
        await self.flush()
        with contextlib.suppress(OSError, RuntimeError):
            if self._writer.can_write_eof():
                self._writer.write_eof()
                return
            sock = self._writer.get_extra_info("socket")
            if sock is not None:
                sock.shutdown(socket.SHUT_WR)


def linger_zero(writer: asyncio.StreamWriter) -> None:
    """Make the socket's close an RST (SO_LINGER on, 0 s) instead of a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def whole_bytes(
    conn: h11.Connection,
    whole: Whole,
    headers: Iterable[tuple[str, str]],
    *,
    head_only: bool = False,
) -> bytes:
    """A complete response framed by h11; without body for HEAD, 204 and 304, as HTTP says."""
    fields = [("content-type", whole.content_type), *headers, *whole.headers]
    bodyless = head_only or whole.status in (204, 304)
    if whole.status != 204:
        fields.append(("content-length", str(len(whole.body))))
    reason = _reason(whole.status)
    out = conn.send(h11.Response(status_code=whole.status, headers=fields, reason=reason)) or b""
    if not bodyless:
        out += conn.send(h11.Data(data=whole.body)) or b""
    return out + (conn.send(h11.EndOfMessage()) or b"")


def advised_delay(headers: Iterable[tuple[str, str]]) -> float | None:
    """The delay a response advises, in seconds: ``retry-after-ms`` first (as the openai
    SDK reads it), else ``Retry-After`` as seconds or as an HTTP date; None if neither."""
    millis: float | None = None
    seconds: float | None = None
    for name, value in headers:
        name = name.lower()
        if name == "retry-after-ms":
            with contextlib.suppress(ValueError):
                millis = float(value) / 1000
        elif name == "retry-after":
            try:
                seconds = float(value)
            except ValueError:
                with contextlib.suppress(TypeError, ValueError):
                    when = email.utils.parsedate_to_datetime(value)
                    seconds = when.timestamp() - time.time()
    delay = millis if millis is not None else seconds
    return None if delay is None or not math.isfinite(delay) else max(0.0, delay)


def _reason(status: int) -> bytes:
    try:
        return http.HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""
