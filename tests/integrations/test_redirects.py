"""Redirects, through every face: inside the one deadline, a hop limit, no credential
sent to another origin, and httpx's method rules.

The engine follows redirects itself; the faces' HTTP clients (the SDKs' httpx2 client,
a caller's ``httpx.AsyncClient(follow_redirects=True)``) never see one to follow, so no
hop starts a fresh deadline. Every server here is a real loopback socket (RawServer); a
second server on another port is "another origin".
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest

import stallproof
import stallproof.anthropic
import stallproof.openai

from ..support.clients import KEY
from ..support.rawserver import RawRequest, RawServer, response
from ..support.timing import MARGIN, SentClock

pytestmark = pytest.mark.anyio

FACES = ["client", "openai", "anthropic", "httpx", "httpx2"]
CHAT = json.dumps(
    {
        "id": "c1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        ],
    }
).encode()
MESSAGE = json.dumps(
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [{"type": "text", "text": "hi"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }
).encode()
# Credentials of every kind the faces can send; none may reach another origin.
SECRET_HEADERS = {
    "api-key": "azure-SECRET-1",
    "x-goog-api-key": "goog-SECRET-2",
    "cookie": "session=cookie-SECRET-3",
    "x-portkey-api-key": "portkey-SECRET-4",
    "x-custom-token": "token-SECRET-5",
}
SECRETS = [KEY, *SECRET_HEADERS.values()]
JSON = {"content-type": "application/json"}

Call = Callable[[], Awaitable[Any]]
# What each face raises (checked per face below).
TIMEOUTS = (
    stallproof.TimeoutException,
    openai.APITimeoutError,
    anthropic.APITimeoutError,
    httpx.TimeoutException,
    httpx2.TimeoutException,
)
HOP_LIMIT = (
    stallproof.TooManyRedirects,
    openai.APIConnectionError,
    anthropic.APIConnectionError,
    httpx.TooManyRedirects,
    httpx2.TooManyRedirects,
)


def path_of(face: str) -> str:
    return "/v1/messages" if face == "anthropic" else "/v1/chat/completions"


def answer_of(face: str) -> bytes:
    return response(200, MESSAGE if face == "anthropic" else CHAT, JSON)


async def _through(
    face: str,
    base: str,
    closers: list[Any],
    *,
    total: float = 5.0,
    max_redirects: int = 10,
    clocks: list[SentClock] | None = None,
) -> Call:
    """One call through ``face`` to ``base`` (scheme://host:port), every secret header set;
    the `SentClock` of its client appended to ``clocks`` if given."""
    limits = stallproof.Limits(max_redirects=max_redirects)
    timeout = stallproof.Timeouts(total=total)
    msgs: Any = [{"role": "user", "content": "hi"}]
    if face == "client":
        client = stallproof.Client(
            base_url=f"{base}/v1",
            api_key=KEY,
            retry=None,
            timeout=timeout,
            limits=limits,
            default_headers=SECRET_HEADERS,
        )
        closers.append(client.aclose)
        _clock(client, clocks)
        return lambda: client.chat.completions.create(model="m", messages=msgs)
    if face == "openai":
        oa = stallproof.openai.AsyncOpenAI(
            api_key=KEY,
            base_url=f"{base}/v1",
            timeout=timeout,
            retry=None,
            limits=limits,
            default_headers=SECRET_HEADERS,
        )
        closers.append(oa.close)
        _clock(oa, clocks)
        return lambda: oa.chat.completions.create(model="m", messages=msgs)
    if face == "anthropic":
        an = stallproof.anthropic.AsyncAnthropic(
            api_key=KEY,
            base_url=base,
            timeout=timeout,
            retry=None,
            limits=limits,
            default_headers=SECRET_HEADERS,
        )
        closers.append(an.close)
        _clock(an, clocks)
        return lambda: an.messages.create(model="m", max_tokens=5, messages=msgs)
    lib: Any = httpx if face == "httpx" else httpx2
    transport_class: Any = (
        stallproof.AsyncTransport if face == "httpx" else stallproof.AsyncTransport2
    )
    raw = lib.AsyncClient(
        transport=transport_class(timeout=timeout, limits=limits, retry=None),
        follow_redirects=True,  # the caller's own setting: the engine never hands it one
        headers={"authorization": f"Bearer {KEY}", **SECRET_HEADERS},
    )
    closers.append(raw.aclose)
    _clock(raw, clocks)

    async def post() -> Any:
        r = await raw.post(f"{base}/v1/chat/completions", json={"model": "m", "messages": msgs})
        r.raise_for_status()
        return r

    return post


def _clock(client: Any, clocks: list[SentClock] | None) -> None:
    if clocks is not None:
        clocks.append(SentClock(client))


@pytest.fixture
async def closers() -> Any:
    done: list[Any] = []
    yield done
    for close in done:
        await close()


def _origin(server: RawServer) -> str:
    return f"http://127.0.0.1:{server.port}"


def _cause_chain(error: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    e: BaseException | None = error
    while e is not None and len(chain) < 10:
        chain.append(e)
        e = e.__cause__
    return chain


def _stallproof_error(error: BaseException, cls: type[Exception]) -> Any:
    """The stallproof error of ``cls`` in ``error``'s cause chain (the SDKs wrap ours)."""
    found = [e for e in _cause_chain(error) if isinstance(e, cls)]
    assert found, f"no {cls.__name__} in the chain of {error!r}"
    return found[0]


@pytest.mark.parametrize("face", FACES)
async def test_a_redirect_loop_ends_at_total(face: str, closers: Any) -> None:
    """Each hop answers after 50 ms: a fresh deadline per hop would never end; the one
    deadline ends the call at total (hop limit set high, so total is what fires)."""

    def loop(request: RawRequest) -> Any:
        return [0.05, response(302, b"", {"location": request.target})]

    with RawServer(loop) as srv:
        clocks: list[SentClock] = []
        call = await _through(
            face, _origin(srv), closers, total=1.0, max_redirects=10_000, clocks=clocks
        )
        with pytest.raises(TIMEOUTS) as e:
            await call()
        elapsed = clocks[0].elapsed()
    assert _stallproof_error(e.value, stallproof.TotalTimeout).limit == 1.0
    if face == "openai":
        assert isinstance(e.value, openai.APITimeoutError)
    if face == "anthropic":
        assert isinstance(e.value, anthropic.APITimeoutError)
    if face in ("httpx", "httpx2"):
        assert isinstance(e.value, (httpx.TimeoutException, httpx2.TimeoutException))
    assert 1.0 - 0.05 <= elapsed < 1.0 + MARGIN
    assert len(srv.requests) >= 5  # it did follow


@pytest.mark.parametrize("face", FACES)
async def test_the_hop_limit_is_a_typed_error(face: str, closers: Any) -> None:
    def loop(request: RawRequest) -> bytes:
        return response(307, b"", {"location": request.target})

    with RawServer(loop) as srv:
        call = await _through(face, _origin(srv), closers, max_redirects=3)
        with pytest.raises(HOP_LIMIT) as e:
            await call()
    error = _stallproof_error(e.value, stallproof.TooManyRedirects)
    assert error.limit == 3 and "max_redirects=3" in str(error)
    if face == "openai":
        assert isinstance(e.value, openai.APIConnectionError)
    if face == "anthropic":
        assert isinstance(e.value, anthropic.APIConnectionError)
    if face in ("httpx", "httpx2"):
        assert isinstance(e.value, (httpx.TooManyRedirects, httpx2.TooManyRedirects))
    assert len(srv.requests) == 4


@pytest.mark.parametrize("face", FACES)
async def test_a_redirect_to_another_origin_carries_no_credential(face: str, closers: Any) -> None:
    with RawServer(lambda request: answer_of(face)) as other:
        target = f"{_origin(other)}{path_of(face)}"
        with RawServer(lambda request: response(307, b"", {"location": target})) as first:
            call = await _through(face, _origin(first), closers)
            await call()
    sent = first.requests[0]
    assert any(s.encode() in sent.raw for s in SECRETS)  # they were set
    assert len(other.requests) == 1
    hop = other.requests[0]
    for secret in SECRETS:
        assert secret.encode() not in hop.raw, (secret, hop.headers)
    for name in ("authorization", "x-api-key", *SECRET_HEADERS):
        assert name not in hop.headers
    assert hop.method == "POST" and hop.body == sent.body  # 307 keeps both
    assert hop.headers["host"] == f"127.0.0.1:{other.port}"


@pytest.mark.parametrize("face", ["client", "openai", "anthropic"])
async def test_a_redirect_within_the_origin_keeps_the_credentials(face: str, closers: Any) -> None:
    def answer(request: RawRequest) -> bytes:
        if request.target.startswith("/moved"):
            return answer_of(face)
        return response(308, b"", {"location": f"/moved{request.target}"})

    with RawServer(answer) as srv:
        call = await _through(face, _origin(srv), closers)
        await call()
    first, hop = srv.requests
    assert hop.target == f"/moved{first.target}"
    for name in ("api-key", "x-goog-api-key", "cookie", "authorization", "x-api-key"):
        assert hop.headers.get(name) == first.headers.get(name)
    assert KEY in first.headers.get("authorization", first.headers.get("x-api-key", ""))


@pytest.mark.parametrize(
    ("status", "method"), [(301, "GET"), (302, "GET"), (303, "GET"), (307, "POST"), (308, "POST")]
)
async def test_the_method_after_a_redirect_is_httpxs(
    status: int, method: str, closers: Any
) -> None:
    def answer(request: RawRequest) -> bytes:
        if request.target == "/next":
            return answer_of("client")
        return response(status, b"", {"location": "/next"})

    with RawServer(answer) as srv:
        call = await _through("client", _origin(srv), closers)
        await call()
    hop = srv.requests[1]
    assert hop.method == method
    if method == "GET":
        assert hop.body == b"" and "content-length" not in hop.headers
    else:
        assert hop.body == srv.requests[0].body


@pytest.mark.parametrize(
    "location",
    ["http://127.0.0.1:99999/v1", "ftp://127.0.0.1/x", "http://[::1/x", "https://"],
)
async def test_an_unusable_location_is_a_typed_error(location: str, closers: Any) -> None:
    with RawServer(lambda request: response(302, b"", {"location": location})) as srv:
        call = await _through("client", _origin(srv), closers)
        with pytest.raises(stallproof.MalformedResponse, match="HTTP 302: the redirect"):
            await call()
    assert len(srv.requests) == 1
