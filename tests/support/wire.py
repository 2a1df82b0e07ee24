"""Raw-socket helpers for the fault server's own tests: bytes out, a parsed answer back.

`raw_exchange`/`pipeline`/`cli_server` talk to a server by URL or run the CLI in a
subprocess; `Raw`/`request`/`exchange`/`dechunk`/`chunks` drive an in-process server one
socket at a time. Every read is bounded, so a server that never answers fails the test
instead of hanging it.
"""

from __future__ import annotations

import contextlib
import json
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from anthropic.types import MessageParam
from openai.types.chat import ChatCompletionMessageParam
from typing_extensions import TypedDict

from fault_server import FaultServer, ServerThread

__all__ = [
    "CHAT",
    "ROOT",
    "STREAM",
    "Answer",
    "ChatArgs",
    "MessagesArgs",
    "Raw",
    "StreamArgs",
    "address",
    "chat_path",
    "chunks",
    "cli_server",
    "content",
    "dechunk",
    "events",
    "exchange",
    "http_request",
    "pipeline",
    "raw_exchange",
    "request",
]


def address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def http_request(
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> bytes:
    """A well-framed HTTP/1.1 request that asks for ``Connection: close``."""
    fields = {"Host": "127.0.0.1", "Connection": "close", **(headers or {})}
    if body or method in ("POST", "PUT"):
        fields["Content-Length"] = str(len(body))
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items())
    return head.encode("latin-1") + b"\r\n" + body


class Answer:
    """A response read off the wire, or None fields when the server closed without one."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        head, _, self.body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status: int | None = int(lines[0].split()[1]) if raw else None
        self.headers = {
            k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])
        }

    def json(self) -> object:
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"Answer({self.raw[:300]!r})"


def raw_exchange(base_url: str, data: bytes, seconds: float = 10.0) -> Answer:
    """Send ``data`` on a fresh connection and read until the server closes (bounded)."""
    deadline = time.monotonic() + seconds
    with socket.create_connection(address(base_url), timeout=seconds) as sock:
        sock.sendall(data)
        out = b""
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            out += chunk
        else:
            raise AssertionError(f"no end of answer within {seconds} s: {out[:200]!r}")
    return Answer(out)


def pipeline(base_url: str, requests: list[bytes], seconds: float = 60.0) -> int:
    """Send ``requests`` back to back on one connection, the last asking to close, while
    reading the answers; returns how many status lines came back."""
    data = b"".join(requests)
    deadline = time.monotonic() + seconds
    with socket.create_connection(address(base_url), timeout=seconds) as sock:
        sock.setblocking(False)
        received = bytearray()
        sent = 0
        while True:
            if time.monotonic() > deadline:
                raise AssertionError(f"pipeline not answered within {seconds} s")
            if sent < len(data):
                with contextlib.suppress(BlockingIOError):
                    sent += sock.send(data[sent : sent + 262144])
            try:
                chunk = sock.recv(262144)
            except BlockingIOError:
                if sent >= len(data):
                    select.select([sock], [], [], 0.05)
                else:
                    select.select([sock], [sock], [], 0.05)
                continue
            if not chunk:
                break
            received += chunk
    return received.count(b"HTTP/1.1 ")


@contextlib.contextmanager
def cli_server(
    *args: str, script: str | None = None, **popen: Any
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``fault-server --port 0 *args`` in a process of its own (its own GIL and core);
    yields its base URL (without /v1) and the process, and stops it (SIGTERM, then kill).
    ``script``: a file of tests/support to run instead, which takes ``--port 0`` and prints
    its URL as ``fault-server`` does (journal_server.py)."""
    popen.setdefault("stderr", subprocess.DEVNULL)
    program = [str(Path(__file__).with_name(script))] if script else ["-m", "fault_server"]
    command = [sys.executable, *program, "--port", "0", *args]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, **popen)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 20)
        assert ready, "fault-server printed no URL within 20 s"
        line = proc.stdout.readline().decode().strip()
        assert line.endswith("/v1"), line
        yield line.removesuffix("/v1"), proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()


# -- a fault server over raw sockets, in-process --------------------------------------------

ROOT = Path(__file__).resolve().parents[2]  # the checkout


class ChatArgs(TypedDict):
    """A chat request's body, typed as the SDKs' ``create`` takes it (``**CHAT``)."""

    model: str
    messages: list[ChatCompletionMessageParam]


CHAT: ChatArgs = {"model": "m", "messages": [{"role": "user", "content": "hello brave new world"}]}


class MessagesArgs(TypedDict):
    """An Anthropic Messages request's body, typed as the SDK's ``create`` takes it."""

    model: str
    max_tokens: int
    messages: list[MessageParam]


class StreamArgs(ChatArgs):
    """`ChatArgs` with ``stream=True``: the SDKs' ``create(**STREAM)`` returns a stream."""

    stream: Literal[True]


STREAM: StreamArgs = {**CHAT, "stream": True}


def request(
    path: str,
    payload: object = None,
    *,
    method: str = "POST",
    headers: tuple[tuple[str, str], ...] = (),
) -> bytes:
    body = b"" if payload is None else json.dumps(payload).encode()
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    if payload is not None or method == "POST":
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class Raw:
    """A raw client socket with bounded reads."""

    def __init__(self, srv: ServerThread | FaultServer) -> None:
        self.sock = socket.create_connection(address(srv.base_url), timeout=5)
        self.buffer = b""

    def __enter__(self) -> Raw:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_for(self, seconds: float) -> tuple[bytes, bool]:
        """Everything received within ``seconds`` (and the buffer), and whether EOF came."""
        data, self.buffer = self.buffer, b""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                return data, True
            data += chunk
        return data, False

    def head(self, seconds: float = 3.0) -> tuple[int, dict[str, str]]:
        """Read a response head; what follows it stays in the buffer."""
        deadline = time.monotonic() + seconds
        while b"\r\n\r\n" not in self.buffer:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = self.sock.recv(65536)
            assert chunk, f"closed before a full head: {self.buffer!r}"
            self.buffer += chunk
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        status_line, *fields = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in fields:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return int(status_line.split()[1]), headers

    def body(self, length: int, seconds: float = 3.0) -> bytes:
        """Read exactly ``length`` body bytes; what follows stays in the buffer."""
        deadline = time.monotonic() + seconds
        while len(self.buffer) < length:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = self.sock.recv(65536)
            assert chunk, f"closed after {len(self.buffer)} of {length} body bytes"
            self.buffer += chunk
        data, self.buffer = self.buffer[:length], self.buffer[length:]
        return data

    def recv_until_reset(self, seconds: float) -> bytes:
        """Everything received before a ConnectionResetError; fail if none comes in time."""
        data, self.buffer = self.buffer, b""
        self.sock.settimeout(seconds)
        try:
            while chunk := self.sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            return data
        raise AssertionError(f"clean close instead of a reset, after {data!r}")

    def wait_eof(self, seconds: float) -> bytes:
        """Read until the server closes; fail if it has not within ``seconds``."""
        data, eof = self.recv_for(seconds)
        assert eof, f"server still open after {seconds} s"
        return data


def dechunk(data: bytes) -> tuple[bytes, bool]:
    """Decode a chunked body; returns the payload and whether the terminator came."""
    out = b""
    while data:
        size_line, sep, rest = data.partition(b"\r\n")
        if not sep:
            break
        size = int(size_line, 16)
        if size == 0:
            return out, True
        out += rest[:size]
        data = rest[size + 2 :]
    return out, False


def events(stream: bytes) -> list[str]:
    return [e for e in stream.decode().split("\n\n") if e]


def chat_path(srv: ServerThread | FaultServer, fault: str | None = None, **params: Any) -> str:
    base = srv.url(fault, **params)
    return urlsplit(base).path + "/chat/completions"


def exchange(
    srv: ServerThread | FaultServer,
    fault: str | None = None,
    payload: object = CHAT,
    **params: Any,
) -> tuple[int, dict[str, str], bytes]:
    """One well-framed request/response over a fresh connection (Connection: close)."""
    with Raw(srv) as raw:
        raw.send(
            request(chat_path(srv, fault, **params), payload, headers=(("Connection", "close"),))
        )
        status, headers = raw.head()
        rest = raw.wait_eof(3)
    if headers.get("transfer-encoding") == "chunked":
        rest, _ = dechunk(rest)
    return status, headers, rest


def chunks(payload: bytes) -> list[dict[str, Any]]:
    """The JSON of every data event of a (dechunked) SSE body, [DONE] left out."""
    out = []
    for event in events(payload):
        data = "\n".join(
            line[len("data:") :].strip() for line in event.split("\n") if line.startswith("data:")
        )
        if data and data != "[DONE]":
            out.append(json.loads(data))
    return out


def content(payload: bytes) -> str:
    return "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks(payload) if c["choices"]
    )
