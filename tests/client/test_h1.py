"""The pool's own HTTP/1.1 connection on asyncio (`stallproof._wire._h1.H1Connection`).

The pool's guarantees (bursts, cancellation at every phase, TLS cancel, DNS, proxies) are
proven by tests/client/test_pool.py, test_bounds.py, test_proxy.py..., which run on it on
asyncio since it is the default there. Here: that it is the one used, and the HTTP it
must get right itself — framing by the end of the connection, interim answers, HEAD, a
streamed request body, a head too large, a socket that stops being read while the caller
does not read, keep-alive reuse, and a read bound that fires as a loop timer.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpcore2
import pytest

import stallproof
from stallproof._wire._h1 import MAX_HEAD_BYTES, H1Body, H1Connection
from stallproof._wire._messages import new_request, new_response
from stallproof._wire._pool import Pool, PoolStats, open_pool

from ..support.rawserver import always, chunked, response
from ..support.timing import MARGIN, stopwatch

pytestmark = pytest.mark.anyio
asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])

OK = b'{"ok": true}'


def request(url: str, method: bytes = b"POST", **kw: Any) -> httpcore2.Request:
    kw.setdefault("content", b"{}")
    return httpcore2.Request(method, url, **kw)


async def read_all(pool: Pool, req: httpcore2.Request) -> tuple[int, bytes]:
    resp = await pool.send(req)
    try:
        body = b"".join([part async for part in resp.stream])  # type: ignore[union-attr]
    finally:
        await resp.aclose()
    return resp.status, body


@pytest.fixture
async def pool() -> AsyncIterator[Pool]:
    pool = Pool(stallproof.Limits())
    yield pool
    assert pool.stats().nothing_held
    await pool.aclose()


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_the_connection_is_chosen_by_backend(raw_server: Any, anyio_backend: str) -> None:
    srv = raw_server(always(response(200, OK)))
    for kind in ("auto", "httpcore2"):
        pool = Pool(stallproof.Limits(), connection=kind)
        conn = pool._new((b"http", b"127.0.0.1", srv.port, None))
        fast = anyio_backend == "asyncio" and kind == "auto"
        assert isinstance(conn, H1Connection) is fast
        await conn.aclose()
    with pytest.raises(stallproof.InvalidRequestError, match="connection must be one of"):
        Pool(stallproof.Limits(), connection="h3")


@asyncio_only
async def test_keep_alive_reuses_one_connection(pool: Pool) -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(OK)
    with KeepAliveServer(head + OK) as srv:
        for _ in range(5):
            assert await read_all(pool, request(srv.url)) == (200, OK)
        assert srv.connections == 1
        assert pool.stats() == PoolStats(connections=1, idle=1, in_use=0, waiting=0)
    await pool.aclose()


@asyncio_only
async def test_a_body_framed_by_the_end_of_the_connection(raw_server: Any, pool: Pool) -> None:
    srv = raw_server(always([response(200, b"", length=False), b"part one, ", 0.05, b"two"]))
    assert await read_all(pool, request(srv.url)) == (200, b"part one, two")
    assert pool.stats().nothing_held and pool.stats().idle == 0  # not reusable


@asyncio_only
async def test_a_chunked_body_and_an_interim_answer(raw_server: Any, pool: Pool) -> None:
    interim = b"HTTP/1.1 100 Continue\r\n\r\n"
    head = response(200, b"", {"transfer-encoding": "chunked"})
    srv = raw_server(always([interim + head, chunked(b"ab"), 0.02, chunked(b"cd") + chunked(b"")]))
    assert await read_all(pool, request(srv.url)) == (200, b"abcd")


@asyncio_only
async def test_head_has_no_body_whatever_it_says(raw_server: Any, pool: Pool) -> None:
    srv = raw_server(always(b"HTTP/1.1 200 OK\r\ncontent-length: 500\r\n\r\n"))
    with anyio.fail_after(2):
        assert await read_all(pool, request(srv.url, b"HEAD", content=b"")) == (200, b"")
    assert pool.stats().nothing_held


@asyncio_only
async def test_a_streamed_request_body_is_chunk_framed(raw_server: Any, pool: Pool) -> None:
    srv = raw_server(always(response(200, OK)))

    async def parts() -> AsyncIterator[bytes]:
        yield b'{"a": '
        yield b"1}"

    assert await read_all(pool, request(srv.url, content=parts())) == (200, OK)
    assert srv.requests[0].headers["transfer-encoding"] == "chunked"


@asyncio_only
async def test_a_body_that_breaks_its_content_length_is_refused(
    raw_server: Any, pool: Pool
) -> None:
    srv = raw_server(always(response(200, OK)))
    for declared, which in ((b"1", "much"), (b"9", "little")):
        req = request(srv.url, headers=[(b"content-length", declared)])
        with pytest.raises(httpcore2.LocalProtocolError, match=f"Too {which} data"):
            await pool.send(req)
    assert srv.requests == []  # nothing was sent


@asyncio_only
async def test_a_head_too_large_is_a_protocol_error(raw_server: Any, make_client: Any) -> None:
    filler = b"x-filler: " + b"a" * 1000 + b"\r\n"
    head = b"HTTP/1.1 200 OK\r\n" + filler * (MAX_HEAD_BYTES // len(filler) + 10)
    srv = raw_server(always([head, 5.0]))  # ... and the head never ends
    client = make_client(srv.url, timeout=stallproof.Timeouts(total=5))
    with stopwatch() as t, pytest.raises(stallproof.ConnectionLost, match="head is too large"):
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert t[0] < 1 + MARGIN


@asyncio_only
async def test_a_caller_that_does_not_read_stops_the_socket_being_read(pool: Pool) -> None:
    """A server that sends 32 MiB at once: while nobody reads the body, the connection
    buffers at most ~0.5 MiB (the rest waits in the kernel, then in the server)."""
    big = 32 * 1024 * 1024
    head = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % big
    with KeepAliveServer(head + b"x" * big) as srv:
        resp = await pool.send(request(srv.url))
        conn = next(iter(pool._busy))
        assert isinstance(conn, H1Connection)
        await anyio.sleep(0.3)
        assert conn._buffered <= 768 * 1024
        got = 0
        async for part in resp.stream:  # type: ignore[union-attr]
            got += len(part)
        assert got == big
        await resp.aclose()
    await pool.aclose()


@asyncio_only
async def test_the_read_bound_fires_on_a_server_that_goes_quiet(raw_server: Any) -> None:
    srv = raw_server(always([response(200, b"", length=False), b"start", 5.0]))
    pool = Pool(stallproof.Limits())
    req = request(srv.url, extensions={"timeout": {"read": 0.3}})
    resp = await pool.send(req)
    parts = resp.stream.__aiter__()  # type: ignore[union-attr]
    assert await parts.__anext__() == b"start"
    with stopwatch() as t, pytest.raises(httpcore2.ReadTimeout):
        await parts.__anext__()
    assert 0.3 <= t[0] < 0.3 + MARGIN
    await resp.aclose()
    assert pool.stats().nothing_held


@asyncio_only
async def test_one_timer_per_connection_bounds_each_read_from_its_own_start(
    raw_server: Any,
) -> None:
    """The connection's one timer (`H1Connection._arm`): armed for an earlier read, it
    moves on to a later read's bound when it fires, and comes forward for an earlier one:
    every read is bounded from its own start, never by an older read's timer."""
    srv = raw_server(always([response(200, b"", length=False), b"a", 0.2, b"b", 5.0]))
    pool = Pool(stallproof.Limits())
    resp = await pool.send(request(srv.url, extensions={"timeout": {"read": 0.5}}))
    body = resp.stream.__aiter__()  # type: ignore[union-attr]
    assert await body.__anext__() == b"a"
    assert await body.__anext__() == b"b"  # ~0.2 s: the timer armed at the start stays
    with stopwatch() as t, pytest.raises(httpcore2.ReadTimeout):
        await body.__anext__()  # the timer fires 0.3 s in, and is moved on to 0.5 s
    assert 0.5 <= t[0] < 0.5 + MARGIN
    await resp.aclose()

    srv = raw_server(always([response(200, b"", length=False), b"a", 5.0]))
    resp = await pool.send(request(srv.url, extensions={"timeout": {"read": 5.0}}))
    body = resp.stream.__aiter__()  # type: ignore[union-attr]
    assert isinstance(body, H1Body)
    assert await body.__anext__() == b"a"
    loop_now = asyncio.get_running_loop().time
    with stopwatch() as t, pytest.raises(TimeoutError):
        await body.read_before(loop_now() + 0.3)  # earlier than the armed timer: re-armed
    assert 0.3 <= t[0] < 0.3 + MARGIN
    await resp.aclose()
    assert pool.stats().nothing_held
    await pool.aclose()


class KeepAliveServer:
    """Answers every request on a connection with ``answer``, keeping it open; counts
    connections."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/x"
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        conn.settimeout(0.2)
        buf = b""
        with conn:
            while not self._stop.is_set():
                try:
                    data = conn.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                buf += data
                while b"\r\n\r\n" in buf:
                    head, _, buf = buf.partition(b"\r\n\r\n")
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value)
                    while len(buf) < length:
                        buf += conn.recv(65536)
                    buf = buf[length:]
                    conn.settimeout(None)
                    try:
                        conn.sendall(self.answer)
                    except OSError:
                        return
                    conn.settimeout(0.2)

    def __enter__(self) -> KeepAliveServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


def test_messages_are_built_as_httpcore2_builds_them() -> None:
    # `new_request`/`new_response` set httpcore2's attributes directly: a new attribute in
    # a later httpcore2 must show up here, not as an AttributeError deep in a call.
    stream = [b"x"]
    ext: dict[str, Any] = {"timeout": {}}
    mine = new_request(b"POST", b"http", b"h", 8, b"/p", [(b"a", b"b")], b"x", ext)
    theirs = httpcore2.Request(
        b"POST",
        httpcore2.URL(scheme=b"http", host=b"h", port=8, target=b"/p"),
        headers=[(b"a", b"b")],
        content=b"x",
        extensions=ext,
    )
    assert vars(mine).keys() == vars(theirs).keys()
    assert vars(mine.url) == vars(theirs.url)
    assert (mine.method, mine.headers, list(mine.stream)) == (  # type: ignore[arg-type]
        theirs.method,
        theirs.headers,
        list(theirs.stream),  # type: ignore[arg-type]
    )
    r1 = new_response(200, [(b"a", b"b")], stream, ext)
    r2 = httpcore2.Response(200, headers=[(b"a", b"b")], content=stream, extensions=ext)
    assert vars(r1) == vars(r2)


@asyncio_only
async def test_a_stream_read_is_bounded_by_a_loop_timer(raw_server: Any) -> None:
    """`H1Body.read_before(until)`: what is buffered comes back at once; a wait past
    ``until`` raises `TimeoutError` on time (the engine's idle and first_token bounds of a
    stream step, with no cancel scope per read); the connection is then not reused."""
    srv = raw_server(always([response(200, b"", length=False), b"start", 5.0]))
    pool = Pool(stallproof.Limits())
    resp = await pool.send(request(srv.url))
    body = resp.stream.__aiter__()  # type: ignore[union-attr]
    assert isinstance(body, H1Body)
    loop_now = asyncio.get_running_loop().time
    assert await body.read_before(loop_now() + 5) == b"start"
    with stopwatch() as t, pytest.raises(TimeoutError):
        await body.read_before(loop_now() + 0.3)
    assert 0.3 <= t[0] < 0.3 + MARGIN
    await resp.aclose()
    assert pool.stats().nothing_held and pool.stats().idle == 0


@asyncio_only
async def test_the_environment_can_take_the_asyncio_wire_back(
    raw_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    srv = raw_server(always(response(200, OK)))
    key = (b"http", b"127.0.0.1", srv.port, None)
    for value, fast in (("httpcore2", False), ("", True), ("auto", True)):
        monkeypatch.setenv("STALLPROOF_CONNECTION", value)
        pool = open_pool(stallproof.Limits(), trust_env=False)
        conn = pool._new(key)
        assert isinstance(conn, H1Connection) is fast
        await conn.aclose()
    monkeypatch.setenv("STALLPROOF_CONNECTION", "h3")
    with pytest.raises(stallproof.InvalidRequestError, match="STALLPROOF_CONNECTION must be"):
        stallproof.Client(api_key="x", base_url=srv.url)
