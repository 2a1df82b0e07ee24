"""A raw-socket HTTP/1.1 server on loopback, for answers no well-behaved server would send.

The fault server speaks the OpenAI protocol with named faults; this one sends whatever
bytes a test hands it — a compression bomb, a body with odd line endings, a redirect loop —
so a test can put any answer on a real socket in a few lines::

    with RawServer(lambda req: response(200, body, {"content-encoding": "br"})) as srv:
        client = make_client(srv.url)

``answer`` receives the request (`RawRequest`) and returns the bytes to send, or an
iterable of byte strings and float delays (seconds to sleep between writes). Every
connection is served in its own thread and closed after one answer. Threads are daemons
and the server stops on ``close()``, so a test that fails never leaves one behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any

__all__ = ["RawRequest", "RawServer", "always", "chunked", "response"]

Answer = bytes | Iterable[bytes | float]


@dataclasses.dataclass
class RawRequest:
    method: str
    target: str
    headers: dict[str, str]  # lower-cased names
    body: bytes
    raw: bytes  # the head and body exactly as received


def response(
    status: int,
    body: bytes,
    headers: Mapping[str, str] | None = None,
    *,
    length: bool = True,
) -> bytes:
    """An HTTP/1.1 answer with ``Connection: close`` (and Content-Length unless ``length``
    is False or the headers give a Transfer-Encoding)."""
    head = [f"HTTP/1.1 {status} X", "connection: close"]
    hdrs = {k.lower(): v for k, v in (headers or {}).items()}
    if length and "transfer-encoding" not in hdrs:
        hdrs.setdefault("content-length", str(len(body)))
    head += [f"{k}: {v}" for k, v in hdrs.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def chunked(part: bytes) -> bytes:
    """One chunk of a ``Transfer-Encoding: chunked`` body (b"" makes the last chunk)."""
    return f"{len(part):x}\r\n".encode() + part + b"\r\n"


class RawServer:
    """Serve ``answer(request)`` on 127.0.0.1 until closed. ``requests`` records each one."""

    def __init__(self, answer: Callable[[RawRequest], Answer], *, path: str = "/v1") -> None:
        self._answer = answer
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.1)
        self.port: int = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}{path}"
        self.requests: list[RawRequest] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, daemon=True)
        self._accept.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            if self._stop.is_set():  # the wake-up from close()
                conn.close()
                return
            t = threading.Thread(target=self._one, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _one(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        try:
            request = _read_request(conn)
            if request is None:
                return
            self.requests.append(request)
            answer = self._answer(request)
            for part in [answer] if isinstance(answer, bytes) else answer:
                if self._stop.is_set():
                    return
                if isinstance(part, float):
                    self._stop.wait(part)
                else:
                    conn.sendall(part)
            # Let the client read to the end before the close resets anything (the test
            # closes the server once its calls are over: no need to wait then).
            self._stop.wait(0.05)
        except OSError:
            pass  # the client went away: that is often what the test is about
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        # Wake the accept loop now, not at its next 0.1 s timeout.
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        self._accept.join(5)
        for t in self._threads:
            t.join(5)
        self._sock.close()

    def __enter__(self) -> RawServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _read_request(conn: socket.socket) -> RawRequest | None:
    data = b""
    while b"\r\n\r\n" not in data:
        part = conn.recv(65536)
        if not part:
            return None
        data += part
        if len(data) > 1 << 20:
            return None
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    while len(body) < length:
        part = conn.recv(65536)
        if not part:
            break
        body += part
    return RawRequest(method, target, headers, body, head + b"\r\n\r\n" + body)


def always(answer: Answer) -> Any:
    """A `RawServer` answer that ignores the request."""

    def respond(request: RawRequest) -> Answer:
        return answer

    return respond
