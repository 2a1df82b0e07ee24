"""Tool-call answers that the tool faults make up: escapes and UTF-8 split, index gaps,
arguments that never close.

Frames here are written with ``ensure_ascii=False``, so non-ASCII text is raw UTF-8 on the
wire, where a split can fall inside a character.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from typing import Any

from ._openai import DONE

__all__ = [
    "TRICKY_ARGUMENTS",
    "TRICKY_PIECES",
    "ToolCall",
    "inside_utf8",
    "tool_completion",
    "tool_frames",
]

# Valid JSON with raw non-ASCII text (2-, 3- and 4-byte UTF-8) and escapes (\" and \u00e9).
TRICKY_ARGUMENTS = (
    '{"city": "Zürich", "quote": "say \\"hi\\"", "esc": "caf\\u00e9", "emoji": "🙂", "cjk": "日本"}'
)
# Cut after a backslash (inside \"), inside \u00e9, and so that pieces hold multi-byte text.
TRICKY_PIECES = (
    '{"city": "Zü',
    'rich", "quote": "say \\',
    '"hi\\"", "esc": "caf\\u00',
    'e9", "emoji": "🙂',
    '", "cjk": "日本"}',
)

ToolCall = tuple[int, str, Sequence[str]]  # (index, function name, argument pieces)


def tool_frames(model: str, calls: Sequence[ToolCall]) -> list[bytes]:
    """A streamed answer made of ``calls``: role chunk, for each call a chunk that opens it
    (id, name) and one per argument piece, the finish chunk, ``[DONE]``."""
    cid, created = "chatcmpl-" + secrets.token_hex(12), int(time.time())

    def frame(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        payload = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [choice],
        }
        return b"data: " + _dumps(payload) + b"\n\n"

    frames = [frame({"role": "assistant", "content": None})]
    for index, name, pieces in calls:
        opening = {"index": index, "id": _call_id(), "type": "function"}
        opening["function"] = {"name": name, "arguments": ""}
        frames.append(frame({"tool_calls": [opening]}))
        frames += [
            frame({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            for piece in pieces
        ]
    frames.append(frame({}, "tool_calls"))
    frames.append(DONE)
    return frames


def tool_completion(model: str, calls: Sequence[tuple[str, str]]) -> bytes:
    """A non-streamed ``chat.completion`` whose message is the (name, arguments) calls."""
    message = {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "tool_calls": [
            {"id": _call_id(), "type": "function", "function": {"name": n, "arguments": a}}
            for n, a in calls
        ],
    }
    payload = {
        "id": "chatcmpl-" + secrets.token_hex(12),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": "tool_calls"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    return _dumps(payload)


def inside_utf8(data: bytes) -> int | None:
    """An offset that falls inside a multi-byte UTF-8 character of ``data``, if any."""
    for i, byte in enumerate(data):
        if 0x80 <= byte <= 0xBF:  # a continuation byte: the character started before it.
            return i
    return None


def _call_id() -> str:
    return "call_" + secrets.token_hex(12)


def _dumps(payload: object) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
