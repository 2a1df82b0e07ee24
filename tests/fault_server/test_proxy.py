"""Proxy mode: one fault server forwards to another (the "real" upstream) on loopback and
injects its faults into the upstream's real answers."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest

import fault_server
from fault_server import FAULTS, ServerThread

from ..support.wire import (
    CHAT,
    ROOT,
    STREAM,
    Raw,
    address,
    chat_path,
    chunks,
    content,
    dechunk,
    events,
    request,
)

pytestmark = pytest.mark.usefixtures("no_server_errors")


def test_healthy_is_passed_through(proxy: ServerThread, upstream: ServerThread) -> None:
    before = upstream.stats().requests
    with openai.OpenAI(base_url=proxy.url(), api_key="x", max_retries=0) as client:
        reply = client.chat.completions.create(
            model="real-model",
            messages=[{"role": "user", "content": "through the proxy"}],
            extra_headers={"x-request-id": "proxied-1"},
        )
        stream = client.chat.completions.create(
            model="real-model",
            messages=[{"role": "user", "content": "through the proxy"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks_ = list(stream)
        ids = [m.id for m in client.models.list()]
    assert reply.model == "real-model"
    assert (reply.choices[0].message.content or "").startswith("echo: through the proxy")
    text = "".join(c.choices[0].delta.content or "" for c in chunks_ if c.choices)
    assert text.startswith("echo: through the proxy")
    assert chunks_[-1].usage is not None
    assert "fault-model" in ids
    assert upstream.stats().requests == before + 3
    (seen,) = upstream.journal(request_id="proxied-1")  # the client's headers went through
    assert seen.requests[0].path == "/v1/chat/completions"
    assert proxy.upstream == upstream.url()


def test_stall_after_three_real_chunks(proxy: ServerThread, upstream: ServerThread) -> None:
    """The upstream paces its stream; the proxy sends each real chunk as it comes, then
    stalls after the third content chunk."""
    with (
        fault_server.running(
            max_hold=5, upstream=upstream.url("healthy", token_interval=0.15)
        ) as slow_proxy,
        Raw(slow_proxy) as raw,
    ):
        raw.send(request(chat_path(slow_proxy, "sse_stall", after=3, hold=1), STREAM))
        raw.head()
        start = time.monotonic()
        early, _ = raw.recv_for(0.25)
        rest = raw.wait_eof(3)
        elapsed = time.monotonic() - start
    assert len(chunks(dechunk(early)[0])) in (2, 3)  # role + 1 content chunk after 0.15 s...
    payload, terminated = dechunk(early + rest)
    assert content(payload) == "echo: hello brave"  # ...then the next two, then silence
    assert not terminated and b"[DONE]" not in payload
    assert 0.9 < elapsed < 2


def test_upstream_errors_are_passed_through(upstream: ServerThread) -> None:
    real = upstream.url("status", code=429, retry_after="2", retry_after_ms=2000)
    with fault_server.running(max_hold=5, upstream=real) as limited:
        response = httpx.post(limited.url(key="lim") + "/chat/completions", json=CHAT)
        assert response.status_code == 429
        assert response.headers["retry-after"] == "2"
        assert response.headers["retry-after-ms"] == "2000"
        assert response.json()["error"]["type"] == "rate_limit_error"
        assert limited.verdict("lim").retry_after[0].advised == 2.0


def test_a_broken_upstream_stream_breaks_the_proxied_one(upstream: ServerThread) -> None:
    with fault_server.running(max_hold=5, upstream=upstream.url("close_mid_body")) as proxy:
        with (
            httpx.Client() as client,
            client.stream("POST", proxy.url(key="b") + "/chat/completions", json=STREAM) as r,
            pytest.raises(httpx.RemoteProtocolError),
        ):
            r.read()  # the real stream stopped short: so does the proxied one
        (conn,) = proxy.journal("b")
        assert conn.requests[0].outcome == "server_closed"


def test_transforms_rewrite_the_real_stream(proxy: ServerThread) -> None:
    def body(fault: str, **params: object) -> bytes:
        payload = {**STREAM, "stream_options": {"include_usage": True}}
        with Raw(proxy) as raw:
            raw.send(
                request(
                    chat_path(proxy, fault, **params),
                    payload,
                    headers=(("Connection", "close"),),
                )
            )
            raw.head()
            return dechunk(raw.wait_eof(3))[0]

    crlf = body("sse_crlf")
    assert crlf.endswith(b"data: [DONE]\r\n\r\n") and b"\n\n" not in crlf
    assert content(crlf.replace(b"\r\n", b"\n")).startswith("echo: hello brave")
    nulls = chunks(body("bad_usage", mode="null"))
    assert [c["usage"] for c in nulls] == [None] * len(nulls)
    after = events(body("data_after_done"))
    assert after[after.index("data: [DONE]") + 1 :][0].count("after-done") == 1
    errored = events(body("error_event", after=2))
    assert json.loads(errored[-1][len("data: ") :])["error"]["type"] == "server_error"
    assert content(body("slow_first_token", wait=0.05)).startswith("echo: hello")


def test_faults_that_need_no_answer_never_call_the_upstream(
    proxy: ServerThread, upstream: ServerThread
) -> None:
    before = upstream.stats().requests
    for fault in ("status", "stall_headers", "half_open", "sse_keepalive", "sse_pings"):
        with Raw(proxy) as raw:
            raw.send(
                request(
                    chat_path(proxy, fault, hold=0.05), STREAM, headers=(("Connection", "close"),)
                )
            )
            raw.wait_eof(2)
    assert upstream.stats().requests == before


def test_json_for_stream_asks_the_upstream_for_json(
    proxy: ServerThread, upstream: ServerThread
) -> None:
    response = httpx.post(
        proxy.url("json_for_stream") + "/chat/completions",
        json={**STREAM, "stream_options": {"include_usage": True}},
    )
    assert response.headers["content-type"] == "application/json"
    assert response.json()["object"] == "chat.completion"


def test_proxy_errors(proxy: ServerThread) -> None:
    with fault_server.running(upstream="http://127.0.0.1:9/v1") as nowhere:
        response = httpx.get(nowhere.url() + "/models")
    assert response.status_code == 502
    assert "upstream http://127.0.0.1:9/v1/models failed" in response.json()["error"]["message"]
    assert httpx.get(proxy.base_url + "/v2/models").status_code == 404
    with pytest.raises(ValueError, match="upstream"):
        fault_server.FaultServer(upstream="ftp://example")


def test_every_fault_through_the_proxy_ends_cleanly(proxy: ServerThread) -> None:
    """Every request-level fault, stream and not, through the proxy at once: each ends
    within its hold and nothing is logged as a server error (the autouse fixture)."""
    host, port = address(proxy.base_url)
    small = {"size": 4096, "interval": 0.01, "wait": 0.01, "tps": 200, "bytes": 300}

    async def one(fault: str, payload: object) -> None:
        params = {p.name: small[p.name] for p in FAULTS[fault].params if p.name in small}
        reader, writer = await asyncio.open_connection(host, port)
        try:
            path = chat_path(proxy, fault, hold=0.3, **params)
            writer.write(request(path, payload, headers=(("Connection", "close"),)))
            with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
                await asyncio.wait_for(reader.readexactly(1 << 24), 3)
        finally:
            writer.close()

    async def main() -> None:
        await asyncio.gather(
            *(
                one(name, payload)
                for name, info in FAULTS.items()
                if info.scope == "request" and name != "huge_body"
                for payload in (CHAT, {**STREAM, "stream_options": {"include_usage": True}})
            )
        )

    start = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - start < 3


@pytest.mark.slow
def test_cli_proxy(upstream: ServerThread) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")])}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fault_server",
            "proxy",
            "--upstream",
            upstream.url(),
            "--port",
            "0",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 15)
        assert ready, "the proxy printed no URL within 15 s"
        base = proc.stdout.readline().strip()
        reply = httpx.post(base + "/chat/completions", json=CHAT, headers={"X-Fault": "no_done"})
        assert reply.json()["choices"][0]["message"]["content"].startswith("echo: hello")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
        assert proc.stderr is not None
        assert f"proxying {upstream.url()}" in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
