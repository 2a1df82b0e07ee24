"""Proxies on stallproof's own pool (`Pool`): from the environment as httpx reads it, or
an explicit ``proxy=``; forward (http://), CONNECT (https://) and SOCKS5, with credentials
that show nowhere; and every bound holding through a proxy that stalls, stays silent or
refuses, with nothing held afterwards. Over a real proxy on loopback
(tests/support/proxyserver.py), asyncio and trio."""

from __future__ import annotations

import logging
import ssl
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpcore2
import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import fault_server
import stallproof
import stallproof.openai
from fault_server._wire_tls import TLS_SUPPORTED, self_signed
from stallproof._wire._pool import Pool
from stallproof._wire._proxy import proxy_routes

from ..support.clients import KEY, MakeClient, assert_pool_clean, pool_state
from ..support.proxyserver import ProxyServer
from ..support.timing import MARGIN, stopwatch

pytestmark = pytest.mark.anyio

MSGS: Any = [{"role": "user", "content": "hi"}]
SECRET = "proxy-SECRET-pw-5551"
_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")
# Nothing listens on port 9 of loopback: a call that reached it directly would be refused
# at once, so a test that times out there proves the proxy was used.
NOWHERE = "https://127.0.0.1:9/v1"


@pytest.fixture(autouse=True)
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no proxy variable, in either case (urllib reads both)."""
    for name in _VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture
def proxy_server() -> Iterator[Any]:
    """Factory of `ProxyServer`s, stopped at the end of the test."""
    servers: list[ProxyServer] = []

    def factory(**kwargs: Any) -> ProxyServer:
        server = ProxyServer(**kwargs)
        servers.append(server)
        return server

    yield factory
    for server in servers:
        server.close()


@pytest.fixture(scope="module")
def tls_server() -> Iterator[Any]:
    if not TLS_SUPPORTED:
        pytest.skip("the TLS listener needs Python 3.11+")
    with fault_server.running(port=0, max_hold=5.0, tls=True) as server:
        yield server


async def ask(client: Any, **kwargs: Any) -> Any:
    return await client.chat.completions.create(model="m", messages=MSGS, **kwargs)


def assert_let_go(client: stallproof.Client, proxy: ProxyServer) -> None:
    """The pool holds nothing, and the client closed its connection to the proxy."""
    assert_pool_clean(client)
    assert proxy.wait_idle() == 0, "a connection to the proxy was left open"


# -- routing ------------------------------------------------------------------------------


async def test_http_proxy_from_the_environment_forwards(
    fault_server: Any, make_client: MakeClient, proxy_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = proxy_server()
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    client = make_client(fault_server.url())
    assert (await ask(client)).choices
    stream = await ask(client, stream=True)
    assert [chunk async for chunk in stream]
    # Forward proxying: the absolute URL goes to the proxy; the second call reuses the
    # same connection (keyed by origin and proxy).
    assert proxy.seen[0].method == "POST"
    assert proxy.seen[0].target == fault_server.url() + "/chat/completions"
    assert pool_state(client).connections == 1


async def test_lower_case_variables_and_all_proxy_count_too(
    fault_server: Any, make_client: MakeClient, proxy_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = proxy_server()
    monkeypatch.setenv("all_proxy", proxy.url)
    client = make_client(fault_server.url())
    assert (await ask(client)).choices
    assert [s.method for s in proxy.seen] == ["POST"]


@pytest.mark.parametrize("no_proxy", ["127.0.0.1", "*", "localhost,127.0.0.1"])
async def test_no_proxy_bypasses_the_proxy(
    fault_server: Any,
    make_client: MakeClient,
    proxy_server: Any,
    monkeypatch: pytest.MonkeyPatch,
    no_proxy: str,
) -> None:
    proxy = proxy_server(fault="silent")  # a call sent to it would never be answered
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.setenv("NO_PROXY", no_proxy)
    client = make_client(fault_server.url(), timeout=5)
    assert (await ask(client)).choices
    assert proxy.seen == []


async def test_trust_env_false_ignores_the_environment(
    fault_server: Any, make_client: MakeClient, proxy_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = proxy_server(fault="silent")
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    client = make_client(fault_server.url(), timeout=5, trust_env=False)
    assert (await ask(client)).choices
    assert proxy.seen == []


async def test_an_explicit_proxy_wins_over_the_environment(
    fault_server: Any, make_client: MakeClient, proxy_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ignored = proxy_server(fault="silent")
    proxy = proxy_server()
    monkeypatch.setenv("HTTP_PROXY", ignored.url)
    monkeypatch.setenv("NO_PROXY", "*")  # httpx ignores NO_PROXY for an explicit proxy too
    client = make_client(fault_server.url(), proxy=proxy.url)
    assert (await ask(client)).choices
    assert ignored.seen == [] and [s.method for s in proxy.seen] == ["POST"]


ENVIRONMENTS: list[dict[str, str]] = [
    {"HTTP_PROXY": "http://p1:3128"},
    {"HTTPS_PROXY": "http://p2:3128", "NO_PROXY": ".corp.example"},
    {"ALL_PROXY": "http://p3:3128", "NO_PROXY": "corp.example, 10.0.0.1,::1,localhost"},
    {"HTTP_PROXY": "p4:8080", "HTTPS_PROXY": "socks5://p5:1080", "NO_PROXY": "x.example:8443"},
    {"ALL_PROXY": "http://p3:3128", "HTTPS_PROXY": "http://p2:3128", "NO_PROXY": "*"},
    {"ALL_PROXY": "http://p3:3128", "NO_PROXY": "http://plain.example"},
]
URLS = [
    "http://api.example/v1",
    "https://api.example/v1",
    "https://corp.example/v1",
    "https://a.corp.example/v1",
    "http://10.0.0.1:8000/v1",
    "http://[::1]:8000/v1",
    "http://localhost:8000/v1",
    "https://x.example:8443/v1",
    "https://x.example/v1",
    "http://plain.example/v1",
    "https://plain.example/v1",
]


@pytest.mark.parametrize("env", ENVIRONMENTS, ids=lambda e: ",".join(sorted(e)))
def test_routing_is_httpxs(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    routes = proxy_routes(None, trust_env=True)  # None: every origin direct
    with httpx.Client(trust_env=True) as reference:
        for url in URLS:
            parsed = httpx.URL(url)
            origin = httpcore2.Origin(parsed.raw_scheme, parsed.raw_host, parsed.port or 0)
            if parsed.port is None:
                origin = httpcore2.Origin(
                    parsed.raw_scheme, parsed.raw_host, 443 if parsed.scheme == "https" else 80
                )
            ours = routes.route(origin) if routes is not None else None
            theirs = reference._transport_for_url(parsed)
            if theirs is reference._transport:
                assert ours is None, (url, env)
            else:
                proxy_url = theirs._pool._proxy_url  # type: ignore[attr-defined]
                assert ours is not None, (url, env)
                assert ours.origin.host == proxy_url.host, (url, env)
                assert ours.origin.port == proxy_url.port, (url, env)


def test_no_variables_means_the_direct_fast_path() -> None:
    assert proxy_routes(None, trust_env=True) is None
    pool = stallproof.Client(base_url=NOWHERE, api_key=KEY)._engine.pool
    assert isinstance(pool, Pool) and pool.proxies is None


# -- bad settings -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad", [f"ftp://u:{SECRET}@proxy:21", f"http://u:{SECRET}@", f"u:{SECRET}@proxy:3128"]
)
def test_a_bad_proxy_is_refused_at_construction_without_its_password(bad: str) -> None:
    with pytest.raises(stallproof.InvalidRequestError) as e:
        stallproof.Client(base_url=NOWHERE, api_key=KEY, proxy=bad)
    assert SECRET not in str(e.value) and "proxy" in str(e.value)
    assert e.value.__cause__ is None and e.value.__context__ is None


def test_a_bad_proxy_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", f"ftp://u:{SECRET}@proxy:21")
    with pytest.raises(stallproof.InvalidRequestError, match="HTTPS_PROXY") as e:
        stallproof.Client(base_url=NOWHERE, api_key=KEY)
    assert SECRET not in str(e.value)


def test_proxy_and_http_client_together_are_refused() -> None:
    with pytest.raises(stallproof.InvalidRequestError, match="http_client"):
        stallproof.Client(
            base_url=NOWHERE,
            api_key=KEY,
            proxy="http://127.0.0.1:3128",
            http_client=httpx.AsyncClient(),
        )


# -- credentials --------------------------------------------------------------------------


async def test_credentials_authorise_and_show_nowhere(
    fault_server: Any,
    make_client: MakeClient,
    proxy_server: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    proxy = proxy_server(auth=("agent", SECRET))
    client = make_client(
        fault_server.url(), proxy=proxy.url_with("agent", SECRET), tracer_provider=provider
    )
    assert (await ask(client)).choices
    assert proxy.seen[0].proxy_authorization is not None
    refused = make_client(
        fault_server.url(), proxy=proxy.url_with("agent", "not-" + SECRET), tracer_provider=provider
    )
    with pytest.raises(stallproof.APIStatusError) as e:
        await ask(refused)
    assert e.value.status_code == 407
    assert isinstance(client._engine.pool, Pool)
    shown = [repr(client), repr(client._engine.pool), repr(client._engine.pool.proxies)]
    shown += [str(e.value), repr(e.value), caplog.text]
    for span in exporter.get_finished_spans():
        shown += [repr(dict(span.attributes or {})), repr([ev.attributes for ev in span.events])]
    for text in shown:
        assert SECRET not in text


# -- CONNECT, the transports and the SDK face ----------------------------------------------


async def test_connect_tunnels_tls_through_the_transport(
    tls_server: Any, proxy_server: Any
) -> None:
    proxy = proxy_server(auth=("agent", SECRET))
    wire = Pool(
        stallproof.Limits(),
        ssl_context=ssl.create_default_context(cafile=tls_server.tls_cert),
        proxies=proxy_routes(proxy.url_with("agent", SECRET), trust_env=False),
    )
    engine = stallproof.Engine(pool=wire, retry=None, timeout=stallproof.Timeouts(total=10))
    try:
        async with httpx.AsyncClient(transport=stallproof.AsyncTransport(engine)) as http:
            answer = await http.get(tls_server.tls_url() + "/models")
            assert answer.status_code == 200 and answer.json()["data"]
            answer = await http.get(tls_server.tls_url() + "/models")  # the same tunnel
            assert answer.status_code == 200
        port = tls_server.tls_url().split(":")[2].split("/")[0]
        assert [(s.method, s.target) for s in proxy.seen] == [("CONNECT", f"127.0.0.1:{port}")]
        assert wire.stats().nothing_held and wire.stats().connections == 1
    finally:
        await wire.aclose()
    assert proxy.wait_idle() == 0


@pytest.fixture(scope="module")
def proxy_tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, Path]:
    """A server context for an https:// proxy on 127.0.0.1, and its certificate."""
    cert, key = self_signed("127.0.0.1", tmp_path_factory.mktemp("proxy-tls"))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context, cert


async def test_an_https_proxy_carries_tls_inside_tls(
    tls_server: Any, fault_server: Any, proxy_server: Any, proxy_tls: Any
) -> None:
    server_context, proxy_cert = proxy_tls
    proxy = proxy_server(tls=server_context, auth=("agent", SECRET))
    trusted = httpx.Proxy(
        proxy.url_with("agent", SECRET), ssl_context=ssl.create_default_context(cafile=proxy_cert)
    )
    wire = Pool(
        stallproof.Limits(),
        ssl_context=ssl.create_default_context(cafile=tls_server.tls_cert),
        proxies=proxy_routes(trusted, trust_env=False),
    )
    engine = stallproof.Engine(pool=wire, retry=None, timeout=stallproof.Timeouts(total=10))
    try:
        async with httpx.AsyncClient(transport=stallproof.AsyncTransport(engine)) as http:
            tunnelled = await http.get(tls_server.tls_url() + "/models")  # CONNECT, TLS in TLS
            forwarded = await http.get(fault_server.url() + "/models")  # forwarded over TLS
        assert tunnelled.status_code == forwarded.status_code == 200
        assert [s.method for s in proxy.seen] == ["CONNECT", "GET"]
        assert wire.stats().nothing_held
    finally:
        await wire.aclose()
    assert proxy.wait_idle() == 0


async def test_the_httpx_transport_reads_the_environment(
    fault_server: Any, proxy_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = proxy_server()
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    async with stallproof.http_client(timeout=10) as http:
        answer = await http.get(fault_server.url() + "/models")
        assert answer.status_code == 200
    assert proxy.seen[0].target == fault_server.url() + "/models"


async def test_the_httpx_transport_takes_a_proxy(fault_server: Any, proxy_server: Any) -> None:
    proxy = proxy_server()
    async with stallproof.http_client2(timeout=10, proxy=proxy.url) as http:
        assert (await http.get(fault_server.url() + "/models")).status_code == 200
    assert [s.method for s in proxy.seen] == ["GET"]


async def test_the_openai_face_goes_through_the_environments_proxy(
    fault_server: Any, proxy_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = proxy_server()
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    client = stallproof.openai.AsyncOpenAI(api_key=KEY, base_url=fault_server.url(), timeout=10)
    try:
        assert (await ask(client)).choices
    finally:
        await client.close()
    assert proxy.seen[0].target == fault_server.url() + "/chat/completions"
    assert proxy.wait_idle() == 0


# -- bounds through a proxy ----------------------------------------------------------------


@pytest.mark.parametrize("origin", ["http", "https"])
@pytest.mark.parametrize(
    ("timeouts", "raised", "bound"),
    [
        (stallproof.Timeouts(read=0.5, total=10), stallproof.ReadTimeout, 0.5),
        (stallproof.Timeouts(first_token=0.5, total=10), stallproof.FirstTokenTimeout, 0.5),
        (stallproof.Timeouts(total=0.6), stallproof.TotalTimeout, 0.6),
    ],
    ids=["read", "first_token", "total"],
)
async def test_a_silent_proxy_ends_on_time(
    make_client: MakeClient,
    proxy_server: Any,
    origin: str,
    timeouts: stallproof.Timeouts,
    raised: type[Exception],
    bound: float,
) -> None:
    # https: the proxy reads the CONNECT and never answers; http: the forwarded request.
    proxy = proxy_server(fault="silent")
    base = NOWHERE if origin == "https" else "http://127.0.0.1:9/v1"
    client = make_client(base, proxy=proxy.url, timeout=timeouts)
    with stopwatch() as t, pytest.raises(raised):
        await ask(client)
    assert bound <= t[0] < bound + MARGIN + 0.5, t[0]
    assert [s.method for s in proxy.seen] == ["CONNECT" if origin == "https" else "POST"]
    assert_let_go(client, proxy)


@pytest.mark.parametrize("status", [407, 502])
async def test_a_refused_connect_is_a_connect_error_at_once(
    make_client: MakeClient, proxy_server: Any, status: int
) -> None:
    proxy = proxy_server(fault="status", status=status)
    client = make_client(NOWHERE, proxy=proxy.url_with("agent", SECRET), timeout=10)
    with stopwatch() as t, pytest.raises(stallproof.ConnectError) as e:
        await ask(client)
    assert t[0] < 1.0 + MARGIN
    assert str(status) in str(e.value) and SECRET not in str(e.value)
    assert_let_go(client, proxy)


async def test_a_refused_connect_is_retried_within_the_budget(
    make_client: MakeClient, proxy_server: Any
) -> None:
    proxy = proxy_server(fault="status", status=502)
    retry = stallproof.Retry(attempts=3, backoff_base=0.01, backoff_max=0.02)
    client = make_client(NOWHERE, proxy=proxy.url, timeout=10, retry=retry)
    with pytest.raises(stallproof.ConnectError):
        await ask(client)
    assert [s.method for s in proxy.seen] == ["CONNECT"] * 3
    assert_let_go(client, proxy)


async def test_a_forwarding_proxys_502_is_the_status_it_is(
    make_client: MakeClient, proxy_server: Any
) -> None:
    proxy = proxy_server(fault="status", status=502)
    client = make_client("http://127.0.0.1:9/v1", proxy=proxy.url, timeout=10)
    with pytest.raises(stallproof.InternalServerError) as e:
        await ask(client)
    assert e.value.status_code == 502
    assert_let_go(client, proxy)


async def test_a_proxy_that_refuses_connections_is_a_connect_error(
    fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(NOWHERE, proxy=fault_server.refused_url, timeout=10)
    with stopwatch() as t, pytest.raises(stallproof.ConnectError):
        await ask(client)
    assert t[0] < 1.0 + MARGIN
    assert_pool_clean(client)


async def test_the_pool_bound_holds_through_a_proxy(
    make_client: MakeClient, proxy_server: Any
) -> None:
    import anyio

    proxy = proxy_server(fault="silent")
    client = make_client(
        NOWHERE,
        proxy=proxy.url,
        limits=stallproof.Limits(max_connections=1, max_keepalive_connections=1),
        # The second call's pool bound fires 0.6 s before its total; the first's total ends it.
        timeout=stallproof.Timeouts(pool=0.4, total=1.0),
    )
    outcomes: list[type[BaseException]] = []

    async def one() -> None:
        try:
            await ask(client)
        except stallproof.StallproofError as e:
            outcomes.append(type(e))

    with stopwatch() as t:
        async with anyio.create_task_group() as tg:
            tg.start_soon(one)
            await anyio.sleep(0.1)
            tg.start_soon(one)
    assert sorted(o.__name__ for o in outcomes) == ["PoolTimeout", "TotalTimeout"]
    assert t[0] < 1.0 + MARGIN + 0.5
    assert_let_go(client, proxy)


# -- SOCKS5 -------------------------------------------------------------------------------


async def test_socks5_with_credentials(
    fault_server: Any, make_client: MakeClient, proxy_server: Any
) -> None:
    proxy = proxy_server(socks=True, auth=("agent", SECRET))
    client = make_client(fault_server.url(), proxy=proxy.url_with("agent", SECRET), timeout=10)
    assert (await ask(client)).choices
    port = fault_server.url().split(":")[2].split("/")[0]
    assert proxy.seen[0].target.endswith(f":{port}")
    assert isinstance(client._engine.pool, Pool)
    assert SECRET not in repr(client._engine.pool.proxies)


@pytest.mark.parametrize(
    ("timeouts", "raised"),
    [
        (stallproof.Timeouts(read=0.6, total=10), stallproof.ReadTimeout),
        (stallproof.Timeouts(total=0.6), stallproof.TotalTimeout),
    ],
    ids=["read", "total"],
)
async def test_a_silent_socks_proxy_ends_on_time(
    make_client: MakeClient,
    proxy_server: Any,
    timeouts: stallproof.Timeouts,
    raised: type[Exception],
) -> None:
    proxy = proxy_server(socks=True, fault="silent")  # greets, then never answers CONNECT
    client = make_client(NOWHERE, proxy=proxy.url, timeout=timeouts)
    with stopwatch() as t, pytest.raises(raised):
        await ask(client)
    assert 0.6 <= t[0] < 0.6 + MARGIN + 0.5
    assert_let_go(client, proxy)


async def test_socks_without_the_extra_is_a_typed_error_at_the_call(
    make_client: MakeClient, proxy_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "socksio", None)  # as if `stallproof[socks]` were absent
    proxy = proxy_server(socks=True)
    client = make_client(NOWHERE, proxy=proxy.url)  # building the client never fails
    needs_extra = r"stallproof\[socks\]"
    with stopwatch() as t, pytest.raises(stallproof.InvalidRequestError, match=needs_extra):
        await ask(client)
    assert t[0] < 0.5 + MARGIN
    assert proxy.seen == []
    assert pool_state(client).connections == 0
