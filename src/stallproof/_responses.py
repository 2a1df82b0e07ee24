"""``client.responses``: openai's Responses API, under stallproof's bounds.

``create`` sends ``POST /responses`` and returns openai's ``Response``, validated, or with
``stream=True`` a `ResponseStream` of openai's typed events. The bounds are the chat call's:
``first_token`` until the first content event (text, reasoning, tool-call arguments), then
``idle`` between content events; the lifecycle events (``response.created``,
``response.in_progress``...) are not content. A stream ends after its terminal event
(``response.completed``, ``failed``, ``incomplete``), even on a server that holds the socket
open after it. ``with_raw_response`` and ``with_streaming_response`` work as for chat.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, overload

from openai import NotGiven, Omit
from openai.types.responses import Response
from openai.types.responses.response_create_params import ResponseCreateParamsBase
from typing_extensions import Unpack

from . import _exceptions as exc
from ._completions import CallArgs
from ._engine import Incoming
from ._raw import (
    PerCall,
    Prepared,
    RawResponse,
    Sender,
    StreamingResponse,
    raw_wrapper,
    streaming_wrapper,
)
from ._request import check_known, is_omitted, pop_stream
from ._results import read_result, refuse
from ._stream import ResponseStream

__all__ = ["ResponseArgs", "Responses"]


class ResponseArgs(ResponseCreateParamsBase, CallArgs, total=False):
    """openai's ``responses.create`` arguments (but ``stream``) and `CallArgs`."""


_KNOWN = frozenset(ResponseArgs.__annotations__) | {"stream"}


async def _response(incoming: Incoming) -> Response:
    return await read_result(incoming, Response)


async def _open_stream(incoming: Incoming) -> ResponseStream:
    if not incoming.body.is_stream:
        raise await refuse(incoming, "asked for a stream but the server answered with a JSON body")
    return ResponseStream(incoming)


class Responses:
    """``client.responses``."""

    def __init__(self, client: Sender) -> None:
        self._client = client
        self.with_raw_response = RawResponses(self)
        self.with_streaming_response = StreamingResponses(self)

    def _prepare(self, params: dict[str, Any]) -> Prepared[Any]:
        check_known("create", params, _KNOWN)
        stream = pop_stream(params)
        opts = PerCall.pop(params)
        extra_body: Mapping[str, Any] | None = params.pop("extra_body", None)
        model = params.get("model")
        # A stored prompt (``prompt=``) may name the model; without one, it is required.
        if "prompt" not in params and (not isinstance(model, str) or not model):
            raise exc.InvalidRequestError(f"model must be a non-empty str, got {model!r}")
        body = {k: v for k, v in params.items() if not is_omitted(v)}
        if stream:
            body["stream"] = True
        if extra_body:
            body.update(extra_body)
        return Prepared(
            b"POST", "responses", body, opts, stream, _open_stream if stream else _response
        )

    @overload
    async def create(
        self,
        *,
        stream: Literal[False] | NotGiven | Omit | None = ...,
        **params: Unpack[ResponseArgs],
    ) -> Response: ...

    @overload
    async def create(
        self, *, stream: Literal[True], **params: Unpack[ResponseArgs]
    ) -> ResponseStream: ...

    @overload
    async def create(
        self, *, stream: bool, **params: Unpack[ResponseArgs]
    ) -> Response | ResponseStream: ...

    async def create(
        self,
        *,
        stream: bool | NotGiven | Omit | None = False,
        **params: Unpack[ResponseArgs],
    ) -> Response | ResponseStream:
        """Create a model response; with ``stream=True``, a `ResponseStream` of events.

        Takes openai's keyword arguments (``model``, ``input``, ``instructions``,
        ``tools``...) and `CallArgs` (``timeout``, ``retry``, ``agent``, ``labels``...).

        Returns:
            ``openai.types.responses.Response``, validated; or a `ResponseStream`.

        Raises:
            TypeError: an argument openai does not have.
            TimeoutException: a bound fired (the subclass names it).
            StreamErrorEvent: the stream carried an ``error`` event.
            TransportError, ProtocolError, APIStatusError: see the exception tree.
            InvalidRequestError: the arguments cannot be sent.
        """
        run = self._client._run(self._prepare({"stream": stream, **params}))
        # Neither the arguments nor the prepared call are held while it runs (thousands
        # may be in flight): the request has their values.
        del params
        result: Response | ResponseStream = await run
        return result


class RawResponses:
    """``client.responses.with_raw_response``: `create` returning a `RawResponse`."""

    def __init__(self, responses: Responses) -> None:
        self._responses = responses
        self._run = raw_wrapper(responses._client, self._prepare)

    def _prepare(self, **params: Any) -> Prepared[Any]:
        return self._responses._prepare(params)

    async def create(
        self, *, stream: bool | NotGiven | Omit | None = False, **params: Unpack[ResponseArgs]
    ) -> RawResponse[Any]:
        """`Responses.create`, with the status and headers: ``.parse()`` is the result."""
        return await self._run(stream=stream, **params)


class StreamingResponses:
    """``client.responses.with_streaming_response``."""

    def __init__(self, responses: Responses) -> None:
        self._responses = responses
        self._run = streaming_wrapper(responses._client, self._prepare)

    def _prepare(self, **params: Any) -> Prepared[Any]:
        return self._responses._prepare(params)

    def create(
        self, *, stream: bool | NotGiven | Omit | None = False, **params: Unpack[ResponseArgs]
    ) -> StreamingResponse[Any]:
        """`Responses.create` as an async context manager; ``await r.parse()``."""
        return self._run(stream=stream, **params)
