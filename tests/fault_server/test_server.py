"""The fault server, checked on the wire: what each fault sends, and when it stops.

Most tests use the session-wide ``fault_server`` fixture (a server in a thread) with a raw
socket, so they see bytes and timings, not a client's interpretation of them. Tests that need
exact counts or a shutdown start their own server. Every fault is given a short ``hold``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest
import trio

import fault_server
from fault_server import (
    FAULTS,
    GENERIC_PARAMS,
    FaultServer,
    FaultSpec,
    FaultSpecError,
    KeyStats,
    ServerThread,
    parse_fault,
)
from fault_server._catalogue import BEHAVIOURS

from ..support.wire import (
    CHAT,
    ROOT,
    STREAM,
    Raw,
    address,
    chat_path,
    dechunk,
    events,
    exchange,
    request,
)

pytestmark = pytest.mark.usefixtures("no_server_errors")


# -- helpers ---------------------------------------------------------------------------


# -- API, catalogue, parsing -------------------------------------------------------------


def test_exports_are_sorted_and_complete() -> None:
    assert fault_server.__all__ == sorted(fault_server.__all__, key=str.lower)
    for name in fault_server.__all__:
        assert getattr(fault_server, name) is not None
    assert FaultServer.__module__ == "fault_server"
    assert set(FAULTS) == set(BEHAVIOURS)
    for info in FAULTS.values():
        assert info.description


def shown(value: object) -> str:
    """A parameter value as docs/fault_server.md writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, float) else str(value)


def doc_rows(text: str, heading: str) -> list[str]:
    """The table rows that start with a code name, in the section under ``heading``."""
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| `")]


def test_docs_catalogue_is_the_real_one() -> None:
    """docs/fault_server.md lists every fault and parameter with its default, and no other."""
    text = (ROOT / "docs" / "fault_server.md").read_text(encoding="utf-8")
    faults = doc_rows(text, "The catalogue")
    assert len(faults) == len(FAULTS)
    for row, info in zip(faults, FAULTS.values(), strict=True):
        params = ", ".join(
            f"`{p.name}`" if p.default is None else f"`{p.name}={shown(p.default)}`"
            for p in info.params
        )
        assert row.startswith(f"| `{info.name}` | {params or '—'} | "), row
    generic = doc_rows(text, "Generic parameters")
    assert generic == [
        f"| `{p.name}` | {p.kind} | {'—' if p.default is None else f'`{shown(p.default)}`'}"
        f" | {p.help} |"
        for p in GENERIC_PARAMS.values()
    ]


def test_parse_fault_specs() -> None:
    spec = parse_fault("trickle_body;interval=0.5;chunk=2")
    assert spec == FaultSpec("trickle_body", {"interval": 0.5, "chunk": 2})
    assert spec.number("interval") == 0.5
    assert spec.integer("chunk") == 2
    assert str(spec) == "trickle_body;interval=0.5;chunk=2"
    assert parse_fault("delay=0.5;tokens=3") == FaultSpec("healthy", {"delay": 0.5, "tokens": 3})
    decoded = parse_fault("status;body=a%3Bb%20c;key=k;first=2")
    assert decoded.text("body") == "a;b c"
    assert decoded.key == "k"
    assert decoded.first == 2
    assert parse_fault(str(decoded)) == decoded
    assert parse_fault("status;should_retry=false").get("should_retry") is False
    assert parse_fault("reset").text("when") == "before"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("bogus", ["unknown fault", "bogus"]),
        ("status;nope=1", ["unknown parameter", "nope", "status"]),
        ("trickle_body;interval=fast", ["interval", "trickle_body", "fast"]),
        ("trickle_body;interval=-1", ["interval", ">= 0"]),
        ("status;code=99", ["code", "99"]),
        ("reset;when=later", ["when", "before, mid"]),
        ("status;key=k;key=j", ["given twice"]),
        ("healthy;first=1", ["first", "key"]),
        ("healthy;delay", ["malformed"]),
        ("", ["empty"]),
        ("healthy;delay=nan", ["delay"]),
        ("status;body=a%0Db", ["body"]),
    ],
)
def test_bad_specs_name_the_problem(text: str, words: list[str]) -> None:
    with pytest.raises(FaultSpecError) as info:
        parse_fault(text)
    for word in words:
        assert word in str(info.value)


def test_urls(srv: ServerThread) -> None:
    _, port = address(srv.base_url)
    assert srv.base_url == f"http://127.0.0.1:{port}"
    assert srv.url() == f"{srv.base_url}/v1"
    assert srv.url("healthy") == f"{srv.base_url}/v1"
    assert srv.url("trickle_body", interval=0.5) == (
        f"{srv.base_url}/fault/trickle_body;interval=0.5/v1"
    )
    assert srv.url(delay=1) == f"{srv.base_url}/fault/healthy;delay=1.0/v1"
    assert srv.url("status", body="a;b") == f"{srv.base_url}/fault/status;body=a%3Bb/v1"
    assert srv.blackhole_url.startswith("http://127.0.0.1:")
    assert srv.blackhole_url.endswith("/v1")
    assert address(srv.blackhole_url)[1] != port
    with pytest.raises(FaultSpecError, match="interval"):
        srv.url("trickle_body", interval="soon")
    with pytest.raises(ValueError, match="max_hold"):
        FaultServer(max_hold=0)
    with pytest.raises(ValueError, match="port"):
        FaultServer(port=70000)


def test_fault_key_is_unique_and_url_safe(fault_key: str) -> None:
    assert "test_fault_key_is_unique_and_url_safe" in fault_key
    assert parse_fault(f"healthy;key={fault_key}").key == fault_key


# -- healthy, through the real openai SDK -----------------------------------------------


def test_openai_sdk_non_stream(srv: ServerThread) -> None:
    with openai.OpenAI(base_url=srv.url(), api_key="x", max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-test", messages=[{"role": "user", "content": "hello brave new world"}]
        )
        reply = raw.parse()
    assert raw.headers["x-request-id"].startswith("req_")
    assert reply.id.startswith("chatcmpl-")
    assert reply.object == "chat.completion"
    assert reply.model == "gpt-test"
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == "echo: hello brave new world lorem ipsum dolor"
    assert choice.finish_reason == "stop"
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (4, 8)
    assert reply.usage.total_tokens == 12


def test_openai_sdk_stream_with_usage(srv: ServerThread) -> None:
    with openai.OpenAI(base_url=srv.url(tokens=3), api_key="x", max_retries=0) as client:
        chunks = list(
            client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "hi there"}],
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo: hi there"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 3


def test_openai_sdk_tool_calls(srv: ServerThread) -> None:
    tools: Any = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    messages: Any = [{"role": "user", "content": "find it"}]
    with openai.OpenAI(base_url=srv.url(), api_key="x", max_retries=0) as client:
        reply = client.chat.completions.create(model="m", messages=messages, tools=tools)
        stream = client.chat.completions.create(
            model="m", messages=messages, tools=tools, stream=True
        )
        chunks = list(stream)
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls"
    assert message.content is None
    assert message.tool_calls is not None
    call = message.tool_calls[0]
    assert call.type == "function"
    assert call.function.name == "lookup"
    assert json.loads(call.function.arguments)["text"].startswith("echo: find it")
    deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices[0].delta.tool_calls]
    assert deltas[0][0].id is not None
    assert deltas[0][0].function is not None
    assert deltas[0][0].function.name == "lookup"
    arguments = "".join(d[0].function.arguments or "" for d in deltas if d[0].function)
    assert json.loads(arguments) == json.loads(call.function.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_openai_sdk_models_and_max_tokens(srv: ServerThread) -> None:
    with openai.OpenAI(base_url=srv.url(), api_key="x", max_retries=0) as client:
        ids = [m.id for m in client.models.list()]
        reply = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "a b c"}], max_tokens=2
        )
    assert "fault-model" in ids
    assert reply.choices[0].message.content == "echo: a"
    assert reply.choices[0].finish_reason == "length"


def test_embeddings_are_deterministic_unit_vectors(srv: ServerThread) -> None:
    with openai.OpenAI(base_url=srv.url(), api_key="x", max_retries=0) as client:
        first = client.embeddings.create(model="e", input=["a b", "c"], dimensions=16)
        again = client.embeddings.create(model="e", input="a b", dimensions=16)
    assert [e.index for e in first.data] == [0, 1]
    vector = first.data[0].embedding
    assert len(vector) == 16 and vector == again.data[0].embedding
    assert abs(sum(v * v for v in vector) - 1) < 1e-4
    assert first.usage.prompt_tokens == first.usage.total_tokens > 0
    bad = httpx.post(srv.url() + "/embeddings", json={"model": "e", "input": []})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"
    assert httpx.get(srv.url() + "/embeddings").status_code == 405


def test_request_id_is_echoed(srv: ServerThread) -> None:
    response = httpx.post(
        srv.url() + "/chat/completions", json=CHAT, headers={"x-request-id": "abc-1"}
    )
    assert response.headers["x-request-id"] == "abc-1"


def test_keep_alive_then_connection_close(own: ServerThread) -> None:
    with Raw(own) as raw:
        for _ in range(3):
            raw.send(request("/v1/chat/completions", CHAT))
            status, headers = raw.head()
            assert status == 200
            body = raw.body(int(headers["content-length"]))
            assert json.loads(body)["object"] == "chat.completion"
        raw.send(request("/v1/models", method="GET", headers=(("Connection", "close"),)))
        status, headers = raw.head()
        assert status == 200
        assert json.loads(raw.wait_eof(2))["object"] == "list"
    stats = own.stats()
    assert (stats.connections_accepted, stats.requests) == (1, 4)


def test_pipelined_requests_are_all_answered(own: ServerThread) -> None:
    with Raw(own) as raw:
        raw.send(request("/v1/chat/completions", CHAT) + request("/v1/models", method="GET"))
        first_status, first = raw.head()
        assert json.loads(raw.body(int(first["content-length"])))["object"] == "chat.completion"
        second_status, second = raw.head()
        assert json.loads(raw.body(int(second["content-length"])))["object"] == "list"
    assert (first_status, second_status) == (200, 200)


def test_errors_are_openai_shaped(srv: ServerThread) -> None:
    base = srv.base_url
    cases = [
        (httpx.get(f"{base}/v2/nothing"), 404, "/v2/nothing"),
        (httpx.get(f"{base}/v1/chat/completions"), 405, "POST"),
        (httpx.post(f"{base}/v1/chat/completions", content=b"{nope"), 400, "JSON"),
        (httpx.post(f"{base}/v1/chat/completions", json={"model": "m"}), 400, "messages"),
        (httpx.get(f"{base}/fault/bogus/v1/models"), 400, "bogus"),
        (httpx.get(f"{base}/fault/reset;when=soon/v1/models"), 400, "when"),
        (httpx.get(f"{base}/v1/models", headers={"X-Fault": "nope;x=1"}), 400, "nope"),
    ]
    for response, code, word in cases:
        assert response.status_code == code, response.text
        error = response.json()["error"]
        assert set(error) >= {"message", "type", "code"}
        assert word in error["message"]


def test_header_wins_over_path(srv: ServerThread) -> None:
    response = httpx.post(
        srv.url("status", code=500) + "/chat/completions",
        json=CHAT,
        headers={"X-Fault": "status;code=418"},
    )
    assert response.status_code == 418


def test_oversized_body_gets_413(srv: ServerThread) -> None:
    with Raw(srv) as raw:
        raw.send(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 9000000\r\n\r\n{"
        )
        status, _ = raw.head()
        assert status == 413
        raw.wait_eof(2)


def test_malformed_http_gets_400(srv: ServerThread) -> None:
    with Raw(srv) as raw:
        raw.send(b"NOT HTTP AT ALL\r\n\r\n")
        status, _ = raw.head()
        assert status == 400
        raw.wait_eof(2)


def test_healthy_but_slow(srv: ServerThread) -> None:
    start = time.monotonic()
    status, _, _ = exchange(srv, "healthy", delay=0.3)
    assert status == 200
    assert time.monotonic() - start >= 0.3
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, token_interval=0.1, tokens=3), STREAM))
        raw.head()
        start = time.monotonic()
        content = raw.buffer
        raw.sock.settimeout(2)
        while b"[DONE]" not in content:
            more = raw.sock.recv(65536)
            assert more
            content += more
    assert time.monotonic() - start >= 0.25  # 3 content chunks, 0.1 s before each.
    assert len(events(dechunk(content)[0])) == 6  # role, 3 tokens, finish, [DONE]


# -- the faults, on the wire --------------------------------------------------------------


@pytest.mark.parametrize("fault", ["half_open", "stall_headers"])
def test_no_answer_until_hold(srv: ServerThread, fault: str) -> None:
    start = time.monotonic()
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, fault, hold=0.4), CHAT))
        assert raw.wait_eof(3) == b""
    assert 0.35 <= time.monotonic() - start < 2


def test_half_open_never_reads_the_body(srv: ServerThread) -> None:
    with Raw(srv) as raw:
        raw.send(
            f"POST {chat_path(srv, 'half_open', hold=0.3)} HTTP/1.1\r\n"
            "Host: x\r\nContent-Length: 100000\r\n\r\n".encode()
        )
        assert raw.wait_eof(3) == b""


def test_trickle_sends_one_byte_per_interval(srv: ServerThread) -> None:
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, "trickle_body", interval=0.1, hold=2), CHAT))
        status, headers = raw.head()
        start = time.monotonic()
        assert status == 200
        assert int(headers["content-length"]) > 100
        assert raw.buffer == b""
        sizes = []
        while time.monotonic() - start < 0.65:
            raw.sock.settimeout(max(0.01, 0.65 - (time.monotonic() - start)))
            with contextlib.suppress(TimeoutError):
                sizes.append(len(raw.sock.recv(100)))
        elapsed = time.monotonic() - start
    # One byte per 0.1 s: six by 0.65 s. Never more; fewer only on a starved machine.
    assert 3 <= sum(sizes) <= elapsed / 0.1 + 1
    assert sizes.count(1) >= len(sizes) - 1  # each byte in its own segment, bar a rare merge


@pytest.mark.parametrize("payload", [CHAT, STREAM])
def test_trickle_completes_a_valid_body(srv: ServerThread, payload: dict[str, object]) -> None:
    status, headers, body = exchange(srv, "trickle_body", payload, interval=0, chunk=7, tokens=2)
    assert status == 200
    assert len(body) == int(headers["content-length"])
    if payload is STREAM:
        assert headers["content-type"] == "text/event-stream"
        assert events(body)[-1] == "data: [DONE]"
    else:
        assert json.loads(body)["choices"][0]["message"]["content"] == "echo: hello"


def test_sse_keepalive_stream(srv: ServerThread) -> None:
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, "sse_keepalive", interval=0.1, hold=0.45), STREAM))
        status, headers = raw.head()
        assert (status, headers["content-type"]) == (200, "text/event-stream")
        payload, terminated = dechunk(raw.wait_eof(2))
    assert not terminated
    assert events(payload) in ([": keep-alive"] * 3, [": keep-alive"] * 4)  # 0.1 s apart, 0.45 s


def test_sse_keepalive_non_stream(srv: ServerThread) -> None:
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, "sse_keepalive", interval=0.1, hold=0.35), CHAT))
        _, headers = raw.head()
        assert headers["content-type"] == "application/json"
        assert headers["transfer-encoding"] == "chunked"
        payload, terminated = dechunk(raw.wait_eof(2))
    assert not terminated
    assert payload in (b"\n" * 2, b"\n" * 3)  # 0.1 s apart, until 0.35 s


def test_sse_stall_stream(srv: ServerThread) -> None:
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, "sse_stall", after=2, hold=0.8), STREAM))
        raw.head()
        first, _ = raw.recv_for(0.4)
        later = raw.wait_eof(2)
    payload, terminated = dechunk(first)
    chunks = [json.loads(e[len("data: ") :]) for e in events(payload)]
    assert [c["choices"][0]["delta"].get("content") for c in chunks] == ["", "echo:", " hello"]
    assert later == b""
    assert not terminated


def test_sse_stall_non_stream(srv: ServerThread) -> None:
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, "sse_stall", hold=0.4), CHAT))
        _, headers = raw.head()
        received = raw.wait_eof(2)
    assert len(received) == int(headers["content-length"]) // 2


@pytest.mark.parametrize("payload", [CHAT, STREAM])
def test_sse_empty_deltas(srv: ServerThread, payload: dict[str, object]) -> None:
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, "sse_empty_deltas", interval=0.05, hold=0.4), payload))
        _, headers = raw.head()
        assert headers["content-type"] == "text/event-stream"
        payload_bytes, _ = dechunk(raw.wait_eof(2))
    chunks = [json.loads(e[len("data: ") :]) for e in events(payload_bytes)]
    assert len(chunks) >= 4
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert {c["choices"][0]["delta"].get("content", "") for c in chunks} == {""}
    assert {json.dumps(c["choices"][0]["delta"]) for c in chunks[1:]} == {"{}", '{"content": ""}'}


def test_reset_before(srv: ServerThread) -> None:
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, "reset"), CHAT))
        assert raw.recv_until_reset(2) == b""


@pytest.mark.parametrize("payload", [CHAT, STREAM])
def test_reset_mid(srv: ServerThread, payload: dict[str, object]) -> None:
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, "reset", when="mid"), payload))
        received = raw.recv_until_reset(2)
    assert received.startswith(b"HTTP/1.1 200 ")
    body = received.partition(b"\r\n\r\n")[2]
    if payload is STREAM:
        assert len(events(dechunk(body)[0])) == 2  # role chunk + 1 content chunk
    else:
        length = int(received.split(b"content-length: ")[1].split(b"\r\n")[0])
        assert len(body) == length // 2


def test_close_mid_body_non_stream(srv: ServerThread) -> None:
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, "close_mid_body"), CHAT))
        _, headers = raw.head()
        received = raw.wait_eof(2)  # a FIN, not an RST: wait_eof would raise on a reset.
    assert len(received) == int(headers["content-length"]) // 2


def test_close_mid_body_stream(srv: ServerThread) -> None:
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, "close_mid_body", after=1), STREAM))
        raw.head()
        payload, terminated = dechunk(raw.wait_eof(2))
    assert not terminated
    assert len(events(payload)) == 2
    assert b"[DONE]" not in payload
    with (
        httpx.Client() as client,
        client.stream("POST", srv.url("close_mid_body") + "/chat/completions", json=STREAM) as r,
        pytest.raises(httpx.RemoteProtocolError),
    ):
        r.read()


def test_content_length_lie(srv: ServerThread) -> None:
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, "content_length_lie", extra=50, hold=0.5), CHAT))
        _, headers = raw.head()
        body, eof = raw.recv_for(0.25)
        assert not eof
        assert raw.wait_eof(2) == b""
    assert int(headers["content-length"]) == len(body) + 50
    assert json.loads(body)["object"] == "chat.completion"


def test_status_with_retry_headers(srv: ServerThread) -> None:
    url = srv.url("status", code=503, retry_after=2, retry_after_ms=1500, should_retry=False)
    with (
        openai.OpenAI(base_url=url, api_key="x", max_retries=0) as client,
        pytest.raises(openai.InternalServerError) as info,
    ):
        client.chat.completions.create(**CHAT)
    response = info.value.response
    assert response.status_code == 503
    assert response.headers["retry-after"] == "2"
    assert response.headers["retry-after-ms"] == "1500"
    assert response.headers["x-should-retry"] == "false"
    assert response.json()["error"]["type"] == "server_error"
    custom = httpx.get(srv.url("status", code=429, body="slow down") + "/models")
    assert (custom.status_code, custom.text) == (429, "slow down")


def test_status_keeps_the_connection(own: ServerThread) -> None:
    with httpx.Client() as client:
        for code in (500, 429, 200):
            assert client.get(own.url("status", code=code) + "/models").status_code == code
    assert own.stats().connections_accepted == 1


def test_malformed_json(srv: ServerThread) -> None:
    _, _, body = exchange(srv, "malformed_json")
    assert body == b'{"id": "x", "choices": ['
    _, _, stream = exchange(srv, "malformed_json", STREAM)
    assert events(stream)[1:] == ["data: {not json", "data: [DONE]"]
    with (
        openai.OpenAI(base_url=srv.url("malformed_json"), api_key="x", max_retries=0) as client,
        pytest.raises(Exception),  # noqa: B017,PT011 -- which one is the client's choice.
    ):
        list(client.chat.completions.create(**STREAM))


def test_huge_body_non_stream(srv: ServerThread) -> None:
    size = 3 * 1024 * 1024 + 7
    response = httpx.post(srv.url("huge_body", size=size) + "/chat/completions", json=CHAT)
    assert len(response.content) == size
    assert response.json()["object"] == "chat.completion"


def test_huge_body_stream(srv: ServerThread) -> None:
    size = 1024 * 1024
    with httpx.stream(
        "POST", srv.url("huge_body", size=size) + "/chat/completions", json=STREAM
    ) as response:
        lines = list(response.iter_lines())
    data_lines = [line for line in lines if line]
    assert len(data_lines[0]) == size
    assert json.loads(data_lines[0][len("data: ") :])["object"] == "chat.completion.chunk"
    assert data_lines[1:] == ["data: [DONE]"]


def test_no_done(srv: ServerThread) -> None:
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, "no_done", tokens=3), STREAM))
        _, headers = raw.head()
        payload, terminated = dechunk(raw.wait_eof(2))
    assert headers["connection"] == "close"
    assert terminated
    frames = events(payload)
    assert "[DONE]" not in payload.decode()
    assert json.loads(frames[-1][len("data: ") :])["choices"][0]["finish_reason"] == "stop"
    assert len(frames) == 5  # role, 3 tokens, finish


def test_hold_is_capped_by_max_hold() -> None:
    with fault_server.running(max_hold=0.3) as server, Raw(server) as raw:
        start = time.monotonic()
        raw.send(request(chat_path(server, "stall_headers", hold=20), CHAT))
        raw.wait_eof(3)
        assert time.monotonic() - start < 1.5


# -- sequences, stats, control endpoints ----------------------------------------------------


def test_first_n_per_key(srv: ServerThread, fault_key: str) -> None:
    url = srv.url("status", code=503, key=fault_key, first=2) + "/models"
    with httpx.Client() as client:
        codes = [client.get(url).status_code for _ in range(4)]
    assert codes == [503, 503, 200, 200]
    assert srv.key_stats(fault_key) == KeyStats(requests=4, connections=1, faulted=2)
    assert srv.key_stats(fault_key + "-other") == KeyStats()
    stats = httpx.get(srv.base_url + "/_fault/stats").json()
    assert stats["keys"][fault_key] == {"requests": 4, "connections": 1, "faulted": 2}


def test_key_connections_and_header_selection(srv: ServerThread, fault_key: str) -> None:
    for _ in range(2):
        with httpx.Client() as client:
            response = client.get(
                srv.url() + "/models", headers={"X-Fault": f"status;code=502;key={fault_key}"}
            )
            assert response.status_code == 502
    assert srv.key_stats(fault_key) == KeyStats(requests=2, connections=2, faulted=2)


def test_stats_and_reset(own: ServerThread, fault_key: str) -> None:
    with httpx.Client() as client:
        client.get(own.url(key=fault_key) + "/models")
        client.get(own.url() + "/models")
        assert client.get(own.base_url + "/_fault/list").json()["faults"][0]["name"] == "healthy"
        stats = own.stats()
        assert (stats.connections_accepted, stats.connections_open, stats.requests) == (1, 1, 2)
        assert client.post(own.base_url + "/_fault/reset", json={}).json()["requests"] == 0
    assert own.key_stats(fault_key) == KeyStats()
    deadline = time.monotonic() + 2
    while own.stats().connections_open and time.monotonic() < deadline:
        time.sleep(0.01)
    assert own.stats().connections_open == 0


def test_client_leaving_ends_the_fault(own: ServerThread) -> None:
    for fault, payload in [("half_open", CHAT), ("trickle_body", STREAM), ("sse_stall", STREAM)]:
        with Raw(own) as raw:
            raw.send(
                request(
                    chat_path(own, fault, interval=0.05)
                    if fault == "trickle_body"
                    else chat_path(own, fault),
                    payload,
                )
            )
            raw.recv_for(0.15)
        deadline = time.monotonic() + 2
        while own.stats().connections_open and time.monotonic() < deadline:
            time.sleep(0.01)
        assert own.stats().connections_open == 0, fault


@pytest.mark.slow
@pytest.mark.parametrize("reset_it", [False, True])
def test_clients_leaving_anywhere_leave_nothing_behind(own: ServerThread, reset_it: bool) -> None:
    """Every fault, stream or not, with the client gone mid-request or mid-response."""
    fast = {"interval": 0.01, "size": 4_000_000}
    for fault, info in FAULTS.items():
        params = {p.name: fast[p.name] for p in info.params if p.name in fast}
        for payload in (CHAT, STREAM):
            whole = request(chat_path(own, fault, **params), payload)
            for data in (whole[:30], whole[:-3], whole):
                with Raw(own) as raw, contextlib.suppress(ConnectionError):
                    raw.send(data)
                    raw.recv_for(0.005)
                    if reset_it:
                        raw.sock.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
    deadline = time.monotonic() + 3
    while own.stats().connections_open and time.monotonic() < deadline:
        time.sleep(0.01)
    assert own.stats().connections_open == 0
    assert own.stats().connections_accepted == len(FAULTS) * 6


def test_blackhole_connect_times_out(srv: ServerThread) -> None:
    for _ in range(2):
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            socket.create_connection(address(srv.blackhole_url), timeout=0.3).close()
        assert time.monotonic() - start >= 0.25
    with pytest.raises(httpx.ConnectTimeout):
        httpx.get(srv.blackhole_url + "/models", timeout=0.3)


# -- lifecycle: asyncio, trio, CLI -----------------------------------------------------------


@pytest.mark.asyncio
async def test_shutdown_ends_every_fault_at_once() -> None:
    server = FaultServer(max_hold=30)
    await server.start()
    host, port = address(server.base_url)
    streams = []
    for fault in [
        "half_open",
        "stall_headers",
        "sse_keepalive",
        "trickle_body",
        "content_length_lie",
    ]:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request(chat_path(server, fault, hold=30), STREAM))
        streams.append((reader, writer))
    for _ in range(200):
        if server.stats().connections_open == 5:
            break
        await asyncio.sleep(0.01)
    assert server.stats().connections_open == 5
    await asyncio.sleep(0.1)  # let every fault reach its stall.
    start = time.monotonic()
    await server.aclose()
    assert time.monotonic() - start < 1
    for reader, writer in streams:
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await asyncio.wait_for(reader.readexactly(1 << 20), 1)
        writer.close()
    assert server.stats().connections_open == 0


# A client gives up on a held fault, then the server stops: the fault's end (PeerGone) and
# the shutdown's cancellation race. asyncio.wait_for ran each fault in a hidden task and, when
# cancelled, never read that task's outcome: "Task exception was never retrieved".
HELD = [
    ("sse_keepalive", {"interval": 0.3}, CHAT),
    ("trickle_body", {"interval": 0.3}, STREAM),
    ("sse_empty_deltas", {"interval": 0.3}, CHAT),
    ("healthy", {"delay": 30}, STREAM),
]


def never_retrieved(records: list[logging.LogRecord]) -> list[str]:
    gc.collect()  # an unretrieved task exception is reported when the task is freed.
    return [r.getMessage() for r in records if "never retrieved" in r.getMessage()]


@pytest.mark.slow
@pytest.mark.parametrize(("fault", "params", "payload"), HELD, ids=[h[0] for h in HELD])
def test_stopping_after_a_client_left_a_held_fault_leaves_no_task_behind(
    caplog: pytest.LogCaptureFixture, fault: str, params: dict[str, Any], payload: object
) -> None:
    for _ in range(3):
        # Raw closes first, then the server stops at once: while it is noticing the close.
        with fault_server.running(max_hold=30) as server, Raw(server) as raw:
            raw.send(request(chat_path(server, fault, hold=30, **params), payload))
            if fault == "healthy":
                raw.recv_for(0.1)  # the delay sends nothing.
            else:
                raw.head()
        assert never_retrieved(caplog.records) == []


@pytest.mark.slow
def test_stopping_after_httpx_gave_up_leaves_no_task_behind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The reported case: a non-stream call with a total cap, then the runner stops."""

    async def call(url: str) -> None:
        async with httpx.AsyncClient() as client:
            with anyio.move_on_after(0.3) as scope:
                await client.post(
                    url + "/chat/completions",
                    json=CHAT,
                    headers={"X-Fault": "sse_empty_deltas;interval=0.1;hold=30"},
                )
            assert scope.cancelled_caught

    for _ in range(3):
        with fault_server.running() as server:
            anyio.run(call, server.url())
        assert never_retrieved(caplog.records) == []


@pytest.mark.asyncio
async def test_a_fault_runs_in_two_tasks_and_shuts_down_quietly() -> None:
    """Its connection's and its peer watcher's: nothing runs unawaited beside them."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        server = FaultServer(max_hold=30)
        await server.start()
        before = asyncio.all_tasks()
        host, port = address(server.base_url)
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request(chat_path(server, "sse_keepalive", interval=0.05, hold=30), CHAT))
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
        await asyncio.sleep(0.12)  # a few keep-alive sleeps in.
        new = asyncio.all_tasks() - before - {asyncio.current_task()}
        assert sorted(t.get_name() for t in new if t.get_name().startswith("fault_")) == [
            "fault_server.connection",
            "fault_server.watch",
        ]
        assert len(new) == 2, new
        writer.transport.abort()  # the client leaves as the server stops.
        await server.aclose()
        assert all(task.done() for task in new)
        del new
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert reported == []


@pytest.mark.asyncio
async def test_async_context_manager_and_openai_async() -> None:
    async with FaultServer() as server:
        async with openai.AsyncOpenAI(base_url=server.url(), api_key="x") as client:
            reply = await client.chat.completions.create(**CHAT)
        assert (reply.choices[0].message.content or "").startswith("echo: hello")
        with pytest.raises(RuntimeError):
            await server.start()


def test_usable_from_trio(srv: ServerThread) -> None:
    async def main() -> list[str]:
        host, port = address(srv.base_url)
        stream = await trio.open_tcp_stream(host, port)
        async with stream:
            await stream.send_all(request(chat_path(srv, "sse_keepalive", interval=0.05), STREAM))
            received = b""
            with trio.move_on_after(0.3):
                while b"keep-alive" not in received.partition(b"\r\n\r\n")[2]:
                    received += await stream.receive_some()
        return events(dechunk(received.partition(b"\r\n\r\n")[2])[0])

    assert trio.run(main) == [": keep-alive"]


@pytest.mark.slow
def test_cli(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")])}
    listing = subprocess.run(
        [sys.executable, "-m", "fault_server", "--list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    assert all(name in listing.stdout for name in FAULTS)
    proc = subprocess.Popen(
        [sys.executable, "-m", "fault_server", "--port", "0", "--max-hold", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 15)
        assert ready, "the CLI printed no URL within 15 s"
        base = proc.stdout.readline().strip()
        assert base.startswith("http://127.0.0.1:")
        assert base.endswith("/v1")
        assert httpx.get(base + "/models").json()["object"] == "list"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        proc.kill()
        proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
