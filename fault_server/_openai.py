"""Builders for the healthy OpenAI-compatible responses that every fault starts from.

Nothing here touches a socket: a request body goes in, a `Whole` response or an
`EventStream` of complete SSE frames comes out, and the faults decide how (badly) to
deliver it. Content is deterministic: ``echo:`` and the words of the last user message, cut
or padded to the requested number of tokens, so a test can assert exactly what it reads.
"""

from __future__ import annotations

import itertools
import json
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from ._json_depth import loads as loads_limited
from ._structured import json_answer, tool_arguments
from ._tools import Tool, ToolError, chat_tool, offered

__all__ = [
    "DONE",
    "MODELS",
    "Api",
    "ChatRequest",
    "EventStream",
    "chat_chunk",
    "RequestError",
    "Whole",
    "completion",
    "completion_stream",
    "error",
    "huge_completion",
    "huge_stream_line",
    "json_bytes",
    "load_object",
    "models",
    "parse_chat",
    "pieces_of",
    "read_tool",
    "sse_event",
    "text_of",
]

Api = Literal["chat", "messages", "responses", "embeddings"]

MODELS = ("fault-model", "gpt-4o-mini")
_MODEL_CREATED = 1_700_000_000
_FILLER = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit")
_MAX_WORD = 40
DONE = b"data: [DONE]\n\n"
FINGERPRINT = "fp_fault_server"

_ERROR_TYPES = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("authentication_error", "invalid_api_key"),
    403: ("permission_error", "permission_denied"),
    404: ("not_found_error", "not_found"),
    409: ("conflict_error", "conflict"),
    413: ("invalid_request_error", "request_too_large"),
    422: ("invalid_request_error", "unprocessable_entity"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
}


class RequestError(ValueError):
    """The request body is not a chat completion request this server can answer."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class Whole:
    """A response sent in one piece: status, body and its content type."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()  # passed on from an upstream, or the fault's.


@dataclass(frozen=True, slots=True)
class EventStream:
    """A streamed answer as complete SSE frames.

    ``events[:prologue]`` open it (chat: the role chunk; Anthropic: ``message_start``,
    ``content_block_start`` and a ``ping``), ``events[prologue : prologue + content]`` carry
    the content (or the tool call's argument pieces), then come the events that close it;
    the last one ends the stream (chat: ``data: [DONE]``; Anthropic: ``message_stop``;
    Responses: ``response.completed``). ``chunker`` makes one more delta event of the same
    answer in its own format; without it, a chat chunk.
    """

    id: str
    model: str
    created: int
    events: tuple[bytes, ...]
    content: int
    prologue: int = 1
    chunker: Callable[[dict[str, Any], str | None], bytes] | None = None

    @property
    def body(self) -> bytes:
        """The whole stream as one body."""
        return b"".join(self.events)

    def head(self, after: int) -> tuple[bytes, ...]:
        """The opening events and the first ``after`` content events."""
        return self.events[: self.prologue + min(after, self.content)]

    def is_end(self, frame: bytes) -> bool:
        """Whether ``frame`` is the event that ends this stream."""
        return frame == self.events[-1]

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        """One more well-formed delta event of this answer: ``{"content": text}`` carries
        text, ``{}`` nothing, and a ``finish_reason`` closes the message."""
        if self.chunker is not None:
            return self.chunker(delta, finish_reason)
        return _frame(_chunk(self.id, self.model, self.created, delta, finish_reason))


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """What the healthy answer depends on, read from a request of one of the APIs served.

    ``api`` names the wire format (``chat``: OpenAI chat completions; ``messages``:
    Anthropic Messages; ``responses``: OpenAI Responses; ``embeddings``). ``inputs``,
    ``dimensions`` and ``base64`` are the embeddings request's. ``json_text``: the content
    that answers a structured-output request instead of the echo text.
    """

    model: str
    text: str
    prompt_tokens: int
    stream: bool = False
    include_usage: bool = False
    tool_name: str | None = None
    max_tokens: int | None = None
    api: Api = "chat"
    inputs: tuple[str, ...] = ()
    dimensions: int = 0
    base64: bool = False
    json_text: str | None = None  # the answer to a JSON response format (`_structured`)
    tool_schema: Any = None  # the called tool's parameters schema (`_structured`)
    # What a fixture (`_fixtures`) matches on: the last message's text, whatever its role
    # (a tool's result too), and the names of the tools offered.
    last_text: str = ""
    tools: tuple[str, ...] = ()
    # A fixture's canned answer: the reply's text, or the called tool's arguments (JSON).
    reply: str | None = None
    tool_arguments: str | None = None
    more_calls: tuple[tuple[str, str], ...] = ()  # (name, arguments JSON) after the first.


def parse_chat(body: bytes) -> ChatRequest:
    """Read a ``POST /v1/chat/completions`` body.

    Raises:
        RequestError: the body is not JSON, or a field has the wrong type.
    """
    try:
        data = loads_limited(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RequestError("request body must be a JSON object")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError("'model' must be a non-empty string", "model")
    messages = data.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise RequestError("'messages' must be a list of objects", "messages")
    texts = [text_of(m.get("content")) for m in messages]
    last_user = ""
    for message, text in zip(messages, texts, strict=True):
        if message.get("role") == "user":
            last_user = text
    options = data.get("stream_options")
    tool = read_tool(chat_tool, data)
    max_tokens = data.get("max_completion_tokens", data.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 0):
        raise RequestError("'max_tokens' must be a non-negative integer", "max_tokens")
    return ChatRequest(
        model=model,
        text=last_user,
        prompt_tokens=sum(len(t.split()) for t in texts),
        stream=data.get("stream") is True,
        include_usage=isinstance(options, dict) and options.get("include_usage") is True,
        tool_name=tool.name if tool else None,
        tool_schema=tool.schema if tool else None,
        max_tokens=max_tokens,
        json_text=json_answer(data.get("response_format"), "echo: " + last_user),
        last_text=texts[-1] if texts else "",
        tools=offered(chat_tool, data),
    )


def load_object(body: bytes) -> dict[str, Any]:
    """The JSON object of a request body (as `parse_chat` reads it).

    Raises:
        RequestError: the body is not JSON (or nested too deeply to read), or not an object.
    """
    try:
        data = loads_limited(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RequestError(f"request body must be a JSON object, not {type(data).__name__}")
    return data


def completion(req: ChatRequest, tokens: int) -> Whole:
    """The non-streamed ``chat.completion`` answering ``req`` with ``tokens`` tokens."""
    pieces, finish = pieces_of(req, tokens)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(pieces), "refusal": None}
    if req.tool_name is not None:
        message["content"] = None
        message["tool_calls"] = [
            _tool_call(req.tool_name, "".join(pieces)),
            *(_tool_call(name, arguments) for name, arguments in req.more_calls),
        ]
    payload = {
        "id": _new_id(),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": req.model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": _usage(req, len(pieces)),
        "service_tier": "default",
        "system_fingerprint": FINGERPRINT,
    }
    return Whole(200, json_bytes(payload))


def completion_stream(req: ChatRequest, tokens: int) -> EventStream:
    """The streamed ``chat.completion.chunk`` frames answering ``req``."""
    cid, created = _new_id(), int(time.time())
    pieces, finish = pieces_of(req, tokens)
    extra: dict[str, Any] = {"usage": None} if req.include_usage else {}

    def frame(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        return _frame(_chunk(cid, req.model, created, delta, finish_reason) | extra)

    if req.tool_name is None:
        events = [frame({"role": "assistant", "content": ""})]
        events += [frame({"content": piece}) for piece in pieces]
    else:
        call = _tool_call(req.tool_name, "")
        events = [frame({"role": "assistant", "content": None, "tool_calls": [call | _I0]})]
        events += [
            frame({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}) for p in pieces
        ]
        events += [  # a fixture's further calls, each whole in one chunk.
            frame({"tool_calls": [{"index": i, **_tool_call(name, arguments)}]})
            for i, (name, arguments) in enumerate(req.more_calls, 1)
        ]
    events.append(frame({}, finish))
    if req.include_usage:
        usage = _chunk(cid, req.model, created, {}, None)
        usage["choices"] = []
        usage["usage"] = _usage(req, len(pieces))
        events.append(_frame(usage))
    events.append(DONE)
    return EventStream(cid, req.model, created, tuple(events), len(pieces))


def models() -> Whole:
    """The ``GET /v1/models`` list."""
    data = [
        {"id": m, "object": "model", "created": _MODEL_CREATED, "owned_by": "fault_server"}
        for m in MODELS
    ]
    return Whole(200, json_bytes({"object": "list", "data": data}))


def error(status: int, message: str, *, code: str | None = None, param: str | None = None) -> Whole:
    """An OpenAI-shaped ``{"error": {...}}`` response."""
    etype, default_code = _ERROR_TYPES.get(
        status, ("server_error", "server_error") if status >= 500 else ("api_error", "error")
    )
    body = {"message": message, "type": etype, "param": param, "code": code or default_code}
    return Whole(status, json_bytes({"error": body}))


def huge_completion(model: str, size: int) -> tuple[int, Iterator[bytes]]:
    """A valid completion JSON of exactly ``max(size, minimum)`` bytes, made as it is read.

    Returns the length and an iterator of pieces of at most 64 KiB, so that 64 MiB never sit
    in memory at once.
    """
    payload = {
        "id": _new_id(),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "\x00"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    return _padded(json_bytes(payload), b"\\u0000", size)


def huge_stream_line(model: str, size: int) -> tuple[int, Iterator[bytes]]:
    """One ``data: {chunk}`` SSE line of ``max(size, minimum)`` bytes, without its newlines."""
    chunk = _chunk(_new_id(), model, int(time.time()), {"content": "\x00"}, None)
    return _padded(b"data: " + json_bytes(chunk), b"\\u0000", size)


def _padded(template: bytes, hole: bytes, size: int) -> tuple[int, Iterator[bytes]]:
    prefix, _, suffix = template.partition(hole)
    fill = max(0, size - len(prefix) - len(suffix))
    unit = b"lorem ipsum " * 5461  # 65,532 bytes of plain JSON-safe text.

    def pieces() -> Iterator[bytes]:
        yield prefix
        left = fill
        while left > 0:
            piece = unit[:left]
            left -= len(piece)
            yield piece
        yield suffix

    return len(prefix) + fill + len(suffix), pieces()


_I0 = {"index": 0}


def pieces_of(req: ChatRequest, tokens: int) -> tuple[list[str], str]:
    """The answer's content in ``tokens`` pieces (text words, or the pieces of a tool call's
    arguments JSON) and its finish reason: ``stop``, ``length`` or ``tool_calls``."""
    finish, wanted = "stop", tokens
    if req.reply is not None:
        tokens = wanted = len(req.reply.split(" "))
    if req.max_tokens is not None and req.max_tokens < tokens:
        tokens, finish = req.max_tokens, "length"
    if req.reply is not None:  # a fixture's: word by word, as it was written.
        said = req.reply.split(" ")
        pieces = [w if i == 0 else " " + w for i, w in enumerate(said)][:tokens]
        return pieces, finish if len(pieces) < len(said) else "stop"
    if req.tool_name is not None and req.tool_arguments is not None:
        return _split(req.tool_arguments, tokens), "tool_calls"
    words = [w[:_MAX_WORD] for w in ("echo: " + req.text).split()][:tokens]
    real = len(words)
    while len(words) < tokens:
        words.append(_FILLER[(len(words) - real) % len(_FILLER)])
    if req.tool_name is not None:
        return _split(tool_arguments(req.tool_schema, " ".join(words)), tokens), "tool_calls"
    if req.json_text is not None:
        # The whole document, in as many pieces as the answer has tokens; cut short by
        # max_tokens it is cut short here too (and does not parse, as a real one would not).
        return _split(req.json_text, wanted)[:tokens], finish
    return [w if i == 0 else " " + w for i, w in enumerate(words)], finish


def _split(text: str, tokens: int) -> list[str]:
    step = max(1, -(-len(text) // max(1, tokens)))
    return [text[i : i + step] for i in range(0, len(text), step)]


def _tool_call(name: str, arguments: str) -> dict[str, Any]:
    call_id = "call_" + secrets.token_hex(12)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def read_tool(pick: Callable[[dict[str, Any]], Tool | None], data: dict[str, Any]) -> Tool | None:
    """The tool ``pick`` chooses among the request's.

    Raises:
        RequestError: a tool it cannot read.
    """
    try:
        return pick(data)
    except ToolError as exc:
        raise RequestError(str(exc), "tools") from None


def text_of(content: object) -> str:
    """The text of a message's content: a string, or the ``text`` of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        return " ".join(p for p in parts if isinstance(p, str))
    return ""


def _usage(req: ChatRequest, completion_tokens: int) -> dict[str, Any]:
    # The details objects, as OpenAI sends them: nothing cached, no reasoning tokens.
    return {
        "prompt_tokens": req.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": req.prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
    }


def _chunk(
    cid: str, model: str, created: int, delta: dict[str, Any], finish_reason: str | None
) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    return {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
        "service_tier": "default",
        "system_fingerprint": FINGERPRINT,
    }


def chat_chunk(first: dict[str, Any], delta: dict[str, Any], finish_reason: str | None) -> bytes:
    """A chat chunk frame with the id, created and model of ``first`` (another chunk's JSON,
    as an upstream sent it), for faults that add chunks to a stream they did not make."""
    cid = str(first.get("id", "chatcmpl-proxy"))
    created = first.get("created", 0)
    model = str(first.get("model", "fault-model"))
    return _frame(
        _chunk(cid, model, created if isinstance(created, int) else 0, delta, finish_reason)
    )


def sse_event(name: str, payload: dict[str, Any]) -> bytes:
    """One named SSE event (``event: name``) whose data is ``payload``."""
    return b"event: " + name.encode() + b"\ndata: " + json_bytes(payload) + b"\n\n"


def _frame(payload: dict[str, Any]) -> bytes:
    return b"data: " + json_bytes(payload) + b"\n\n"


def json_bytes(payload: object) -> bytes:
    """Compact JSON."""
    return json.dumps(payload, separators=(",", ":")).encode()


def _new_id() -> str:
    return f"chatcmpl-{_ID_PREFIX}{next(_ids):012x}"


# Completion ids: random per process, then counted (a urandom per answer was a system call
# on the hot path).
_ID_PREFIX = secrets.token_hex(6)
_ids = itertools.count(1)
