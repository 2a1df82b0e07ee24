"""Raw-socket helpers for the fault server's own tests: bytes out, a parsed answer back.

Shared by the test modules that check the server's limits, guards and overload behaviour;
every read is bounded, so a server that never answers fails the test instead of hanging it.
"""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

__all__ = ["Answer", "address", "http_request", "raw_exchange"]


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
