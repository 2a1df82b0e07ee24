"""SSE decoding: linear in bytes, every line ending delivered at once, floods on time.

The stream cases run over real sockets (tests/support/rawserver.py), through `Client`.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from openai.types.chat import ChatCompletionMessageParam

import stallproof
from stallproof import Timeouts
from stallproof._sse import SSEDecoder

from ..support.clients import MakeClient, assert_pool_clean
from ..support.rawserver import RawRequest, response
from ..support.timing import MARGIN, stopwatch

MSGS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]
HEADERS = {"content-type": "text/event-stream", "transfer-encoding": "chunked"}


def _chunk(content: str | None = None, finish: str | None = None) -> bytes:
    delta = {"content": content} if content is not None else {}
    obj = {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(obj).encode()


def _chunked(part: bytes) -> bytes:
    return f"{len(part):x}\r\n".encode() + part + b"\r\n"


def _feed_time(line_bytes: int) -> float:
    best = float("inf")
    for _ in range(3):
        decoder = SSEDecoder(max_line_bytes=4 * 1024 * 1024)
        piece = b"x" * 64
        # This thread's CPU time: other processes on a busy machine do not count.
        start = time.thread_time()
        for _ in range(line_bytes // 64):
            list(decoder.feed(piece))
        list(decoder.feed(b"\n\n"))
        best = min(best, time.thread_time() - start)
    return best


def test_a_long_line_in_small_pieces_costs_linear_time() -> None:
    """16x the bytes costs about 16x the time (quadratic decoding: about 256x)."""
    small, large = _feed_time(32 * 1024), _feed_time(512 * 1024)
    assert large < 64 * small, (small, large)


@pytest.mark.parametrize("eol", [b"\r", b"\r\n", b"\n"])
def test_every_line_ending_dispatches_at_once(eol: bytes) -> None:
    decoder = SSEDecoder(max_line_bytes=1024)
    # The blank line that ends the event arrives as the last byte(s) of a write.
    events = list(decoder.feed(b"event: x" + eol + b"data: 1" + eol + eol))
    assert [(e.event, e.data) for e in events] == [("x", "1")]
    # A LF starting the next write completes a CR (or is a blank line): nothing more.
    assert [e.data for e in decoder.feed(b"\ndata: 2" + eol + eol)] == ["2"]


def test_a_crlf_split_across_writes_is_one_line_ending() -> None:
    decoder = SSEDecoder(max_line_bytes=1024)
    assert list(decoder.feed(b"data: a\r")) == []
    assert list(decoder.feed(b"\ndata: b\r")) == []
    events = list(decoder.feed(b"\n\r\n"))
    assert [e.data for e in events] == ["a\nb"]


@pytest.mark.anyio
@pytest.mark.parametrize("eol", [b"\r", b"\r\n"])
async def test_a_complete_stream_with_cr_endings_ends_without_waiting(
    eol: bytes, raw_server: Any, make_client: MakeClient
) -> None:
    """Each event is its own write and the server then holds the socket open: every chunk,
    the finish and [DONE] must be seen as they arrive, not one write late."""

    def answer(request: RawRequest) -> Iterator[bytes | float]:
        yield response(200, b"", HEADERS)
        for event in (_chunk("hi"), _chunk(finish="stop"), b"data: [DONE]"):
            yield _chunked(event + eol + eol)
            yield 0.05
        yield 10.0  # hold the socket open

    srv = raw_server(answer)
    client = make_client(srv.url, timeout=Timeouts(idle=1.0, total=5))
    with stopwatch() as elapsed:
        s = await client.chat.completions.create(model="m", messages=MSGS, stream=True)
        chunks = [c async for c in s]
    assert [c.choices[0].finish_reason for c in chunks] == [None, "stop"]
    assert elapsed[0] < 1.0  # the 0.25 s drain after [DONE] included, no idle timeout
    assert_pool_clean(client)


@pytest.mark.anyio
async def test_named_events_with_non_json_data_are_skipped_and_not_progress(
    raw_server: Any, make_client: MakeClient
) -> None:
    """As docs/bounds.md says: skipped, not an error, and not content (idle still fires)."""

    def answer(request: RawRequest) -> Iterator[bytes | float]:
        yield response(200, b"", HEADERS)
        yield _chunked(_chunk("hi") + b"\n\n")
        for _ in range(50):
            yield _chunked(b"event: notice\ndata: this is not JSON\n\n")
            yield 0.1

    srv = raw_server(answer)
    idle = 0.5
    client = make_client(srv.url, timeout=Timeouts(idle=idle, total=10))
    s = await client.chat.completions.create(model="m", messages=MSGS, stream=True)
    seen = []
    with stopwatch() as elapsed, pytest.raises(stallproof.IdleTimeout):
        async for c in s:
            seen.append(c.choices[0].delta.content)
    assert seen == ["hi"]
    assert elapsed[0] <= idle + MARGIN, elapsed[0]
    assert_pool_clean(client)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "flood", [b": ping\n\n", b"event: ping\ndata: {}\n\n", b'data: {"choices": []}\n\n']
)
@pytest.mark.parametrize("encoding", [None, "gzip"])
async def test_a_flood_of_tiny_keepalives_does_not_delay_first_token(
    flood: bytes, encoding: str | None, raw_server: Any, make_client: MakeClient
) -> None:
    """Keep-alives as fast as loopback carries them, never content: first_token fires on
    time although every read returns at once."""
    block = flood * (256 * 1024 // len(flood))
    headers = dict(HEADERS)
    if encoding:
        headers["content-encoding"] = encoding
        c = zlib.compressobj(6, zlib.DEFLATED, 31)

    def answer(request: RawRequest) -> Iterator[bytes | float]:
        yield response(200, b"", headers)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            yield _chunked(c.compress(block) + c.flush(zlib.Z_SYNC_FLUSH) if encoding else block)
            # Still a flood (256 KiB every 2 ms), but the server thread lets the GIL go, so
            # what is measured is the client's parsing, not this thread's hold on the lock.
            yield 0.002

    srv = raw_server(answer)
    # A quarter of a second: the flood is all CPU until the bound fires, and without the
    # fix it runs to total (10 s) however short first_token is.
    limit = 0.25
    client = make_client(srv.url, timeout=Timeouts(first_token=limit, total=10))
    with stopwatch() as elapsed, pytest.raises(stallproof.FirstTokenTimeout) as e:
        await client.chat.completions.create(model="m", messages=MSGS, stream=True)
    # The flooding server is a thread of this process and competes for the GIL and the
    # CPU (with both cores busy besides, the bound was seen to end 1.8 s late), so this test
    # allows far more than the usual margin: what it shows is that the flood does not hold
    # the bound off (before the fix, a gzip flood ran to the 10 s total).
    assert limit <= elapsed[0] <= limit + 10 * MARGIN, (elapsed[0], e.value.elapsed)
    assert_pool_clean(client)
