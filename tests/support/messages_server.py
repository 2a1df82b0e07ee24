"""A small real Anthropic Messages server on loopback, with a handful of named faults.

Used until `fault_server` speaks ``/v1/messages`` (it serves OpenAI chat completions
today): the anthropic SDK face is driven against these over real sockets. Each fault is the
Messages-shaped twin of the `fault_server` fault of the same name; when `fault_server`
gains ``/v1/messages``, test_sdk_catalogue's anthropic case should move to the whole
catalogue and this module can go.

The base URL for a fault is ``server.url(name)``; the SDK appends ``/v1/messages``.
"""

from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["FAULTS", "MessagesServer", "running_messages_server"]

HOLD = 10.0  # the longest a stalled fault keeps its connection

MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-test",
    "content": [{"type": "text", "text": "Hello there"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 3, "output_tokens": 2},
}


def _event(name: str, data: dict[str, object]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


START = _event(
    "message_start",
    {"type": "message_start", "message": {**MESSAGE, "content": [], "stop_reason": None}},
)
BLOCK = _event(
    "content_block_start",
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
)
DELTA = _event(
    "content_block_delta",
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
)
END = (
    _event("content_block_stop", {"type": "content_block_stop", "index": 0})
    + _event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 2},
        },
    )
    + _event("message_stop", {"type": "message_stop"})
)
PING = _event("ping", {"type": "ping"})

# name: what a non-stream and a streamed request meet.
FAULTS = {
    "healthy": "a whole message, or a whole event stream",
    "half_open": "the request is read; nothing is ever sent",
    "sse_pings": "stream: headers, then only ping events; plain: headers, then silence",
    "sse_stall": "stream: one text delta, then silence; plain: half a body, then silence",
    "trickle_body": "headers, then one byte of body every 0.2 s",
    "reset": "the connection is reset before any answer",
    "close_mid_body": "half the answer, then the connection is closed",
    "overloaded": "529 overloaded_error",
}


def _head(ctype: str, length: int | None) -> bytes:
    framing = f"content-length: {length}\r\n" if length is not None else ""
    return (
        f"HTTP/1.1 200 OK\r\ncontent-type: {ctype}\r\n{framing}request-id: req_1\r\n\r\n".encode()
    )


class _Handler(socketserver.BaseRequestHandler):
    server: MessagesServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(HOLD)
        head = b""
        while b"\r\n\r\n" not in head:
            part = sock.recv(65536)
            if not part:
                return
            head += part
        head, _, body = head.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        path = lines[0].split(" ")[1]
        length = next(
            (
                int(v)
                for k, _, v in (h.partition(":") for h in lines[1:])
                if k.strip().lower() == "content-length"
            ),
            0,
        )
        while len(body) < length:
            part = sock.recv(65536)
            if not part:
                return
            body += part
        fault = path.split("/")[2] if path.startswith("/fault/") else "healthy"
        stream = json.loads(body or b"{}").get("stream") is True
        # OSError: the client went away, which is what most faults are waiting for.
        with contextlib.suppress(OSError):
            self._answer(sock, fault, stream)

    def _hold(self) -> None:
        self.server.stopping.wait(HOLD)

    def _answer(self, sock: socket.socket, fault: str, stream: bool) -> None:
        ctype = "text/event-stream" if stream else "application/json"
        body = START + BLOCK + DELTA + END if stream else json.dumps(MESSAGE).encode()
        headers = _head(ctype, len(body))
        if fault == "healthy":
            sock.sendall(headers + body)
        elif fault == "half_open":
            self._hold()
        elif fault == "reset":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif fault == "close_mid_body":
            sock.sendall(headers + body[: len(body) // 2])
        elif fault == "overloaded":
            error = json.dumps(
                {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
            ).encode()
            sock.sendall(
                b"HTTP/1.1 529 Overloaded\r\ncontent-type: application/json\r\n"
                + f"content-length: {len(error)}\r\n\r\n".encode()
                + error
            )
        elif fault == "sse_pings" and stream:
            sock.sendall(_head(ctype, None) + START)  # the body ends when the server closes
            while not self.server.stopping.wait(0.1):
                sock.sendall(PING)
        elif fault in ("sse_stall", "sse_pings"):
            cut = START + BLOCK + DELTA if stream else body[: len(body) // 2]
            sock.sendall(headers + (cut if fault == "sse_stall" else b""))
            self._hold()
        elif fault == "trickle_body":
            sock.sendall(headers)
            for byte in body:
                if self.server.stopping.wait(0.2):
                    return
                sock.sendall(bytes([byte]))
        else:
            raise ValueError(f"unknown fault {fault!r}")


class MessagesServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.stopping = threading.Event()

    def url(self, fault: str = "healthy") -> str:
        """The SDK's ``base_url`` for a fault (the SDK adds ``/v1/messages``)."""
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; known: {sorted(FAULTS)}")
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/fault/{fault}"


@contextmanager
def running_messages_server() -> Iterator[MessagesServer]:
    server = MessagesServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server
    finally:
        server.stopping.set()
        server.shutdown()
        server.server_close()
        thread.join(5)
