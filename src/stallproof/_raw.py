"""A call prepared by a resource method, and the three ways openai users run it.

``await client.chat.completions.create(...)``: the typed result.
``await client.chat.completions.with_raw_response.create(...)``: a `RawResponse` with the
status and headers; ``.parse()`` gives the typed result (openai's ``LegacyAPIResponse``).
``async with client.chat.completions.with_streaming_response.create(...) as r``: a
`StreamingResponse`; ``await r.parse()`` reads the body, leaving the block releases it.

Each is the same engine call under the same bounds; only what the caller gets differs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

import httpx

from . import _exceptions as exc
from ._config import UNSET, Unset
from ._engine import Incoming
from ._policies import Retry
from ._request import is_omitted

__all__ = ["PerCall", "Prepared", "RawResponse", "Sender", "StreamingResponse", "raw_wrapper"]

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
        """Take the per-call arguments out of a method's keyword arguments."""
        retry = params.pop("retry", UNSET)
        return cls(
            timeout=params.pop("timeout", UNSET),
            retry=UNSET if is_omitted(retry) else retry,
            agent=params.pop("agent", None),
            labels=params.pop("labels", None),
            extra_headers=params.pop("extra_headers", None),
            extra_query=params.pop("extra_query", None),
        )


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
    value has the status and headers at once, and ``await parse()`` for the result.

    Leaving the block releases the connection, whether or not the body was read.
    """

    def __init__(self, client: Sender, prepared: Prepared[R]) -> None:
        self._client = client
        self._prepared = prepared
        self._incoming: Incoming | None = None
        self._result: R | None = None
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
        if self._incoming is None:
            raise RuntimeError("parse() is only available inside `async with`")
        if self._result is None:
            self._result = await self._prepared.convert(self._incoming)
        return self._result

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
