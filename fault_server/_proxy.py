"""Proxy mode: the healthy answer comes from a real OpenAI-compatible server.

`Upstream` holds one httpx client for the server's life. For each request whose fault needs
the normal answer, an `UpstreamSource` forwards the request (method, path under ``/v1``,
body, and the client's headers but hop-by-hop ones and ours) and hands the response to the
fault: an SSE stream as `UpstreamFrames`, read event by event as the upstream sends them,
anything else as a `Whole`. A fault that never needs the answer (a stall, a status) never
contacts the upstream.

Bounds: connecting and sending are bounded by httpx timeouts (10 s); reading the answer is
bounded by the fault's ``hold``, like everything a fault does. An upstream that cannot be
reached gives the client a 502 with an OpenAI-shaped error that says why.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from ._answer import Frames, UpstreamBroken, frame_json
from ._json_depth import loads as loads_limited
from ._openai import Api, ChatRequest, Whole, chat_chunk, error
from ._proxy_recording import Recorder, request_key
from ._wire_exchange import Source

__all__ = ["Upstream", "UpstreamFrames", "UpstreamSource", "check_upstream_url"]

_TIMEOUT = httpx.Timeout(connect=10.0, read=None, write=10.0, pool=10.0)
_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
# Request headers never forwarded: hop-by-hop ones, those httpx sets, and our own.
_DROP = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
        "proxy-authorization",
        "proxy-connection",
        "accept-encoding",
        "x-fault",
        "x-fault-key",
    }
)
# Response headers passed back to the client (content-type and framing are ours to set).
_PASS = frozenset(
    {
        "retry-after",
        "retry-after-ms",
        "x-should-retry",
        "openai-model",
        "openai-organization",
        "openai-processing-ms",
        "openai-version",
    }
)
_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r")


def check_upstream_url(url: str) -> str:
    """``url`` without a trailing slash, if it is an absolute http(s) URL.

    Raises:
        ValueError: naming the URL and what is wrong with it.
    """
    if not isinstance(url, str):
        raise ValueError(f"upstream must be an http(s) URL, got {url!r}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"upstream must be an http:// or https:// URL, got {url!r}")
    if parts.query or parts.fragment:
        raise ValueError(f"upstream must not have a query or fragment, got {url!r}")
    return url.rstrip("/")


class Upstream:
    """The real server a proxying `FaultServer` forwards to, e.g. ``http://host:8000/v1``.

    Requests for ``/v1/<rest>`` go to ``<url>/<rest>``: give the URL an OpenAI client would
    use, ``/v1`` included.
    """

    def __init__(self, url: str, record: str | Path | None = None) -> None:
        self.url = check_upstream_url(url)
        self._client: httpx.AsyncClient | None = None
        self._recorder = None if record is None else Recorder(record)

    async def start(self) -> None:
        if self._recorder is not None:
            self._recorder.open()
        # trust_env=False: a test proxy must not itself go through HTTP_PROXY.
        self._client = httpx.AsyncClient(
            timeout=_TIMEOUT, limits=_LIMITS, trust_env=False, follow_redirects=False
        )

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if self._recorder is not None:
            self._recorder.close()
        if client is not None:
            await client.aclose()

    def target(self, path: str, query: str) -> str | None:
        """The upstream URL for our ``path`` (and query), or None if it is not under /v1."""
        if path != "/v1" and not path.startswith("/v1/"):
            return None
        return self.url + path[3:] + (f"?{query}" if query else "")

    def source(
        self,
        method: str,
        url: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        chat: ChatRequest | None,
    ) -> Source:
        if self._client is None:
            raise RuntimeError("the upstream client is not started")
        forwarded = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in headers
            if k.decode("latin-1").lower() not in _DROP
        ]
        forwarded.append(("accept-encoding", "identity"))  # SSE is read as it comes.
        source = UpstreamSource(self._client, method, url, forwarded, body, chat)
        if self._recorder is not None:
            source.record_to(self._recorder, "/v1" + url[len(self.url) :])
        return source


class UpstreamSource:
    """Fetches the answer to one request from the upstream, at most once per kind."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        method: str,
        url: str,
        headers: list[tuple[str, str]],
        body: bytes,
        chat: ChatRequest | None,
    ) -> None:
        self._client = client
        self._method = method
        self._url = url
        self._headers = headers
        self._body = body
        self._chat = chat
        self._responses: list[httpx.Response] = []
        self._frames: list[UpstreamFrames] = []
        self._recorder: Recorder | None = None
        self._path = ""

    def record_to(self, recorder: Recorder, path: str) -> None:
        """Write each complete answer to ``recorder``, as the answer to ``path``."""
        self._recorder, self._path = recorder, path

    async def answer(self, stream: bool) -> Whole | Frames:
        body = self._body
        if self._chat is not None and stream != self._chat.stream:
            body = _with_stream(body, stream)
        request = self._client.build_request(
            self._method, self._url, headers=self._headers, content=body
        )
        sent = time.monotonic()
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            return error(502, f"fault_server proxy: upstream {self._url} failed: {exc!r}")
        self._responses.append(response)
        passed = tuple(
            (k, v)
            for k, v in response.headers.items()
            if k in _PASS or k.startswith(("x-ratelimit-", "anthropic-ratelimit-"))
        )
        content_type = response.headers.get("content-type", "application/json")
        head = time.monotonic() - sent
        if response.status_code == 200 and content_type.startswith("text/event-stream"):
            frames = UpstreamFrames(
                response, response.status_code, passed, self._api or "chat", sent, head
            )
            if self._recorder is not None:
                frames.on_end = partial(self._record, self._key(body, stream), frames)
            self._frames.append(frames)
            return frames
        try:
            data = await response.aread()
        except httpx.HTTPError as exc:
            return error(502, f"fault_server proxy: reading {self._url} failed: {exc!r}")
        whole = Whole(response.status_code, data, content_type, passed)
        if self._recorder is not None:
            timing = {"head": head, "body": time.monotonic() - sent}
            self._recorder.whole(self._key(body, stream), self._api, whole, timing)
        return whole

    def _record(self, key: str, frames: UpstreamFrames, events: list[bytes]) -> None:
        if self._recorder is not None:
            self._recorder.stream(key, frames, events, frames.head, frames.times)

    @property
    def _api(self) -> Api | None:
        return self._chat.api if self._chat is not None else None

    def _key(self, body: bytes, stream: bool) -> str:
        return request_key(self._method, self._path, body, stream)

    async def aclose(self) -> None:
        for frames in self._frames:
            await frames.aclose()
        for response in self._responses:
            await response.aclose()


class UpstreamFrames(Frames):
    """An upstream SSE body cut into events as it arrives; line ends normalised to LF."""

    def __init__(
        self,
        response: httpx.Response,
        status: int,
        headers: tuple[tuple[str, str], ...],
        api: Api = "chat",
        sent: float | None = None,
        head: float = 0.0,
    ) -> None:
        super().__init__(status, headers, api)
        self._chunks: AsyncIterator[bytes] = response.aiter_bytes()
        # When the request went out (monotonic), and each event then came (seconds after).
        self._sent = time.monotonic() if sent is None else sent
        self.head = head
        self.times: list[float] = []
        self._buffer = b""
        self._ended = False
        self._first: dict[str, Any] | None = None
        self._seen: list[bytes] = []
        # Called once with every event, when the stream has ended well (a recording).
        self.on_end: Callable[[list[bytes]], None] | None = None

    async def _next(self) -> bytes | None:
        while True:
            match = _BOUNDARY.search(self._buffer)
            if match is not None:
                event, self._buffer = self._buffer[: match.start()], self._buffer[match.end() :]
                if event.strip():
                    return self._remember(event)
                continue
            if self._ended:
                event, self._buffer = self._buffer, b""
                if event.strip():
                    return self._remember(event)
                on_end, self.on_end = self.on_end, None
                if on_end is not None:
                    on_end(self._seen)
                return None
            try:
                self._buffer += await self._chunks.__anext__()
            except StopAsyncIteration:
                self._ended = True
            except httpx.HTTPError as exc:
                raise UpstreamBroken(f"upstream stream broke off: {exc!r}") from exc

    def _remember(self, event: bytes) -> bytes:
        frame = event.replace(b"\r\n", b"\n").replace(b"\r", b"\n") + b"\n\n"
        if self.on_end is not None:
            self._seen.append(frame)
            self.times.append(time.monotonic() - self._sent)
        if self._first is None:
            data = frame_json(frame)
            if isinstance(data, dict) and "id" in data:
                self._first = data
        return frame

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        return chat_chunk(self._first or {}, delta, finish_reason)

    async def aclose(self) -> None:
        closer = getattr(self._chunks, "aclose", None)
        if closer is not None:
            await closer()


def _with_stream(body: bytes, stream: bool) -> bytes:
    try:
        data = loads_limited(body)
    except ValueError:
        return body
    if not isinstance(data, dict):
        return body
    data["stream"] = stream
    if not stream:
        data.pop("stream_options", None)
    return json.dumps(data).encode()
