"""A real HTTP and SOCKS5 proxy on loopback, with the faults a corporate proxy shows.

`ProxyServer` relays for real: an absolute-form request (``POST http://host:port/path``) is
forwarded to its origin in origin form, a ``CONNECT host:port`` opens a TCP tunnel, and with
``socks=True`` it speaks SOCKS5 (no auth, or username/password) instead. Each client
connection is served by its own daemon thread with a ``select`` loop, so the proxy also
sees when the client closes its side: ``active`` counts the client connections still open,
which is how a test checks that nothing is held after a fault.

Faults (``fault=``):

- ``None``: relay.
- ``"silent"``: accept and read, never answer (not even to a CONNECT).
- ``"status"``: answer every request head (CONNECT or forward) with ``status``.

``tls=`` (a server-side `ssl.SSLContext`) makes it an https:// proxy: TLS to the proxy,
and for a CONNECT, the client's TLS to the origin inside that.

``auth=(user, password)`` makes the proxy answer 407 to a request whose
``Proxy-Authorization`` (or SOCKS5 credentials) differ. ``seen`` records what it received:
method, target and the ``Proxy-Authorization`` header, per request head.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import re
import select
import socket
import ssl
import struct
import threading
import time
from types import TracebackType

__all__ = ["ProxyServer", "Seen"]

_HEAD_MAX = 64 * 1024
_HOP_BY_HOP = (b"proxy-authorization", b"proxy-connection")
_ABSOLUTE = re.compile(rb"^([A-Z]+) (http://[^/ ]+)(/[^ ]*) HTTP/1\.1\r\n")


@dataclasses.dataclass(frozen=True)
class Seen:
    method: str
    target: str
    proxy_authorization: str | None


class ProxyServer:
    """Serve as a proxy on 127.0.0.1 until closed (see the module docstring)."""

    def __init__(
        self,
        *,
        fault: str | None = None,
        status: int = 502,
        auth: tuple[str, str] | None = None,
        socks: bool = False,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.fault = fault
        self.tls = tls
        self.status = status
        self.auth = auth
        self.socks = socks
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._active = 0
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.1)
        self.port: int = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, daemon=True)
        self._accept.start()

    @property
    def url(self) -> str:
        return f"{self._scheme}://127.0.0.1:{self.port}"

    def url_with(self, user: str, password: str) -> str:
        return f"{self._scheme}://{user}:{password}@127.0.0.1:{self.port}"

    @property
    def _scheme(self) -> str:
        return "socks5" if self.socks else "https" if self.tls else "http"

    @property
    def active(self) -> int:
        """Client connections the proxy still has open (the client has not closed them)."""
        with self._lock:
            return self._active

    def wait_idle(self, seconds: float = 3.0) -> int:
        """Wait until every client connection is closed, or ``seconds``; the count left."""
        deadline = time.monotonic() + seconds
        while self.active and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.active

    # -- serving ---------------------------------------------------------------------------

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            if self._stop.is_set():  # the wake-up from close()
                conn.close()
                return
            with self._lock:
                self._active += 1
            t = threading.Thread(target=self._one, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _one(self, conn: socket.socket) -> None:
        upstream: socket.socket | None = None
        try:
            conn.settimeout(10)
            if self.tls is not None:  # an https:// proxy: TLS to the proxy itself
                conn = self.tls.wrap_socket(conn, server_side=True)
            upstream = self._socks(conn) if self.socks else self._http(conn)
            if upstream is not None:
                self._pipe(conn, upstream, forward=not self.socks and self._forward)
        except OSError:
            pass  # the client went away: often what the test is about
        finally:
            if upstream is not None:
                upstream.close()
            conn.close()
            with self._lock:
                self._active -= 1

    def _http(self, conn: socket.socket) -> socket.socket | None:
        """Read one request head; answer it, tunnel it or forward it."""
        self._forward = False
        buffered = b""
        while b"\r\n\r\n" not in buffered:
            data = self._recv(conn)
            if not data:
                return None
            buffered += data
            if len(buffered) > _HEAD_MAX:
                return None
        head, _, rest = buffered.partition(b"\r\n\r\n")
        method, target, headers = _split(head)
        given = self._saw(method, target, headers)
        if self.fault == "silent":
            self._drain(conn)
            return None
        if self.fault == "status":
            conn.sendall(_answer(self.status))
            return None
        if self.auth is not None and given != _basic(*self.auth):
            conn.sendall(_answer(407, b"Proxy-Authenticate: Basic realm=proxy\r\n"))
            return None
        return self._open(conn, method, target, headers, rest)

    def _open(
        self,
        conn: socket.socket,
        method: str,
        target: str,
        headers: list[list[bytes]],
        rest: bytes,
    ) -> socket.socket:
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
            upstream = socket.create_connection((host.strip("[]"), int(port)), timeout=5)
            conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            if rest:
                upstream.sendall(rest)
            return upstream
        # Absolute form: http://host:port/path -> origin form to the origin.
        authority, _, path = target.partition("://")[2].partition("/")
        host, _, port = authority.rpartition(":")
        upstream = socket.create_connection((host.strip("[]"), int(port or 80)), timeout=5)
        request_line = f"{method} /{path} HTTP/1.1\r\n".encode("latin-1")
        upstream.sendall(request_line + _kept(headers) + b"\r\n" + rest)
        self._forward = True
        return upstream

    def _socks(self, conn: socket.socket) -> socket.socket | None:
        """SOCKS5 (RFC 1928/1929): a greeting, maybe credentials, then CONNECT."""
        version, count = self._exact(conn, 2)
        methods = self._exact(conn, count)
        wanted = 0x02 if self.auth is not None else 0x00
        if version != 5 or wanted not in methods:
            conn.sendall(b"\x05\xff")
            return None
        conn.sendall(bytes([5, wanted]))
        given: str | None = None
        if wanted == 0x02:
            _, ulen = self._exact(conn, 2)
            user = self._exact(conn, ulen)
            (plen,) = self._exact(conn, 1)
            password = self._exact(conn, plen)
            given = f"{user.decode()}:{password.decode()}"
            if (user.decode(), password.decode()) != self.auth:
                conn.sendall(b"\x01\x01")
                self.seen.append(Seen("SOCKS", "", given))
                return None
            conn.sendall(b"\x01\x00")
        _, command, _, kind = self._exact(conn, 4)
        if kind == 1:
            host = socket.inet_ntoa(self._exact(conn, 4))
        elif kind == 3:
            (length,) = self._exact(conn, 1)
            host = self._exact(conn, length).decode()
        else:
            host = socket.inet_ntop(socket.AF_INET6, self._exact(conn, 16))
        (port,) = struct.unpack("!H", self._exact(conn, 2))
        self.seen.append(Seen("SOCKS", f"{host}:{port}", given))
        if self.fault == "silent" or command != 1:
            self._drain(conn)
            return None
        upstream = socket.create_connection((host, port), timeout=5)
        conn.sendall(b"\x05\x00\x00\x01" + socket.inet_aton("127.0.0.1") + b"\x00\x00")
        return upstream

    def _pipe(self, conn: socket.socket, upstream: socket.socket, *, forward: bool) -> None:
        """Relay both ways until either side closes (or the proxy stops).

        Forwarding, a later request on the same (keep-alive) connection is turned to origin
        form too: the client sends it only once the answer before is read, so it starts a
        read of its own."""
        ends = {conn: upstream, upstream: conn}
        while not self._stop.is_set():
            readable = _ready(list(ends))
            for sock in readable:
                data = sock.recv(65536)
                if not data:
                    return
                if forward and sock is conn:
                    data = self._to_origin_form(data)
                ends[sock].sendall(data)

    def _to_origin_form(self, data: bytes) -> bytes:
        found = _ABSOLUTE.match(data)
        if found is None:
            return data
        head, _, rest = data.partition(b"\r\n\r\n")  # a test's head comes in one read
        method, target, headers = _split(head)
        self._saw(method, target, headers)
        path = found.group(3)
        return f"{method} ".encode() + path + b" HTTP/1.1\r\n" + _kept(headers) + b"\r\n" + rest

    def _saw(self, method: str, target: str, headers: list[list[bytes]]) -> bytes | None:
        found = {k.strip().lower(): v.strip() for k, v in headers}
        given = found.get(b"proxy-authorization")
        self.seen.append(Seen(method, target, given.decode("latin-1") if given else None))
        return given

    def _drain(self, conn: socket.socket) -> None:
        """Read and drop until the client closes (or the proxy stops): never answer."""
        while not self._stop.is_set():
            readable = _ready([conn])
            if readable and not conn.recv(65536):
                return

    def _recv(self, conn: socket.socket) -> bytes:
        while not self._stop.is_set():
            readable = _ready([conn])
            if readable:
                return conn.recv(65536)
        return b""

    def _exact(self, conn: socket.socket, n: int) -> bytes:
        data = b""
        while len(data) < n and not self._stop.is_set():
            readable = _ready([conn])
            part = conn.recv(n - len(data)) if readable else b"-"
            if part == b"-":
                continue
            if not part:
                raise ConnectionError("the client closed mid-handshake")
            data += part
        return data

    # -- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        self._stop.set()
        # Wake the accept loop now, not at its next 0.1 s timeout.
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        self._accept.join(5)
        for t in self._threads:
            t.join(5)
        self._sock.close()

    def __enter__(self) -> ProxyServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _ready(socks: list[socket.socket]) -> list[socket.socket]:
    """The sockets with something to read within 50 ms (TLS data already decrypted too)."""
    pending: list[socket.socket] = [
        s for s in socks if isinstance(s, ssl.SSLSocket) and s.pending()
    ]
    if pending:
        return pending
    readable, _, _ = select.select(socks, [], [], 0.05)
    return readable


def _split(head: bytes) -> tuple[str, str, list[list[bytes]]]:
    """A request head's method, target and headers (name, value pairs)."""
    lines = head.split(b"\r\n")
    method, target, _version = lines[0].decode("latin-1").split(" ", 2)
    return method, target, [line.split(b":", 1) for line in lines[1:]]


def _kept(headers: list[list[bytes]]) -> bytes:
    """The headers an origin gets: the proxy's own are dropped."""
    return b"".join(
        k + b":" + v + b"\r\n" for k, v in headers if k.strip().lower() not in _HOP_BY_HOP
    )


def _basic(user: str, password: str) -> bytes:
    return b"Basic " + base64.b64encode(f"{user}:{password}".encode())


def _answer(status: int, extra: bytes = b"") -> bytes:
    return (
        f"HTTP/1.1 {status} Proxy Says No\r\n".encode()
        + extra
        + b"Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
