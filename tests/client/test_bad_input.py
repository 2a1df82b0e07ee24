"""Bad input gets a typed error that names what is wrong, with a request_id once a call
has started: never a raw h11/httpx/ExceptionGroup error, never ImportError."""

from __future__ import annotations

import json
import warnings
from typing import Any

import httpx
import httpx2
import pytest
from openai.types.chat import ChatCompletionMessageParam

import stallproof

from ..support.clients import MakeClient
from ..support.rawserver import RawRequest, always, response

pytestmark = pytest.mark.anyio

MSGS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]


@pytest.mark.parametrize(
    "name", ["Content-Length", "content-length", "Host", "Transfer-Encoding", "Connection"]
)
async def test_extra_headers_may_not_frame_the_request(
    name: str, raw_server: Any, make_client: MakeClient
) -> None:
    srv = raw_server(always(response(200, b"{}")))
    client = make_client(srv.url)
    with pytest.raises(stallproof.InvalidRequestError, match=f"extra_headers.*{name}"):
        await client.chat.completions.create(model="m", messages=MSGS, extra_headers={name: "5"})
    with pytest.raises(stallproof.InvalidRequestError, match=f"default_headers.*{name}"):
        stallproof.Client(base_url=srv.url, default_headers={name: "5"})
    assert srv.requests == []


@pytest.mark.parametrize("port", [65536, 99999])
def test_a_base_url_port_out_of_range_is_refused(port: int) -> None:
    with pytest.raises(stallproof.InvalidRequestError, match=f"port {port}"):
        stallproof.Client(base_url=f"http://127.0.0.1:{port}/v1")


@pytest.mark.parametrize("lib", [httpx, httpx2])
async def test_a_port_out_of_range_through_a_transport_is_typed(lib: Any) -> None:
    make = stallproof.http_client if lib is httpx else stallproof.http_client2
    async with make(timeout=5, retry=None) as client:
        with pytest.raises(stallproof.InvalidRequestError, match="port 99999") as e:
            await client.post("http://127.0.0.1:99999/v1/chat/completions", content=b"{}")
    assert e.value.stallproof_request_id
    assert isinstance(e.value, lib.LocalProtocolError)


@pytest.mark.parametrize("max_redirects", [0, 3])
async def test_a_redirect_loop_through_a_user_client_that_follows_redirects_is_typed(
    max_redirects: int, raw_server: Any, make_client: Any
) -> None:
    """The engine follows redirects itself, up to ``max_redirects`` (0: none), and the
    user's client (``follow_redirects=True``) never sees one: a loop ends in a typed
    `TooManyRedirects`, not httpx.TooManyRedirects, after max_redirects + 1 requests."""

    def loop(request: RawRequest) -> bytes:
        return response(302, b"", {"location": request.target})

    srv = raw_server(loop)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the once-per-process pool warning
        client = make_client(
            srv.url,
            http_client=httpx.AsyncClient(follow_redirects=True),
            limits=stallproof.Limits(max_redirects=max_redirects),
        )
    with pytest.raises(stallproof.TooManyRedirects) as e:
        await client.chat.completions.create(model="m", messages=MSGS)
    assert e.value.limit == max_redirects and e.value.stallproof_request_id
    assert len(srv.requests) == max_redirects + 1


@pytest.mark.parametrize("variable", ["ALL_PROXY", "all_proxy", "HTTPS_PROXY"])
async def test_a_socks_proxy_in_the_environment_does_not_break_construction(
    variable: str, monkeypatch: pytest.MonkeyPatch, raw_server: Any
) -> None:
    monkeypatch.setenv(variable, "socks5://127.0.0.1:1")
    monkeypatch.setenv("NO_PROXY", "")
    # Building a client never fails; a call it routes through the proxy (nothing listens
    # on port 1) is a typed ConnectError. NO_PROXY sends the rest of this test direct.
    async with stallproof.Client(base_url="https://127.0.0.1:9/v1", retry=None) as client:
        with pytest.raises(stallproof.ConnectError):
            await client.chat.completions.create(model="m", messages=MSGS)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    answer = {
        "id": "x",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
    }
    srv = raw_server(always(response(200, json.dumps(answer).encode())))
    async with stallproof.Client(base_url=srv.url, retry=None) as client:
        resp = await client.chat.completions.create(model="m", messages=MSGS)
        assert resp.choices[0].message.content == "hi"
    async with stallproof.http_client(retry=None) as c1, stallproof.http_client2(retry=None) as c2:
        for c in (c1, c2):
            r = await c.post(srv.url + "/chat/completions", content=b"{}")
            assert r.json() == answer  # sent through the engine, not around it
