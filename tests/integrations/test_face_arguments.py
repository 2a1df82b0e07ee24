"""Bad constructor arguments through `Client` and every SDK face (openai and anthropic,
async and sync) are `InvalidRequestError`s that name the argument and show no secret, not
in the message, its ``repr``, nor anything its ``__cause__``/``__context__`` chain holds
(a suppressed context included); and nothing is sent (issue 21).

A ``base_url`` with credentials (``https://user:KEY@host``) or a query (``?api-key=KEY``)
is refused everywhere: the native client used to drop the credentials silently and the
SDKs' httpx to send them as Basic auth in place of the API key; a query never reached the
server as written (see `stallproof._base_url`).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import openai
import pytest

import stallproof
from stallproof.anthropic import Anthropic, AsyncAnthropic
from stallproof.openai import AsyncOpenAI, OpenAI

from ..support.clients import KEY, chain
from ..support.rawserver import always, response

OK_URL = "http://127.0.0.1:9/v1"
FACES: dict[str, Callable[..., Any]] = {
    "Client": stallproof.Client,
    "AsyncOpenAI": AsyncOpenAI,
    "OpenAI": OpenAI,
    "AsyncAnthropic": AsyncAnthropic,
    "Anthropic": Anthropic,
}
# What is bad, and a piece of the message that names it.
BAD: dict[str, tuple[dict[str, Any], str]] = {
    "userinfo": ({"base_url": f"http://user:{KEY}@127.0.0.1:9/v1"}, "credentials"),
    "key only userinfo": ({"base_url": f"https://{KEY}@api.example/v1"}, "credentials"),
    "key in query": ({"base_url": f"http://127.0.0.1:9/v1?api-key={KEY}"}, "query"),
    "key in fragment": ({"base_url": f"http://127.0.0.1:9/v1#{KEY}"}, "query or fragment"),
    "port 99999": ({"base_url": "http://127.0.0.1:99999/v1"}, "port 99999"),
    "port 65536": ({"base_url": "http://127.0.0.1:65536/v1"}, "port 65536"),
    "broken ipv6": ({"base_url": "http://[::1/v1"}, "not a valid URL"),
    "host with a space": ({"base_url": "http://bad host/v1"}, "not a host name"),
    "host with NUL": ({"base_url": "http://bad\x00host/v1"}, "not a valid URL"),
    "ftp": ({"base_url": "ftp://h/v1"}, "absolute http"),
    "relative": ({"base_url": "/v1"}, "absolute http"),
    "int": ({"base_url": 5}, "str or a URL, got int"),
    "bytes": ({"base_url": b"http://h/v1"}, "str or a URL, got bytes"),
    "huge": ({"base_url": "http://h/" + "a" * 10_000_000}, "characters long"),
    "key with CRLF": ({"api_key": f"{KEY}\r\n"}, "api_key"),
    "key with a space": ({"api_key": f" {KEY}"}, "api_key"),
    "key int": ({"api_key": 5}, "api_key must be a str"),
    "header CRLF": ({"default_headers": {"x-a": f"v\r\nx-b: {KEY}"}}, "'x-a'"),
    "header name": ({"default_headers": {"x a": "v"}}, "x a"),
    "header int": ({"default_headers": {"x-a": 5}}, "'x-a' must have a str value"),
    "headers list": ({"default_headers": [("a", "b")]}, "default_headers must be a mapping"),
    "query list": ({"default_query": [("a", "b")]}, "default_query must be a mapping"),
}
# Bad for the SDK faces, which send headers as ASCII (`Client` sends latin-1).
BAD_FOR_FACES: dict[str, tuple[dict[str, Any], str]] = {
    "key non-ASCII": ({"api_key": f"é{KEY}"}, "outside ASCII"),
    "header non-ASCII": ({"default_headers": {"x-a": f"é{KEY}"}}, "outside ASCII"),
    "anthropic auth_token": ({"auth_token": f"{KEY}\n"}, "auth_token"),
}


def cases() -> Iterator[Any]:
    for face in FACES:
        for name, (kwargs, match) in BAD.items():
            yield pytest.param(face, kwargs, match, id=f"{face}-{name}")
        if face == "Client":
            continue
        for name, (kwargs, match) in BAD_FOR_FACES.items():
            if "auth_token" in kwargs and "Anthropic" not in face:
                continue
            yield pytest.param(face, kwargs, match, id=f"{face}-{name}")


@pytest.mark.parametrize(("face", "kwargs", "match"), list(cases()))
def test_a_bad_constructor_argument_is_typed_and_shows_no_secret(
    face: str, kwargs: dict[str, Any], match: str
) -> None:
    arguments = {"base_url": OK_URL, "api_key": "k", **kwargs}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(stallproof.InvalidRequestError, match=match) as e:
            FACES[face](**arguments)
    assert len(str(e.value)) < 500
    assert_clean(e.value)


@pytest.mark.parametrize("face", ["AsyncOpenAI", "OpenAI", "AsyncAnthropic", "Anthropic"])
def test_a_bad_base_url_in_the_environment_is_named(
    face: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDKs read their base URL from the environment when none is given: checked too."""
    variable = "ANTHROPIC_BASE_URL" if "Anthropic" in face else "OPENAI_BASE_URL"
    monkeypatch.setenv(variable, f"https://user:{KEY}@api.example/v1")
    with pytest.raises(stallproof.InvalidRequestError, match=f"{variable} may not hold") as e:
        FACES[face](api_key="k")
    assert KEY not in str(e.value)


@pytest.mark.parametrize("face", list(FACES))
@pytest.mark.parametrize(
    "proxy", ["http://h:99999", "http://[::1", "socks9://h:1", "http://bad host:8"]
)
def test_a_bad_proxy_in_the_environment_is_named(
    face: str, proxy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every face reads the proxy variables (through its engine) as `Client` does: one that
    cannot be used is refused when the client is built, by the variable's name."""
    monkeypatch.setenv("HTTPS_PROXY", proxy.replace("://", f"://user:{KEY}@"))
    monkeypatch.setenv("NO_PROXY", "")
    with pytest.raises(stallproof.InvalidRequestError, match="HTTPS_PROXY from the env") as e:
        FACES[face](base_url=OK_URL, api_key="k")
    assert_clean(e.value)


@pytest.mark.parametrize("face", ["AsyncOpenAI", "OpenAI", "AsyncAnthropic", "Anthropic"])
def test_a_bad_key_in_the_environment_is_named(face: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key read from the environment with its trailing newline is refused by the variable's
    name, as `Client` refuses it."""
    variable = "ANTHROPIC_API_KEY" if "Anthropic" in face else "OPENAI_API_KEY"
    monkeypatch.setenv(variable, f"{KEY}\n")
    with pytest.raises(stallproof.InvalidRequestError, match=variable) as e:
        FACES[face](base_url=OK_URL)
    assert KEY not in str(e.value)


@pytest.mark.parametrize("face", list(FACES))
def test_a_good_client_shows_no_key(face: str) -> None:
    """The key is in no ``repr``/``str`` of a client, nor of its ``base_url``."""
    client = FACES[face](base_url="https://api.example/v1", api_key=KEY)
    try:
        for shown in (repr(client), str(client), str(client.base_url), repr(client.base_url)):
            assert KEY not in shown
    finally:
        if face in ("OpenAI", "Anthropic"):
            client.close()


@pytest.mark.parametrize("face", list(FACES))
def test_a_copy_with_a_bad_base_url_is_refused(face: str) -> None:
    """``with_options(base_url=...)`` (the SDKs' ``copy``) is checked as the constructor is."""
    client = FACES[face](base_url=OK_URL, api_key="k")
    try:
        with pytest.raises(stallproof.InvalidRequestError, match="credentials") as e:
            client.with_options(base_url=f"http://user:{KEY}@127.0.0.1:9/v1")
        assert KEY not in str(e.value)
    finally:
        if face in ("OpenAI", "Anthropic"):
            client.close()


CALL_BAD: dict[str, tuple[dict[str, Any], str]] = {
    "header CRLF": ({"extra_headers": {"x-a": f"v\r\nx-b: {KEY}"}}, "extra_headers: header 'x-a'"),
    "header non-ASCII": ({"extra_headers": {"x-a": f"é{KEY}"}}, "outside ASCII"),
    "header int": ({"extra_headers": {"x-a": 5}}, "'x-a' must have a str value"),
    "header name": ({"extra_headers": {"x a": "v"}}, "x a"),
    "header name non-ASCII": ({"extra_headers": {"x-é": "v"}}, "non-empty ASCII"),
    "query too long": ({"extra_query": {"q": "a" * 100_000}}, "InvalidURL"),
}


def create(client: Any, **kwargs: Any) -> Any:
    """One call as a caller makes it (a coroutine on an async face)."""
    if not hasattr(client, "chat"):  # anthropic's
        return client.messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}], **kwargs
        )
    return client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], **kwargs
    )


@pytest.mark.anyio
@pytest.mark.parametrize("face", ["AsyncOpenAI", "AsyncAnthropic"])
@pytest.mark.parametrize(("kwargs", "match"), list(CALL_BAD.values()), ids=list(CALL_BAD))
async def test_a_bad_argument_of_one_call_is_typed_and_nothing_is_sent(
    face: str, kwargs: dict[str, Any], match: str, raw_server: Any
) -> None:
    """Per call, ``extra_headers`` and ``extra_query`` the SDK cannot send are an
    `InvalidRequestError` naming them (not the SDK's APIConnectionError over ours, nor a
    raw TypeError or InvalidURL from inside it), before anything is sent."""
    srv = raw_server(always(response(500, b"")))
    client = FACES[face](base_url=srv.url, api_key=KEY, max_retries=0)
    try:
        with pytest.raises(stallproof.InvalidRequestError, match=match) as e:
            await create(client, **kwargs)
    finally:
        await client.close()
    assert_clean(e.value)
    assert srv.requests == []


@pytest.mark.parametrize("face", ["OpenAI", "Anthropic"])
@pytest.mark.parametrize(("kwargs", "match"), list(CALL_BAD.values()), ids=list(CALL_BAD))
def test_a_bad_argument_of_one_sync_call_is_typed_and_nothing_is_sent(
    face: str, kwargs: dict[str, Any], match: str, raw_server: Any
) -> None:
    srv = raw_server(always(response(500, b"")))
    client = FACES[face](base_url=srv.url, api_key=KEY, max_retries=0)
    try:
        with pytest.raises(stallproof.InvalidRequestError, match=match) as e:
            create(client, **kwargs)
    finally:
        client.close()
    assert_clean(e.value)
    assert srv.requests == []


def assert_clean(error: BaseException) -> None:
    """Ours all the way down its chain, and no key anywhere in it."""
    for e in chain(error):
        assert isinstance(e, stallproof.InvalidRequestError), type(e)
        assert KEY not in str(e) and KEY not in repr(e.args)


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_why_plain_sdks_mangle_credentials_and_a_query_in_base_url(
    sdk: str, raw_server: Any
) -> None:
    """What the faces refuse, the plain SDKs send wrong: credentials in ``base_url`` become
    ``Authorization: Basic`` in place of the API key, and the request path is glued after
    a query (openai: ``/v1/?api-key=Kchat/completions``): the reason for the rule
    (docs/errors.md)."""

    srv = raw_server(always(response(200, b"{}")))
    origin = srv.url.removesuffix("/v1")
    targets = []
    for base in (origin.replace("://", "://user:pw@") + "/v1", f"{origin}/v1?api-key=K"):
        if sdk == "openai":
            client: Any = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0)
        else:
            client = anthropic.Anthropic(base_url=base, api_key=KEY, max_retries=0)
        with contextlib.suppress(Exception), client:
            create(client)
        targets.append(srv.requests[-1])
    assert targets[0].headers["authorization"].startswith("Basic ")
    assert KEY not in targets[0].raw.decode("latin-1")  # the API key was not sent
    # The path after the query: the server sees no such path, and a query ending in it.
    path, _, query = targets[1].target.partition("?")
    assert path.rstrip("/") == "/v1" and query.startswith("api-key=K") and query != "api-key=K"
