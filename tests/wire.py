"""Raw-socket helpers for the fault server's own tests: bytes out, a parsed answer back.

Shared by the test modules that check the server's limits, guards and overload behaviour;
every read is bounded, so a server that never answers fails the test instead of hanging it.
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
from typing import Any
from urllib.parse import urlsplit

__all__ = ["Answer", "address", "cli_server", "http_request", "pipeline", "raw_exchange"]


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
def cli_server(*args: str, **popen: Any) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``fault-server --port 0 *args`` in a process of its own (its own GIL and core);
    yields its base URL (without /v1) and the process, and stops it (SIGTERM, then kill)."""
    popen.setdefault("stderr", subprocess.DEVNULL)
    command = [sys.executable, "-m", "fault_server", "--port", "0", *args]
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
