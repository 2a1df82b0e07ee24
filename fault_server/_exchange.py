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
import enum
import http
import logging
import math
import socket
import struct
from collections.abc import Iterable
from typing import NoReturn

import anyio
import h11

from ._faults import FaultSpec
from ._openai import ChatRequest, EventStream, Whole, completion_stream

__all__ = ["Exchange", "Outcome", "PeerGone", "PeerWatcher", "whole_bytes"]

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

    Its task is the only one a connection creates besides its own. `stop` cancels it and
    waits for it; a done-callback reads its outcome, so that even when the waiting is itself
    cancelled (the server shutting down), an error in it is logged and never left for
    asyncio to report as "never retrieved".
    """

    def __init__(self, reader: asyncio.StreamReader, conn: h11.Connection) -> None:
        self.gone = asyncio.Event()
        self._reader = reader
        self._conn = conn
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
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
                    break
                fed += len(data)
                self._conn.receive_data(data)
            else:
                return  # buffered enough: stop reading, and so stop noticing.
        except (ConnectionError, OSError):
            pass
        self.gone.set()


def _report_watcher(task: asyncio.Task[None]) -> None:
    """Read a finished watcher's outcome, logging an error (a bug) if it had one."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        logger.error("fault_server: peer watcher failed", exc_info=exc)


class Exchange:
    """The request a fault answers, and the means to answer it (or not)."""

    def __init__(
        self,
        *,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        watcher: PeerWatcher,
        spec: FaultSpec,
        reply: Whole | EventStream,
        chat: ChatRequest | None,
        request_id: str,
    ) -> None:
        self.spec = spec
        self.reply = reply
        self.chat = chat
        self._conn = conn
        self._writer = writer
        self._watcher = watcher
        self._request_id = request_id

    # -- what to send ------------------------------------------------------------------

    @property
    def stream(self) -> bool:
        """Whether the healthy answer is an SSE stream (the request said ``stream: true``)."""
        return isinstance(self.reply, EventStream)

    @property
    def body(self) -> bytes:
        """The whole healthy body: JSON, or every SSE frame joined."""
        return self.reply.body

    @property
    def model(self) -> str:
        return self.chat.model if self.chat is not None else "fault-model"

    def event_stream(self) -> EventStream:
        """The healthy answer as a stream, even when the request did not ask for one."""
        if isinstance(self.reply, EventStream):
            return self.reply
        chat = self.chat or ChatRequest(model=self.model, text="", prompt_tokens=0)
        return completion_stream(chat, self.spec.integer("tokens"))

    # -- sending -----------------------------------------------------------------------

    async def send_head(
        self,
        status: int = 200,
        *,
        content_type: str | None = None,
        content_length: int | None = None,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """Send the status line and headers. Without ``content_length``, HTTP/1.1 is chunked."""
        if content_type is None:
            content_type = "text/event-stream" if self.stream else "application/json"
        fields = [("content-type", content_type), ("x-request-id", self._request_id)]
        if content_type == "text/event-stream":
            fields.append(("cache-control", "no-cache"))
        if content_length is not None:
            fields.append(("content-length", str(content_length)))
        fields.extend(headers)
        reason = _reason(status)
        await self._write(
            self._conn.send(h11.Response(status_code=status, headers=fields, reason=reason))
        )

    async def send_data(self, data: bytes) -> None:
        """Send body bytes, framed by h11 (a chunk when chunked)."""
        if data:
            await self._write(self._conn.send(h11.Data(data=data)))

    async def send_end(self) -> None:
        """End the body well (the chunked terminator when chunked)."""
        await self._write(self._conn.send(h11.EndOfMessage()))

    async def send_whole(self, whole: Whole, headers: tuple[tuple[str, str], ...] = ()) -> Outcome:
        """Send a complete, well-framed response."""
        fields = (("x-request-id", self._request_id), *headers)
        await self._write(whole_bytes(self._conn, whole, fields))
        return Outcome.KEEP

    async def _write(self, data: bytes | None) -> None:
        if not data:
            return
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            raise PeerGone from exc

    # -- waiting -----------------------------------------------------------------------

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or raise `PeerGone` as soon as the client leaves."""
        gone = self._watcher.gone
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

    async def reset(self) -> Outcome:
        """Flush what was written, then abort the connection with a TCP RST."""
        transport = self._writer.transport
        while transport.get_write_buffer_size() and not transport.is_closing():
            await self.sleep(0.005)
        sock = self._writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
        return Outcome.ABORTED


def whole_bytes(
    conn: h11.Connection,
    whole: Whole,
    headers: Iterable[tuple[str, str]],
    *,
    head_only: bool = False,
) -> bytes:
    """A complete response framed by h11; without body for HEAD, 204 and 304, as HTTP says."""
    fields = [("content-type", whole.content_type), *headers]
    bodyless = head_only or whole.status in (204, 304)
    if whole.status != 204:
        fields.append(("content-length", str(len(whole.body))))
    reason = _reason(whole.status)
    out = conn.send(h11.Response(status_code=whole.status, headers=fields, reason=reason)) or b""
    if not bodyless:
        out += conn.send(h11.Data(data=whole.body)) or b""
    return out + (conn.send(h11.EndOfMessage()) or b"")


def _reason(status: int) -> bytes:
    try:
        return http.HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""
