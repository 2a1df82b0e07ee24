"""Compression bombs: the size caps count decoded bytes, as they are decoded.

A few hundred bytes of brotli or a kilobyte of gzip inside gzip decode to hundreds of
MiB. Each test serves such a body over a real socket (tests/support/rawserver.py) and checks that
the call ends with the typed error, on time, holding memory near the cap, on success
bodies, error bodies and streams, through `Client` and through the httpx transports.
"""

from __future__ import annotations

import functools
import json
import zlib
from collections.abc import Callable
from typing import Any

import brotli
import httpx
import httpx2
import pytest
import zstandard
from openai.types.chat import ChatCompletionMessageParam

import stallproof

from ..support.clients import MakeClient, assert_pool_clean
from ..support.memory import Peak
from ..support.rawserver import always, response

pytestmark = pytest.mark.anyio

MSGS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]
CAP = 1024 * 1024
LIMITS = stallproof.Limits(max_response_bytes=CAP, max_line_bytes=64 * 1024)
MiB = 1024 * 1024
# Bombs decode to SIZE_MIB MiB, 16 times the cap: an uncut one would peak far above the 8x
# the tests allow, and building them costs each test worker well under a second.
SIZE_MIB = 16
# The proof that a bomb is cut is the heap's peak (`Peak`), not a stopwatch: MiBs of zeros
# decode in ~0.2 s whether cut or not, and a loaded machine can take longer than that to run
# the cut call. Time is bounded by the client's total (5 s): a call that ran into it would
# raise TotalTimeout, not the error each test expects.


def _gzip(parts: Callable[[], Any], wbits: int = 31) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, wbits)
    return b"".join(c.compress(p) for p in parts()) + c.flush()


def _brotli(parts: Callable[[], Any]) -> bytes:
    c = brotli.Compressor(quality=5)
    return b"".join(c.process(p) for p in parts()) + bytes(c.finish())


def _zstd(parts: Callable[[], Any]) -> bytes:
    c = zstandard.ZstdCompressor(level=3).compressobj()
    return b"".join(c.compress(p) for p in parts()) + c.flush()


@functools.cache
def bomb(encoding: str, filler: bytes = b"\0", mib: int = SIZE_MIB) -> bytes:
    """``mib`` MiB of ``filler`` under ``encoding`` (a few KB on the wire)."""

    def parts() -> Any:
        return (filler * MiB for _ in range(mib))

    if encoding == "gzip":
        return _gzip(parts)
    if encoding == "deflate":
        return _gzip(parts, wbits=15)
    if encoding == "br":
        return _brotli(parts)
    if encoding == "zstd":
        return _zstd(parts)
    if encoding == "gzip, gzip":
        inner = bomb("gzip", filler, mib)
        return _gzip(lambda: [inner])
    raise AssertionError(encoding)


ENCODINGS = ["gzip", "deflate", "br", "zstd", "gzip, gzip"]


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_a_success_body_bomb_is_response_too_large(
    encoding: str, raw_server: Any, make_client: MakeClient
) -> None:
    body = bomb(encoding)
    srv = raw_server(always(response(200, body, {"content-encoding": encoding})))
    client = make_client(srv.url, limits=LIMITS, timeout=5)
    with Peak() as mem, pytest.raises(stallproof.ResponseTooLarge) as e:
        await client.chat.completions.create(model="m", messages=MSGS)
    assert e.value.limit == CAP and e.value.stallproof_request_id
    assert mem.peak < 8 * CAP, mem.peak
    assert_pool_clean(client)


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_an_error_body_bomb_is_cut_at_the_error_cap(
    encoding: str, raw_server: Any, make_client: MakeClient
) -> None:
    body = bomb(encoding)
    srv = raw_server(always(response(500, body, {"content-encoding": encoding})))
    client = make_client(srv.url, limits=LIMITS, timeout=5)
    with Peak() as mem, pytest.raises(stallproof.InternalServerError) as e:
        await client.chat.completions.create(model="m", messages=MSGS)
    # Decoded (zeros, not compressed bytes) and cut at max_error_body_bytes.
    assert e.value.body == "\0" * LIMITS.max_error_body_bytes
    assert "content-encoding" not in e.value.headers
    assert mem.peak < 8 * CAP, mem.peak


@functools.cache
def _sse_bomb() -> bytes:
    """gzip of a content event, then blank lines (valid SSE, no events): SIZE_MIB MiB."""
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    first = (
        b"data: "
        + json.dumps({**chunk, "choices": [{"index": 0, "delta": {"content": "hi"}}]}).encode()
    )
    return _gzip(lambda: [first + b"\n\n", *(b"\n" * MiB for _ in range(SIZE_MIB))])


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_a_stream_bomb_is_response_too_large(
    encoding: str, raw_server: Any, make_client: MakeClient
) -> None:
    headers = {"content-type": "text/event-stream", "content-encoding": encoding}
    srv = raw_server(always(response(200, bomb(encoding, b"\n"), headers)))
    client = make_client(srv.url, limits=LIMITS, timeout=5)
    with Peak() as mem, pytest.raises(stallproof.ResponseTooLarge) as e:
        s = await client.chat.completions.create(model="m", messages=MSGS, stream=True)
        async for _ in s:
            pass
    assert e.value.limit == CAP
    assert mem.peak < 8 * CAP, mem.peak
    assert_pool_clean(client)
    assert client.inflight() == ()


@pytest.fixture(params=["httpx", "httpx2"])
def lib(request: pytest.FixtureRequest) -> Any:
    return httpx if request.param == "httpx" else httpx2


def _http_client(lib: Any) -> Any:
    make = stallproof.http_client if lib is httpx else stallproof.http_client2
    return make(timeout=5, retry=None, limits=LIMITS)


@pytest.mark.parametrize("encoding", ["gzip", "br", "gzip, gzip"])
@pytest.mark.parametrize("status", [200, 500])
async def test_bombs_through_the_transports(
    encoding: str, status: int, lib: Any, raw_server: Any
) -> None:
    srv = raw_server(always(response(status, bomb(encoding), {"content-encoding": encoding})))
    async with _http_client(lib) as client:
        with Peak() as mem:
            if status == 200:
                with pytest.raises(stallproof.ResponseTooLarge) as e:
                    await client.post(srv.url + "/chat/completions", content=b"{}")
                assert isinstance(e.value, lib.RemoteProtocolError)
            else:
                r = await client.post(srv.url + "/chat/completions", content=b"{}")
                # The library gets the decoded, capped body and no Content-Encoding.
                assert r.status_code == 500 and "content-encoding" not in r.headers
                assert r.content == b"\0" * LIMITS.max_error_body_bytes
        assert mem.peak < 8 * CAP, mem.peak


async def test_a_stream_bomb_through_a_transport(lib: Any, raw_server: Any) -> None:
    headers = {"content-type": "text/event-stream", "content-encoding": "gzip"}
    srv = raw_server(always(response(200, _sse_bomb(), headers)))
    body = json.dumps({"model": "m", "stream": True, "messages": MSGS})
    async with _http_client(lib) as client:
        with Peak() as mem, pytest.raises(stallproof.ResponseTooLarge):
            async with client.stream("POST", srv.url + "/chat/completions", content=body) as r:
                assert "content-encoding" not in r.headers
                async for _ in r.aiter_raw():
                    pass
        assert mem.peak < 8 * CAP, mem.peak
        assert client._transport.inflight() == ()


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_an_encoded_body_is_decoded_once(
    encoding: str, lib: Any, raw_server: Any, make_client: MakeClient
) -> None:
    """A small encoded answer works through Client and the transports alike."""
    answer = {
        "id": "x",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
    }
    plain = json.dumps(answer).encode()
    encoded = {
        "gzip": lambda: _gzip(lambda: [plain]),
        "deflate": lambda: _gzip(lambda: [plain], wbits=15),
        "br": lambda: _brotli(lambda: [plain]),
        "zstd": lambda: _zstd(lambda: [plain]),
        "gzip, gzip": lambda: _gzip(lambda: [_gzip(lambda: [plain])]),
    }[encoding]()
    srv = raw_server(always(response(200, encoded, {"content-encoding": encoding})))
    client = make_client(srv.url, limits=LIMITS)
    resp = await client.chat.completions.create(model="m", messages=MSGS)
    assert resp.choices[0].message.content == "hi"
    async with _http_client(lib) as http:
        r = await http.post(srv.url + "/chat/completions", content=b"{}")
        assert r.json() == answer
        assert "content-encoding" not in r.headers
        assert int(r.headers["content-length"]) == len(plain)


@pytest.mark.parametrize(
    ("encoding", "body", "error"),
    [
        ("gzip", b"not gzip at all", stallproof.MalformedResponse),
        ("gzip", bomb("gzip")[:1000], stallproof.TruncatedResponse),
        ("compress", b"x", stallproof.MalformedResponse),
    ],
)
async def test_bad_encodings_are_typed(
    encoding: str, body: bytes, error: type[Exception], raw_server: Any, make_client: MakeClient
) -> None:
    srv = raw_server(always(response(200, body, {"content-encoding": encoding})))
    client = make_client(srv.url, limits=LIMITS)
    with pytest.raises(error) as e:
        await client.chat.completions.create(model="m", messages=MSGS)
    assert e.value.stallproof_request_id  # type: ignore[attr-defined]
    assert "decode" in str(e.value) or "compressed" in str(e.value)
    assert_pool_clean(client)


@pytest.mark.parametrize(
    ("encoding", "body"),
    [("gzip", b"not gzip at all"), ("gzip", bomb("gzip")[:1000]), ("compress", b"x")],
)
async def test_an_error_body_that_does_not_decode_keeps_its_status(
    encoding: str, body: bytes, raw_server: Any, make_client: MakeClient
) -> None:
    srv = raw_server(always(response(503, body, {"content-encoding": encoding})))
    client = make_client(srv.url, limits=LIMITS)
    with pytest.raises(stallproof.InternalServerError) as e:
        await client.chat.completions.create(model="m", messages=MSGS)
    assert e.value.status_code == 503 and e.value.stallproof_request_id
    assert_pool_clean(client)
