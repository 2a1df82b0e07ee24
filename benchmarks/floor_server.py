"""A canned OpenAI-compatible server for `floor.py`: as little server CPU per call as it can.

The fault server does a lot per request (scenarios, journal, validation); measuring clients
near the floor of a Python HTTP client needs a server that costs much less than the
cheapest of them, so that it is the clients' work that is compared. This one answers
``POST .../chat/completions`` with a precomputed completion (``Content-Length``) or, when
the body asks for ``"stream": true``, an event stream (chunked) of N content chunks, a
final chunk and ``data: [DONE]``. N is 16 unless the path starts ``/n/<N>/``.

Events are written one per loop iteration (a ``call_soon`` chain), as a model's tokens
arrive one by one, so a client reads them in small pieces rather than in one buffer; with
``/n/<N>/i/<ms>/`` one every ``ms`` milliseconds, as a model paces its tokens (each then
arrives in a read of its own).

    python benchmarks/floor_server.py     # prints http://127.0.0.1:<port>/v1, serves until killed
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time

_HEAD_END = b"\r\n\r\n"
_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)
_STREAM = re.compile(rb'"stream"\s*:\s*true')
_N = re.compile(rb"^[A-Z]+ /n/(\d+)/")
_INTERVAL = re.compile(rb"^[A-Z]+ /n/\d+/i/(\d+)/")
_MAX_EVENTS = 100_000

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]


def completion_body() -> bytes:
    text = " ".join(WORDS[i % len(WORDS)] for i in range(16))
    return json.dumps(
        {
            "id": "chatcmpl-floor",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": "fault-model",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 20, "completion_tokens": 16, "total_tokens": 36},
        }
    ).encode()


def chunk(delta: dict[str, str], finish: str | None) -> bytes:
    data = json.dumps(
        {
            "id": "chatcmpl-floor",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": "fault-model",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    ).encode()
    event = b"data: " + data + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(event), event)  # one HTTP chunk per event


_BODY = completion_body()
_PLAIN = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
    b"x-request-id: floor\r\n\r\n" % len(_BODY)
) + _BODY
_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
    b"x-request-id: floor\r\n\r\n"
)
_FIRST = chunk({"role": "assistant", "content": ""}, None)
_WORDS = [chunk({"content": w + " "}, None) for w in WORDS]
_LAST = chunk({}, "stop")
_DONE = b"%x\r\ndata: [DONE]\n\n\r\n0\r\n\r\n" % len(b"data: [DONE]\n\n")


class _Conn(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.busy = False
        self.interval = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._next()

    def _next(self) -> None:
        if self.busy or self.transport is None:
            return
        end = self.buf.find(_HEAD_END)
        if end < 0:
            return
        head = self.buf[: end + 4]
        m = _LENGTH.search(head)
        length = int(m.group(1)) if m else 0
        if len(self.buf) < end + 4 + length:
            return
        body = self.buf[end + 4 : end + 4 + length]
        self.buf = self.buf[end + 4 + length :]
        if _STREAM.search(body) is None:
            self.transport.write(_PLAIN)
            self._next()
            return
        n = _N.match(head)
        events = min(int(n.group(1)), _MAX_EVENTS) if n else 16
        paced = _INTERVAL.match(head)
        self.interval = int(paced.group(1)) / 1000 if paced else 0.0
        self.busy = True
        self.transport.write(_STREAM_HEAD + _FIRST)
        self.loop.call_soon(self._event, 0, events)

    def _event(self, i: int, events: int) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if i < events:
            self.transport.write(_WORDS[i % len(_WORDS)])
            if self.interval:
                self.loop.call_later(self.interval, self._event, i + 1, events)
            else:
                self.loop.call_soon(self._event, i + 1, events)
            return
        self.transport.write(_LAST + _DONE)
        self.busy = False
        self._next()


async def serve() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Conn, "127.0.0.1", 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(f"http://127.0.0.1:{port}/v1", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        sys.exit(0)
