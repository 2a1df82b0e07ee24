"""Anthropic's Messages API (``POST /v1/messages``): its requests and healthy answers.

A message answer is typed content blocks: one ``text`` block, or one ``tool_use`` block when
the request offers tools. Streamed, it is named SSE events, as Anthropic sends them:
``message_start``, ``content_block_start``, a ``ping``, ``content_block_delta`` events
(``text_delta``, or ``input_json_delta`` pieces of the tool's input), ``content_block_stop``,
``message_delta`` (stop reason, usage) and ``message_stop``. A ``ping`` event is Anthropic's
keep-alive: `PING` is what the keep-alive faults send on this API. Errors are
``{"type": "error", "error": {"type": ..., "message": ...}}``, in a body or an ``error``
event.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from ._openai import (
    ChatRequest,
    EventStream,
    RequestError,
    Whole,
    json_bytes,
    load_object,
    pieces_of,
    read_tool,
    sse_event,
    text_of,
)
from ._structured import json_answer
from ._tools import messages_tool, offered

__all__ = ["PING", "error_event", "message", "message_error", "message_stream", "parse_messages"]

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
_PROLOGUE = 3  # message_start, content_block_start, ping.


PING = sse_event("ping", {"type": "ping"})


def parse_messages(body: bytes) -> ChatRequest:
    """Read a ``POST /v1/messages`` body.

    Raises:
        RequestError: the body is not JSON, or a field is missing or has the wrong type.
    """
    data = load_object(body)
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError("'model' must be a non-empty string", "model")
    max_tokens = data.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise RequestError("'max_tokens' must be an integer >= 1", "max_tokens")
    messages = data.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise RequestError("'messages' must be a list of objects", "messages")
    texts = [text_of(m.get("content")) for m in messages]
    last_user = ""
    for message_, text in zip(messages, texts, strict=True):
        if message_.get("role") == "user":
            last_user = text
    system = text_of(data.get("system"))
    output = data.get("output_config")
    last = messages[-1].get("content") if messages else None
    tool = read_tool(messages_tool, data)
    return ChatRequest(
        model=model,
        text=last_user,
        prompt_tokens=sum(len(t.split()) for t in (system, *texts)),
        stream=data.get("stream") is True,
        tool_name=tool.name if tool else None,
        tool_schema=tool.schema if tool else None,
        last_text=_results_and_text(last),
        tools=offered(messages_tool, data),
        max_tokens=max_tokens,
        api="messages",
        # structured outputs (messages.parse(output_format=...)): its JSON schema.
        json_text=json_answer(
            output.get("format") if isinstance(output, dict) else None, "echo: " + last_user
        ),
    )


def _results_and_text(content: object) -> str:
    """The text of a message's content, its ``tool_result`` blocks' included."""
    if not isinstance(content, list):
        return text_of(content)
    results = [
        text_of(block.get("content"))
        for block in content
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]
    return " ".join(t for t in (*results, text_of(content)) if t)


def message(req: ChatRequest, tokens: int) -> Whole:
    """The non-streamed ``message`` answering ``req`` with ``tokens`` tokens."""
    pieces, finish = pieces_of(req, tokens)
    blocks = [_block(req, "".join(pieces)), *_more_blocks(req)]
    payload = _message(req, blocks, _STOP_REASONS[finish], len(pieces))
    return Whole(200, json_bytes(payload))


def message_stream(req: ChatRequest, tokens: int) -> EventStream:
    """The streamed events answering ``req``."""
    pieces, finish = pieces_of(req, tokens)
    start = _message(req, [], None, 1)
    block = _block(req, "")
    events = [
        sse_event("message_start", {"type": "message_start", "message": start}),
        sse_event("content_block_start", _block_start(block)),
        PING,
    ]
    kind = "text_delta" if req.tool_name is None else "input_json_delta"
    events += [_delta(kind, piece) for piece in pieces]
    events.append(_block_stop(0))
    for index, more in enumerate(_more_blocks(req), 1):  # a fixture's further calls.
        arguments = json.dumps(more["input"])
        events.append(sse_event("content_block_start", _block_start({**more, "input": {}}, index)))
        events.append(_delta("input_json_delta", arguments, index))
        events.append(_block_stop(index))
    events.append(_message_delta(_STOP_REASONS[finish], len(pieces)))
    events.append(sse_event("message_stop", {"type": "message_stop"}))

    def chunker(delta: dict[str, Any], finish_reason: str | None) -> bytes:
        if finish_reason is not None:
            return _message_delta(_STOP_REASONS.get(finish_reason, "end_turn"), len(pieces))
        return _delta("text_delta", str(delta.get("content") or ""))

    return EventStream(
        start["id"], req.model, 0, tuple(events), len(pieces), _PROLOGUE, chunker=chunker
    )


def message_error(status: int, message_text: str) -> Whole:
    """An Anthropic-shaped error response."""
    return Whole(status, json_bytes(_error(status, message_text)))


def error_event(message_text: str) -> bytes:
    """An ``error`` event, as Anthropic sends mid-stream (``overloaded_error``)."""
    return sse_event("error", _error(529, message_text))


def _error(status: int, message_text: str) -> dict[str, Any]:
    etype = _ERROR_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": etype, "message": message_text}}


def _message(
    req: ChatRequest, content: list[dict[str, Any]], stop_reason: str | None, output: int
) -> dict[str, Any]:
    return {
        "id": "msg_" + secrets.token_hex(12),
        "type": "message",
        "role": "assistant",
        "model": req.model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": req.prompt_tokens, "output_tokens": output},
    }


def _block(req: ChatRequest, text: str) -> dict[str, Any]:
    if req.tool_name is None:
        return {"type": "text", "text": text}
    return {
        "type": "tool_use",
        "id": "toolu_" + secrets.token_hex(12),
        "name": req.tool_name,
        "input": json.loads(text) if text else {},
    }


def _more_blocks(req: ChatRequest) -> list[dict[str, Any]]:
    """The ``tool_use`` blocks of a fixture's calls after the first."""
    return [
        {
            "type": "tool_use",
            "id": "toolu_" + secrets.token_hex(12),
            "name": name,
            "input": json.loads(arguments),
        }
        for name, arguments in req.more_calls
    ]


def _block_stop(index: int) -> bytes:
    return sse_event("content_block_stop", {"type": "content_block_stop", "index": index})


def _delta(kind: str, piece: str, index: int = 0) -> bytes:
    field = "text" if kind == "text_delta" else "partial_json"
    delta = {"type": kind, field: piece}
    payload = {"type": "content_block_delta", "index": index, "delta": delta}
    return sse_event("content_block_delta", payload)


def _block_start(block: dict[str, Any], index: int = 0) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _message_delta(stop_reason: str, output: int) -> bytes:
    return sse_event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": output},
        },
    )
