"""An API key never leaves the request: not in a message, repr, args, log line, span, dump,
or anything an error's ``__cause__``/``__context__`` chain holds on to.

Real sockets throughout (tests/support/rawserver.py); the key is `KEY` from support/clients.
"""

from __future__ import annotations

import io
import logging
import warnings
from typing import Any

import httpx
import httpx2
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import stallproof

from ..support.clients import KEY, MakeClient, chain
from ..support.rawserver import always, response

pytestmark = pytest.mark.anyio

MSGS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'


def assert_no_key(error: BaseException) -> None:
    """Nothing an error chain shows or holds (messages, args, requests) has the key."""
    for e in chain(error):
        assert KEY not in str(e) and KEY not in repr(e) and KEY not in repr(e.args), type(e)
        request = e.__dict__.get("_request") or e.__dict__.get("request")
        if request is not None:
            held = str(request.url) + repr(list(request.headers.multi_items()))
            assert KEY not in held, (type(e), held)


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Every log record at DEBUG, ours and the HTTP libraries' alike."""
    caplog.set_level(logging.DEBUG)
    return caplog


@pytest.mark.parametrize("bad", [f"{KEY}\n", f" {KEY}", f"{KEY}\t", f"{KEY}\r\n"])
def test_an_api_key_with_whitespace_is_refused_without_echo(bad: str) -> None:
    with pytest.raises(stallproof.InvalidRequestError, match="api_key") as e:
        stallproof.Client(base_url="http://127.0.0.1:1/v1", api_key=bad)
    assert_no_key(e.value)


@pytest.fixture(params=["httpx", "httpx2"])
def lib(request: pytest.FixtureRequest) -> Any:
    return httpx if request.param == "httpx" else httpx2


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("authorization", f"Bearer {KEY}\n"),
        ("authorization", f"Bearer {KEY} "),
        ("api-key", f"{KEY}\r"),
        ("x-api-key", f"{KEY}\x00"),
    ],
)
async def test_a_bad_secret_header_through_a_transport_is_refused_by_name(
    name: str, value: str, lib: Any, raw_server: Any, logs: pytest.LogCaptureFixture
) -> None:
    srv = raw_server(always(response(200, b"{}")))
    make = stallproof.http_client if lib is httpx else stallproof.http_client2
    async with make(timeout=5, retry=None) as client:
        with pytest.raises(stallproof.InvalidRequestError) as e:
            await client.post(srv.url + "/chat/completions", headers={name: value}, content=BODY)
    assert isinstance(e.value, lib.LocalProtocolError)
    assert name in str(e.value) and e.value.stallproof_request_id
    assert_no_key(e.value)
    assert KEY not in logs.text
    assert srv.requests == []  # refused before anything was sent


@pytest.mark.parametrize("length", ["1", "500"])
async def test_a_body_that_breaks_its_own_content_length_is_refused_with_a_clean_chain(
    length: str, lib: Any, raw_server: Any, logs: pytest.LogCaptureFixture
) -> None:
    """h11 refuses it while the body is sent, with an error the pool does not map: ours,
    and the pool's error under it keeps no text (it is our refusal's __context__)."""
    srv = raw_server(always(response(200, b"{}")))
    make = stallproof.http_client if lib is httpx else stallproof.http_client2
    headers = {"authorization": f"Bearer {KEY}", "content-length": length}
    async with make(timeout=5, retry=None) as client:
        with pytest.raises(stallproof.InvalidRequestError, match="Content-Length") as e:
            await client.post(srv.url + "/chat/completions", headers=headers, content=BODY)
    assert isinstance(e.value, lib.LocalProtocolError)
    assert_no_key(e.value)
    assert all(
        c.args == () for c in chain(e.value) if not isinstance(c, stallproof.StallproofError)
    )
    assert KEY not in logs.text


async def test_a_bad_extra_header_on_client_is_refused_by_name(
    raw_server: Any, make_client: MakeClient, logs: pytest.LogCaptureFixture
) -> None:
    srv = raw_server(always(response(200, b"{}")))
    client = make_client(srv.url)
    with pytest.raises(stallproof.InvalidRequestError, match="x-api-key") as e:
        await client.chat.completions.create(
            model="m", messages=MSGS, extra_headers={"x-api-key": f"{KEY}\n"}
        )
    assert_no_key(e.value)
    assert KEY not in logs.text


def test_userinfo_in_base_url_is_refused_and_shows_nowhere(logs: pytest.LogCaptureFixture) -> None:
    """Credentials in a base_url were dropped silently (never sent): now refused, by name,
    with the URL shown without them (every face: tests/integrations/test_face_arguments.py).
    """
    with pytest.raises(stallproof.InvalidRequestError, match="credentials") as e:
        stallproof.Client(base_url=f"http://user:{KEY}@127.0.0.1:9/v1")
    assert "http://127.0.0.1:9/v1" in str(e.value)
    assert_no_key(e.value)
    assert KEY not in logs.text


async def test_nothing_a_call_shows_holds_the_key(
    raw_server: Any, make_client: MakeClient, logs: pytest.LogCaptureFixture
) -> None:
    srv = raw_server(always(response(503, b'{"error": {"message": "down"}}')))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    client = make_client(
        srv.url, api_key=KEY, tracer_provider=provider, breaker=stallproof.Breaker()
    )
    assert KEY not in repr(client) and KEY not in str(client.base_url)
    with pytest.raises(stallproof.InternalServerError) as e:
        await client.chat.completions.create(model="m", messages=MSGS)
    assert_no_key(e.value)
    assert all(KEY not in upstream for upstream in client.circuits())
    dump = io.StringIO()
    dump.write(stallproof.format_inflight(client.inflight(), now_label=repr(client)))
    assert KEY not in dump.getvalue()
    attributes = [str(dict(s.attributes or {})) for s in exporter.get_finished_spans()]
    assert attributes and all(KEY not in a for a in attributes)
    assert any("url.full" in a for a in attributes)
    assert KEY not in logs.text


async def test_the_sdk_error_chain_holds_no_authorization_header(raw_server: Any) -> None:
    """openai keeps our error as __cause__ of its APIConnectionError; what it holds of the
    request has the key replaced."""
    srv = raw_server(always([response(200, b"", {"content-length": "100"}), b"{", 10.0]))
    http = stallproof.http_client2(timeout=stallproof.Timeouts(total=0.5), retry=None)
    sdk = openai.AsyncOpenAI(api_key=KEY, base_url=srv.url, http_client=http, max_retries=0)
    async with http:
        with pytest.raises(openai.APIConnectionError) as e:
            await sdk.chat.completions.create(model="m", messages=MSGS)
    cause = e.value.__cause__
    assert isinstance(cause, stallproof.TotalTimeout)
    assert cause.request.headers["authorization"] == "[redacted]"
    assert_no_key(cause)


async def test_a_user_http_client_error_chain_holds_no_request(
    raw_server: Any, make_client: MakeClient
) -> None:
    """Errors from a caller's httpx client are translated without keeping httpx's error
    (whose .request has the Authorization header) as __context__."""
    srv = raw_server(always([response(200, b"", {"content-length": "100"}), b"{"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the once-per-process pool warning
        client = make_client(srv.url, http_client=httpx.AsyncClient())
    with pytest.raises(stallproof.TruncatedResponse) as e:
        await client.chat.completions.create(model="m", messages=MSGS)
    assert_no_key(e.value)
    assert not any(isinstance(x, httpx.HTTPError) for x in chain(e.value))


def test_check_headers_remembers_only_fine_headers() -> None:
    """With a ``known`` set, `check_headers` skips headers it found fine before and still
    refuses exactly what `header_problem` refuses, header by header, every time."""
    from stallproof._redact import KNOWN_HEADERS, check_headers, header_problem

    def one_by_one(headers: list[tuple[bytes, bytes]]) -> str | None:
        return next((p for n, v in headers if (p := header_problem(n, v)) is not None), None)

    good = [(b"user-agent", b"stallproof/1"), (b"authorization", b"Bearer k"), (b"x-a", b"")]
    cases: list[list[tuple[bytes, bytes]]] = [[], good]
    for byte in range(256):
        c = bytes([byte])
        cases.append([*good, (b"x-test", b"a" + c + b"a")])
        cases.append([(b"x-test", c + b"a"), *good])
        cases.append([*good, (b"x" + c + b"y", b"v")])
    known: set[tuple[bytes, bytes]] = set()
    for _ in range(2):
        for headers in cases:
            assert check_headers(headers, known) == one_by_one(headers), headers
            assert len(known) <= KNOWN_HEADERS
            assert all(header_problem(n, v) is None for n, v in known)
    assert (b"authorization", b"Bearer k") in known
