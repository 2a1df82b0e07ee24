"""A call prepared by a resource method, and the three ways openai users run it.

``await client.chat.completions.create(...)``: the typed result.
``await client.chat.completions.with_raw_response.create(...)``: a `RawResponse` with the
status and headers; ``.parse()`` gives the typed result (openai's ``LegacyAPIResponse``).
``async with client.chat.completions.with_streaming_response.create(...) as r``: a
`StreamingResponse`; ``await r.parse()`` reads the body, leaving the block releases it.

Each is the same engine call under the same bounds; only what the caller gets differs.
"""

from __future__ import annotations

import codecs
import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

import httpx

from . import _exceptions as exc
from ._config import UNSET, Unset
from ._engine import Incoming
from ._policies import Retry
from ._request import is_omitted

__all__ = [
    "DEFAULT_PER_CALL",
    "PerCall",
    "Prepared",
    "RawResponse",
    "Sender",
    "StreamingResponse",
    "raw_wrapper",
]

R = TypeVar("R")


class Sender(Protocol):
    """What a resource (``chat.completions``, ``models``, ``embeddings``) needs of its
    client: send a prepared call through the engine, or send it and convert the answer.
    `Client` is the one implementation; resources depend on this, not on `Client`, so
    the client can build its resources without an import circle."""

    async def _send(
        self, method: bytes, path: str, body: dict[str, Any] | None, opts: PerCall, *, stream: bool
    ) -> Incoming: ...

    async def _run(self, prepared: Prepared[R]) -> R: ...


@dataclasses.dataclass(frozen=True, slots=True)
class PerCall:
    """The per-call arguments every method takes besides its own parameters.

    ``agent`` and ``labels`` are checked here, for every method; ``timeout`` when it is
    resolved against the client's bounds (`_faces._compat.timeouts_from`), and ``retry``
    by the engine, which every face reaches (an omitted one is `UNSET`: the client's policy).

    Raises:
        InvalidRequestError: an ``agent`` that is not a str, or ``labels`` that do not map
            str to str.
    """

    timeout: object = UNSET
    retry: Retry | Unset | None = UNSET
    agent: str | None = None
    labels: Mapping[str, str] | None = None
    extra_headers: Mapping[str, str | None] | None = None
    extra_query: Mapping[str, object] | None = None

    def __post_init__(self) -> None:
        if self.agent is not None and not isinstance(self.agent, str):
            raise exc.InvalidRequestError(f"agent must be a str or None, got {self.agent!r}")
        labels = self.labels
        if labels is not None and (
            not isinstance(labels, Mapping)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
        ):
            raise exc.InvalidRequestError(f"labels must map str to str, got {labels!r}")

    @classmethod
    def pop(cls, params: dict[str, Any]) -> PerCall:
        """Take the per-call arguments out of a method's keyword arguments.

        A call that passes none of them gets the one shared default (frozen): one object
        less per call in flight for the garbage collector to walk (thousands may be).
        """
        if params.keys().isdisjoint(_PER_CALL):
            return DEFAULT_PER_CALL
        retry = params.pop("retry", UNSET)
        return cls(
            timeout=params.pop("timeout", UNSET),
            retry=UNSET if is_omitted(retry) else retry,
            agent=params.pop("agent", None),
            labels=params.pop("labels", None),
            extra_headers=params.pop("extra_headers", None),
            extra_query=params.pop("extra_query", None),
        )


_PER_CALL = frozenset(f.name for f in dataclasses.fields(PerCall))
DEFAULT_PER_CALL = PerCall()


@dataclasses.dataclass(frozen=True, slots=True)
class Prepared(Generic[R]):
    """One call, ready to send: the request, and how its response becomes the result."""

    method: bytes
    path: str
    body: dict[str, Any] | None
    opts: PerCall
    stream: bool
    convert: Callable[[Incoming], Awaitable[R]]


class RawResponse(Generic[R]):
    """What ``with_raw_response`` methods return: status, headers, and the parsed result."""

    def __init__(self, incoming: Incoming, result: R) -> None:
        self.status_code = incoming.status
        self.headers = httpx.Headers(incoming.headers)
        self.request_id = incoming.header("x-request-id")  # the server's, as in openai
        self.stallproof_request_id = incoming.call.request_id
        self._result = result

    def parse(self) -> R:
        """The typed result (an `AsyncStream` for ``stream=True``: iterate or close it)."""
        return self._result


class StreamingResponse(Generic[R]):
    """What ``with_streaming_response`` methods return: an async context manager whose
    value has the status and headers at once, then ``await parse()`` for the result, or
    the body as openai's streaming response gives it: ``iter_bytes()``, ``iter_text()``,
    ``iter_lines()``, ``read()``, ``text()``, ``json()`` (one of these, once).

    Leaving the block releases the connection, whether or not the body was read.
    """

    def __init__(self, client: Sender, prepared: Prepared[R]) -> None:
        self._client = client
        self._prepared = prepared
        self._incoming: Incoming | None = None
        self._result: R | None = None
        self._consumed = False
        self.status_code = 0
        self.headers = httpx.Headers()
        self.request_id: str | None = None

    async def __aenter__(self) -> StreamingResponse[R]:
        p = self._prepared
        self._incoming = await self._client._send(p.method, p.path, p.body, p.opts, stream=p.stream)
        self.status_code = self._incoming.status
        self.headers = httpx.Headers(self._incoming.headers)
        self.request_id = self._incoming.header("x-request-id")
        return self

    async def parse(self) -> R:
        """Read the body (under the call's bounds) into the typed result; once."""
        incoming = self._open("parse")
        if self._result is None:
            if self._consumed:
                raise RuntimeError("parse() after the body was read as bytes: choose one")
            self._result = await self._prepared.convert(incoming)
        return self._result

    # -- the body as openai's streaming response reads it ------------------------------------

    async def iter_bytes(self, chunk_size: int | None = None) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive (``chunk_size``: in pieces of that size, the
        last one shorter), each read under the call's bounds; once."""
        incoming = self._open("iter_bytes")
        if self._consumed or self._result is not None:
            raise RuntimeError("the body was already read: iter_*(), read() or parse() once")
        if chunk_size is not None and (
            isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
        ):
            raise exc.InvalidRequestError(f"chunk_size must be an int >= 1, got {chunk_size!r}")
        self._consumed = True
        pending = bytearray()
        async for part in incoming.body.aiter_bytes():
            if chunk_size is None:
                yield part
                continue
            pending += part
            while len(pending) >= chunk_size:
                yield bytes(pending[:chunk_size])
                del pending[:chunk_size]
        if pending:
            yield bytes(pending)

    async def iter_text(self, chunk_size: int | None = None) -> AsyncIterator[str]:
        """The body as text (its charset, else UTF-8), decoded incrementally."""
        decoder = codecs.getincrementaldecoder(self._charset())(errors="replace")
        async for part in self.iter_bytes(chunk_size):
            text = decoder.decode(part)
            if text:
                yield text
        tail = decoder.decode(b"", final=True)
        if tail:
            yield tail

    async def iter_lines(self) -> AsyncIterator[str]:
        """The body's lines, without their line endings (``\n``, ``\r\n`` or ``\r``)."""
        pending = ""
        async for text in self.iter_text():
            pending += text
            lines = pending.splitlines(keepends=True)
            pending = ""
            if lines and not lines[-1].endswith(("\n", "\r")):
                pending = lines.pop()
            elif lines and lines[-1].endswith("\r"):
                pending = lines.pop()  # \r may be the first half of \r\n
            for line in lines:
                yield line.rstrip("\r\n")
        if pending:
            yield pending.rstrip("\r\n")

    async def read(self) -> bytes:
        """The whole body, read under the call's bounds and its size cap."""
        return b"".join([part async for part in self.iter_bytes()])

    async def text(self) -> str:
        """The whole body as text."""
        return (await self.read()).decode(self._charset(), errors="replace")

    async def json(self) -> Any:
        """The whole body parsed as JSON."""
        try:
            return json.loads(await self.read())
        except ValueError as e:
            raise exc.InvalidRequestError(f"the body is not JSON: {e}") from None

    def _open(self, method: str) -> Incoming:
        if self._incoming is None:
            raise RuntimeError(f"{method}() is only available inside `async with`")
        return self._incoming

    def _charset(self) -> str:
        charset = httpx.Headers(self.headers).get("content-type", "")
        for part in charset.split(";")[1:]:
            name, _, value = part.strip().partition("=")
            if name.lower() == "charset" and value:
                try:
                    return codecs.lookup(value.strip('"')).name
                except LookupError:
                    break
        return "utf-8"

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._incoming is not None:
            closer = getattr(self._result, "aclose", None)
            if closer is not None:
                await closer()
            await self._incoming.body.aclose()


def raw_wrapper(
    client: Sender, prepare: Callable[..., Prepared[R]]
) -> Callable[..., Awaitable[RawResponse[R]]]:
    """``prepare``'s method as ``with_raw_response`` exposes it."""

    async def run(**params: Any) -> RawResponse[R]:
        p = prepare(**params)
        incoming = await client._send(p.method, p.path, p.body, p.opts, stream=p.stream)
        return RawResponse(incoming, await p.convert(incoming))

    return run


def streaming_wrapper(
    client: Sender, prepare: Callable[..., Prepared[R]]
) -> Callable[..., StreamingResponse[R]]:
    """``prepare``'s method as ``with_streaming_response`` exposes it."""

    def run(**params: Any) -> StreamingResponse[R]:
        return StreamingResponse(client, prepare(**params))

    return run
