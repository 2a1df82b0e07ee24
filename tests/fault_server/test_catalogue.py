"""The catalogue's newer faults, checked on the wire: socket, framing, SSE/OpenAI, status, time.

Like test_server.py, each test drives a fault with a raw socket (or httpx, or the
openai SDK where what matters is that a real client parses it) and asserts the bytes and
their timing. Holds and intervals are short: the whole file runs in a few seconds.
"""

from __future__ import annotations

import email.utils
import itertools
import json
import socket
import struct
import time
from typing import Any

import httpx
import openai
import pytest

from fault_server import FaultServer, ServerThread
from fault_server._tool_calls import TRICKY_ARGUMENTS

from ..support.wire import (
    CHAT,
    STREAM,
    Raw,
    address,
    chat_path,
    chunks,
    content,
    dechunk,
    events,
    exchange,
    request,
)

pytestmark = pytest.mark.usefixtures("no_server_errors")

USAGE_STREAM = {**STREAM, "stream_options": {"include_usage": True}}


def raw_chunks(data: bytes) -> list[bytes]:
    """The payloads of each HTTP chunk of a chunked body, in order."""
    out = []
    while data:
        size_line, sep, rest = data.partition(b"\r\n")
        if not sep or int(size_line, 16) == 0:
            break
        size = int(size_line, 16)
        out.append(rest[:size])
        data = rest[size + 2 :]
    return out


def stream_body(
    srv: ServerThread | FaultServer, fault: str, payload: object, **params: Any
) -> tuple[dict[str, str], bytes, bool]:
    """Headers, the dechunked body and whether it was terminated, read until EOF."""
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, fault, **params), payload))
        _, headers = raw.head()
        body, terminated = dechunk(raw.wait_eof(3))
    return headers, body, terminated


# -- socket ---------------------------------------------------------------------------------


def test_slow_accept_delays_reading_a_new_connection(own: ServerThread) -> None:
    own.scenario("slow_accept", pause=0.4, times=1)
    timings = []
    for _ in range(2):
        with Raw(own) as raw:  # connect() succeeds at once: the kernel did the handshake.
            start = time.monotonic()
            raw.send(request("/v1/models", method="GET"))
            status, _ = raw.head()
            timings.append(time.monotonic() - start)
            assert status == 200
    assert timings[0] >= 0.38
    assert timings[1] < 0.3  # times=1: the next connection is read at once.
    record = own.journal()[0]
    assert record.fault == "slow_accept;pause=0.4"
    # Named by a request, it cannot act (the request was already read): a 400 that says so.
    response = httpx.get(own.url("slow_accept") + "/models")
    assert response.status_code == 400
    assert "scenario" in response.json()["error"]["message"]


def test_half_open_leaves_the_body_unread_so_the_client_send_stalls(srv: ServerThread) -> None:
    size = 64 * 1024 * 1024
    head = (
        f"POST {chat_path(srv, 'half_open', hold=1)} HTTP/1.1\r\nHost: x\r\n"
        f"Content-Length: {size}\r\n\r\n"
    ).encode()
    with Raw(srv) as raw:
        raw.send(head)
        raw.sock.setblocking(False)
        sent, block = 0, b"x" * 65536
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                sent += raw.sock.send(block)
            except BlockingIOError:
                time.sleep(0.05)  # let the server read what it will, then try again.
                try:
                    sent += raw.sock.send(block)
                except BlockingIOError:
                    break
    # The server read the head and at most its 1 MiB watch buffer: the send blocked early.
    assert sent < 16 * 1024 * 1024


@pytest.mark.parametrize("payload", [CHAT, STREAM], ids=["plain", "stream"])
def test_half_close_sends_a_fin_and_keeps_reading(own: ServerThread, payload: object) -> None:
    with Raw(own) as raw:
        raw.send(request(chat_path(own, "half_close", after=1, hold=0.6), payload))
        _, headers = raw.head()
        start = time.monotonic()
        received = raw.wait_eof(0.5)  # the FIN comes at once...
        assert time.monotonic() - start < 0.4
        raw.send(b"still here")  # ...and the socket still takes our bytes: no RST.
        time.sleep(0.8)  # the server closes at hold.
    if payload is STREAM:
        assert len(events(dechunk(received)[0])) == 2  # role + 1 content chunk
    else:
        assert len(received) == int(headers["content-length"]) // 2
    (conn,) = own.journal()
    assert (conn.closed_by, conn.how) == ("server", "hold")
    assert conn.requests[0].outcome == "hold_expired"


@pytest.mark.parametrize("then", ["close", "reset", "stall"])
def test_cut_after_n_bytes(srv: ServerThread, then: str) -> None:
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, "cut_after", bytes=20, then=then, hold=0.5), CHAT))
        if then == "reset":
            received = raw.recv_until_reset(2)
        elif then == "close":
            received = raw.wait_eof(2)
        else:
            received, eof = raw.recv_for(0.3)
            assert not eof
            assert raw.wait_eof(2) == b""
    assert received == b"HTTP/1.1 200 OK\r\ncon"  # 20 bytes: the cut falls inside the head.


def test_cut_after_inside_the_stream_body(srv: ServerThread) -> None:
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, "cut_after", bytes=400), STREAM))
        received = raw.wait_eof(2)
    assert len(received) == 400
    assert b"\r\n\r\n" in received  # the head came whole, the body did not.


# -- HTTP framing ---------------------------------------------------------------------------


def test_stall_in_headers(srv: ServerThread) -> None:
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, "stall_in_headers", hold=0.4), CHAT))
        received, eof = raw.recv_for(0.25)
        assert not eof
        assert raw.wait_eof(2) == b""
    assert received.startswith(b"HTTP/1.1 200 OK\r\n")
    assert received.endswith(b"\r\n")
    assert b"\r\n\r\n" not in received  # the head never ends.
    assert b"content-type: application/json" in received


def test_trickle_headers(srv: ServerThread) -> None:
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, "trickle_headers", interval=0.02, chunk=20), CHAT))
        start = time.monotonic()
        status, headers = raw.head(5)
        elapsed = time.monotonic() - start
        body = raw.body(int(headers["content-length"]))
    head_size = len("HTTP/1.1 200 OK\r\n") + sum(len(f"{k}: {v}\r\n") for k, v in headers.items())
    assert status == 200
    assert elapsed >= (head_size // 20 - 1) * 0.02 * 0.9
    assert json.loads(body)["object"] == "chat.completion"
    response = httpx.post(
        srv.url("trickle_headers", interval=0.01, chunk=50) + "/chat/completions", json=STREAM
    )
    assert response.text.endswith("data: [DONE]\n\n")


def test_chunked_no_end(srv: ServerThread) -> None:
    headers, body, terminated = stream_body(srv, "chunked_no_end", CHAT, hold=0.3)
    assert headers["transfer-encoding"] == "chunked"
    assert not terminated
    assert json.loads(body)["object"] == "chat.completion"  # all of it, but no final chunk.
    _, stream, terminated = stream_body(srv, "chunked_no_end", STREAM, hold=0.3, tokens=2)
    assert not terminated
    assert "[DONE]" not in stream.decode()
    assert chunks(stream)[-1]["choices"][0]["finish_reason"] == "stop"


def test_endless_body(srv: ServerThread) -> None:
    _, stream, terminated = stream_body(srv, "endless_body", STREAM, interval=0.01, hold=0.3)
    assert not terminated
    assert len(chunks(stream)) > 5
    assert content(stream).startswith(" lorem lorem")
    _, plain, terminated = stream_body(srv, "endless_body", CHAT, interval=0.01, hold=0.3)
    assert not terminated
    assert plain.startswith(b'{"id":"chatcmpl-')
    assert plain.count(b" lorem") > 5
    assert plain.endswith(b" lorem")  # the content string never closes.


# -- SSE / OpenAI ---------------------------------------------------------------------------


def test_sse_pings(srv: ServerThread) -> None:
    for payload in (STREAM, CHAT):  # always an event stream
        headers, body, terminated = stream_body(srv, "sse_pings", payload, interval=0.05, hold=0.3)
        assert headers["content-type"] == "text/event-stream"
        assert not terminated
        frames = events(body)
        assert json.loads(frames[0][len("data: ") :])["choices"][0]["delta"]["role"] == "assistant"
        assert len(frames) >= 4
        assert set(frames[1:]) == {'event: ping\ndata: {"type": "ping"}'}
    _, body, _ = stream_body(srv, "sse_pings", STREAM, interval=0.05, hold=0.2, event="heartbeat")
    assert events(body)[1] == 'event: heartbeat\ndata: {"type": "heartbeat"}'


def test_done_then_hold(srv: ServerThread) -> None:
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, "done_then_hold", hold=0.5, tokens=2), STREAM))
        raw.head()
        first, eof = raw.recv_for(0.3)
        assert not eof
        assert raw.wait_eof(2) == b""
    body, terminated = dechunk(first)
    assert events(body)[-1] == "data: [DONE]"
    assert not terminated
    _, plain, terminated = stream_body(srv, "done_then_hold", CHAT, hold=0.2)
    assert json.loads(plain)["object"] == "chat.completion"
    assert not terminated


def test_data_after_done(srv: ServerThread) -> None:
    _, _, body = exchange(srv, "data_after_done", STREAM, tokens=2)
    frames = events(body)
    done = frames.index("data: [DONE]")
    assert "after-done" in "".join(frames[done:])
    assert frames[-1] == "data: [DONE]"
    with openai.OpenAI(base_url=srv.url("data_after_done"), api_key="x", max_retries=0) as c:
        text = "".join(
            ch.choices[0].delta.content or ""
            for ch in c.chat.completions.create(**STREAM)
            if ch.choices
        )
    assert "after-done" not in text  # a correct client stops at the first [DONE]


@pytest.mark.parametrize("as_event", [False, True])
def test_error_event(srv: ServerThread, as_event: bool) -> None:
    _, _, body = exchange(srv, "error_event", STREAM, after=1, event=as_event)
    frames = events(body)
    assert len(frames) == 3 and "[DONE]" not in body.decode()
    last = frames[-1]
    assert last.startswith("event: error\ndata: ") if as_event else last.startswith("data: ")
    assert json.loads(last.partition("data: ")[2])["error"]["type"] == "server_error"
    status, _, plain = exchange(srv, "error_event", CHAT)
    assert status == 200
    assert json.loads(plain)["error"]["message"].endswith("mid-stream")
    if not as_event:
        with (
            openai.OpenAI(base_url=srv.url("error_event"), api_key="x", max_retries=0) as c,
            pytest.raises(openai.APIError, match="mid-stream"),
        ):
            list(c.chat.completions.create(**STREAM))


@pytest.mark.parametrize("eol", ["crlf", "cr"])
def test_sse_crlf(srv: ServerThread, eol: str) -> None:
    _, _, body = exchange(srv, "sse_crlf", STREAM, eol=eol, tokens=3)
    sep = b"\r\n\r\n" if eol == "crlf" else b"\r\r"
    assert body.endswith(b"data: [DONE]" + sep)
    assert b"\n" not in body.replace(b"\r\n", b"") if eol == "crlf" else b"\n" not in body
    with openai.OpenAI(base_url=srv.url("sse_crlf", eol=eol), api_key="x", max_retries=0) as c:
        parts = [ch.choices[0].delta.content or "" for ch in c.chat.completions.create(**STREAM)]
    assert "".join(parts) == "echo: hello brave new world lorem ipsum dolor"


def test_sse_multiline(srv: ServerThread) -> None:
    _, _, body = exchange(srv, "sse_multiline", STREAM, tokens=2)
    first = events(body)[0].split("\n")
    assert first[:3] == ["id: 1", "retry: 3000", ": the data of this event spans lines"]
    assert sum(line.startswith("data:") for line in first) > 5
    assert content(body) == "echo: hello"
    with openai.OpenAI(base_url=srv.url("sse_multiline"), api_key="x", max_retries=0) as c:
        parts = [ch.choices[0].delta.content or "" for ch in c.chat.completions.create(**STREAM)]
    assert "".join(parts).startswith("echo: hello brave")


def test_sse_long_line(srv: ServerThread) -> None:
    size = 300_000
    _, _, body = exchange(srv, "sse_long_line", STREAM, size=size, tokens=2)
    lines = [line for line in body.split(b"\n") if line]
    assert [len(line) for line in lines].count(size) == 1
    assert len(lines[1]) == size
    assert content(body).endswith("echo: hello")
    assert events(body)[-1] == "data: [DONE]"


def test_endless_line(srv: ServerThread) -> None:
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, "endless_line", interval=0.02, hold=0.4), STREAM))
        raw.head()
        payload, _ = dechunk(raw.wait_eof(2))
    role, _, line = payload.partition(b"\n\n")
    assert b'"role":"assistant"' in role
    assert line.startswith(b"data: {") and b"\n" not in line
    assert line.count(b" lorem") > 5


@pytest.mark.parametrize("mode", ["missing", "null", "early"])
def test_bad_usage(srv: ServerThread, mode: str) -> None:
    _, _, body = exchange(srv, "bad_usage", USAGE_STREAM, mode=mode, tokens=2)
    parsed = chunks(body)
    usage_chunks = [c for c in parsed if c["choices"] == []]
    if mode == "missing":
        assert usage_chunks == []
    elif mode == "null":
        assert [c["usage"] for c in parsed] == [None] * len(parsed)
    else:
        assert parsed[1]["choices"] == []  # right after the role chunk, before any content
        assert parsed[1]["usage"]["completion_tokens"] == 2
    assert events(body)[-1] == "data: [DONE]"
    _, _, plain = exchange(srv, "bad_usage", CHAT, mode=mode)
    data = json.loads(plain)
    if mode == "missing":
        assert "usage" not in data
    elif mode == "null":
        assert data["usage"] is None
    else:
        assert data["usage"]["total_tokens"] > 0


def test_tool_split_stream(srv: ServerThread) -> None:
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, "tool_split"), STREAM, headers=(("Connection", "close"),)))
        raw.head()
        wire = raw.wait_eof(3)
    pieces = raw_chunks(wire)
    undecodable = 0
    for piece in pieces:
        try:
            piece.decode("utf-8")
        except UnicodeDecodeError:
            undecodable += 1
    assert undecodable >= 4  # chunks that end or start inside a UTF-8 character
    body = b"".join(pieces)
    deltas = [c["choices"][0]["delta"] for c in chunks(body)]
    arguments = [d["tool_calls"][0]["function"]["arguments"] for d in deltas if "tool_calls" in d]
    assert any(a.endswith("\\") for a in arguments)  # cut after a backslash
    assert any(a.endswith("\\u00") for a in arguments)  # cut inside \u00e9
    assert "".join(arguments) == TRICKY_ARGUMENTS
    assert json.loads("".join(arguments))["esc"] == "café"
    tools: Any = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    with openai.OpenAI(base_url=srv.url("tool_split"), api_key="x", max_retries=0) as c:
        got = [
            tc.function.arguments or ""
            for ch in c.chat.completions.create(**STREAM, tools=tools)
            for tc in ch.choices[0].delta.tool_calls or []
            if tc.function
        ]
    assert json.loads("".join(got)) == json.loads(TRICKY_ARGUMENTS)


def test_tool_split_non_stream(srv: ServerThread) -> None:
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, "tool_split"), CHAT))
        _, headers = raw.head()
        body = raw.body(int(headers["content-length"]))
    message = json.loads(body)["choices"][0]["message"]
    assert json.loads(message["tool_calls"][0]["function"]["arguments"])["city"] == "Zürich"
    assert "Zürich".encode() in body  # raw UTF-8 on the wire, not \u escapes


def test_index_gap(srv: ServerThread) -> None:
    _, _, body = exchange(srv, "index_gap", STREAM)
    indices = [
        tc["index"] for c in chunks(body) for tc in c["choices"][0]["delta"].get("tool_calls") or []
    ]
    assert sorted(set(indices)) == [0, 2]
    assert chunks(body)[-1]["choices"][0]["finish_reason"] == "tool_calls"
    _, _, plain = exchange(srv, "index_gap", CHAT)
    assert len(json.loads(plain)["choices"][0]["message"]["tool_calls"]) == 2


def test_tool_args_unclosed(srv: ServerThread) -> None:
    _, _, body = exchange(srv, "tool_args_unclosed", STREAM)
    arguments = "".join(
        tc["function"].get("arguments", "")
        for c in chunks(body)
        for tc in c["choices"][0]["delta"].get("tool_calls") or []
    )
    assert arguments == '{"text": "echo: hello brave new world'
    assert events(body)[-1] == "data: [DONE]"
    _, _, plain = exchange(srv, "tool_args_unclosed", CHAT)
    call = json.loads(plain)["choices"][0]["message"]["tool_calls"][0]
    with pytest.raises(json.JSONDecodeError):
        json.loads(call["function"]["arguments"])


def test_json_for_stream(srv: ServerThread) -> None:
    status, headers, body = exchange(srv, "json_for_stream", STREAM)
    assert (status, headers["content-type"]) == (200, "application/json")
    assert int(headers["content-length"]) == len(body)
    assert json.loads(body)["object"] == "chat.completion"


# -- status -----------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [429, 500, 502, 503, 504, 529])
def test_status_codes_with_every_retry_header(srv: ServerThread, code: int) -> None:
    url = srv.url("status", code=code, retry_after_date=30, retry_after_ms=250, should_retry=True)
    response = httpx.get(url + "/models")
    assert response.status_code == code
    when = email.utils.parsedate_to_datetime(response.headers["retry-after"]).timestamp()
    assert 28 <= when - time.time() <= 31
    assert response.headers["retry-after-ms"] == "250"
    assert response.headers["x-should-retry"] == "true"
    assert response.json()["error"]["message"].endswith(str(code))


def test_retry_after_above_any_cap_is_sent_verbatim(srv: ServerThread) -> None:
    response = httpx.get(srv.url("status", code=429, retry_after="86400") + "/models")
    assert (response.status_code, response.headers["retry-after"]) == (429, "86400")


def test_slow_error_body(srv: ServerThread) -> None:
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, "status", code=503, body="wait", interval=0.1), CHAT))
        status, headers = raw.head()
        start = time.monotonic()
        body = raw.body(4)
        elapsed = time.monotonic() - start
    assert (status, headers["content-length"], body) == (503, "4", b"wait")
    assert elapsed >= 0.35


# -- time -------------------------------------------------------------------------------------


def test_slow_first_token(srv: ServerThread) -> None:
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, "slow_first_token", wait=0.3, tokens=2), STREAM))
        raw.head()
        start = time.monotonic()
        early, _ = raw.recv_for(0.2)
        rest, _ = raw.recv_for(0.5)
    first = chunks(dechunk(early)[0])
    assert len(first) == 1 and first[0]["choices"][0]["delta"]["role"] == "assistant"
    assert content(dechunk(early + rest)[0]) == "echo: hello"
    assert time.monotonic() - start >= 0.3
    with Raw(srv) as raw:
        # A lower bound is measured from before the server can start waiting: the send.
        # (From the headers, a test process descheduled after they came measured less.)
        start = time.monotonic()
        raw.send(request(chat_path(srv, "slow_first_token", wait=0.3), CHAT))
        _, headers = raw.head()
        body = raw.body(int(headers["content-length"]))
        assert time.monotonic() - start >= 0.3
    assert json.loads(body)["object"] == "chat.completion"


def _arrivals(srv: ServerThread, **params: Any) -> list[float]:
    """When each content chunk of a token_rate stream arrived, from the role chunk."""
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, "token_rate", **params), STREAM))
        raw.head()
        raw.sock.settimeout(2)
        data, times, start = raw.buffer, [], time.monotonic()
        while b"[DONE]" not in data:
            more = raw.sock.recv(65536)
            assert more
            data += more
            times.append(time.monotonic() - start)
    return times


def test_token_rate_and_jitter(srv: ServerThread) -> None:
    start = time.monotonic()
    _, _, body = exchange(srv, "token_rate", STREAM, tps=40, tokens=8)
    elapsed = time.monotonic() - start
    assert content(body).startswith("echo: hello")
    assert 8 / 40 <= elapsed < 8 / 40 + 0.4
    start = time.monotonic()
    exchange(srv, "token_rate", CHAT, tps=40, tokens=8)  # non-stream: the same total wait
    assert time.monotonic() - start >= 8 / 40
    jittered = _arrivals(srv, tps=20, jitter=0.9, seed=3, tokens=6)
    gaps = [b - a for a, b in itertools.pairwise(jittered)]
    assert max(gaps) - min(gaps) > 0.02  # not steady
    assert jittered[-1] < 6 * 0.05 * 1.9 + 0.3


def test_every_fault_has_a_wire_test() -> None:
    """Each catalogue fault is driven by name in this file, test_server.py or
    test_peers.py."""
    from pathlib import Path

    from fault_server import FAULTS

    here = Path(__file__)
    others = ("test_server.py", "test_peers.py")
    text = "".join((here.parent / name).read_text() for name in others) + here.read_text()
    missing = [name for name in FAULTS if f'"{name}"' not in text]
    assert missing == []


def test_raw_socket_errors_are_not_reported_as_server_errors(own: ServerThread) -> None:
    """A client that resets mid-stream of every new fault leaves nothing open."""
    for fault in ("endless_body", "endless_line", "sse_pings", "done_then_hold", "half_close"):
        for payload in (CHAT, STREAM):
            sock = socket.create_connection(address(own.base_url), timeout=2)
            try:
                sock.sendall(request(chat_path(own, fault, hold=5), payload))
                sock.recv(100)
            finally:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()
    deadline = time.monotonic() + 3
    while own.stats().connections_open and time.monotonic() < deadline:
        time.sleep(0.01)
    assert own.stats().connections_open == 0
    outcomes = {r.outcome for c in own.journal() for r in c.requests}
    assert outcomes == {"client_reset"}  # the reset is the client's, recorded as such


def test_holds_many_stalled_connections_and_stays_responsive(own: ServerThread) -> None:
    """A small version of benchmarks/fault_server_bench.py: 500 held stalls on raw
    sockets, bounded in count and time."""
    host, port = address(own.base_url)
    raw = request(chat_path(own, "stall_headers", hold=5), CHAT)
    socks = []
    try:
        for _ in range(500):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.settimeout(2)
            sock.connect((host, port))
            sock.sendall(raw)
        deadline = time.monotonic() + 10
        while own.stats().connections_open < 500 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert own.stats().connections_open == 500
        start = time.monotonic()
        assert httpx.get(own.url() + "/models").status_code == 200
        assert time.monotonic() - start < 0.5
    finally:
        for sock in socks:
            sock.close()
    deadline = time.monotonic() + 5
    while own.stats().connections_open and time.monotonic() < deadline:
        time.sleep(0.02)
    assert own.stats().connections_open == 0
