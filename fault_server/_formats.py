"""The wire formats served, by path: what each API's requests are and how it answers.

=============================  ======  =================================================
path                           method  API (``ChatRequest.api``)
=============================  ======  =================================================
``/v1/chat/completions``       POST    ``chat``: OpenAI chat completions (`_openai`)
``/v1/messages``               POST    ``messages``: Anthropic Messages (`_anthropic`)
``/v1/responses``              POST    ``responses``: OpenAI Responses (`_responses`)
``/v1/embeddings``             POST    ``embeddings``: OpenAI embeddings (here)
``/v1/models``                 GET     the model list
=============================  ======  =================================================

Faults ask this module for what differs between the formats: the healthy answer, the
keep-alive a server of that API sends (an Anthropic ``ping`` event, else an SSE comment),
how its stream ends, its error shape. Embeddings are never streamed: faults that always
stream send chat chunks there.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
from collections.abc import Mapping
from types import MappingProxyType

from . import _anthropic, _responses
from ._openai import (
    DONE,
    Api,
    ChatRequest,
    EventStream,
    RequestError,
    Whole,
    completion,
    completion_stream,
    error,
    json_bytes,
    load_object,
    parse_chat,
)

__all__ = [
    "ROUTES",
    "api_error",
    "error_event",
    "is_end",
    "keepalive",
    "lenient_request",
    "malformed_event",
    "local_stream",
    "local_whole",
    "made_stream",
    "parse_request",
    "path_error",
    "prologue",
    "route",
]

CHAT = "/v1/chat/completions"
MODELS = "/v1/models"
_APIS: Mapping[str, Api] = MappingProxyType(
    {
        CHAT: "chat",
        "/v1/messages": "messages",
        "/v1/responses": "responses",
        "/v1/embeddings": "embeddings",
    }
)
ROUTES: Mapping[str, str] = MappingProxyType({**dict.fromkeys(_APIS, "POST"), MODELS: "GET"})
_DEFAULT_DIMENSIONS = 16
_MAX_DIMENSIONS = 4096
_MAX_INPUTS = 2048  # OpenAI's own limit on inputs per request.
_KEEPALIVE = b": keep-alive\n\n"


def route(method: str, path: str) -> Whole | None:
    """An error for a path or method we do not serve, else None."""
    wanted = ROUTES.get(path)
    if wanted is None:
        return error(404, f"unknown path {path!r}; served: {', '.join(ROUTES)}")
    if method != wanted:
        return path_error(path, 405, f"{path} takes {wanted}, not {method}")
    return None


def path_error(
    path: str, status: int, message: str, *, code: str | None = None, param: str | None = None
) -> Whole:
    """An error answering a request to ``path``, in the shape its API's clients read:
    Anthropic's ``{"type": "error", "error": {...}}`` on Messages, else OpenAI's (with
    ``code`` and ``param``, which Anthropic's shape has no room for)."""
    return api_error(_APIS.get(path), status, message, code=code, param=param)


def parse_request(path: str, body: bytes) -> ChatRequest | None:
    """The request ``body`` sent to ``path``; None for a path without a body (models).

    Raises:
        RequestError: the body is not a request of that API.
    """
    api = _APIS.get(path)
    if api == "chat":
        return parse_chat(body)
    if api == "messages":
        return _anthropic.parse_messages(body)
    if api == "responses":
        return _responses.parse_responses(body)
    if api == "embeddings":
        return _parse_embeddings(body)
    return None


def lenient_request(path: str, body: bytes) -> ChatRequest | None:
    """The request in ``body``, or None when it is not one we understand (proxy mode)."""
    try:
        return parse_request(path, body)
    except RequestError:
        return None


def local_whole(req: ChatRequest, tokens: int) -> Whole:
    """The healthy non-streamed answer to ``req``, in its API's format."""
    if req.api == "messages":
        return _anthropic.message(req, tokens)
    if req.api == "responses":
        return _responses.response(req, tokens)
    if req.api == "embeddings":
        return _embeddings(req)
    return completion(req, tokens)


def local_stream(req: ChatRequest, tokens: int) -> EventStream | Whole:
    """The healthy streamed answer to ``req``; embeddings, never streamed, answer whole."""
    if req.api == "embeddings":
        return _embeddings(req)
    return made_stream(req, tokens)


def made_stream(req: ChatRequest, tokens: int) -> EventStream:
    """A stream in ``req``'s format (chat chunks for an API that never streams)."""
    if req.api == "messages":
        return _anthropic.message_stream(req, tokens)
    if req.api == "responses":
        return _responses.response_stream(req, tokens)
    return completion_stream(req, tokens)


def api_error(
    api: Api | None,
    status: int,
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
) -> Whole:
    """An error response shaped as ``api``'s clients expect it."""
    if api == "messages":
        return _anthropic.message_error(status, message)
    return error(status, message, code=code, param=param)


def error_event(api: Api | None, message: str, sequence: int = 0) -> bytes:
    """An error sent as an SSE event mid-stream, as ``api`` sends it; ``sequence`` is the
    number of events the stream sent before it (the Responses API numbers its events)."""
    if api == "messages":
        return _anthropic.error_event(message)
    if api == "responses":
        return _responses.error_event(message, sequence)
    return b"event: error\ndata: " + error(500, message).body + b"\n\n"


def malformed_event(api: Api | None) -> bytes:
    """An event whose data is not JSON, named as ``api`` names its events (an Anthropic
    or Responses client drops an unnamed one unread)."""
    name = {"messages": b"content_block_delta", "responses": b"response.output_text.delta"}
    prefix = b"event: " + name[api] + b"\n" if api in name else b""
    return prefix + b"data: {not json\n\n"


def keepalive(api: Api | None) -> bytes:
    """The keep-alive a server of ``api`` sends while it has nothing to say."""
    return _anthropic.PING if api == "messages" else _KEEPALIVE


def prologue(api: Api | None) -> int:
    """How many events open a stream of ``api`` before the first content event."""
    return {"messages": 3, "responses": 4}.get(api or "chat", 1)


def is_end(api: Api | None, frame: bytes) -> bool:
    """Whether ``frame`` is the event that ends a stream of ``api``."""
    if api == "messages":
        return frame.startswith(b"event: message_stop")
    if api == "responses":
        return frame.startswith(b"event: response.completed")
    return frame.strip() == DONE.strip()


def _parse_embeddings(body: bytes) -> ChatRequest:
    data = load_object(body)
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError("'model' must be a non-empty string", "model")
    given = data.get("input")
    if isinstance(given, str):
        inputs: list[str] = [given]
    elif isinstance(given, list) and given and len(given) <= _MAX_INPUTS:
        inputs = [item if isinstance(item, str) else repr(item) for item in given]
        if all(isinstance(item, int) for item in given):  # one input of token ids.
            inputs = [repr(given)]
    else:
        raise RequestError(
            f"'input' must be a string or a list of 1 to {_MAX_INPUTS} inputs", "input"
        )
    dimensions = data.get("dimensions", _DEFAULT_DIMENSIONS)
    if (
        isinstance(dimensions, bool)
        or not isinstance(dimensions, int)
        or not 1 <= dimensions <= _MAX_DIMENSIONS
    ):
        raise RequestError(f"'dimensions' must be an integer in 1..{_MAX_DIMENSIONS}", "dimensions")
    encoding = data.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise RequestError("'encoding_format' must be 'float' or 'base64'", "encoding_format")
    return ChatRequest(
        model=model,
        text=inputs[-1],
        prompt_tokens=sum(len(t.split()) for t in inputs),
        api="embeddings",
        inputs=tuple(inputs),
        dimensions=dimensions,
        base64=encoding == "base64",
    )


def _embeddings(req: ChatRequest) -> Whole:
    data = []
    for index, text in enumerate(req.inputs):
        vector = _vector(text, req.dimensions)
        if req.base64:
            packed = struct.pack(f"<{len(vector)}f", *vector)
            value: object = base64.b64encode(packed).decode("ascii")
        else:
            value = vector
        data.append({"object": "embedding", "index": index, "embedding": value})
    usage = {"prompt_tokens": req.prompt_tokens, "total_tokens": req.prompt_tokens}
    payload = {"object": "list", "data": data, "model": req.model, "usage": usage}
    return Whole(200, json_bytes(payload))


def _vector(text: str, dimensions: int) -> list[float]:
    """A deterministic unit vector for ``text`` (OpenAI's are normalised too): the same
    text always gets the same one."""
    out: list[float] = []
    counter = 0
    while len(out) < dimensions:
        digest = hashlib.sha256(f"{counter}:{text}".encode()).digest()
        out += [(byte - 127.5) / 127.5 for byte in digest]
        counter += 1
    out = out[:dimensions]
    norm = math.sqrt(sum(x * x for x in out)) or 1.0
    # Rounded to float32, so that a float and a base64 answer carry the same numbers.
    return [struct.unpack("<f", struct.pack("<f", x / norm))[0] for x in out]
