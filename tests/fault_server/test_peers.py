"""What peers (Toxiproxy and co.) offer, checked on the wire: refused connections, the
slicer, a token-bucket rate limiter, faults under TLS with a handshake that never ends, and
record/replay of a real upstream through proxy mode.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

import fault_server
from fault_server import FAULTS, FaultServer, RecordingError, ServerThread
from fault_server._wire_tls import TLS_SUPPORTED, _with_openssl

from ..support.timing import MARGIN
from ..support.wire import (
    CHAT,
    ROOT,
    STREAM,
    MessagesArgs,
    Raw,
    address,
    chat_path,
    dechunk,
    request,
)

pytestmark = pytest.mark.usefixtures("no_server_errors")

MESSAGES: MessagesArgs = {
    "model": "claude-test",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "hello brave new world"}],
}


needs_tls = pytest.mark.skipif(not TLS_SUPPORTED, reason="the TLS listener needs Python 3.11+")


@pytest.fixture
def tls_server() -> Iterator[ServerThread]:
    if not TLS_SUPPORTED:
        pytest.skip("the TLS listener needs Python 3.11+")
    with fault_server.running(port=0, max_hold=5.0, tls=True) as server:
        yield server


def trusting(server: ServerThread) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=server.tls_cert)


# -- refused ---------------------------------------------------------------------------


def test_refused_url_refuses_at_once(srv: ServerThread) -> None:
    start = time.monotonic()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address(srv.refused_url), timeout=3)
    assert time.monotonic() - start < 0.5


def test_refuse_scenario_resets_before_reading_then_serves(own: ServerThread) -> None:
    own.scenario("refuse", times=1)
    # The RST may come before connect() returns, or at the first send or read.
    with pytest.raises(ConnectionResetError), Raw(own) as raw:
        raw.send(request(chat_path(own), CHAT))
        raw.sock.settimeout(3)
        while raw.sock.recv(65536):
            pass
    with Raw(own) as raw:
        raw.send(request(chat_path(own), CHAT))
        status, _ = raw.head()
    assert status == 200
    first = own.journal()[0]
    assert (first.closed_by, first.how, first.fault) == ("server", "refused", "refuse")
    assert first.requests == ()


def test_refuse_is_connection_level_only(srv: ServerThread) -> None:
    with Raw(srv) as raw:
        raw.send(request(chat_path(srv, "refuse"), CHAT))
        status, _ = raw.head()
    assert status == 400


# -- slicer ----------------------------------------------------------------------------


def test_slicer_sends_small_varied_slices_apart(srv: ServerThread) -> None:
    with Raw(srv) as raw:
        raw.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        path = chat_path(srv, "slicer", size=6, variation=3, interval=0.01)
        raw.send(request(path, CHAT, headers=(("Connection", "close"),)))
        start = time.monotonic()
        reads: list[bytes] = []
        raw.sock.settimeout(5)
        while chunk := raw.sock.recv(65536):
            reads.append(chunk)
        elapsed = time.monotonic() - start
    data = b"".join(reads)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    reply = json.loads(body)
    assert reply["choices"][0]["message"]["content"].startswith("echo: hello")
    slices = len(data) / 9  # at most size + variation bytes each.
    assert len(reads) >= slices / 2  # a busy machine may merge a few, not most.
    assert elapsed >= (slices - 1) * 0.01 * 0.9
    assert min(len(r) for r in reads) <= 9


def test_slicer_stream_reassembles(srv: ServerThread) -> None:
    with openai.OpenAI(
        base_url=srv.url("slicer", size=20, variation=10, interval=0.001), api_key="x"
    ) as client:
        text = "".join(
            chunk.choices[0].delta.content or ""
            for chunk in client.chat.completions.create(
                model="m", messages=CHAT["messages"], stream=True
            )
            if chunk.choices
        )
    assert text == "echo: hello brave new world lorem ipsum dolor"


# -- rate_limit ------------------------------------------------------------------------


def test_rate_limit_is_a_token_bucket(srv: ServerThread, fault_key: str) -> None:
    # One token a second: the three requests must come within a second of the first for
    # the third to find the bucket empty (at 2 a second, a loaded machine took longer).
    url = srv.url("rate_limit", limit=2, rate=1, key=fault_key)
    with httpx.Client(base_url=url, timeout=5) as client:
        answers = [client.post("/chat/completions", json=CHAT) for _ in range(3)]
        time.sleep(1.05)  # one token back (1 a second).
        later = client.post("/chat/completions", json=CHAT)
        other = httpx.post(
            srv.url("rate_limit", limit=2, rate=1, key=fault_key + "-other") + "/chat/completions",
            json=CHAT,
        )
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert [a.headers["x-ratelimit-remaining-requests"] for a in answers] == ["1", "0", "0"]
    assert all(a.headers["x-ratelimit-limit-requests"] == "2" for a in answers)
    refused = answers[2]
    assert refused.headers["retry-after"] == "1"
    assert 500 <= float(refused.headers["retry-after-ms"]) <= 1000
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert later.status_code == 200
    assert other.status_code == 200  # its own bucket.


def test_rate_limit_on_messages_speaks_anthropic(srv: ServerThread, fault_key: str) -> None:
    base = srv.url("rate_limit", limit=1, rate=0.5, key=fault_key).removesuffix("/v1")
    with anthropic.Anthropic(base_url=base, api_key="x", max_retries=0) as client:
        raw = client.messages.with_raw_response.create(**MESSAGES)
        with pytest.raises(anthropic.RateLimitError) as caught:
            client.messages.create(**MESSAGES)
    assert raw.headers["anthropic-ratelimit-requests-limit"] == "1"
    assert raw.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert caught.value.response.headers["retry-after"] == "2"


def test_rate_limit_is_honoured_by_the_openai_sdk(srv: ServerThread, fault_key: str) -> None:
    url = srv.url("rate_limit", limit=1, rate=4, key=fault_key)
    with openai.OpenAI(base_url=url, api_key="x", max_retries=3) as client:
        start = time.monotonic()
        for _ in range(3):
            client.chat.completions.create(model="m", messages=CHAT["messages"])
        elapsed = time.monotonic() - start
    assert elapsed >= 0.4  # two waits of ~0.25 s, told by retry-after-ms.
    verdict = srv.verdict(fault_key)
    assert verdict.attempts >= 5


# -- TLS -------------------------------------------------------------------------------


def test_tls_listener_serves_every_fault(tls_server: ServerThread) -> None:
    url = tls_server.tls_url()
    assert url.startswith("https://")
    with httpx.Client(verify=trusting(tls_server), timeout=5) as client:
        models = client.get(url + "/models")
        status = client.post(
            tls_server.tls_url("status", code=503) + "/chat/completions", json=CHAT
        )
        start = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            client.post(
                tls_server.tls_url("stall_headers") + "/chat/completions",
                json=CHAT,
                timeout=httpx.Timeout(5, read=0.3),
            )
        elapsed = time.monotonic() - start
    assert models.status_code == 200
    assert models.json()["object"] == "list"
    assert status.status_code == 503
    assert 0.3 <= elapsed < 1.5
    with pytest.raises(httpx.ConnectError):  # an untrusted certificate is refused.
        httpx.get(url + "/models", timeout=5)


def test_openai_sdk_streams_over_tls(tls_server: ServerThread) -> None:
    http = httpx.Client(verify=trusting(tls_server))
    # openai types http_client as httpx2's; it takes an httpx one too (its legacy path).
    with openai.OpenAI(base_url=tls_server.tls_url(), api_key="x", http_client=http) as client:  # type: ignore[arg-type]
        chunks = list(
            client.chat.completions.create(model="m", messages=CHAT["messages"], stream=True)
        )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).startswith(
        "echo:"
    )


def test_tls_stall_never_finishes_the_handshake(tls_server: ServerThread) -> None:
    tls_server.scenario("tls_stall", times=1, hold=1.0)
    host, port = address(tls_server.tls_url())
    start = time.monotonic()
    with pytest.raises(httpx.ConnectTimeout):
        httpx.get(
            tls_server.tls_url() + "/models",
            verify=trusting(tls_server),
            timeout=httpx.Timeout(5, connect=0.3),
        )
    elapsed = time.monotonic() - start
    assert 0.3 <= elapsed < 1.0
    # On the wire: TCP is accepted, the ClientHello gets no answer, the hold closes it.
    tls_server.scenario("tls_stall", times=1, hold=0.5)
    with socket.create_connection((host, port), timeout=3) as sock:
        context = trusting(tls_server)
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = context.wrap_bio(incoming, outgoing, server_hostname=host)
        with pytest.raises(ssl.SSLWantReadError):
            tls.do_handshake()
        sock.sendall(outgoing.read())  # the ClientHello.
        start = time.monotonic()
        sock.settimeout(3)
        assert sock.recv(65536) == b""  # nothing, then the server's close.
        assert 0.4 <= time.monotonic() - start < 1.5
    # The next connection shakes hands and is served.
    answer = httpx.get(tls_server.tls_url() + "/models", verify=trusting(tls_server), timeout=5)
    assert answer.status_code == 200


def test_tls_urls_need_tls(srv: ServerThread) -> None:
    with pytest.raises(RuntimeError, match="tls=True"):
        srv.tls_url()


# -- record and replay -------------------------------------------------------------------


def test_record_then_replay_with_faults(own: ServerThread, tmp_path: Path) -> None:
    tape = tmp_path / "tape.jsonl"
    with (
        fault_server.running(port=0, max_hold=5.0, upstream=own.url(), record=tape) as proxy,
        httpx.Client(base_url=proxy.url(), timeout=5) as client,
    ):
        whole = client.post("/chat/completions", json=CHAT).json()
        streamed = client.post("/chat/completions", json=STREAM).content
        messages = client.post("/messages", json={**MESSAGES, "stream": True}).content
        # A stream the fault stopped reading early is not recorded.
        stalled = {"X-Fault": "sse_stall;after=1;hold=0.2"}
        with pytest.raises(httpx.RemoteProtocolError):
            client.post("/chat/completions", json=STREAM, headers=stalled)
    lines = [json.loads(line) for line in tape.read_text().splitlines()]
    assert [(e["path"], e["stream"]) for e in lines] == [
        ("/v1/chat/completions", False),
        ("/v1/chat/completions", True),
        ("/v1/messages", True),
    ]
    with fault_server.running(port=0, max_hold=5.0, replay=tape) as replay:
        assert replay.upstream == f"replay:{tape}"
        with httpx.Client(base_url=replay.url(), timeout=5) as client:
            again = client.post("/chat/completions", json=CHAT).json()
            again_streamed = client.post("/chat/completions", json=STREAM).content
            again_messages = client.post("/messages", json={**MESSAGES, "stream": True}).content
            missing = client.post("/chat/completions", json={**CHAT, "model": "other"})
        with Raw(replay) as raw:  # a fault applies to the recorded stream.
            raw.send(request(chat_path(replay, "sse_stall", after=1, hold=0.3), STREAM))
            status, _ = raw.head()
            rest, eof = raw.recv_for(1.0)
    assert again == whole  # the recorded id, created and content: not made up anew.
    assert again_streamed == streamed
    assert again_messages == messages
    assert missing.status_code == 404
    assert "no non-streamed answer recorded" in missing.json()["error"]["message"]
    assert status == 200 and eof
    body, ended = dechunk(rest)
    assert not ended
    assert body == b"".join(streamed.split(b"\n\n")[i] + b"\n\n" for i in range(2))


def test_replay_refuses_a_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"method": "POST"}\n')
    server = FaultServer(replay=bad)
    with pytest.raises(RecordingError, match="line 1"), fault_server.running(replay=bad):
        pass
    assert server.upstream == f"replay:{bad}"
    with pytest.raises(ValueError, match="record= needs upstream"):
        FaultServer(record=bad)


# -- the CLI -------------------------------------------------------------------------------


def cli(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")])}
    return subprocess.Popen(
        [sys.executable, "-m", "fault_server", "--port", "0", "--max-hold", "2", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
@needs_tls
def test_cli_tls_and_replay(tmp_path: Path) -> None:
    proc = cli("--tls")
    try:
        assert proc.stdout is not None
        assert proc.stderr is not None
        ready, _, _ = select.select([proc.stdout], [], [], 15)
        assert ready, "the CLI printed no URL within 15 s"
        lines = [proc.stdout.readline().strip() for _ in range(3)]
        cert = proc.stderr.readline().strip().rpartition(": ")[2]
        assert lines[2].startswith("https://127.0.0.1:")
        context = ssl.create_default_context(cafile=cert)
        assert httpx.get(lines[2] + "/models", verify=context, timeout=5).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        proc.kill()
        proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    proc = cli("--replay", str(bad))
    try:
        _, err = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == 1
    assert "line 1 of replay file" in err


def test_every_fault_under_tls_ends_cleanly(tls_server: ServerThread) -> None:
    """Every request-level fault, stream and not, over TLS at once: each ends within its
    hold, and the autouse fixture sees no server error (half_close, reset and the cuts
    work on the TCP socket beneath the TLS)."""
    host, port = address(tls_server.tls_url())
    context = trusting(tls_server)
    small = {"size": 4096, "interval": 0.01, "wait": 0.01, "tps": 200, "bytes": 300}

    async def one(fault: str, payload: object) -> None:
        params = {p.name: small[p.name] for p in FAULTS[fault].params if p.name in small}
        reader, writer = await asyncio.open_connection(host, port, ssl=context)
        try:
            path = chat_path(tls_server, fault, hold=0.3, **params)
            writer.write(request(path, payload, headers=(("Connection", "close"),)))
            with pytest.raises((OSError, asyncio.IncompleteReadError)):
                await asyncio.wait_for(reader.readexactly(1 << 24), 3)
        finally:
            writer.transport.abort()

    async def main() -> None:
        await asyncio.gather(
            *(
                one(name, payload)
                for name, info in FAULTS.items()
                if info.scope == "request"
                for payload in (CHAT, STREAM)
            )
        )

    start = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - start < 4


def test_half_close_under_tls_sends_a_fin(tls_server: ServerThread) -> None:
    """asyncio cannot half-close TLS: the TCP socket beneath is shut down instead, so the
    client reads the partial answer, then an end (without close_notify) long before hold."""
    host, port = address(tls_server.tls_url())
    context = trusting(tls_server)
    with (
        socket.create_connection((host, port), timeout=3) as plain,
        context.wrap_socket(plain, server_hostname=host) as sock,
    ):
        sock.sendall(request(chat_path(tls_server, "half_close", after=1, hold=3), STREAM))
        data = b""
        start = time.monotonic()
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ssl.SSLEOFError:
            pass  # the end came without close_notify, as it should.
        elapsed = time.monotonic() - start
    assert data.startswith(b"HTTP/1.1 200 ")
    assert b'"content":"echo:"' in data
    assert elapsed < 1.5


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl command")
def test_the_openssl_fallback_makes_a_certificate_clients_trust(tmp_path: Path) -> None:
    """Without the cryptography package the certificate comes from the openssl command:
    a real handshake over a socket pair verifies it for 127.0.0.1."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    _with_openssl("127.0.0.1", cert, key)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    client = ssl.create_default_context(cafile=str(cert))
    left, right = socket.socketpair()
    with left, right:
        left.settimeout(5)
        right.settimeout(5)
        done: list[BaseException | None] = []

        def serve() -> None:
            try:
                with server.wrap_socket(right, server_side=True) as tls:
                    tls.sendall(b"ok")
                done.append(None)
            except BaseException as exc:  # reported below, never lost in the thread.
                done.append(exc)

        thread = threading.Thread(target=serve)
        thread.start()
        with client.wrap_socket(left, server_hostname="127.0.0.1") as tls:
            assert tls.recv(2) == b"ok"
        thread.join(5)
    assert done == [None]


@pytest.mark.slow
def test_replay_with_the_recorded_timing_and_a_speed(own: ServerThread, tmp_path: Path) -> None:
    """A stream recorded at 5 tokens a second replays at that pace, or faster by the speed,
    or at once without one."""
    tape = tmp_path / "tape.jsonl"
    paced = own.url("token_rate", tps=5)  # an upstream at 8 chunks, 0.2 s apart: ~1.6 s.
    slow = {**CHAT, "messages": [{"role": "user", "content": "slowly"}]}

    def both(base_url: str) -> tuple[float, bytes, float, Any]:
        """The stream and the whole answer, asked at once (each timed on its own): their
        waits overlap, as nothing of one depends on the other."""

        def ask(payload: dict[str, Any]) -> tuple[float, httpx.Response]:
            with httpx.Client(base_url=base_url, timeout=10) as client:
                start = time.monotonic()
                answer = client.post("/chat/completions", json=payload)
                return time.monotonic() - start, answer

        with ThreadPoolExecutor(2) as pool:
            (took, streamed), (whole_took, whole) = pool.map(ask, (STREAM, slow))
        return took, streamed.content, whole_took, whole.json()

    with fault_server.running(port=0, max_hold=10.0, upstream=paced, record=tape) as proxy:
        _, streamed, _, whole = both(proxy.url())
    lines = [json.loads(line) for line in tape.read_text().splitlines()]
    (stream_line,) = [line for line in lines if line["stream"]]
    (whole_line,) = [line for line in lines if not line["stream"]]
    times = stream_line["timing"]["frames"]
    assert len(times) == len(stream_line["frames"])
    assert times == sorted(times) and times[-1] >= 1.4
    assert whole_line["timing"]["body"] >= 1.4

    def replayed(speed: float | None) -> tuple[float, float, bytes]:
        with fault_server.running(port=0, max_hold=10.0, replay=tape, replay_speed=speed) as srv:
            took, body, whole_took, answer = both(srv.url())
        assert answer == whole
        return took, whole_took, body

    as_recorded, whole_as_recorded, body = replayed(1.0)
    assert body == streamed
    assert 1.4 <= as_recorded < 1.6 + MARGIN + 0.5
    assert 1.4 <= whole_as_recorded < 1.6 + MARGIN + 0.5
    faster, whole_faster, _ = replayed(4.0)
    assert 0.35 <= faster < 0.4 + MARGIN + 0.3
    assert 0.35 <= whole_faster < 0.4 + MARGIN + 0.3
    at_once, whole_at_once, _ = replayed(None)
    assert at_once < 0.3 + MARGIN and whole_at_once < 0.3 + MARGIN


def test_replay_speed_is_checked() -> None:
    with pytest.raises(ValueError, match="replay_speed"):
        FaultServer(replay_speed=2.0)  # without replay=
    with pytest.raises(ValueError, match="replay_speed"):
        FaultServer(replay="x.jsonl", replay_speed=0)
