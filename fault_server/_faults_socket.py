"""Faults of the socket: connections never answered, delayed, refused or stalled in the TLS
handshake; responses sliced, reset, cut, half-closed.

``slow_accept``, ``refuse`` and ``tls_stall`` act on a connection before any request is
read (their scope is ``connection``): a scenario arms them, and the listener runs them on the
next connection it accepts (`_wire_connection`, `_wire_tls`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import TYPE_CHECKING

import anyio

from ._answer import Frames
from ._params import after, choice, integer, number
from ._registry import FaultGroup
from ._sending import send_part
from ._wire_exchange import Exchange, Outcome, linger_zero

if TYPE_CHECKING:
    from ._spec import FaultSpec

__all__ = ["SOCKET"]

SOCKET = FaultGroup("socket")

_READ_SIZE = 65536


@SOCKET.fault(
    "half_open",
    "Accept, never answer: the request is not parsed past its head, nothing is ever "
    "sent; the server closes after `hold`. A large request body is not read either, so "
    "the client's send stalls once the socket buffers are full.",
)
async def half_open(ex: Exchange) -> Outcome:
    await ex.stall()


@SOCKET.connection_fault(
    "slow_accept",
    "Connection level, armed by a scenario: the kernel completes the handshake (connect "
    "succeeds) but the server does not read the connection for `pause` seconds, then "
    "serves it normally.",
    (number("pause", 1.0, "Seconds before the server starts reading the connection."),),
)
async def slow_accept(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, spec: FaultSpec, max_hold: float
) -> bool:
    await asyncio.sleep(min(spec.number("pause"), max_hold))
    return True


@SOCKET.connection_fault(
    "refuse",
    "Connection level, armed by a scenario: the server aborts the accepted connection "
    "with a TCP RST before reading a byte, the nearest a listening port comes to "
    "refusing. A true ECONNREFUSED (nothing listens) is at `refused_url`.",
)
async def refuse(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, spec: FaultSpec, max_hold: float
) -> bool:
    linger_zero(writer)  # the abort that follows sends an RST.
    return False


@SOCKET.connection_fault(
    "tls_stall",
    "Connection level, armed by a scenario, on the TLS listener (`tls=True`, "
    "`tls_url`): TCP is accepted, the ClientHello read, and the handshake never "
    "answered; the server closes after `hold` (at most max_hold).",
)
async def tls_stall(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, spec: FaultSpec, max_hold: float
) -> bool:
    hold = max_hold
    if spec.get("hold") is not None:
        hold = min(hold, spec.number("hold"))
    with anyio.move_on_after(hold), contextlib.suppress(ConnectionError, OSError):
        while await reader.read(_READ_SIZE):  # the ClientHello, never answered.
            pass
    return False


@SOCKET.fault(
    "slicer",
    "The healthy response, head included, written in slices of `size` bytes, each "
    "varied by up to ±`variation` bytes, `interval` seconds apart (Toxiproxy's slicer). "
    "A stream is sliced frame by frame as it comes.",
    (
        integer("size", 8, "Average bytes per slice.", 1),
        integer("variation", 4, "Most bytes a slice differs from `size`.", 0),
        number("interval", 0.005, "Seconds between slices."),
        integer("seed", 0, "Seed of the variation: the same seed gives the same slices."),
    ),
)
async def slicer(ex: Exchange) -> Outcome:
    """Like Toxiproxy's slicer, it works on the bytes of the connection, the response head
    included: a client that assumes a read returns a whole line, a whole event or a whole
    header block meets the pieces (the server sets TCP_NODELAY, so slices leave as separate
    segments)."""
    spec = ex.spec
    size, variation = spec.integer("size"), spec.integer("variation")
    interval = spec.number("interval")
    rng = random.Random(spec.integer("seed"))

    async def sliced(data: bytes) -> None:
        start = 0
        while start < len(data):
            length = max(1, size + rng.randint(-variation, variation))
            await ex.write(data[start : start + length])
            start += length
            await ex.sleep(interval)

    answer = await ex.answer()
    if isinstance(answer, Frames):
        await sliced(
            ex.head_bytes(answer.status, content_type=answer.content_type, headers=answer.headers)
        )
        while (frame := await answer.next()) is not None:
            await sliced(ex.data_bytes(frame))
    else:
        head = ex.head_bytes(
            answer.status,
            content_type=answer.content_type,
            content_length=len(answer.body),
            headers=answer.headers,
        )
        await sliced(head + ex.data_bytes(answer.body))
    await sliced(ex.end_bytes())
    return Outcome.KEEP


@SOCKET.fault(
    "reset",
    "Abort with a TCP RST. when=before: read the request, send nothing, RST. when=mid: "
    "headers and part of the body (stream: role + `after` content chunks; non-stream: "
    "half the body), then RST.",
    (choice("when", "before", "When to reset.", "before", "mid"), after(1)),
)
async def reset(ex: Exchange) -> Outcome:
    if ex.spec.text("when") == "mid":
        await send_part(ex)
    return await ex.reset()


@SOCKET.fault(
    "close_mid_body",
    "Headers (Content-Length of the full body; stream: chunked SSE), part of the body "
    "(stream: role + `after` content chunks, no [DONE], no chunk terminator; non-stream: "
    "half), then a clean FIN.",
    (after(2),),
)
async def close_mid_body(ex: Exchange) -> Outcome:
    await send_part(ex)
    return Outcome.CLOSE


@SOCKET.fault(
    "half_close",
    "Headers and part of the body (as close_mid_body), then shutdown(SHUT_WR): a FIN, "
    "but the server keeps the socket open and reading until the client closes or `hold`.",
    (after(2),),
)
async def half_close(ex: Exchange) -> Outcome:
    await send_part(ex)
    await ex.half_close()
    await ex.stall()  # still reading: the client's close (or hold) ends it.


@SOCKET.fault(
    "cut_after",
    "The healthy response, head included, cut after `bytes` bytes; then `then`: close "
    "(FIN), reset (RST) or stall (silence until `hold`).",
    (
        integer("bytes", 100, "Bytes of the response sent before the cut.", 0),
        choice("then", "close", "What follows the cut.", "close", "reset", "stall"),
    ),
)
async def cut_after(ex: Exchange) -> Outcome:
    answer = await ex.answer()
    if isinstance(answer, Frames):
        head = ex.head_bytes(
            answer.status, content_type=answer.content_type, headers=answer.headers
        )
        body = b"".join([ex.data_bytes(frame) for frame in await answer.rest()])
    else:
        head = ex.head_bytes(
            answer.status,
            content_type=answer.content_type,
            content_length=len(answer.body),
            headers=answer.headers,
        )
        body = ex.data_bytes(answer.body)
    response = head + body + ex.end_bytes()
    cut = ex.spec.integer("bytes")
    if cut < len(head) and ex.log is not None:
        ex.log.status = None  # the head itself was cut: no status went out.
    await ex.write(response[:cut])
    then = ex.spec.text("then")
    if then == "reset":
        return await ex.reset()
    if then == "stall":
        await ex.stall()
    return Outcome.CLOSE
