"""OpenAI's Responses API (``POST /v1/responses``): its requests and healthy answers.

A response holds one output item: a ``message`` with one ``output_text`` part, or a
``function_call`` when the request offers function tools. Streamed, it is named SSE events
with a ``sequence_number``: ``response.created``, ``response.in_progress``,
``response.output_item.added``, ``response.content_part.added``, the
``response.output_text.delta`` events (``response.function_call_arguments.delta`` for a
call), their ``.done`` events, ``response.output_item.done`` and ``response.completed``.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Iterator
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
from ._tools import offered, responses_tool

__all__ = ["error_event", "parse_responses", "response", "response_stream"]


def parse_responses(body: bytes) -> ChatRequest:
    """Read a ``POST /v1/responses`` body.

    Raises:
        RequestError: the body is not JSON, or a field is missing or has the wrong type.
    """
    data = load_object(body)
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError("'model' must be a non-empty string", "model")
    given = data.get("input")
    if isinstance(given, str):
        texts, last_user = [given], given
    elif isinstance(given, list) and all(isinstance(item, dict) for item in given):
        texts = [text_of(item.get("content", item.get("output"))) for item in given]
        users = [t for item, t in zip(given, texts, strict=True) if item.get("role") == "user"]
        last_user = users[-1] if users else ""
    else:
        raise RequestError("'input' must be a string or a list of objects", "input")
    max_tokens = data.get("max_output_tokens")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise RequestError("'max_output_tokens' must be an integer >= 1", "max_output_tokens")
    instructions = text_of(data.get("instructions"))
    text = data.get("text")
    tool = read_tool(responses_tool, data)
    return ChatRequest(
        model=model,
        text=last_user,
        prompt_tokens=sum(len(t.split()) for t in (instructions, *texts)),
        stream=data.get("stream") is True,
        tool_name=tool.name if tool else None,
        tool_schema=tool.schema if tool else None,
        last_text=texts[-1] if texts else "",
        tools=offered(responses_tool, data),
        max_tokens=max_tokens,
        api="responses",
        json_text=json_answer(
            text.get("format") if isinstance(text, dict) else None, "echo: " + last_user
        ),
    )


def response(req: ChatRequest, tokens: int) -> Whole:
    """The non-streamed ``response`` answering ``req`` with ``tokens`` tokens."""
    pieces, finish = pieces_of(req, tokens)
    answer = _Answer(req, finish, len(pieces))
    return Whole(200, json_bytes(answer.response("".join(pieces))))


def response_stream(req: ChatRequest, tokens: int) -> EventStream:
    """The streamed events answering ``req``."""
    pieces, finish = pieces_of(req, tokens)
    answer = _Answer(req, finish, len(pieces))
    text = "".join(pieces)
    seq = itertools.count()
    opening = [
        _event(seq, "response.created", response=answer.response(None)),
        _event(seq, "response.in_progress", response=answer.response(None)),
        _event(seq, "response.output_item.added", output_index=0, item=answer.item(None)),
    ]
    where = {"item_id": answer.item_id, "output_index": 0}
    part = {"content_index": 0}
    if req.tool_name is None:
        opening.append(_event(seq, "response.content_part.added", **where, **part, part=_part("")))
        deltas = [
            _event(seq, "response.output_text.delta", **where, **part, delta=p, logprobs=[])
            for p in pieces
        ]
        closing = [
            _event(seq, "response.output_text.done", **where, **part, text=text, logprobs=[]),
            _event(seq, "response.content_part.done", **where, **part, part=_part(text)),
        ]
    else:
        deltas = [
            _event(seq, "response.function_call_arguments.delta", **where, delta=p) for p in pieces
        ]
        closing = [_event(seq, "response.function_call_arguments.done", **where, arguments=text)]
    closing.append(_event(seq, "response.output_item.done", output_index=0, item=answer.item(text)))
    for index, call in enumerate(answer.more, 1):  # a fixture's further calls, each whole.
        more = {"item_id": call["id"], "output_index": index}
        arguments = call["arguments"]
        closing += [
            _event(
                seq,
                "response.output_item.added",
                output_index=index,
                item={**call, "status": "in_progress", "arguments": ""},
            ),
            _event(seq, "response.function_call_arguments.delta", **more, delta=arguments),
            _event(seq, "response.function_call_arguments.done", **more, arguments=arguments),
            _event(seq, "response.output_item.done", output_index=index, item=call),
        ]
    closing.append(_event(seq, "response.completed", response=answer.response(text)))

    def chunker(delta: dict[str, Any], finish_reason: str | None) -> bytes:
        # (logprobs: a required list of both events, as the real API sends it.)
        if finish_reason is not None:
            return _event(seq, "response.output_text.done", **where, **part, text=text, logprobs=[])
        content = str(delta.get("content") or "")
        return _event(
            seq, "response.output_text.delta", **where, **part, delta=content, logprobs=[]
        )

    events = (*opening, *deltas, *closing)
    return EventStream(
        answer.id, req.model, answer.created, events, len(pieces), len(opening), chunker=chunker
    )


def error_event(message_text: str, sequence: int) -> bytes:
    """An ``error`` event, as the Responses stream sends one, numbered ``sequence`` (the
    events sent before it, numbered from 0)."""
    payload = {"type": "error", "code": "server_error", "message": message_text, "param": None}
    return sse_event("error", {**payload, "sequence_number": sequence})


class _Answer:
    """The ids and the shape of one response, in progress or complete."""

    def __init__(self, req: ChatRequest, finish: str, output_tokens: int) -> None:
        self.req = req
        self.id = "resp_" + secrets.token_hex(12)
        self.item_id = ("msg_" if req.tool_name is None else "fc_") + secrets.token_hex(12)
        self.call_id = "call_" + secrets.token_hex(12)
        self.created = int(time.time())
        self.finish = finish
        self.output_tokens = output_tokens
        self.more = [  # a fixture's calls after the first, complete.
            {
                "id": "fc_" + secrets.token_hex(12),
                "type": "function_call",
                "status": "completed",
                "call_id": "call_" + secrets.token_hex(12),
                "name": name,
                "arguments": arguments,
            }
            for name, arguments in req.more_calls
        ]

    def item(self, text: str | None) -> dict[str, Any]:
        """The output item; ``text`` None while in progress."""
        status = "in_progress" if text is None else "completed"
        if self.req.tool_name is not None:
            return {
                "id": self.item_id,
                "type": "function_call",
                "status": status,
                "call_id": self.call_id,
                "name": self.req.tool_name,
                "arguments": text or "",
            }
        return {
            "id": self.item_id,
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": [] if text is None else [_part(text)],
        }

    def response(self, text: str | None) -> dict[str, Any]:
        """The response object; ``text`` None while in progress."""
        done = text is not None
        incomplete = done and self.finish == "length"
        status = "in_progress" if not done else "incomplete" if incomplete else "completed"
        prompt = self.req.prompt_tokens
        usage = {
            "input_tokens": prompt,
            # cache_write_tokens: required by openai 3.60's ResponseUsage.
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + self.output_tokens,
        }
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.req.model,
            "output": [self.item(text), *self.more] if done else [],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": None,
            "metadata": {},
            "temperature": 1.0,
            "top_p": 1.0,
            "text": {"format": {"type": "text"}},
            "usage": usage if done else None,
        }


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _event(seq: Iterator[int], kind: str, **fields: Any) -> bytes:
    return sse_event(kind, {"type": kind, **fields, "sequence_number": next(seq)})
